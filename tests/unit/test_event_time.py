"""Event time against the receiving clock (pure rule and the decoder), and what dead letters keep."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from core import events as ev
from core.domain.rules.event_time import format_utc, future_event_reason, receiving_clock_ms
from streaming.decode import decode_batches, decode_record

NOW_MS = 1_800_000_000_000  # 2027-01-15T08:00:00Z
YEAR_2100_MS = int(datetime(2100, 1, 1, tzinfo=UTC).timestamp() * 1000)
SOURCE_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("batch_time", pa.timestamp("us", tz="UTC")),
    ]
)


def heartbeat(at_ms: int) -> bytes:
    builder = ev.EventBuilder("c1", "run-1", clock_ms=lambda: at_ms)
    event = builder.build(ev.heartbeat(at_ms, partition=0, partition_count=1), event_time_ms=at_ms)
    return ev.encode_event(event)


def utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def decoded(records: list[tuple[bytes, int, int]], skew_s: float = 300) -> list[dict]:
    """(value, Kafka timestamp ms, batch time ms) records through the job's mapInArrow function."""
    batch = pa.RecordBatch.from_pylist(
        [
            {
                "key": b"cluster",
                "value": value,
                "topic": "bkaudit.changes",
                "partition": 0,
                "offset": offset,
                "timestamp": utc(kafka_ms),
                "batch_time": utc(batch_ms),
            }
            for offset, (value, kafka_ms, batch_ms) in enumerate(records)
        ],
        schema=SOURCE_SCHEMA,
    )
    out = decode_batches(iter([batch]), "bkaudit.feedback", max_event_time_skew_s=skew_s)
    return pa.Table.from_batches(list(out)).to_pylist()


# ------------------------------------------------------------------------------------------ the pure rule


def test_the_receiving_clock_is_the_earlier_of_the_kafka_time_and_the_batch_time():
    assert receiving_clock_ms(NOW_MS, NOW_MS + 5_000) == NOW_MS
    assert receiving_clock_ms(YEAR_2100_MS, NOW_MS) == NOW_MS  # a producer whose clock jumped
    assert receiving_clock_ms(-1, NOW_MS) == NOW_MS  # Kafka's "no timestamp"
    assert receiving_clock_ms(None, NOW_MS) == NOW_MS
    assert receiving_clock_ms(NOW_MS, None) == NOW_MS
    assert receiving_clock_ms(None, None) is None


@pytest.mark.parametrize(
    ("ahead_ms", "rejected"),
    [(-3_600_000, False), (0, False), (300_000, False), (300_001, True), (YEAR_2100_MS - NOW_MS, True)],
)
def test_an_event_more_than_the_skew_ahead_of_the_receiving_clock_is_rejected(ahead_ms, rejected):
    reason = future_event_reason(NOW_MS + ahead_ms, NOW_MS, max_skew_s=300)
    assert (reason is not None) == rejected


def test_the_reason_names_the_event_time_the_skew_and_the_receiving_clock():
    assert future_event_reason(YEAR_2100_MS, NOW_MS, max_skew_s=300) == (
        "event time 2100-01-01T00:00:00Z is more than 300 s ahead of the receiving clock "
        "2027-01-15T08:00:00Z (the earlier of the Kafka record time and the batch time)"
    )
    assert "more than 0.5 s ahead" in future_event_reason(NOW_MS + 501, NOW_MS, max_skew_s=0.5)
    assert future_event_reason(YEAR_2100_MS, None, max_skew_s=300) is None  # nothing to compare with
    assert format_utc(NOW_MS + 7) == "2027-01-15T08:00:00.007Z"


# ------------------------------------------------------------------------------------------ the decoder


def test_a_heartbeat_from_2100_becomes_a_dead_letter_that_never_moves_the_watermark():
    (row,) = decoded([(heartbeat(YEAR_2100_MS), NOW_MS, NOW_MS + 2_000)])
    assert row["kind"] == "dead_letter" and row["state_key"] == "dead"
    assert row["watermark_time"] is None
    assert row["event_time"] == utc(NOW_MS)  # stamped with the receiving clock, not 2100
    payload = json.loads(row["payload"])
    assert payload["source"] == "future"
    assert payload["reason"].startswith("event time 2100-01-01T00:00:00Z is more than 300 s ahead")
    assert base64.b64decode(payload["value_b64"]) == heartbeat(YEAR_2100_MS)  # the record, for a replay
    assert base64.b64decode(payload["key_b64"]) == b"cluster"


def test_a_future_kafka_timestamp_does_not_vouch_for_a_future_event():
    # A watcher whose clock jumped stamps its records (Kafka CreateTime) with the same wrong time.
    (row,) = decoded([(heartbeat(YEAR_2100_MS), YEAR_2100_MS, NOW_MS)])
    assert row["kind"] == "dead_letter" and row["event_time"] == utc(NOW_MS)


def test_events_within_the_skew_reach_the_watermark():
    rows = decoded(
        [
            (heartbeat(NOW_MS - 60_000), NOW_MS, NOW_MS),  # behind: fine
            (heartbeat(NOW_MS + 250_000), NOW_MS, NOW_MS + 1_000),  # a clock a little ahead: fine
        ]
    )
    assert [r["kind"] for r in rows] == ["heartbeat", "heartbeat"]
    assert [r["watermark_time"] for r in rows] == [utc(NOW_MS - 60_000), utc(NOW_MS + 250_000)]


def test_the_skew_is_a_setting():
    (row,) = decoded([(heartbeat(NOW_MS + 3_600_000), NOW_MS, NOW_MS)], skew_s=7200)
    assert row["kind"] == "heartbeat"


def test_a_replayed_batch_decides_the_same_however_late_it_runs():
    # Spark replays a batch with the batch timestamp it recorded; a fresh replay of the topic much later has
    # a later batch time, but the Kafka time still bounds the record as when it was first received.
    record = heartbeat(NOW_MS + 3_600_000)
    first = decoded([(record, NOW_MS, NOW_MS)])
    assert decoded([(record, NOW_MS, NOW_MS)]) == first
    assert decoded([(record, NOW_MS, NOW_MS + 86_400_000)]) == first
    assert first[0]["kind"] == "dead_letter"


def test_undecodable_records_keep_their_key_and_value_bytes():
    row = decode_record(b"ledger/9", b"\xff\x00junk", "bkaudit.changes", 1, 5, feedback_topic="fb")
    payload = json.loads(row["payload"])
    assert (payload["source"], payload["reason"]) == ("kafka", "change event: not a valid protobuf message")
    assert base64.b64decode(payload["key_b64"]) == b"ledger/9"
    assert base64.b64decode(payload["value_b64"]) == b"\xff\x00junk"
    empty = json.loads(decode_record(None, b"", "bkaudit.changes", 1, 6, feedback_topic="fb")["payload"])
    assert empty["value_b64"] == "" and "key_b64" not in empty  # empty value kept, absent key absent


@pytest.mark.parametrize("version", [b"2", b"3"])
def test_a_record_holding_raw_ledger_metadata_keeps_its_reason_but_not_its_bytes(version):
    value = b"BookieMetadataFormatVersion\t" + version + b"\n" + b'password: "s3cret"\n'
    row = decode_record(b"ledger/11", value, "bkaudit.changes", 0, 1, feedback_topic="fb")
    payload = json.loads(row["payload"])
    assert "value_b64" not in payload and "s3cret" not in row["payload"]
    assert payload["reason"].endswith(
        "value not kept: it looks like BookKeeper ledger metadata, which can hold the ledger password"
    )
    assert base64.b64decode(payload["key_b64"]) == b"ledger/11"


def test_a_future_ledger_event_is_kept_whole_and_holds_no_password():
    # Change events never carry the password (the watcher strips it), so keeping their bytes is safe.
    from collections import namedtuple

    from core.domain.metadata import DigestType, LedgerMetadata, LedgerPassword, LedgerState, Segment

    stat = namedtuple("Stat", "czxid mzxid ctime mtime version dataLength")(5, 5, 0, 0, 0, 90)
    md = LedgerMetadata(
        ensemble_size=2,
        write_quorum=2,
        ack_quorum=2,
        state=LedgerState.CLOSED,
        last_entry_id=9,
        length=100,
        segments=(Segment(0, ("b1:3181", "b2:3181")),),
        digest_type=DigestType.CRC32C,
        password=LedgerPassword(b"s3cret-pw"),
    )
    builder = ev.EventBuilder("c1", "run-1", clock_ms=lambda: YEAR_2100_MS)
    record = ev.encode_event(builder.build(ev.ledger_upserted(7, md, stat, "/ledgers/L7")))
    (row,) = decoded([(record, NOW_MS, NOW_MS)])
    payload = json.loads(row["payload"])
    assert (row["kind"], payload["source"]) == ("dead_letter", "future")
    kept = base64.b64decode(payload["value_b64"])
    assert kept == record and ev.decode_event(kept).ledger_upserted.metadata.has_password
    assert b"s3cret-pw" not in kept
