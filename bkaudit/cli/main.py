"""Entry point of the ``bkaudit`` command: wires the command groups and enforces the error contract.

Example:
    $ bkaudit path ledger 59
    /ledgers/00/0000/L0059
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from typer.exceptions import TyperException

from bkaudit import __version__
from bkaudit.cli import (
    agent,
    alerts,
    availability,
    bookies,
    check,
    config,
    demo,
    dev,
    metadata,
    path,
    pulsar,
    query,
    repair,
    sim,
    status,
    stream,
    watch,
)
from bkaudit.cli._process_end import finish, own_process
from bkaudit.cli.helptext import tidy_help
from core.errors import BkauditError, ConfigError, InvalidArgumentError
from core.settings import CONFIG_FILE_ENV, note_command_line, suggest_setting

app = typer.Typer(
    name="bkaudit",
    help="A continuously running auditor for Apache BookKeeper clusters.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def setting_overrides(assignments: list[str]) -> dict[str, str]:
    """``key=value`` assignments (dotted setting keys) as the ``BKAUDIT_*`` variables that carry them.

    The variables are how every part of a process reads its settings (Spark's Python workers too), and
    they rank above the config file, as a command-line override should. A key that is no setting is a
    :class:`ConfigError` naming the setting it most likely means.

    Example:
        >>> setting_overrides(["kafka.bootstrap_servers=k1:9092", "stream.watermark_delay_s=2"])
        {'BKAUDIT_KAFKA__BOOTSTRAP_SERVERS': 'k1:9092', 'BKAUDIT_STREAM__WATERMARK_DELAY_S': '2'}
    """
    if not assignments:  # the common case: no need to list every setting
        return {}
    from bkaudit.settings_docs import setting_docs

    known = {row.key: row.env_var for row in setting_docs()}
    variables = {}
    for assignment in assignments:
        key, equals, value = assignment.partition("=")
        if not equals:
            raise InvalidArgumentError(f"--set wants key=value, got {assignment!r}")
        if key.strip() not in known:
            raise ConfigError(_no_such_setting(key.strip()))
        variables[known[key.strip()]] = value
    return variables


def _no_such_setting(key: str) -> str:
    """The error for a ``--set`` key that is no setting, with the one it most likely means.

    Example:
        >>> _no_such_setting("kafka.bootstrap_server")
        '--set kafka.bootstrap_server: no such setting; did you mean kafka.bootstrap_servers?'
    """
    suggestion = suggest_setting(key)
    hint = f"did you mean {suggestion}?" if suggestion else "`bkaudit config docs` lists them"
    return f"--set {key}: no such setting; {hint}"


def _version(show: bool) -> None:
    if show:
        sys.stdout.write(f"bkaudit {__version__}\n")
        raise typer.Exit(0)


ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config", metavar="FILE", help=f"settings file (.toml, .yaml or .json); same as {CONFIG_FILE_ENV}"
    ),
]
SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set", metavar="KEY=VALUE", help="override one setting, e.g. --set kafka.bootstrap_servers=k:9092"
    ),
]
VersionOption = Annotated[
    bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
]


@app.callback()
def main(
    config_file: ConfigOption = None, assignments: SetOption = None, _show_version: VersionOption = False
) -> None:
    """A continuously running auditor for Apache BookKeeper clusters."""
    if config_file is not None:
        os.environ[CONFIG_FILE_ENV] = str(config_file)
    variables = setting_overrides(assignments or [])
    os.environ.update(variables)
    note_command_line(variables)


app.add_typer(metadata.app, name="metadata")
app.add_typer(availability.app, name="availability")
app.add_typer(check.app, name="check")
app.add_typer(path.app, name="path")
app.add_typer(bookies.app, name="bookies")
app.add_typer(dev.app, name="dev")
app.add_typer(sim.app, name="sim")
app.add_typer(query.app, name="query")
app.add_typer(pulsar.app, name="pulsar")
app.add_typer(alerts.app, name="alerts")
app.add_typer(config.app, name="config")
app.command("demo")(demo.demo)
app.command("stream")(stream.stream)
app.command("watch")(watch.watch)
app.command("status")(status.status)
app.command("agent")(agent.agent)
app.command("repair")(repair.repair)


def _one_line(message: str) -> str:
    return " ".join(message.split()) or "error"


def run(argv: list[str] | None = None) -> int:
    """Run the CLI; bad input and usage errors exit 2 with one line on stderr, never a traceback.

    Without ``argv`` (the process' own command line), a command that asked for it ends the process here
    (:mod:`bkaudit.cli._process_end`); with ``argv`` (a caller in the same process) it always returns.
    """
    if argv is None:
        own_process()
    code = _run(argv)
    finish(code)
    return code


@functools.cache
def _command() -> typer.core.TyperGroup:
    """The click command tree of :data:`app` with tidied help, built once per process: typer builds it from
    every command's signature (tens of milliseconds), which a caller running many commands in one process
    (the suite's ``cli`` fixture) would otherwise pay on each run. Parsing keeps no state in the tree.

    Example:
        >>> _command() is _command() and "query" in _command().commands
        True
    """
    command = typer.main.get_command(app)
    assert isinstance(command, typer.core.TyperGroup)
    tidy_help(command)
    return command


def _run(argv: list[str] | None) -> int:
    command = _command()
    try:
        result = command.main(args=argv, prog_name="bkaudit", standalone_mode=False)
    except BkauditError as err:
        sys.stderr.write(f"bkaudit: {_one_line(str(err))}\n")
        return 2
    except typer.Abort:
        sys.stderr.write("bkaudit: aborted\n")
        return 130
    except TyperException as err:  # usage errors of the (vendored) click layer
        if type(err).__name__ == "NoArgsIsHelpError":
            sys.stderr.write(err.format_message() + "\n")
        else:
            sys.stderr.write(f"bkaudit: {_one_line(err.format_message())}\n")
        return 2
    except typer.Exit as err:
        return err.exit_code
    except BrokenPipeError:
        return 0
    finally:
        note_command_line({})  # what --set wrote is this run's alone
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(run())
