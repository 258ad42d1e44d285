"""The membership lane's tailing planner against a real broker: records planned from the consumer and read
from memory, the same offsets and fingerprints as the full planning, and the full planning whenever the
consumer cannot be trusted (its offsets gone, ``availableNow``, a replayed range)."""

from __future__ import annotations

import json
import time
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from bkaudit.testing.kafka_io import produce
from connectors.kafka.client_config import consumer_config, producer_config
from connectors.kafka.planner import META, KafkaPlanner
from connectors.kafka.publisher import MEMBERSHIP_PARTITION_KEY, partition_for_key
from connectors.kafka.tail_reader import TailingReader, consumer_fetch_options
from connectors.kafka.topics import ensure_topic

pytestmark = pytest.mark.integration

PARTITIONS = 4
CLUSTER = MEMBERSHIP_PARTITION_KEY


def _source(kafka_settings: Any, topic: str) -> KafkaPlanner:
    return KafkaPlanner(
        {
            "kafka.bootstrap.servers": kafka_settings.bootstrap_servers,
            "subscribe": topic,
            "bkaudit.partitionofkey": CLUSTER.decode(),
            "bkaudit.skipkeyprefixes": "ledger/",
        }
    )


def _values(reader: Any, start: dict, end: dict) -> list[bytes]:
    return [
        row["value"]
        for part in reader.partitions(start, end)
        for batch in reader.read(part)
        for row in pa.Table.from_batches([batch]).to_pylist()
    ]


def _batch(reader: Any, start: dict) -> tuple[dict, list[bytes]]:
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    return end, _values(reader, start, end)


@pytest.fixture
def topic(kafka_settings: Any, request: pytest.FixtureRequest) -> tuple[str, int]:
    name = f"t.tail-{request.node.name[-40:]}"
    ensure_topic(kafka_settings, name, partitions=PARTITIONS)
    return name, partition_for_key(CLUSTER, PARTITIONS)


def test_new_records_are_planned_from_the_consumer_as_the_full_planning_would(kafka_settings, topic) -> None:
    name, mine = topic
    produce(kafka_settings, name, [(CLUSTER, b"registered", mine)])
    tail = TailingReader(_source(kafka_settings, name), wait_s=2.0, verify_every_s=600)
    full = _source(kafka_settings, name)
    try:
        start = tail.initialOffset()
        first, values = _batch(tail, start)
        assert values == [b"registered"] and tail.full_plannings == 1
        # The skipped record first: the planning ends at the kept one, whichever fetch brings each.
        produce(kafka_settings, name, [(b"ledger/7", b"skipped", mine), (CLUSTER, b"lost", mine)])
        second, values = _batch(tail, first)
        assert tail.tail_plannings == 1 and tail.full_plannings == 1
        assert values == [b"lost"]  # the ledger record is read past, as by the source
        planned_in_full = full.latestOffset(first, full.getDefaultReadLimit())
        assert second[name] == planned_in_full[name] == {str(mine): 3}
        assert second[META]["fingerprints"] == planned_in_full[META]["fingerprints"]
        assert tail.latestOffset(second, tail.getDefaultReadLimit()) is second  # nothing new
    finally:
        tail.stop()
        full.stop()


def test_records_the_batch_skips_are_gathered_until_one_it_keeps_arrives(kafka_settings, topic) -> None:
    """Ledger records on the membership partition make no batch of their own: the planning keeps taking
    them and ends the batch as soon as a membership record arrives (not when the gathering runs out)."""
    import threading

    name, mine = topic
    tail = TailingReader(_source(kafka_settings, name), wait_s=2.0, verify_every_s=600, skipped_gather_s=60)
    try:
        first, _ = _batch(tail, tail.initialOffset())
        produce(kafka_settings, name, [(b"ledger/%d" % i, b"skipped", mine) for i in range(3)])
        later = threading.Timer(1.0, produce, (kafka_settings, name, [(CLUSTER, b"lost", mine)]))
        started = time.monotonic()
        later.start()
        second, values = _batch(tail, first)
        later.join()
        assert values == [b"lost"] and second[name] == {str(mine): 4}
        assert tail.tail_plannings == 1 and time.monotonic() - started < 30  # not the 60 s gathering
    finally:
        tail.stop()


def test_skipped_records_alone_end_a_batch_when_the_gathering_runs_out(kafka_settings, topic) -> None:
    import threading

    name, mine = topic
    tail = TailingReader(_source(kafka_settings, name), wait_s=2.0, verify_every_s=600, skipped_gather_s=6.0)
    try:
        first, _ = _batch(tail, tail.initialOffset())
        produce(kafka_settings, name, [(b"ledger/1", b"skipped", mine)])
        later = threading.Timer(0.5, produce, (kafka_settings, name, [(b"ledger/2", b"skipped", mine)]))
        later.start()
        second, values = _batch(tail, first)
        later.join()
        assert values == [] and second[name] == {str(mine): 2}  # one batch for both
        assert tail.tail_plannings == 1
    finally:
        tail.stop()


def test_records_reach_a_waiting_planning_from_the_consumer(kafka_settings, topic) -> None:
    """Records written one by one while a planning waits are each planned from the tailing consumer, in
    order, with no full planning. How soon each arrives (the embedded broker answers a waiting fetch when
    its wait runs out, so the consumer waits ``kafka.tail_fetch_wait_ms``, 50 ms, not librdkafka's 500 ms)
    is a figure of ``tests/benchmarks/bench_tail_fetches.py`` (``planning_delay_ms``)."""
    name, mine = topic
    tail = TailingReader(_source(kafka_settings, name), wait_s=2.0, verify_every_s=600)
    try:
        end, _ = _batch(tail, tail.initialOffset())
        values = write_while_planning(kafka_settings, name, mine, tail, end, count=12)
        assert [value for value, _, _ in values] == [b"r%d" % i for i in range(12)]
        assert tail.full_plannings == 1 and tail.tail_plannings >= 1  # answered from the consumer
    finally:
        tail.stop()


def write_while_planning(
    kafka_settings: Any, name: str, partition: int, tail: Any, end: dict, count: int
) -> list[tuple[bytes, float, float]]:
    """Write ``count`` records 100 ms apart while ``tail`` plans batches from ``end``: each record's value,
    the ``time.monotonic()`` of its ack and of its planning."""
    import threading

    acked: list[float] = []
    seen: list[tuple[bytes, float]] = []

    def write() -> None:
        for i in range(count):
            time.sleep(0.1)
            produce(kafka_settings, name, [(CLUSTER, b"r%d" % i, partition)])
            acked.append(time.monotonic())

    writer = threading.Thread(target=write)
    writer.start()
    deadline = time.monotonic() + 120
    while len(seen) < count and time.monotonic() < deadline:
        end, values = _batch(tail, end)
        seen.extend((value, time.monotonic()) for value in values)
    writer.join()
    return [(value, sent, at) for (value, at), sent in zip(seen, acked, strict=True)]


def test_a_range_the_consumer_did_not_plan_is_read_from_the_broker(kafka_settings, topic) -> None:
    name, mine = topic
    produce(kafka_settings, name, [(CLUSTER, f"r{i}".encode(), mine) for i in range(3)])
    tail = TailingReader(_source(kafka_settings, name), wait_s=2.0, verify_every_s=600)
    try:
        replayed = {name: {str(mine): 1}}
        assert _values(tail, replayed, {name: {str(mine): 3}}) == [b"r1", b"r2"]
    finally:
        tail.stop()


def test_the_full_planning_runs_again_when_its_time_comes(kafka_settings, topic) -> None:
    name, mine = topic
    tail = TailingReader(_source(kafka_settings, name), wait_s=0.2, verify_every_s=0.0)
    try:
        start = tail.initialOffset()
        end, _ = _batch(tail, start)
        produce(kafka_settings, name, [(CLUSTER, b"x", mine)])
        _, values = _batch(tail, end)
        assert values == [b"x"] and tail.tail_plannings == 0 and tail.full_plannings == 2
    finally:
        tail.stop()


def test_a_due_full_planning_waits_while_the_consumer_holds_records(kafka_settings, topic) -> None:
    """The reader's schedule runs on a stepped clock, and the record is known to be in the consumer's
    queue (its last fetch saw it) before the due planning: the verdict does not depend on how soon the
    machine runs the consumer's fetch or the test's next line."""
    name, mine = topic
    clock = SteppedClock()
    tail = TailingReader(_source(kafka_settings, name), wait_s=0.2, verify_every_s=1.0, clock=clock)
    try:
        end, _ = _batch(tail, tail.initialOffset())
        assert _batch(tail, end)[1] == []  # a tail planning: the consumer is at the end now
        clock.now += 1.5  # the full planning is due (and not yet three intervals late)
        produce(kafka_settings, name, [(CLUSTER, b"lost", mine)])
        _wait_until_fetched(tail, name, mine, end[name][str(mine)] + 1)
        after, values = _batch(tail, end)
        assert values == [b"lost"] and (tail.full_plannings, tail.tail_plannings) == (1, 2)
        _batch(tail, after)  # nothing held: the due full planning runs
        assert tail.full_plannings == 2
    finally:
        tail.stop()


class SteppedClock:
    """A clock that moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _wait_until_fetched(tail: Any, topic: str, partition: int, high: int, timeout_s: float = 30.0) -> None:
    """Until the tailing consumer's last fetch answered a high watermark of ``high`` or more: the records
    below it are in its queue then (librdkafka caches the watermark of each fetch response)."""
    deadline = time.monotonic() + timeout_s
    where = TopicPartition(topic, partition)
    while tail._consumer.get_watermark_offsets(where, cached=True)[1] < high:
        assert time.monotonic() < deadline, f"no fetch up to offset {high} in {timeout_s} s"
        time.sleep(0.02)


def test_available_now_plans_in_full(kafka_settings, topic) -> None:
    name, mine = topic
    produce(kafka_settings, name, [(CLUSTER, b"a", mine)])
    tail = TailingReader(_source(kafka_settings, name), wait_s=0.2, verify_every_s=600)
    try:
        tail.prepareForTriggerAvailableNow()
        end, values = _batch(tail, tail.initialOffset())
        produce(kafka_settings, name, [(CLUSTER, b"after the target", mine)])
        assert values == [b"a"] and tail.latestOffset(end, tail.getDefaultReadLimit()) == end
        assert tail.tail_plannings == 0
    finally:
        tail.stop()


def test_a_partition_ending_before_the_consumer_sends_it_to_the_full_planning(kafka_settings, topic) -> None:
    """The consumer sits past the partition's end (as after the topic was recreated shorter): the tail sees
    it in its last fetch and hands over to the full planning, which reads the topic again from its start."""
    name, mine = topic
    produce(kafka_settings, name, [(CLUSTER, b"a", mine)])
    tail = TailingReader(_source(kafka_settings, name), wait_s=1.0, verify_every_s=600)
    try:
        end, _ = _batch(tail, tail.initialOffset())
        beyond = {name: {str(mine): 50}, META: end[META]}
        tail._follow({(name, mine): 50})  # the consumer where the checkpoint says we are
        replanned, values = _batch(tail, beyond)
        assert tail.full_plannings == 2 and tail.tail_plannings == 0
        assert replanned[META]["begin"] == {name: {str(mine): 0}} and values == [b"a"]
    finally:
        tail.stop()


def test_every_partition_of_every_topic_is_tailed_as_the_full_planning_would(kafka_settings, topic) -> None:
    """The driver-run ledger lane tails every partition of two topics: a planning from the consumer gives
    the full planning's ends and fingerprints, and gathers records for ``gather_s``."""
    name, _ = topic
    other = f"{name}-2"
    ensure_topic(kafka_settings, other, partitions=2)
    options = {"kafka.bootstrap.servers": kafka_settings.bootstrap_servers, "subscribe": f"{name},{other}"}
    produce(kafka_settings, name, [(b"ledger/1", b"a", 0), (b"ledger/2", b"b", 2)])
    tail = TailingReader(KafkaPlanner(options), wait_s=2.0, verify_every_s=600, gather_s=0.5)
    full = KafkaPlanner(options)
    try:
        first, values = _batch(tail, tail.initialOffset())
        assert sorted(values) == [b"a", b"b"] and tail.full_plannings == 1
        produce(
            kafka_settings, name, [(b"ledger/3", b"c", 1), (b"ledger/4", b"d", 2), (b"ledger/5", b"e", 3)]
        )
        produce(kafka_settings, other, [(b"ledger/6", b"f", 1)])
        second, values = _batch(tail, first)
        assert tail.tail_plannings == 1 and tail.full_plannings == 1
        assert sorted(values) == [b"c", b"d", b"e", b"f"]  # gathered into one batch
        planned_in_full = full.latestOffset(first, full.getDefaultReadLimit())
        assert second[name] == planned_in_full[name] == {"0": 1, "1": 1, "2": 2, "3": 1}
        assert second[other] == planned_in_full[other] == {"0": 0, "1": 1}
        assert second[META]["fingerprints"] == planned_in_full[META]["fingerprints"]
    finally:
        tail.stop()
        full.stop()


def test_a_position_past_the_brokers_lagging_end_offset_is_not_taken_for_a_truncation(
    kafka_settings, topic
) -> None:
    """After a multi-record batch the embedded broker's ListOffsets answers the batch's first offset + 1,
    while its fetches serve the whole batch: a tailing consumer's position is then past the "end". The full
    planning took that for a truncated partition and read the whole topic again (seen in the 2,000
    changes/s pipeline benchmark); it now checks the record before our position and goes on."""
    name, _ = topic
    options = {"kafka.bootstrap.servers": kafka_settings.bootstrap_servers, "subscribe": name}
    tail = TailingReader(KafkaPlanner(options), wait_s=2.0, verify_every_s=600, gather_s=0.5)
    full = KafkaPlanner(options)
    try:
        first, _ = _batch(tail, tail.initialOffset())
        produce(kafka_settings, name, [(b"k", b"v%d" % i, 0) for i in range(10)], one_record_batches=False)
        second, values = _batch(tail, first)
        assert second[name]["0"] == 10 and len(values) == 10
        if full._offsets.latest([name])[name]["0"] >= 10:
            pytest.skip("the broker's end offset is exact (a real Kafka broker): nothing to test")
        replanned = full.latestOffset(second, full.getDefaultReadLimit())
        assert replanned is second or "begin" not in replanned.get(META, {}), replanned  # no reset
        produce(kafka_settings, name, [(b"k", b"more", 0)])
        third = full.latestOffset(second, full.getDefaultReadLimit())
        assert third[name]["0"] == 11 and "begin" not in third[META]
        assert _values(full, second, third) == [b"more"]
    finally:
        tail.stop()
        full.stop()


def test_a_gathering_consumer_holds_its_next_fetch_while_fetched_records_wait(kafka_settings, topic) -> None:
    """While records stream in, a fetch finds some every time and the consumer fetches again at once: back
    to back, and the embedded broker's fetch costs time in proportion to the partition's size. The ledger
    lane's consumer, which gathers a second of records anyway, holds its next fetch while records it
    fetched are still queued; the membership lane's, which hands each record on at once, does not.

    Both consumers fetch a first batch (three records, one produce request); each hands one on and keeps
    two queued. A fourth record follows. The immediate consumer fetches it; the gathering one makes no
    fetch for as long as its queue holds records (its statistics, timed by librdkafka's monotonic clock,
    show its received count stay at three), and fetches it once the queue is taken. The verdict does not
    depend on the machine's speed: the gathering consumer holds for as long as records wait, however long
    that is. How much fewer fetches this makes on a stream is measured by
    ``tests/benchmarks/bench_tail_fetches.py``."""
    name, _ = topic
    consumers = {kind: _StatsConsumer(kafka_settings, name, gather_s) for kind, gather_s in _KINDS}
    producer = Producer({**producer_config(kafka_settings), "linger.ms": 1000})
    try:
        for value in (b"a", b"b", b"c"):  # one produce request: one record batch, fetched whole
            producer.produce(name, value, partition=0)
        producer.flush(30)
        for consumer in consumers.values():
            assert consumer.next_value(timeout_s=30) == b"a"  # fetched; b and c stay queued
        producer.produce(name, b"d", partition=0)
        producer.flush(30)
        produced_at = time.monotonic()
        assert consumers["immediate"].drain(timeout_s=30) == [b"b", b"c", b"d"]  # fetched d meanwhile
        time.sleep(1.0)  # statistics intervals more of the gathering consumer's hold
        taken_at = time.monotonic()
        gathering = consumers["gathering"]
        assert gathering.drain(timeout_s=30) == [b"b", b"c", b"d"]  # fetched once b and c were taken
        received = gathering.received_between(produced_at, taken_at)
        assert received, "no statistics of the gathering consumer while its records waited"
        assert set(received) == {3}, f"records received while b and c were queued: {received}"
    finally:
        for consumer in consumers.values():
            consumer.close()


_KINDS = (("immediate", 0.0), ("gathering", 1.0))


class _StatsConsumer:
    """A tailing consumer of partition 0 configured as a lane's (``consumer_fetch_options``), with its
    librdkafka statistics every 100 ms."""

    def __init__(self, kafka_settings: Any, topic: str, gather_s: float) -> None:
        self.stats: list[dict[str, Any]] = []
        self.topic = topic
        self.consumer = Consumer(
            {
                **consumer_config(kafka_settings, None),
                **consumer_fetch_options(gather_s, kafka_settings.tail_fetch_wait_ms),
                "statistics.interval.ms": 100,
                "stats_cb": lambda text: self.stats.append(json.loads(text)),
            }
        )
        self.consumer.assign([TopicPartition(topic, 0, 0)])

    def next_value(self, timeout_s: float) -> bytes | None:
        """The next record's value, waiting up to ``timeout_s`` (statistics are served meanwhile)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = self.consumer.poll(0.1)
            if message is not None and message.error() is None:
                return bytes(message.value())
        return None

    def drain(self, timeout_s: float, count: int = 3) -> list[bytes | None]:
        return [self.next_value(timeout_s) for _ in range(count)]

    def received_between(self, start: float, end: float) -> list[int]:
        """Records received by fetches (``rxmsgs``) in the statistics taken between two ``time.monotonic()``
        readings (librdkafka's ``ts`` is CLOCK_MONOTONIC in microseconds, as ``time.monotonic`` on Linux)."""
        return [
            int(s["topics"][self.topic]["partitions"]["0"]["rxmsgs"])
            for s in self.stats
            if start < s["ts"] / 1e6 < end and self.topic in s["topics"]
        ]

    def close(self) -> None:
        self.consumer.close()


def test_a_partition_the_consumer_falls_behind_on_is_caught_up_by_a_full_planning(
    kafka_settings, topic
) -> None:
    """A batch that delivers less of a partition than waits there (here: a read limit of 10 records against
    3,000) sends the next planning to the full one, which reads the backlog in bulk, instead of leaving it
    to the consumer until the full planning is due (600 s here)."""
    name, _ = topic
    options = {"kafka.bootstrap.servers": kafka_settings.bootstrap_servers, "subscribe": name}
    tail = TailingReader(KafkaPlanner(options), wait_s=2.0, verify_every_s=600, max_records=10)
    try:
        first, _ = _batch(tail, tail.initialOffset())
        backlog = [f"r{i}".encode() for i in range(3000)]
        produce(kafka_settings, name, [(b"ledger/1", value, 0) for value in backlog])
        second, values = _batch(tail, first)
        assert values == backlog[:10] and (tail.full_plannings, tail.tail_plannings) == (1, 1)
        _, values = _batch(tail, second)
        assert tail.full_plannings == 2 and values == backlog[10:]
    finally:
        tail.stop()
