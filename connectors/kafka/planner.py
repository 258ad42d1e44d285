"""Micro-batches planned over Kafka topics and read through librdkafka (confluent-kafka), without Spark.

:class:`KafkaPlanner` plans each batch as a range of offsets per partition (``key, value, topic, partition,
offset, timestamp, timestampType, headers`` as Arrow, :data:`ARROW_RECORD_SCHEMA`) and reads the ranges;
the driver-run lanes (:mod:`streaming.driver_batches`, through
:class:`~connectors.kafka.tail_reader.TailingReader`) use it directly, and
:mod:`connectors.kafka.spark_source` adapts it to a Spark data source for the timers query. It speaks the
protocol of Spark's ``DataSourceStreamReader`` (``initialOffset``, ``latestOffset``, ``partitions``,
``read``, ``commit``), so one planner serves both: offsets are kept by the caller's checkpoint (exactly
once across restarts when the sink is idempotent), ``maxOffsetsPerTrigger`` honoured, an available-now run
supported. Partitions added to a topic are read from their start.

**Topic identity.** Offsets alone cannot tell a topic from its recreation once the new one has grown past
our position (a broker that lost its data, a topic deleted and re-created). Each checkpointed offset
therefore carries, per partition, a fingerprint of the last record before it (offset, timestamp, CRC-32 of
key and value), re-checked when planning: on the first planning after a start and whenever new records
arrived. A fingerprint that no longer matches, a partition that disappeared, or an end offset below our
position means the topic was recreated or truncated: the source then reads the topic again from its
beginning (the batch's start is recorded in its end offset, so a replayed batch reads the same range),
logs one WARNING and counts the reset; the watcher publishes a full snapshot into the new topic, from
which the job recovers. Records lost to retention before we read them (earliest offset past our position,
same topic) are the ``failOnDataLoss`` option's business: ``true`` (default) stops the query with one
clear error, ``false`` resumes from the earliest available offset.

**Broker outages.** Every broker call of the planning (offsets, fingerprints) and the executors' reads
retry with exponential back-off (0.5 s doubling to 30 s) for up to ``bkaudit.brokerOutageLimitS``
seconds (default 600) before the query stops with one ``ServiceError`` line. While retrying, the source
keeps a small status file (option ``bkaudit.statusFile``) that :class:`SourceStatusCollector` turns into
metrics in the driver's registry.

Options (Spark's names): ``kafka.bootstrap.servers``, ``subscribe`` (comma-separated topics),
``startingOffsets`` (``earliest`` | ``latest`` | JSON ``{"topic": {"0": 42}}``), ``maxOffsetsPerTrigger``,
``failOnDataLoss``, ``kafka.request.timeout.ms`` (default: the setting), and bkaudit's own
``bkaudit.brokerOutageLimitS``, ``bkaudit.statusFile``, ``bkaudit.skipKeyPrefixes``,
``bkaudit.partitionOfKey`` (read only the partition Kafka's default partitioner gives this key, in each
topic, as the partition count is now; the membership lane reads the one partition its events share) and
``bkaudit.availableNowTopics`` (under an available-now trigger, only these topics stop at their ends as of
the start; the others are read as they grow).
Security settings
are not options (they would show in query plans): they come from the same ``BKAUDIT_KAFKA__*`` settings
every other client uses.

Example:
    >>> planner = KafkaPlanner({"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "bkaudit.changes",
    ...                         "maxoffsetspertrigger": "1000"})
    >>> planner.getDefaultReadLimit()
    RowLimit(max_rows=1000)
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from connectors.kafka.offsets import list_offsets, records_at
from core.errors import ConfigError, ServiceError

ARROW_RECORD_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)

# Offsets as Spark checkpoints them: {"topic": {"partition": next offset to read}}, plus the META entry.
Offsets = dict[str, dict[str, int]]
# Per-partition record fingerprints: {"topic": {"partition": fingerprint}}.
Fingerprints = dict[str, dict[str, str]]

#: Key of the source's own bookkeeping inside a checkpointed offset (``@`` is not legal in a topic name):
#: ``{"fingerprints": {topic: {partition: fingerprint}}, "begin": {topic: {partition: first offset}}}``.
#: ``fingerprints`` identify the record before each position; ``begin`` is where the batch ending at this
#: offset started when that is not the previous batch's end (a reset, a new partition, skipped data).
META = "@bkaudit"

DEFAULT_OUTAGE_LIMIT_S = 600.0
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
#: While a fingerprint fetch waits, how often the partitions' ends are looked up again.
END_CHECK_EVERY_S = 1.0
#: Plannings in a row that may find a topic shorter than the ends they planned by (a broker that lost
#: its data between the two reads) before the planning stops with one line.
REPLANS = 3

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KafkaRange:
    """Offsets ``[start, end)`` of one topic partition: one read (one Spark task under the adapter)."""

    topic: str
    partition: int
    start: int
    end: int
    outage_limit_s: float = DEFAULT_OUTAGE_LIMIT_S


def positions_of(offset: dict) -> Offsets:
    """The ``{topic: {partition: offset}}`` part of a checkpointed offset (without :data:`META`).

    Example:
        >>> positions_of({"t": {"0": 5}, META: {"fingerprints": {}}})
        {'t': {'0': 5}}
    """
    return {topic: partitions for topic, partitions in offset.items() if topic != META}


def _meta(offset: dict, entry: str) -> dict[str, dict[str, Any]]:
    meta = offset.get(META)
    return dict(meta.get(entry, {})) if isinstance(meta, dict) else {}


def record_fingerprint(offset: int, timestamp_ms: int, key: bytes | None, value: bytes | None) -> str:
    """What identifies one record of a topic: its offset, timestamp and a CRC-32 of key and value.

    A recreated topic that has grown past our position holds a different record at the same offset
    (another time, other bytes), which this tells apart without topic ids (the embedded broker forgets
    them with its data).

    Example:
        >>> record_fingerprint(41, 1700000000000, b"ledger/1", b"v")
        '41:1700000000000:9ba05dc9'
    """
    crc = zlib.crc32(value or b"", zlib.crc32(b"\x00", zlib.crc32(key or b"")))
    return f"{offset}:{timestamp_ms}:{crc:08x}"


def kafka_settings_of(options: dict[str, str]) -> Any:
    """The Kafka settings a reader with these options uses (the settings, with the options' overrides)."""
    from core.settings import load_settings

    kafka = load_settings().kafka
    update: dict[str, Any] = {}
    if options.get("kafka.bootstrap.servers"):
        update["bootstrap_servers"] = options["kafka.bootstrap.servers"]
    if options.get("kafka.request.timeout.ms"):
        update["request_timeout_ms"] = _number(options, "kafka.request.timeout.ms", int)
    return kafka.model_copy(update=update) if update else kafka


def _number(options: dict[str, str], name: str, kind: Any) -> Any:
    try:
        value = kind(options[name])
    except ValueError:
        raise ConfigError(f"bkaudit_kafka: option {name} must be a number, got {options[name]!r}") from None
    if value <= 0:
        raise ConfigError(f"bkaudit_kafka: option {name} must be positive, got {options[name]!r}")
    return value


def outage_limit_s(options: dict[str, str]) -> float:
    name = "bkaudit.brokeroutagelimits"
    return float(_number(options, name, float)) if options.get(name) else DEFAULT_OUTAGE_LIMIT_S


def skipped_key_prefixes(options: dict[str, str]) -> tuple[bytes, ...]:
    """Option ``bkaudit.skipKeyPrefixes``: records whose key starts with one of these (comma-separated) are
    read past and never become rows (the job's membership lane skips every ``ledger/`` record this way).

    Example:
        >>> skipped_key_prefixes({"bkaudit.skipkeyprefixes": "ledger/, x"}), skipped_key_prefixes({})
        ((b'ledger/', b'x'), ())
    """
    text = options.get("bkaudit.skipkeyprefixes", "")
    return tuple(part.strip().encode() for part in text.split(",") if part.strip())


def is_skipped(record: Any, skipped: tuple[bytes, ...]) -> bool:
    """Whether a librdkafka message is read past: its key starts with one of ``skipped``
    (:func:`skipped_key_prefixes`). A message without a key (an error report) never is.

    Example:
        >>> class Message:
        ...     def key(self): return b"ledger/7"
        >>> is_skipped(Message(), (b"ledger/",)), is_skipped(Message(), ())
        (True, False)
    """
    return bool(skipped) and (record.key() or b"").startswith(skipped)


def partition_of_key(options: dict[str, str]) -> bytes | None:
    """Option ``bkaudit.partitionOfKey``: only the partition of this key is planned and read.

    Example:
        >>> partition_of_key({"bkaudit.partitionofkey": "cluster"}), partition_of_key({})
        (b'cluster', None)
    """
    key = options.get("bkaudit.partitionofkey", "").strip()
    return key.encode() if key else None


def topics_of(options: dict[str, str]) -> list[str]:
    """The topics of the ``subscribe`` option.

    Example:
        >>> topics_of({"subscribe": "a, b"})
        ['a', 'b']
    """
    topics = [t.strip() for t in options.get("subscribe", "").split(",") if t.strip()]
    if not topics:
        raise ConfigError("bkaudit_kafka: option 'subscribe' (comma-separated topics) is required")
    return topics


class SourceStatus:
    """The planning side's outage and reset counts, kept in a small JSON file the driver's metrics read.

    The source's planning runs in a Python process Spark starts for it, not in the job's own process, so
    its state reaches ``/metrics`` through this file (written only when something changes: an outage
    starts or ends, a retry, a reset). No path: nothing is written.

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "status.json"
        >>> status = SourceStatus(str(path))
        >>> status.retrying(1000.0); status.reset("t", "recreated")
        >>> data = json.loads(path.read_text())
        >>> data["unavailable_since"], data["retries"], data["resets"]
        (1000.0, 1, {'t': 1})
        >>> status.retrying(1010.0)  # a later report of the same outage
        >>> json.loads(path.read_text())["unavailable_since"]
        1000.0
    """

    def __init__(self, path: str | None) -> None:
        self._path = Path(path) if path else None
        self._data: dict[str, Any] = {"unavailable_since": None, "retries": 0, "resets": {}}
        if self._path is not None and self._path.exists():
            with contextlib.suppress(ValueError, OSError):
                self._data.update(json.loads(self._path.read_text()))
        self._data["unavailable_since"] = None

    def retrying(self, since: float) -> None:
        """One retry of an outage that began at ``since`` (an earlier report of the same outage wins)."""
        current = self._data["unavailable_since"]
        self._data["unavailable_since"] = since if current is None else min(float(current), since)
        self._data["retries"] = int(self._data["retries"]) + 1
        self._write()

    def available(self) -> None:
        if self._data["unavailable_since"] is not None:
            self._data["unavailable_since"] = None
            self._write()

    def reset(self, topic: str, reason: str) -> None:
        resets = self._data["resets"]
        resets[topic] = int(resets.get(topic, 0)) + 1
        self._data["last_reset"] = {"topic": topic, "reason": reason, "at": time.time()}
        self._write()

    def _write(self) -> None:
        if self._path is None:
            return
        with contextlib.suppress(OSError):  # metrics must never stop the audit
            self._path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self._path.with_suffix(".tmp")
            temporary.write_text(json.dumps(self._data, sort_keys=True))
            temporary.replace(self._path)


def with_backoff(
    action: str,
    call: Callable[[], Any],
    *,
    limit_s: float,
    servers: str,
    status: SourceStatus | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Any:
    """``call()``, retried with exponential back-off while Kafka fails, for up to ``limit_s`` seconds.

    A broker that hangs or restarts makes the client raise after its request timeout (30 s by default);
    the job rides that out instead of dying, and stops with one :class:`ServiceError` line only when the
    outage lasts longer than the limit.

    Example:
        >>> from connectors.kafka.client_config import KafkaTimeout
        >>> answers = iter([KafkaTimeout("hung"), KafkaTimeout("hung"), 42])
        >>> def call():
        ...     answer = next(answers)
        ...     if isinstance(answer, Exception):
        ...         raise answer
        ...     return answer
        >>> with_backoff("reading offsets", call, limit_s=60, servers="k1:9092", sleep=lambda s: None)
        42
    """
    from confluent_kafka import KafkaException

    from connectors.kafka.client_config import configuration_error, error_text

    started: float | None = None
    delay = BACKOFF_FIRST_S
    while True:
        try:
            result = call()
        except KafkaException as err:
            refused = configuration_error(err)
            if refused is not None:
                raise refused from None  # no outage: waiting would not change the answer
            now = clock()
            started = now if started is None else started
            waited = now - started
            if waited >= limit_s:
                raise ServiceError(
                    f"bkaudit_kafka: Kafka at {servers} failed {action} for {waited:.0f} s, longer than "
                    f"stream.broker_outage_limit_s ({limit_s:.0f} s): {error_text(err)}; check the "
                    "brokers, then start the job again"
                ) from None
            if status is not None:
                status.retrying(time.time() - waited)
            logger.warning(
                "Kafka at %s: %s failed (%s); retrying in %.1f s (outage %.0f s of %.0f s allowed)",
                servers,
                action,
                error_text(err),
                delay,
                waited,
                limit_s,
            )
            sleep(min(delay, max(0.0, limit_s - waited)))
            delay = min(delay * 2, BACKOFF_MAX_S)
            continue
        if started is not None:
            logger.warning("Kafka at %s: %s works again after %.0f s", servers, action, clock() - started)
        if status is not None:
            status.available()  # also ends an outage a tailing consumer reported (broker_lost)
        return result


class _EndsVanished(Exception):
    """The ends a planning read are gone from the topic before the planning finished."""


class KafkaOffsets:
    """Looks up partition offsets and fingerprints (broker metadata) for the driver-side planning calls."""

    def __init__(self, options: dict[str, str], status: SourceStatus | None = None) -> None:
        self._settings = kafka_settings_of(options)
        self._limit_s = outage_limit_s(options)
        self._status = status
        self._only_key = partition_of_key(options)
        # Metadata and offsets only: a broker answers one connection's requests in order, and a fetch may
        # hold the connection for up to fetch.wait.max.ms (500 ms), so fingerprints are fetched by a
        # client of their own per call (closing it does not wait for its last fetch).
        self._consumer: Any = self._retrying("connecting", self._connect)

    def _connect(self) -> Any:
        from confluent_kafka import Consumer

        from connectors.kafka.client_config import consumer_config

        consumer = Consumer(consumer_config(self._settings, None))
        consumer.list_topics(timeout=self._timeout_s)  # raises while no broker answers: retried
        return consumer

    @property
    def _timeout_s(self) -> float:
        return self._settings.request_timeout_ms / 1000.0

    def _retrying(self, action: str, call: Callable[[], Any]) -> Any:
        return with_backoff(
            action, call, limit_s=self._limit_s, servers=self._settings.bootstrap_servers, status=self._status
        )

    def earliest(self, topics: Sequence[str]) -> Offsets:
        return self._retrying("reading the earliest offsets", lambda: self._lookup(topics, low=True))

    def latest(self, topics: Sequence[str]) -> Offsets:
        """The end offsets, from fresh metadata (a recreated topic may have another partition count)."""
        return self._retrying("reading the latest offsets", lambda: self._lookup(topics, low=False))

    def _lookup(self, topics: Sequence[str], *, low: bool, every_partition: bool = False) -> Offsets:
        """The first (``low``) or the end offsets of the planned partitions of ``topics`` (every partition
        with ``every_partition``), from one ``ListOffsets`` request; ``{}`` for a topic that is not there."""
        found = list_offsets(
            self._consumer,
            topics,
            low=low,
            timeout_s=self._timeout_s,
            partitions=lambda ids: self._partitions(ids, every=every_partition),
        )
        return {topic: {str(p): offset for p, offset in found.get(topic, {}).items()} for topic in topics}

    def _partitions(self, ids: list[int], *, every: bool = False) -> list[int]:
        """The partitions to plan: all, or the one of ``bkaudit.partitionOfKey`` (murmur2, as Java's and our
        producers place keyed records) unless ``every``."""
        if self._only_key is None or not ids or every:
            return ids
        from connectors.kafka.publisher import partition_for_key

        return [partition_for_key(self._only_key, len(ids))]

    def fingerprints(self, wanted: dict[tuple[str, str], int]) -> dict[tuple[str, str], str | None]:
        """The fingerprint of the record at each ``(topic, partition) → offset``; None: no record there.

        A broker that does not answer within the request timeout is retried (back-off, outage limit):
        "no answer" is never taken for "another record".
        """
        if not wanted:
            return {}
        return self._retrying("reading record fingerprints", lambda: self._fetch_fingerprints(wanted))

    def _fetch_fingerprints(self, wanted: dict[tuple[str, str], int]) -> dict[tuple[str, str], str | None]:
        from confluent_kafka import Consumer

        from connectors.kafka.client_config import KafkaTimeout, consumer_config

        by_key = {(topic, int(partition)): offset for (topic, partition), offset in wanted.items()}
        fetcher: Any = Consumer(consumer_config(self._settings, None))
        try:
            found = records_at(
                fetcher,
                by_key,
                timeout_s=self._timeout_s,
                on_idle=self.ending_at_or_before,  # no record to wait for past a partition's end
                idle_every_s=END_CHECK_EVERY_S,
            )
        finally:
            fetcher.close()
        if len(found) < len(by_key):
            raise KafkaTimeout(f"no record fetched from {len(by_key) - len(found)} partitions")
        return {
            (topic, str(partition)): (
                record_fingerprint(message.offset(), message.timestamp()[1], message.key(), message.value())
                if message is not None and message.offset() == by_key[(topic, partition)]
                else None  # the broker's next record is later: none at that offset
            )
            for (topic, partition), message in found.items()
        }

    def ending_at_or_before(self, wanted: dict[tuple[str, int], int]) -> list[tuple[str, int]]:
        """The partitions whose log now ends at or before the wanted offset, or that are gone from a topic
        that is there: no record is there to wait for (the broker came back without its data, perhaps
        with another partition count, after the ends were read). Every partition is looked up, not only
        the one a key-filtered reader plans (a key may map to another partition now). A broker that does
        not answer, or a topic absent right now, says nothing here.

        Example:
            >>> # offsets.ending_at_or_before({("changes", 0): 175})  → [("changes", 0)] after a data loss
        """
        from confluent_kafka import KafkaException

        try:
            ends = self._lookup(sorted({topic for topic, _ in wanted}), low=False, every_partition=True)
        except KafkaException:
            return []
        return [
            (topic, partition)
            for (topic, partition), offset in wanted.items()
            if ends.get(topic) and ends[topic].get(str(partition), offset) <= offset
        ]

    def close(self) -> None:
        self._consumer.close()


def read_range(options: dict[str, str], kafka_range: KafkaRange) -> Iterator[pa.RecordBatch]:
    """Executor side: read one offset range and yield Arrow record batches.

    A broker that stops answering is waited for (librdkafka reconnects by itself) up to the range's
    outage limit; then the task fails with one line.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from connectors.kafka.client_config import consumer_config

    if kafka_range.end <= kafka_range.start:
        return
    settings = kafka_settings_of(options)
    skipped = skipped_key_prefixes(options)
    # No automatic reset: a range whose offsets vanished must not be filled with another topic's records
    # ("error" reports it as an _AUTO_OFFSET_RESET error instead).
    config = {**consumer_config(settings, None), "auto.offset.reset": "error"}
    consumer = with_backoff(
        "connecting",
        lambda: Consumer(config),
        limit_s=kafka_range.outage_limit_s,
        servers=settings.bootstrap_servers,
    )
    try:
        consumer.assign([TopicPartition(kafka_range.topic, kafka_range.partition, kafka_range.start)])
        position = kafka_range.start
        pending: list[Any] = []
        idle_since: float | None = None
        next_end_check = time.monotonic() + END_CHECK_EVERY_S
        while position < kafka_range.end:
            # consume() waits for num_messages or the timeout: ask for no more than the range still holds.
            messages = consumer.consume(num_messages=min(5000, kafka_range.end - position), timeout=1.0)
            if any(_offsets_gone(m, KafkaError) for m in messages):
                _warn_range_gone(kafka_range, position)
                break
            records = [m for m in messages if m.error() is None]
            if not records:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() >= next_end_check:
                    next_end_check = time.monotonic() + END_CHECK_EVERY_S
                    if _range_vanished(consumer, kafka_range, settings.request_timeout_ms / 1000.0):
                        _warn_range_gone(kafka_range, position)
                        break
                if time.monotonic() - idle_since > kafka_range.outage_limit_s:
                    raise ServiceError(
                        f"bkaudit_kafka: no records from {kafka_range.topic}/{kafka_range.partition} at "
                        f"offset {position} (range ends at {kafka_range.end}) for "
                        f"{kafka_range.outage_limit_s:.0f} s (stream.broker_outage_limit_s); check the "
                        "brokers, then start the job again"
                    )
                continue
            idle_since = None
            pending.extend(r for r in records if r.offset() < kafka_range.end)
            position = records[-1].offset() + 1
            if len(pending) >= 5000 or position >= kafka_range.end:
                yield record_batch(pending, skipped)
                pending = []
        if pending:
            yield record_batch(pending, skipped)
    finally:
        consumer.close()


def record_batch(records: Sequence[Any], skipped: tuple[bytes, ...] = ()) -> pa.RecordBatch:
    """librdkafka messages as :data:`ARROW_RECORD_SCHEMA` rows, less those whose key starts with one of
    ``skipped``.

    Example:
        >>> record_batch([]).num_rows
        0
    """
    columns: dict[str, list[Any]] = {name: [] for name in ARROW_RECORD_SCHEMA.names}
    for record in records:
        if is_skipped(record, skipped):
            continue
        timestamp_type, timestamp_ms = record.timestamp()
        columns["key"].append(record.key())
        columns["value"].append(record.value())
        columns["topic"].append(record.topic())
        columns["partition"].append(record.partition())
        columns["offset"].append(record.offset())
        columns["timestamp"].append(timestamp_ms * 1000)
        columns["timestampType"].append(_SPARK_TIMESTAMP_TYPES.get(timestamp_type, 0))
        columns["headers"].append([{"key": k, "value": v} for k, v in (record.headers() or [])])
    return pa.RecordBatch.from_pydict(columns, schema=ARROW_RECORD_SCHEMA)


#: librdkafka's timestamp types → Spark's ``timestampType`` column (0 CreateTime, 1 LogAppendTime).
_SPARK_TIMESTAMP_TYPES = {1: 0, 2: 1}


def _offsets_gone(message: Any, kafka_error: Any) -> bool:
    """Whether ``message`` reports that the range's next offset is no longer on the broker."""
    error = message.error()
    return error is not None and error.code() in (
        kafka_error._AUTO_OFFSET_RESET,
        kafka_error.OFFSET_OUT_OF_RANGE,
    )


def _range_vanished(consumer: Any, kafka_range: KafkaRange, timeout_s: float) -> bool:
    """Whether the range's partition is gone or now ends before the range does: its records were lost (a
    broker back without its data, the topic recreated) and will not come. A planned range never ends past
    the partition's end, which only grows while the topic keeps its data. The embedded broker answers a
    fetch past the end with no records instead of ``OFFSET_OUT_OF_RANGE``, so without this the task waited
    for the new topic to grow that far. A broker that does not answer, or a topic absent right now, says
    nothing here."""
    from confluent_kafka import KafkaException, TopicPartition

    try:
        described = consumer.list_topics(kafka_range.topic, timeout=timeout_s).topics.get(kafka_range.topic)
        if described is None or described.error is not None:
            return False
        if kafka_range.partition not in described.partitions:
            return True
        # The high watermark of this consumer's last fetch response, not a ListOffsets answer: the embedded
        # broker's ListOffsets lags after a multi-record batch, and a range planned from a tailing
        # consumer may end past it while every record is there.
        _, end = consumer.get_watermark_offsets(
            TopicPartition(kafka_range.topic, kafka_range.partition), cached=True
        )
    except KafkaException:
        return False
    return end is not None and 0 <= end < kafka_range.end


def _warn_range_gone(kafka_range: KafkaRange, position: int) -> None:
    """The broker no longer has the rest of a planned range (the topic was recreated or truncated while
    the batch read it): what it had is gone, and the next planning, seeing the new topic, reads it from
    its beginning (where the watcher's full snapshot lands)."""
    logger.warning(
        "bkaudit_kafka: %s/%d has no offset %d any more (range %d..%d): the topic was recreated or "
        "truncated while this batch read it; the next planning reads the new topic from its beginning",
        kafka_range.topic,
        kafka_range.partition,
        position,
        kafka_range.start,
        kafka_range.end - 1,
    )


@dataclass(frozen=True)
class RowLimit:
    """How many records a batch may take (None: all available); Spark's ``ReadMaxRows`` has the same
    ``max_rows``."""

    max_rows: int | None


class KafkaPlanner:
    """Plans micro-batches over Kafka offsets and reads them; see the module docstring for the options."""

    def __init__(self, options: dict[str, str]) -> None:
        self._options = dict(options)
        self._topics = topics_of(self._options)
        self._fail_on_data_loss = self._options.get("failondataloss", "true").lower() != "false"
        self._outage_limit_s = outage_limit_s(self._options)
        max_offsets = self._options.get("maxoffsetspertrigger")
        try:
            self._max_offsets = int(max_offsets) if max_offsets else None
        except ValueError:
            raise ConfigError(
                f"bkaudit_kafka: maxOffsetsPerTrigger must be an integer, got {max_offsets!r}"
            ) from None
        self._offsets_client: KafkaOffsets | None = None
        self._status: SourceStatus | None = None
        self._available_now_target: Offsets | None = None
        self._verified: dict[tuple[str, str], int] = {}  # positions whose fingerprint matched (this process)
        self._unseen: set[tuple[str, str]] = set()  # partitions the last planning could not see reach its end

    @property
    def options(self) -> dict[str, str]:
        """The source options (lower-case names), as given."""
        return dict(self._options)

    @property
    def _offsets(self) -> KafkaOffsets:
        # Created lazily on the driver; never pickled to executors (it holds sockets and locks).
        if self._offsets_client is None:
            self._status = SourceStatus(self._options.get("bkaudit.statusfile"))
            self._offsets_client = KafkaOffsets(self._options, self._status)
        return self._offsets_client

    def broker_lost(self, reason: str) -> None:
        """A consumer tailing for this planner lost its broker: one retry, and an outage until the next
        broker call of the planning succeeds (the ``bkaudit_stream_broker_*`` metrics, as the planning's
        own retries count)."""
        status = self._status
        if status is None:
            return  # nothing planned yet, so no consumer either
        logger.warning(
            "Kafka at %s: the tailing consumer lost the broker (%s); planning in full until it answers",
            self._options.get("kafka.bootstrap.servers", "?"),
            reason,
        )
        status.retrying(time.time())

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_offsets_client"] = None
        state["_status"] = None
        return state

    def initialOffset(self) -> dict:
        starting = self._options.get("startingoffsets", "earliest")
        if starting == "earliest":
            return self._offsets.earliest(self._topics)
        if starting == "latest":
            return self._offsets.latest(self._topics)
        try:
            parsed = json.loads(starting)
            return {t: {str(p): int(o) for p, o in parsed[t].items()} for t in self._topics}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ConfigError(
                "bkaudit_kafka: startingOffsets must be 'earliest', 'latest' or JSON "
                '{"topic": {"0": 42}} naming every subscribed topic'
            ) from None

    def getDefaultReadLimit(self) -> RowLimit:
        """At most ``maxOffsetsPerTrigger`` records a batch (``max_rows`` None: all available)."""
        return RowLimit(self._max_offsets)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_target = self._offsets.latest(self._topics)

    def _latest(self) -> Offsets:
        """The ends to plan up to: the available-now target, or the topics' ends now. With
        ``bkaudit.availableNowTopics`` the target holds only for those topics; the others are read to their
        ends now (the driver-run ledger lane: the changes available at its start, and every decision the
        timers query relays until the run settles)."""
        target = self._available_now_target
        if target is None:
            return self._offsets.latest(self._topics)
        only = [t for t in self._options.get("bkaudit.availablenowtopics", "").split(",") if t]
        live = self._offsets.latest(self._topics) if only else {}
        return {**live, **{t: dict(ps) for t, ps in target.items() if not only or t in only}}

    def _recreated_topics(
        self, positions: Offsets, fingerprints: Fingerprints, latest: Offsets, earliest: Offsets
    ) -> dict[str, str]:
        """Topics whose identity changed since ``positions`` were checkpointed, with the evidence."""
        changed: dict[str, str] = {}
        to_verify: dict[tuple[str, str], int] = {}
        behind: dict[tuple[str, str], str] = {}
        for topic in self._topics:
            ours, now = positions.get(topic, {}), latest.get(topic, {})
            if not ours or not now:
                continue  # first planning, or the topic is absent right now: nothing to compare or read
            gone = sorted(set(ours) - set(now), key=int)
            if gone:
                changed[topic] = (
                    f"partitions {','.join(gone)} are gone ({len(ours)} partitions before, {len(now)} now)"
                )
                continue
            for p in (p for p in ours if now[p] < ours[p]):
                # Truncated, unless the record before our position is still the one read: the embedded
                # broker's end offset lags after a multi-record batch while its fetches serve the whole
                # batch (a tailing reader's position can be past it).
                behind[(topic, p)] = f"partition {p} ends at offset {now[p]}, before our position {ours[p]}"
                to_verify[(topic, p)] = ours[p] - 1
            if any(t == topic for t, _ in behind):
                continue
            # New partitions may be a topic recreated wider, whose old partitions hold other records up to
            # our very positions: verify those again before the new ones are read.
            widened = bool(set(now) - set(ours))
            for partition, position in ours.items():
                expected = fingerprints.get(topic, {}).get(partition)
                verified = self._verified.get((topic, partition)) == position and not widened
                retained = earliest.get(topic, {}).get(partition, 0) < position  # else: retention's business
                if expected and retained and (not verified or now[partition] > position):
                    to_verify[(topic, partition)] = position - 1
        found = self._offsets.fingerprints(to_verify)
        for (topic, partition), offset in sorted(to_verify.items()):
            expected = fingerprints.get(topic, {}).get(partition)
            if expected is not None and found.get((topic, partition)) == expected:
                self._verified[(topic, partition)] = offset + 1
                if (topic, partition) in behind:
                    latest[topic][partition] = offset + 1  # the same topic: nothing new past our position
            elif topic not in changed:
                changed[topic] = behind.get((topic, partition)) or (
                    f"the record at offset {offset} of partition {partition} is not the one read before "
                    f"({found.get((topic, partition)) or 'no record'} instead of {expected})"
                )
        return changed

    def _report_reset(self, topic: str, reason: str) -> None:
        logger.warning(
            "bkaudit_kafka: topic %s was recreated or truncated (%s): reading it again from its beginning; "
            "the watcher republishes a full snapshot into it (if the alerts topic lost its history too, run "
            "`bkaudit alerts republish`)",
            topic,
            reason,
        )
        if self._status is not None:
            self._status.reset(topic, reason)

    def _checked_start(
        self, start: Offsets, earliest: Offsets, resets: dict[str, str] | None = None
    ) -> Offsets:
        """Start offsets with new partitions added, reset topics from their beginning, data loss handled
        per ``failOnDataLoss``."""
        checked: Offsets = {}
        for topic in self._topics:
            checked[topic] = {}
            for partition, first_available in earliest.get(topic, {}).items():
                position = start.get(topic, {}).get(partition)
                if position is None or topic in (resets or {}):
                    position = first_available  # a new partition, or a recreated topic: read it all
                elif position < first_available:
                    if self._fail_on_data_loss:
                        raise ServiceError(
                            f"bkaudit_kafka: {topic}/{partition} lost offsets "
                            f"{position}..{first_available - 1} (retention or topic recreation); "
                            "set failOnDataLoss=false to resume from the earliest"
                        )
                    position = first_available
                checked[topic][partition] = position
        return checked

    def latestOffset(self, start: dict, limit: Any) -> dict:
        """The end of the next batch from ``start``: at most ``limit.max_rows`` records (a
        :class:`RowLimit`, or Spark's ``ReadMaxRows``; without ``max_rows``: all available)."""
        max_rows = getattr(limit, "max_rows", None)
        for _ in range(REPLANS):
            try:
                return self._plan(start, max_rows)
            except _EndsVanished as vanished:
                logger.warning("bkaudit_kafka: %s; planning again from fresh offsets", vanished)
                if self._available_now_target is not None:
                    self._available_now_target = self._offsets.latest(self._topics)
        raise ServiceError(
            f"bkaudit_kafka: the subscribed topics lost records under {REPLANS} plannings in a row "
            "(a broker losing its data again and again?); check the brokers, then start the job again"
        )

    def _plan(self, start: dict, max_rows: int | None) -> dict:
        positions = positions_of(start)
        latest = self._latest()
        earliest = self._offsets.earliest(self._topics)
        if partition_of_key(self._options) is not None:
            # One partition is read; positions of others (another partition count before) are not ours.
            positions = {
                t: {p: o for p, o in ps.items() if p in latest.get(t, ps)} for t, ps in positions.items()
            }
        resets = self._recreated_topics(positions, _meta(start, "fingerprints"), latest, earliest)
        for topic, reason in resets.items():
            self._report_reset(topic, reason)
        begin = self._checked_start(positions, earliest, resets)
        self._unseen = set()
        for topic in self._topics:
            if positions.get(topic) and not latest.get(topic):
                # Absent right now (a broker back without its data, the topic not recreated yet): keep
                # our positions, so its recreation is recognised and reported instead of read as new.
                begin[topic] = dict(positions[topic])
                self._unseen.update((topic, partition) for partition in positions[topic])
        end: Offsets = {}
        for topic, partitions in begin.items():
            end[topic] = {}
            for partition, position in partitions.items():
                newest = latest.get(topic, {}).get(partition, position)
                if newest < position:
                    if self._fail_on_data_loss:
                        raise ServiceError(
                            f"bkaudit_kafka: {topic}/{partition} ends at {newest}, before our position "
                            f"{position}; set failOnDataLoss=false to resume from the earliest"
                        )
                    newest = position
                    self._unseen.add((topic, partition))
                end[topic][partition] = newest
        if max_rows:
            end = _cap_rows(begin, end, max_rows)
        if end == positions and begin == positions and not resets:
            return start  # nothing new: the very same offset, so Spark plans no batch
        return {**end, META: self._bookkeeping(start, positions, begin, end, resets)}

    def _bookkeeping(
        self, start: dict, positions: Offsets, begin: Offsets, end: Offsets, resets: dict[str, str]
    ) -> dict[str, Any]:
        """The META entry of the offset ending at ``end``: fingerprints, and begins that are not the start."""
        carried = _meta(start, "fingerprints")
        fingerprints: Fingerprints = {}
        wanted: dict[tuple[str, str], int] = {}
        for topic, partitions in end.items():
            fingerprints[topic] = {}
            for partition, stop in partitions.items():
                old = carried.get(topic, {}).get(partition)
                if stop == positions.get(topic, {}).get(partition) and topic not in resets and old:
                    fingerprints[topic][partition] = old
                elif stop > 0:
                    wanted[(topic, partition)] = stop - 1
        found = self._offsets.fingerprints(wanted)
        self._refuse_vanished_ends(wanted, found)
        for (topic, partition), fingerprint in found.items():
            if fingerprint is not None:
                fingerprints[topic][partition] = fingerprint
                self._verified[(topic, partition)] = end[topic][partition]
        moved: Offsets = {}
        for topic, partitions in begin.items():
            for partition, first in partitions.items():
                if positions.get(topic, {}).get(partition) != first:
                    moved.setdefault(topic, {})[partition] = first
        meta: dict[str, Any] = {"fingerprints": {t: f for t, f in fingerprints.items() if f}}
        if moved:
            meta["begin"] = moved
        return meta

    def _refuse_vanished_ends(
        self, wanted: dict[tuple[str, str], int], found: dict[tuple[str, str], str | None]
    ) -> None:
        """A planned end with no record, in a partition that now ends before it: the ends were read from
        a topic that has since lost its data. Planning by them would read the new topic from the middle
        and keep no fingerprint to notice it later, so the plan is refused (and made again)."""
        absent = {(t, int(p)): offset for (t, p), offset in wanted.items() if found.get((t, p)) is None}
        if not absent:
            return
        shorter = self._offsets.ending_at_or_before(absent)
        if shorter:
            topic, partition = shorter[0]
            raise _EndsVanished(
                f"{topic}/{partition} now ends at or before offset {absent[(topic, partition)]}, the last "
                "record planned"
            )

    def reportLatestOffset(self) -> dict | None:
        return self._offsets.latest(self._topics)

    def partitions(self, start: dict, end: dict) -> Sequence[KafkaRange]:
        """The batch from ``start`` to ``end``: one range per partition with records in it."""
        ranges: list[KafkaRange] = []
        positions, begins = positions_of(start), _meta(end, "begin")
        for topic, partitions in positions_of(end).items():
            for partition, stop in partitions.items():
                begin = begins.get(topic, {}).get(partition, positions.get(topic, {}).get(partition, 0))
                if stop > begin:
                    ranges.append(
                        KafkaRange(topic, int(partition), int(begin), int(stop), self._outage_limit_s)
                    )
        return ranges

    def read(self, partition: KafkaRange) -> Iterator[pa.RecordBatch]:
        return read_range(self._options, partition)

    def confirmed(self, topic: str, partition: int) -> bool:
        """Whether the last planning saw ``partition`` reach its planned end: not when the topic was absent
        (a broker back without its data) or the partition ended before it. A consumer started there then
        would read a recreated topic from the middle once it grew past that offset."""
        return (topic, str(partition)) not in self._unseen

    def commit(self, end: dict) -> None:
        """Offsets live in Spark's checkpoint; nothing is committed to Kafka."""

    def stop(self) -> None:
        if self._offsets_client is not None:
            self._offsets_client.close()
            self._offsets_client = None


def _cap_rows(start: Offsets, end: Offsets, max_rows: int) -> Offsets:
    """Spread ``max_rows`` over partitions in proportion to their backlog (at least one row each)."""
    backlog = {(t, p): end[t][p] - start[t].get(p, 0) for t in end for p in end[t]}
    total = sum(backlog.values())
    if total <= max_rows:
        return end
    capped: Offsets = {t: dict(ps) for t, ps in end.items()}
    for (topic, partition), pending in backlog.items():
        share = max(1, pending * max_rows // total) if pending else 0
        capped[topic][partition] = start[topic].get(partition, 0) + min(pending, share)
    return capped


class SourceStatusCollector:
    """Prometheus collector over :class:`SourceStatus`'s file, registered in the job's registry.

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "status.json"
        >>> SourceStatus(str(path)).retrying(time.time() - 5)
        >>> samples = {s.name: s.value for m in SourceStatusCollector(path).collect() for s in m.samples}
        >>> samples["bkaudit_stream_broker_retries_total"]
        1.0
        >>> samples["bkaudit_stream_broker_unavailable_seconds"] >= 5
        True
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path  # None: no source status (yet): every sample is 0

    def _read(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            return dict(json.loads(self.path.read_text()))
        except (OSError, ValueError):
            return {}

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        data = self._read()
        since = data.get("unavailable_since")
        outage = GaugeMetricFamily(
            "bkaudit_stream_broker_unavailable_seconds",
            "how long the source's planning has been retrying an unreachable or hung broker (0: reachable)",
        )
        outage.add_metric([], max(0.0, time.time() - float(since)) if since else 0.0)
        yield outage
        yield CounterMetricFamily(
            "bkaudit_stream_broker_retries",
            "broker calls of the source's planning retried after a Kafka error (back-off)",
            value=float(data.get("retries", 0)),
        )
        resets = CounterMetricFamily(
            "bkaudit_stream_source_resets",
            "topics found recreated or truncated and read again from their beginning, by topic",
            labels=["topic"],
        )
        for topic, count in sorted(dict(data.get("resets", {})).items()):
            resets.add_metric([topic], float(count))
        yield resets
