"""The broker loses its data under a checkpointed job: the job must never skip the new topic's events.

``ServiceHarness.stop_broker(lose_data=True)`` + ``start_broker`` is a real data loss (Tansu loses everything
at a restart; a real Kafka broker's data directory is deleted while it is down): the changes topic comes back
empty (recreated by the next client, with the broker's default partition count unless someone creates it
first). The job's checkpoint still holds offsets of the old topic. Two ways it used to go wrong, both checked
here on the real broker, Spark and Delta:

- the recreated topic grew past the checkpoint's offsets: the job started cleanly and skipped the first
  records of each old partition (the watcher's fresh snapshot, a bookie loss): alerts were missing;
- the recreated topic is shorter than the checkpoint: the job failed at every start (a crash loop under
  systemd).

Either way the source must notice that the topic is not the one it read (fingerprints of the last records
read, partitions gone, ends below our position) and read the new topic from its beginning.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from bkaudit.testing.kafka_io import produce
from connectors.delta.tables import read_table
from connectors.kafka.planner import META, KafkaOffsets, KafkaPlanner, KafkaRange, read_range
from connectors.kafka.topics import ensure_topic
from core.settings import Settings
from streaming import job
from tests.integration.event_fixtures import Watcher, alerts_on

pytestmark = [pytest.mark.integration, pytest.mark.chaos]  # also part of `pytest -m chaos`

BOOKIES = [f"10.0.2.{i}:3181" for i in range(1, 7)]
RACKS = {b: f"/rack{i % 3}" for i, b in enumerate(BOOKIES)}
LOST = BOOKIES[0]


class Clock:
    """Event time for the fake watchers: +10 ms per event, jumped forward between phases."""

    def __init__(self, start_ms: int) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        self.now_ms += 10
        return self.now_ms


def ring(first: int) -> list[str]:
    return [BOOKIES[(first + k) % len(BOOKIES)] for k in range(3)]


def job_settings(kafka_settings, tmp_path: Path) -> Settings:
    kafka = kafka_settings.model_copy(update={"topic_partitions": 2})
    return Settings(
        kafka=kafka,
        lakehouse_root=tmp_path / "lh",
        checkpoint_root=tmp_path / "cp",
        stream={"watermark_delay_s": 0.5, "default_recovery_delay_s": 0},
    )


def run_once(spark, settings: Settings):
    query, sink = job.start(spark, settings, available_now=True)
    try:
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
    finally:
        sink.close()
    return sink


def publish_cluster(watcher: Watcher, ledgers: range, at_ms: int, partitions: int) -> None:
    """A full snapshot's worth of a healthy cluster: rack map, bookies, ledgers, then a heartbeat."""
    watcher.rack_map(RACKS)
    for bookie in BOOKIES:
        watcher.bookie(bookie, "WRITABLE")
    for ledger_id in ledgers:
        watcher.ledger(ledger_id, ring(ledger_id))
    watcher.heartbeat(at_ms, partitions)
    watcher.flush()


def checkpointed_positions(settings: Settings) -> dict[str, dict[str, int]]:
    """The changes topic's offsets in the ledger lane's newest offset log entry."""
    offsets = Path(settings.checkpoint_root) / settings.stream.app_id / "ledger-lane" / "offsets"
    newest = max(offsets.iterdir(), key=lambda p: int(p.stem) if p.stem.isdigit() else -1)
    source = json.loads(newest.read_text())["end"]
    return {k: v for k, v in source.items() if k == settings.kafka.changes_topic}


def lose_the_broker(bk_services) -> None:
    bk_services.stop_broker(lose_data=True)
    bk_services.start_broker()


def firing(kafka) -> set[tuple[str, object]]:
    try:
        alerts = alerts_on(kafka)
    except (ValueError, TypeError):  # the alerts topic is not there (yet) after the loss
        return set()
    return {(a["kind"], a["ledger_id"] or a["bookies"][0]) for _, a in alerts if a["state"] == "firing"}


def expected_loss(ledgers: range) -> set[tuple[str, object]]:
    return {("BOOKIE_LOST", LOST)} | {("LEDGER_UNDER_REPLICATED", i) for i in ledgers if LOST in ring(i)}


def publish_before_the_loss(kafka: Any, ledgers: range) -> tuple[Clock, int, int]:
    """A 2-partition changes topic holding a cluster of ``ledgers``: (clock, t0, the watcher's last mzxid)."""
    ensure_topic(kafka, kafka.changes_topic, partitions=2)
    t0 = int(time.time() * 1000) - 600_000
    clock = Clock(t0)
    before = Watcher(kafka, clock)
    publish_cluster(before, ledgers, t0 + 100_000, partitions=2)
    before.close()
    return clock, t0, before.mzxid


def test_recreated_topic_grown_past_the_checkpoint_is_read_from_its_start(
    spark, bk_services, kafka_settings, tmp_path
):
    settings = job_settings(kafka_settings, tmp_path)
    kafka = settings.kafka
    clock, t0, mzxid = publish_before_the_loss(kafka, range(1, 9))
    run_once(spark, settings)
    positions = checkpointed_positions(settings)[kafka.changes_topic]
    assert min(positions.values()) > 0, positions

    lose_the_broker(bk_services)
    # The topic comes back with 4 partitions (as the broker's default would make it), the watcher's new
    # snapshot first, then a bookie loss, then enough heartbeats to grow every old partition past the
    # checkpoint's offsets.
    ensure_topic(kafka, kafka.changes_topic, partitions=4)
    clock.now_ms = t0 + 200_000
    after = Watcher(kafka, clock)
    after.mzxid = mzxid
    ledgers = range(1, 13)
    publish_cluster(after, ledgers, t0 + 200_000, partitions=4)
    after.bookie(LOST, "GONE")
    for step in range(max(positions.values()) + 2):
        after.heartbeat(t0 + 300_000 + step, partitions=4)
    after.close()

    run_once(spark, settings)
    assert firing(kafka) == expected_loss(ledgers)
    bookies = {r["bookie_id"]: r for r in read_table(settings.lakehouse_root, "bookies").to_pylist()}
    assert bookies[LOST]["lost"] is True
    ledger_ids = {r["ledger_id"] for r in read_table(settings.lakehouse_root, "ledgers").to_pylist()}
    assert ledger_ids == set(ledgers)


def test_recreated_topic_shorter_than_the_checkpoint_is_read_from_its_start(
    spark, bk_services, kafka_settings, tmp_path
):
    settings = job_settings(kafka_settings, tmp_path)
    kafka = settings.kafka
    clock, t0, mzxid = publish_before_the_loss(kafka, range(1, 31))
    run_once(spark, settings)
    positions = checkpointed_positions(settings)[kafka.changes_topic]

    lose_the_broker(bk_services)
    ensure_topic(kafka, kafka.changes_topic, partitions=2)
    clock.now_ms = t0 + 200_000
    after = Watcher(kafka, clock)
    after.mzxid = mzxid
    after.bookie(LOST, "GONE")
    after.heartbeat(t0 + 300_000, partitions=2)
    after.close()

    run_once(spark, settings)  # used to fail: "ends at 1, before our position ..."
    new_positions = checkpointed_positions(settings)[kafka.changes_topic]
    assert all(new_positions[p] < positions[p] for p in positions), (positions, new_positions)
    # The ledgers were known before the loss; the bookie loss in the new topic fans out to them.
    assert firing(kafka) == expected_loss(range(1, 31))


def test_a_running_job_reads_the_recreated_topic_after_the_broker_lost_its_data(
    spark, bk_services, kafka_settings, tmp_path
):
    """The same loss under a running job: its planning waits out the restart (back-off), keeps its
    positions while the topic is absent, then finds the recreated topic and reads it from its start. The
    driver-run lane's tailing consumer must not start at positions the planning kept for an absent topic:
    it read the recreated topic from the middle once it grew past them (ledger 11 never arrived)."""
    settings = job_settings(kafka_settings, tmp_path)
    kafka = settings.kafka
    clock, t0, mzxid = publish_before_the_loss(kafka, range(1, 9))
    query, sink = job.start(spark, settings)
    try:
        deadline = time.monotonic() + 240
        while len(read_table_rows(settings, "ledgers")) < 8:
            assert time.monotonic() < deadline, "the first batch did not come"
            time.sleep(0.5)
        positions = checkpointed_positions(settings)[kafka.changes_topic]

        lose_the_broker(bk_services)
        time.sleep(3)  # the job plans against the empty broker for a while
        ensure_topic(kafka, kafka.changes_topic, partitions=4)
        clock.now_ms = t0 + 200_000
        after = Watcher(kafka, clock)
        after.mzxid = mzxid
        ledgers = range(1, 13)
        publish_cluster(after, ledgers, t0 + 200_000, partitions=4)
        after.bookie(LOST, "GONE")
        for step in range(max(positions.values()) + 2):
            after.heartbeat(t0 + 300_000 + step, partitions=4)
        after.close()

        deadline = time.monotonic() + 300
        while firing(kafka) != expected_loss(ledgers):
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, firing(kafka)
            time.sleep(1)
        resets = sink.metrics.registry.get_sample_value(
            "bkaudit_stream_source_resets_total", {"topic": kafka.changes_topic}
        )
        assert resets is not None and resets >= 1
    finally:
        job.stop_gracefully(query, sink)
        sink.close()


def read_table_rows(settings: Settings, name: str) -> list[dict]:
    try:
        return read_table(settings.lakehouse_root, name).to_pylist()
    except Exception:  # not created yet
        return []


def test_a_topic_recreated_wider_is_read_from_its_start_even_where_its_ends_match_our_positions(
    bk_services, kafka_settings
):
    """The broker lost its data and the topic came back with more partitions, its old partitions exactly as
    long as our positions: the planning must not take the new partitions for added ones and read them
    alone (it did while the old partitions' fingerprints counted as verified in this process)."""
    topic = "t.recreated-wider"
    ensure_topic(kafka_settings, topic, partitions=2)
    produce(kafka_settings, topic, [(b"k", b"old-%d" % i, i % 2) for i in range(6)])
    reader = KafkaPlanner({"kafka.bootstrap.servers": kafka_settings.bootstrap_servers, "subscribe": topic})
    limit = reader.getDefaultReadLimit()
    try:
        read = reader.latestOffset(reader.initialOffset(), limit)
        assert reader.latestOffset(read, limit) is read  # its last records verified, nothing new
        lose_the_broker(bk_services)
        ensure_topic(kafka_settings, topic, partitions=4)
        produce(kafka_settings, topic, [(b"k", b"new-%d" % i, i % 4) for i in range(12)])
        planned = reader.latestOffset(read, limit)
        assert planned[META].get("begin", {}).get(topic) == {str(p): 0 for p in range(4)}, planned
        assert {p: planned[topic][p] for p in planned[topic]} == {str(p): 3 for p in range(4)}
    finally:
        reader.stop()


def test_a_fingerprint_past_the_end_of_a_recreated_topic_is_no_record_not_a_broker_outage(
    bk_services, kafka_settings
):
    """The planner read the old topic's ends, then the broker came back without its data: the record it
    fingerprints is not there, and the partition now ends before it, so the answer is "no record" at once.
    It used to wait for that record through the request timeout and its retries (over a minute after a
    broker's data loss), taking the empty broker for an outage."""
    topic = "t.fingerprint-past-end"
    ensure_topic(kafka_settings, topic, partitions=1)
    produce(kafka_settings, topic, [(b"k", b"old-%d" % i, 0) for i in range(8)])
    lose_the_broker(bk_services)
    ensure_topic(kafka_settings, topic, partitions=1)
    produce(kafka_settings, topic, [(b"k", b"new-%d" % i, 0) for i in range(3)])
    offsets = KafkaOffsets(
        {
            "kafka.bootstrap.servers": kafka_settings.bootstrap_servers,
            "kafka.request.timeout.ms": "20000",
            "bkaudit.brokeroutagelimits": "1",  # an outage fails this lookup: no retries hide it
        }
    )
    try:
        assert offsets.fingerprints({(topic, "0"): 7}) == {(topic, "0"): None}
        present = offsets.fingerprints({(topic, "0"): 2})[(topic, "0")]
        assert present is not None and present.startswith("2:")
    finally:
        offsets.close()


def test_ends_read_before_a_data_loss_are_planned_again_not_read_from_the_new_topic(
    bk_services, kafka_settings
):
    """The broker loses its data between the planning's read of the ends and its fingerprints of them: the
    ends belong to the old topic. Planning by them read the new topic from the middle up to offsets it
    did not have, and kept no fingerprint to notice it; the planning now starts again from fresh ends and
    reads the new topic from its beginning."""
    topic = "t.ends-vanished"
    ensure_topic(kafka_settings, topic, partitions=1)
    produce(kafka_settings, topic, [(b"k", b"old-%d" % i, 0) for i in range(8)])
    reader = KafkaPlanner(
        {
            "kafka.bootstrap.servers": kafka_settings.bootstrap_servers,
            "subscribe": topic,
            "bkaudit.brokeroutagelimits": "60",  # a planning stuck on the vanished ends fails in a minute
        }
    )
    limit = reader.getDefaultReadLimit()
    try:
        read = reader.latestOffset(reader.initialOffset(), limit)
        assert read[topic] == {"0": 8}
        produce(kafka_settings, topic, [(b"k", b"old-%d" % i, 0) for i in range(8, 12)])
        stale = reader._offsets.latest([topic])  # the ends, read just before the broker loses its data
        assert stale[topic] == {"0": 12}
        lose_the_broker(bk_services)
        ensure_topic(kafka_settings, topic, partitions=1)
        produce(kafka_settings, topic, [(b"k", b"new-%d" % i, 0) for i in range(3)])
        fresh_latest, served = reader._offsets.latest, iter([stale])
        reader._offsets.latest = lambda topics: next(served, None) or fresh_latest(topics)
        planned = reader.latestOffset(read, limit)
        assert planned[topic] == {"0": 3}, planned
        assert planned[META].get("begin", {}).get(topic) == {"0": 0}, planned
        assert planned[META]["fingerprints"][topic]["0"].startswith("2:")
    finally:
        reader.stop()


def test_a_fingerprint_in_a_partition_the_key_left_is_no_record_for_a_key_filtered_reader(
    bk_services, kafka_settings
):
    """The membership lane plans only the partition of its key. The broker came back without its data and
    the topic with another partition count, where the key maps elsewhere: the partition it read is shorter
    now, and the answer is "no record" at once. Looking up only the key's new partition, it waited for
    that record through every retry (two minutes in the chaos test)."""
    topic = "t.key-moved"
    key = "k0"  # murmur2: partition 1 of 4, partition 2 of 3
    ensure_topic(kafka_settings, topic, partitions=4)
    produce(kafka_settings, topic, [(key.encode(), b"old-%d" % i, 1) for i in range(8)])
    lose_the_broker(bk_services)
    ensure_topic(kafka_settings, topic, partitions=3)
    produce(kafka_settings, topic, [(key.encode(), b"new-%d" % i, i % 3) for i in range(6)])
    offsets = KafkaOffsets(
        {
            "kafka.bootstrap.servers": kafka_settings.bootstrap_servers,
            "kafka.request.timeout.ms": "20000",
            "bkaudit.brokeroutagelimits": "1",  # an outage fails this lookup: no retries hide it
            "bkaudit.partitionofkey": key,
        }
    )
    try:
        assert offsets.latest([topic]) == {topic: {"2": 2}}  # the key's partition now
        assert offsets.fingerprints({(topic, "1"): 7}) == {(topic, "1"): None}
    finally:
        offsets.close()


def test_a_range_whose_records_were_lost_while_a_task_read_it_ends_at_once(bk_services, kafka_settings):
    """A batch was planned on the old topic, then the broker came back without its data while the task read
    the range. The embedded broker answers a fetch past the new topic's end with no records (not
    OFFSET_OUT_OF_RANGE), so the task waited, silently, until the new topic grew past the planned end: 50 s
    in the chaos test. It now sees the partition ends before the range and stops at once; the next
    planning finds the fingerprint changed and reads the new topic from its beginning."""
    topic = "t.range-lost"
    ensure_topic(kafka_settings, topic, partitions=1)
    produce(kafka_settings, topic, [(b"k", b"old-%d" % i, 0) for i in range(8)])
    lose_the_broker(bk_services)
    ensure_topic(kafka_settings, topic, partitions=1)
    produce(kafka_settings, topic, [(b"k", b"new-%d" % i, 0) for i in range(3)])
    options = {"kafka.bootstrap.servers": kafka_settings.bootstrap_servers}
    started = time.monotonic()
    batches = list(read_range(options, KafkaRange(topic, 0, 5, 8, outage_limit_s=60.0)))
    assert time.monotonic() - started < 15
    assert sum(b.num_rows for b in batches) == 0
