"""Folds in rotation: which buckets a tick rewrites, and the watermark every reader and restart relies on,
against a model of the table (per ledger, the newest change folded into its bucket)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.delta.ledger_log import oldest_pending, plan_tick

batches = st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=8, unique=True), min_size=1, max_size=12)


@settings(max_examples=40)
@given(batches, st.integers(1, 6), st.integers(1, 4), st.lists(st.booleans(), max_size=12))
def test_the_watermark_never_passes_a_change_a_bucket_lacks_and_catches_up(changes, buckets, limit, skips):
    table: dict[int, int] = {}  # ledger -> the batch of its row in the table
    done = np.full(buckets, -1, np.int64)
    complete = -1
    overlay: list[tuple[int, pa.Table]] = []

    def tick(through: int) -> None:
        nonlocal complete
        pending = [(b, rows) for b, rows in overlay if b <= through]
        chosen, new_complete = plan_tick(oldest_pending(pending, done, buckets), through, limit)
        assert complete <= new_complete <= through
        assert len(chosen) <= limit
        for b, rows in pending:  # the chosen buckets rewritten with every change through ``through``
            for ledger in rows.column("ledger_id").to_pylist():
                if ledger % buckets in chosen:
                    table[ledger] = b
        done[chosen] = through
        complete = new_complete
        for b, rows in pending:  # every change through the watermark is in its bucket
            if b <= complete:
                assert all(table.get(i, -1) >= b for i in rows.column("ledger_id").to_pylist())

    for batch, ids in enumerate(changes):
        overlay.append((batch, pa.table({"ledger_id": pa.array(ids, pa.int64())})))
        if batch < len(skips) and skips[batch]:
            continue  # no tick between two batches
        tick(batch)
    last = len(changes) - 1
    for _ in range(-(-buckets // limit)):  # a full rotation with nothing new folds everything
        tick(last)
    assert complete == last
    newest = {i: b for b, ids in enumerate(changes) for i in ids}
    assert table == newest


def test_a_tick_takes_the_buckets_holding_the_oldest_changes_first():
    oldest = np.array([7, 5, -1, 5, 6])
    chosen, complete = plan_tick(oldest, through=9, limit=2)
    assert chosen.tolist() == [1, 3] and complete == 5  # bucket 4 still lacks batch 6
