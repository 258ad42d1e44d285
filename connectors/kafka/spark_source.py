"""A PySpark Python data source that reads Kafka topics through kafka-python.

Spark's JVM ``kafka`` connector is not obtainable here, so this source gives the same columns
(``key, value, topic, partition, offset, timestamp, timestampType, headers``) from a Python
``DataSourceStreamReader``: one input partition per Kafka partition and offset range, offsets kept in the
query's checkpoint (exactly once across restarts when the sink is idempotent), ``maxOffsetsPerTrigger``
honoured, ``Trigger.AvailableNow`` supported. Partitions added to a topic are read from their start. When a
partition's offsets go backwards (topic deleted and recreated, retention past our position), the
``failOnDataLoss`` option decides: ``true`` (default) stops the query with a clear error, ``false`` resumes
from the earliest available offset.

Options (Spark's names): ``kafka.bootstrap.servers``, ``subscribe`` (comma-separated topics),
``startingOffsets`` (``earliest`` | ``latest`` | JSON ``{"topic": {"0": 42}}``), ``maxOffsetsPerTrigger``,
``failOnDataLoss``. Security settings are not options (they would show in query plans): they come from
the same ``BKAUDIT_KAFKA__*`` settings every other client uses.

Status: first version (foundation issue); the streaming auditor issue extends it.

Example:
    >>> KafkaDataSource.name()
    'bkaudit_kafka'
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from bkaudit.errors import ConfigError, ServiceError

KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers",
            ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
        ),
    ]
)

_ARROW_SCHEMA = pa.schema(
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

# Offsets as Spark checkpoints them: {"topic": {"partition": next offset to read}}.
Offsets = dict[str, dict[str, int]]


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """Offsets ``[start, end)`` of one topic partition: one Spark task."""

    topic: str
    partition: int
    start: int
    end: int


def _kafka_settings(options: dict[str, str]) -> Any:
    from bkaudit.settings import load_settings

    kafka = load_settings().kafka
    servers = options.get("kafka.bootstrap.servers")
    return kafka.model_copy(update={"bootstrap_servers": servers}) if servers else kafka


def _topics(options: dict[str, str]) -> list[str]:
    topics = [t.strip() for t in options.get("subscribe", "").split(",") if t.strip()]
    if not topics:
        raise ConfigError("bkaudit_kafka: option 'subscribe' (comma-separated topics) is required")
    return topics


class _KafkaOffsets:
    """Looks up partition offsets (broker metadata) for the driver-side planning calls."""

    def __init__(self, options: dict[str, str]) -> None:
        from kafka import KafkaConsumer

        from connectors.kafka.client_config import consumer_config

        self._consumer = KafkaConsumer(**consumer_config(_kafka_settings(options), None))

    def _partitions(self, topic: str) -> list[Any]:
        from kafka import TopicPartition

        ids = self._consumer.partitions_for_topic(topic) or set()
        return [TopicPartition(topic, p) for p in sorted(ids)]

    def earliest(self, topics: Sequence[str]) -> Offsets:
        return self._lookup(topics, self._consumer.beginning_offsets)

    def latest(self, topics: Sequence[str]) -> Offsets:
        return self._lookup(topics, self._consumer.end_offsets)

    def _lookup(self, topics: Sequence[str], fetch: Any) -> Offsets:
        result: Offsets = {}
        for topic in topics:
            partitions = self._partitions(topic)
            answered = fetch(partitions) if partitions else {}
            result[topic] = {str(tp.partition): int(answered[tp]) for tp in partitions}
        return result

    def close(self) -> None:
        self._consumer.close()


def _read_range(options: dict[str, str], kafka_range: KafkaRange) -> Iterator[pa.RecordBatch]:
    """Executor side: read one offset range and yield Arrow record batches."""
    from kafka import KafkaConsumer, TopicPartition

    from connectors.kafka.client_config import consumer_config

    if kafka_range.end <= kafka_range.start:
        return
    consumer = KafkaConsumer(**consumer_config(_kafka_settings(options), None))
    try:
        tp = TopicPartition(kafka_range.topic, kafka_range.partition)
        consumer.assign([tp])
        consumer.seek(tp, kafka_range.start)
        position = kafka_range.start
        columns: dict[str, list[Any]] = {name: [] for name in _ARROW_SCHEMA.names}
        idle_polls = 0
        while position < kafka_range.end:
            polled = consumer.poll(timeout_ms=1000, max_records=5000)
            records = polled.get(tp, [])
            if not records:
                idle_polls += 1
                if idle_polls > 60:
                    raise ServiceError(
                        f"bkaudit_kafka: no records from {tp.topic}/{tp.partition} at offset {position} "
                        f"(range ends at {kafka_range.end}) after 60 s"
                    )
                continue
            idle_polls = 0
            for record in records:
                if record.offset >= kafka_range.end:
                    break
                columns["key"].append(record.key)
                columns["value"].append(record.value)
                columns["topic"].append(record.topic)
                columns["partition"].append(record.partition)
                columns["offset"].append(record.offset)
                columns["timestamp"].append(record.timestamp * 1000)
                columns["timestampType"].append(record.timestamp_type)
                columns["headers"].append([{"key": k, "value": v} for k, v in (record.headers or [])])
            position = records[-1].offset + 1
            if len(columns["offset"]) >= 5000 or position >= kafka_range.end:
                yield pa.RecordBatch.from_pydict(columns, schema=_ARROW_SCHEMA)
                columns = {name: [] for name in _ARROW_SCHEMA.names}
    finally:
        consumer.close()


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches over Kafka offsets; see the module docstring for the options."""

    def __init__(self, options: dict[str, str]) -> None:
        self._options = dict(options)
        self._topics = _topics(self._options)
        self._fail_on_data_loss = self._options.get("failondataloss", "true").lower() != "false"
        max_offsets = self._options.get("maxoffsetspertrigger")
        try:
            self._max_offsets = int(max_offsets) if max_offsets else None
        except ValueError:
            raise ConfigError(
                f"bkaudit_kafka: maxOffsetsPerTrigger must be an integer, got {max_offsets!r}"
            ) from None
        self._offsets_client: _KafkaOffsets | None = None
        self._available_now_target: Offsets | None = None

    @property
    def _offsets(self) -> _KafkaOffsets:
        # Created lazily on the driver; never pickled to executors (it holds sockets and locks).
        if self._offsets_client is None:
            self._offsets_client = _KafkaOffsets(self._options)
        return self._offsets_client

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_offsets_client"] = None
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

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self._max_offsets) if self._max_offsets else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_target = self._offsets.latest(self._topics)

    def _checked_start(self, start: Offsets, earliest: Offsets) -> Offsets:
        """Start offsets with new partitions added and data loss handled per ``failOnDataLoss``."""
        checked: Offsets = {}
        for topic in self._topics:
            checked[topic] = {}
            for partition, first_available in earliest.get(topic, {}).items():
                position = start.get(topic, {}).get(partition)
                if position is None:
                    position = first_available  # a partition added since the last batch: read it all
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

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        latest = self._available_now_target or self._offsets.latest(self._topics)
        earliest = self._offsets.earliest(self._topics)
        begin = self._checked_start(start, earliest)
        end: Offsets = {}
        for topic, partitions in begin.items():
            end[topic] = {}
            for partition, position in partitions.items():
                newest = latest.get(topic, {}).get(partition, position)
                if newest < position:
                    if self._fail_on_data_loss:
                        raise ServiceError(
                            f"bkaudit_kafka: {topic}/{partition} ends at {newest}, before our position "
                            f"{position} (topic recreated?); set failOnDataLoss=false to resume from the "
                            "earliest"
                        )
                    newest = position
                end[topic][partition] = newest
        if isinstance(limit, ReadMaxRows):
            end = _cap_rows(begin, end, limit.max_rows)
        return end

    def reportLatestOffset(self) -> dict | None:
        return self._offsets.latest(self._topics)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges: list[InputPartition] = []
        for topic, partitions in end.items():
            for partition, stop in partitions.items():
                begin = start.get(topic, {}).get(partition, 0)
                if stop > begin:
                    ranges.append(KafkaRange(topic, int(partition), int(begin), int(stop)))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange)
        return _read_range(self._options, partition)

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


class KafkaBatchReader(DataSourceReader):
    """Batch read of everything currently in the topics (earliest → latest)."""

    def __init__(self, options: dict[str, str]) -> None:
        self._options = dict(options)
        offsets = _KafkaOffsets(self._options)
        try:
            topics = _topics(self._options)
            self._start = offsets.earliest(topics)
            self._end = offsets.latest(topics)
        finally:
            offsets.close()

    def partitions(self) -> Sequence[InputPartition]:
        return [
            KafkaRange(topic, int(partition), self._start[topic][partition], stop)
            for topic, partitions in self._end.items()
            for partition, stop in partitions.items()
            if stop > self._start[topic][partition]
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange)
        return _read_range(self._options, partition)


def _lowercase_keys(options: Any) -> dict[str, str]:
    # Spark passes options case-insensitively (often lower-cased); we look them up in lower case.
    return {str(key).lower(): str(value) for key, value in dict(options).items()}


class KafkaDataSource(DataSource):
    """``spark.readStream.format("bkaudit_kafka")``: Kafka topics with the built-in source's columns.

    Example:
        >>> # spark.dataSource.register(KafkaDataSource)
        >>> # spark.readStream.format("bkaudit_kafka").option("kafka.bootstrap.servers", "127.0.0.1:9092")
        >>> #     .option("subscribe", "bkaudit.changes").load()
        >>> KafkaDataSource({}).schema().fieldNames()[:3]
        ['key', 'value', 'topic']
    """

    @classmethod
    def name(cls) -> str:
        return "bkaudit_kafka"

    def schema(self) -> StructType:
        return KAFKA_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(_lowercase_keys(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(_lowercase_keys(self.options))
