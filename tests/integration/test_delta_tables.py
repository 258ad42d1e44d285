"""The auditor's Delta tables (real Delta tables through deltalake): creation, replay-safe batch writes."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from connectors.delta.tables import (
    LEDGER_BOOKIES,
    TABLES,
    BatchWriter,
    ensure_tables,
    maintain,
    read_table,
    table_before_batch,
    table_path,
)

pytestmark = pytest.mark.integration


def index_rows(pairs):
    return pa.Table.from_pylist(
        [{"bookie": bookie, "ledger_id": ledger, "mzxid": 1} for bookie, ledger in pairs],
        schema=LEDGER_BOOKIES.schema,
    )


def index_of(root):
    # The raw table: what the writer left (read_table shows only the rows of current ledger versions).
    rows = DeltaTable(table_path(root, "ledger_bookies")).to_pyarrow_table().to_pylist()
    return sorted((r["bookie"], r["ledger_id"]) for r in rows)


def test_tables_are_created_once_with_cdf_comments_and_partitions(tmp_path):
    assert ensure_tables(tmp_path) == sorted(TABLES)
    assert ensure_tables(tmp_path) == sorted(TABLES)  # idempotent
    for spec in TABLES.values():
        table = DeltaTable(table_path(tmp_path, spec.name))
        assert table.metadata().configuration["delta.enableChangeDataFeed"] == "true"
        assert table.metadata().partition_columns == list(spec.partition_by)
        assert all(field.metadata.get("comment") for field in table.schema().fields)


def test_replace_keys_replaces_a_ledgers_index_rows_and_keeps_the_others(tmp_path):
    ensure_tables(tmp_path)
    BatchWriter(tmp_path, "job", 0).replace_keys(
        "ledger_bookies", "ledger_id", [1, 2], index_rows([("b1", 1), ("b2", 1), ("b1", 2), ("b3", 2)])
    )
    # Ledger 1's ensemble changed b2 → b4; ledger 2 untouched; ledger 3 appears.
    BatchWriter(tmp_path, "job", 1).replace_keys(
        "ledger_bookies", "ledger_id", [1, 3], index_rows([("b1", 1), ("b4", 1), ("b2", 3)])
    )
    assert index_of(tmp_path) == [("b1", 1), ("b1", 2), ("b2", 3), ("b3", 2), ("b4", 1)]
    # A deleted ledger: its key with no rows.
    BatchWriter(tmp_path, "job", 2).replace_keys("ledger_bookies", "ledger_id", [2], index_rows([]))
    assert index_of(tmp_path) == [("b1", 1), ("b2", 3), ("b4", 1)]


def test_a_replayed_batch_changes_nothing_and_reads_the_state_before_it(tmp_path):
    ensure_tables(tmp_path)
    bookie = pa.Table.from_pylist(
        [{"bookie_id": "b1", "status": "WRITABLE"}], schema=TABLES["bookies"].schema
    )
    assert BatchWriter(tmp_path, "job", 0).upsert("bookies", bookie)
    gone = pa.Table.from_pylist([{"bookie_id": "b1", "status": "GONE"}], schema=TABLES["bookies"].schema)
    assert BatchWriter(tmp_path, "job", 1).upsert("bookies", gone)
    version = DeltaTable(table_path(tmp_path, "bookies")).version()

    # Replay of batch 1 after a crash: skipped, and decisions read the table as before batch 1.
    assert not BatchWriter(tmp_path, "job", 1).upsert("bookies", gone)
    assert DeltaTable(table_path(tmp_path, "bookies")).version() == version
    before = table_before_batch(tmp_path, "bookies", "job", 1).to_pyarrow_table().to_pylist()
    assert [r["status"] for r in before] == ["WRITABLE"]
    # A batch not yet applied reads the latest state.
    latest = table_before_batch(tmp_path, "bookies", "job", 2).to_pyarrow_table().to_pylist()
    assert [r["status"] for r in latest] == ["GONE"]
    # Another app id is independent.
    assert BatchWriter(tmp_path, "other", 1).upsert("bookies", gone)


def test_append_conforms_rows_to_the_schema_and_maintenance_keeps_rows(tmp_path):
    ensure_tables(tmp_path)
    for batch in range(3):
        BatchWriter(tmp_path, "job", batch).append(
            "dead_letters", pa.table({"source": ["kafka"], "reason": [f"bad {batch}"], "batch_id": [batch]})
        )
    assert sorted(read_table(tmp_path, "dead_letters").column("reason").to_pylist()) == [
        "bad 0",
        "bad 1",
        "bad 2",
    ]
    maintain(tmp_path, retention_hours=0)
    assert read_table(tmp_path, "dead_letters").num_rows == 3


def test_the_sink_compacts_every_n_batches_without_changing_contents(tmp_path, kafka_settings):
    import json
    from datetime import UTC, datetime

    from streaming.sink import ARROW_DECISION_SCHEMA, AuditSink, SinkConfig

    config = SinkConfig(
        lakehouse_root=tmp_path, app_id="m", kafka=kafka_settings, maintenance_every_batches=3
    )
    sink = AuditSink(config)
    for batch in range(4):
        row = {
            "kind": "bookie_state",
            "event_time": datetime.now(tz=UTC),
            "cluster": "c",
            "bookie_id": f"b{batch}",
            "payload": json.dumps({"status": "WRITABLE"}),
        }
        sink.process(pa.Table.from_pylist([row], schema=ARROW_DECISION_SCHEMA), batch)
    history = [c["operation"] for c in DeltaTable(table_path(tmp_path, "bookies")).history()]
    assert "OPTIMIZE" in history  # batch 3 ran the maintenance
    assert sorted(read_table(tmp_path, "bookies").column("bookie_id").to_pylist()) == ["b0", "b1", "b2", "b3"]


def _age_removed_files(table_dir, hours):
    """Date every ``remove`` action in the table's log ``hours`` back (vacuum ages a replaced file by it)."""
    import json
    import time

    stamp = int((time.time() - hours * 3600) * 1000)
    for log in Path(table_dir, "_delta_log").glob("*.json"):
        actions = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        for action in actions:
            if "remove" in action:
                action["remove"]["deletionTimestamp"] = stamp
        log.write_text("".join(json.dumps(action) + "\n" for action in actions))


@pytest.mark.parametrize(("retention_hours", "kept"), [(168, True), (1, False)])
def test_the_sink_maintenance_deletes_replaced_files_older_than_its_retention(
    tmp_path, retention_hours, kept
):
    from deltalake import write_deltalake

    from connectors.delta.tables import BOOKIES
    from core.settings import KafkaSettings
    from streaming.sink import AuditSink, SinkConfig

    config = SinkConfig(
        lakehouse_root=tmp_path,
        app_id="m",
        kafka=KafkaSettings(),  # never reached: maintenance publishes nothing
        maintenance_every_batches=1,
        maintenance_retention_hours=retention_hours,
    )
    sink = AuditSink(config)
    bookies = table_path(tmp_path, "bookies")
    write_deltalake(
        bookies, pa.Table.from_pylist([{"bookie_id": "b1"}], schema=BOOKIES.schema), mode="overwrite"
    )
    (replaced,) = DeltaTable(bookies).file_uris()
    write_deltalake(
        bookies, pa.Table.from_pylist([{"bookie_id": "b2"}], schema=BOOKIES.schema), mode="overwrite"
    )
    _age_removed_files(bookies, hours=2)  # the first file was replaced two hours ago
    sink.upkeep._maintain(1)
    assert Path(replaced).exists() is kept
    assert read_table(tmp_path, "bookies").column("bookie_id").to_pylist() == ["b2"]
