"""The Kafka source's ``bkaudit.partitionOfKey``: the membership lane plans and reads one partition."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from bkaudit.testing.kafka_io import produce
from connectors.kafka.planner import META, KafkaPlanner
from connectors.kafka.publisher import MEMBERSHIP_PARTITION_KEY, partition_for_key
from connectors.kafka.topics import ensure_topic

pytestmark = pytest.mark.integration

PARTITIONS = 4


def _reader(kafka_settings: Any, topic: str) -> KafkaPlanner:
    return KafkaPlanner(
        {
            "kafka.bootstrap.servers": kafka_settings.bootstrap_servers,
            "subscribe": topic,
            "bkaudit.partitionofkey": MEMBERSHIP_PARTITION_KEY.decode(),
        }
    )


def _rows(reader: KafkaPlanner, start: dict, end: dict) -> list[dict[str, Any]]:
    return [
        row
        for part in reader.partitions(start, end)
        for batch in reader.read(part)
        for row in pa.Table.from_batches([batch]).to_pylist()
    ]


def test_only_the_partition_of_the_key_is_planned_and_read(kafka_settings) -> None:
    topic = "t.partition-of-key"
    ensure_topic(kafka_settings, topic, partitions=PARTITIONS)
    mine = partition_for_key(MEMBERSHIP_PARTITION_KEY, PARTITIONS)
    records = [(b"heartbeat", f"hb-{p}".encode(), p) for p in range(PARTITIONS)]
    records += [(MEMBERSHIP_PARTITION_KEY, b"bookie-lost", mine), (b"ledger/7", b"other", (mine + 1) % 4)]
    produce(kafka_settings, topic, records)
    reader = _reader(kafka_settings, topic)
    try:
        start = reader.initialOffset()
        assert set(start[topic]) == {str(mine)}
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        rows = _rows(reader, start, end)
        assert {row["partition"] for row in rows} == {mine}
        assert sorted(row["value"] for row in rows) == sorted([f"hb-{mine}".encode(), b"bookie-lost"])
    finally:
        reader.stop()


def test_positions_of_every_partition_are_narrowed_without_a_reset(kafka_settings) -> None:
    # A checkpoint written while every partition was read (or another source's offsets): the others are
    # dropped, not taken for partitions that are gone (which would read as a recreated topic).
    topic = "t.partition-of-key-narrowed"
    ensure_topic(kafka_settings, topic, partitions=PARTITIONS)
    mine = partition_for_key(MEMBERSHIP_PARTITION_KEY, PARTITIONS)
    produce(kafka_settings, topic, [(b"heartbeat", b"old", p) for p in range(PARTITIONS)])
    everything = {topic: {str(p): 1 for p in range(PARTITIONS)}}
    produce(kafka_settings, topic, [(MEMBERSHIP_PARTITION_KEY, b"new", mine)])
    reader = _reader(kafka_settings, topic)
    try:
        end = reader.latestOffset(everything, reader.getDefaultReadLimit())
        assert set(end[topic]) == {str(mine)} and end[topic][str(mine)] == 2
        assert "begin" not in end[META]  # read on from our position: no reset to the beginning
    finally:
        reader.stop()
