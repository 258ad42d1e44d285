"""The lost-bookie alerts of the job: one owner shared by its two lanes.

``BOOKIE_LOST``, ``LEDGER_UNDER_REPLICATED`` and ``LEDGER_UNRECOVERABLE`` are decided here and nowhere else,
by :meth:`LossAuditor.apply`, from

- membership decisions (the membership lane, :mod:`streaming.membership`): a bookie lost or returned sends
  the ledgers of its partition of the ``ledger_bookies`` index through the vectorised lost-bookie rule
  (:func:`~core.domain.rules.lost_ledgers.lost_bookie_verdicts`), with no Spark state and no read of the
  ``ledgers`` table;
- changed ledgers (the ledger lane, :class:`streaming.sink.AuditSink`, *after* it wrote their index rows):
  their new versions against the lost set.

The auditor keeps the lost set and the open alerts of its kinds in memory (loaded from Delta at the first
call; the ledger kinds as Arrow columns, :mod:`core.domain.ledger_alerts`, so a loss goes from the rule's
verdicts to encoded Kafka records and table rows in bulk, with no object per ledger), publishes each call's
transitions, then records them (``bookies`` membership columns, ``open_alerts``,
``violations``) with the caller's ``(app_id, batch_id)`` app transaction, so a replayed batch writes nothing
twice.

**Why no ledger falls between the lanes.** Each call holds :attr:`LossAuditor.lock` from reading the lost
set and the index to recording its alerts, and the ledger lane calls only after its index write. If the
ledger lane's call comes first, the lost bookie's index partition already holds the ledger's new rows when
the loss reads it; if the loss comes first, the ledger lane's call sees the bookie lost. Either way the
newest version of every ledger meets the newest lost set, and the later call decides last. The same lock
serialises every commit to the tables both lanes write (``open_alerts``, ``violations``, ``bookies``):
delta-rs would fail one of two concurrent commits.

Example:
    >>> sorted(kind.value for kind in LOSS_ALERT_KINDS)
    ['BOOKIE_LOST', 'LEDGER_UNDER_REPLICATED', 'LEDGER_UNRECOVERABLE']
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from connectors.delta.ledger_log import LedgerLog
from connectors.delta.scan import scan
from connectors.delta.tables import (
    BOOKIES,
    INDEX_LEDGER_COLUMNS,
    OPEN_ALERTS,
    VIOLATIONS,
    BatchWriter,
    OpenTables,
    table_before_batch,
)
from core.domain.alert_book import AlertBook, alert_to_row
from core.domain.alerts import Alert, AlertKind
from core.domain.ledger_alerts import (
    alert_records,
    alert_rows,
    condition_table,
    empty_open,
    ledger_transitions,
    open_from_rows,
    transition_counts,
    verdict_conditions_table,
)
from core.domain.rules.auditor_lag import UnmarkedAtRisk, unmarked_at_risk
from core.domain.rules.autorecovery import AUTORECOVERY_KINDS
from core.domain.rules.lost_ledgers import LOST_BOOKIE_INPUT_SCHEMA, lost_bookie_verdicts
from core.settings import KafkaSettings
from streaming.publish import encoded_alerts, publish_records
from streaming.reports import REPORTS_KEPT, LossReport, keep_recent

logger = logging.getLogger(__name__)

#: The ledger kinds of the lost-bookie rule.
LOST_LEDGER_KINDS = (AlertKind.LEDGER_UNDER_REPLICATED, AlertKind.LEDGER_UNRECOVERABLE)
#: The lost-bookie kinds.
LOSS_ALERT_KINDS = frozenset({AlertKind.BOOKIE_LOST, *LOST_LEDGER_KINDS})
#: The kinds the membership lane decides and this module records, each kept as an object (a handful open).
MEMBERSHIP_ALERT_KINDS = frozenset(
    {AlertKind.BOOKIE_LOST, AlertKind.ZOOKEEPER_DISRUPTION, *AUTORECOVERY_KINDS}
)
#: Every kind this module owns; the ledger lane never touches these.
OWNED_ALERT_KINDS = LOSS_ALERT_KINDS | MEMBERSHIP_ALERT_KINDS
#: The decisions that carry membership (the processor's and the membership lane's vocabulary).
MEMBERSHIP_DECISIONS = frozenset(
    {"bookie_state", "bookie_lost", "bookie_returned", "autorecovery_alert", "cluster_alert"}
)
#: The ``bookies`` columns membership owns; ``rack`` is the ledger lane's (placement), kept on update.
MEMBERSHIP_COLUMNS = (
    "bookie_id",
    "cluster",
    "status",
    "lost",
    "missing_since",
    "flaps",
    "host",
    "port",
    "rpc_address",
    "has_cookie",
    "cookie_changed_at",
    "updated_at",
)
_RULE_SCHEMA = pa.schema([*LOST_BOOKIE_INPUT_SCHEMA, pa.field("pulsar_topic", pa.string())])
_RULE_COLUMNS = _RULE_SCHEMA.names
#: Every column of an alert transition's rows (``open_alerts`` and ``violations`` each take theirs).
_ROW_SCHEMA = pa.schema(
    [
        *OPEN_ALERTS.schema,
        *(f for f in VIOLATIONS.schema if f.name not in OPEN_ALERTS.schema.names and f.name != "batch_id"),
    ]
)


def membership_app(app_id: str) -> str:
    """The app transaction id of the loss owner's Delta commits for the membership lane's batches.

    Example:
        >>> membership_app("bkaudit")
        'bkaudit.membership'
    """
    return f"{app_id}.membership"


def loss_app(app_id: str) -> str:
    """The app transaction id of the loss owner's Delta commits for the ledger lane's batches.

    Example:
        >>> loss_app("bkaudit")
        'bkaudit.loss'
    """
    return f"{app_id}.loss"


def utc_from_ms(ms: int | None) -> datetime | None:
    """Epoch milliseconds as a UTC ``datetime`` (the tables' timestamp columns); None stays None.

    Example:
        >>> utc_from_ms(0).isoformat(), utc_from_ms(None)
        ('1970-01-01T00:00:00+00:00', None)
    """
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


@dataclass
class _Evaluation:
    """Ledgers to put through the lost-bookie rule: their rule columns and the event time to decide at."""

    rows: pa.Table  # _RULE_COLUMNS
    at_ms: np.ndarray


class _PhaseClock:
    """Records the seconds since its previous call under each name (a loss's timeline, for reports)."""

    def __init__(self, into: dict[str, float]) -> None:
        self._into = into
        self._last = time.monotonic()

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self._into[name] = round(now - self._last, 4)
        self._last = now


class LossAuditor:
    """The one owner of the loss alerts (see the module docstring); thread-safe, one per job process."""

    def __init__(
        self,
        lakehouse_root: str | Path,
        kafka: KafkaSettings,
        producer: Callable[[], Any],
        ledger_log: LedgerLog,
    ) -> None:
        self.lakehouse_root = lakehouse_root
        self.ledger_log = ledger_log  # the ledgers' current versions: which index rows are current
        self.kafka = kafka
        self._producer = producer
        self.lock = threading.RLock()
        self._open: dict[tuple[str, AlertKind], Alert] | None = None  # MEMBERSHIP_ALERT_KINDS
        self._open_ledgers: pa.Table = empty_open()  # the ledger kinds, columnar
        self._lost: frozenset[str] = frozenset()
        # Bookies never registered that live ledgers name (see _never_registered): the known bookies (a
        # bookies row: registered or with a cookie at some time), the bookies lost that way, the names
        # waiting for the membership lane to pass the event time they were named at, and its clock.
        self._known: set[str] = set()
        self._ghosts: set[str] = set()
        self._named: dict[str, int] = {}
        self._membership_ms: int | None = None
        self._tables = OpenTables(lakehouse_root)
        self.reports: list[LossReport] = []
        # unmarked_at_risk's last answer, with the open set and the ledger log's changes it was computed at.
        self._unmarked: tuple[pa.Table, int, UnmarkedAtRisk] | None = None
        # Where the closed ledgers of a bookie formatted again go to be probed at once (the sink's replicas
        # check queue); None: nobody probes them ahead of the background walk.
        self.check_soon: Callable[[Sequence[int]], None] | None = None
        # Raises once the job's hold on its checkpoint is gone (AuditSink.set_write_check).
        self.write_check: Callable[[], None] = lambda: None

    # -- state --------------------------------------------------------------------------------------------
    def _table(self, name: str) -> DeltaTable:
        """The table at its newest version. Kept open between calls and brought up to date with only the
        commits since (opening ``ledger_bookies`` afresh reads its whole log: a cost on every loss)."""
        return self._tables.get(name)

    def _load(self, open_alerts: DeltaTable, bookies: DeltaTable, cluster: str) -> None:
        kept = sorted(kind.value for kind in MEMBERSHIP_ALERT_KINDS)
        bookie_rows = scan(open_alerts, [("kind", "in", kept)]).to_pylist()
        self._open = dict(AlertBook.from_rows(cluster, bookie_rows).open)
        kinds = [kind.value for kind in LOST_LEDGER_KINDS]
        self._open_ledgers = open_from_rows(scan(open_alerts, [("kind", "in", kinds)]))
        lost = scan(bookies, [("lost", "=", True)], ["bookie_id"]).column("bookie_id").to_pylist()
        self._lost = frozenset(lost)
        self._known = set(scan(bookies, [], ["bookie_id"]).column("bookie_id").to_pylist())
        self._ghosts = {
            bookie_id
            for (entity, kind), alert in self._open.items()
            if kind is AlertKind.BOOKIE_LOST and (alert.detail or {}).get("never_registered")
            for bookie_id in (entity.removeprefix("bookie/"),)
        }
        index = self._table("ledger_bookies")  # opened now, so a loss reads only the commits since
        # Names a ledger gave before a restart: the index's partitions (checked again when due).
        now_ms = int(time.time() * 1000)
        named = {str(part["bookie"]) for part in index.partitions() if part.get("bookie")}
        self._named = dict.fromkeys(sorted(named - self._known), now_ms)
        self.ledger_log.ensure_open()

    def _ensure_loaded(self, app_id: str, batch_id: int, cluster: str) -> None:
        root = self.lakehouse_root
        applied = self._table("open_alerts").transaction_version(app_id)
        replaying = applied is not None and applied >= batch_id
        if replaying:
            # A batch whose alerts were recorded before a crash: decide from the state before it.
            before = table_before_batch(root, "open_alerts", app_id, batch_id)
            self._load(before, table_before_batch(root, "bookies", app_id, batch_id), cluster)
        elif self._open is None:
            self._load(self._table("open_alerts"), self._table("bookies"), cluster)

    def lost(self) -> frozenset[str]:
        """The bookies lost now (as far as the calls so far know)."""
        with self.lock:
            return self._lost

    def unmarked_at_risk(self) -> UnmarkedAtRisk:
        """The ledgers with an open ``LEDGER_UNDER_REPLICATED`` or ``LEDGER_UNRECOVERABLE`` whose current row
        has no under-replication mark (``AUDITOR_LAGGING``'s input), each at risk since its alert started;
        looked up in bulk in the ledger log, again only once the open set or a ledger's row changed (the
        membership lane asks every batch; after a loss of 30,000 ledgers the lookup is 10-50 ms). Nothing
        before the first call loaded the open alerts."""
        with self.lock:
            at_risk = self._open_ledgers
            if not at_risk.num_rows or self._open is None:
                return UnmarkedAtRisk()
            changes = self.ledger_log.changes  # before the lookup: a row recorded during it counts as new
            if self._unmarked is not None and self._unmarked[0] is at_risk and self._unmarked[1] == changes:
                return self._unmarked[2]
            ids = at_risk.column("ledger_id").to_numpy()
            since = at_risk.column("started_at_ms").to_numpy()
        marked_rows = self.ledger_log.take(np.unique(ids), ["ledger_id", "under_replication_marked"])
        marked_rows = marked_rows.filter(pc.fill_null(marked_rows.column("under_replication_marked"), False))
        marked = np.isin(ids, marked_rows.column("ledger_id").to_numpy())
        found = unmarked_at_risk(ids, since, marked)
        with self.lock:
            self._unmarked = (at_risk, changes, found)
        return found

    def open_counts(self) -> dict[str, int]:
        """Open alerts of the loss kinds, per kind (empty before the first call)."""
        with self.lock:
            counts: dict[str, int] = {}
            for _, kind in self._open or {}:
                counts[kind.value] = counts.get(kind.value, 0) + 1
            for entry in pc.value_counts(self._open_ledgers.column("kind")).to_pylist():
                counts[entry["values"]] = entry["counts"]
            return counts

    # -- the call -----------------------------------------------------------------------------------------
    def apply(
        self,
        *,
        app_id: str,
        batch_id: int,
        cluster: str,
        membership: Sequence[Mapping[str, Any]] = (),
        changed_rows: Mapping[int, Mapping[str, Any]] | None = None,
        changed_at_ms: Mapping[int, int] | None = None,
        named_bookies: Mapping[str, int] | None = None,
        membership_clock_ms: int | None = None,
    ) -> LossReport:
        """Apply membership decisions (rows with ``kind``, ``at_ms``, ``bookie_id``, ``payload``) and
        re-evaluate changed ledgers (``ledgers`` rows by id, with the event time of each change); publish
        the resulting transitions, then record them. A call with nothing to do writes nothing.

        ``named_bookies``: the bookies the changed ledgers name, with the event time they were named at;
        ``membership_clock_ms``: how far the membership lane has read the bookies' registrations (a
        heartbeat of their partition). Together they find bookies that ledgers name but that never
        registered."""
        started = time.monotonic()
        report = LossReport(app_id, batch_id)
        changed_rows, changed_at_ms = changed_rows or {}, changed_at_ms or {}
        if (
            not membership
            and not changed_rows
            and not named_bookies
            and not self._clock_judges(membership_clock_ms)
        ):
            return report
        phase = _PhaseClock(report.phase_s)
        with self.lock:
            phase("lock")
            self._ensure_loaded(app_id, batch_id, cluster)
            assert self._open is not None
            self._note_named(named_bookies or {}, membership_clock_ms)
            book = AlertBook(cluster, open=dict(self._open))
            bookie_rows, lost, lost_changed = self._apply_membership(book, membership, cluster)
            report.ledgers_rechecked = self._check_reformatted(reformatted_bookies(membership))
            lost = self._never_registered(book, bookie_rows, lost, lost_changed, cluster)
            if not membership and not changed_rows and not lost_changed:
                return report
            phase("membership")
            conditions = self._evaluate(lost, lost_changed, changed_rows, changed_at_ms)
            phase("evaluate")
            ledgers, open_ledgers = ledger_transitions(cluster, self._open_ledgers, conditions)
            report.ledgers_evaluated = conditions.num_rows
            phase("transitions")
            self._publish(report, book, cluster, ledgers)
            phase("publish")
            report.bookies_written, report.skipped_replay_tables = self._record(
                app_id, batch_id, book, bookie_rows, cluster, ledgers
            )
            phase("record")
            self._open, self._open_ledgers, self._lost = book.open, open_ledgers, lost
        report.seconds = round(time.monotonic() - started, 3)
        if report.values or report.bookies_written:
            keep_recent(self.reports, report, REPORTS_KEPT)
        return report

    def _publish(self, report: LossReport, book: AlertBook, cluster: str, ledgers: pa.Table) -> None:
        """Publish the bookie transitions, then the ledgers' (encoded in bulk), and wait for every ack."""
        if not book.transitions and not ledgers.num_rows:
            return
        bookie_bodies, bookie_records = encoded_alerts(book.transitions)
        counts = transition_counts(ledgers)
        for body in bookie_bodies:
            counts[(body["kind"], body["state"])] = counts.get((body["kind"], body["state"]), 0) + 1
        records = [*bookie_records, *alert_records(cluster, ledgers)]
        self.write_check()  # a job that lost its hold on the checkpoint publishes nothing
        report.values = publish_records(self._producer(), self.kafka, records, counts=counts)
        report.transitions = counts
        report.published_at = time.time()

    def _apply_membership(
        self, book: AlertBook, membership: Sequence[Mapping[str, Any]], cluster: str
    ) -> tuple[dict[str, dict[str, Any]], frozenset[str], dict[str, int]]:
        """Bookie rows to write, the lost set after the decisions, and the bookies lost or returned (with
        the event time of their latest transition)."""
        bookie_rows: dict[str, dict[str, Any]] = {}
        lost = set(self._lost)
        lost_changed: dict[str, int] = {}
        for row in sorted(membership, key=lambda r: r["at_ms"]):
            kind, bookie_id, at_ms, payload = row["kind"], row["bookie_id"], row["at_ms"], row["payload"]
            if kind == "bookie_state":
                self._known.add(bookie_id)
                self._named.pop(bookie_id, None)
                if bookie_id in self._ghosts and not payload.get("lost"):
                    # It registered (or has a cookie) after all: the membership rule owns it from now on.
                    self._ghosts.discard(bookie_id)
                    book.set_bookie_condition(AlertKind.BOOKIE_LOST, bookie_id, False, at_ms=at_ms)
                    lost_changed[bookie_id] = at_ms
                bookie_rows[bookie_id] = {
                    "bookie_id": bookie_id,
                    "cluster": cluster,
                    "status": payload.get("status"),
                    "lost": bool(payload.get("lost")),
                    "missing_since": utc_from_ms(payload.get("missing_since_ms")),
                    "flaps": payload.get("flaps") or 0,
                    "host": payload.get("host"),
                    "port": payload.get("port"),
                    "has_cookie": payload.get("has_cookie"),
                    "cookie_changed_at": utc_from_ms(payload.get("cookie_changed_ms")),
                    "rpc_address": payload.get("rpc_address"),
                    "updated_at": utc_from_ms(at_ms),
                }
                (lost.add if payload.get("lost") else lost.discard)(bookie_id)
            elif kind == "bookie_lost":
                detail = {"missing_since": payload.get("missing_since_ms")}
                book.set_bookie_condition(AlertKind.BOOKIE_LOST, bookie_id, True, at_ms=at_ms, detail=detail)
                lost_changed[bookie_id] = at_ms
            elif kind == "bookie_returned":
                book.set_bookie_condition(AlertKind.BOOKIE_LOST, bookie_id, False, at_ms=at_ms)
                lost_changed[bookie_id] = at_ms
            elif kind in ("autorecovery_alert", "cluster_alert"):
                _set_health_condition(book, row.get("ledger_id"), at_ms, payload)
        return bookie_rows, frozenset(lost), lost_changed

    def _check_reformatted(self, bookies: Sequence[str]) -> int:
        """Hand the closed ledgers that name ``bookies`` (formatted again: their entries may be gone) to
        :attr:`check_soon`, read from the bookies' index partitions; returns how many."""
        if not bookies or self.check_soon is None:
            return 0
        columns = ["ledger_id", "mzxid", "state"]  # mzxid: which index rows are of current versions
        indexed = self.ledger_log.read_index(self._table("ledger_bookies"), bookies, columns)
        closed = pc.fill_null(pc.equal(indexed.column("state"), "CLOSED"), True)
        ids = np.unique(indexed.filter(closed).column("ledger_id").to_numpy())
        logger.info(
            "bookies %s were formatted again (cookie replaced): checking their %d closed ledgers now",
            ", ".join(bookies),
            len(ids),
        )
        self.check_soon(ids.tolist())
        return len(ids)

    def _clock_judges(self, clock_ms: int | None) -> bool:
        """Whether the membership lane's clock alone gives this call work: a name to judge now, or the names
        of the index to take at the first call (a clock with nothing to judge touches no table)."""
        if clock_ms is None:
            return False
        with self.lock:
            if self._open is None:
                return True
            self._note_named({}, clock_ms)
            return any(at_ms < clock_ms for at_ms in self._named.values())

    def _note_named(self, named: Mapping[str, int], clock_ms: int | None) -> None:
        """Remember the names no bookies row has (the earliest time each was named), and the membership
        lane's clock."""
        if clock_ms is not None:
            self._membership_ms = (
                clock_ms if self._membership_ms is None else max(self._membership_ms, clock_ms)
            )
        for bookie_id, at_ms in named.items():
            if bookie_id not in self._known and bookie_id not in self._ghosts:
                self._named[bookie_id] = min(at_ms, self._named.get(bookie_id, at_ms))

    def _never_registered(
        self,
        book: AlertBook,
        bookie_rows: dict[str, dict[str, Any]],
        lost: frozenset[str],
        lost_changed: dict[str, int],
        cluster: str,
    ) -> frozenset[str]:
        """Bookies a live ledger names that never registered and have no cookie are lost, as BookKeeper's
        Auditor decides (lost = bookies in the ledgers' index - available bookies): one ``BOOKIE_LOST``
        (``detail.never_registered``) and their ledgers' alerts. A name is judged once the membership lane
        has read past the time it was named at, so a bookie whose registration was simply not read yet is
        never taken for lost. Returns the lost set with them."""
        clock = self._membership_ms
        if clock is None or not self._named:
            return lost
        due = sorted(b for b, at_ms in self._named.items() if at_ms < clock)
        if not due:
            return lost
        for bookie_id in due:
            del self._named[bookie_id]
        # mzxid: the stored rows of older versions are told from the current ones by it.
        index = self.ledger_log.read_index(
            self._table("ledger_bookies"), due, ["bookie", "ledger_id", "mzxid"]
        )
        named = set(index.column("bookie").to_pylist())
        found = set(lost)
        for bookie_id in (b for b in due if b in named and b not in self._known):
            detail = {"missing_since": clock, "never_registered": True}
            book.set_bookie_condition(AlertKind.BOOKIE_LOST, bookie_id, True, at_ms=clock, detail=detail)
            bookie_rows[bookie_id] = {
                "bookie_id": bookie_id,
                "cluster": cluster,
                "status": "GONE",
                "lost": True,
                "missing_since": utc_from_ms(clock),
                "flaps": 0,
                "has_cookie": False,
                "updated_at": utc_from_ms(clock),
            }
            lost_changed[bookie_id] = clock
            found.add(bookie_id)
            self._ghosts.add(bookie_id)
            self._known.add(bookie_id)
        return frozenset(found)

    def _evaluate(
        self,
        lost: frozenset[str],
        lost_changed: Mapping[str, int],
        changed_rows: Mapping[int, Mapping[str, Any]],
        changed_at_ms: Mapping[int, int],
    ) -> pa.Table:
        """The lost-bookie conditions of the ledgers this call reaches (a ``CONDITION_SCHEMA`` table, by
        ledger id): the lost or returned bookies' index partitions, and the ledger lane's changed ledgers."""
        parts: list[_Evaluation] = []
        gone = _no_conditions([])
        if lost_changed:
            parts.append(self._from_index(lost_changed, exclude=set(changed_rows)))
        if changed_rows and (lost or self._any_open(changed_rows)):
            live, gone = self._from_changed(lost_changed, changed_rows, changed_at_ms)
            parts.append(live)
        parts = [part for part in parts if part.rows.num_rows]
        judged = _no_conditions([])
        if parts:
            rows = pa.concat_tables([part.rows for part in parts])
            at_ms = np.concatenate([part.at_ms for part in parts])
            verdicts = lost_bookie_verdicts(rows, lost)
            judged = verdict_conditions_table(verdicts, at_ms, rows.column("pulsar_topic"))
        conditions = pa.concat_tables([judged, gone])
        order = np.argsort(conditions.column("ledger_id").to_numpy(), kind="stable")
        return conditions.take(pa.array(order, pa.int64()))

    def _any_open(self, ledger_ids: Mapping[int, Any]) -> bool:
        ids = np.fromiter(ledger_ids, np.int64, len(ledger_ids))
        return bool(np.isin(ids, self._open_ledgers.column("ledger_id").to_numpy()).any())

    def _from_index(self, lost_changed: Mapping[str, int], exclude: set[int]) -> _Evaluation:
        """The ledgers on the bookies lost or returned, once each, from their index partitions (the ledger
        columns copied into the index; ``ledgers`` only for rows written before the copy existed)."""
        bookies = sorted(lost_changed)
        indexed = self.ledger_log.read_index(
            self._table("ledger_bookies"), bookies, ["bookie", "ledger_id", "mzxid", *INDEX_LEDGER_COLUMNS]
        )
        when = np.asarray([lost_changed[b] for b in bookies], dtype=np.int64)
        at_ms = when[pc.index_in(indexed.column("bookie"), pa.array(bookies)).to_numpy(zero_copy_only=False)]
        ledger_ids = indexed.column("ledger_id").to_numpy()
        # One row per ledger: the one of its latest transition (a ledger on two lost bookies is decided once).
        order = np.lexsort((-at_ms, ledger_ids))
        first = order[np.r_[True, ledger_ids[order][1:] != ledger_ids[order][:-1]]] if len(order) else order
        keep = first[~np.isin(ledger_ids[first], np.fromiter(exclude, np.int64, len(exclude)))]
        unique = indexed.take(pa.array(keep, pa.int64()))
        return self._with_copied_columns(unique, at_ms[keep])

    def _with_copied_columns(self, indexed: pa.Table, at_ms: np.ndarray) -> _Evaluation:
        """Index rows whose copied columns are null (written before the copy existed) read from ``ledgers``;
        deleted or undecodable ledgers drop out (their alerts were resolved when that happened)."""
        missing = pc.is_null(indexed.column("state")).to_numpy(zero_copy_only=False)
        complete = _Evaluation(
            indexed.filter(pa.array(~missing)).select(_RULE_COLUMNS).cast(_RULE_SCHEMA), at_ms[~missing]
        )
        if not missing.any():
            return complete
        ids = indexed.column("ledger_id").to_numpy()[missing]
        found = self.ledger_log.rows(ids.tolist())
        live = {i: r for i, r in found.items() if not r.get("deleted") and r.get("state")}
        when = dict(zip(ids.tolist(), at_ms[missing].tolist(), strict=True))
        old = _rule_table(list(live.values()))
        return _Evaluation(
            pa.concat_tables([complete.rows, old]),
            np.concatenate([complete.at_ms, np.asarray([when[i] for i in live], dtype=np.int64)]),
        )

    def _from_changed(
        self,
        lost_changed: Mapping[str, int],
        changed_rows: Mapping[int, Mapping[str, Any]],
        changed_at_ms: Mapping[int, int],
    ) -> tuple[_Evaluation, pa.Table]:
        """The ledger lane's changed ledgers: live ones to evaluate at the later of their change and any loss
        or return of a bookie they name; deleted and undecodable ones as conditions that resolve."""
        live: list[Mapping[str, Any]] = []
        at_ms: list[int] = []
        gone: list[tuple[int, int, str | None]] = []  # (ledger id, at, resolution reason)
        for ledger_id, row in changed_rows.items():
            at = changed_at_ms[ledger_id]
            if row.get("deleted"):
                gone.append((ledger_id, at, "ledger deleted"))
            elif not row.get("state"):  # undecodable: nothing can be evaluated
                gone.append((ledger_id, at, None))
            else:
                hits = [lost_changed[b] for b in row.get("bookies") or () if b in lost_changed]
                live.append(row)
                at_ms.append(max([at, *hits]))
        return _Evaluation(_rule_table(live), np.asarray(at_ms, dtype=np.int64)), _no_conditions(gone)

    def _record(
        self,
        app_id: str,
        batch_id: int,
        book: AlertBook,
        bookie_rows: Mapping[str, Mapping[str, Any]],
        cluster: str,
        ledgers: pa.Table,
    ) -> tuple[int, int]:
        """Write the call's bookie rows and alert transitions (one commit per table, skipped on replay);
        returns the bookie rows and the writes a replay found done."""
        self.write_check()
        writer = BatchWriter(self.lakehouse_root, app_id, batch_id)
        written: list[bool] = []
        if bookie_rows:
            rows = [dict(bookie_rows[b]) for b in sorted(bookie_rows)]
            table = pa.Table.from_pylist(rows, schema=BOOKIES.schema)
            written.append(writer.upsert("bookies", table, columns=MEMBERSHIP_COLUMNS))
        if book.transitions or ledgers.num_rows:
            written.extend(record_transitions(writer, book, alert_rows(cluster, ledgers)))
        return len(bookie_rows), written.count(False)


def reformatted_bookies(membership: Sequence[Mapping[str, Any]]) -> list[str]:
    """The bookies whose cookie the membership decisions saw replaced (formatted again under the same id).

    Example:
        >>> replaced = {"kind": "bookie_state", "bookie_id": "b2", "payload": {"cookie_replaced": True}}
        >>> reformatted_bookies([replaced, {"kind": "bookie_state", "bookie_id": "b1", "payload": {}}])
        ['b2']
    """
    return sorted(
        {
            row["bookie_id"]
            for row in membership
            if row["kind"] == "bookie_state" and (row["payload"] or {}).get("cookie_replaced")
        }
    )


def record_transitions(
    writer: BatchWriter, book: AlertBook, ledger_rows: pa.Table | None = None
) -> tuple[bool, bool]:
    """``open_alerts`` (each transition's row while it is open, removed when resolved) and ``violations``
    (every transition, appended) for a book's transitions and, columnar, ledger transitions
    (:func:`~core.domain.ledger_alerts.alert_rows`); per table, False when a replay found it written."""
    # Each transition's row once: an open alert with a transition's id is that transition (a re-fire is a
    # new object).
    rows = {id(a): alert_to_row(a) for a in book.transitions}
    all_rows = pa.Table.from_pylist([rows[id(a)] for a in book.transitions], schema=_ROW_SCHEMA)
    still_open = [book.open.get((a.entity, a.kind)) is a for a in book.transitions]
    if ledger_rows is not None and ledger_rows.num_rows:
        all_rows = pa.concat_tables([all_rows, ledger_rows.select(_ROW_SCHEMA.names).cast(_ROW_SCHEMA)])
        firing = pc.equal(ledger_rows.column("state"), "firing").to_numpy(zero_copy_only=False)
        still_open.extend(firing.tolist())
    open_rows = all_rows.filter(pa.array(still_open, pa.bool_())).select(OPEN_ALERTS.schema.names)
    ids = set(all_rows.column("alert_id").to_pylist())
    written = writer.replace_keys("open_alerts", "alert_id", ids, open_rows.cast(OPEN_ALERTS.schema))
    batch = pa.array(np.full(all_rows.num_rows, writer.batch_id, dtype=np.int64))
    violations = all_rows.append_column("batch_id", batch).select(VIOLATIONS.schema.names)
    appended = writer.append("violations", violations.cast(VIOLATIONS.schema))
    return written, appended


def _set_health_condition(
    book: AlertBook, ledger_id: int | None, at_ms: int, payload: Mapping[str, Any]
) -> None:
    """Fire or resolve one AutoRecovery or ZooKeeper health alert (a rule's transition, as a decision)."""
    kind, firing = AlertKind(payload["kind"]), bool(payload["firing"])
    detail = dict(payload["detail"]) if firing else None
    if ledger_id is None:
        book.set_cluster_condition(kind, firing, at_ms=at_ms, detail=detail)
    else:
        book.set_ledger_condition(kind, ledger_id, firing, at_ms=at_ms, detail=detail)


def _rule_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """``ledgers`` rows as the rule's columns (segments as the table holds them)."""
    return pa.Table.from_pylist([{c: r.get(c) for c in _RULE_COLUMNS} for r in rows], schema=_RULE_SCHEMA)


def _no_conditions(gone: Sequence[tuple[int, int, str | None]]) -> pa.Table:
    """Conditions under which nothing holds (deleted or undecodable ledgers): whatever is open resolves."""
    return condition_table(
        ledger_ids=[g[0] for g in gone],
        at_ms=[g[1] for g in gone],
        kinds=pa.nulls(len(gone), pa.string()),
        bookies=[[] for _ in gone],
        details=pa.nulls(len(gone), pa.string()),
        topics=pa.nulls(len(gone), pa.string()),
        resolutions=[g[2] for g in gone],
    )


__all__ = [
    "LOSS_ALERT_KINDS",
    "LOST_LEDGER_KINDS",
    "MEMBERSHIP_ALERT_KINDS",
    "MEMBERSHIP_COLUMNS",
    "MEMBERSHIP_DECISIONS",
    "OWNED_ALERT_KINDS",
    "LossAuditor",
    "LossReport",
    "loss_app",
    "membership_app",
    "record_transitions",
    "reformatted_bookies",
    "utc_from_ms",
]
