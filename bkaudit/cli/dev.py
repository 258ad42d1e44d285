"""`bkaudit dev up | down | status`: the embedded ZooKeeper and Kafka-protocol broker on loopback.

Example:
    $ bkaudit dev up
    {"zookeeper": "127.0.0.1:40123", "kafka": "127.0.0.1:40124"}
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from bkaudit.cli._io import emit_json
from bkaudit.cli.formats import StateFormat, StateFormatOption, emit_state
from bkaudit.settings import load_settings

if TYPE_CHECKING:
    from connectors.devcluster import DevCluster

app = typer.Typer(help="Embedded ZooKeeper + Kafka-protocol broker on loopback.", no_args_is_help=True)


def _cluster() -> DevCluster:
    from connectors.devcluster import DevCluster

    return DevCluster(load_settings().dev)


@app.command("up")
def up() -> None:
    """Start (or reuse) the embedded services; prints {"zookeeper": "host:port", "kafka": "host:port"}."""
    from bkaudit.localfs import writable_directory

    cluster = _cluster()
    writable_directory(cluster.settings.state_dir, "dev.state_dir")
    emit_json(cluster.up())


@app.command("down")
def down() -> None:
    """Stop the embedded services started from this state directory (and nothing else)."""
    emit_json({"stopped": _cluster().down()})


@app.command("status")
def status(fmt: StateFormatOption = StateFormat.table) -> None:
    """Say what runs where: pids, addresses, log files."""
    emit_state(_cluster().status(), fmt)
