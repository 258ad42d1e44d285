"""Filtered reads of Delta tables whose files differ in physical type (delta-rs writes MERGE files with
``string_view`` columns, appends with ``string``): the sink's reads and the query engine's fallback."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from connectors.delta.scan import filter_expression, scan, scan_partitions, view_typed_dataset
from connectors.delta.tables import LEDGERS, BatchWriter, ensure_tables, table_path
from core.settings import KafkaSettings
from streaming.sink import AuditSink, SinkConfig


def _ledger(ledger_id: int, state: str, deleted: bool = False) -> dict[str, object]:
    # One partition for all: the failure needs a file holding both OPEN and CLOSED rows (a file of one
    # value is decided by its statistics alone, without evaluating the filter on its data).
    return {"ledger_id": ledger_id, "ledger_bucket": 0, "state": state, "deleted": deleted}


def _ledgers_table(root: Path) -> DeltaTable:
    """A `ledgers` table written as the sink writes it: two MERGEs (the second rewrites files), OPEN and
    CLOSED ledgers side by side, as on every Pulsar cluster."""
    ensure_tables(root)
    rows = [_ledger(1, "OPEN"), _ledger(2, "CLOSED"), _ledger(3, "CLOSED")]
    rows.append(_ledger(4, "CLOSED", deleted=True))
    BatchWriter(root, app_id="scan-test", batch_id=0).upsert(
        "ledgers", pa.Table.from_pylist(rows, schema=LEDGERS.schema)
    )
    BatchWriter(root, app_id="scan-test", batch_id=1).upsert(
        "ledgers", pa.Table.from_pylist([_ledger(5, "CLOSED"), _ledger(1, "OPEN")], schema=LEDGERS.schema)
    )
    return DeltaTable(table_path(root, "ledgers"))


def _physical_state_types(table: DeltaTable) -> set[str]:
    return {str(pq.read_schema(path).field("state").type) for path in table.file_uris()}


def test_the_writer_really_mixes_string_and_string_view(tmp_path: Path) -> None:
    """The premise of every test below: if delta-rs stops writing string_view, they test nothing new."""
    assert "string_view" in _physical_state_types(_ledgers_table(tmp_path))


def test_scan_compares_text_columns_whatever_the_files_physical_type(tmp_path: Path) -> None:
    table = _ledgers_table(tmp_path)
    write_deltalake(
        table_path(tmp_path, "ledgers"),
        pa.Table.from_pylist([_ledger(6, "CLOSED")], schema=LEDGERS.schema),
        mode="append",
    )
    table = DeltaTable(table_path(tmp_path, "ledgers"))
    assert _physical_state_types(table) == {"string", "string_view"}

    closed = scan(table, [("state", "=", "CLOSED"), ("deleted", "=", False)], ["ledger_id"])
    assert sorted(closed.column("ledger_id").to_pylist()) == [2, 3, 5, 6]
    not_closed = scan(table, [("state", "not in", ["CLOSED"])], ["ledger_id"])
    assert not_closed.column("ledger_id").to_pylist() == [1]
    assert scan(table, [("state", "in", ["OPEN"]), ("ledger_id", ">", 1)]).num_rows == 0


def test_scrutiny_picks_closed_and_open_ledgers_from_merge_written_files(tmp_path: Path) -> None:
    """The background replicas check picks the next closed or open, live ledgers (it raised
    ArrowNotImplementedError as soon as a file written by a MERGE held OPEN and CLOSED ledgers)."""
    _ledgers_table(tmp_path)
    sink = AuditSink(
        SinkConfig(
            lakehouse_root=tmp_path, app_id="scan-test", kafka=KafkaSettings(), scrutiny_ledgers_per_s=1000.0
        )
    )
    sink.probes.scrutiny.last_pick_ms = 0  # a long time ago: the whole budget is available
    sink.ledger_log.open(1)  # the ledgers as the job holds them in memory, loaded from those files
    picks = sink.probes._scrutiny_picks(set())
    assert [p["ledger_id"] for p in picks] == [1, 2, 3, 5]  # 1 is open: checked up to its LAC


def test_engines_filter_the_view_typed_dataset_across_physical_types(tmp_path: Path) -> None:
    _ledgers_table(tmp_path)
    write_deltalake(
        table_path(tmp_path, "ledgers"),
        pa.Table.from_pylist([_ledger(6, "CLOSED")], schema=LEDGERS.schema),
        mode="append",
    )
    con = duckdb.connect()
    con.register("ledgers", view_typed_dataset(DeltaTable(table_path(tmp_path, "ledgers"))))
    rows = con.execute("SELECT ledger_id FROM ledgers WHERE state = 'CLOSED' ORDER BY ledger_id").fetchall()
    assert [r[0] for r in rows] == [2, 3, 4, 5, 6]


def test_an_unknown_operator_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unsupported filter operator 'like' on 'state'"):
        filter_expression([("state", "like", "C%")], pa.schema([("state", pa.string())]))


def test_a_partitions_files_read_directly_are_what_the_pruned_scan_reads(tmp_path: Path) -> None:
    """``scan_partitions`` (a loss's read of its bookie's index partition) equals :func:`scan` with the
    partitions pruned: files written before a column was added give nulls, MERGE-written (``string_view``)
    files read as the table's types, other partitions are not read, and an absent one gives no rows."""
    path = str(tmp_path / "index")
    first = pa.table({"bookie": ["b1", "b2"], "ledger_id": [1, 2]})
    write_deltalake(path, first, partition_by=["bookie"])
    later = pa.table({"bookie": ["b2", "b3"], "ledger_id": [3, 4], "state": ["OPEN", "CLOSED"]})
    write_deltalake(path, later, mode="append", schema_mode="merge")
    merged = pa.table({"bookie": ["b2"], "ledger_id": [2], "state": ["CLOSED"]})
    table = DeltaTable(path)
    table.merge(
        merged, "t.ledger_id = s.ledger_id", source_alias="s", target_alias="t"
    ).when_matched_update_all().execute()
    table = DeltaTable(path)
    for bookies in (["b2"], ["b2", "b3", "b2"], ["b9"]):
        for columns in (None, ["state", "bookie", "ledger_id"]):
            direct = scan_partitions(table, "bookie", bookies, columns)
            pruned = scan(table, [("bookie", "in", bookies)], columns, prune_partitions=True)
            assert direct.schema == pruned.schema
            assert direct.sort_by("ledger_id").to_pylist() == pruned.sort_by("ledger_id").to_pylist()
    assert scan_partitions(table, "bookie", ["b2"], ["ledger_id", "state"]).sort_by(
        "ledger_id"
    ).to_pylist() == [
        {"ledger_id": 2, "state": "CLOSED"},
        {"ledger_id": 3, "state": "OPEN"},
    ]
