"""The sink's topics stage (streaming/topics.py) with the rule of core/domain/rules/topics.py, without
services: managed-ledger decisions as the ledger lane makes them, a ledger log stand-in."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.domain.alert_book import AlertBook
from core.domain.alerts import AlertKind, AlertState
from core.domain.managed_ledger import (
    ManagedCursorInfo,
    ManagedLedgerInfo,
    TopicLedger,
    encode_managed_cursor_info,
    encode_managed_ledger_info,
)
from core.domain.rules.topics import Listing, listed_table, missing_pairs, orphaned_ledgers
from core.pb import change_events_pb2 as pb
from streaming.decode import managed_ledger_payload
from streaming.sink_batch import SinkBatch
from streaming.topics import TopicsConfig, TopicsStage

NAME = "public/default/persistent/orders"
TOPIC = "persistent://public/default/orders"
CUSTOM = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


class FakeLog:
    """The two ledger-log calls the stage makes, over a dict of live ledgers."""

    def __init__(self) -> None:
        self.live: dict[int, dict[str, Any]] = {}

    def add(self, ledger_id: int, *, ctime_ms: int = 0, topic: str | None = TOPIC, length: int = 100) -> None:
        component = [{"key": "component", "value": b"managed-ledger"}] if topic else []
        self.live[ledger_id] = {
            "ledger_id": ledger_id,
            "deleted": False,
            "pulsar_topic": topic,
            "ctime_ms": ctime_ms,
            "length": length,
            "custom_metadata": component,
        }

    def versions(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        known = np.array([1 if int(i) in self.live else -1 for i in ids], np.int64)
        return known, np.zeros(len(ids), bool)

    def current_chunks(self, columns: list[str]) -> Iterator[pa.Table]:
        """The live ledgers in two chunks (odd and even ids), as the log walks its buckets."""
        schema = pa.schema(
            [
                ("ledger_id", pa.int64()),
                ("deleted", pa.bool_()),
                ("pulsar_topic", pa.string()),
                ("ctime_ms", pa.int64()),
                ("length", pa.int64()),
                ("custom_metadata", CUSTOM),
            ]
        )
        for parity in (1, 0):
            rows = [row for row in self.live.values() if row["ledger_id"] % 2 == parity]
            yield pa.Table.from_pylist(rows, schema=schema).select(columns)


class Stack:
    def __init__(self, **config: Any) -> None:
        self.stage = TopicsStage(TopicsConfig(**config), None, changes_partitions=1)
        self.log = FakeLog()
        self.open: dict[Any, Any] = {}
        self.batch_id = 0
        self.transitions: list[Any] = []
        self.dead: list[dict[str, Any]] = []
        self.topic_rows: list[dict[str, Any]] = []

    def run(self, rows: list[dict[str, Any]], *, snapshot_at: int | None = None) -> list[Any]:
        batch = SinkBatch(
            batch_id=self.batch_id,
            cluster="c",
            book=AlertBook("c", open=dict(self.open)),
            bookie_rows={},
            changes_partitions=1,
        )
        if snapshot_at is not None:
            batch.snapshots_complete.append(
                {"partition": 0, "partition_count": 1, "begin_ms": 0, "at_ms": snapshot_at}
            )
        self.stage.apply(batch, rows, self.log)  # type: ignore[arg-type]
        self.stage.commit()
        self.open = dict(batch.book.open)
        self.batch_id += 1
        self.transitions.extend(batch.book.transitions)
        self.dead.extend(batch.dead_letters)
        self.topic_rows.extend(batch.topic_rows)
        return batch.book.transitions


def changed(at_ms: int, mzxid: int, data: bytes, cursor: str = "") -> dict[str, Any]:
    message = pb.ManagedLedgerChanged(name=NAME, cursor=cursor, data=data)
    message.znode.mzxid = mzxid
    return {"kind": "managed_ledger_changed", "at_ms": at_ms, "payload": managed_ledger_payload(message)}


def listing(*ledgers: TopicLedger) -> bytes:
    return encode_managed_ledger_info(ManagedLedgerInfo(ledgers))


def clock(at_ms: int) -> dict[str, Any]:
    return {"kind": "topics_clock", "at_ms": at_ms, "payload": {}}


def kinds(transitions: list[Any]) -> list[tuple[str, str, str]]:
    return [(a.kind.value, a.entity, a.state.value) for a in transitions]


def test_a_missing_ledger_fires_after_the_grace_and_resolves_with_the_same_id():
    stack = Stack(missing_grace_s=60)
    stack.log.add(1)
    assert stack.run([changed(1_000, 5, listing(TopicLedger(1), TopicLedger(2)))], snapshot_at=1_000) == []
    assert stack.run([clock(30_000)]) == []  # within the grace: Pulsar may be creating it
    fired = stack.run([clock(61_000)])
    assert kinds(fired) == [("TOPIC_LEDGER_MISSING", f"topic/{NAME}/ledger/2", "firing")]
    assert fired[0].detail["missing_since_ms"] == 1_000 and fired[0].pulsar_topic == TOPIC
    resolved = stack.run([changed(70_000, 6, listing(TopicLedger(1)))])  # unlisted (trimmed)
    assert kinds(resolved) == [("TOPIC_LEDGER_MISSING", f"topic/{NAME}/ledger/2", "resolved")]
    assert resolved[0].alert_id == fired[0].alert_id
    assert stack.topic_rows[-1]["ledger_ids"] == [1]


def test_nothing_is_judged_before_a_complete_full_snapshot():
    stack = Stack(missing_grace_s=0)
    assert stack.run([changed(1_000, 5, listing(TopicLedger(2)))]) == []
    assert stack.run([clock(100_000)]) == []
    fired = stack.run([clock(101_000)], snapshot_at=101_000)
    assert kinds(fired) == [("TOPIC_LEDGER_MISSING", f"topic/{NAME}/ledger/2", "firing")]


def test_an_offloaded_ledger_deleted_from_bookkeeper_is_not_missing():
    stack = Stack(missing_grace_s=0)
    offloaded = TopicLedger(3, offloaded=True, bookkeeper_deleted=True)
    half = TopicLedger(4, offloaded=True, bookkeeper_deleted=False)
    fired = stack.run([changed(1_000, 5, listing(offloaded, half))], snapshot_at=1_000)
    assert kinds(fired) == [("TOPIC_LEDGER_MISSING", f"topic/{NAME}/ledger/4", "firing")]
    row = stack.topic_rows[-1]
    assert (row["offloaded_ids"], row["bookkeeper_deleted_ids"]) == ([3, 4], [3])


def test_a_cursor_ledger_is_checked_and_a_deleted_cursor_resolves():
    stack = Stack(missing_grace_s=0)
    stack.log.add(1)
    cursor = encode_managed_cursor_info(ManagedCursorInfo(9))
    fired = stack.run(
        [changed(1_000, 5, listing(TopicLedger(1))), changed(1_000, 6, cursor, cursor="sub")],
        snapshot_at=1_000,
    )
    assert kinds(fired) == [("TOPIC_LEDGER_MISSING", f"topic/{NAME}/ledger/9", "firing")]
    gone = {"kind": "managed_ledger_deleted", "at_ms": 2_000, "payload": {"name": NAME, "cursor": "sub"}}
    assert kinds(stack.run([gone])) == [("TOPIC_LEDGER_MISSING", f"topic/{NAME}/ledger/9", "resolved")]


def test_an_undecodable_znode_is_a_dead_letter_and_metadata_corrupt_for_its_topic_until_it_decodes():
    stack = Stack()
    stack.log.add(1)
    fired = stack.run([changed(1_000, 5, b"\x47\x78garbage")], snapshot_at=1_000)
    assert kinds(fired) == [("METADATA_CORRUPT", f"topic/{NAME}", "firing")]
    assert stack.dead[-1]["source"] == "managed_ledger" and stack.dead[-1]["reason"]
    assert (
        stack.dead[-1]["path"] == f"/managed-ledgers/{NAME}" and stack.dead[-1]["value"] == b"\x47\x78garbage"
    )
    assert stack.topic_rows[-1]["undecodable_reason"]
    resolved = stack.run([changed(2_000, 6, listing(TopicLedger(1)))])
    assert kinds(resolved) == [("METADATA_CORRUPT", f"topic/{NAME}", "resolved")]
    assert resolved[0].alert_id == fired[0].alert_id


def test_an_orphaned_ledger_fires_after_both_graces_and_resolves_when_listed_again():
    stack = Stack(missing_grace_s=10, orphan_grace_s=100)
    stack.log.add(1, ctime_ms=0)
    stack.log.add(7, ctime_ms=50_000, length=4_096)  # its topic does not list it
    stack.log.add(8, ctime_ms=0, topic=None)  # not Pulsar's: never orphaned
    assert stack.run([changed(1_000, 5, listing(TopicLedger(1)))], snapshot_at=1_000) == []
    assert stack.run([clock(140_000)]) == []  # younger than the orphan grace: being listed, maybe
    assert stack.run([clock(170_000)]) == []  # old enough now: orphaned, for the missing grace first
    assert stack.run([clock(185_000)]) == []  # checked at most every ORPHAN_CHECK_EVERY_MS
    fired = stack.run([clock(200_000)])
    assert kinds(fired) == [("LEDGER_ORPHANED", "ledger/7", "firing")]
    assert fired[0].detail["size"] == 4_096 and fired[0].detail["managed_ledger_exists"] is True
    resolved = stack.run([changed(210_000, 6, listing(TopicLedger(1), TopicLedger(7)))])
    assert kinds(resolved) == [("LEDGER_ORPHANED", "ledger/7", "resolved")]
    assert resolved[0].alert_id == fired[0].alert_id


def test_a_managed_ledger_missing_from_a_full_snapshot_is_deleted():
    stack = Stack(missing_grace_s=0)
    stack.run([changed(1_000, 5, listing(TopicLedger(2)))], snapshot_at=1_000)
    batch_rows = [clock(5_000)]
    stack.stage.partitions = 1
    resolved = stack.run(batch_rows, snapshot_at=5_000)  # begin_ms 0 < seen 1_000: still there
    assert resolved == []
    stack2 = Stack(missing_grace_s=0)
    stack2.run([changed(1_000, 5, listing(TopicLedger(2)))], snapshot_at=1_000)
    batch = SinkBatch(
        batch_id=9,
        cluster="c",
        book=AlertBook("c", open=dict(stack2.open)),
        bookie_rows={},
        changes_partitions=1,
    )
    batch.snapshots_complete.append({"partition": 0, "partition_count": 1, "begin_ms": 2_000, "at_ms": 3_000})
    stack2.stage.apply(batch, [], stack2.log)  # type: ignore[arg-type]
    assert kinds(batch.book.transitions) == [("TOPIC_LEDGER_MISSING", f"topic/{NAME}/ledger/2", "resolved")]
    assert batch.topic_rows[-1]["deleted"] is True


@given(
    st.lists(st.tuples(st.integers(0, 30), st.booleans(), st.booleans()), max_size=20),
    st.sets(st.integers(0, 30), max_size=20),
)
def test_missing_pairs_is_the_per_ledger_rule(ledgers, existing):
    info = tuple(TopicLedger(i, offloaded=o, bookkeeper_deleted=d) for i, o, d in ledgers)
    found = missing_pairs(listed_table({NAME: Listing(info, {})}), np.array(sorted(existing), np.int64))
    expected = sorted({i for i, o, d in ledgers if i not in existing and not (o and d)})
    assert found.column("ledger_id").to_pylist() == expected


def test_states_are_alert_states():
    assert AlertState.FIRING.value == "firing"
    assert AlertKind.TOPIC_LEDGER_MISSING.severity == "critical"
    assert AlertKind.LEDGER_ORPHANED.severity == "warning"
    with pytest.raises(ValueError):
        AlertBook("c").set_topic_condition(AlertKind.BOOKIE_LOST, NAME, True, at_ms=1)


@given(
    st.lists(
        st.tuples(
            st.integers(0, 20),  # ledger id
            st.sampled_from([None, "persistent://a/b/c", "persistent://a/b/d"]),  # its topic
            st.integers(0, 200),  # ctime
            st.sampled_from([None, "managed-ledger", "schema"]),  # component
        ),
        max_size=15,
        unique_by=lambda t: t[0],
    ),
    st.sets(st.integers(0, 20), max_size=10),
    st.sets(st.integers(0, 20), max_size=5),
)
def test_orphaned_ledgers_is_the_per_ledger_rule(ledgers, listed_c, cursor_ids):
    cursors = {f"s{i}": i for i in cursor_ids}
    listed = listed_table(
        {"a/b/persistent/c": Listing(tuple(TopicLedger(i) for i in sorted(listed_c)), cursors)}
    )
    table = pa.table(
        {
            "ledger_id": pa.array([t[0] for t in ledgers], pa.int64()),
            "pulsar_topic": pa.array([t[1] for t in ledgers], pa.string()),
            "ctime_ms": pa.array([t[2] for t in ledgers], pa.int64()),
            "length": pa.array([1] * len(ledgers), pa.int64()),
            "component": pa.array([t[3] for t in ledgers], pa.string()),
        }
    )
    found = orphaned_ledgers(table, listed, now_ms=200, grace_ms=100).column("ledger_id").to_pylist()
    needed = listed_c | cursor_ids
    expected = sorted(
        i
        for i, topic, ctime, component in ledgers
        if topic is not None
        and component in (None, "managed-ledger")
        and ctime <= 100
        and not (topic == "persistent://a/b/c" and i in needed)
    )
    assert found == expected


def test_a_managed_ledger_event_is_decoded_and_passed_to_the_sink_with_the_clock():
    from datetime import UTC, datetime

    from core import events as ev
    from streaming.decode import ARROW_CHANGE_SCHEMA, decode_record
    from streaming.ledger_lane import managed_ledger_decisions, topics_clock

    event = ev.EventBuilder("c", "run", clock_ms=lambda: 1_000).build(
        ev.managed_ledger_changed(NAME, "", b"\xff", None),
        snapshot_id="s1",  # type: ignore[arg-type]
    )
    row = decode_record(b"k", ev.encode_event(event), "changes", 0, 3, feedback_topic="feedback")
    assert (row["kind"], row["state_key"]) == ("managed_ledger_changed", "managed-ledgers")
    row["event_time"] = datetime.fromtimestamp(1, tz=UTC)
    decisions = managed_ledger_decisions(pa.Table.from_pylist([row], schema=ARROW_CHANGE_SCHEMA), "c")
    payload = json.loads(decisions.column("payload")[0].as_py())
    assert (
        payload["name"] == NAME and payload["snapshot_id"] == "s1" and "does not decode" in payload["error"]
    )
    assert topics_clock(2_000, "c").column("kind").to_pylist() == ["topics_clock"]


def test_a_batch_replayed_after_a_crash_decides_the_same_alerts_with_the_same_ids(tmp_path):
    """The state is saved after the batch's tables: a crash before that replays the batch from the state of
    the batch before it, in a new process (a new stage on the same directory)."""
    log = FakeLog()
    log.add(1)

    def run(stage: TopicsStage, batch_id: int, rows: list[dict[str, Any]], **extra: Any) -> list[Any]:
        batch = SinkBatch(
            batch_id=batch_id, cluster="c", book=AlertBook("c"), bookie_rows={}, changes_partitions=1
        )
        batch.snapshots_complete.extend(extra.get("snapshots", []))
        stage.apply(batch, rows, log)  # type: ignore[arg-type]
        return batch.book.transitions

    config = TopicsConfig(missing_grace_s=10)
    first = TopicsStage(config, tmp_path, changes_partitions=1)
    snapshot = {"partition": 0, "partition_count": 1, "begin_ms": 0, "at_ms": 1_000}
    run(first, 0, [changed(1_000, 5, listing(TopicLedger(1), TopicLedger(2)))], snapshots=[snapshot])
    first.commit()
    fired = run(first, 1, [clock(20_000)])  # the process dies before commit()
    again = run(TopicsStage(config, tmp_path, changes_partitions=1), 1, [clock(20_000)])
    assert [a.alert_id for a in again] == [a.alert_id for a in fired] and len(fired) == 1
