"""The ledger state's hot columns rebuild the rows' hot columns exactly, and merging equals folding rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.delta.ledger_columns import HOT_COLUMNS, LedgerColumns
from connectors.delta.tables import LEDGERS, conform_to, fold_rows

one_row = st.fixed_dictionaries(
    {
        "ledger_id": st.integers(0, 40),
        "mzxid": st.none() | st.integers(0, 10**12),
        "state": st.none() | st.sampled_from(["OPEN", "IN_RECOVERY", "CLOSED", "SOMETHING_NEW"]),
        "deleted": st.none() | st.booleans(),
        "under_replication_marked": st.none() | st.booleans(),
        "under_replication_replicas": st.none() | st.lists(st.sampled_from(["b1", "b2", "b3"]), max_size=2),
        "under_replication_ctime_ms": st.none() | st.integers(0, 10**13),
    }
)
ledger_rows = st.lists(one_row, max_size=25, unique_by=lambda r: r["ledger_id"])


def table_of(rows: list[dict]) -> pa.Table:
    return conform_to(pa.Table.from_pylist(rows, schema=LEDGERS.schema.empty_table().schema), LEDGERS.schema)


def hot(rows: pa.Table) -> list[dict]:
    return sorted(rows.select(list(HOT_COLUMNS)).to_pylist(), key=lambda r: r["ledger_id"])


@settings(max_examples=25)
@given(ledger_rows, st.lists(st.integers(0, 40), max_size=10, unique=True))
def test_the_columns_rebuild_every_hot_column_of_the_rows(drawn, wanted):
    rows = table_of(drawn)
    columns = LedgerColumns.of(rows)
    assert hot(columns.rows(columns.ids, HOT_COLUMNS)) == hot(rows)
    present = np.array([i for i in wanted if i in set(columns.ids.tolist())], np.int64)
    taken = columns.rows(present, ["ledger_id", "state", "under_replication_replicas"]).to_pylist()
    by_id = {r["ledger_id"]: r for r in drawn}
    assert taken == [
        {k: by_id[i][k] for k in ("ledger_id", "state", "under_replication_replicas")}
        for i in present.tolist()
    ]


@settings(max_examples=25)
@given(ledger_rows, ledger_rows)
def test_merging_rows_into_the_columns_equals_the_columns_of_the_rows_folded(base, newer):
    folded, _ = fold_rows(table_of(base), [table_of(newer)])
    merged = LedgerColumns.of(table_of(base)).merged(table_of(newer))
    assert hot(merged.rows(merged.ids, HOT_COLUMNS)) == hot(folded)
    expected = LedgerColumns.of(folded)
    assert merged.ids.tolist() == expected.ids.tolist()
    assert merged.closed().tolist() == expected.closed().tolist()
    assert merged.checked().tolist() == expected.checked().tolist()
    assert merged.gone().tolist() == expected.gone().tolist()


@settings(max_examples=25)
@given(ledger_rows)
def test_columns_built_in_parts_equal_the_columns_built_at_once(drawn):
    rows = table_of(drawn)
    parts = [LedgerColumns.of(rows.slice(start, 7)) for start in range(0, rows.num_rows, 7)]
    whole, joined = LedgerColumns.of(rows), LedgerColumns.concat(parts)
    assert hot(joined.rows(joined.ids, HOT_COLUMNS)) == hot(whole.rows(whole.ids, HOT_COLUMNS))
