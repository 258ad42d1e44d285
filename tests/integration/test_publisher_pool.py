"""PublisherPool against the embedded broker: every record delivered once, per-partition order kept, exact end
offsets, dead workers replaced, an unreachable broker reported; and the sink's big bursts going through it."""

from __future__ import annotations

import json
import signal
import time

import pytest
from kafka import KafkaConsumer, TopicPartition

from bkaudit.errors import ServiceError
from connectors.kafka.client_config import consumer_config
from connectors.kafka.publisher import partition_for_key
from connectors.kafka.publisher_pool import POOL_MIN_RECORDS, PublisherPool
from connectors.kafka.topics import ensure_topic
from connectors.process import free_port
from tests.integration.event_fixtures import decision_table as decisions

pytestmark = pytest.mark.integration


def _read_all(
    kafka_settings, topic: str, partitions: int, expected: int
) -> dict[int, list[tuple[bytes, bytes]]]:
    consumer = KafkaConsumer(**consumer_config(kafka_settings, None))
    assigned = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(assigned)
    consumer.seek_to_beginning()
    received: dict[int, list[tuple[bytes, bytes]]] = {p: [] for p in range(partitions)}
    deadline = time.monotonic() + 60
    while sum(map(len, received.values())) < expected and time.monotonic() < deadline:
        for tp, records in consumer.poll(timeout_ms=500).items():
            received[tp.partition].extend((r.key, r.value) for r in records)
    ends = consumer.end_offsets(assigned)
    consumer.close()
    assert sum(ends.values()) == expected  # one-record tails in every worker: the high watermarks are exact
    return received


def test_a_burst_from_two_processes_arrives_once_in_per_partition_order(kafka_settings):
    topic = kafka_settings.alerts_topic
    ensure_topic(kafka_settings, topic, partitions=4)
    records = []
    for i in range(5000):
        key = f"c1/ledger/{i % 300}".encode()
        records.append((topic, partition_for_key(key, 4), key, json.dumps({"seq": i}).encode()))
    pool = PublisherPool(kafka_settings, processes=2)
    try:
        assert pool.publish(records, timeout_s=120) == (0, None)
        assert pool.workers_started == 2
    finally:
        pool.close()
    assert pool.workers_started == 0
    received = _read_all(kafka_settings, topic, 4, len(records))
    for partition in range(4):
        assert received[partition] == [(k, v) for _, p, k, v in records if p == partition]


def test_a_dead_worker_is_replaced_and_one_dying_mid_burst_fails_the_call(kafka_settings):
    topic = kafka_settings.alerts_topic
    ensure_topic(kafka_settings, topic, partitions=2)
    pool = PublisherPool(kafka_settings, processes=2)
    try:
        pool.start()
        first = pool._workers[0]
        assert first is not None
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=10)
        # Replaced before the next burst: nothing is sent to a dead process.
        assert pool.publish([(topic, 0, b"k", b"after a crash")], timeout_s=60) == (0, None)
        assert pool._workers[0] is not first

        # A worker that dies while it holds a burst: the caller learns it (its batch fails and is replayed).
        worker = pool._worker(1)
        worker.submit([(topic, 1, b"k", b"lost with the worker")])
        worker.process.send_signal(signal.SIGKILL)
        with pytest.raises(ServiceError, match="publisher process exited"):
            worker.result(timeout_s=30)
    finally:
        pool.close()


def test_an_unreachable_broker_is_an_error_for_the_caller_and_no_secret_is_on_a_command_line(kafka_settings):
    from pydantic import SecretStr

    nowhere = kafka_settings.model_copy(
        update={
            "bootstrap_servers": f"127.0.0.1:{free_port()}",
            "bootstrap_timeout_ms": 1500,
            "request_timeout_ms": 1500,
            "sasl_password": SecretStr("hunter2-never-shown"),
        }
    )
    pool = PublisherPool(nowhere, processes=1)
    try:
        with pytest.raises(ServiceError, match="publisher process failed: KafkaTimeoutError"):
            pool.publish([("t", 0, b"k", b"v")], timeout_s=60)  # the sink fails its batch: replayed later
        pool.start()  # the failed worker was replaced
        worker = pool._workers[0]
        assert worker is not None and worker.process.poll() is None
        assert not any("hunter2" in str(arg) for arg in worker.process.args)
    finally:
        pool.close()


def test_the_sink_publishes_a_big_burst_through_its_processes_with_the_same_alert_ids(
    kafka_settings, tmp_path
):
    from streaming.sink import AuditSink, SinkConfig

    ensure_topic(kafka_settings, kafka_settings.alerts_topic, 3)
    sink = AuditSink(
        SinkConfig(
            lakehouse_root=tmp_path / "lh", app_id="pool-test", kafka=kafka_settings, publish_processes=2
        )
    )
    ledgers = POOL_MIN_RECORDS + 100

    ledger = {
        "state": "CLOSED",
        "ensemble_size": 2,
        "write_quorum": 2,
        "ack_quorum": 2,
        "last_entry_id": 9,
        "length": 10,
        "segments": [[0, ["b1", "b2"]]],
        "version": 0,
        "format_version": 3,
        "custom_metadata": [],
    }
    setup = [("rack_map", 1_000, None, None, {"racks": {"b1": "/r1", "b2": "/r2"}, "moved": []})]  # adhering
    setup += [("bookie_state", 1_000, None, b, {"status": "WRITABLE", "lost": False}) for b in ("b1", "b2")]
    setup += [("ledger_state", 1_000, i, None, {**ledger, "mzxid": 10 + i}) for i in range(ledgers)]
    try:
        assert sink.process(decisions(*setup), 0).alerts == []
        report = sink.process(
            decisions(
                (
                    "bookie_state",
                    2_000,
                    None,
                    "b1",
                    {"status": "GONE", "lost": True, "missing_since_ms": 1_500},
                ),
                ("bookie_lost", 2_000, None, "b1", {"missing_since_ms": 1_500}),
            ),
            1,
        )
        assert sink._publisher_pool is not None and sink._publisher_pool.workers_started == 2
    finally:
        sink.close()
    assert len(report.alerts) == ledgers + 1  # every ledger on b1, and BOOKIE_LOST
    received = _read_all(kafka_settings, kafka_settings.alerts_topic, 3, ledgers + 1)
    published = sorted(json.loads(v)["alert_id"] for records in received.values() for _, v in records)
    assert published == sorted(a["alert_id"] for a in report.alerts)
