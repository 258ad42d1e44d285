"""Batched sends that leave every partition's last batch with one record (a correct high watermark on Tansu).

The embedded broker (Tansu) sets a partition's high watermark to the *base offset of its last batch + 1*:
after a ten-record batch at offsets 0–9 it reports 1, and the other nine records stay invisible to any
consumer that reads up to the end offsets (Spark's planning, ``bkaudit query``'s tools, an SRE's
``kafka-console-consumer``) until the next write to that partition. Sending one record per batch
(``batch_size=0``) avoids it, at one request per record: the watcher's 1 M-ledger snapshot then takes
~15 minutes, and a lost bookie's thousands of alerts take seconds to publish.

:class:`TailSender` keeps batching and fixes only the end of a burst. It holds back the newest record of
each partition; records before it go out in ordinary (multi-record) batches. :meth:`TailSender.release`
(called when the caller has nothing more to send for now) flushes the producer, so nothing is pending, and
then sends each held record alone: every partition's last batch is that one record, and its high watermark
is exact. Per-partition order is unchanged (the held record is the newest of its partition and goes out
after everything before it). On real Kafka the hold is unnecessary: ``kafka.single_record_tails = false``
sends straight through; with ``producer_batch_size = 0`` every batch is one record anyway and nothing is
held.

Status: stable.

Example:
    >>> class Recorder:  # stands in for KafkaProducer in this doctest
    ...     def __init__(self): self.log = []
    ...     def send(self, topic, *, key, value, partition): self.log.append(value); return Done()
    ...     def flush(self, timeout=None): self.log.append("flush")
    >>> class Done:
    ...     def add_callback(self, *a): pass
    ...     def add_errback(self, *a): pass
    >>> producer = Recorder(); sender = TailSender(producer, hold_tails=True)
    >>> for value in (b"a", b"b", b"c"):
    ...     sender.send("t", key=b"k", value=value, partition=0)
    >>> sender.release(); producer.log
    [b'a', b'b', 'flush', b'c']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Called with the record metadata after the broker acknowledged the record.
OnSuccess = Callable[[Any], None]
#: Called with the exception when the record failed after the producer's retries.
OnError = Callable[[BaseException], None]


@dataclass(slots=True)
class _Held:
    key: bytes | None
    value: bytes
    on_success: OnSuccess | None
    on_error: OnError | None


class TailSender:
    """Sends keyed records to explicit partitions through one kafka-python producer (see the module doc).

    Not thread-safe: one thread sends and releases (the watcher's worker, the sink's batch).

    Example:
        >>> # sender = TailSender(KafkaProducer(...), hold_tails=settings.single_record_tails)
        >>> # sender.send("bkaudit.alerts", key=b"ledger/7", value=payload, partition=3)
        >>> # sender.flush()     # release the held tails and wait for every acknowledgement
    """

    def __init__(self, producer: Any, *, hold_tails: bool) -> None:
        self.producer = producer
        self.hold_tails = hold_tails
        self._held: dict[tuple[str, int], _Held] = {}

    @property
    def holding(self) -> int:
        """How many records are held back (one per partition at most)."""
        return len(self._held)

    def send(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes,
        partition: int,
        on_success: OnSuccess | None = None,
        on_error: OnError | None = None,
    ) -> None:
        """Send a record, or hold it as its partition's tail and send the one it replaces.

        May raise what ``KafkaProducer.send`` raises (e.g. ``KafkaTimeoutError`` when the producer cannot
        take the record); the record passed in is then not held either, so the caller can retry it.
        """
        record = _Held(key, value, on_success, on_error)
        if not self.hold_tails:
            self._send_now(topic, partition, record)
            return
        slot = (topic, partition)
        previous = self._held.get(slot)
        if previous is not None:
            self._send_now(topic, partition, previous)  # raises before the swap: nothing is lost
        self._held[slot] = record

    def release(self, timeout_s: float | None = None) -> None:
        """Flush what was sent, then send every held record alone (one-record batches at the ends).

        Raises ``KafkaTimeoutError`` when the flush does not finish within ``timeout_s``; the held records
        are then kept for the next call.
        """
        if not self._held:
            return
        self.producer.flush(timeout=timeout_s)
        held, self._held = self._held, {}
        for index, ((topic, partition), record) in enumerate(held.items()):
            try:
                self._send_now(topic, partition, record)
            except BaseException:
                # Keep the unsent ones held (in order) for the next release.
                self._held = dict(list(held.items())[index:])
                raise

    def flush(self, timeout_s: float | None = None) -> None:
        """Release the held tails and wait until every record is acknowledged or failed."""
        self.release(timeout_s)
        self.producer.flush(timeout=timeout_s)

    def _send_now(self, topic: str, partition: int, record: _Held) -> None:
        future = self.producer.send(topic, key=record.key, value=record.value, partition=partition)
        if record.on_success is not None:
            future.add_callback(record.on_success)
        if record.on_error is not None:
            future.add_errback(record.on_error)


__all__ = ["TailSender"]
