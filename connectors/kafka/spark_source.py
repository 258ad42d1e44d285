"""``spark.readStream.format("bkaudit_kafka")``: Kafka topics as a PySpark Python data source.

Spark's JVM ``kafka`` connector is not obtainable here, so this source gives the same columns
(``key, value, topic, partition, offset, timestamp, timestampType, headers``) from a Python
``DataSourceStreamReader``: a thin adapter over :class:`~connectors.kafka.planner.KafkaPlanner`, which
plans the batches (offsets, topic identity, broker outages, read limits; its module docstring has the
options) and reads each range as one Spark task. The timers query reads the decisions topic with it.

Example:
    >>> KafkaDataSource.name()
    'bkaudit_kafka'
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
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

from connectors.kafka.planner import KafkaOffsets, KafkaPlanner, KafkaRange, read_range, topics_of

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


@dataclass(frozen=True)
class SparkKafkaRange(KafkaRange, InputPartition):
    """A :class:`~connectors.kafka.planner.KafkaRange` as Spark's input partition: one Spark task."""

    @classmethod
    def of(cls, kafka_range: KafkaRange) -> SparkKafkaRange:
        return cls(**{field.name: getattr(kafka_range, field.name) for field in fields(kafka_range)})


class KafkaStreamReader(KafkaPlanner, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The planner as Spark's stream reader: Spark's read limits and input partitions, nothing else."""

    def getDefaultReadLimit(self) -> ReadLimit:  # type: ignore[override]
        max_rows = super().getDefaultReadLimit().max_rows
        return ReadMaxRows(max_rows) if max_rows else ReadAllAvailable()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:  # type: ignore[override]
        return [SparkKafkaRange.of(kafka_range) for kafka_range in super().partitions(start, end)]

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange)
        return read_range(self.options, partition)


class KafkaBatchReader(DataSourceReader):
    """Batch read of everything currently in the topics (earliest → latest)."""

    def __init__(self, options: dict[str, str]) -> None:
        self._options = dict(options)
        offsets = KafkaOffsets(self._options)
        try:
            topics = topics_of(self._options)
            self._start = offsets.earliest(topics)
            self._end = offsets.latest(topics)
        finally:
            offsets.close()

    def partitions(self) -> Sequence[InputPartition]:
        return [
            SparkKafkaRange(topic, int(partition), self._start[topic][partition], stop)
            for topic, partitions in self._end.items()
            for partition, stop in partitions.items()
            if stop > self._start[topic][partition]
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange)
        return read_range(self._options, partition)


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
