"""The decoder's columnar hot path against its per-record form: the same rows, byte for byte."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.kafka.planner import ARROW_RECORD_SCHEMA
from core import events as ev
from core.domain.rackmap import parse_rack_map
from core.pb import change_events_pb2 as pb
from streaming.decode import (
    ARROW_CHANGE_SCHEMA,
    _encode_ledger_payload,
    decode_batches,
    decode_record,
    ledger_payload,
    ledger_payload_json,
)

CHANGES, FEEDBACK = "bkaudit.changes", "bkaudit.feedback"
NOW_MS = 1_800_000_000_000
SKEW_S = 300
BUCKETS = 16
#: What the Kafka source hands the decoder (its first columns), plus Spark's batch time.
SOURCE_SCHEMA = pa.schema(
    [*list(ARROW_RECORD_SCHEMA)[:6], pa.field("batch_time", pa.timestamp("us", tz="UTC"))]
)

texts = st.text(max_size=12)  # any code point: the JSON text escapes what it must
int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)
int32s = st.integers(min_value=-(2**31), max_value=2**31 - 1)


@st.composite
def upserts(draw: Any) -> pb.LedgerUpserted:
    upserted = pb.LedgerUpserted(ledger_id=draw(st.integers(0, 2**63 - 1)), path=draw(texts))
    md = upserted.metadata
    md.format_version = draw(int32s)
    md.ensemble_size, md.write_quorum, md.ack_quorum = (draw(int32s) for _ in range(3))
    md.state = draw(st.integers(0, 4))  # 0 and 4 are not in the enum's names: the payload says OPEN
    md.last_entry_id, md.length, md.creation_time_ms = (draw(int64s) for _ in range(3))
    md.digest_type = draw(st.integers(0, 5))  # unknown digests are null
    md.has_password = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        segment = md.segments.add(first_entry_id=draw(int64s))
        segment.ensemble.extend(draw(st.lists(texts, max_size=4)))
    for _ in range(draw(st.integers(0, 3))):
        md.custom_metadata.add(key=draw(texts), value=draw(st.binary(max_size=12)))
    if draw(st.booleans()):
        md.pulsar_topic = draw(texts)
    stat = upserted.znode
    stat.mzxid, stat.ctime_ms, stat.mtime_ms = (draw(int64s) for _ in range(3))
    stat.version, stat.data_length = draw(int32s), draw(int32s)
    return upserted


@settings(max_examples=300, deadline=None)
@given(upserted=upserts(), snapshot_id=st.none() | texts)
def test_the_upsert_payload_text_is_the_encoded_payload_dictionary(upserted, snapshot_id):
    expected = _encode_ledger_payload({**ledger_payload(upserted), "snapshot_id": snapshot_id})
    assert ledger_payload_json(upserted, snapshot_id) == expected
    assert json.loads(ledger_payload_json(upserted, snapshot_id))["snapshot_id"] == snapshot_id


def _event(payload: Any, at_ms: int, snapshot_id: str | None) -> bytes:
    builder = ev.EventBuilder("c1", "run-1", clock_ms=lambda: at_ms)
    return ev.encode_event(builder.build(payload, event_time_ms=at_ms, snapshot_id=snapshot_id))


@st.composite
def records(draw: Any) -> tuple[str, bytes | None, int]:
    """(topic, value, event time ms): valid upserts (some from the future), other events, bad bytes,
    feedback records good and bad, and upserts sent to the feedback topic."""
    at_ms = NOW_MS + draw(st.sampled_from([-5_000, 0, SKEW_S * 1000, SKEW_S * 1000 + 1, 10**9]))
    snapshot_id = draw(st.none() | st.just("snap-1"))
    kind = draw(st.sampled_from(["upsert", "upsert", "heartbeat", "deleted", "bytes", "none", "feedback"]))
    if kind == "upsert":
        upserted = draw(upserts())
        upserted.ledger_id %= 2**40
        return draw(st.sampled_from([CHANGES, FEEDBACK])), _event(upserted, at_ms, snapshot_id), at_ms
    if kind == "heartbeat":
        return CHANGES, _event(ev.heartbeat(at_ms, partition=0, partition_count=1), at_ms, None), at_ms
    if kind == "deleted":
        deleted = pb.LedgerDeleted(ledger_id=draw(st.integers(0, 2**40)), last_mzxid=draw(st.integers(0, 99)))
        return CHANGES, _event(deleted, at_ms, snapshot_id), at_ms
    if kind == "none":
        return CHANGES, None, at_ms
    if kind == "feedback":
        message = {"kind": "probe_result", "ledger_id": draw(st.integers(0, 99)), "event_time_ms": at_ms}
        if draw(st.booleans()):
            message["cluster"] = "c1"
        return FEEDBACK, json.dumps(message).encode(), at_ms
    return draw(st.sampled_from([CHANGES, FEEDBACK])), draw(st.binary(max_size=40)), at_ms


def _source(items: list[tuple[str, bytes | None, int]], batch_ms: int) -> pa.RecordBatch:
    def utc(ms: int) -> datetime:
        return datetime.fromtimestamp(ms / 1000, tz=UTC)

    return pa.RecordBatch.from_pylist(
        [
            {
                "key": b"k",
                "value": value,
                "topic": topic,
                "partition": offset % 3,
                "offset": offset,
                "timestamp": utc(NOW_MS),
                "batch_time": utc(batch_ms),
            }
            for offset, (topic, value, _) in enumerate(items)
        ],
        schema=SOURCE_SCHEMA,
    )


def _per_record(source: pa.RecordBatch) -> list[dict[str, Any]]:
    """The decoder's contract, one record at a time: :func:`decode_record`, then dead letters stamped with
    the receiving clock and without a watermark time."""
    rows = []
    batch_ms = source.column("batch_time").cast(pa.int64()).to_pylist()
    for record, received_us in zip(source.to_pylist(), batch_ms, strict=True):
        received_ms = min(NOW_MS, received_us // 1000)
        row = decode_record(
            record["key"],
            record["value"],
            record["topic"],
            record["partition"],
            record["offset"],
            feedback_topic=FEEDBACK,
            ledger_buckets=BUCKETS,
            received_ms=received_ms,
            max_event_time_skew_s=SKEW_S,
        )
        if row["kind"] == "dead_letter":
            row["event_time"], row["watermark_time"] = received_ms * 1000, None
        else:
            row["watermark_time"] = row["event_time"]
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=ARROW_CHANGE_SCHEMA).to_pylist()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(records(), max_size=12), batch_late_ms=st.sampled_from([0, 1_000]))
def test_a_batch_decodes_to_the_rows_of_its_records_one_by_one(items, batch_late_ms):
    source = _source(items, NOW_MS + batch_late_ms)
    (decoded,) = decode_batches(
        iter([source]), FEEDBACK, ledger_buckets=BUCKETS, max_event_time_skew_s=SKEW_S
    )
    assert decoded.schema == ARROW_CHANGE_SCHEMA
    assert decoded.to_pylist() == _per_record(source)


def test_an_empty_batch_decodes_to_an_empty_batch():
    (decoded,) = decode_batches(iter([_source([], NOW_MS)]), FEEDBACK)
    assert decoded.num_rows == 0 and decoded.schema == ARROW_CHANGE_SCHEMA


def test_a_rack_map_event_carries_each_bookies_affinity_group() -> None:
    rack_map = parse_rack_map(b'{"orders": {"b-1": {"rack": "/r1"}}, "default": {"b-2": null}}')
    value = _event(ev.rack_map_event("zk:/bookies", rack_map, present=True), 5, None)
    row = decode_record(b"c1", value, "bkaudit.changes", 0, 1, feedback_topic="bkaudit.feedback")
    assert json.loads(row["payload"])["groups"] == {"b-1": "orders", "b-2": "default"}
