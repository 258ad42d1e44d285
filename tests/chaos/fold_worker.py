"""A child process for ``test_kill_during_fold``: micro-batches of ledger changes recorded as the job's sink
records them (:class:`~connectors.delta.ledger_log.LedgerLog` on real Delta tables), their index rows
appended after some batches only (the sink's ``index_append_interval_s``), folded in the background every
few milliseconds in rotation (every other run by a child process, as at scale), until it is killed.

Each batch's rows are a pure function of its id (:func:`batch_rows`), as a Spark replay's input is the same
batch again. On start the worker replays the last recorded batch or goes on after it (at random, as Spark
does after a crash before or after recording a batch done), and sometimes folds a batch as soon as it is
recorded (what the job does when it stops; a fold never passes the index's last append), so a later replay
finds its batch already folded.
"""

from __future__ import annotations

import random
import sys
import time
from datetime import UTC, datetime
from typing import Any

from deltalake import DeltaTable

from connectors.delta.ledger_log import LedgerLog
from connectors.delta.tables import LEDGER_BUCKETS, BatchWriter, ensure_tables, table_path

APP = "chaos-fold"
LEDGERS = 400
PER_BATCH = 150
#: The bucket counts the runs take in turn.
BUCKETS = (8, 8, 3)


def batch_rows(batch_id: int) -> tuple[list[dict[str, Any]], dict[int, list[str]]]:
    """The ledger rows batch ``batch_id`` changes and the index (bookies) of each."""
    rows, index = [], {}
    for k in range(PER_BATCH):
        ledger_id = (batch_id * 37 + k * 7) % LEDGERS
        deleted = (batch_id + k) % 11 == 0
        bookies = [f"b{(ledger_id + batch_id + j) % 9}" for j in range(3)]
        rows.append(
            {
                "ledger_id": ledger_id,
                "ledger_bucket": ledger_id % LEDGER_BUCKETS,
                "state": "CLOSED",
                "ensemble_size": 3,
                "write_quorum": 2,
                "ack_quorum": 2,
                "segments": [{"first_entry_id": 0, "ensemble": bookies}],
                "bookies": sorted(bookies),
                "mzxid": batch_id * 1000 + k,
                "deleted": deleted,
                "updated_at": datetime.fromtimestamp(batch_id, tz=UTC),
            }
        )
        index[ledger_id] = [] if deleted else bookies
    # One row per ledger per batch (the sink writes each changed ledger once): the last change wins.
    last = {row["ledger_id"]: row for row in rows}
    return list(last.values()), {i: index[i] for i in last}


def expected_state(last_batch: int) -> dict[int, tuple[int, bool]]:
    """ledger id → (mzxid, deleted) after batches 0..``last_batch``."""
    state: dict[int, tuple[int, bool]] = {}
    for batch_id in range(last_batch + 1):
        for row in batch_rows(batch_id)[0]:
            state[row["ledger_id"]] = (row["mzxid"], row["deleted"])
    return state


def recorded_batch(root: str) -> int:
    """The last batch whose changes are in ``ledger_changes`` (-1: none): its one write, so it finished and
    Spark may have recorded it done."""
    changes = DeltaTable(table_path(root, "ledger_changes")).transaction_version(APP)
    return -1 if changes is None else int(changes)


def main(argv: list[str]) -> None:
    root, seed = argv[0], int(argv[1])
    rng = random.Random(seed)
    ensure_tables(root)
    recorded = recorded_batch(root)
    # The last batch may or may not have been recorded done by Spark: run again, or the next one.
    replay = recorded >= 0 and rng.random() < 0.5
    batch_id = recorded if replay else recorded + 1
    # Folds in rotation (a few buckets per tick, old files vacuumed after a round or two), and a bucket
    # count that changes between runs, as after a change of ``stream.ledger_table_buckets``.
    log = LedgerLog(root, APP, buckets=BUCKETS[seed % len(BUCKETS)])
    if seed % 2:  # every other run folds in a child process, as the job does at scale (killed with it)
        log.fold_in_child_from_rows = 0
    log.start_folding(0.06, ticks=3, vacuum_rounds=1 + seed % 2)
    print(f"start {batch_id}", flush=True)
    while True:
        log.open(batch_id)
        log.batch_started(batch_id)
        rows, _ = batch_rows(batch_id)
        log.record(BatchWriter(root, APP, batch_id), rows)
        if rng.random() < 0.4:
            log.flush_index()
        if rng.random() < 0.2:
            log.fold(through=batch_id)
        print(f"recorded {batch_id}", flush=True)
        batch_id += 1
        time.sleep(rng.random() * 0.02)


if __name__ == "__main__":
    main(sys.argv[1:])
