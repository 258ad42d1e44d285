"""``bkaudit query auditor-diff`` over the example lakehouse: bookie-1 lost at 12:10 (ledgers 1 and 2 under
replicated), nothing marked; then BookKeeper's marks are added by hand."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from connectors.delta.queries import Lakehouse, write_example_lakehouse
from connectors.delta.tables import TABLES, BatchWriter
from core.errors import InvalidArgumentError

LOST_AT = datetime(2024, 5, 1, 12, 10, tzinfo=UTC)  # when the example's LEDGER_UNDER_REPLICATED started


def mark(root: Path, ledger_ids: list[int], batch: int) -> None:
    """Give ``ledger_ids`` an under-replication mark, as the watcher reports one."""
    rows = DeltaTable(str(root / "ledgers")).to_pyarrow_table()
    rows = rows.filter(pc.is_in(rows.column("ledger_id"), pa.array(ledger_ids)))
    index = rows.schema.get_field_index("under_replication_marked")
    rows = rows.set_column(index, rows.schema.field(index), pa.array([True] * rows.num_rows))
    ctime = rows.schema.get_field_index("under_replication_ctime_ms")
    at_ms = int(LOST_AT.timestamp() * 1000) + 1_000
    rows = rows.set_column(ctime, rows.schema.field(ctime), pa.array([at_ms] * rows.num_rows, pa.int64()))
    BatchWriter(root, "example", batch).upsert("ledgers", rows.cast(TABLES["ledgers"].schema))


def diff(root: Path, **kwargs: object) -> list[tuple[str, int]]:
    with Lakehouse(root) as lakehouse:
        return [(r["diff"], r["ledger_id"]) for r in lakehouse.auditor_diff(**kwargs).to_pylist()]  # type: ignore[arg-type]


def test_at_risk_ledgers_without_a_mark_are_listed_once_the_grace_has_passed(tmp_path: Path) -> None:
    root = write_example_lakehouse(tmp_path)
    assert diff(root, grace_s=300, now=datetime(2024, 5, 1, 12, 14, tzinfo=UTC)) == []  # within the grace
    late = datetime(2024, 5, 1, 12, 16, tzinfo=UTC)
    assert diff(root, grace_s=300, now=late) == [("at_risk_unmarked", 1), ("at_risk_unmarked", 2)]
    mark(root, [1, 2], batch=5)
    assert diff(root, grace_s=300, now=late) == []  # the Auditor did its part


def test_a_mark_on_a_ledger_bkaudit_finds_healthy_is_listed(tmp_path: Path) -> None:
    root = write_example_lakehouse(tmp_path)
    mark(root, [1, 3], batch=5)  # ledger 3 names no lost bookie and has no open finding
    rows = diff(root, grace_s=0)
    assert rows == [("at_risk_unmarked", 2), ("marked_healthy", 3)]


def test_a_negative_grace_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="--grace"):
        Lakehouse(write_example_lakehouse(tmp_path)).auditor_diff(grace_s=-1)
