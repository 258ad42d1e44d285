"""The ledger lane's ``foreachBatch`` sink: ledgers, placement, probes, snapshots, alerts, feedback.

:meth:`AuditSink.process` runs one micro-batch of decisions (:data:`streaming.schemas.DECISION_SCHEMA`)
through named stages: read the state as of before the batch; apply the decisions in event-time order
(:mod:`streaming.sink_batch`, one handler per kind); re-check the ledgers a rack move or a valid rack map
again affects; reconcile complete FULL snapshots; evaluate placement; probe (:mod:`streaming.probe_stage`);
publish the alert transitions and feedback; write the tables (ledgers through
:mod:`connectors.delta.ledger_log`: appended, folded in the background); hand membership decisions and
changed ledgers to the loss owner (:mod:`streaming.loss`); then the tables' upkeep (:mod:`streaming.upkeep`).
Why a replayed batch changes nothing is stated once, in :meth:`AuditSink.process`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from connectors.delta.ledger_log import LedgerLog
from connectors.delta.placement_plans import PlacementPlanner
from connectors.delta.scan import scan
from connectors.delta.tables import (
    APP_METADATA_KEY,
    BOOKIES,
    DEAD_LETTERS,
    LEDGERS,
    SNAPSHOT_SEEN,
    TOPICS,
    BatchWriter,
    OpenTables,
    ensure_tables,
    table_before_batch,
)
from core.domain.alert_book import AlertBook
from core.domain.alerts import AlertKind, AlertState
from streaming.decode import ARROW_CHANGE_SCHEMA
from streaming.loss import (
    OWNED_ALERT_KINDS,
    LossAuditor,
    loss_app,
    membership_app,
    record_transitions,
    utc_from_ms,
)
from streaming.memory import give_back
from streaming.probe_stage import ProbeStage
from streaming.processor import DECISION_COLUMNS
from streaming.publish import publish
from streaming.reports import REPORTS_KEPT, BatchReport, keep_recent
from streaming.sink_batch import (
    CARRIED_COLUMNS,
    VERSION_ONLY_KINDS,
    SinkBatch,
    apply_decisions,
    evaluate_ledgers,
    rack_map_is_invalid,
)
from streaming.sink_config import SinkConfig
from streaming.sink_versions import (
    LazyRows,
    parse_payloads,
    plan_versions,
    snapshot_sightings,
    split_versions,
    version_rows,
)
from streaming.topics import TopicsStage
from streaming.upkeep import TableUpkeep

if TYPE_CHECKING:
    from streaming.metrics import StreamMetrics

logger = logging.getLogger(__name__)

#: A batch of at least this many decisions gives the memory it leaves behind back to the system when it
#: ends (:mod:`streaming.memory`, ~0.1 s; a batch of 100,000 takes seconds).
GIVE_BACK_AFTER_DECISIONS = 20_000


#: What the sink receives per batch (:data:`streaming.schemas.DECISION_SCHEMA` as Arrow): the processor's
#: decision columns, typed as the decoder types them; tests and benchmarks build decision tables with it.
ARROW_DECISION_SCHEMA = pa.schema(
    [pa.field(name, ARROW_CHANGE_SCHEMA.field(name).type) for name in DECISION_COLUMNS]
)


def kafka_partition(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key`` (Java client's murmur2, librdkafka's).

    Example:
        >>> kafka_partition("ledger/1", 1)
        0
    """
    from connectors.kafka.publisher import partition_for_key

    return partition_for_key(key.encode("utf-8"), partitions)  # the watcher's own rule: one implementation


def _read_unknown_placement(log: LedgerLog) -> list[dict[str, Any]]:
    """Live closed ledgers whose ``placement`` is null: not evaluated while the rack map was invalid (their
    ids found a few buckets at a time, then their whole rows)."""
    found = []
    for rows in log.current_chunks(["ledger_id", "placement", "state", "deleted"]):
        unknown = pc.and_(pc.is_null(rows.column("placement")), pc.equal(rows.column("state"), "CLOSED"))
        live = pc.invert(pc.fill_null(rows.column("deleted"), False))
        found.append(rows.filter(pc.fill_null(pc.and_(unknown, live), False)).column("ledger_id").to_numpy())
    ids = np.concatenate(found) if found else np.empty(0, np.int64)
    return sorted(log.take(ids).to_pylist(), key=lambda row: row["ledger_id"])


def _known_versions(log: LedgerLog, ledger_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """The current version (``mzxid``, ``deleted``) of each known ledger among ``ledger_ids``, with the
    columns a new version keeps, looked up in bulk: all a new version's event needs of the ledger's row."""
    if not ledger_ids:
        return {}
    ids = np.unique(np.asarray(ledger_ids, dtype=np.int64))
    found = log.take(ids, ["ledger_id", "mzxid", "deleted", *CARRIED_COLUMNS])
    return {row.pop("ledger_id"): row for row in found.to_pylist()}


#: The ``bookies`` columns the ledger lane writes: the rack map's and what its probes learned (membership is
#: :mod:`streaming.loss`'s).
SINK_BOOKIE_COLUMNS = ("bookie_id", "cluster", "rack", "rack_group", "answers_entry_lists", "updated_at")


def _only_loss_owner_committed(table: Any, since_version: int, app_id: str) -> bool:
    """Whether every commit of ``table`` after ``since_version`` is the loss owner's (its kinds are left out
    of the ledger lane's cached open alerts, which therefore still hold)."""
    newer = table.version() - since_version
    if newer <= 0:
        return newer == 0
    owners = {loss_app(app_id), membership_app(app_id)}
    history = table.history(newer)
    return len(history) == newer and all(c.get(APP_METADATA_KEY) in owners for c in history)


def _ms(value: datetime | None, *, default: int) -> int:
    """Milliseconds since the epoch of a table timestamp (``default`` when null)."""
    return default if value is None else int(value.timestamp() * 1000)


def _epoch_ms(times: pa.ChunkedArray) -> np.ndarray:
    """A timestamp column (any unit; Spark's collect and the sink queue keep microseconds) as epoch ms.

    Example:
        >>> when = pa.chunked_array([pa.array([1_500_000], pa.timestamp("us", tz="UTC"))])
        >>> _epoch_ms(when).tolist()
        [1500]
    """
    as_ms = pc.cast(times, pa.timestamp("ms", tz="UTC"), safe=False)
    return pc.cast(as_ms, pa.int64()).to_numpy()


def _decision_rows(decisions: pa.Table) -> list[dict[str, Any]]:
    """The batch's decisions as rows with their payload parsed and ``at_ms``, in event-time order."""
    rows = decisions.to_pylist()
    for row in rows:
        row["payload"] = json.loads(row["payload"]) if row.get("payload") else {}
        when = row["event_time"]
        row["at_ms"] = int(when.timestamp() * 1000) if isinstance(when, datetime) else int(when or 0)
    rows.sort(key=lambda r: r["at_ms"])
    return rows


class SinkStopping(RuntimeError):
    """Raised for a batch that arrives after a graceful stop began (Spark replays it on restart)."""


def _hold_kept() -> None:
    """The write check of a sink whose job holds its checkpoint for its whole life (a local lock)."""


class AuditSink:
    """The ``foreachBatch`` function (``sink(batch_df, batch_id)``); keeps its Kafka and bookie clients."""

    def __init__(
        self,
        config: SinkConfig,
        metrics: StreamMetrics | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.metrics = metrics
        # Held while a batch runs; a graceful stop takes it so the query is never interrupted mid-call.
        self.busy = threading.Lock()
        self.stopping = threading.Event()
        self._producer: Any = None
        self.reports: list[BatchReport] = []
        # The open alerts after the last batch, with the open_alerts table version they match: the next batch
        # reuses them when the table is still at that version instead of re-reading every open alert (a lost
        # bookie leaves thousands open, and every later batch would pay for them).
        self._open_alerts_cache: tuple[int, dict[Any, Any]] | None = None
        # The bookies table's rows at the version they were read (a new version is read again).
        self._bookie_rows_cache: tuple[int, dict[str, dict[str, Any]]] | None = None
        ensure_tables(config.lakehouse_root)
        # Delta tables kept open between batches, brought up to date with the commits since (opening one
        # afresh reads its log from the last checkpoint: a cost on every batch, growing with the table).
        self.tables = OpenTables(config.lakehouse_root)
        # The ledgers' state: appended per batch, folded into ``ledgers`` in the background, held in memory.
        self.ledger_log = LedgerLog(config.lakehouse_root, config.app_id, buckets=config.ledger_table_buckets)
        # After every fold: the relocation plans of the ledgers with an open placement alert.
        self.ledger_log.after_fold = PlacementPlanner(
            config.lakehouse_root, config.placement, self.ledger_log
        ).refresh
        # The loss alerts' one owner, shared with the membership lane (one producer for both lanes).
        self.loss = LossAuditor(config.lakehouse_root, config.kafka, self._kafka, self.ledger_log)
        # Re-probes and the replicas check (streaming.probe_stage).
        self.probes = ProbeStage(config, self.ledger_log)
        self.loss.check_soon = self.probes.scrutiny.check_soon  # a bookie formatted again: its ledgers first
        # The index's append and cleanup, and Delta maintenance, after each batch (streaming.upkeep).
        self.upkeep = TableUpkeep(config, self.ledger_log, self.tables, self.loss.lock, clock=clock)
        # Pulsar's managed ledgers against the ledgers (streaming.topics).
        self.topics = TopicsStage(
            config.topics, config.topics_state_dir, changes_partitions=config.changes_partitions
        )
        self.write_check: Callable[[], None] = _hold_kept

    def set_write_check(self, check: Callable[[], None]) -> None:
        """Run ``check`` before any batch publishes or writes (here, in the loss owner and in the ledger
        log's folds and index appends): it raises once the job's hold on its checkpoint is gone."""
        self.write_check = check
        self.loss.write_check = check
        self.ledger_log.write_check = check

    # -- clients ------------------------------------------------------------------------------------------
    def _kafka(self) -> Any:
        if self._producer is None:
            from confluent_kafka import Producer

            from connectors.kafka.client_config import failures_only_producer_config

            self._producer = Producer(failures_only_producer_config(self.config.kafka))
        return self._producer

    def kafka_producer(self) -> Any:
        """The job's one producer (alerts, feedback, and the driver-run ledger lane's forwarding)."""
        return self._kafka()

    def start_producer(self) -> None:
        """Open the alert producer now (it connects in the background), not at the first burst."""
        self._kafka()

    def start_folding(self) -> None:
        """Fold the ledger changes into ``ledgers`` every ``ledger_fold_interval_s`` in the background."""
        self.ledger_log.start_folding(
            self.config.ledger_fold_interval_s,
            ticks=self.config.ledger_fold_ticks,
            vacuum_rounds=self.config.ledger_vacuum_rounds,
        )

    def close(self, *, fold: bool = True) -> None:
        """Fold what is left (``fold``), then close the clients (also when the fold raises: a lost lease
        refuses it). Without ``fold`` the background fold stops and what is left stays in
        ``ledger_changes`` for the next start's fold."""
        try:
            self.ledger_log.stop_folding(fold_all=fold)
        finally:
            self._close_clients()

    def _close_clients(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.config.kafka.producer_delivery_timeout_ms / 1000)
            self._producer = None
        self.probes.close()

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        if self.stopping.is_set():
            # Fail the batch (it is replayed after a restart); returning would mark it done unprocessed.
            raise SinkStopping(f"batch {batch_id} arrived while the job is stopping; it will be replayed")
        with self.busy:
            self.process(batch_df.toArrow(), batch_id)

    # -- the batch -----------------------------------------------------------------------------------------
    def process(self, decisions: pa.Table, batch_id: int) -> BatchReport:
        """Run one micro-batch through the named stages below.

        **Why a replayed batch changes nothing** (Spark runs a batch again after a crash at any point of
        it, with the same decisions). Every stage that decides reads the state *as of before this batch*:
        the tables through :func:`~connectors.delta.tables.table_before_batch` (a table that already holds
        this batch's commit is read at the version before it), the ledgers through the ledger log, which
        forgets a replayed batch's first attempt (:meth:`~connectors.delta.ledger_log.LedgerLog.open`).
        Decisions are then functions of the batch and that state, so a replay decides alike: it publishes
        the same alert ids again (consumers de-duplicate by id) *before* any table is written, and every
        table write carries the app transaction ``(app id, batch id)``, which a table that already has it
        skips. The loss owner's call follows the same rule with its own app id. Probes are the exception
        a replay repeats (their results go to the feedback topic, where the processor drops a stale round).
        """
        started = time.monotonic()
        report = BatchReport(batch_id, decisions=decisions.num_rows)
        versions, rest = split_versions(decisions)
        parsed = parse_payloads(versions.column("payload")) if versions.num_rows else None
        rows = _decision_rows(rest if parsed is not None else decisions)
        batch, open_version = self._read_state(rows, batch_id)
        if parsed is not None:
            self._apply_versions(batch, versions, parsed)
        apply_decisions(batch, rows)
        if batch.needs_rows():
            batch.versions_to_rows()
        self._recheck_moved_racks(batch)
        self._recheck_unknown_placement(batch)
        self._reconcile_snapshots(batch)
        self.topics.apply(batch, rows, self.ledger_log)
        evaluate_ledgers(batch, self.config.placement)
        feedback = self.probes.run(batch, report)  # stage 6
        report.feedback = len(feedback)
        self.write_check()  # a job that lost its hold on the checkpoint publishes and writes nothing
        report.alerts = self._publish(batch.book, feedback)  # before the tables: see above
        self._write_tables(batch, open_version, report)
        self.topics.commit()  # the topics stage's state: after the batch's tables
        self._hand_to_loss_owner(batch, report)
        self._finish(batch, report, started)
        return report

    def _read_state(self, rows: list[dict[str, Any]], batch_id: int) -> tuple[SinkBatch, int]:
        """Stage 1: bookies, the open alerts and the ledgers the decisions touch, as of before the batch;
        returns the batch and the ``open_alerts`` version its alerts were read at."""
        root, app = self.config.lakehouse_root, self.config.app_id
        cluster = next((r["cluster"] for r in rows if r.get("cluster")), None) or self.config.cluster_default
        bookie_rows = self._bookie_rows(table_before_batch(root, "bookies", app, batch_id, self.tables))
        open_table = table_before_batch(root, "open_alerts", app, batch_id, self.tables)
        cached, self._open_alerts_cache = self._open_alerts_cache, None  # valid again only if all goes well
        if cached is not None and _only_loss_owner_committed(open_table, cached[0], app):
            book = AlertBook(cluster, open=dict(cached[1]))
        else:
            # The loss kinds are streaming.loss's: this lane neither fires nor resolves them.
            open_rows = open_table.to_pyarrow_table().to_pylist()
            book = AlertBook.from_rows(
                cluster, (r for r in open_rows if AlertKind(r["kind"]) not in OWNED_ALERT_KINDS)
            )
        log = self.ledger_log
        log.open(batch_id)  # the ledgers as of before this batch (already open: a no-op)
        log.batch_started(batch_id)
        batch = SinkBatch(
            batch_id=batch_id,
            cluster=cluster,
            book=book,
            bookie_rows=bookie_rows,
            changes_partitions=self.config.changes_partitions,
            racks={b: r.get("rack") for b, r in bookie_rows.items()},
            groups={b: r.get("rack_group") for b, r in bookie_rows.items()},
            rack_map_invalid=rack_map_is_invalid(book),
        )
        # Whole rows for the ledgers a decision other than a new version touches; the version alone for the
        # rest (a duplicate or older version is dropped, a newer one replaces the whole row).
        batch.ledgers = log.rows(
            r["ledger_id"]
            for r in rows
            if r.get("ledger_id") is not None and r["kind"] not in VERSION_ONLY_KINDS
        )
        batch.known = _known_versions(log, [r["ledger_id"] for r in rows if r["kind"] in VERSION_ONLY_KINDS])
        return batch, open_table.version()

    def _bookie_rows(self, table: DeltaTable) -> dict[str, dict[str, Any]]:
        """The ``bookies`` rows by id at ``table``'s version, read once per version (the batch replaces
        rows in the dict it gets, never changes one in place)."""
        cached = self._bookie_rows_cache
        version = table.version()
        if cached is None or cached[0] != version:
            rows = {r["bookie_id"]: r for r in table.to_pyarrow_table().to_pylist()}
            cached = self._bookie_rows_cache = (version, rows)
        return dict(cached[1])

    def _apply_versions(self, batch: SinkBatch, decisions: pa.Table, parsed: pa.Table) -> None:
        """Stage 2a: the new versions of ledgers nothing else in the batch names, column by column
        (:mod:`streaming.sink_versions`; the same result as the ``ledger_state`` handler's)."""
        ids = decisions.column("ledger_id").to_numpy()
        at_ms = _epoch_ms(decisions.column("event_time"))
        current, gone = self.ledger_log.versions(ids)
        plan = plan_versions(ids, at_ms, parsed.column("mzxid").to_numpy(), current, gone)
        changed = np.unique(ids[plan.final])
        carried = self.ledger_log.take(changed, ["ledger_id", *CARRIED_COLUMNS])
        batch.versions = version_rows(decisions, parsed, plan, batch.cluster, carried)
        self.probes.scrutiny.ledger_closed(
            newly_closed(self.ledger_log.take(changed, ["ledger_id", "state"]), batch.versions)
        )
        batch.versions_at_ms, batch.versions_first_at_ms = plan.final_at_ms, plan.first_at_ms
        seen_ids, seen_at = ids[plan.seen], at_ms[plan.seen]
        order = np.argsort(seen_at, kind="stable")  # the latest time of each ledger written last
        batch.exists_at_ms.update(zip(seen_ids[order].tolist(), seen_at[order].tolist(), strict=True))
        sightings = snapshot_sightings(decisions, parsed, plan.seen, batch.changes_partitions)
        if sightings.num_rows:
            batch.snapshot_seen_tables.append(sightings)

    def _recheck_moved_racks(self, batch: SinkBatch) -> None:
        """Stage 3: the ledgers on bookies whose rack or affinity group moved are evaluated again (through
        the index)."""
        if not batch.moved:
            return
        moved = batch.moved
        indexed = self.ledger_log.read_index(
            self.tables.get("ledger_bookies"), sorted(moved), ["bookie", "ledger_id", "mzxid"]
        ).to_pylist()
        affected: dict[int, int] = {}
        for entry in indexed:
            if entry["ledger_id"] not in batch.index_replace:  # replaced now: its new bookies below
                when = moved[entry["bookie"]]
                affected[entry["ledger_id"]] = max(affected.get(entry["ledger_id"], when), when)
        for ledger_id, bookies_now in batch.index_replace.items():
            hits = [moved[b] for b in bookies_now if b in moved]
            if hits:
                affected[ledger_id] = max(affected.get(ledger_id, 0), *hits)
        batch.ledgers.update(self.ledger_log.rows(i for i in affected if i not in batch.ledgers))
        for ledger_id, when in affected.items():
            batch.evaluate_at(ledger_id, when)

    def _recheck_unknown_placement(self, batch: SinkBatch) -> None:
        """Stage 3b: a valid rack map again re-checks the closed ledgers whose placement became unknown
        while the map was invalid."""
        recovered_ms = batch.rack_map_recovered_ms
        if recovered_ms is None:
            return
        for found in _read_unknown_placement(self.ledger_log):
            batch.ledgers.setdefault(found["ledger_id"], found)
            batch.evaluate_at(found["ledger_id"], recovered_ms)

    def _reconcile_snapshots(self, batch: SinkBatch) -> None:
        """Stage 4: ledgers absent from a complete FULL snapshot are gone."""
        for done in batch.snapshots_complete:
            vanished = self._vanished(batch, done)
            batch.ledgers.update(self.ledger_log.rows(i for i in vanished if i not in batch.ledgers))
            for ledger_id in vanished:
                before = batch.row_or_new(ledger_id)
                batch.ledgers[ledger_id] = {
                    **before,
                    "deleted": True,
                    "updated_at": utc_from_ms(done["at_ms"]),
                }
                batch.index_replace[ledger_id] = []
                batch.touch(ledger_id, done["at_ms"])

    def _write_tables(self, batch: SinkBatch, open_version: int, report: BatchReport) -> None:
        """Stage 8: every table, each with the batch's app transaction (skipped when a replay finds it)."""
        root = self.config.lakehouse_root
        writer = BatchWriter(root, self.config.app_id, batch.batch_id, self.tables)
        written = []
        versions = batch.versions if batch.versions is not None and batch.versions.num_rows else None
        if batch.changed_ledgers or versions is not None:
            ledger_rows = [batch.ledgers[i] for i in sorted(batch.changed_ledgers)]
            written.append(self.ledger_log.record(writer, ledger_rows, versions))
            report.ledgers_written = len(ledger_rows) + (versions.num_rows if versions is not None else 0)
        open_alerts_version: int | None = open_version  # unchanged unless written below
        book = batch.book
        with self.loss.lock:  # tables the loss owner writes too: one commit at a time
            if batch.bookies_changed:
                rows_out = [batch.bookie_rows[b] for b in sorted(batch.bookies_changed)]
                table = pa.Table.from_pylist(rows_out, schema=BOOKIES.schema)
                written.append(writer.upsert("bookies", table, columns=SINK_BOOKIE_COLUMNS))
            if book.transitions:
                open_written, violations_written = record_transitions(writer, book)
                written.extend([open_written, violations_written])
                # Written now: the table's new version. Skipped (a replay found it done): unknown, no cache.
                open_alerts_version = self.tables.get("open_alerts").version() if open_written else None
        if batch.dead_letters:
            table = pa.Table.from_pylist(batch.dead_letters, schema=DEAD_LETTERS.schema)
            written.append(writer.append("dead_letters", table))
        if batch.topic_rows:
            table = pa.Table.from_pylist(batch.topic_rows, schema=TOPICS.schema)
            written.append(writer.upsert("topics", table))
        if batch.snapshot_seen or batch.snapshot_seen_tables:
            table = pa.concat_tables(
                [
                    pa.Table.from_pylist(batch.snapshot_seen, schema=SNAPSHOT_SEEN.schema),
                    *batch.snapshot_seen_tables,
                ]
            )
            written.append(writer.append("snapshot_seen", table))
        report.skipped_replay_tables = sum(1 for w in written if not w)
        if open_alerts_version is not None:
            self._open_alerts_cache = (open_alerts_version, dict(book.open))

    def _hand_to_loss_owner(self, batch: SinkBatch, report: BatchReport) -> None:
        """Stage 9: the membership decisions, and this batch's changed ledgers against the lost set (after
        their index rows are written: see streaming.loss for why no ledger falls between the lanes)."""
        versions = batch.versions if batch.versions is not None else LEDGERS.schema.empty_table()
        ids = versions.column("ledger_id").to_numpy()
        loss = self.loss.apply(
            app_id=loss_app(self.config.app_id),
            batch_id=batch.batch_id,
            cluster=batch.cluster,
            membership=batch.membership,
            changed_rows=LazyRows(
                {i: batch.ledgers[i] for i in batch.index_replace if i in batch.ledgers},
                ids,
                versions.to_pylist,
            ),
            changed_at_ms=LazyRows(
                {i: batch.trigger_ms.get(i, 0) for i in batch.index_replace}, ids, batch.versions_at_ms.tolist
            ),
            named_bookies=named_bookies(versions, batch.versions_at_ms, batch),
        )
        report.alerts.extend(loss.alerts)
        report.skipped_replay_tables += loss.skipped_replay_tables

    def _finish(self, batch: SinkBatch, report: BatchReport, started: float) -> None:
        """Stage 10: the report and metrics, then maintenance."""
        report.dead_letters = dict(Counter(row["source"] for row in batch.dead_letters))
        open_counts = Counter(kind.value for _, kind in batch.book.open) + Counter(self.loss.open_counts())
        report.open_alerts = dict(sorted(open_counts.items()))
        self.probes.note(report)
        self.upkeep.after_batch(batch.batch_id)
        if report.decisions >= GIVE_BACK_AFTER_DECISIONS:
            give_back()
        report.seconds = round(time.monotonic() - started, 3)
        if self.metrics is not None:
            self.metrics.on_batch(report)  # the one place the sink's metrics are updated
        keep_recent(self.reports, report, REPORTS_KEPT)

    # -- helpers -------------------------------------------------------------------------------------------
    def _vanished(self, batch: SinkBatch, done: dict[str, Any]) -> list[int]:
        """The ledgers of partition p that a complete FULL snapshot of p shows gone.

        A ledger vanished only if the tables hold it as not deleted, the snapshot did not report it, and
        nothing about it happened at or after the snapshot's begin: the watcher's event time never goes
        back within a run, so an event at or after the begin's time (a live create during or after the
        scan, in this batch or an earlier one) proves the znode was there (docs/journal.md, "Vanished
        ledgers"). A snapshot whose begin the job did not see is not used.
        """
        snapshot_id, partition = done["snapshot_id"], int(done["partition"])
        begin_ms = done.get("begin_ms")
        if begin_ms is None:
            logger.warning(
                "snapshot %s on partition %d: its begin was not read by this job; no vanished-ledger "
                "reconciliation from it (the next complete FULL snapshot does it)",
                snapshot_id,
                partition,
            )
            return []
        partitions = int(done.get("partition_count") or self.config.changes_partitions)
        root, app = self.config.lakehouse_root, self.config.app_id
        seen_table = table_before_batch(root, "snapshot_seen", app, batch.batch_id)
        ledgers, exists_at_ms = batch.ledgers, batch.exists_at_ms
        # The ledgers the snapshot reported, as one sorted array (a set of a million ints is ~60 MB).
        seen = [scan(seen_table, [("snapshot_id", "=", snapshot_id)], ["ledger_id"]).column("ledger_id")]
        seen.append(
            pa.array([r["ledger_id"] for r in batch.snapshot_seen if r["snapshot_id"] == snapshot_id])
        )
        for sightings in batch.snapshot_seen_tables:
            mine = pc.equal(sightings.column("snapshot_id"), snapshot_id)
            seen.append(sightings.column("ledger_id").filter(mine))
        seen_sorted = np.unique(
            np.concatenate([np.asarray(pc.cast(ids, pa.int64()).to_numpy(), np.int64) for ids in seen])
        )
        # Known before the begin: rows not deleted whose last change is older (this batch's rows supersede).
        begin = pa.scalar(utc_from_ms(begin_ms), type=LEDGERS.schema.field("updated_at").type)
        candidates: set[int] = set()
        for rows in self.ledger_log.current_chunks(["ledger_id", "deleted", "updated_at"]):
            not_deleted = pc.or_(pc.is_null(rows["deleted"]), pc.invert(pc.fill_null(rows["deleted"], True)))
            older = pc.or_(pc.is_null(rows["updated_at"]), pc.less(rows["updated_at"], begin))
            known = rows.filter(pc.and_(not_deleted, older)).column("ledger_id").to_numpy()
            unseen = known[~np.isin(known, seen_sorted)]  # what the snapshot reported cannot vanish
            candidates.update(i for i in unseen.tolist() if i not in ledgers)
        candidates |= {
            i
            for i, r in ledgers.items()
            if not r.get("deleted") and _ms(r.get("updated_at"), default=-1) < begin_ms
        }
        found = np.fromiter(candidates, np.int64, len(candidates))
        candidates = set(found[~np.isin(found, seen_sorted)].tolist())
        return sorted(
            i
            for i in candidates
            if exists_at_ms.get(i, -1) < begin_ms and kafka_partition(f"ledger/{i}", partitions) == partition
        )

    def _publish(self, book: AlertBook, feedback: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send the batch's alert transitions and feedback; returns the alerts as published (JSON objects)."""
        if not book.transitions and not feedback:
            return []
        return publish(self._kafka(), self.config.kafka, book.transitions, feedback)


def open_alert_counts(root: str | Path) -> dict[str, int]:
    """Current number of open alerts per kind (for the audit gauges).

    Example:
        >>> import tempfile; open_alert_counts(tempfile.mkdtemp())
        {}
    """
    from connectors.delta.tables import read_table

    counts: dict[str, int] = defaultdict(int)
    for kind in read_table(root, "open_alerts").column("kind").to_pylist():
        counts[kind] += 1
    return dict(counts)


__all__ = ["AlertState", "AuditSink", "BatchReport", "SinkConfig", "kafka_partition", "open_alert_counts"]


def newly_closed(before: pa.Table, after: pa.Table) -> list[int]:
    """The ledgers ``after`` shows CLOSED that ``before`` (their rows before the batch) showed open or in
    recovery: a ledger first seen closed (a snapshot at start-up) is the walk's, not a close.

    Example:
        >>> before = pa.table({"ledger_id": [1, 2, 3], "state": ["OPEN", "CLOSED", "IN_RECOVERY"]})
        >>> after = pa.table({"ledger_id": [1, 2, 3, 4], "state": ["CLOSED", "CLOSED", "CLOSED", "CLOSED"]})
        >>> newly_closed(before, after)
        [1, 3]
    """
    was_open = before.filter(pc.invert(pc.fill_null(pc.equal(before.column("state"), "CLOSED"), False)))
    now_closed = after.filter(pc.fill_null(pc.equal(after.column("state"), "CLOSED"), False))
    ids = now_closed.column("ledger_id").to_numpy()
    return sorted(ids[np.isin(ids, was_open.column("ledger_id").to_numpy())].tolist())


def named_bookies(versions: pa.Table, versions_at_ms: np.ndarray, batch: SinkBatch) -> dict[str, int]:
    """The bookies the batch's changed ledgers name, each with the latest event time of the batch's changes
    (a name is judged once the membership lane has read past it: later is the safe side)."""
    names = set(pc.unique(pc.list_flatten(versions.column("bookies"))).drop_null().to_pylist())
    at_ms = [int(versions_at_ms.max())] if len(versions_at_ms) else []
    for ledger_id in batch.index_replace:
        row = batch.ledgers.get(ledger_id)
        if row is not None and not row.get("deleted"):
            names.update(row.get("bookies") or ())
            at_ms.append(int(batch.trigger_ms.get(ledger_id, 0)))
    if not names:
        return {}
    latest = max(at_ms) if at_ms else 0
    return dict.fromkeys(sorted(names), latest)
