"""The ledger lane, run by a driver thread: every change applied without
Spark's per-record machinery, and only what needs a timer through the stateful operator.

``changes + feedback + decisions topics → LedgerLane.process → sink queue``, run by
:class:`~streaming.driver_batches.DriverMicroBatches` (librdkafka, a write-ahead offset log of its own).
Per micro-batch the lane

1. decodes the changes in columns (:func:`streaming.decode.decode_batches`);
2. learns which ledgers are *tracked* — under an under-replication mark, or named by a failing probe result
   on the feedback topic — and keeps them in its state (a superset of the timers query's tracked ledgers:
   a ledger leaves only when it is deleted);
3. turns the other ledgers' changes into decisions column by column (``ledger_state``, ``ledger_deleted``,
   ``ledger_corrupt``), exactly what the stateful processor emits for a ledger it does not track, and the
   rack map and snapshot brackets into decisions with :class:`~streaming.processor.ClusterLogic`;
4. forwards the tracked ledgers' changes, every mark and the heartbeats (the timers' event-time clock) to
   the tracked topic, unchanged, where the *timers query* (``transformWithStateInPandas`` over the tracked
   and feedback topics) runs the suspicion rounds and grace periods and relays its decisions to the
   decisions topic (:class:`DecisionRelay`). While no ledger is tracked the query has nothing to time, and
   a heartbeat goes to it only every ``IDLE_HEARTBEAT_INTERVAL_MS`` of event time;
5. adds the relayed decisions it read, queues the batch's decisions for the sink, then saves its state
   (``<batch id>.json``: the batch's commit).

Why a replayed batch changes nothing: it starts from the state saved by the newest batch before it and
reads exactly its logged records, so it decides and forwards what its first attempt did; the sink's app
transactions skip what that attempt already recorded, and the timers query drops a forwarded change it
already holds (znode versions) or a probe round it already counted. A relayed decision delivered twice (the
timers query replays a batch after a crash) is applied twice: every relayed kind is idempotent in the sink
(an alert already firing, a round already asked for, a version already applied).

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> store = LaneStates(Path(tempfile.mkdtemp()))
    >>> store.save(0, {"tracked": [7]}); store.before(1)["tracked"]
    [7]
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streaming.decode import decode_batches
from streaming.driver_batches import LaneStates
from streaming.processor import DECISION_COLUMNS, ClusterLogic, ProcessorConfig, rows_from_frames
from streaming.sink import ARROW_DECISION_SCHEMA
from streaming.state_keys import DEAD_LETTER_STATE_KEY

logger = logging.getLogger(__name__)

LANE_NAME = "bkaudit-ledgers"
TIMERS_QUERY_NAME = "bkaudit-timers"

#: A ledger's changes, and the decision each becomes when the ledger is not tracked (the stateful
#: processor's own answer for a ledger without state).
DIRECT_DECISIONS = {
    "ledger_upserted": "ledger_state",
    "ledger_deleted": "ledger_deleted",
    "ledger_undecodable": "ledger_corrupt",
}
#: Changes that prove a ledger's znode exists (a tracked ledger's are announced to the sink at once).
SIGHTING_KINDS = frozenset({"ledger_upserted", "ledger_undecodable"})
#: Changes that make their ledger tracked (always forwarded: the grace period is a timer).
MARK_KIND = "under_replication_mark"
LEDGER_KINDS = frozenset({*DIRECT_DECISIONS, MARK_KIND})
HEARTBEAT_KIND = "heartbeat"
#: While no ledger is tracked, the heartbeats the timers query gets, at most one batch of them per this much
#: event time: they only keep its watermark (the job's event-time gauges) near the wall clock, and each of
#: its micro-batches costs ~1 CPU-second; with every heartbeat forwarded it ran one every trigger.
IDLE_HEARTBEAT_INTERVAL_MS = 30_000


@dataclass(frozen=True)
class LedgerLaneConfig:
    """The topics and knobs the lane needs; built by ``streaming.job`` from the settings."""

    changes_topic: str
    feedback_topic: str
    tracked_topic: str
    decisions_topic: str
    processor: ProcessorConfig
    ledger_buckets: int = 64
    max_event_time_skew_s: float | None = None
    cluster_default: str = "unknown"


Forward = Callable[[str, Sequence[tuple[bytes | None, bytes | None]]], None]


class LedgerLane:
    """The lane's batch function; see the module docstring.

    ``put(decisions, batch_id)`` hands decisions to the sink (the sink queue: durable once it returns);
    ``forward(topic, records)`` sends raw ``(key, value)`` records and returns once Kafka acknowledged them.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from connectors.kafka.planner import ARROW_RECORD_SCHEMA
        >>> queued = []
        >>> lane = LedgerLane(LedgerLaneConfig("changes", "feedback", "tracked", "decisions",
        ...                                    ProcessorConfig(membership=False)),
        ...                   lambda decisions, batch_id: queued.append((batch_id, decisions.num_rows)),
        ...                   lambda topic, records: None, LaneStates(Path(tempfile.mkdtemp())))
        >>> nothing = ARROW_RECORD_SCHEMA.empty_table().append_column(
        ...     "batch_time", pa.array([], pa.timestamp("us", tz="UTC")))
        >>> lane.process(nothing, 0), queued, lane.store.saved(0)
        (0, [(0, 0)], True)
    """

    def __init__(
        self,
        config: LedgerLaneConfig,
        put: Callable[[pa.Table, int], Any],
        forward: Forward,
        store: LaneStates,
    ) -> None:
        self.config = config
        self.put = put
        self.forward = forward
        self.store = store
        self.cluster_logic = ClusterLogic(config.processor)

    def process(self, records: pa.Table, batch_id: int) -> int:
        """Apply one micro-batch of raw Kafka records (the source's columns plus ``batch_time``); returns
        the number of decisions queued."""
        state = self.store.before(batch_id) or {}
        topics = records.column("topic")
        changes = records.filter(pc.equal(topics, self.config.changes_topic))
        decoded = self._decode(changes)
        tracked = np.union1d(
            np.asarray(state.get("tracked") or [], dtype=np.int64),
            np.concatenate(
                [
                    failing_probe_ledgers(records.filter(pc.equal(topics, self.config.feedback_topic))),
                    _ledger_ids(decoded.filter(pc.equal(decoded.column("kind"), MARK_KIND))),
                ]
            ),
        )
        heartbeat_ms = _newest_heartbeat_ms(decoded)
        beats_sent_ms = state.get("heartbeat_forwarded_ms")
        with_heartbeats = _heartbeats_due(heartbeat_ms, beats_sent_ms, tracking=tracked.size > 0)
        forwarded = _forwarded_mask(decoded, tracked, with_heartbeats=with_heartbeats)
        cluster = _newest_cluster(decoded) or state.get("cluster") or self.config.cluster_default
        cluster_state, cluster_decisions = self._cluster(state.get("cluster_state"), decoded, cluster)
        managed = managed_ledger_decisions(decoded, cluster)
        follows_topics = bool(state.get("managed_ledgers")) or managed.num_rows > 0
        decisions = pa.concat_tables(
            [
                direct_decisions(decoded.filter(pc.invert(forwarded)), cluster),
                managed,
                topics_clock(heartbeat_ms, cluster) if follows_topics else _empty_decisions(),
                tracked_sightings(decoded.filter(forwarded), cluster),
                cluster_decisions,
                dead_letters(decoded),
                relayed_decisions(records.filter(pc.equal(topics, self.config.decisions_topic))),
            ]
        )
        self._forward(changes.filter(forwarded))
        self.put(decisions.sort_by([("event_time", "ascending")]), batch_id)
        deleted = _ledger_ids(decoded.filter(pc.equal(decoded.column("kind"), "ledger_deleted")))
        self.store.save(
            batch_id,
            {
                "cluster": cluster,
                "cluster_state": cluster_state,
                "tracked": np.setdiff1d(tracked, deleted).tolist(),
                "heartbeat_forwarded_ms": heartbeat_ms if with_heartbeats else beats_sent_ms,
                "managed_ledgers": follows_topics,
            },
        )
        return decisions.num_rows

    # -- steps ---------------------------------------------------------------------------------------------
    def _decode(self, changes: pa.Table) -> pa.Table:
        from streaming.decode import ARROW_CHANGE_SCHEMA

        batches = decode_batches(
            iter(changes.to_batches()),
            feedback_topic=self.config.feedback_topic,
            ledger_buckets=self.config.ledger_buckets,
            max_event_time_skew_s=self.config.max_event_time_skew_s,
        )
        return pa.Table.from_batches(list(batches), schema=ARROW_CHANGE_SCHEMA)

    def _cluster(
        self, state: dict[str, Any] | None, decoded: pa.Table, cluster: str
    ) -> tuple[dict[str, Any] | None, pa.Table]:
        """The cluster group's changes (rack map, snapshot brackets) through :class:`ClusterLogic`."""
        rows = decoded.filter(
            pc.and_(
                pc.equal(decoded.column("state_key"), "cluster"),
                pc.not_equal(decoded.column("kind"), HEARTBEAT_KIND),
            )
        )
        if not rows.num_rows:
            return state, _empty_decisions()
        new_state, out, _ = self.cluster_logic.apply(state, rows_from_frames(iter([rows.to_pandas()])))
        return new_state, decisions_from_dicts(out, cluster)

    def _forward(self, chosen: pa.Table) -> None:
        """Kafka records, unchanged, to the tracked topic (per-ledger order kept: same keys, so the same
        partition for every change of a ledger). The decoder gives one row per record, in order, so the
        decoded rows' mask picks the records."""
        if chosen.num_rows:
            self.forward(
                self.config.tracked_topic,
                list(zip(chosen.column("key").to_pylist(), chosen.column("value").to_pylist(), strict=True)),
            )


# ----------------------------------------------------------------------------------------- columns


def _ledger_ids(rows: pa.Table) -> np.ndarray:
    ids = pc.drop_null(rows.column("ledger_id"))
    return np.asarray(ids.to_numpy(), dtype=np.int64) if len(ids) else np.empty(0, dtype=np.int64)


def _forwarded_mask(
    decoded: pa.Table, tracked: np.ndarray, *, with_heartbeats: bool = True
) -> pa.ChunkedArray | pa.Array:
    """Rows for the timers query: a tracked ledger's changes (marks make their ledger tracked) and, with
    ``with_heartbeats``, the heartbeats."""
    kinds = decoded.column("kind")
    ledger = pc.is_in(kinds, pa.array(sorted(LEDGER_KINDS)))
    ids = pc.fill_null(decoded.column("ledger_id"), -1).to_numpy()
    of_tracked = pa.array(np.isin(np.asarray(ids, dtype=np.int64), tracked))
    chosen = pc.and_(ledger, of_tracked)
    return pc.or_(chosen, pc.equal(kinds, HEARTBEAT_KIND)) if with_heartbeats else chosen


def _heartbeats_due(newest_ms: int | None, sent_ms: int | None, *, tracking: bool) -> bool:
    """Whether the batch's heartbeats go to the timers query: always while a ledger is tracked, else once
    ``IDLE_HEARTBEAT_INTERVAL_MS`` of event time has passed since the last ones sent.

    Example:
        >>> _heartbeats_due(40_000, 20_000, tracking=True), _heartbeats_due(40_000, 20_000, tracking=False)
        (True, False)
        >>> _heartbeats_due(50_000, 20_000, tracking=False), _heartbeats_due(None, None, tracking=True)
        (True, False)
    """
    if newest_ms is None:
        return False
    return tracking or sent_ms is None or newest_ms - sent_ms >= IDLE_HEARTBEAT_INTERVAL_MS


def _newest_heartbeat_ms(decoded: pa.Table) -> int | None:
    """The event time of the batch's newest heartbeat (ms), None without one."""
    beats = decoded.filter(pc.equal(decoded.column("kind"), HEARTBEAT_KIND)).column("event_time")
    newest = pc.max(beats.cast(pa.int64())).as_py() if len(beats) else None
    return None if newest is None else newest // 1000


def _newest_cluster(decoded: pa.Table) -> str | None:
    clusters = pc.drop_null(decoded.column("cluster"))
    return clusters[-1].as_py() if len(clusters) else None


def _empty_decisions() -> pa.Table:
    return ARROW_DECISION_SCHEMA.empty_table()


def direct_decisions(rows: pa.Table, cluster: str) -> pa.Table:
    """Changes of untracked ledgers as the decisions the stateful processor emits for them, column by
    column: payloads pass on unparsed (the decoder's already carry the snapshot id).

    Example:
        >>> from streaming.decode import ARROW_CHANGE_SCHEMA
        >>> row = {"state_key": "ledgers/1", "kind": "ledger_deleted", "event_time": datetime.now(UTC),
        ...        "ledger_id": 7, "payload": '{"last_mzxid":3,"inferred":false}'}
        >>> table = pa.Table.from_pylist([row], schema=ARROW_CHANGE_SCHEMA)
        >>> direct_decisions(table, "c1").column("kind").to_pylist()
        ['ledger_deleted']
    """
    kinds = rows.column("kind")
    chosen = rows.filter(pc.is_in(kinds, pa.array(sorted(DIRECT_DECISIONS))))
    n = chosen.num_rows
    if not n:
        return _empty_decisions()
    decision_kind = pa.array([DIRECT_DECISIONS[k] for k in chosen.column("kind").to_pylist()], pa.string())
    return _ledger_decisions(chosen, decision_kind, chosen.column("payload"), cluster)


#: Pulsar's managed-ledger changes, passed to the sink's topics stage as they are (no timers).
MANAGED_LEDGER_KINDS = ("managed_ledger_changed", "managed_ledger_deleted")
#: The topics stage's event-time clock: the batch's newest heartbeat, once managed ledgers were seen.
TOPICS_CLOCK_KIND = "topics_clock"


def managed_ledger_decisions(rows: pa.Table, cluster: str) -> pa.Table:
    """The batch's managed-ledger changes as decisions of the same kind (payloads unchanged, plus the
    snapshot id).

    Example:
        >>> from streaming.decode import ARROW_CHANGE_SCHEMA
        >>> row = {"state_key": "managed-ledgers", "kind": "managed_ledger_deleted", "snapshot_id": "s",
        ...        "event_time": datetime.now(UTC), "payload": '{"name":"t/n/persistent/x"}'}
        >>> made = managed_ledger_decisions(pa.Table.from_pylist([row], schema=ARROW_CHANGE_SCHEMA), "c")
        >>> made.column("kind").to_pylist(), made.column("payload").to_pylist()
        (['managed_ledger_deleted'], ['{"name":"t/n/persistent/x","snapshot_id":"s"}'])
    """
    chosen = rows.filter(pc.is_in(rows.column("kind"), pa.array(MANAGED_LEDGER_KINDS)))
    if not chosen.num_rows:
        return _empty_decisions()
    payloads = [
        json.dumps({**json.loads(text), "snapshot_id": snapshot}, separators=(",", ":"))
        for text, snapshot in zip(
            chosen.column("payload").to_pylist(), chosen.column("snapshot_id").to_pylist(), strict=True
        )
    ]
    return _ledger_decisions(chosen, chosen.column("kind"), pa.array(payloads, pa.string()), cluster)


def topics_clock(heartbeat_ms: int | None, cluster: str) -> pa.Table:
    """One ``topics_clock`` decision at the batch's newest heartbeat (none without one): the topics stage's
    grace periods advance on an idle cluster too.

    Example:
        >>> topics_clock(5_000, "c").column("kind").to_pylist(), topics_clock(None, "c").num_rows
        (['topics_clock'], 0)
    """
    if heartbeat_ms is None:
        return _empty_decisions()
    return decisions_from_dicts(
        [{"kind": TOPICS_CLOCK_KIND, "event_time_ms": heartbeat_ms, "payload": {}}], cluster
    )


def tracked_sightings(rows: pa.Table, cluster: str) -> pa.Table:
    """``ledger_seen`` decisions for the forwarded (tracked) ledgers' znodes, at once: their changes reach the
    sink only through the timers query, later than this batch's snapshot end, and a complete snapshot that
    had not seen them would take them for deleted. The versions follow through the timers query.

    Example:
        >>> from streaming.decode import ARROW_CHANGE_SCHEMA
        >>> row = {"state_key": "ledgers/1", "kind": "ledger_upserted", "event_time": datetime.now(UTC),
        ...        "ledger_id": 7, "snapshot_id": "s1", "payload": "{}"}
        >>> seen = tracked_sightings(pa.Table.from_pylist([row], schema=ARROW_CHANGE_SCHEMA), "c1")
        >>> seen.column("kind").to_pylist(), seen.column("payload").to_pylist()
        (['ledger_seen'], ['{"snapshot_id":"s1"}'])
    """
    chosen = rows.filter(pc.is_in(rows.column("kind"), pa.array(sorted(SIGHTING_KINDS))))
    n = chosen.num_rows
    if not n:
        return _empty_decisions()
    payloads = [
        json.dumps({"snapshot_id": snapshot_id}, separators=(",", ":"))
        for snapshot_id in chosen.column("snapshot_id").to_pylist()
    ]
    kinds = pa.array(["ledger_seen"] * n, pa.string())
    return _ledger_decisions(chosen, kinds, pa.array(payloads, pa.string()), cluster)


def _ledger_decisions(rows: pa.Table, kinds: pa.Array, payloads: Any, cluster: str) -> pa.Table:
    """Decisions on the ledgers of decoded ``rows``, one each, with their event times."""
    n = rows.num_rows
    columns = {
        "kind": kinds,
        "event_time": rows.column("event_time"),
        "cluster": pc.fill_null(rows.column("cluster"), cluster),
        "ledger_id": rows.column("ledger_id"),
        "bookie_id": pa.nulls(n, pa.string()),
        "payload": payloads,
        "topic": pa.nulls(n, pa.string()),
        "partition": pa.nulls(n, pa.int32()),
        "offset": pa.nulls(n, pa.int64()),
    }
    return pa.table(columns, schema=ARROW_DECISION_SCHEMA)


def dead_letters(decoded: pa.Table) -> pa.Table:
    """Undecodable records as ``dead_letter`` decisions, passed on as the processor passes them."""
    dead = decoded.filter(pc.equal(decoded.column("state_key"), DEAD_LETTER_STATE_KEY))
    return dead.select(list(DECISION_COLUMNS)).cast(ARROW_DECISION_SCHEMA)


def decisions_from_dicts(decisions: Sequence[dict[str, Any]], cluster: str | None) -> pa.Table:
    """Decision dicts (:class:`ClusterLogic`, :class:`~streaming.processor.LedgerLogic`) as an Arrow table.

    Example:
        >>> decisions_from_dicts([{"kind": "rack_map", "event_time_ms": 5, "payload": {"racks": {}}}],
        ...                      "c1").column("payload").to_pylist()
        ['{"racks":{}}']
    """
    return pa.Table.from_pylist(
        [
            {
                "kind": d["kind"],
                "event_time": datetime.fromtimestamp(d["event_time_ms"] / 1000, tz=UTC),
                "cluster": cluster,
                "ledger_id": d.get("ledger_id"),
                "bookie_id": d.get("bookie_id"),
                "payload": json.dumps(d.get("payload") or {}, separators=(",", ":"), sort_keys=True),
            }
            for d in decisions
        ],
        schema=ARROW_DECISION_SCHEMA,
    )


def failing_probe_ledgers(feedback: pa.Table) -> np.ndarray:
    """Ledgers named by a failing probe result on the feedback topic (they become tracked)."""
    from core.domain.rules.rounds import failure_kind

    if not feedback.num_rows:
        return np.empty(0, dtype=np.int64)
    values = feedback.column("value")
    candidates = feedback.filter(pc.match_substring(pc.cast(values, pa.string()), '"failing":true'))
    ids = []
    for value in candidates.column("value").to_pylist():
        try:
            message = json.loads(value)
        except ValueError:
            continue  # the timers query's decoder records it as a dead letter
        if isinstance(message, dict) and failure_kind(message) is not None and message.get("ledger_id"):
            ids.append(int(message["ledger_id"]))
    return np.asarray(ids, dtype=np.int64)


# ------------------------------------------------------------------------------- the relayed decisions


def encode_decisions(decisions: pa.Table) -> list[tuple[bytes, bytes]]:
    """Decisions as ``(key, JSON value)`` records for the decisions topic (keyed by ledger or bookie, so one
    entity's decisions stay in order).

    Example:
        >>> table = decisions_from_dicts([{"kind": "probe_request", "event_time_ms": 5, "ledger_id": 7,
        ...                                "payload": {"round": 1}}], "c1")
        >>> encode_decisions(table)[0][0]
        b'ledger/7'
    """
    records = []
    for row in decisions.to_pylist():
        at: datetime = row.pop("event_time")
        row["event_time_ms"] = int(at.timestamp() * 1000)
        key = f"ledger/{row['ledger_id']}" if row["ledger_id"] is not None else f"bookie/{row['bookie_id']}"
        records.append((key.encode(), json.dumps(row, separators=(",", ":"), sort_keys=True).encode()))
    return records


def relayed_decisions(records: pa.Table) -> pa.Table:
    """The decisions topic's records back as decisions; a record that is not one becomes a dead letter
    with its reason (nothing else in the batch is lost)."""
    if not records.num_rows:
        return _empty_decisions()
    rows = []
    for value, topic, partition, offset, at in zip(
        records.column("value").to_pylist(),
        records.column("topic").to_pylist(),
        records.column("partition").to_pylist(),
        records.column("offset").to_pylist(),
        records.column("timestamp").to_pylist(),
        strict=True,
    ):
        try:
            row = json.loads(value)
            rows.append(
                {
                    **{name: row.get(name) for name in DECISION_COLUMNS if name != "event_time"},
                    "event_time": datetime.fromtimestamp(int(row["event_time_ms"]) / 1000, tz=UTC),
                }
            )
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            reason = f"not a relayed decision: {type(err).__name__}: {err}"
            rows.append(
                {
                    "kind": "dead_letter",
                    "event_time": at,
                    "payload": json.dumps({"reason": reason, "source": "kafka"}),
                    "topic": topic,
                    "partition": partition,
                    "offset": offset,
                }
            )
    return pa.Table.from_pylist(rows, schema=ARROW_DECISION_SCHEMA)


class DecisionRelay:
    """The timers query's ``foreachBatch``: its decisions to the decisions topic, acknowledged before the
    batch ends (a replayed batch sends them again; see the module docstring).

    Example:
        >>> sent = []
        >>> relay = DecisionRelay(lambda topic, records: sent.append((topic, len(records))), "decisions")
        >>> relay.stopping.is_set(), relay.topic
        (False, 'decisions')
    """

    def __init__(self, send: Callable[[str, Sequence[tuple[bytes | None, bytes | None]]], None], topic: str):
        self.send = send
        self.topic = topic
        # A graceful stop waits for the running call (``busy``) and lets no new one start (``stopping``), as
        # for the sink: interrupting a batch inside a Py4J call floods the log with nested interrupt traces.
        self.stopping = threading.Event()
        self.busy = threading.Lock()

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        if self.stopping.is_set():
            from streaming.sink import SinkStopping

            raise SinkStopping(
                f"timers batch {batch_id} arrived while the job is stopping; it will be replayed"
            )
        with self.busy:
            decisions = batch_df.toArrow()
            if decisions.num_rows:
                self.send(self.topic, encode_decisions(decisions))
                logger.debug("timers batch %d relayed %d decisions", batch_id, decisions.num_rows)


__all__ = [
    "LANE_NAME",
    "TIMERS_QUERY_NAME",
    "DecisionRelay",
    "LedgerLane",
    "LedgerLaneConfig",
    "dead_letters",
    "decisions_from_dicts",
    "direct_decisions",
    "encode_decisions",
    "failing_probe_ledgers",
    "relayed_decisions",
]
