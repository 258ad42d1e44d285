"""Benchmark: the floors under the streaming auditor's figures on this machine, before any bkaudit logic.

What the decided stack (confluent-kafka/librdkafka, the embedded Tansu broker, PySpark with a Python data
source and ``transformWithStateInPandas``, local mode) costs by itself, so the stream benchmark's figures
can be read against what is reachable at all:

- ``publish``: N alert-sized JSON records (pre-encoded, keys and partitions computed beforehand) sent with
  librdkafka to the embedded broker and acknowledged, from 1 and from several processes (one producer each,
  partitions split between them). A lost bookie at 1 M ledgers on 100 bookies has ~31,000 alerts to publish.
- ``consume``: the same records read back by one librdkafka consumer (records/s).
  (``bench_kafka_clients.py`` compares both Python clients side by side.)
- ``spark_latency``: a micro-batch carrying one record, through bkaudit's Kafka source and (a) nothing else,
  (b) a ``transformWithStateInPandas`` operator that only counts (RocksDB state store, event-time watermark):
  seconds from the trigger to the ``foreachBatch`` function holding the rows (the DAG ran), and from the
  record's send to that moment. Each round waits for an idle query, sends one record, waits for its batch.
- ``spark_throughput``: one micro-batch of N records (``availableNow``) through the same two queries:
  records/s and seconds, against the ``processingTime`` fixed cost above.
- ``delta_merge``: the sink's upsert of a batch's changed ledger rows (a Delta MERGE by key through
  ``BatchWriter.upsert``) into a ``ledgers`` table of 1 M rows, for 1,000 and 10,000 random ledgers.

Run: ``python tests/benchmarks/bench_floors.py [--alerts 31000] [--rounds 8] [--records 100000]`` (prints
JSON), or through pytest (``-m benchmark``) at a small count. Nothing else should run meanwhile.

Example:
    >>> _summary([3.0, 1.0, 2.0])
    {'n': 3, 'p50': 2.0, 'min': 1.0, 'max': 3.0}
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _summary(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 3),
        "min": round(ordered[0], 3),
        "max": round(ordered[-1], 3),
    }


def _alert_record(index: int) -> tuple[bytes, bytes]:
    """A record shaped like a ``LEDGER_UNDER_REPLICATED`` alert (docs/alerts.md), ~420 bytes."""
    from core.domain.alerts import Alert, AlertKind

    alert = Alert.ledger(
        cluster="bench-cluster",
        kind=AlertKind.LEDGER_UNDER_REPLICATED,
        ledger_id=10_000_000 + index,
        started_at_ms=1_763_700_000_000,
        detected_at_ms=1_763_700_000_000,
        bookies=["10.4.0.8:3181"],
        pulsar_topic=f"persistent://tenant/ns/topic-{index % 1000}",
        detail={"lost_bookies": ["10.4.0.8:3181"]},
    )
    return alert.kafka_key().encode(), alert.to_bytes()


def _publisher(
    bootstrap: str, topic: str, records: list[tuple[int, bytes, bytes]], out: Any, go: Any
) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "batch.size": 262_144, "linger.ms": 5, "acks": 1})
    producer.list_topics(topic, timeout=30)  # metadata before the clock starts
    out.put("ready")
    go.wait()
    failures: list[Any] = []
    started = time.perf_counter()
    for p, k, v in records:
        while True:
            try:
                producer.produce(
                    topic, value=v, key=k, partition=p, on_delivery=lambda e, _m: e and failures.append(e)
                )
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush()
    out.put((time.perf_counter() - started, len(failures)))


def publish_floor(bootstrap: str, alerts: int, processes: int, partitions: int) -> dict[str, Any]:
    """Seconds to send and have acknowledged ``alerts`` pre-encoded records from ``processes`` producers."""
    from connectors.kafka.publisher import partitions_for_keys

    topic = f"floor.publish.{processes}.{os.getpid()}.{time.time_ns()}"
    _create_topic(bootstrap, topic, partitions)
    encoded = [_alert_record(i) for i in range(alerts)]
    placed = partitions_for_keys([k for k, _ in encoded], partitions)
    shares: list[list[tuple[int, bytes, bytes]]] = [[] for _ in range(processes)]
    for (key, value), partition in zip(encoded, placed, strict=True):
        shares[partition % processes].append((partition, key, value))  # each partition has one producer
    context = multiprocessing.get_context("spawn")
    channels = [context.Queue() for _ in range(processes)]
    go = context.Event()
    workers = [
        context.Process(target=_publisher, args=(bootstrap, topic, share, channel, go))
        for share, channel in zip(shares, channels, strict=True)
    ]
    for worker in workers:
        worker.start()
    for channel in channels:
        assert channel.get(timeout=120) == "ready"
    started = time.perf_counter()
    go.set()
    results = [channel.get(timeout=300) for channel in channels]
    wall = time.perf_counter() - started
    for worker in workers:
        worker.join(timeout=60)
    return {
        "processes": processes,
        "records": alerts,
        "bytes_per_record": round(sum(len(v) for _, v in encoded) / alerts),
        "seconds": round(wall, 3),
        "us_per_record": round(wall / alerts * 1e6, 1),
        "failed": sum(f for _, f in results),
        "topic": topic,
    }


def consume_floor(bootstrap: str, topic: str, expected: int) -> dict[str, Any]:
    """Records/s of one librdkafka consumer reading ``topic`` from the start."""
    from confluent_kafka import Consumer

    from connectors.kafka.client_config import assign_from_beginning, consumer_config
    from core.settings import KafkaSettings

    consumer = Consumer(consumer_config(KafkaSettings(bootstrap_servers=bootstrap), None))
    assign_from_beginning(consumer, topic, 30)
    seen = 0
    started = time.perf_counter()
    deadline = started + 300
    while seen < expected and time.perf_counter() < deadline:
        seen += sum(1 for m in consumer.consume(num_messages=10_000, timeout=0.5) if m.error() is None)
    elapsed = time.perf_counter() - started
    consumer.close()
    return {"records": seen, "seconds": round(elapsed, 3), "records_per_s": round(seen / elapsed)}


class _Batches:
    """The ``foreachBatch`` function: when each batch's rows reached the driver, and which keys it held."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[str, float] = {}
        self.rows: list[tuple[int, int, float]] = []  # (batch id, rows, wall time after the rows arrived)

    def __call__(self, frame: Any, batch_id: int) -> None:
        table = frame.toArrow()  # runs the micro-batch's DAG, as the auditor's sink does
        arrived = time.time()
        keys = table.column("k").to_pylist() if table.num_rows else []
        with self.lock:
            self.rows.append((batch_id, table.num_rows, arrived))
            for key in keys:
                self.seen.setdefault(str(key), arrived)


def _counting_processor() -> Any:
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class Counting(StatefulProcessor):
        """Counts rows per key in a value state: the least a stateful operator does."""

        def init(self, handle: Any) -> None:
            self.count = handle.getValueState("count", "n LONG")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            total = sum(len(frame) for frame in rows)
            before = self.count.get()
            self.count.update(((before[0] if before else 0) + total,))
            yield pd.DataFrame({"k": [key[0]], "n": [total]})

        def close(self) -> None:
            pass

    return Counting()


def _query(spark: Any, bootstrap: str, topic: str, stateful: bool, checkpoint: Path, **trigger: Any) -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from connectors.kafka.spark_source import KafkaDataSource

    spark.dataSource.register(KafkaDataSource)
    raw = (
        spark.readStream.format("bkaudit_kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    rows = raw.selectExpr("CAST(key AS STRING) AS k", "timestamp AS ts")
    if stateful:
        rows = (
            rows.withWatermark("ts", "0 seconds")
            .groupBy("k")
            .transformWithStateInPandas(
                statefulProcessor=_counting_processor(),
                outputStructType=StructType([StructField("k", StringType()), StructField("n", LongType())]),
                outputMode="Append",
                timeMode="EventTime",
            )
        )
    batches = _Batches()
    writer = rows.writeStream.foreachBatch(batches).option("checkpointLocation", str(checkpoint))
    return writer.trigger(**trigger).start(), batches


def _producer(bootstrap: str) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "batch.num.messages": 1, "linger.ms": 0, "acks": 1})


def _send_and_wait(producer: Any, topic: str, key: bytes, value: bytes, **partition: int) -> None:
    """One record, acknowledged before returning."""
    producer.produce(topic, value=value, key=key, **partition)
    assert producer.flush(30) == 0


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from connectors.kafka.topics import ensure_topic
    from core.settings import KafkaSettings

    ensure_topic(KafkaSettings(bootstrap_servers=bootstrap), topic, partitions)


def _wait_idle(query: Any, timeout_s: float = 60.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        status = query.status
        if not status["isTriggerActive"] and not status["isDataAvailable"]:
            return
        time.sleep(0.05)
    raise TimeoutError("the query did not become idle")


def spark_latency(
    spark: Any, bootstrap: str, work: Path, stateful: bool, rounds: int, partitions: int
) -> dict[str, Any]:
    """One record per micro-batch: trigger → rows in ``foreachBatch``, and send → rows, per round."""
    topic = f"floor.latency.{int(stateful)}.{time.time_ns()}"
    _create_topic(bootstrap, topic, partitions)
    query, batches = _query(
        spark, bootstrap, topic, stateful, work / f"cp-latency-{int(stateful)}", processingTime="1 second"
    )
    producer = _producer(bootstrap)
    send_to_rows: list[float] = []
    trigger_to_rows: list[float] = []
    try:
        for round_number in range(rounds + 1):  # round 0 warms the query up (first batch, worker start)
            _wait_idle(query)
            key = f"round-{round_number}"
            sent = time.time()
            _send_and_wait(producer, topic, key.encode(), b"x")
            deadline = time.time() + 60
            while key not in batches.seen and time.time() < deadline:
                time.sleep(0.005)
            if key not in batches.seen:
                raise TimeoutError(f"record {key} never reached foreachBatch")
            arrived = batches.seen[key]
            _wait_idle(query)
            progress = [p for p in query.recentProgress if p["numInputRows"]]
            started = time.mktime(time.strptime(progress[-1]["timestamp"][:19], "%Y-%m-%dT%H:%M:%S"))
            started += float("0." + progress[-1]["timestamp"][20:23]) - time.timezone
            if round_number:
                send_to_rows.append(arrived - sent)
                trigger_to_rows.append(arrived - started)
    finally:
        query.stop()
    return {
        "stateful": stateful,
        "send_to_rows_s": _summary(send_to_rows),
        "trigger_to_rows_s": _summary(trigger_to_rows),
    }


def spark_throughput(
    spark: Any, bootstrap: str, work: Path, stateful: bool, records: int, partitions: int
) -> dict[str, Any]:
    """``records`` records in one ``availableNow`` micro-batch (keys spread like ledger buckets)."""
    topic = f"floor.throughput.{int(stateful)}.{time.time_ns()}"
    _create_topic(bootstrap, topic, partitions)
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "batch.size": 262_144, "linger.ms": 5, "acks": 1})
    value = b"v" * 200  # the size of a ledger upsert event
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=value, key=f"ledgers/{i % 64}".encode())
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush()
    # Tansu's high watermark after multi-record batches is too low; a last one-record send fixes it.
    for partition in range(partitions):
        _send_and_wait(producer, topic, b"tail", value, partition=partition)
    started = time.perf_counter()
    query, batches = _query(
        spark, bootstrap, topic, stateful, work / f"cp-throughput-{int(stateful)}", availableNow=True
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    total = records + partitions
    read = sum(n for _, n, _ in batches.rows) if not stateful else None
    return {
        "stateful": stateful,
        "records": total,
        "rows_out": read,
        "seconds": round(elapsed, 3),
        "records_per_s": round(total / elapsed),
    }


def _ledger_rows(ids: list[int], last_entry: int) -> Any:
    import pyarrow as pa

    from connectors.delta.tables import LEDGER_BUCKETS, LEDGERS

    ensembles = [[f"10.0.{i % 10}.{(i * 7 + k) % 100}:3181" for k in range(3)] for i in ids]
    columns = {
        "ledger_id": ids,
        "ledger_bucket": [i % LEDGER_BUCKETS for i in ids],
        "cluster": ["bench"] * len(ids),
        "state": ["CLOSED"] * len(ids),
        "ensemble_size": [3] * len(ids),
        "write_quorum": [2] * len(ids),
        "ack_quorum": [2] * len(ids),
        "last_entry_id": [last_entry] * len(ids),
        "segments": [[{"first_entry_id": 0, "ensemble": e}] for e in ensembles],
        "bookies": [sorted(e) for e in ensembles],
        "mzxid": ids,
        "deleted": [False] * len(ids),
    }
    return pa.table(
        {name: pa.array(values, LEDGERS.schema.field(name).type) for name, values in columns.items()}
    )


def delta_merge_floor(work: Path, ledgers: int, updates: list[int]) -> dict[str, Any]:
    """The sink's per-batch upsert of changed ledger rows (``BatchWriter.upsert``, a Delta MERGE by key)
    into a ``ledgers`` table of ``ledgers`` rows, for batches of ``updates`` random ledgers."""
    import random

    from connectors.delta.tables import BatchWriter, ensure_tables

    root = work / "lakehouse"
    ensure_tables(root)
    started = time.perf_counter()
    for first in range(0, ledgers, 250_000):  # loaded like a snapshot: a few large appends
        ids = list(range(first, min(first + 250_000, ledgers)))
        BatchWriter(root, "floors", first).append("ledgers", _ledger_rows(ids, 9))
    load_s = time.perf_counter() - started
    rng = random.Random(0)
    merges = []
    for batch, count in enumerate(updates, start=ledgers):
        ids = sorted(rng.sample(range(ledgers), count))
        rows = _ledger_rows(ids, 10 + batch)
        started = time.perf_counter()
        BatchWriter(root, "floors", batch).upsert("ledgers", rows)
        merges.append({"rows": count, "seconds": round(time.perf_counter() - started, 3)})
    return {"table_rows": ledgers, "load_s": round(load_s, 1), "merges": merges}


def run(
    alerts: int, rounds: int, records: int, partitions: int = 16, ledgers: int = 1_000_000
) -> dict[str, Any]:
    from connectors.kafka.embedded import EmbeddedBroker
    from core.settings import SparkSettings
    from streaming.session import build_spark_session

    work = Path(tempfile.mkdtemp(prefix="bkaudit-bench-floors-"))
    broker = EmbeddedBroker(work / "broker")
    broker.start()
    figures: dict[str, Any] = {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()}
    try:
        figures["publish"] = [publish_floor(broker.bootstrap, alerts, processes, 8) for processes in (1, 2)]
        figures["consume"] = consume_floor(broker.bootstrap, figures["publish"][0]["topic"], alerts)
        spark = build_spark_session(SparkSettings(master="local[2]"))
        figures["spark_latency"] = [
            spark_latency(spark, broker.bootstrap, work, stateful, rounds, partitions)
            for stateful in (False, True)
        ]
        figures["spark_throughput"] = [
            spark_throughput(spark, broker.bootstrap, work, stateful, records, partitions)
            for stateful in (False, True)
        ]
        spark.stop()
    finally:
        broker.stop()
    figures["delta_merge"] = delta_merge_floor(work, ledgers, [1_000, 10_000, 1_000, 10_000])
    return figures


@pytest.mark.benchmark
def test_floor_figures():
    print(json.dumps(run(alerts=3000, rounds=2, records=5000, ledgers=20_000)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--alerts", type=int, default=31_000, help="alert records to publish")
    parser.add_argument("--rounds", type=int, default=8, help="one-record micro-batches per query")
    parser.add_argument("--records", type=int, default=100_000, help="records in the throughput batch")
    parser.add_argument("--partitions", type=int, default=16, help="partitions of the Spark topics")
    parser.add_argument(
        "--ledgers", type=int, default=1_000_000, help="rows of the ledgers table merged into"
    )
    args = parser.parse_args()
    figures = run(args.alerts, args.rounds, args.records, args.partitions, args.ledgers)
    print(json.dumps(figures, indent=2))
    # the last line: every figure on one line, with the load average it was measured at
    print(json.dumps({**figures, "load_average": [round(x, 2) for x in os.getloadavg()]}))
