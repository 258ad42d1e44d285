"""Partition offsets and the records at given offsets, each asked of Kafka once: the lookups that the
Kafka source's planning (:mod:`connectors.kafka.planner`) and `bkaudit status`
(:mod:`connectors.kafka.positions`) share.

No retries here: a call answers within its timeout or raises. The source wraps these calls in its
back-off; `bkaudit status` takes the one answer.

Example:
    >>> # list_offsets(consumer, ["bkaudit.changes"], low=False, timeout_s=10)
    >>> #     → {"bkaudit.changes": {0: 812, 1: 790}}
    >>> # records_at(consumer, {("bkaudit.changes", 0): 811}, timeout_s=10)[("bkaudit.changes", 0)].offset()
    >>> #     → 811
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

#: ``(topic, partition)``.
PartitionKey = tuple[str, int]


def list_offsets(
    consumer: Any,
    topics: Sequence[str],
    *,
    low: bool,
    timeout_s: float,
    partitions: Callable[[list[int]], list[int]] | None = None,
    skip_failed: bool = False,
) -> dict[str, dict[int, int]]:
    """``{topic: {partition: offset}}``: the first (``low``) or the end offset of every partition of
    ``topics``, from fresh metadata (a recreated topic may have another partition count) and one
    ``ListOffsets`` request. (``get_watermark_offsets`` asks for both, per partition: four times the
    requests, and the embedded broker's cost of each grows with the partition's batches.)

    A topic that is absent, in error or without partitions is left out. ``partitions`` picks which of a
    topic's partition ids (ascending) to ask for; all by default. A partition the broker gives no offset
    for raises :class:`confluent_kafka.KafkaException`, or is left out with ``skip_failed``. No broker
    answering within ``timeout_s`` raises ``KafkaException`` as well.

    Example:
        >>> # list_offsets(consumer, ["bkaudit.changes", "gone"], low=True, timeout_s=10)
        >>> #     → {"bkaudit.changes": {0: 0, 1: 0}}
    """
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaException, TopicPartition

    described = consumer.list_topics(timeout=timeout_s).topics  # every topic: asking for one may create it
    choose = partitions or (lambda ids: ids)
    wanted = [
        TopicPartition(topic, partition, OFFSET_BEGINNING if low else OFFSET_END)
        for topic in topics
        if (metadata := described.get(topic)) is not None and metadata.error is None and metadata.partitions
        for partition in choose(sorted(metadata.partitions))
    ]
    result: dict[str, dict[int, int]] = {}
    if not wanted:
        return result
    for found in consumer.offsets_for_times(wanted, timeout=timeout_s):
        if found.error is None:
            result.setdefault(found.topic, {})[found.partition] = int(found.offset)
        elif not skip_failed:
            raise KafkaException(found.error)
    return result


def records_at(
    consumer: Any,
    wanted: dict[PartitionKey, int],
    *,
    timeout_s: float,
    on_idle: Callable[[dict[PartitionKey, int]], Iterable[PartitionKey]] | None = None,
    idle_every_s: float = 1.0,
) -> dict[PartitionKey, Any | None]:
    """The first record at or after each ``(topic, partition) → offset`` (the record at that offset when
    there is one), fetched by ``consumer`` within ``timeout_s``.

    The consumer is assigned the partitions for the call and left unassigned after; a partition is paused
    once its record is in, so the rest need not wait behind its later records. While records are missing,
    ``on_idle(pending)`` is asked every ``idle_every_s`` which of the pending partitions have no record to
    wait for: those map to None. Partitions fetched neither way in time are left out of the answer.

    Example:
        >>> records_at(None, {}, timeout_s=1.0)
        {}
        >>> # records_at(consumer, {("bkaudit.changes", 0): 811}, timeout_s=10)
        >>> #     → {("bkaudit.changes", 0): <Message at offset 811>}
    """
    from confluent_kafka import TopicPartition

    if not wanted:
        return {}
    consumer.assign([TopicPartition(topic, p, offset) for (topic, p), offset in wanted.items()])
    found: dict[PartitionKey, Any | None] = {}
    pending = dict(wanted)
    deadline = time.monotonic() + timeout_s
    next_idle = time.monotonic() + idle_every_s
    try:
        while pending and time.monotonic() < deadline:
            # consume() waits for num_messages or the timeout: one record per partition will do.
            for message in consumer.consume(num_messages=len(pending), timeout=0.2):
                if message.error() is not None:
                    continue  # a partition's end or a transient fetch error: the deadline decides
                key = (message.topic(), message.partition())
                if key not in pending or message.offset() < pending[key]:
                    continue
                del pending[key]
                consumer.pause([TopicPartition(*key)])
                found[key] = message
            if pending and on_idle is not None and time.monotonic() >= next_idle:
                next_idle = time.monotonic() + idle_every_s
                for key in list(on_idle(dict(pending))):
                    if pending.pop(key, None) is not None:
                        found[key] = None
    finally:
        # A paused partition would stay paused when the consumer is assigned it again.
        if found:
            consumer.resume([TopicPartition(*key) for key in found])
        consumer.unassign()
    return found
