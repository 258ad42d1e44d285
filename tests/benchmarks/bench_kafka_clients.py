"""Benchmark: the two Python Kafka clients side by side, in one run, against the embedded broker.

Why bkaudit moved from kafka-python to confluent-kafka (librdkafka): a lost bookie at 1 M ledgers on 100
bookies has ~31,000 alerts to publish, and the job's source reads the changes topic record by record. Both
clients run here with bkaudit's producer settings (acks=all, 256 KiB batches, no linger, one request in
flight per connection), the same pre-encoded records and explicit partitions (Java's murmur2):

- ``produce``: ``--records`` records of ``--record-bytes`` bytes sent and every one acknowledged, per round
  (seconds; p50, min and max over ``--rounds``), each round into a fresh topic of ``--partitions``.
- ``sink_send_records_s`` (librdkafka only): the same records through the sink's own send loop
  (``connectors.kafka.tail_sender.send_records``, one-record tails per partition included).
- ``consume``: ``--consume`` records read back from the beginning by one consumer assigned every partition
  (records/s; p50 over the rounds).

kafka-python is no longer a bkaudit dependency: its half runs only when it is installed (``"kafka_python":
null`` otherwise). The run ends with one JSON line, ``uptime``'s load average beside the figures.

Run: ``python tests/benchmarks/bench_kafka_clients.py [--records 31000] [--consume 100000] [--rounds 3]``,
or through pytest (``-m benchmark``) at a small count. Nothing else should run meanwhile.

Example:
    >>> _summary([3.0, 1.0, 2.0])
    {'n': 3, 'p50': 2.0, 'min': 1.0, 'max': 3.0}
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.bench_floors import _summary

#: (partition, key, value)
Placed = tuple[int, bytes, bytes]

BATCH_BYTES = 262_144


def _records(count: int, size: int, partitions: int) -> list[Placed]:
    """``count`` alert-keyed records of exactly ``size`` bytes, placed by Java's murmur2."""
    from connectors.kafka.publisher import partitions_for_keys

    keys = [b"bench-cluster/ledger/%d" % (10_000_000 + i) for i in range(count)]
    values = [
        (b'{"alert_id":"%032x","kind":"LEDGER_UNDER_REPLICATED"' % i).ljust(size, b" ") for i in range(count)
    ]
    placed = partitions_for_keys(keys, partitions)
    return list(zip(placed, keys, values, strict=True))


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from connectors.kafka.topics import ensure_topic
    from core.settings import KafkaSettings

    ensure_topic(KafkaSettings(bootstrap_servers=bootstrap), topic, partitions)


# ------------------------------------------------------------------------------------------- confluent


def _confluent_producer(bootstrap: str) -> Any:
    from confluent_kafka import Producer

    from connectors.kafka.client_config import producer_config
    from core.settings import KafkaSettings

    return Producer(producer_config(KafkaSettings(bootstrap_servers=bootstrap)))


def confluent_produce(bootstrap: str, topic: str, records: list[Placed]) -> float:
    """Seconds to produce ``records`` and have every one acknowledged (bkaudit's producer settings)."""
    producer = _confluent_producer(bootstrap)
    producer.list_topics(topic, timeout=30)  # metadata before the clock starts
    failed: list[Any] = []

    def report(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(error)

    started = time.perf_counter()
    for partition, key, value in records:
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=partition, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(120) == 0
    elapsed = time.perf_counter() - started
    assert not failed, failed[:3]
    return elapsed


def sink_path_produce(bootstrap: str, topic: str, records: list[Placed]) -> float:
    """The same records through the sink's own send loop (``send_records``: one-record tails included)."""
    from connectors.kafka.tail_sender import send_records
    from core.settings import KafkaSettings

    producer = _confluent_producer(bootstrap)
    producer.list_topics(topic, timeout=30)
    started = time.perf_counter()
    failed, first = send_records(
        producer, KafkaSettings(bootstrap_servers=bootstrap), [(topic, p, k, v) for p, k, v in records]
    )
    elapsed = time.perf_counter() - started
    assert not failed, first
    return elapsed


def confluent_consume(bootstrap: str, topic: str, expected: int) -> float:
    """Records/s of one librdkafka consumer reading ``topic`` from the beginning (every partition): the
    floors benchmark's consumer, so both report the same measurement."""
    from tests.benchmarks.bench_floors import consume_floor

    figures = consume_floor(bootstrap, topic, expected)
    assert figures["records"] >= expected, f"read {figures['records']} of {expected}"
    return float(figures["records"]) / max(figures["seconds"], 1e-9)


# ----------------------------------------------------------------------------------------- kafka-python


def kafka_python_available() -> bool:
    return importlib.util.find_spec("kafka") is not None


def kafka_python_produce(bootstrap: str, topic: str, records: list[Placed]) -> float:
    """The same as :func:`confluent_produce` with kafka-python (bkaudit's former producer settings)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        batch_size=BATCH_BYTES,
        linger_ms=0,
        max_in_flight_requests_per_connection=1,
        retries=2_147_483_647,
    )
    producer.partitions_for(topic)  # metadata before the clock starts
    started = time.perf_counter()
    futures = [producer.send(topic, key=key, value=value, partition=p) for p, key, value in records]
    producer.flush()
    elapsed = time.perf_counter() - started
    producer.close()
    assert not [f for f in futures if f.failed()]
    return elapsed


def kafka_python_consume(bootstrap: str, topic: str, expected: int) -> float:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    seen = 0
    started = time.perf_counter()
    deadline = started + 300
    while seen < expected and time.perf_counter() < deadline:
        for batch in consumer.poll(timeout_ms=500, max_records=10_000).values():
            seen += len(batch)
    elapsed = time.perf_counter() - started
    consumer.close()
    assert seen >= expected, f"read {seen} of {expected}"
    return seen / elapsed


# ------------------------------------------------------------------------------------------------- run


def _client_figures(
    bootstrap: str,
    produce: Callable[[str, str, list[Placed]], float],
    consume: Callable[[str, str, int], float],
    records: list[Placed],
    consume_topic: str,
    consume_count: int,
    rounds: int,
    partitions: int,
    name: str,
) -> dict[str, Any]:
    produced: list[float] = []
    for index in range(rounds):
        topic = f"bench.clients.{name}.{index}.{time.time_ns()}"
        _create_topic(bootstrap, topic, partitions)
        produced.append(produce(bootstrap, topic, records))
    rates = [consume(bootstrap, consume_topic, consume_count) for _ in range(rounds)]
    return {
        "produce_acked_s": _summary(produced),
        "consume_records_per_s": {k: round(v) if k != "n" else v for k, v in _summary(rates).items()},
    }


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())


def run(records: int, record_bytes: int, consume: int, rounds: int, partitions: int) -> dict[str, Any]:
    from connectors.kafka.embedded import EmbeddedBroker

    work = Path(tempfile.mkdtemp(prefix="bkaudit-bench-clients-"))
    broker = EmbeddedBroker(work / "broker")
    broker.start()
    figures: dict[str, Any] = {
        "records": records,
        "record_bytes": record_bytes,
        "consume_records": consume,
        "partitions": partitions,
        "rounds": rounds,
        "cpus": os.cpu_count(),
        "uptime_at_start": _uptime(),
    }
    try:
        placed = _records(records, record_bytes, partitions)
        # The consume topic: filled once (with one-record tails so every record is below the watermark).
        consume_topic = f"bench.clients.consume.{time.time_ns()}"
        _create_topic(broker.bootstrap, consume_topic, partitions)
        backlog = _records(consume, record_bytes, partitions)
        confluent_produce(broker.bootstrap, consume_topic, backlog[:-partitions])
        tails = {p: (p, f"tail/{p}".encode(), b"t" * record_bytes) for p in range(partitions)}
        for tail in tails.values():
            confluent_produce(broker.bootstrap, consume_topic, [tail])
        total = consume - partitions + len(tails)
        figures["confluent_kafka"] = _client_figures(
            broker.bootstrap,
            confluent_produce,
            confluent_consume,
            placed,
            consume_topic,
            total,
            rounds,
            partitions,
            "confluent",
        )
        sink_path = []
        for index in range(rounds):
            topic = f"bench.clients.sinkpath.{index}.{time.time_ns()}"
            _create_topic(broker.bootstrap, topic, partitions)
            sink_path.append(sink_path_produce(broker.bootstrap, topic, placed))
        figures["confluent_kafka"]["sink_send_records_s"] = _summary(sink_path)
        figures["kafka_python"] = (
            _client_figures(
                broker.bootstrap,
                kafka_python_produce,
                kafka_python_consume,
                placed,
                consume_topic,
                total,
                rounds,
                partitions,
                "kafkapython",
            )
            if kafka_python_available()
            else None
        )
    finally:
        broker.stop()
    if figures["kafka_python"]:
        ours, theirs = figures["confluent_kafka"], figures["kafka_python"]
        figures["produce_speedup_p50"] = round(
            theirs["produce_acked_s"]["p50"] / ours["produce_acked_s"]["p50"], 1
        )
        figures["consume_speedup_p50"] = round(
            ours["consume_records_per_s"]["p50"] / theirs["consume_records_per_s"]["p50"], 1
        )
    figures["uptime_at_end"] = _uptime()
    return figures


@pytest.mark.benchmark
def test_client_figures():
    print(json.dumps(run(records=2000, record_bytes=328, consume=5000, rounds=1, partitions=8)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=31_000, help="records produced and acked per round")
    parser.add_argument("--record-bytes", type=int, default=328, help="bytes per record value")
    parser.add_argument("--consume", type=int, default=100_000, help="records read back per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args()
    print(json.dumps(run(args.records, args.record_bytes, args.consume, args.rounds, args.partitions)))
