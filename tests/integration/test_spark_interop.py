"""What a Spark user reads on day one: every Delta table the job wrote, through delta-spark, and the alerts
topic, through Spark's own Kafka source, agree with bkaudit's own readers (DuckDB for the tables, librdkafka
for the topic). Real broker, Spark and Delta; one job run shared by the module.

The jars (:mod:`connectors.delta.spark_interop`) are built for Spark 4.2: on another pyspark the module skips,
saying so.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyspark
import pytest

from bkaudit.testing.kafka_io import read_topic
from connectors.delta.queries import Lakehouse
from connectors.delta.spark_interop import check_spark_line, kafka_read_options
from connectors.delta.tables import TABLES
from core import events as ev
from core.domain.managed_ledger import ManagedLedgerInfo, TopicLedger, encode_managed_ledger_info
from core.domain.rackmap import RackMap
from core.errors import ConfigError
from tests.integration.event_fixtures import Stat
from tests.integration.test_stream_job import BOOKIES, RACKS, job_with_watcher, run_once

pytestmark = pytest.mark.integration


try:
    check_spark_line(pyspark.__version__)
except ConfigError as err:  # decided before any fixture starts a service
    pytest.skip(str(err), allow_module_level=True)


@pytest.fixture(scope="module")
def job_output(spark: Any, bk_services: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One job run that writes every table: a corrupt znode (dead letter), a lost bookie (open alerts,
    violations, under-replicated ledgers), a ledger on one rack (placement plan); then the sink's close
    folds the changes into ``ledgers``."""
    settings, watcher, t0 = job_with_watcher(
        bk_services.kafka_settings(), tmp_path_factory.mktemp("interop"), clock_offset_ms=-60_000
    )
    watcher.send(ev.rack_map_event("file:/racks.json", RackMap.from_racks(RACKS), present=True))
    for bookie in BOOKIES:
        watcher.bookie(bookie, "WRITABLE")
    watcher.ledger(1, BOOKIES[0:3])
    watcher.ledger(2, BOOKIES[1:4])
    watcher.ledger(3, [BOOKIES[0], BOOKIES[3]], wq=1, aq=1)
    watcher.ledger(6, [BOOKIES[1], BOOKIES[4]])  # both on /rack1: a placement plan
    watcher.ledger(4, [BOOKIES[0], BOOKIES[3]], closed=False)
    watcher.send(ev.ledger_undecodable(5, "/ledgers/L5", Stat(1, 1, 0, 0, 0, 3), "bad header"))
    listing = encode_managed_ledger_info(ManagedLedgerInfo((TopicLedger(1), TopicLedger(2))))
    watcher.send(
        ev.managed_ledger_changed("t/ns/persistent/x", "", listing, Stat(1, 2, 0, 0, 0, len(listing)))
    )
    watcher.heartbeat(t0 + 50_000)
    watcher.bookie(BOOKIES[0], "GONE")
    watcher.heartbeat(t0 + 55_000)
    watcher.flush()
    run_once(spark, settings)
    return settings


_SAME_KIND = {pa.string_view(): pa.string(), pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}


def _kind(kind: pa.DataType) -> pa.DataType:
    """The type with its physical variants (views, large offsets) as the plain one: what a reader means."""
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_list_view(kind):
        return pa.list_(_kind(kind.value_type))
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, _kind(f.type)) for f in kind])
    return _SAME_KIND.get(kind, kind)


def _schema(table: pa.Table) -> list[tuple[str, pa.DataType]]:
    return [(field.name, _kind(field.type)) for field in table.schema]


def _rows(table: pa.Table) -> list[str]:
    """The rows as sorted canonical texts (zoned timestamps print as instants in UTC)."""
    return sorted(json.dumps(row, sort_keys=True, default=repr) for row in table.to_pylist())


def _as_bkaudit_reads(lakehouse: Lakehouse, name: str) -> pa.Table:
    lakehouse._files_view(name, name)  # the view bkaudit query builds over a table's live files
    return lakehouse._con.sql(f'SELECT * FROM "{name}"').to_arrow_table()


def test_spark_reads_every_delta_table_the_job_writes_as_bkaudit_query_does(
    spark: Any, job_output: Any
) -> None:
    root = job_output.lakehouse_root
    with Lakehouse(root) as lakehouse:
        assert set(lakehouse.tables()) == set(TABLES)
        filled = set()
        for name in sorted(TABLES):
            ours = _as_bkaudit_reads(lakehouse, name)
            theirs = spark.read.format("delta").load(str(root / name)).toArrow()
            assert _schema(theirs) == _schema(ours), name
            assert theirs.num_rows == ours.num_rows, name
            assert _rows(theirs) == _rows(ours), name
            if ours.num_rows:
                filled.add(name)
    # Every table that holds rows in this run was compared row by row (snapshot_seen is the bulk loader's).
    assert filled >= set(TABLES) - {"snapshot_seen"}


def test_delta_spark_reads_every_time_column_as_an_instant(spark: Any, job_output: Any) -> None:
    """TIMESTAMP (an instant), never TIMESTAMP_NTZ (a wall clock): Spark and DuckDB both place it in UTC."""
    for name, spec in TABLES.items():
        schema = spark.read.format("delta").load(str(job_output.lakehouse_root / name)).schema
        for field in spec.schema:
            if pa.types.is_timestamp(field.type):
                assert schema[field.name].dataType.simpleString() == "timestamp", (name, field.name)


def test_spark_kafka_source_reads_the_alert_json_the_project_reader_reads(
    spark: Any, job_output: Any
) -> None:
    kafka = job_output.kafka
    ours = sorted((r.partition, r.offset, r.key, r.value) for r in read_topic(kafka, kafka.alerts_topic))
    frame = spark.read.format("kafka").options(**kafka_read_options(kafka, kafka.alerts_topic)).load()
    theirs = sorted(
        (row.partition, row.offset, bytes(row.key) if row.key is not None else None, bytes(row.value))
        for row in frame.select("partition", "offset", "key", "value").collect()
    )
    assert len(ours) >= 5  # a corrupt znode, a lost bookie and its ledgers
    assert theirs == ours
    assert {json.loads(value)["kind"] for *_, value in theirs} >= {"BOOKIE_LOST", "METADATA_CORRUPT"}
