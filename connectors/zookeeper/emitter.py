"""The watcher's emitter: payloads become change events on the changes topic, in the worker's order.

Every recipe of the watcher (:mod:`connectors.zookeeper.watcher`) is given :meth:`Emitter.emit` and nothing
else to publish with. The emitter wraps a payload in its envelope (cluster, run id, sequence, event time:
:class:`~core.events.EventBuilder`), hands it to :class:`~connectors.kafka.publisher.ChangePublisher` (keyed
by entity; back-pressure instead of drops), counts it by payload type, and inside a snapshot bracket counts
it for its partition: the bracket's END tells each partition how many events it carried. Snapshot markers
and heartbeats go to every partition (:meth:`Emitter.emit_everywhere`, :meth:`Emitter.heartbeats`).

Runs on the watcher's worker thread only.

Example:
    >>> from prometheus_client import CollectorRegistry, Counter
    >>> class Publisher:
    ...     partition_count = 2
    ...     def publish(self, event, *, partition=None, change_time_ms=None):
    ...         return 0 if partition is None else partition
    >>> counter = Counter("events", "events", ["type"], registry=CollectorRegistry())
    >>> emitter = Emitter(Publisher(), events.EventBuilder("cluster-1", "run-1"), counter)
    >>> emitter.emit(events.recovery_delay(30, present=True), None); emitter.published
    1
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from connectors.kafka.publisher import ChangePublisher
from connectors.zookeeper.snapshot import Snapshot
from core import events
from core.pb import change_events_pb2 as pb

#: What recipes are given to publish with: ``emit(payload, snapshot or None)``.
Emit = Callable[[events.Payload, Snapshot | None], None]


class Emitter:
    """Builds and publishes the watcher's events; ``counter`` is the events-by-type metric family."""

    def __init__(self, publisher: ChangePublisher | Any, builder: events.EventBuilder, counter: Any) -> None:
        self.publisher = publisher
        self.builder = builder
        self._counter = counter
        self._counters: dict[str, Any] = {}
        self.published = 0  # events handed to the publisher

    def emit(self, payload: events.Payload, snapshot: Snapshot | None) -> None:
        """Publish one entity event (inside ``snapshot``'s bracket when given)."""
        event = self.builder.build(payload, snapshot_id=snapshot.snapshot_id if snapshot is not None else "")
        change_time_ms = None
        if snapshot is None and isinstance(payload, pb.LedgerUpserted):
            change_time_ms = payload.znode.mtime_ms  # the live change's latency is measured to its ack
        partition = self.publisher.publish(event, change_time_ms=change_time_ms)
        if snapshot is not None:
            snapshot.partition_events[partition] += 1
        self._count(event)

    def emit_everywhere(self, make: Callable[[int, int], events.Payload], snapshot: Snapshot | None) -> None:
        """Publish ``make(partition, partition_count)`` to every partition (snapshot markers)."""
        snapshot_id = snapshot.snapshot_id if snapshot is not None else ""
        count = self.publisher.partition_count
        for partition in range(count):
            event = self.builder.build(make(partition, count), snapshot_id=snapshot_id)
            self.publisher.publish(event, partition=partition)
            self._count(event)

    def heartbeats(self, last_zxid: int) -> int:
        """A heartbeat on every partition, at the watcher's clock now; returns that time (ms)."""
        now_ms = self.builder.now_ms()
        count = self.publisher.partition_count
        for partition in range(count):
            payload = events.heartbeat(
                now_ms, partition=partition, partition_count=count, last_zxid=last_zxid
            )
            self.publisher.publish(self.builder.build(payload, event_time_ms=now_ms), partition=partition)
        self._counter.labels("heartbeat").inc(count)
        self.published += count
        return now_ms

    def _count(self, event: pb.ChangeEvent) -> None:
        kind = events.payload_type(event)
        counter = self._counters.get(kind)
        if counter is None:
            counter = self._counters[kind] = self._counter.labels(kind)
        counter.inc()
        self.published += 1
