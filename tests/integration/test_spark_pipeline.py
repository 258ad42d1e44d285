"""A real streaming query: broker → bkaudit_kafka Python data source → foreachBatch → Delta (deltalake)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

from bkaudit.testing.kafka_io import produce
from connectors.kafka.spark_source import KafkaDataSource
from connectors.kafka.topics import ensure_topic

pytestmark = pytest.mark.integration


def append_batch(path: str, data: pa.Table, *, app_id: str, batch_id: int) -> bool:
    """Append ``data`` unless batch ``batch_id`` of ``app_id`` is already in the Delta table (a replayed
    ``foreachBatch`` call writes nothing); True when written."""
    try:
        done = DeltaTable(path).transaction_version(app_id)
    except TableNotFoundError:
        done = None
    if done is not None and done >= batch_id:
        return False
    properties = CommitProperties(app_transactions=[Transaction(app_id, batch_id)])
    write_deltalake(path, data, mode="append", commit_properties=properties)
    return True


def read_table(path: str) -> pa.Table:
    return DeltaTable(path).to_pyarrow_table()


def _produce(settings, topic: str, start: int, count: int) -> None:
    # One record per batch: exact high watermarks on the embedded broker (TailSender has no headers).
    records = [(f"k{i % 3}".encode(), f"{i}".encode()) for i in range(start, start + count)]
    produce(settings, topic, records, headers=[("h", b"x")])


def _run_to_delta(
    spark, settings, topic: str, checkpoint: str, table: str, *, available_now: bool = True, **options: str
) -> int:
    """Run the query until the backlog is processed; returns the number of micro-batches that had rows.

    ``available_now`` uses Trigger.AvailableNow (Spark reads everything in one go for Python sources);
    otherwise a processing-time trigger runs until ``processAllAvailable`` returns.
    """
    spark.dataSource.register(KafkaDataSource)
    reader = (
        spark.readStream.format("bkaudit_kafka")
        .option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .option("subscribe", topic)
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    frame = reader.load().selectExpr(
        "CAST(key AS STRING) AS key",
        "CAST(value AS STRING) AS value",
        "partition",
        "offset",
        "timestamp",
        "headers",
    )
    batches_with_rows: list[int] = []

    def write(batch_frame, batch_id: int) -> None:
        rows = batch_frame.toArrow()
        if rows.num_rows:
            batches_with_rows.append(batch_id)
            table_rows = pa.table(
                {
                    "key": rows.column("key"),
                    "value": rows.column("value"),
                    "partition": rows.column("partition"),
                    "offset": rows.column("offset"),
                }
            )
            append_batch(table, table_rows, app_id="test-pipeline", batch_id=batch_id)

    writer = frame.writeStream.foreachBatch(write).option("checkpointLocation", checkpoint)
    if available_now:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination(120)
    else:
        query = writer.trigger(processingTime="0 seconds").start()
        query.processAllAvailable()
        query.stop()
    assert query.exception() is None, query.exception()
    return len(batches_with_rows)


def test_streaming_query_reads_the_broker_and_writes_delta_exactly_once(spark, kafka_settings, tmp_path):
    topic = kafka_settings.changes_topic
    ensure_topic(kafka_settings, topic, partitions=2)
    _produce(kafka_settings, topic, 0, 50)
    checkpoint, table = str(tmp_path / "checkpoint"), str(tmp_path / "table")

    _run_to_delta(spark, kafka_settings, topic, checkpoint, table)
    first = read_table(table)
    assert sorted(int(v) for v in first.column("value").to_pylist()) == list(range(50))

    # A restart from the same checkpoint reads only what arrived since.
    _produce(kafka_settings, topic, 50, 30)
    _run_to_delta(spark, kafka_settings, topic, checkpoint, table)
    values = sorted(int(v) for v in read_table(table).column("value").to_pylist())
    assert values == list(range(80))


def test_max_offsets_per_trigger_splits_the_backlog(spark, kafka_settings, tmp_path):
    topic = kafka_settings.changes_topic
    ensure_topic(kafka_settings, topic, partitions=1)
    _produce(kafka_settings, topic, 0, 40)
    batches = _run_to_delta(
        spark,
        kafka_settings,
        topic,
        str(tmp_path / "cp"),
        str(tmp_path / "t"),
        available_now=False,
        maxOffsetsPerTrigger="10",
    )
    assert batches == 4
    assert read_table(str(tmp_path / "t")).num_rows == 40


def test_kafka_source_columns_match_the_builtin_kafka_source(spark, kafka_settings):
    topic = kafka_settings.changes_topic
    ensure_topic(kafka_settings, topic, partitions=1)
    _produce(kafka_settings, topic, 0, 3)
    spark.dataSource.register(KafkaDataSource)
    frame = (
        spark.read.format("bkaudit_kafka")
        .option("kafka.bootstrap.servers", kafka_settings.bootstrap_servers)
        .option("subscribe", topic)
        .load()
    )
    assert [(f.name, f.dataType.simpleString()) for f in frame.schema.fields] == [
        ("key", "binary"),
        ("value", "binary"),
        ("topic", "string"),
        ("partition", "int"),
        ("offset", "bigint"),
        ("timestamp", "timestamp"),
        ("timestampType", "int"),
        ("headers", "array<struct<key:string,value:binary>>"),
    ]
    rows = frame.orderBy("offset").collect()
    assert [bytes(r.value) for r in rows] == [b"0", b"1", b"2"]
    assert [r.offset for r in rows] == [0, 1, 2]
    assert rows[0].headers[0].key == "h" and bytes(rows[0].headers[0].value) == b"x"


def _source_end(query) -> dict:
    """The source's end offset of the query's last micro-batch, without the source's bookkeeping."""
    from connectors.kafka.planner import positions_of

    end = query.lastProgress["sources"][0]["endOffset"]
    return positions_of(json.loads(end) if isinstance(end, str) else end)


def test_skipped_key_prefixes_never_become_rows_and_their_offsets_are_read_past(
    spark, kafka_settings, tmp_path
):
    # The membership lane's source (option bkaudit.skipKeyPrefixes=ledger/): ledger records are read past,
    # not returned, and the offsets still move beyond them, so no later micro-batch reads them again.
    topic = kafka_settings.changes_topic
    ensure_topic(kafka_settings, topic, partitions=2)
    spark.dataSource.register(KafkaDataSource)
    collected: list[tuple[int, str, str, int, int]] = []

    def write(batch_frame, batch_id: int) -> None:
        for row in batch_frame.toArrow().to_pylist():
            collected.append((batch_id, row["key"], row["value"], row["partition"], row["offset"]))

    def start(checkpoint: str):
        frame = (
            spark.readStream.format("bkaudit_kafka")
            .option("kafka.bootstrap.servers", kafka_settings.bootstrap_servers)
            .option("subscribe", topic)
            .option("bkaudit.skipKeyPrefixes", "ledger/")
            .load()
            .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value", "partition", "offset")
        )
        writer = frame.writeStream.foreachBatch(write).option("checkpointLocation", checkpoint)
        return writer.trigger(processingTime="0 seconds").start()

    def send(records: list[tuple[str, str, int]]) -> None:
        produce(kafka_settings, topic, [(k.encode(), v.encode(), p) for k, v, p in records])

    # Each partition ends with ledger records: the last records of the range are skipped ones.
    first = [
        ("bookie/b1", "a0", 0),
        ("ledger/1", "a1", 0),
        ("cluster", "a2", 0),
        ("ledger/2", "a3", 0),
        ("ledger/3", "a4", 1),
        ("bookie/b2", "a5", 1),
        ("ledger/4", "a6", 1),
        ("ledger/5", "a7", 1),
    ]
    only_ledgers = [("ledger/6", "b0", 0), ("ledger/7", "b1", 1), ("ledger/8", "b2", 1)]
    last = [("ledger/9", "c0", 0), ("bookie/b3", "c1", 0), ("cluster", "c2", 1), ("ledger/10", "c3", 1)]
    checkpoint = str(tmp_path / "checkpoint")
    query = start(checkpoint)
    try:
        send(first)
        query.processAllAvailable()
        assert sorted((k, v, p) for _, k, v, p, _ in collected) == [
            ("bookie/b1", "a0", 0),
            ("bookie/b2", "a5", 1),
            ("cluster", "a2", 0),
        ]
        assert _source_end(query) == {topic: {"0": 4, "1": 4}}  # past the skipped tails

        mark = len(collected)
        send(only_ledgers)
        query.processAllAvailable()
        assert collected[mark:] == []  # a micro-batch of skipped records only: no rows, offsets moved
        assert _source_end(query) == {topic: {"0": 5, "1": 6}}

        mark = len(collected)
        send(last)
        query.processAllAvailable()
        assert sorted((k, v, p, o) for _, k, v, p, o in collected[mark:]) == [
            ("bookie/b3", "c1", 0, 6),
            ("cluster", "c2", 1, 6),
        ]
        assert _source_end(query) == {topic: {"0": 7, "1": 8}}
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    assert not any(key.startswith("ledger/") for _, key, *_ in collected)

    # A restart from the checkpoint reads nothing again (neither the rows nor the skipped records).
    mark = len(collected)
    restarted = start(checkpoint)
    try:
        restarted.processAllAvailable()
    finally:
        restarted.stop()
    assert restarted.exception() is None, restarted.exception()
    assert collected[mark:] == []


def test_jobs_started_in_one_session_share_one_progress_listener(spark):
    """A listener per job would make every query event cost a Py4J round trip per job ever started."""
    from streaming.metrics import StreamMetrics, subscribe

    def listeners() -> int:
        return len(spark._jsparkSession.streams().listListeners())

    subscribe(spark, StreamMetrics())
    before = listeners()
    for _ in range(3):
        subscribe(spark, StreamMetrics())
    assert listeners() == before
