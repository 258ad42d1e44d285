"""What a batch of either lane did: the reports the job's metrics, logs, tests and benchmarks read.

Example:
    >>> BatchReport(3, decisions=10).decisions, LossReport("bkaudit.membership", 3).alerts
    (10, [])
    >>> LossReport("bkaudit.membership", 4, values=[b'{"kind":"BOOKIE_LOST"}']).alerts
    [{'kind': 'BOOKIE_LOST'}]
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class BatchReport:
    """What one batch did (for logs, metrics and tests).

    The counts are the work this run of the batch did: a batch Spark replays (the sink ran, the commit did
    not) reports its probes, alerts and rows again, even when the tables skip its writes as already done.
    ``probe_outcomes`` is keyed ``(reason, outcome)``: reason ``reprobe`` (the processor asked) or
    ``scrutiny`` (the background pass), outcome ``healthy`` or ``failing``
    (:attr:`~connectors.bookie.ledger_probe.LedgerProbeOutcome.failing`). ``dead_letters`` is keyed by the
    rows' ``source``: ``kafka`` (a record that is not a change event) or ``znode`` (undecodable metadata).
    """

    batch_id: int
    decisions: int = 0
    alerts: list[dict[str, Any]] = field(default_factory=list)
    feedback: int = 0
    probes: int = 0
    probe_outcomes: dict[tuple[str, str], int] = field(default_factory=dict)  # (reason, outcome) → probes
    dead_letters: dict[str, int] = field(default_factory=dict)  # source → rows
    ledgers_written: int = 0
    skipped_replay_tables: int = 0
    open_alerts: dict[str, int] = field(default_factory=dict)  # kind → open count after the batch
    seconds: float = 0.0
    # The background replicas check: when its current pass began and its last one ended (epoch ms), and
    # how long a pass takes at its pace (None: no walk).
    scrutiny_pass_started_ms: int | None = None
    scrutiny_last_full_pass_ms: int | None = None
    scrutiny_expected_pass_s: float | None = None


@dataclass
class LossReport:
    """What one :meth:`LossAuditor.apply` did (for logs, metrics, tests and benchmarks).

    The alerts are kept as the values published (a loss publishes tens of thousands: decoding them all for
    every call would cost more than publishing); :attr:`alerts` decodes them when asked.
    """

    app_id: str
    batch_id: int
    values: list[bytes] = field(default_factory=list)  # the alerts published, as on Kafka
    transitions: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, state) → alerts
    ledgers_evaluated: int = 0
    bookies_written: int = 0
    ledgers_rechecked: int = 0  # closed ledgers of bookies formatted again, handed to the replicas check
    skipped_replay_tables: int = 0  # writes a replay found already done
    published_at: float | None = None  # wall time every alert of the call was acknowledged
    seconds: float = 0.0
    phase_s: dict[str, float] = field(default_factory=dict)  # seconds per step, in order (see LossAuditor)

    @property
    def alerts(self) -> list[dict[str, Any]]:
        """The alerts published, as their JSON objects (docs/alerts.md, "The alert object")."""
        return [json.loads(value) for value in self.values]


def keep_recent(reports: list[Any], report: Any, keep: int) -> None:
    """Append ``report`` and drop all but the newest ``keep``: a job runs for months, and a loss's report
    holds every alert it published.

    Example:
        >>> kept = [1, 2, 3]
        >>> keep_recent(kept, 4, keep=3)
        >>> kept
        [2, 3, 4]
    """
    reports.append(report)
    if len(reports) > keep:
        del reports[:-keep]


#: How many reports a lane keeps in memory (for tests, the demo and benchmarks; metrics are cumulative).
REPORTS_KEPT = 1000


__all__ = ["REPORTS_KEPT", "BatchReport", "LossReport", "keep_recent"]
