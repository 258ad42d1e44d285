"""The driver-run ledger lane's pure pieces: the decisions relayed through Kafka and back, and what the lane
makes of hostile records on the decisions and feedback topics (a dead letter with its reason, nothing else
in the batch lost)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.ledger_lane import (
    decisions_from_dicts,
    encode_decisions,
    failing_probe_ledgers,
    relayed_decisions,
)

AT = datetime(2026, 1, 1, tzinfo=UTC)


def records(values: list[bytes | None], topic: str = "decisions") -> pa.Table:
    """Raw Kafka records as the lane's reader gives them (the columns the lane reads)."""
    n = len(values)
    return pa.table(
        {
            "value": pa.array(values, pa.binary()),
            "topic": [topic] * n,
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "timestamp": pa.array([AT] * n, pa.timestamp("us", tz="UTC")),
        }
    )


def test_relayed_decisions_come_back_as_they_were_sent():
    sent = decisions_from_dicts(
        [
            {"kind": "probe_request", "event_time_ms": 5_000, "ledger_id": 7, "payload": {"round": 2}},
            {"kind": "under_replication_stuck", "event_time_ms": 6_000, "ledger_id": 8, "payload": {}},
        ],
        "c1",
    )
    back = relayed_decisions(records([value for _, value in encode_decisions(sent)]))
    assert back.to_pylist() == sent.to_pylist()
    assert [key for key, _ in encode_decisions(sent)] == [b"ledger/7", b"ledger/8"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=64)), min_size=1, max_size=8))
def test_random_records_on_the_decisions_topic_are_dead_letters_and_the_rest_is_kept(garbage):
    good = encode_decisions(
        decisions_from_dicts([{"kind": "replicas_cleared", "event_time_ms": 1, "ledger_id": 3}], "c1")
    )[0][1]
    back = relayed_decisions(records([good, *garbage])).to_pylist()
    assert back[0]["kind"] == "replicas_cleared" and back[0]["ledger_id"] == 3
    for row, value in zip(back[1:], garbage, strict=True):
        if row["kind"] == "dead_letter":
            assert json.loads(row["payload"])["reason"].startswith("not a relayed decision")
            assert (row["topic"], row["partition"]) == ("decisions", 0)
        else:  # random bytes that happen to be a decision's JSON
            assert value is not None and json.loads(value)["kind"] == row["kind"]


def test_truncated_and_hostile_relayed_records_are_dead_letters():
    whole = encode_decisions(
        decisions_from_dicts([{"kind": "probe_request", "event_time_ms": 1, "ledger_id": 3}], "c1")
    )[0][1]
    hostile = [whole[: len(whole) // 2], b"[]", b'{"kind": "x"}', b'{"event_time_ms": "soon"}', b"null", None]
    back = relayed_decisions(records(hostile)).to_pylist()
    assert [row["kind"] for row in back] == ["dead_letter"] * len(hostile)
    assert all("not a relayed decision" in json.loads(row["payload"])["reason"] for row in back)


def test_only_failing_probe_results_track_their_ledger_and_bad_feedback_is_skipped():
    feedback = [
        json.dumps({"ledger_id": 1, "failing": True, "outcome": {"result": "LESS_THAN_AQ"}}),
        json.dumps({"ledger_id": 2, "failing": False}),
        '{"ledger_id": 3, "failing":true, "outcome": ',  # truncated: the timers query's dead letter
        json.dumps([{"failing": True}]),
        None,
    ]
    values = [v.replace(", ", ",").replace(": ", ":").encode() if v else None for v in feedback]
    assert failing_probe_ledgers(records(values, "feedback")).tolist() == [1]


# -- heartbeats for the timers query ------------------------------------------------------------------------
def lane_with_forwarded(tmp_path):
    from streaming.driver_batches import LaneStates
    from streaming.ledger_lane import LedgerLane, LedgerLaneConfig
    from streaming.processor import ProcessorConfig

    forwarded: list[list[bytes]] = []
    config = LedgerLaneConfig(
        "changes", "feedback", "tracked", "decisions", ProcessorConfig(membership=False)
    )
    lane = LedgerLane(
        config,
        lambda decisions, batch_id: None,
        lambda topic, chosen: forwarded.append([key for key, _ in chosen]),
        LaneStates(tmp_path),
    )
    return lane, forwarded


def change_records(events: list) -> pa.Table:
    """The change events as the lane's reader gives them: Kafka records plus the batch's time."""
    from connectors.kafka.planner import ARROW_RECORD_SCHEMA
    from core import events as ev

    rows = [
        {
            "key": ev.kafka_key(e),
            "value": ev.encode_event(e),
            "topic": "changes",
            "partition": 0,
            "offset": n,
            "timestamp": AT,
            "timestampType": 0,
            "headers": [],
        }
        for n, e in enumerate(events)
    ]
    table = pa.Table.from_pylist(rows, schema=ARROW_RECORD_SCHEMA)
    return table.append_column("batch_time", pa.array([AT] * len(rows), pa.timestamp("us", tz="UTC")))


def beats(builder, *times_ms: int) -> list:
    from core import events as ev

    return [builder.build(ev.heartbeat(t, partition=0, partition_count=1), event_time_ms=t) for t in times_ms]


def test_with_nothing_tracked_the_timers_query_gets_a_heartbeat_only_every_idle_interval(tmp_path):
    from core import events as ev
    from streaming.ledger_lane import IDLE_HEARTBEAT_INTERVAL_MS

    lane, forwarded = lane_with_forwarded(tmp_path)
    builder = ev.EventBuilder("c1", "run")
    start = int(AT.timestamp() * 1000)
    step = IDLE_HEARTBEAT_INTERVAL_MS // 3
    for batch_id in range(7):  # one heartbeat a batch, a third of the interval apart
        lane.process(change_records(beats(builder, start + batch_id * step)), batch_id)
    assert [len(keys) for keys in forwarded] == [1, 1, 1]  # batches 0, 3 and 6
    assert lane.store.before(7)["heartbeat_forwarded_ms"] == start + 6 * step
    replayed = ev.EventBuilder("c1", "run")
    lane.process(change_records(beats(replayed, start + 6 * step)), 6)  # batch 6 again: forwarded again
    assert [len(keys) for keys in forwarded] == [1, 1, 1, 1]


def test_with_a_tracked_ledger_every_heartbeat_reaches_the_timers_query(tmp_path):
    from core import events as ev
    from core.domain.underreplication import UnderreplicatedLedger

    lane, forwarded = lane_with_forwarded(tmp_path)
    builder = ev.EventBuilder("c1", "run")
    start = int(AT.timestamp() * 1000)
    lane.process(change_records(beats(builder, start)), 0)
    mark = ev.underreplication_set(7, UnderreplicatedLedger(("b1",), start), _Stat())
    lane.process(change_records([builder.build(mark), *beats(builder, start + 1_000)]), 1)
    lane.process(change_records(beats(builder, start + 2_000)), 2)
    assert forwarded == [[b"cluster"], [b"ledger/7", b"cluster"], [b"cluster"]]  # heartbeats key "cluster"


class _Stat:
    czxid = mzxid = 5
    ctime = mtime = 0
    version = 0
    dataLength = 9


def test_a_tracked_ledger_in_a_snapshot_is_seen_by_the_sink_at_once(tmp_path):
    """Its upsert goes to the timers query, which relays it later than the snapshot's end; without a sighting
    in this batch, the sink's reconciliation of the complete snapshot would take the ledger for deleted."""
    from core import events as ev
    from core.domain.metadata import LedgerMetadata, LedgerState, Segment
    from core.domain.underreplication import UnderreplicatedLedger
    from streaming.driver_batches import LaneStates
    from streaming.ledger_lane import LedgerLane, LedgerLaneConfig
    from streaming.processor import ProcessorConfig

    queued: list[pa.Table] = []
    forwarded: list[list[bytes]] = []
    config = LedgerLaneConfig(
        "changes", "feedback", "tracked", "decisions", ProcessorConfig(membership=False)
    )
    lane = LedgerLane(
        config,
        lambda decisions, batch_id: queued.append(decisions),
        lambda topic, chosen: forwarded.append([key for key, _ in chosen]),
        LaneStates(tmp_path),
    )
    builder = ev.EventBuilder("c1", "run")
    start = int(AT.timestamp() * 1000)
    mark = ev.underreplication_set(7, UnderreplicatedLedger(("b1",), start), _Stat())
    lane.process(change_records([builder.build(mark)]), 0)  # ledger 7 is tracked from now on
    md = LedgerMetadata(
        ensemble_size=2,
        write_quorum=2,
        ack_quorum=2,
        state=LedgerState.CLOSED,
        last_entry_id=1,
        length=2,
        segments=(Segment(0, ("b1:3181", "b2:3181")),),
    )
    upsert = builder.build(ev.ledger_upserted(7, md, _Stat(), "/ledgers/L7"), snapshot_id="snap-1")
    lane.process(change_records([upsert]), 1)
    assert forwarded[-1] == [b"ledger/7"]  # the version itself goes through the timers query
    seen = queued[-1].filter(pa.compute.equal(queued[-1].column("kind"), "ledger_seen")).to_pylist()
    assert [(r["ledger_id"], json.loads(r["payload"])) for r in seen] == [(7, {"snapshot_id": "snap-1"})]
