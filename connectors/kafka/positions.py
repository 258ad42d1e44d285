"""Where a topic's partitions end and when given records were written: the facts `bkaudit status` needs.

One short-lived librdkafka consumer, no group, no retries beyond the request timeout: a status command
answers quickly or says the broker did not answer.

Example:
    >>> # with TopicPositions(settings.kafka) as positions:
    >>> #     ends = positions.end_offsets("bkaudit.changes")      # {0: 812, 1: 790}
    >>> #     positions.record_times("bkaudit.changes", {0: 811})  # {0: 1764146400123}
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

from core.errors import ServiceError
from core.settings import KafkaSettings


class TopicPositions:
    """End offsets of a topic's partitions, and the write time (ms) of the record at given offsets."""

    def __init__(self, settings: KafkaSettings, timeout_s: float | None = None) -> None:
        from confluent_kafka import Consumer

        from connectors.kafka.client_config import consumer_config

        self.settings = settings
        request_timeout_s = settings.request_timeout_ms / 1000.0
        self.timeout_s = request_timeout_s if timeout_s is None else min(timeout_s, request_timeout_s)
        self._consumer: Any = Consumer(consumer_config(settings, None))

    def end_offsets(self, topic: str) -> dict[int, int] | None:
        """``{partition: end offset}`` of ``topic``; None when the topic does not exist.

        Raises :class:`~core.errors.ServiceError` when no broker answers within the request timeout.

        Example:
            >>> # TopicPositions(settings.kafka).end_offsets("bkaudit.changes")  → {0: 812, 1: 790}
        """
        from confluent_kafka import OFFSET_END, KafkaException, TopicPartition

        try:
            described = self._consumer.list_topics(topic, timeout=self.timeout_s).topics.get(topic)
            if described is None or described.error is not None or not described.partitions:
                return None
            wanted = [TopicPartition(topic, p, OFFSET_END) for p in sorted(described.partitions)]
            found = self._consumer.offsets_for_times(wanted, timeout=self.timeout_s)
        except KafkaException as err:
            raise ServiceError(
                f"Kafka at {self.settings.bootstrap_servers} did not answer: {err.args[0]}"
            ) from None
        return {item.partition: int(item.offset) for item in found if item.error is None}

    def record_times(self, topic: str, offsets: dict[int, int]) -> dict[int, int]:
        """``{partition: timestamp ms}`` of the record at each ``{partition: offset}``; partitions whose
        record could not be fetched within the request timeout are left out.

        Example:
            >>> # positions.record_times("bkaudit.changes", {0: 811})  → {0: 1764146400123}
        """
        from confluent_kafka import TopicPartition

        if not offsets:
            return {}
        self._consumer.assign([TopicPartition(topic, p, o) for p, o in offsets.items()])
        found: dict[int, int] = {}
        deadline = time.monotonic() + self.timeout_s
        try:
            while len(found) < len(offsets) and time.monotonic() < deadline:
                for message in self._consumer.consume(num_messages=len(offsets), timeout=0.2):
                    partition = message.partition()
                    if message.error() is None and partition not in found:
                        found[partition] = message.timestamp()[1]
        finally:
            self._consumer.unassign()
        return found

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> TopicPositions:
        return self

    def __exit__(
        self, _type: type[BaseException] | None, _value: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.close()
