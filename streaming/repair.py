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

from connectors.delta.health import REBUILT_FROM, recorded_tables, what_to_do
from connectors.delta.repair import (
    Rebuilt,
    damaged_tables,
    rebuild_index,
    rebuild_ledgers,
    rebuild_open_alerts,
    rebuild_violations,
)
from connectors.kafka.alert_tail import AlertHistory
from core.errors import ConfigError
from core.settings import Settings

#: Sources first: each table after the one it is rebuilt from.
ORDER = ("ledgers", "ledger_bookies", "violations", "open_alerts")
#: The tables each rebuild reads besides its source.
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

    root = settings.lakehouse_root
    if table is not None and table not in REBUILT_FROM:
        known = recorded_tables(root) | set(REBUILT_FROM)
        if table not in known:
            raise ConfigError(f"--table {table}: no such table (one of {', '.join(sorted(REBUILT_FROM))})")
        raise ConfigError(f"--table {table}: {what_to_do(table)}")
    with locked_checkpoint(settings):
        found = plan(damaged_tables(root), table)
        report = RepairReport(found, [], dry_run)
        if dry_run:
            return report
        for name in found.rebuild:
            if name == "ledgers":
                report.rebuilt.append(rebuild_ledgers(root, settings.stream.app_id))
            elif name == "ledger_bookies":
                report.rebuilt.append(rebuild_index(root))
            elif name == "open_alerts":
                report.rebuilt.append(rebuild_open_alerts(root))
            else:
                history = (alert_history or _alert_history(settings))()
                report.topic_truncated = dict(history.truncated)
                records = [(r.key, r.alert) for r in history.records if r.alert is not None]
                report.rebuilt.append(rebuild_violations(root, records))
    return report


def _alert_history(settings: Settings) -> Callable[[], AlertHistory]:
    from connectors.kafka.alert_tail import read_alert_history
    from connectors.kafka.client_config import kafka_errors

    def read() -> AlertHistory:
        with kafka_errors(settings.kafka, "read the alerts topic"):
            return read_alert_history(settings.kafka)

    return read


__all__ = ["ORDER", "RepairPlan", "RepairReport", "plan", "repair"]
