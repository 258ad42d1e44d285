"""`bkaudit repair`: rebuild the job's damaged derived Delta tables, each from its source.

``ledgers`` from ``ledger_changes``, ``ledger_bookies`` from ``ledgers``, ``violations`` from the alerts
topic, ``open_alerts`` from ``violations``. Refused while a job holds the checkpoint. A damaged table that
has no source (``ledger_changes``, ``bookies``, …) is named in one line (exit 2): restore it.

Example:
    $ bkaudit repair --dry-run
    $ bkaudit repair --table open_alerts
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from bkaudit.cli.live import DevOption, use_dev_services
from core.errors import ServiceError


def repair(
    table: Annotated[
        str | None,
        typer.Option(
            "--table",
            "-t",
            help="rebuild this table only, even when whole (ledgers, ledger_bookies, "
            "violations or open_alerts)",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="say what would be rebuilt; write nothing")
    ] = False,
    dev: DevOption = False,
) -> None:
    """Rebuild damaged derived Delta tables from their sources (the job must be stopped)."""
    from connectors.delta.health import REBUILT_FROM, what_to_do
    from core.settings import load_settings
    from streaming.repair import repair as run_repair

    use_dev_services(dev)
    settings = load_settings()
    report = run_repair(settings, table=table, dry_run=dry_run)
    found = report.plan
    out = sys.stdout
    if dry_run:
        for name in found.rebuild:
            why = found.damaged.get(name, "asked for")
            out.write(f"would rebuild {name} from {REBUILT_FROM[name]} ({why})\n")
    for done in report.rebuilt:
        out.write(f"rebuilt {done.table} from {done.source}: {done.rows} rows\n")
        if done.note:
            out.write(f"  note: {done.note}\n")
    for partition, first in sorted(report.topic_truncated.items()):
        out.write(
            f"  note: alerts topic partition {partition} starts at offset {first}: the transitions before it "
            "are gone (retention), and so from violations\n"
        )
    problems = [
        f"the Delta table '{name}' is damaged ({damage}); {what_to_do(name)}"
        for name, damage in found.unrepairable.items()
    ] + [f"cannot rebuild {name}: {why}" for name, why in found.blocked.items()]
    if problems:
        raise ServiceError("; ".join(problems) + "; the job will not start until then")
    if not found.rebuild:
        out.write("every table is whole: nothing to repair\n")
