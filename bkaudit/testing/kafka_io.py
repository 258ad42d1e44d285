"""Reading and writing topics of the real broker in tests and benchmarks, through the product's librdkafka
clients (:mod:`connectors.kafka.client_config`): every partition from its beginning, no consumer group.

Example:
    >>> # records = read_topic(kafka_settings, kafka_settings.alerts_topic)
    >>> # [json.loads(r.value) for r in records]
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from connectors.kafka.client_config import (
    assign_from_beginning,
    consumer_config,
    partition_count,
    producer_config,
)
from core.settings import KafkaSettings


@dataclass(frozen=True)
class Record:
    """One record as a test looks at it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int
    headers: list[tuple[str, bytes]]


def _record(message: Any) -> Record:
    return Record(
        message.topic(),
        message.partition(),
        message.offset(),
        message.key(),
        message.value(),
        message.timestamp()[1],
        list(message.headers() or []),
    )


class TopicTail:
    """A consumer of every partition of ``topic`` from the beginning (waits up to ``wait_s`` for it)."""

    def __init__(self, settings: KafkaSettings, topic: str, *, wait_s: float = 15.0) -> None:
        self.topic = topic
        self.consumer = Consumer(consumer_config(settings, None))
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.partitions = assign_from_beginning(self.consumer, topic, 5.0)
                break
            except Exception:
                if time.monotonic() >= deadline:
                    self.consumer.close()
                    raise
                time.sleep(0.1)
        self.positions = dict.fromkeys(range(self.partitions), 0)

    def poll(self, timeout_s: float = 0.3) -> list[Record]:
        """The records that arrived (possibly none), in each partition's order."""
        messages = self.consumer.consume(num_messages=1000, timeout=timeout_s)
        found = [_record(m) for m in messages if m.error() is None]
        for record in found:
            self.positions[record.partition] = record.offset + 1
        return found

    def end_offsets(self) -> dict[int, int]:
        """Each partition's high watermark, asked of the broker now."""
        return {
            p: self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10, cached=False)[1]
            for p in range(self.partitions)
        }

    def read_to_end(self, timeout_s: float = 20.0) -> list[Record]:
        """Everything up to the end offsets as of now; fails if they are not reached within ``timeout_s``."""
        end = self.end_offsets()
        found: list[Record] = []
        deadline = time.monotonic() + timeout_s
        while any(self.positions[p] < end[p] for p in end):
            assert time.monotonic() < deadline, f"timed out reading {self.topic} to {end}"
            found.extend(self.poll())
        return found

    def close(self) -> None:
        self.consumer.close()


def read_topic(settings: KafkaSettings, topic: str, timeout_s: float = 20.0) -> list[Record]:
    """Every record of ``topic`` up to its end offsets as of now, all partitions."""
    tail = TopicTail(settings, topic)
    try:
        return tail.read_to_end(timeout_s)
    finally:
        tail.close()


def end_offsets(settings: KafkaSettings, topic: str) -> dict[int, int]:
    """Each partition's high watermark (what a reader planning by end offsets would read up to)."""
    tail = TopicTail(settings, topic)
    try:
        return tail.end_offsets()
    finally:
        tail.close()


def produce(
    settings: KafkaSettings,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes] | tuple[bytes | None, bytes, int | None]],
    *,
    one_record_batches: bool = True,
    headers: list[tuple[str, bytes]] | None = None,
) -> int:
    """Send ``(key, value[, partition])`` records and wait for every ack; returns how many were sent.

    ``one_record_batches`` (the default) sends each record in its own batch, so the embedded broker's end
    offsets are exact without held tails. A record without a partition goes where the key's murmur2 says
    (librdkafka's partitioner, Java's).
    """
    overrides = {"batch.num.messages": 1} if one_record_batches else {}
    producer = Producer({**producer_config(settings), **overrides})
    failures: list[Any] = []
    sent = 0
    for item in records:
        key, value = item[0], item[1]
        partition = item[2] if len(item) > 2 else None
        extra: dict[str, Any] = {} if partition is None else {"partition": partition}
        if headers:
            extra["headers"] = headers
        producer.produce(topic, value=value, key=key, on_delivery=_collect(failures), **extra)
        producer.poll(0)
        sent += 1
    pending = producer.flush(30)
    assert not pending and not failures, f"{pending} records unacknowledged, failures: {failures[:3]}"
    return sent


def _collect(failures: list[Any]) -> Any:
    def report(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    return report


def topic_partitions(settings: KafkaSettings, topic: str) -> int:
    """How many partitions ``topic`` has (fails when it does not exist)."""
    consumer = Consumer(consumer_config(settings, None))
    try:
        return partition_count(consumer, topic, 10.0)
    finally:
        consumer.close()


__all__ = ["Record", "TopicTail", "end_offsets", "produce", "read_topic", "topic_partitions"]
