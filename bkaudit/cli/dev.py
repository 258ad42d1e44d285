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


def _cluster(state_dir: Path | None = None) -> DevCluster:
    from connectors.devcluster import DevCluster

    settings = load_settings().dev
    return DevCluster(settings if state_dir is None else settings.model_copy(update={"state_dir": state_dir}))


@app.command("up")
def up(state_dir: StateDirOption = None) -> None:
    """Start (or reuse) the embedded services; prints {"zookeeper": "host:port", "kafka": "host:port"}."""
    from core.localfs import writable_directory

    cluster = _cluster(state_dir)
    writable_directory(cluster.settings.state_dir, "dev.state_dir")
    emit_json(cluster.up())


@app.command("down")
def down(state_dir: StateDirOption = None) -> None:
    """Stop the embedded services started from this state directory (and nothing else)."""
    emit_json({"stopped": _cluster(state_dir).down()})


@app.command("status")
def status(fmt: StateFormatOption = StateFormat.table, state_dir: StateDirOption = None) -> None:
    """Say what runs where: pids, addresses, log files."""
    emit_state(_cluster(state_dir).status(), fmt)
