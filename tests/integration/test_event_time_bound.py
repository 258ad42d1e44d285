"""Event time against the receiving clock, and the job's own account of late and poison records.

Real broker, real Spark (``--available-now`` runs of the job), real Delta. A change event dated further ahead
of the receiving clock than ``stream.max_event_time_skew_s`` must not reach the watermark (a heartbeat dated
2100 would make every later event late, and Spark drops late rows); it goes to ``dead_letters`` with its
reason. Rows Spark drops as late anyway are counted, and dead letters keep the record's bytes.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from bkaudit.testing.kafka_io import produce
from connectors.delta.tables import read_table
from connectors.kafka.topics import ensure_topic
from core import events as ev
from core.settings import Settings
from streaming import job
from tests.integration.event_fixtures import Watcher

pytestmark = pytest.mark.integration

BOOKIES = [f"10.0.0.{i}:3181" for i in range(1, 4)]
YEAR_2100_MS = int(datetime(2100, 1, 1, tzinfo=UTC).timestamp() * 1000)


def job_with_watcher(
    kafka_settings: Any, tmp_path: Any, *, clock_offset_ms: int, **stream: Any
) -> tuple[Settings, Watcher, int]:
    """One job on a 2-partition changes topic and a fake watcher whose clock starts at now + offset."""
    kafka = kafka_settings.model_copy(update={"topic_partitions": 2})
    settings = Settings(
        kafka=kafka,
        lakehouse_root=tmp_path / "lh",
        checkpoint_root=tmp_path / "cp",
        stream={"watermark_delay_s": 0.5, "default_recovery_delay_s": 0, **stream},
    )
    ensure_topic(kafka, kafka.changes_topic, partitions=2)
    t0 = int(time.time() * 1000) + clock_offset_ms
    clock = iter(range(t0, t0 + 10**9, 10))
    return settings, Watcher(kafka, lambda: next(clock)), t0


def run_once(spark: Any, settings: Settings) -> Any:
    """One ``--available-now`` run; returns the job's metrics once its listener saw the run's last batch."""
    query, sink = job.start(spark, settings, available_now=True)
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    sink.close()
    last_batch = query.lastProgress["batchId"]
    registry = sink.metrics.registry
    deadline = time.monotonic() + 120  # the query listener is called asynchronously
    while registry.get_sample_value("bkaudit_stream_batch_id") != last_batch:
        assert time.monotonic() < deadline, "the query listener did not report the last batch"
        time.sleep(0.2)
    return registry


def heartbeat_at(settings: Settings, at_ms: int) -> None:
    """A heartbeat on every partition from another watcher run (a watcher's own later events never date
    earlier than its last one, so the run whose clock jumped is not the one sending the real events)."""
    other = Watcher(settings.kafka, lambda: at_ms)
    other.heartbeat(at_ms)
    other.close()


def ledger_ids(settings: Settings) -> set[int]:
    return set(read_table(settings.lakehouse_root, "ledgers").column("ledger_id").to_pylist())


def test_a_heartbeat_from_2100_goes_to_dead_letters_and_later_events_are_still_applied(
    spark, kafka_settings, tmp_path
):
    settings, watcher, t0 = job_with_watcher(kafka_settings, tmp_path, clock_offset_ms=-60_000)
    watcher.bookie(BOOKIES[0], "WRITABLE")
    watcher.ledger(1, BOOKIES)
    watcher.heartbeat(t0 + 1_000)
    watcher.flush()
    heartbeat_at(settings, YEAR_2100_MS)  # a valid heartbeat on every partition, dated 2100
    first = run_once(spark, settings)

    watcher.ledger(2, BOOKIES)  # real events after it: not late
    watcher.ledger(3, BOOKIES)
    watcher.heartbeat(t0 + 2_000)
    watcher.flush()
    metrics = run_once(spark, settings)

    assert ledger_ids(settings) == {1, 2, 3}
    assert first.get_sample_value("bkaudit_stream_dead_letters_total", {"source": "future"}) == 2
    dead = read_table(settings.lakehouse_root, "dead_letters").to_pylist()
    assert sorted(d["partition"] for d in dead) == [0, 1]
    assert {(d["source"], d["topic"]) for d in dead} == {("future", settings.kafka.changes_topic)}
    for d in dead:
        assert re.fullmatch(
            r"event time 2100-01-01T00:00:00Z is more than 300 s ahead of the receiving clock "
            r"20\d\d-\d\d-\d\dT[0-9:.]+Z \(the earlier of the Kafka record time and the batch time\)",
            d["reason"],
        ), d["reason"]
    assert all(ev.decode_event(d["value"]).HasField("heartbeat") for d in dead)  # the record, kept whole
    assert all(d["received_at"].year < 2100 for d in dead)  # stamped with the receiving clock
    assert metrics.get_sample_value("bkaudit_stream_watermark_timestamp_seconds") < time.time()
    assert metrics.get_sample_value("bkaudit_stream_watermark_ahead_seconds") == 0
    assert metrics.get_sample_value("bkaudit_stream_rows_dropped_late_total") == 0


def changes_behind_a_watermark_pushed_ahead(spark: Any, kafka_settings: Any, tmp_path: Any) -> tuple:
    """Ledger 1, then a heartbeat an hour ahead (accepted within a generous skew: the watermark is then
    ahead of the wall clock), then ledgers 2 and 3 dated now, an hour behind it. The job's settings and
    its metrics after each of the two runs."""
    settings, watcher, t0 = job_with_watcher(
        kafka_settings, tmp_path, clock_offset_ms=0, max_event_time_skew_s=7200
    )
    watcher.bookie(BOOKIES[0], "WRITABLE")
    watcher.ledger(1, BOOKIES)
    watcher.flush()
    heartbeat_at(settings, t0 + 3_600_000)
    first = run_once(spark, settings)
    watcher.ledger(2, BOOKIES)
    watcher.ledger(3, BOOKIES)
    watcher.flush()
    return settings, first, run_once(spark, settings)


def test_the_driver_lane_applies_changes_dated_behind_a_watermark_pushed_ahead(
    spark, kafka_settings, tmp_path
):
    # Ledger changes do not pass the stateful operator (the ledger lane applies them): none is dropped as
    # late. (The ahead gauge is the timers query's, fed only by the heartbeats the lane forwards: its
    # arithmetic is tests/unit/test_stream_metrics.py's.)
    settings, _, metrics = changes_behind_a_watermark_pushed_ahead(spark, kafka_settings, tmp_path)
    assert ledger_ids(settings) == {1, 2, 3}
    assert metrics.get_sample_value("bkaudit_stream_rows_dropped_late_total") == 0


def test_dead_letters_of_poison_records_keep_their_key_and_value_bytes(spark, kafka_settings, tmp_path):
    settings, watcher, _ = job_with_watcher(kafka_settings, tmp_path, clock_offset_ms=-60_000)
    kafka = settings.kafka
    poison = {(b"ledger/9", b"\xff\x00not a change event"), (b"ledger/10", b"")}
    # Raw ledger metadata (which holds the ledger password) published by mistake: its bytes are not kept.
    metadata = b'BookieMetadataFormatVersion\t2\nquorumSize: 2\npassword: "s3cret"\n'
    records = [(key, value, 1) for key, value in sorted(poison)] + [(b"ledger/11", metadata, 0)]
    produce(kafka, kafka.changes_topic, records)  # one-record batches: exact ends
    watcher.ledger(1, BOOKIES)
    watcher.flush()
    run_once(spark, settings)

    dead = read_table(settings.lakehouse_root, "dead_letters").to_pylist()
    assert {(d["key"], d["value"]) for d in dead if d["partition"] == 1} == poison
    (withheld,) = [d for d in dead if d["partition"] == 0]
    assert withheld["key"] == b"ledger/11" and withheld["value"] is None
    assert "value not kept" in withheld["reason"] and "s3cret" not in withheld["reason"]
    assert ledger_ids(settings) == {1}
