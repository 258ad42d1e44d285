"""Entry point of the ``bkaudit`` command: wires the command groups and enforces the error contract.

Example:
    $ bkaudit path ledger 59
    /ledgers/00/0000/L0059
"""

from __future__ import annotations

import sys

import typer
from typer.exceptions import TyperException

from bkaudit.cli import (
    agent,
    alerts,
    availability,
    check,
    demo,
    dev,
    metadata,
    path,
    query,
    sim,
    stream,
    watch,
)
from bkaudit.errors import BkauditError

app = typer.Typer(
    name="bkaudit",
    help="A continuously running auditor for Apache BookKeeper clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.add_typer(metadata.app, name="metadata")
app.add_typer(availability.app, name="availability")
app.add_typer(check.app, name="check")
app.add_typer(path.app, name="path")
app.add_typer(dev.app, name="dev")
app.add_typer(sim.app, name="sim")
app.add_typer(query.app, name="query")
app.add_typer(alerts.app, name="alerts")
app.command("demo")(demo.demo)
app.command("stream")(stream.stream)
app.command("watch")(watch.watch)
app.command("agent")(agent.agent)


def _one_line(message: str) -> str:
    return " ".join(message.split()) or "error"


def run(argv: list[str] | None = None) -> int:
    """Run the CLI; bad input and usage errors exit 2 with one line on stderr, never a traceback."""
    command = typer.main.get_command(app)
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
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(run())
