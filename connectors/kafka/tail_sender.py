"""Batched sends that leave every partition's last batch with one record (a correct high watermark on Tansu).

The embedded broker (Tansu) sets a partition's high watermark to the *base offset of its last batch + 1*:
after a ten-record batch at offsets 0–9 it reports 1, and the other nine records stay invisible to any
consumer that reads up to the end offsets (Spark's planning, ``bkaudit query``'s tools, an SRE's
``kafka-console-consumer``) until the next write to that partition. librdkafka batches like any Kafka
client, so it hits this too. Sending one record per batch (``batch_size=0``) avoids it, at one request per
record: the watcher's 1 M-ledger snapshot then takes many minutes, and a lost bookie's thousands of alerts
take seconds to publish.

:class:`TailSender` keeps batching and fixes only the end of a burst. It holds back the newest record of
each partition; records before it go out in ordinary (multi-record) batches. :meth:`TailSender.release`
(called when the caller has nothing more to send for now) flushes the producer, so nothing is pending, and
then sends each held record alone: every partition's last batch is that one record, and its high watermark
is exact. Per-partition order is unchanged (the held record is the newest of its partition and goes out
after everything before it). On real Kafka the hold is unnecessary: ``kafka.single_record_tails = false``
sends straight through; with ``producer_batch_size = 0`` every batch is one record anyway and nothing is
held.

A full local queue (librdkafka's ``BufferError``) is back-pressure: the sender waits for delivery reports
to free it and tries again, for up to ``max_block_s``, then raises
:class:`~connectors.kafka.client_config.KafkaTimeout`; the record is then neither sent nor held, so the
caller can retry it. Nothing is dropped.

Example:
    >>> class Recorder:  # stands in for confluent_kafka.Producer in this doctest
    ...     def __init__(self): self.log = []
    ...     def produce(self, topic, *, value, key, partition, on_delivery): self.log.append(value)
    ...     def flush(self, timeout=-1): self.log.append("flush"); return 0
    >>> producer = Recorder(); sender = TailSender(producer, hold_tails=True)
    >>> for value in (b"a", b"b", b"c"):
    ...     sender.send("t", key=b"k", value=value, partition=0)
    >>> sender.release(); producer.log
    [b'a', b'b', 'flush', b'c']
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from connectors.kafka.client_config import KafkaTimeout

#: How often a sender whose reports another thread serves looks at the producer's queue (seconds).
_DRAIN_POLL_S = 0.001

#: Called with the delivered ``confluent_kafka.Message`` (its partition and offset) after the broker acked.
OnSuccess = Callable[[Any], None]
#: Called with the exception when the record failed after the producer's retries.
OnError = Callable[[BaseException], None]
#: (topic, partition, key, value)
Record = tuple[str, int, bytes | None, bytes]


@dataclass(slots=True)
class _Held:
    key: bytes | None
    value: bytes
    on_success: OnSuccess | None
    on_error: OnError | None
    on_delivery: Callable[[Any, Any], None] | None = None  # a ready callback (send_batch) wins


class TailSender:
    """Sends keyed records to explicit partitions through one librdkafka producer (see the module doc).

    Not thread-safe: one thread sends and releases (the watcher's worker, the sink's batch). Delivery
    callbacks run wherever the producer is polled. With ``reports_polled_elsewhere`` (the watcher polls on a
    thread of its own) the sender never polls: it waits for the producer's queue to drain instead, so every
    delivery report runs on that one thread, in the order the broker acknowledged. librdkafka hands each
    batch's reports to whichever thread polls first, so two polling threads can run a later batch's reports
    before an earlier one's, and acknowledged offsets then seem to go backwards.

    Example:
        >>> # sender = TailSender(Producer(producer_config(settings)), hold_tails=holds_tails(settings))
        >>> # sender.send("bkaudit.alerts", key=b"ledger/7", value=payload, partition=3)
        >>> # sender.flush()     # release the held tails and wait for every acknowledgement
    """

    def __init__(
        self,
        producer: Any,
        *,
        hold_tails: bool,
        max_block_s: float = 60.0,
        reports_polled_elsewhere: bool = False,
        hold_records: int = 1,
    ) -> None:
        self.producer = producer
        self.hold_tails = hold_tails
        self.max_block_s = max_block_s
        self.reports_polled_elsewhere = reports_polled_elsewhere
        # Up to this many of a partition's newest records wait, and go out together (one batch) when one
        # more comes: a caller that sends records one by one (the watcher) makes fewer, larger batches.
        self.hold_records = max(1, hold_records)
        self._held: dict[tuple[str, int], list[_Held]] = {}
        # Records handed to the producer whose delivery report has not run yet, and a condition the report
        # of the last one notifies: a flush waits on it (reports served elsewhere) instead of polling.
        self._outstanding = 0
        self._drained = threading.Condition(threading.Lock())
        self._release_pending = False  # start_release sent all but the tails; finish_release sends them
        #: Called on the report thread when the last outstanding record's report ran during a pending
        #: release (must not block: e.g. queue a marker for the thread that calls finish_release).
        self.on_drained: Callable[[], None] | None = None

    @property
    def holding(self) -> int:
        """How many records are held back (``hold_records`` per partition at most)."""
        return sum(len(records) for records in self._held.values())

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

        May raise what ``Producer.produce`` raises, or :class:`KafkaTimeout` when the producer's queue stayed
        full for ``max_block_s``; the record passed in is then not held either, so the caller can retry it.
        """
        record = _Held(key, value, on_success, on_error)
        if not self.hold_tails:
            self._send_now(topic, partition, record)
            return
        held = self._held.setdefault((topic, partition), [])
        if len(held) >= self.hold_records:
            self._send_held(topic, partition, held, keep=0)  # raises before the append: nothing is lost
        held.append(record)

    def send_batch(self, records: Sequence[Record], on_delivery: Callable[[Any, Any], None]) -> None:
        """Send many records, all with one delivery callback (``on_delivery(error, message)``), holding the
        newest of each partition as :meth:`send` would; the bulk path (tens of thousands of alerts of a
        lost bookie) without a callback object and a held slot per record.

        Example:
            >>> class Recorder:
            ...     def __init__(self): self.log = []
            ...     def produce(self, topic, *, value, key, partition, on_delivery): self.log.append(value)
            ...     def flush(self, timeout=-1): return 0
            >>> producer = Recorder(); sender = TailSender(producer, hold_tails=True)
            >>> sender.send_batch([("t", 0, b"k", b"a"), ("t", 1, b"k", b"b"), ("t", 0, b"k", b"c")],
            ...                   lambda error, message: None)
            >>> producer.log, sender.holding
            ([b'a'], 2)
        """
        if not self.hold_tails:
            for topic, partition, key, value in records:
                self._produce(topic, partition, key, value, on_delivery)
            return
        last = {(topic, partition): index for index, (topic, partition, _, _) in enumerate(records)}
        for slot in last:  # what was held for a partition goes before its new records
            self._send_held(*slot, self._held.get(slot, []), keep=0)
        for index, (topic, partition, key, value) in enumerate(records):
            if last[(topic, partition)] == index:
                self._held[(topic, partition)] = [_Held(key, value, None, None, on_delivery)]
            else:
                self._produce(topic, partition, key, value, on_delivery)

    def release(self, timeout_s: float | None = None) -> None:
        """Send the held records but each partition's newest, flush, then send each newest alone (one-record
        batches at the ends).

        Raises :class:`KafkaTimeout` when the flush does not finish within ``timeout_s``; the held records
        are then kept for the next call.
        """
        if not self.holding:
            return
        for (topic, partition), held in self._held.items():
            self._send_held(topic, partition, held, keep=1)  # all but each partition's newest, together
        self._flush(timeout_s)
        self._release_pending = False  # this release sends every tail
        for (topic, partition), held in self._held.items():
            self._send_held(topic, partition, held, keep=0)  # the newest, alone in its batch
        self._held = {slot: held for slot, held in self._held.items() if held}

    def start_release(self) -> bool:
        """:meth:`release` without waiting (reports served elsewhere only): send the held records but each
        partition's newest now; :meth:`finish_release` sends the newest once every earlier record's report
        has run. ``on_drained`` (when set) is called, on the report thread, when that moment comes.

        Returns True when the release finished at once (nothing was in flight).

        Example:
            >>> # sender.on_drained = lambda: queue.put("tails")   # then, on the sender's thread:
            >>> # sender.start_release() or ...; later: sender.finish_release()
        """
        if not self.holding:
            return False
        if not self.reports_polled_elsewhere:  # nothing counts the reports: wait here instead
            self.release()
            return True
        for (topic, partition), held in self._held.items():
            self._send_held(topic, partition, held, keep=1)
        with self._drained:
            self._release_pending = True
            drained = self._outstanding <= 0
        return drained and self.finish_release()

    def finish_release(self) -> bool:
        """Send each partition's held record alone, if a release is pending and nothing is in flight.

        A partition that received more records since :meth:`start_release` keeps holding them (sent
        together they would not end with a one-record batch); the next release takes them. Returns True
        when the pending release was finished.
        """
        with self._drained:
            if not self._release_pending or self._outstanding > 0:
                return False
            self._release_pending = False
        for (topic, partition), held in self._held.items():
            if len(held) == 1:
                self._send_held(topic, partition, held, keep=0)  # alone in its batch: nothing in flight
        self._held = {slot: held for slot, held in self._held.items() if held}
        return True

    @property
    def release_pending(self) -> bool:
        """True between :meth:`start_release` and the :meth:`finish_release` that sent the tails."""
        return self._release_pending

    def abandon(self, error: BaseException) -> int:
        """Fail every held record through its callback with ``error`` (they will never be sent: the
        producer is being replaced); returns how many. Records already handed to the producer are the
        producer's to fail (``purge``).

        Example:
            >>> failed = []
            >>> sender = TailSender(object(), hold_tails=True)
            >>> sender.send("t", key=b"k", value=b"v", partition=0, on_error=failed.append)
            >>> sender.abandon(RuntimeError("replaced")), failed, sender.holding
            (1, [RuntimeError('replaced')], 0)
        """
        held, self._held = self._held, {}
        self._release_pending = False
        records = [record for queued in held.values() for record in queued]
        for record in records:
            if record.on_delivery is not None:
                record.on_delivery(KafkaError(KafkaError._PURGE_QUEUE, str(error)), None)
            elif record.on_error is not None:
                record.on_error(error)
        return len(records)

    def _send_held(self, topic: str, partition: int, held: list[_Held], *, keep: int) -> None:
        """Send the oldest held records of a partition, in order, until ``keep`` remain; a record leaves the
        list only once it is handed to the producer (an error keeps the rest held, in order)."""
        while len(held) > keep:
            self._send_now(topic, partition, held[0])
            del held[0]

    def flush(self, timeout_s: float | None = None) -> None:
        """Release the held tails and wait until every record is acknowledged or failed."""
        self.release(timeout_s)
        self._flush(timeout_s)

    def _flush(self, timeout_s: float | None) -> None:
        if self.reports_polled_elsewhere:
            pending = self._wait_drained(timeout_s)
        else:
            pending = self.producer.flush(-1 if timeout_s is None else timeout_s)
        if pending:
            raise KafkaTimeout(f"{pending} records still unacknowledged after {timeout_s} s")

    def _wait_drained(self, timeout_s: float | None) -> int:
        """Wait until every record handed to the producer had its delivery report run (acknowledged or
        failed); returns how many had not when ``timeout_s`` ran out (one wake-up, no polling)."""
        with self._drained:
            self._drained.wait_for(lambda: self._outstanding <= 0, timeout_s)
            return max(self._outstanding, 0)

    def _counted(self, callback: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        """``callback``, then one record fewer outstanding (waking a flush when it was the last)."""

        def report(error: Any, message: Any) -> None:
            try:
                callback(error, message)
            finally:
                with self._drained:
                    self._outstanding -= 1
                    drained = self._outstanding <= 0
                    if drained:
                        self._drained.notify_all()
                    ready = drained and self._release_pending
                if ready and self.on_drained is not None:
                    self.on_drained()

        return report

    def _send_now(self, topic: str, partition: int, record: _Held) -> None:
        callback = record.on_delivery or _delivery_report(record.on_success, record.on_error)
        self._produce(topic, partition, record.key, record.value, callback)

    def _produce(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes,
        callback: Callable[[Any, Any], None],
    ) -> None:
        """Hand one record to the producer. A full local queue is waited out, for up to ``max_block_s``:
        delivery reports free it (served here, unless another thread serves them)."""
        deadline: float | None = None
        counted = self.reports_polled_elsewhere
        if counted:
            callback = self._counted(callback)
        while True:
            try:
                self.producer.produce(topic, value=value, key=key, partition=partition, on_delivery=callback)
                if counted:
                    with self._drained:
                        self._outstanding += 1
                return
            except BufferError:
                now = time.monotonic()
                deadline = now + self.max_block_s if deadline is None else deadline
                if now >= deadline:
                    raise KafkaTimeout(
                        f"the producer's queue stayed full for {self.max_block_s:.0f} s"
                    ) from None
                if self.reports_polled_elsewhere:
                    time.sleep(_DRAIN_POLL_S)
                else:
                    self.producer.poll(0.1)


def _delivery_report(on_success: OnSuccess | None, on_error: OnError | None) -> Callable[[Any, Any], None]:
    def report(error: Any, message: Any) -> None:
        if error is not None:
            if on_error is not None:
                on_error(KafkaException(error))
        elif on_success is not None:
            on_success(message)

    return report


def send_records(producer: Any, settings: Any, records: Sequence[Record]) -> tuple[int, str | None]:
    """Send ``records`` through ``producer`` (one-record tails when the settings ask for them) and wait for
    every acknowledgement; returns (records that failed after the producer's retries, the first failure).

    The one bulk send loop (the sink's alerts and feedback, ``bkaudit alerts republish``).

    Example:
        >>> # failed, first_failure = send_records(Producer(producer_config(s)), s, records)
    """
    from connectors.kafka.client_config import error_text, holds_tails

    failures: list[BaseException] = []
    sender = TailSender(
        producer, hold_tails=holds_tails(settings), max_block_s=settings.producer_max_block_ms / 1000
    )
    sender.send_batch(records, _delivery_report(None, failures.append))
    sender.flush()
    return len(failures), (error_text(failures[0]) if failures else None)


__all__ = ["Record", "TailSender", "send_records"]
