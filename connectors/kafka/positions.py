"""Where a topic's partitions end and when given records were written: the facts `bkaudit status` needs.

One short-lived librdkafka consumer, no group, no retries beyond the request timeout: a status command
answers quickly or says the broker did not answer. The lookups are :mod:`connectors.kafka.offsets`', the
same the Kafka source plans with (there with back-off).

Example:
    >>> # with TopicPositions(settings.kafka) as positions:
    >>> #     ends = positions.end_offsets("bkaudit.changes")      # {0: 812, 1: 790}
    >>> #     positions.record_times("bkaudit.changes", {0: 811})  # {0: 1764146400123}
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from connectors.kafka.offsets import list_offsets, records_at
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
        from confluent_kafka import KafkaException

        try:
            ends = list_offsets(
                self._consumer, [topic], low=False, timeout_s=self.timeout_s, skip_failed=True
            )
        except KafkaException as err:
            raise ServiceError(
                f"Kafka at {self.settings.bootstrap_servers} did not answer: {err.args[0]}"
            ) from None
        return ends.get(topic)

    def record_times(self, topic: str, offsets: dict[int, int]) -> dict[int, int]:
        """``{partition: timestamp ms}`` of the record at each ``{partition: offset}`` (or the first one
        after it); partitions whose record could not be fetched within the request timeout are left out.

        Example:
            >>> # positions.record_times("bkaudit.changes", {0: 811})  → {0: 1764146400123}
        """
        wanted = {(topic, partition): offset for partition, offset in offsets.items()}
        found = records_at(self._consumer, wanted, timeout_s=self.timeout_s)
        return {
            partition: message.timestamp()[1]
            for (_, partition), message in found.items()
            if message is not None
        }

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> TopicPositions:
        return self

    def __exit__(
        self, _type: type[BaseException] | None, _value: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.close()
