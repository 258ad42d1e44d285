"""Benchmark: how often the lanes' tailing consumers fetch while records stream in (embedded broker).

The ledger lane's consumer gathers a second of records anyway and holds its next fetch while fetched records
are queued (``consumer_fetch_options(1.0, ...)``: ``queued.min.messages`` 1, ``fetch.queue.backoff.ms`` a
fifth of the gather); the membership lane's hands each record on at once and fetches again at once. Both
tail one partition while ``--records`` records stream in (a produce request every ten records, 5 ms apart)
and read every one in order. The figures: each consumer's fetch requests during the stream (librdkafka's
statistics) and their ratio. On a quiet machine the gathering consumer fetched 16-21x less often; at load 5,
2.9x (a slower stream leaves the immediate consumer idle between records). Without the hold the ratio is
1.0-1.15. ``planning_delay_ms``: a membership lane's planning (``TailingReader``) waiting for records
written 100 ms apart, from each record's ack to its planning (median and max, ms; 130 ms on the median when
the consumer waited librdkafka's default 500 ms at the broker, which answers a waiting fetch only when its
wait runs out; under 60 ms with ``kafka.tail_fetch_wait_ms`` 50). ``tests/integration/test_tail_reader.py``
checks the hold and that records are planned from the consumer, not these figures, which depend on how the
machine schedules the threads.

Run: ``python tests/benchmarks/bench_tail_fetches.py [--records 3000]`` (one JSON line, ``uptime``'s load
average beside the figures), or through pytest (``-m benchmark``). Nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

KINDS = (("immediate", 0.0), ("gathering", 1.0))


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def _fetches(stats: list[str]) -> int:
    return sum(b["req"].get("Fetch", 0) for b in json.loads(stats[-1])["brokers"].values())


def _tail(consumer: Any, offsets: list[int], count: int) -> None:
    deadline = time.monotonic() + 120
    while len(offsets) < count and time.monotonic() < deadline:
        offsets.extend(m.offset() for m in consumer.consume(1000, 0.1) if m.error() is None)


def stream_fetches(bootstrap: str, topic: str, count: int) -> dict[str, int]:
    """Fetch requests of each kind of consumer while ``count`` records stream into ``topic`` partition 0."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from connectors.kafka.tail_reader import consumer_fetch_options

    consumers: dict[str, tuple[Any, list[str], list[int]]] = {}
    for kind, gather_s in KINDS:
        stats: list[str] = []
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-tail-{kind}",
                "enable.auto.commit": False,
                **consumer_fetch_options(gather_s, 50),
                "statistics.interval.ms": 100,
                "stats_cb": stats.append,
            }
        )
        consumer.assign([TopicPartition(topic, 0, 0)])
        consumers[kind] = (consumer, stats, [])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1})
    try:
        for consumer, stats, _ in consumers.values():
            while not stats:
                consumer.poll(0.1)
        before = {kind: _fetches(stats) for kind, (_, stats, _) in consumers.items()}
        threads = [threading.Thread(target=_tail, args=(c, o, count)) for c, _, o in consumers.values()]
        for thread in threads:
            thread.start()
        for i in range(count):
            producer.produce(topic, b"%d" % i, partition=0)
            producer.poll(0)
            if i % 10 == 9:
                time.sleep(0.005)
        producer.flush(30)
        for thread in threads:
            thread.join()
        time.sleep(0.3)  # one more statistics interval: the counts up to the last record
        made = {}
        for kind, (consumer, stats, offsets) in consumers.items():
            if offsets != list(range(count)):
                raise AssertionError(f"{kind} read {len(offsets)} of {count} records")
            consumer.poll(0.2)
            made[kind] = _fetches(stats) - before[kind]
        return made
    finally:
        for consumer, _, _ in consumers.values():
            consumer.close()


def planning_delays_ms(settings: Any, topic: str) -> dict[str, float]:
    """Median and max of ack-to-planning delays of records written one by one to a waiting planning."""
    import statistics

    from connectors.kafka.planner import KafkaPlanner
    from connectors.kafka.publisher import MEMBERSHIP_PARTITION_KEY, partition_for_key
    from connectors.kafka.tail_reader import TailingReader
    from tests.integration.test_tail_reader import _batch, write_while_planning

    options = {
        "kafka.bootstrap.servers": settings.bootstrap_servers,
        "subscribe": topic,
        "bkaudit.partitionofkey": MEMBERSHIP_PARTITION_KEY.decode(),
        "bkaudit.skipkeyprefixes": "ledger/",
    }
    tail = TailingReader(KafkaPlanner(options), wait_s=2.0, verify_every_s=600)
    try:
        end, _ = _batch(tail, tail.initialOffset())
        partition = partition_for_key(MEMBERSHIP_PARTITION_KEY, 4)
        written = write_while_planning(settings, topic, partition, tail, end, count=24)
    finally:
        tail.stop()
    delays = [(at - sent) * 1000 for _, sent, at in written]
    return {"median": round(statistics.median(delays), 1), "max": round(max(delays), 1)}


def run(records: int) -> dict[str, Any]:
    from connectors.kafka.embedded import EmbeddedBroker
    from connectors.kafka.topics import ensure_topic
    from core.settings import KafkaSettings

    broker = EmbeddedBroker(Path(tempfile.mkdtemp(prefix="bkaudit-bench-tail-")) / "broker")
    broker.start()
    figures: dict[str, Any] = {"records": records, "uptime_at_start": _uptime()}
    try:
        settings = KafkaSettings(bootstrap_servers=broker.bootstrap)
        topic = f"bench.tail.fetches.{time.time_ns()}"
        ensure_topic(settings, topic, partitions=1)
        made = stream_fetches(broker.bootstrap, topic, records)
        membership = f"bench.tail.membership.{time.time_ns()}"
        ensure_topic(settings, membership, partitions=4)
        figures["planning_delay_ms"] = planning_delays_ms(settings, membership)
    finally:
        broker.stop()
    figures["fetches"] = made
    figures["immediate_per_gathering"] = round(made["immediate"] / max(1, made["gathering"]), 2)
    figures["uptime_at_end"] = _uptime()
    return figures


@pytest.mark.benchmark
def test_tail_fetch_figures():
    print(json.dumps(run(3000)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=3000, help="records streamed into the partition")
    args = parser.parse_args()
    print(json.dumps(run(args.records)))
