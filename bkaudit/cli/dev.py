"""`bkaudit dev up | down | status`: the embedded ZooKeeper and Kafka-protocol broker on loopback.

Example:
    $ bkaudit dev up
    {"zookeeper": "127.0.0.1:40123", "kafka": "127.0.0.1:40124"}
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from bkaudit.cli._io import emit_json
from bkaudit.cli.formats import StateFormat, StateFormatOption, emit_state
from core.settings import load_settings

if TYPE_CHECKING:
    from connectors.devcluster import DevCluster

app = typer.Typer(help="Embedded ZooKeeper + Kafka-protocol broker on loopback.", no_args_is_help=True)


StateDirOption = Annotated[
    Path | None,
    typer.Option(
        "--state-dir", help="pid files, logs and data of the services (dev.state_dir, default .bkaudit)"
    ),
]


def _cluster(state_dir: Path | None = None, **overrides: object) -> DevCluster:
    from connectors.devcluster import DevCluster

    settings = load_settings().dev
    changes = {key: value for key, value in overrides.items() if value is not None}
    if state_dir is not None:
        changes["state_dir"] = state_dir
    if not changes:
        return DevCluster(settings)
    from pydantic import ValidationError

    from core.errors import ConfigError

    try:
        return DevCluster(settings.model_validate({**dict(settings), **changes}))
    except ValidationError as err:
        problem = err.errors()[0]
        raise ConfigError(f"--{str(problem['loc'][0]).replace('_', '-')}: {problem['msg']}") from None


BookKeeperOption = Annotated[
    str | None,
    typer.Option(
        "--bookkeeper",
        help="'real': also start a real Apache BookKeeper cluster (dev.bookkeeper: none or real)",
    ),
]


@app.command("up")
def up(
    state_dir: StateDirOption = None,
    bookkeeper: BookKeeperOption = None,
    bookies: Annotated[
        int | None, typer.Option("--bookies", help="real BookKeeper: bookies (dev.bookies)")
    ] = None,
    racks: Annotated[int | None, typer.Option("--racks", help="real BookKeeper: racks (dev.racks)")] = None,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls",
            help="TLS only, client certificates required: ZooKeeper (secureClientPort) and the real Kafka "
            "broker (dev.tls, dev.broker = kafka), a throwaway CA in the tls folder of the state directory",
        ),
    ] = False,
    scram: Annotated[
        bool,
        typer.Option(
            "--scram",
            help="with --tls: the Kafka broker also opens a SASL_SSL listener for SCRAM-SHA-256/512 users "
            "(dev.kafka_scram); add users with Kafka's admin API",
        ),
    ] = False,
) -> None:
    """Start (or reuse) the embedded services; prints {"zookeeper": "host:port", "kafka": "host:port"} (plus
    "bookkeeper": its metadataServiceUri with --bookkeeper real, "tls": the CA's directory with --tls,
    "kafka_sasl": the SASL_SSL listener with --scram)."""
    from core.localfs import writable_directory
    from core.logsetup import configure_progress_logging

    configure_progress_logging()  # the waits on stderr; stdout stays the JSON answer
    secured: dict[str, object] = {"tls": True, "broker": "kafka"} if tls else {}
    if scram:
        secured["kafka_scram"] = True
    cluster = _cluster(state_dir, bookkeeper=bookkeeper, bookies=bookies, racks=racks, **secured)
    writable_directory(cluster.settings.state_dir, "dev.state_dir")
    if cluster.tls is not None:
        from bkaudit.testing.tls import ensure_throwaway_ca

        ensure_throwaway_ca(cluster.tls.cafile.parent)
    emit_json(cluster.up())


@app.command("down")
def down(state_dir: StateDirOption = None, bookkeeper: BookKeeperOption = None) -> None:
    """Stop the embedded services started from this state directory (and nothing else)."""
    emit_json({"stopped": _cluster(state_dir, bookkeeper=bookkeeper).down()})


@app.command("status")
def status(
    fmt: StateFormatOption = StateFormat.table,
    state_dir: StateDirOption = None,
    bookkeeper: BookKeeperOption = None,
) -> None:
    """Say what runs where: pids, addresses, log files."""
    emit_state(_cluster(state_dir, bookkeeper=bookkeeper).status(), fmt)
