"""The driver-run lanes' planner: one consumer that stays on the lane's partitions.

A planning of :class:`~connectors.kafka.planner.KafkaPlanner` asks the broker for the
partitions' first and end offsets and checks fingerprints, and its batch then reads the ranges with new
consumers: four round trips or more before a loss's record reaches the membership lane (85-240 ms at a
million ledgers on the embedded broker under load, against 15 ms on a quiet machine), and seconds per
planning for the ledger lane, whose fingerprints come from deep in partitions of a million records.
:class:`TailingReader` keeps one consumer at the lane's positions (every partition it reads) instead. Its
fetch waits at the broker for records (``kafka.tail_fetch_wait_ms``; real Kafka answers when a record
arrives, the embedded broker only later, within the wait), and a planning takes the records the consumer
already holds: the batch ends after the last of them in each partition, those records' fingerprints go
into the offset (computed here, nothing fetched) and the batch reads those very records from memory. With
``gather_s``, a planning that got a first record keeps taking records for that long (up to
``max_records``): fewer, larger batches for a lane whose cost is per batch; such a consumer also spaces
its fetches (:data:`FETCHES_PER_GATHER`). A planning whose records the batch would all skip keeps taking
records until one it keeps arrives, for up to ``skipped_gather_s`` (:data:`SKIPPED_GATHER_S`).

The full planning still runs: first, every ``verify_every_s`` (when the consumer holds no record, so a
loss does not wait for it; at the latest three intervals after the last), for ``Trigger.AvailableNow``,
for a replayed batch's range, and whenever the consumer reports an error (offsets gone, a broker error). It
is what tells a recreated or truncated topic, lost data and an outage apart (see the source's docstring), so
a topic recreated *and* grown past our position meanwhile is noticed within three intervals; one whose end
fell below our position is noticed at once (the consumer reports its offsets gone, or its last fetch shows
the partition ending before our position).

Example:
    >>> TailingReader.__name__
    'TailingReader'
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from connectors.kafka.planner import (
    META,
    KafkaPlanner,
    KafkaRange,
    is_skipped,
    kafka_settings_of,
    positions_of,
    record_batch,
    record_fingerprint,
    skipped_key_prefixes,
)

#: A gathering reader (``gather_s`` > 0) fetches a partition at most this often per gather: its records wait
#: for the gather's end anyway. While records stream in, every fetch finds some and the consumer fetches
#: again at once, back to back; the embedded broker's fetch costs time in proportion to the partition's
#: size: at 10,000 records/s into a million-record topic, fetching back to back cost it ~0.6 of a core
#: (docs/journal.md, "The broker's fetches: the tail was the embedded broker's CPU").
FETCHES_PER_GATHER = 5

#: While every record a planning took is one the batch would skip (the membership lane's partition carries
#: the ledger records of the keys that hash to it), the planning keeps taking records for up to this long
#: before it ends a batch; a record the batch keeps ends it at once. A busy cluster's ledger records made
#: the membership lane commit a batch of nothing for every fetch (two fsynced files each; ~11 a second at
#: 10,000 changes/s).
SKIPPED_GATHER_S = 1.0

Positions = dict[tuple[str, int], int]


class TailingReader:
    """A :class:`KafkaPlanner` whose plannings between full ones come from a tailing consumer."""

    def __init__(
        self,
        reader: KafkaPlanner,
        *,
        wait_s: float,
        verify_every_s: float = 5.0,
        max_records: int = 5000,
        gather_s: float = 0.0,
        skipped_gather_s: float = SKIPPED_GATHER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reader = reader
        self._clock = clock  # when full plannings are due (tests step it; waits keep the real clock)
        self._wait_s = wait_s
        self._verify_every_s = verify_every_s
        self._max_records = max_records
        self._gather_s = gather_s
        self._skipped_gather_s = skipped_gather_s
        self._skipped = skipped_key_prefixes(reader.options)
        self._consumer: Any = None
        self._at: Positions | None = None  # where the consumer is: (topic, partition) → offset
        self._connection_lost = False  # the consumer lost its broker connection: plan in full before tailing
        self._unconfirmed = False  # the last full planning could not check a position: no consumer there
        self._behind = False  # a partition's backlog outgrew what the consumer delivered: catch up in full
        self._verified_at = float("-inf")
        self._available_now = False
        self.enabled = True  # False: every planning is the full one
        self._held: dict[tuple[str, int, int, int], list[Any]] = {}  # planned ranges' records
        self.tail_plannings = 0  # plannings answered from the consumer (a metric)
        self.full_plannings = 0

    # -- the reader's face --------------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        return self._reader.initialOffset()

    def getDefaultReadLimit(self) -> Any:
        return self._reader.getDefaultReadLimit()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True
        self._reader.prepareForTriggerAvailableNow()

    @property
    def waits_for_records(self) -> bool:
        """Whether a planning itself waits (up to ``wait_s``) for a record: the lane then plans again at
        once after a batch instead of sleeping out its interval."""
        return self.enabled and not self._available_now

    def latestOffset(self, start: dict, limit: Any) -> dict:
        position = _positions(start)
        if self.waits_for_records and position and position == self._at:
            since = self._clock() - self._verified_at
            # A full planning that is due waits while records are there to hand over (a loss does not
            # wait for it), but never past three intervals.
            if self._behind:
                end = None
            elif since < self._verify_every_s:
                end = self._tail(start, limit, self._wait_s)
            elif since < 3 * self._verify_every_s:
                end = self._tail(start, limit, 0.0, only_records=True)
            else:
                end = None
            if end is not None:
                return end
            if self._consumer is None:  # the consumer failed: do not spin on a failing broker
                return self._full_after_failure(start, limit)
        if self.waits_for_records and self._unconfirmed:  # nor while a topic is away
            return self._full_after_failure(start, limit)
        return self._full(start, limit)

    def _full_after_failure(self, start: dict, limit: Any) -> dict:
        end = self._full(start, limit)
        if end == start:
            time.sleep(self._wait_s)
        return end

    def partitions(self, start: dict, end: dict) -> Sequence[Any]:
        return self._reader.partitions(start, end)

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange)
        held = self._held.pop((partition.topic, partition.partition, partition.start, partition.end), None)
        if held is None:
            return self._reader.read(partition)
        return iter([record_batch(held, self._skipped)])

    def commit(self, end: dict) -> None:
        self._reader.commit(end)

    def stop(self) -> None:
        self._close_consumer()
        self._reader.stop()

    # -- planning -----------------------------------------------------------------------------------------
    def _full(self, start: dict, limit: Any) -> dict:
        self.full_plannings += 1
        self._held.clear()
        self._behind = False
        end = self._reader.latestOffset(start, limit)
        self._verified_at = self._clock()
        before, after = _positions(start), _positions(end)
        self._unconfirmed = not all(self._confirmed(key, offset, before) for key, offset in after.items())
        if self._unconfirmed:
            # A position the planning could not check against the broker (its topic absent, or ending
            # before it): a consumer there would read a recreated topic from the middle once it grew past
            # it. Plan in full until the planning sees the topic again.
            self._close_consumer()
        else:
            self._follow(after)
        return end

    def _confirmed(self, key: tuple[str, int], offset: int, before: Positions) -> bool:
        """Whether the consumer may start at ``offset``: nothing before it, records this planning read up to
        it, or the planning saw the partition there."""
        return offset == 0 or before.get(key) != offset or self._reader.confirmed(*key)

    def _tail(self, start: dict, limit: Any, wait_s: float, *, only_records: bool = False) -> dict | None:
        """The next batch's end from the consumer's records (waiting up to ``wait_s`` for one); ``start``
        when it has none; None when the consumer reported an error (it is closed then), or when it has none
        and ``only_records`` (the caller plans in full)."""
        assert self._at is not None
        records = self._poll(limit, wait_s)
        if records is None or self._connection_lost or (not records and not self._still_in_range()):
            self._close_consumer()
            return None
        if not records and only_records:
            return None
        self.tail_plannings += 1
        if not records:
            self._behind = self._fell_behind({})
            return start
        by_partition: dict[tuple[str, int], list[Any]] = {}
        for record in records:
            by_partition.setdefault((record.topic(), record.partition()), []).append(record)
        ends: dict[str, dict[str, int]] = {}
        for (topic, partition), offset in self._at.items():
            ends.setdefault(topic, {})[str(partition)] = offset
        fingerprints = {t: dict(f) for t, f in (start.get(META) or {}).get("fingerprints", {}).items()}
        held = {}
        for (topic, partition), taken in by_partition.items():
            last, offset = taken[-1], self._at[(topic, partition)]
            stop = last.offset() + 1
            held[(topic, partition, offset, stop)] = taken
            self._at[(topic, partition)] = ends[topic][str(partition)] = stop
            fingerprints.setdefault(topic, {})[str(partition)] = record_fingerprint(
                last.offset(), last.timestamp()[1], last.key(), last.value()
            )
        self._held = held
        self._behind = self._fell_behind(by_partition)
        return {**ends, META: {"fingerprints": fingerprints}}

    def _poll(self, limit: Any, wait_s: float) -> list[Any] | None:
        """The records the consumer has (waiting up to ``wait_s`` for the first, then gathering for up to
        ``gather_s``), at most the read limit, in each partition's order; None on any error."""
        most = min(self._max_records, getattr(limit, "max_rows", None) or self._max_records)
        first = self._consumer.poll(wait_s)
        if first is None:
            return []
        messages = [first]
        deadline = time.monotonic() + self._gather_s
        while len(messages) < most:
            remaining = max(0.0, deadline - time.monotonic())
            more = self._consumer.consume(num_messages=most - len(messages), timeout=remaining)
            messages.extend(more)
            if remaining <= 0:
                break
        if self._skipped:
            self._gather_skipped(messages, most)
        if any(m.error() is not None for m in messages) or self._connection_lost:
            return None
        return messages

    def _gather_skipped(self, messages: list[Any], most: int) -> None:
        """While every record in ``messages`` is one the batch skips, add what comes next (for up to
        ``skipped_gather_s``, at most ``most`` in all); returns as soon as a record to keep (or an error)
        arrives."""
        deadline = time.monotonic() + self._skipped_gather_s
        latest = messages
        while len(messages) < most and self._all_skipped(latest):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            latest = self._consumer.consume(num_messages=most - len(messages), timeout=0)
            if not latest:
                record = self._consumer.poll(remaining)
                if record is None:
                    return
                latest = [record]
            messages.extend(latest)

    def _all_skipped(self, records: list[Any]) -> bool:
        return all(r.error() is None and is_skipped(r, self._skipped) for r in records)

    def _fell_behind(self, delivered: dict[tuple[str, int], list[Any]]) -> bool:
        """Whether a partition's backlog (its end as the last fetch response gave it) is larger than what
        the consumer delivered of it in this batch, and than :data:`BEHIND_MIN_RECORDS`.

        On the embedded broker, a consumer that spaces its fetches can fall behind on one partition of a
        large topic while it keeps up with the others; records there would wait for the next full planning
        (tens of seconds). The full planning reads such a backlog in bulk, up to the read limit."""
        return any(
            high - offset > max(BEHIND_MIN_RECORDS, len(delivered.get(key, ())))
            for key, offset, _, high in self._fetched_watermarks()
        )

    def _still_in_range(self) -> bool:
        """Whether every position lies within its partition's offsets as their last fetch responses gave
        them. A broker may answer a fetch past the end with no records and no error."""
        return all(
            high < 0 or low <= offset <= high  # negative: no fetch answered yet
            for _, offset, low, high in self._fetched_watermarks()
        )

    def _fetched_watermarks(self) -> Iterator[tuple[tuple[str, int], int, int, int]]:
        """(partition, the consumer's position, low, high) for every partition it reads, the watermarks as
        its last fetch response gave them (no broker call)."""
        from confluent_kafka import TopicPartition

        assert self._at is not None
        for (topic, partition), offset in self._at.items():
            low, high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
            yield (topic, partition), offset, low, high

    def _follow(self, positions: Positions) -> None:
        """Put the consumer at ``positions`` (none: nothing to tail)."""
        if not positions:
            self._close_consumer()
            return
        if self._at == positions and self._consumer is not None:
            return
        from confluent_kafka import Consumer, TopicPartition

        from connectors.kafka.client_config import consumer_config

        if self._consumer is None:
            settings = kafka_settings_of(self._reader.options)
            # No automatic reset: offsets that vanished are an error, which sends us to the full planning.
            config = {**consumer_config(settings, None), "auto.offset.reset": "error"}
            fetching = consumer_fetch_options(self._gather_s, settings.tail_fetch_wait_ms)
            self._connection_lost = False
            self._consumer = Consumer({**config, **fetching, "error_cb": self._on_client_error})
        self._consumer.assign([TopicPartition(t, p, o) for (t, p), o in sorted(positions.items())])
        self._at = dict(positions)

    def _on_client_error(self, error: Any) -> None:
        """librdkafka's client-level errors (served during ``poll``). A lost connection may be a broker
        that comes back without its data: the consumer would go on fetching at its offsets in a recreated
        topic as soon as it grew past them, with no error. The records it holds are dropped and the
        planning runs in full (it checks the record before each position) before it tails again."""
        from confluent_kafka import KafkaError

        if error.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
            self._connection_lost = True
            self._reader.broker_lost(error.str())

    def _close_consumer(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
        self._consumer, self._at = None, None
        self._connection_lost = False


#: A tailing planning sends the next one to the full planning when a partition's backlog exceeds both what
#: the batch delivered of it and this many records.
BEHIND_MIN_RECORDS = 1000


def consumer_fetch_options(gather_s: float, wait_ms: int) -> dict[str, Any]:
    """librdkafka options of a tailing consumer that gathers for ``gather_s`` (0: hands records on at once)
    and whose fetches wait ``wait_ms`` at the broker for records.

    A gathering consumer holds a partition's next fetch back while records it fetched are still queued
    (``queued.min.messages`` 1), for a fifth of the gather (``fetch.queue.backoff.ms``).

    Example:
        >>> consumer_fetch_options(0.0, 50)
        {'fetch.wait.max.ms': 50}
        >>> consumer_fetch_options(1.0, 50)
        {'fetch.wait.max.ms': 50, 'queued.min.messages': 1, 'fetch.queue.backoff.ms': 200}
    """
    options: dict[str, Any] = {"fetch.wait.max.ms": wait_ms}
    if gather_s > 0:
        options["queued.min.messages"] = 1
        options["fetch.queue.backoff.ms"] = max(1, round(gather_s * 1000 / FETCHES_PER_GATHER))
    return options


def _positions(offset: dict) -> Positions:
    """``(topic, partition) → offset`` of every partition an offset names.

    Example:
        >>> _positions({"t": {"2": 40}, META: {}}), _positions({"t": {"0": 1, "1": 2}})
        ({('t', 2): 40}, {('t', 0): 1, ('t', 1): 2})
    """
    return {(t, int(p)): int(o) for t, ps in positions_of(offset).items() for p, o in ps.items()}


__all__ = ["FETCHES_PER_GATHER", "SKIPPED_GATHER_S", "TailingReader", "consumer_fetch_options"]
