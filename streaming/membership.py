"""The membership lane: from a bookie's registration to its ledgers' alerts, beside the ledger lane.

``changes topic (every record but ledger/…) → MembershipLane.process``, run by a driver thread
(:mod:`streaming.driver_batches`) with no Spark task and no stateful operator. Per micro-batch the lane

1. decodes the records with the ledger lane's decoder (dead letters and future events are the ledger
   lane's to record: it reads every record too);
2. applies bookie registrations, ``lostBookieRecoveryDelay``, AutoRecovery's znodes and heartbeats (the
   event-time clock) to :class:`~core.domain.rules.lost_bookie.BookieMembership` and
   :class:`~core.domain.rules.autorecovery.AutoRecoveryHealth` through the same
   :class:`~streaming.processor.ClusterLogic` the stateful processor used: BookKeeper's debounce (the delay
   from ZooKeeper, no delay when more than one bookie is missing, a return within the delay is a flap),
   with the at-risk ledgers the Auditor has not marked as the auditor knows them when the batch starts
   (``AUDITOR_LAGGING``);
3. hands the resulting decisions to :class:`~streaming.loss.LossAuditor`, which reads only the lost bookie's
   index partition, applies the vectorised lost-bookie rule, publishes, then records in Delta;
4. saves its state (a few kB: one entry per bookie) as ``<batch id>.json`` in its checkpoint: the batch's
   commit.

A batch starts from the state saved by the newest batch before it, so a replay after a crash (the same
records, :class:`~streaming.driver_batches.OffsetLog`) decides what its first attempt decided, and the
auditor's app transaction skips what that attempt already recorded: no alert lost, none re-fired under a
new id. ``AUDITOR_LAGGING``'s input (the auditor's open ledger alerts and the ledgers' marks) is not in the
records: it is saved per batch before the batch decides (``<state dir>/lagging-inputs``), and a replay reads
it back. Rack-map events stay with the ledger lane (they change placement, a ledger-lane rule).

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> store = MembershipStateStore(Path(tempfile.mkdtemp()))
    >>> store.save(3, {"bookies": {}}); store.save(5, {"bookies": {"b1": {}}})
    >>> store.before(5), store.before(9)
    ({'bookies': {}}, {'bookies': {'b1': {}}})
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from connectors import storage
from core.domain.rules.auditor_lag import UnmarkedAtRisk
from streaming.decode import decode_batches
from streaming.driver_batches import BatchFiles, LaneStates
from streaming.loss import MEMBERSHIP_DECISIONS, LossAuditor, membership_app
from streaming.processor import MEMBERSHIP_CHANGES, ClusterLogic, ProcessorConfig, rows_from_frames
from streaming.reports import REPORTS_KEPT, LossReport, keep_recent

if TYPE_CHECKING:
    from streaming.metrics import StreamMetrics

logger = logging.getLogger(__name__)

QUERY_NAME = "bkaudit-membership"
#: Records the membership lane never needs (the source reads past them without building rows).
SKIPPED_KEY_PREFIXES = ("ledger/", "managed-ledger/")


#: The lane's state after each micro-batch, one small JSON file per batch in its checkpoint.
MembershipStateStore = LaneStates
#: The subdirectory of the state directory holding AUDITOR_LAGGING's input per batch.
LAGGING_INPUTS = "lagging-inputs"


@dataclass(frozen=True)
class MembershipLaneConfig:
    """What the lane needs besides the shared auditor; built by ``streaming.job`` from the settings."""

    app_id: str
    feedback_topic: str
    processor: ProcessorConfig
    max_event_time_skew_s: float | None = None
    cluster_default: str = "unknown"
    membership_partition: int = 0  # the changes topic's partition of the bookies' registrations


def membership_rows(records: pa.Table, config: MembershipLaneConfig) -> list[dict[str, Any]]:
    """The batch's membership changes as :class:`ClusterLogic` rows, in event-time order."""
    if not records.num_rows:
        return []
    decoded = pa.Table.from_batches(
        list(
            decode_batches(
                iter(records.to_batches()),
                feedback_topic=config.feedback_topic,
                max_event_time_skew_s=config.max_event_time_skew_s,
            )
        )
    )
    wanted = decoded.filter(pa.compute.is_in(decoded.column("kind"), pa.array(sorted(MEMBERSHIP_CHANGES))))
    if not wanted.num_rows:
        return []
    return rows_from_frames(iter([wanted.to_pandas()]))


def registrations_read_until(rows: list[dict[str, Any]], partition: int) -> int | None:
    """The newest heartbeat of the registrations' partition among ``rows``: every registration the watcher
    published before it has been read (one partition keeps its order). None without one.

    Example:
        >>> rows = [{"kind": "heartbeat", "event_time_ms": 9, "payload": {"partition": 1}},
        ...         {"kind": "heartbeat", "event_time_ms": 7, "payload": {"partition": 0}}]
        >>> registrations_read_until(rows, 0), registrations_read_until(rows, 2)
        (7, None)
    """
    times = [
        row["event_time_ms"]
        for row in rows
        if row["kind"] == "heartbeat" and (row.get("payload") or {}).get("partition") == partition
    ]
    return max(times) if times else None


class MembershipLane:
    """The membership lane's batch function; see the module docstring."""

    def __init__(
        self,
        config: MembershipLaneConfig,
        auditor: LossAuditor,
        store: MembershipStateStore,
        metrics: StreamMetrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.auditor = auditor
        self.store = store
        self.logic = ClusterLogic(config.processor)
        self.reports: list[LossReport] = []
        # AUDITOR_LAGGING's input per batch, written before the batch decides: a replay reads it back.
        self.lagging_inputs = BatchFiles(storage.join(store.directory, LAGGING_INPUTS), keep=store.keep)

    def process(self, records: pa.Table, batch_id: int) -> LossReport:
        """Apply one micro-batch of raw Kafka records (the source's columns plus ``batch_time``); its
        state file, saved last, is the batch's commit."""
        rows = membership_rows(records, self.config)
        state = self.store.before(batch_id)
        cluster = next((r["cluster"] for r in reversed(rows) if r.get("cluster")), None)
        cluster = cluster or (state or {}).get("cluster") or self.config.cluster_default
        unmarked = self._lagging_input(batch_id)
        new_state, decisions, _ = self.logic.apply(state, rows, unmarked)
        new_state["cluster"] = cluster
        membership = [
            {
                "kind": d["kind"],
                "at_ms": d["event_time_ms"],
                "bookie_id": d["bookie_id"],
                "ledger_id": d["ledger_id"],
                "payload": d["payload"],
            }
            for d in decisions
            if d["kind"] in MEMBERSHIP_DECISIONS
        ]
        report = self.auditor.apply(
            app_id=membership_app(self.config.app_id),
            batch_id=batch_id,
            cluster=cluster,
            membership=membership,
            membership_clock_ms=registrations_read_until(rows, self.config.membership_partition),
        )
        self.store.save(batch_id, new_state)
        if self.metrics is not None:
            self.metrics.on_membership_batch(report, self.auditor.open_counts())
        if report.values or report.bookies_written:
            keep_recent(self.reports, report, REPORTS_KEPT)
        return report

    def _lagging_input(self, batch_id: int) -> UnmarkedAtRisk | None:
        """AUDITOR_LAGGING's input (None: its check is off), judged at the batch's event times: the at-risk
        ledgers the Auditor has not marked, as the auditor knows them when the batch first ran. It is read
        outside the batch's records, so it is saved before the batch decides and a replay reads the first
        attempt's (it decides, and names its alert, as that attempt did)."""
        if self.config.processor.autorecovery.lagging_s <= 0:
            return None
        if self.lagging_inputs.saved(batch_id):
            return UnmarkedAtRisk.from_json(self.lagging_inputs.read(batch_id))
        unmarked = self.auditor.unmarked_at_risk()
        self.lagging_inputs.save(batch_id, unmarked.to_json())
        return unmarked


__all__ = [
    "QUERY_NAME",
    "SKIPPED_KEY_PREFIXES",
    "MembershipLane",
    "MembershipLaneConfig",
    "MembershipStateStore",
    "membership_app",
    "membership_rows",
]
