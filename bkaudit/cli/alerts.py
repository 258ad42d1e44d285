"""`bkaudit alerts ...`: act on the alert stream.

``republish`` re-sends every alert of the ``open_alerts`` table to the alerts topic as ``firing``, with its
stable ``alert_id`` and the JSON the job publishes: for when the topic's history was lost with the broker
(docs/troubleshooting.md, "The alerts topic lost its history"). Consumers deduplicate by ``alert_id``.

Example:
    $ bkaudit alerts republish --dry-run              # how many would be sent, per kind
    $ bkaudit alerts republish --format json          # {"topic": "bkaudit.alerts", "sent": 148, ...}
"""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from bkaudit.cli._io import emit_json

app = typer.Typer(help="Act on the alert stream (republish the open alerts).", no_args_is_help=True)


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


@app.command("republish")
def republish(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="count what would be sent; send nothing")
    ] = False,
    lakehouse: Annotated[
        Path | None,
        typer.Option("--lakehouse", help="root of the Delta tables (default: the lakehouse_root setting)"),
    ] = None,
    fmt: Annotated[
        OutputFormat, typer.Option("--format", "-f", help="table (aligned text) or json (one object)")
    ] = OutputFormat.table,
) -> None:
    """Re-send every open alert to the alerts topic (firing, same alert_id, same JSON as the job)."""
    import pyarrow as pa

    from bkaudit.cli._render import render
    from connectors.kafka.republish import republish_open_alerts
    from core.settings import load_settings

    settings = load_settings()
    report = republish_open_alerts(
        lakehouse if lakehouse is not None else settings.lakehouse_root, settings.kafka, dry_run=dry_run
    )
    if fmt is OutputFormat.json:
        emit_json(
            {
                "topic": report.topic,
                "dry_run": report.dry_run,
                "sent": 0 if report.dry_run else report.sent,
                "open_alerts": report.sent,
                "by_kind": report.by_kind,
            }
        )
        return
    counts = pa.table(
        {"kind": list(report.by_kind), "alerts": pa.array(list(report.by_kind.values()), pa.int64())}
    )
    render(counts, "table", sys.stdout)
    if report.dry_run:
        sys.stdout.write(f"dry run: {report.sent} open alerts would be sent to {report.topic}\n")
    else:
        sys.stdout.write(f"sent {report.sent} open alerts to {report.topic}\n")
