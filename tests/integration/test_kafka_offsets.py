"""The offset and record lookups the Kafka source and `bkaudit status` share, on the embedded broker."""

from __future__ import annotations

import time

import pytest

from bkaudit.testing.kafka_io import produce
from connectors.kafka.client_config import consumer_config
from connectors.kafka.offsets import list_offsets, records_at
from connectors.kafka.positions import TopicPositions
from connectors.kafka.topics import ensure_topic

pytestmark = pytest.mark.integration


@pytest.fixture
def consumer(kafka_settings):
    from confluent_kafka import Consumer

    client = Consumer(consumer_config(kafka_settings, None))
    yield client
    client.close()


def test_first_and_end_offsets_of_the_chosen_partitions_and_none_of_an_absent_topic(kafka_settings, consumer):
    topic = f"{kafka_settings.changes_topic}.two"
    ensure_topic(kafka_settings, topic, partitions=2)
    produce(kafka_settings, topic, [(b"k", b"v%d" % i, i % 2) for i in range(5)])
    assert list_offsets(consumer, [topic, f"{topic}.absent"], low=True, timeout_s=10) == {topic: {0: 0, 1: 0}}
    assert list_offsets(consumer, [topic], low=False, timeout_s=10) == {topic: {0: 3, 1: 2}}
    last_only = list_offsets(consumer, [topic], low=False, timeout_s=10, partitions=lambda ids: ids[-1:])
    assert last_only == {topic: {1: 2}}
    with TopicPositions(kafka_settings, timeout_s=10) as positions:
        assert positions.end_offsets(topic) == {0: 3, 1: 2}
        assert positions.end_offsets(f"{topic}.absent") is None


def test_the_same_record_is_found_again_by_the_same_consumer(kafka_settings):
    """`bkaudit status` asks one consumer for the record times of the same partition twice (the watcher's
    last record, then a lane's position). A partition paused once its record was in stayed paused when it
    was assigned again, and the second answer came back empty."""
    topic = f"{kafka_settings.changes_topic}.again"
    ensure_topic(kafka_settings, topic, partitions=1)
    produce(kafka_settings, topic, [(b"k", b"v%d" % i, 0) for i in range(3)])
    with TopicPositions(kafka_settings, timeout_s=10) as positions:
        first = positions.record_times(topic, {0: 2})
        assert set(first) == {0}
        assert positions.record_times(topic, {0: 2}) == first
        assert positions.record_times(topic, {0: 1}).keys() == {0}


def test_a_partition_the_idle_check_gives_up_on_is_none_at_once(kafka_settings, consumer):
    topic = f"{kafka_settings.changes_topic}.past-end"
    ensure_topic(kafka_settings, topic, partitions=1)
    produce(kafka_settings, topic, [(b"k", b"v0", 0)])
    started = time.monotonic()
    found = records_at(consumer, {(topic, 0): 0}, timeout_s=10)
    assert found[(topic, 0)].value() == b"v0"
    gone = records_at(consumer, {(topic, 0): 5}, timeout_s=20, on_idle=list, idle_every_s=0.2)
    assert gone == {(topic, 0): None}
    assert time.monotonic() - started < 15  # given up at its first idle checks, not after the 20 s timeout
    assert records_at(consumer, {(topic, 0): 5}, timeout_s=0.5) == {}  # nothing there, no one gives up
