"""The real Kafka broker (``dev.broker = kafka``): it starts, serves, keeps its topics across a restart,
reports exact high watermarks after multi-record batches, and a bad config fails in one line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from bkaudit.testing.kafka_io import end_offsets, produce, read_topic
from connectors.kafka.client_config import admin_config, producer_config
from connectors.kafka.kafka_broker import KafkaBroker
from connectors.kafka.publisher import partition_for_key
from connectors.kafka.tail_sender import TailSender
from connectors.kafka.topics import ensure_topic
from core.errors import ServiceError
from core.settings import KafkaSettings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    kafka = KafkaBroker(tmp_path_factory.mktemp("kafka-broker"))
    kafka.start(timeout=120)
    try:
        yield kafka
    finally:
        kafka.stop()


def _settings(broker: KafkaBroker) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=broker.bootstrap)


def test_produces_consumes_and_keeps_the_topic_across_a_restart(broker):
    settings = _settings(broker)
    topic = "t.restart"  # auto-created by the producer's metadata request, like on Tansu
    sent = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(50)]
    produce(settings, topic, sent)
    assert sorted((r.key, r.value) for r in read_topic(settings, topic)) == sorted(sent)
    partitions = len(end_offsets(settings, topic))
    assert partitions == broker.num_partitions

    port = broker.port
    broker.stop()
    assert not broker.is_running()
    broker.start(timeout=120)
    assert broker.port == port
    assert topic in AdminClient(admin_config(settings)).list_topics(timeout=10).topics
    assert sorted((r.key, r.value) for r in read_topic(settings, topic)) == sorted(sent)
    assert sum(end_offsets(settings, topic).values()) == len(sent)


def test_high_watermarks_are_exact_after_multi_record_batches(broker):
    # The same burst as the Tansu control in test_services (no held tails, batching on): on the real
    # broker every record is below the reported end offsets, so single_record_tails is not needed here.
    settings = _settings(broker)
    topic = "t.watermarks"
    ensure_topic(settings, topic, partitions=3)
    assert producer_config(settings)["batch.size"] > 0
    sent = [(f"ledger/{i % 5}".encode(), f"v{i}".encode()) for i in range(2000)]
    sender = TailSender(Producer(producer_config(settings)), hold_tails=False)
    for key, value in sent:
        sender.send(topic, key=key, value=value, partition=partition_for_key(key, 3))
    sender.flush()
    assert sum(end_offsets(settings, topic).values()) == len(sent)
    produce(settings, topic, [(b"ledger/0", b"batched")] * 10, one_record_batches=False)
    assert sum(end_offsets(settings, topic).values()) == len(sent) + 10
    assert len(read_topic(settings, topic)) == len(sent) + 10


def test_discarded_data_leaves_an_empty_broker_on_the_same_port(broker):
    settings = _settings(broker)
    produce(settings, "t.lost", [(b"k", b"v")])
    port = broker.port
    broker.stop()
    broker.discard_data()
    broker.start(timeout=120)
    assert broker.port == port
    assert "t.lost" not in AdminClient(admin_config(settings)).list_topics(timeout=10).topics


def test_a_bad_config_fails_with_one_line_naming_the_log(tmp_path: Path):
    kafka = KafkaBroker(tmp_path / "bad", extra_properties={"num.partitions": "0"})
    with pytest.raises(ServiceError) as failure:
        kafka.start(timeout=120)
    message = str(failure.value)
    assert "\n" not in message
    assert str(kafka.log_file) in message
    assert "num.partitions" in kafka.log_file.read_text()
    assert not kafka.is_running()


def test_a_producer_sees_a_topic_the_broker_creates_in_the_background(broker):
    # Kafka answers the creating metadata request "unknown topic" and creates the topic afterwards: the
    # sink's partition_count asks a producer again instead of failing the batch.
    from connectors.kafka.client_config import partition_count

    producer = Producer(producer_config(_settings(broker)))
    assert partition_count(producer, "t.created-on-first-use", 20.0) == broker.num_partitions


def test_the_broker_writes_kafkas_own_log(broker):
    # Kafka 4.1 logs through slf4j 1.7: without its log4j binding on the classpath it logs nothing at all.
    assert "Kafka Server started" in broker.log_file.read_text()
