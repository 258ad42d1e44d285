"""The ledger log's in-memory index of changed ledgers: built in one sort, the same as batch by batch."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from connectors.delta.ledger_log import _OverlayIndex

batches = st.lists(
    st.lists(st.tuples(st.integers(0, 30), st.integers(0, 10**6), st.booleans(), st.booleans()), max_size=12),
    max_size=8,
)


def overlay_of(drawn: list[list[tuple[int, int, bool, bool]]]) -> list[tuple[int, pa.Table]]:
    overlay = []
    for batch, rows in enumerate(drawn):
        ids, versions, deleted, closed = (
            (list(column) for column in zip(*rows, strict=True)) if rows else ([],) * 4
        )
        table = pa.table(
            {
                "ledger_id": pa.array(ids, pa.int64()),
                "mzxid": pa.array(versions, pa.int64()),
                "deleted": pa.array(deleted, pa.bool_()),
                "state": pa.array(["CLOSED" if c else "OPEN" for c in closed], pa.string()),
            }
        )
        overlay.append((batch * 3 + 1, table))
    return overlay


def columns(index: _OverlayIndex) -> list[list]:
    return [c.tolist() for c in index.columns()]


@given(batches)
def test_the_index_built_at_once_equals_the_index_built_batch_by_batch(drawn):
    overlay = overlay_of(drawn)
    one_by_one = _OverlayIndex.empty()
    for batch, rows in overlay:
        one_by_one = one_by_one.updated_with(batch, rows)
    assert columns(_OverlayIndex.of(overlay)) == columns(one_by_one)


@given(batches, st.lists(st.integers(0, 35), max_size=10))
def test_the_index_of_some_ledgers_is_the_whole_index_restricted_to_them(drawn, wanted):
    overlay = overlay_of(drawn)
    whole = _OverlayIndex.of(overlay)
    some = _OverlayIndex.of(overlay, np.array(wanted, np.int64))
    keep = np.isin(whole.ids, wanted)
    expected = [np.asarray(c)[keep].tolist() for c in columns(whole)]
    assert columns(some) == expected
