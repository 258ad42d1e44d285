"""Reading the alerts topic as an SRE would: the newest transitions, then each new one as it arrives.

:class:`AlertTail` assigns every partition of the alerts topic (no consumer group: it commits nothing and
disturbs no other reader), starts each partition ``last`` records before its end, reads up to the ends
as of the start (:meth:`AlertTail.backlog`) and, when asked, goes on reading (:meth:`AlertTail.follow`).
A record whose value is not an alert object is returned with its reason, never dropped.

Example:
    >>> parse_alert(b'{"alert_id": "a1", "kind": "BOOKIE_LOST", "state": "firing"}')["kind"]
    'BOOKIE_LOST'
    >>> parse_alert(b"not json")
    Traceback (most recent call last):
    ...
    ValueError: not JSON (Expecting value: line 1 column 1 (char 0))
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from core.settings import KafkaSettings

#: Fields every alert object carries (the JSON the job publishes: core.domain.alerts.Alert.to_json).
REQUIRED_FIELDS = ("alert_id", "kind", "state")
#: The backlog read ends once every partition reached its end offset, or after this long without a record
#: (an end offset a broker over-reports must not hang the command).
IDLE_END_S = 2.0


def parse_alert(value: bytes | None) -> dict[str, Any]:
    """An alerts-topic record's value as the alert object; :class:`ValueError` naming what is wrong.

    Example:
        >>> parse_alert(b'{"kind": "BOOKIE_LOST"}')
        Traceback (most recent call last):
        ...
        ValueError: not an alert object (no alert_id, state)
    """
    if value is None:
        raise ValueError("no value (a tombstone)")
    try:
        body = json.loads(value)
    except ValueError as err:
        raise ValueError(f"not JSON ({err})") from None
    except RecursionError:  # nested deeper than the decoder goes: hostile or broken, never an alert
        raise ValueError("not JSON (nested too deeply)") from None
    if not isinstance(body, dict):
        raise ValueError(f"not an alert object (a JSON {type(body).__name__})")
    missing = [name for name in REQUIRED_FIELDS if name not in body]
    if missing:
        raise ValueError(f"not an alert object (no {', '.join(missing)})")
    return body


@dataclass(frozen=True)
class AlertRecord:
    """One record of the alerts topic: its alert object, or why it is not one (``error``)."""

    partition: int
    offset: int
    timestamp_ms: int
    alert: dict[str, Any] | None
    error: str | None = None
    key: str | None = None  # ``<cluster>/<entity>``

    @classmethod
    def from_message(cls, message: Any) -> AlertRecord:
        """A librdkafka message as a record (its value parsed)."""
        _, timestamp_ms = message.timestamp()
        try:
            alert, error = parse_alert(message.value()), None
        except ValueError as err:
            alert, error = None, str(err)
        raw_key = message.key()
        key = raw_key.decode("utf-8", "replace") if raw_key is not None else None
        return cls(message.partition(), message.offset(), int(timestamp_ms), alert, error, key)


class AlertTail:
    """A reader of every partition of the alerts topic, from ``last`` records before each partition's end.

    Example:
        >>> # with AlertTail(settings.kafka, last=20) as tail:
        >>> #     for record in tail.backlog(): print(record.alert)
    """

    def __init__(self, settings: KafkaSettings, *, last: int, timeout_s: float = 10.0) -> None:
        from confluent_kafka import Consumer

        from connectors.kafka.client_config import consumer_config

        self.topic = settings.alerts_topic
        self.consumer = Consumer(consumer_config(settings, None))
        try:
            self.ends = self._assign_last(last, timeout_s)
        except BaseException:
            self.consumer.close()
            raise
        self.positions = {p: self._starts[p] for p in self.ends}

    @property
    def starts(self) -> dict[int, int]:
        """Where each partition's read began (its first offset still held, for a read of everything)."""
        return dict(self._starts)

    def _assign_last(self, last: int, timeout_s: float) -> dict[int, int]:
        """Assign each partition at ``last`` records before its end; returns the ends."""
        from confluent_kafka import TopicPartition

        from connectors.kafka.offsets import list_offsets
        from core.errors import ServiceError

        lows = list_offsets(self.consumer, [self.topic], low=True, timeout_s=timeout_s).get(self.topic)
        if not lows:
            raise ServiceError(f"Kafka: the alerts topic {self.topic} does not exist (no job has published)")
        ends = list_offsets(self.consumer, [self.topic], low=False, timeout_s=timeout_s)[self.topic]
        self._starts = {p: max(lows[p], ends[p] - last) for p in ends}
        self.consumer.assign([TopicPartition(self.topic, p, o) for p, o in self._starts.items()])
        return ends

    def _poll(self, timeout_s: float) -> list[AlertRecord]:
        from confluent_kafka import KafkaError, KafkaException

        found = []
        for message in self.consumer.consume(num_messages=500, timeout=timeout_s):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(error)
            record = AlertRecord.from_message(message)
            self.positions[record.partition] = record.offset + 1
            found.append(record)
        return found

    def backlog(self) -> list[AlertRecord]:
        """The records up to the ends as of the start, oldest first (by record time, then position)."""
        found: list[AlertRecord] = []
        idle_since = time.monotonic()
        while any(self.positions[p] < end for p, end in self.ends.items()):
            batch = self._poll(0.2)
            if batch:
                found.extend(batch)
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_END_S:
                break
        return sorted(found, key=lambda r: (r.timestamp_ms, r.partition, r.offset))

    def follow(self, stopped: Callable[[], bool]) -> Iterator[AlertRecord]:
        """Each record as it arrives, until ``stopped()`` is true (checked at least every 0.5 s)."""
        while not stopped():
            yield from self._poll(0.5)

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> AlertTail:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class AlertHistory:
    """Every record the alerts topic still holds, and the partitions whose first records are gone
    (retention passed, or the topic was recreated): partition → first offset held."""

    records: list[AlertRecord]
    truncated: dict[int, int]


def read_alert_history(settings: KafkaSettings, timeout_s: float = 10.0) -> AlertHistory:
    """Every record of the alerts topic, oldest first (what ``bkaudit repair`` rebuilds ``violations``
    from); :class:`~core.errors.ServiceError` when the topic does not exist."""
    with AlertTail(settings, last=2**62, timeout_s=timeout_s) as tail:
        records = tail.backlog()
        truncated = {p: start for p, start in tail.starts.items() if start > 0}
    return AlertHistory(records, truncated)


__all__ = ["AlertHistory", "AlertRecord", "AlertTail", "parse_alert", "read_alert_history"]
