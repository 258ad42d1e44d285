"""The fold's rows: each ledger's newest change over its folded row, sorted by id, against a dict model."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from connectors.delta.tables import current_rows, fold_rows, latest_per_ledger, overlaid

SCHEMA = pa.schema([("ledger_id", pa.int64()), ("v", pa.int64()), ("names", pa.list_(pa.string()))])

ids = st.integers(0, 40)
base_rows = st.lists(st.tuples(ids, st.integers(0, 9)), unique_by=lambda row: row[0], max_size=30)
batches = st.lists(st.lists(st.tuples(ids, st.integers(10, 99)), max_size=10), max_size=5)
changes_with_batch = st.lists(st.tuples(ids, st.integers(10, 99), st.integers(0, 5)), max_size=40)


def table(rows: list[tuple[int, int]]) -> pa.Table:
    return pa.table(
        {
            "ledger_id": [i for i, _ in rows],
            "v": [v for _, v in rows],
            "names": [[f"b{v}"] * (v % 3) for _, v in rows],
        },
        schema=SCHEMA,
    )


def model(base: list[tuple[int, int]], changes: list[list[tuple[int, int]]]) -> list[dict]:
    state = dict(base)
    for batch in changes:
        state.update(batch)
    return table(sorted(state.items())).to_pylist()


@given(base_rows, batches)
def test_current_rows_are_the_newest_row_of_every_ledger_sorted_by_id(base, changes):
    current = current_rows(table(sorted(base)), [table(batch) for batch in changes])
    assert current.to_pylist() == model(base, changes)


@given(base_rows, st.lists(st.tuples(ids, st.integers(10, 99)), max_size=30), st.randoms())
def test_overlaid_takes_a_base_in_any_order(base, latest, random):
    latest = list(dict(latest).items())  # one row per ledger
    shuffled = list(base)
    random.shuffle(shuffled)  # a base read from Delta comes in partition order, not by id
    assert overlaid(table(shuffled), table(latest)).to_pylist() == model(base, [latest])


@given(base_rows, changes_with_batch)
def test_the_child_s_fold_takes_each_ledger_s_change_of_its_latest_batch(base, changes):
    """A scan of ledger_changes returns the batches' files in any order: the fold orders by batch_id, and
    within one batch keeps the order the rows were read in."""
    rows = table([(i, v) for i, v, _ in changes])
    rows = rows.append_column("batch_id", pa.array([b for *_, b in changes], pa.int64()))
    folded, latest = fold_rows(table(base), [rows], order_by="batch_id")
    by_batch = sorted(enumerate(changes), key=lambda item: (item[1][2], item[0]))  # batch, then read order
    assert folded.to_pylist() == model(base, [[(i, v) for _, (i, v, _) in by_batch]])
    assert latest.schema == SCHEMA
    assert latest.column("ledger_id").to_pylist() == sorted({i for i, _, _ in changes})


def test_overlaid_keeps_a_base_of_no_chunks_and_no_changes_empty():
    empty = SCHEMA.empty_table()
    assert overlaid(empty, empty).num_rows == 0
    assert overlaid(empty, table([(3, 1)])).to_pylist() == table([(3, 1)]).to_pylist()
    assert latest_per_ledger([], order_by="batch_id").num_rows == 0
