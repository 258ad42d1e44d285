"""``bkaudit repair``: rebuild the job's damaged derived tables, holding its checkpoint meanwhile.

The job refuses to start on a damaged or vanished table (:func:`connectors.delta.health.check_lakehouse`).
This rebuilds the four tables that have a source (:data:`~connectors.delta.health.REBUILT_FROM`), in the
order their sources need: ``ledgers``, then ``ledger_bookies``, ``violations``, ``open_alerts``. It holds
the job's checkpoint lock (and its ZooKeeper lease) while it runs: it is refused while a job runs, and no
job starts meanwhile. A damaged table without a source (``ledger_changes``, ``bookies``, …) is reported in
one line and still stops the job.

Example:
    >>> plan({"open_alerts": "it is gone", "ledger_changes": "it is gone"}, None).rebuild
    ['open_alerts']
    >>> plan({"ledgers": "x", "ledger_changes": "y"}, None).blocked["ledgers"]
    'its source ledger_changes is damaged'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from deltalake import DeltaTable

from connectors.delta.health import REBUILT_FROM, TABLES_RECORD, recorded_tables, what_to_do
from connectors.delta.repair import (
    Rebuilt,
    damaged_tables,
    ledgers_in_changes,
    rebuild_index,
    rebuild_ledgers,
    rebuild_open_alerts,
    rebuild_violations,
    recreate,
    violation_rows,
)
from connectors.delta.tables import read_current_ledgers, table_path
from connectors.kafka.alert_tail import AlertHistory
from core.errors import ConfigError
from core.settings import Settings

#: Sources first: each table after the one it is rebuilt from.
ORDER = ("ledgers", "ledger_bookies", "violations", "open_alerts")
#: The tables each rebuild reads (its source among them).
_READS = {
    "ledgers": ("ledger_changes",),
    "ledger_bookies": ("ledgers", "ledger_changes"),
    "violations": (),
    "open_alerts": ("violations",),
}


@dataclass
class RepairPlan:
    """What a repair does: the tables to rebuild (in order), the damaged ones it cannot rebuild, and the
    ones whose source is itself damaged beyond repair."""

    damaged: dict[str, str]
    rebuild: list[str]
    unrepairable: dict[str, str] = field(default_factory=dict)
    blocked: dict[str, str] = field(default_factory=dict)


@dataclass
class RepairReport:
    """What a repair did (nothing with ``dry_run``), and the alerts topic's partitions whose first
    records are gone (partition → first offset held)."""

    plan: RepairPlan
    rebuilt: list[Rebuilt]
    dry_run: bool
    topic_truncated: dict[int, int] = field(default_factory=dict)


def plan(damaged: dict[str, str], table: str | None) -> RepairPlan:
    """The repair of ``damaged`` (table → what is wrong): every rebuildable damaged table, or ``table``
    alone (rebuilt even when whole)."""
    wanted = {table} if table is not None else set(damaged) & set(REBUILT_FROM)
    unrepairable = {name: damage for name, damage in damaged.items() if name not in REBUILT_FROM}
    rebuild, blocked = [], {}
    for name in ORDER:
        if name not in wanted:
            continue
        broken = [s for s in _READS[name] if s in damaged and s not in rebuild]
        if broken:
            blocked[name] = f"its source {broken[0]} is damaged"
            continue
        rebuild.append(name)
    return RepairPlan(damaged, rebuild, unrepairable, blocked)


def repair(
    settings: Settings,
    *,
    table: str | None = None,
    dry_run: bool = False,
    alert_history: Callable[[], AlertHistory] | None = None,
) -> RepairReport:
    """Rebuild the damaged derived tables of ``settings.lakehouse_root`` (or ``table`` alone), holding
    the job's checkpoint. ``alert_history`` reads the alerts topic (default: from ``settings.kafka``)."""
    from streaming.job import locked_checkpoint

    if settings.object_store.lakehouse_url:
        raise ConfigError(
            f"bkaudit repair rebuilds a local lakehouse only: object_store.lakehouse_url is "
            f"{settings.object_store.lakehouse_url}; copy the tables to a local lakehouse_root, repair them "
            "there and copy them back, or restore them from the store's versioning"
        )
    root = settings.lakehouse_root
    if table is not None and table not in REBUILT_FROM:
        known = recorded_tables(root) | set(REBUILT_FROM)
        if table not in known:
            raise ConfigError(f"--table {table}: no such table (one of {', '.join(sorted(REBUILT_FROM))})")
        raise ConfigError(f"--table {table}: {what_to_do(table)}")
    if not (Path(root) / TABLES_RECORD).is_file():
        raise ConfigError(
            f"no lakehouse written by `bkaudit stream` at {root} ({TABLES_RECORD} is missing): check "
            "lakehouse_root (BKAUDIT_LAKEHOUSE_ROOT)"
        )
    with locked_checkpoint(settings):
        found = plan(damaged_tables(root), table)
        report = RepairReport(found, [], dry_run)
        if dry_run:
            return report
        index: dict[str, int] | None = None
        if {"ledgers", "ledger_bookies"} <= set(found.rebuild):  # the fold appends to a readable index
            index = recreate(root, "ledger_bookies")
        for name in found.rebuild:
            if name == "ledgers":
                if name not in found.damaged:
                    _refuse_to_shrink(name, ledgers_in_changes(root), read_current_ledgers(root).num_rows)
                report.rebuilt.append(
                    rebuild_ledgers(root, settings.stream.app_id, settings.stream.ledger_table_buckets)
                )
            elif name == "ledger_bookies":
                report.rebuilt.append(rebuild_index(root, index))
            elif name == "open_alerts":
                report.rebuilt.append(rebuild_open_alerts(root))
            else:
                history = (alert_history or _alert_history(settings))()
                report.topic_truncated = dict(history.truncated)
                records = [(r.key, r.alert) for r in history.records if r.alert is not None]
                if name not in found.damaged:
                    held = DeltaTable(table_path(root, name)).to_pyarrow_table(columns=["alert_id"]).num_rows
                    _refuse_to_shrink(name, violation_rows(records).num_rows, held)
                report.rebuilt.append(rebuild_violations(root, records))
    return report


def _refuse_to_shrink(name: str, source_rows: int, rows: int) -> None:
    """A whole table rebuilt on request (``--table``) must not lose rows its source no longer holds.

    Example:
        >>> try:
        ...     _refuse_to_shrink("violations", 10, 14)
        ... except ConfigError as err:
        ...     print(str(err).split(": a rebuild")[1])
         would lose 4; violations is whole, left as it is
    """
    if source_rows >= rows:
        return
    raise ConfigError(
        f"--table {name}: {REBUILT_FROM[name]} holds {source_rows} rows of the {rows} in {name} (the others "
        f"are past its retention): a rebuild would lose {rows - source_rows}; {name} is whole, left as it is"
    )


def _alert_history(settings: Settings) -> Callable[[], AlertHistory]:
    from connectors.kafka.alert_tail import read_alert_history
    from connectors.kafka.client_config import kafka_errors

    def read() -> AlertHistory:
        with kafka_errors(settings.kafka, "read the alerts topic"):
            return read_alert_history(settings.kafka)

    return read


__all__ = ["ORDER", "RepairPlan", "RepairReport", "plan", "repair"]
