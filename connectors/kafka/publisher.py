"""Publishes change events (:mod:`core.events`) to Kafka without losing any.

* One librdkafka producer built by :func:`connectors.kafka.client_config.producer_config` (acks=all,
  endless retries, one request in flight per connection so per-key order survives retries), behind a
  :class:`~connectors.kafka.tail_sender.TailSender`: records go out in batches, and the newest record of
  each partition is held until :meth:`ChangePublisher.release_tails`, or the non-blocking
  :meth:`ChangePublisher.start_release_tails` / :meth:`ChangePublisher.finish_release_tails` the watcher
  uses when its queue runs dry, so every partition ends with a one-record batch and the embedded broker's
  high watermark is right.
* The partition is chosen here, with Kafka's default rule for keyed records (murmur2 of the key modulo the
  partition count, as the Java client does), so the watcher knows where each event lands: heartbeats and
  snapshot markers go to every partition explicitly, and each SnapshotEnd carries how many snapshot events
  its partition received.
* Never drop: the publisher caps the records not yet acknowledged (``max_unacked``) and blocks the caller
  at the cap — back-pressure up the watch loop instead of a silent loss. When librdkafka's own queue is full
  for ``max_block_ms`` the publisher keeps retrying until the event is accepted. Delivery reports are
  served by a small thread polling the producer, so acks are counted while the watcher is idle.
* A record that still fails after the producer's retries (delivery timeout) sets
  :attr:`ChangePublisher.failed`; the watcher then publishes a full snapshot once the broker accepts
  records again.
* A topic that lost its data (a broker that restarted empty, a topic deleted and re-created, an unclean
  leader election) shows in the acknowledgements: a partition's offsets go backwards. That sets
  :attr:`ChangePublisher.topic_lost`; the watcher then learns the topic's partitions again
  (:meth:`ChangePublisher.refresh_partitions`) and publishes a full snapshot into the new topic.
* A producer that owes reports for :data:`PRODUCER_STALL_S` while the broker answers metadata requests
  (:meth:`ChangePublisher.stalled_for`) is taken for stuck as well.
* Either way the watcher asks for a new producer (:meth:`ChangePublisher.renew_producer_soon`): a
  librdkafka producer that saw a topic deleted and re-created can keep the old partitions' leader epochs and
  never deliver to the new topic. The publishing thread replaces it before its next send; the old one's
  records (the full snapshot republishes them) are failed and their back-pressure permits returned.

Example:
    >>> partition_for_key(b"ledger/59", 4) in range(4)
    True
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from confluent_kafka import Producer, murmur2

from connectors.kafka.client_config import (
    KafkaTimeout,
    error_text,
    holds_tails,
    kafka_errors,
    partition_count,
    producer_config,
)
from connectors.kafka.tail_sender import TailSender
from connectors.kafka.topics import ensure_topic
from core.events import encode_event, kafka_key, payload_type
from core.pb import change_events_pb2 as pb
from core.settings import KafkaSettings
from core.threadnames import named_target

logger = logging.getLogger(__name__)

#: ``on_delivered(payload_type, event_time_ms, change_time_ms)`` runs on the producer's I/O thread after the
#: broker acked; ``change_time_ms`` is what the caller passed to :meth:`ChangePublisher.publish` (or None).
DeliveredHook = Callable[[str, int, int | None], None]


MEMBERSHIP_PARTITION_KEY = b"cluster"
#: Payloads published to the partition of :data:`MEMBERSHIP_PARTITION_KEY` (see :func:`partition_for_event`).
MEMBERSHIP_PAYLOADS = frozenset({"bookie_status", "bookie_probe"})
#: Records of a partition held and sent together (one batch): the watcher publishes one event at a time, and
#: librdkafka (linger 0) would send each few as a batch of its own. The embedded broker's offset lookups and
#: fetches cost time in proportion to a partition's batches (docs/journal.md, "Why the broker was
#: busy").
HELD_RECORDS_PER_PARTITION = 64

# When a publisher releases its held records (the cadence the watcher keeps, and the replay benchmark's
# writer with it):
#: once nothing more has come to publish for this long: short enough to add nothing visible to a live
#: change's latency, long enough not to interrupt a snapshot's read stream;
TAIL_RELEASE_IDLE_S = 0.002
#: at most this often while changes keep coming. Each release ends every partition with a one-record batch;
#: at a million ledgers, releases every few records left the topic with hundreds of thousands of batches,
#: and the embedded broker's offset lookups and fetches cost time in proportion to a partition's batches
#: (producing 10,000 changes/s with a release every ~2 ms cost it ~0.7 of a core, one every 50 ms 0.06);
TAIL_RELEASE_MIN_INTERVAL_S = 0.02
#: at least this often while records are held, pause or not (the delay holding adds to a change).
TAIL_RELEASE_MAX_INTERVAL_S = 0.05


def partition_for_key(key: bytes, partition_count: int) -> int:
    """Kafka's default partition of a keyed record (``toPositive(murmur2(key)) % partitions``).

    librdkafka's own function (``partitioner=murmur2_random``, the producers' setting), so a record sent
    without an explicit partition lands where this says, as with Java's default partitioner.

    Example:
        >>> partition_for_key(b"cluster", 1)
        0
        >>> [partition_for_key(b"ledger/%d" % i, 8) for i in range(5)] == [
        ...     partition_for_key(b"ledger/%d" % i, 8) for i in range(5)]
        True
    """
    return murmur2(key, partition_count)


def partitions_for_keys(keys: Sequence[bytes], partition_count: int) -> list[int]:
    """:func:`partition_for_key` of many keys (librdkafka's murmur2 in C: ~60 ns a key).

    Example:
        >>> keys = [b"c1/ledger/%d" % i for i in range(100)] + [b"", b"x"]
        >>> partitions_for_keys(keys, 8) == [partition_for_key(k, 8) for k in keys]
        True
    """
    return [murmur2(key, partition_count) for key in keys]


def partition_for_event(event: pb.ChangeEvent, partition_count: int) -> int:
    """The partition of a change event published without an explicit one.

    Membership events (bookie status and liveness probes, like the recovery delay and the rack map keyed
    ``cluster``) all go to the partition of ``cluster``: the lost-bookie rule spans bookies ("more than one
    missing → no delay") and the recovery delay, so the consumer needs them in one total order, which only
    one partition gives; the job's membership lane reads that partition alone. Their key stays the entity
    (``bookie/<id>``).

    Example:
        >>> from core import events
        >>> event = events.EventBuilder("c", "r").build(events.bookie_status("b1:3181", 1))
        >>> partition_for_event(event, 4) == partition_for_key(MEMBERSHIP_PARTITION_KEY, 4)
        True
    """
    key = MEMBERSHIP_PARTITION_KEY if payload_type(event) in MEMBERSHIP_PAYLOADS else kafka_key(event)
    return partition_for_key(key, partition_count)


class ChangePublisher:
    """Sends :class:`~core.pb.change_events_pb2.ChangeEvent` records to one topic.

    ``start()`` creates the topic if absent (``partitions``, default ``settings.topic_partitions``) and learns
    its partition count. ``publish`` is meant to be called from one thread (the watcher's worker).

    Example:
        >>> # publisher = ChangePublisher(kafka_settings, "bkaudit.changes"); publisher.start()
        >>> # partition = publisher.publish(event)          # blocks on back-pressure, never drops
        >>> # publisher.close(timeout_s=30)                 # flushes
    """

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str | None = None,
        *,
        partitions: int | None = None,
        on_delivered: DeliveredHook | None = None,
        producer_factory: Callable[[dict[str, Any]], Any] = Producer,
        max_unacked: int = 10_000,
    ) -> None:
        self.settings = settings
        self.topic = topic or settings.changes_topic
        self._wanted_partitions = partitions
        self._on_delivered = on_delivered
        self._producer_factory = producer_factory
        self._producer: Any = None
        self._sender: TailSender | None = None
        self.partition_count = 0
        self._failed = threading.Event()
        self._stopping = threading.Event()
        self.sent = 0
        self.delivered = 0
        self.delivery_failures = 0
        self._lock = threading.Lock()  # counters touched by the producer's I/O thread
        self._acked: dict[int, int] = {}  # partition → highest offset acknowledged (in this topic's life)
        self._topic_lost: str | None = None
        self._unacked = threading.BoundedSemaphore(max_unacked)
        self._poller: threading.Thread | None = None
        self._renew = threading.Event()  # replace the producer before the next send
        self.producers_replaced = 0
        # The last delivery report, or the send that found nothing outstanding: how long the producer has
        # owed an answer (see stalled_for).
        self._progress_at = time.monotonic()

    def start(self) -> None:
        """Ensure the topic exists and open the producer."""
        self.partition_count = ensure_topic(self.settings, self.topic, self._wanted_partitions)
        self._open_producer()
        logger.info("publishing change events to %s (%d partitions)", self.topic, self.partition_count)

    def _open_producer(self) -> None:
        """A new producer, its sender and its delivery-report thread (a previous one's thread then ends)."""
        # The producer bootstraps on its own (the brokers may have gone since the topic was checked).
        with kafka_errors(self.settings, "opening the producer"):
            self._producer = self._producer_factory(producer_config(self.settings))
        self._sender = TailSender(
            self._producer,
            hold_tails=holds_tails(self.settings),
            max_block_s=self.settings.producer_max_block_ms / 1000,
            reports_polled_elsewhere=True,  # only the poller runs the acks, in the broker's order
            hold_records=HELD_RECORDS_PER_PARTITION,
        )
        self._poller = threading.Thread(
            target=named_target("kafka-delivery", self._serve_delivery_reports),
            args=(self._producer,),
            name="kafka-delivery",
            daemon=True,
        )
        self._poller.start()

    def renew_producer_soon(self) -> None:
        """Replace the producer before the next send (on the publishing thread; callable from any thread).

        For when the topic was lost or records failed: the full snapshot that follows republishes
        everything, so the old producer's undelivered records are failed, not waited for.
        """
        self._renew.set()

    def _renew_if_asked(self) -> None:
        """Replace the producer when :meth:`renew_producer_soon` asked for it (the publishing thread only)."""
        if not self._renew.is_set() or self._producer is None:
            return
        self._renew.clear()
        old_producer, old_sender, old_poller = self._producer, self._sender, self._poller
        self._open_producer()  # the old poller stops: it serves only the current producer
        if old_poller is not None:
            old_poller.join(timeout=1.0)
        replaced = ProducerReplaced("the producer was replaced; a full snapshot republishes its records")
        abandoned = old_sender.abandon(replaced) if old_sender is not None else 0
        queued = len(old_producer)
        old_producer.purge()
        old_producer.flush(PURGE_REPORTS_S)  # runs the purged records' failure reports here
        with self._lock:
            self._acked = {}  # offsets of the new producer's topic start a new life
        self.producers_replaced += 1
        logger.warning(
            "replaced the Kafka producer of %s (%d held and %d queued records left to the full snapshot)",
            self.topic,
            abandoned,
            queued,
        )

    def _serve_delivery_reports(self, producer: Any) -> None:
        """Run the delivery callbacks (acks, failures) as they come, like a client's I/O thread would."""
        while self._producer is producer:
            producer.poll(0.1)

    @property
    def failed(self) -> bool:
        """True once a record was not delivered after the producer's retries (until :meth:`clear_failed`)."""
        return self._failed.is_set()

    @property
    def topic_lost(self) -> bool:
        """True once an acknowledged offset went backwards (the topic lost its data) until taken."""
        return self._topic_lost is not None

    def take_topic_lost(self) -> str | None:
        """What showed the topic's loss (None when it did not happen), and forget it."""
        with self._lock:
            reason, self._topic_lost = self._topic_lost, None
            return reason

    def refresh_partitions(self, timeout_s: float = 10.0) -> int:
        """Learn the topic's partition count again (a recreated topic may have another) and return it.

        The producer's metadata is refreshed too, so explicit partitions of the new count are accepted.
        """
        self.partition_count = ensure_topic(self.settings, self.topic, self._wanted_partitions)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # the producer's metadata request also updates its cache
                if partition_count(self._producer, self.topic, 1.0) == self.partition_count:
                    break
            time.sleep(0.1)
        return self.partition_count

    def _note_acknowledged(self, message: Any) -> None:
        """Count one acknowledged record and check its offset against the partition's last one."""
        partition, offset = message.partition(), message.offset()
        with self._lock:
            self.delivered += 1
            if partition is None or offset is None or offset < 0:  # acks=0: no offset to compare
                return
            previous = self._acked.get(partition, -1)
            if offset > previous:
                self._acked[partition] = offset
                return
            self._acked = {partition: offset}  # the new topic's life starts here
            self._topic_lost = f"partition {partition} acknowledged offset {offset} after offset {previous}"
        logger.warning("topic %s lost its data: %s", self.topic, self._topic_lost)

    def clear_failed(self) -> None:
        """Forget past delivery failures (the watcher calls it when it starts a republishing snapshot)."""
        self._failed.clear()

    def partition_for(self, event: pb.ChangeEvent) -> int:
        """The partition ``event`` goes to when published without an explicit partition.

        See :func:`partition_for_event`.
        """
        return partition_for_event(event, self.partition_count)

    def publish(
        self, event: pb.ChangeEvent, *, partition: int | None = None, change_time_ms: int | None = None
    ) -> int:
        """Send ``event`` (keyed by its entity) and return its partition; blocks while the buffer is full.

        ``change_time_ms`` (when the change happened, e.g. the znode's mtime) is handed back to the
        delivered hook, which can then measure change → Kafka latency.
        """
        key = kafka_key(event)
        if partition is None:
            partition = self.partition_for(event)
        value = encode_event(event)
        kind = payload_type(event)
        event_time_ms = event.event_time_ms
        if self.unacked <= 0:
            self.note_progress()  # nothing was owed until this record
        while not self._unacked.acquire(timeout=1.0):
            if self._stopping.is_set():
                raise KafkaTimeout("shutting down with records still unacknowledged")
            self._renew_if_asked()  # a stalled producer holds every permit: its replacement frees them
            logger.debug("waiting for Kafka to acknowledge earlier records")
        assert self._sender is not None, "start() first"
        while True:
            self._renew_if_asked()
            try:
                self._sender.send(
                    self.topic,
                    key=key,
                    value=value,
                    partition=partition,
                    on_success=partial(self._delivered, kind, event_time_ms, change_time_ms),
                    on_error=partial(self._failed_delivery, kind),
                )
                break
            except KafkaTimeout:
                # The producer's queue stayed full for max_block_ms: the broker is slow or away. Keep blocking
                # the caller (back-pressure) rather than dropping; give up only when shutting down.
                if self._stopping.is_set():
                    self._unacked.release()
                    raise
                logger.warning("Kafka is not accepting records (the producer's queue is full); still trying")
        self.sent += 1
        return partition

    @property
    def holding(self) -> bool:
        """True while records are held back for :meth:`release_tails`."""
        return self._sender is not None and self._sender.holding > 0

    def release_tails(self) -> None:
        """Send the held records, each alone in its batch (call when there is nothing more to publish now).

        Waits for the records sent before them to be acknowledged; blocks while Kafka is away, like
        :meth:`publish` (back-pressure), and gives up only when shutting down.
        """
        while self._sender is not None and self._sender.holding:
            try:
                self._sender.release(timeout_s=1.0)
            except KafkaTimeout:
                if self._stopping.is_set():
                    raise
                logger.debug("waiting for Kafka before sending the held records")

    def start_release_tails(self, on_ready: Callable[[], None]) -> bool:
        """Send the held records but each partition's newest, without waiting; ``on_ready`` runs (on the
        delivery-report thread) when :meth:`finish_release_tails` can send the newest alone. True when the
        release finished at once. May raise like :meth:`publish` (the records then stay held).
        """
        assert self._sender is not None, "start() first"
        self._sender.on_drained = on_ready
        return self._sender.start_release()

    def finish_release_tails(self) -> bool:
        """Send the held newest records alone if the release started earlier is ready (see above)."""
        return self._sender is not None and self._sender.finish_release()

    @property
    def release_pending(self) -> bool:
        """True while a started release waits for earlier records to be acknowledged."""
        return self._sender is not None and self._sender.release_pending

    def _delivered(self, kind: str, event_time_ms: int, change_time_ms: int | None, message: Any) -> None:
        self.note_progress()
        self._unacked.release()
        self._note_acknowledged(message)
        if self._on_delivered is not None:
            self._on_delivered(kind, event_time_ms, change_time_ms)

    def stalled_for(self) -> float:
        """Seconds the producer has owed a delivery report for records handed to it (0 when none are
        outstanding): a broker that is away, or a producer that stopped delivering (see the module doc)."""
        return time.monotonic() - self._progress_at if self.unacked > 0 else 0.0

    def note_progress(self) -> None:
        """Start counting :meth:`stalled_for` again from now (a report came, or a stall was acted on)."""
        self._progress_at = time.monotonic()

    @property
    def unacked(self) -> int:
        """Records handed to the producer and not yet acknowledged (or failed)."""
        return self.sent - self.delivered - self.delivery_failures

    def _failed_delivery(self, kind: str, error: BaseException) -> None:
        self.note_progress()
        self._unacked.release()
        with self._lock:
            self.delivery_failures += 1
        if _purged(error):  # the producer was replaced or closed: known, and republished or reported
            logger.debug("a %s event was abandoned with its producer", kind or "change")
            return
        self._failed.set()
        logger.error("a %s event was not delivered after retries: %s", kind or "change", error_text(error))

    def flush(self, timeout_s: float | None = None) -> None:
        """Send the held records and wait until every record published so far is acknowledged or failed."""
        if self._sender is not None:
            self._sender.flush(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush (bounded by ``timeout_s``) and close the producer."""
        self._stopping.set()
        if self._producer is None:
            return
        started = time.monotonic()
        try:
            assert self._sender is not None
            self._sender.flush(timeout_s)
        except KafkaTimeout:
            logger.error(
                "shutdown: %d change events were not confirmed by Kafka within %.0f s "
                "(the next start publishes a full snapshot)",
                self.sent - self.delivered,
                timeout_s,
            )
        remaining = max(0.0, timeout_s - (time.monotonic() - started))
        producer, self._producer = self._producer, None  # stops the delivery-report thread
        if self._poller is not None:
            self._poller.join(timeout=1.0)
            self._poller = None
        if remaining <= 0 or len(producer):
            producer.purge()  # what was not confirmed in time is abandoned (the next start republishes)
        self._sender = None

    def abort(self) -> None:
        """Make a ``publish`` blocked on a dead broker give up (shutdown)."""
        self._stopping.set()


class ProducerReplaced(Exception):
    """The failure a replaced producer's held records are reported with (they were never sent)."""


#: A producer that has owed delivery reports this long while the broker answers (the topic exists, its
#: partitions are listed) has stopped delivering: a healthy one answers in milliseconds, seconds at worst.
PRODUCER_STALL_S = 30.0
#: How long the replaced producer's purged records' failure reports are waited for.
PURGE_REPORTS_S = 5.0


def _purged(error: BaseException) -> bool:
    """Whether a delivery failure is the publisher's own doing: a replaced producer's records (purged, or
    held and never sent), not a broker's refusal."""
    from confluent_kafka import KafkaError

    if isinstance(error, ProducerReplaced):
        return True
    code = error.args[0].code() if error.args and isinstance(error.args[0], KafkaError) else None
    return code in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)
