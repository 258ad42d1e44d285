"""`bkaudit dev up | down | status`: the embedded ZooKeeper and Kafka-protocol broker. Status: being written."""

from __future__ import annotations

import typer

app = typer.Typer(help="Embedded ZooKeeper + Kafka-protocol broker on loopback", no_args_is_help=True)
