"""kill -9 between a micro-batch's ledger writes, their index's append and their fold: nothing lost or
repeated.

A child process (:mod:`tests.chaos.fold_worker`) records micro-batches of ledger changes exactly as the
job's sink does (real Delta tables), appends the index rows of the versions since after some batches only,
with the fold running every 20 ms in its background thread and, now and then, a fold of a batch just
recorded (the job's stop). It is killed with SIGKILL at random moments: inside a batch's write, an index
append or a fold, between them. Each restart replays the last batch or goes on, as Spark would. Afterwards
the ledgers' state read back from Delta (and loaded again by a new process's
:class:`~connectors.delta.ledger_log.LedgerLog`) equals the state the recorded batches define: every ledger
once, at its last version; every reader of the index sees exactly the current versions' bookies, before the
new process appends what the kills left out and after; and the table then holds each of them once.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from deltalake import DeltaTable

from connectors.delta.ledger_log import LedgerLog, read_current_index, read_current_ledgers
from connectors.delta.tables import table_path
from tests.chaos.fold_worker import APP, LEDGERS, batch_rows, expected_state, recorded_batch

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]


def run_until_killed(root: Path, seed: int, rng: random.Random) -> list[str]:
    """Start the worker, let it record a few batches, SIGKILL it at a random moment; returns its lines."""
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.chaos.fold_worker", str(root), str(seed)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines = []
    try:
        assert worker.stdout is not None
        wanted = rng.randint(1, 5)
        while sum(line.startswith("recorded") for line in lines) < wanted:
            line = worker.stdout.readline()
            if not line:
                raise AssertionError(f"the worker ended: {lines}")
            lines.append(line.strip())
        time.sleep(rng.random() * 0.08)  # into the next batch's writes or a fold, or between them
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
    return lines


def versions_of(table) -> dict[int, tuple[int, bool]]:
    columns = (table.column(name).to_pylist() for name in ("ledger_id", "mzxid", "deleted"))
    return {ledger_id: (mzxid, deleted) for ledger_id, mzxid, deleted in zip(*columns, strict=True)}


def test_a_kill_between_batches_and_folds_loses_and_repeats_nothing(tmp_path):
    root = tmp_path / "lakehouse"
    rng = random.Random(20261125)
    for round_number in range(8):
        run_until_killed(root, round_number, rng)
    last = recorded_batch(str(root))
    assert last >= 8
    expected = expected_state(last)
    bookies_now: dict[int, list[str]] = {}
    for batch_id in range(last + 1):
        bookies_now.update(batch_rows(batch_id)[1])
    expected_index = sorted(
        (ledger_id, bookie) for ledger_id, names in bookies_now.items() for bookie in names
    )

    current = read_current_ledgers(root)
    ids = current.column("ledger_id").to_pylist()
    assert len(ids) == len(set(ids)) == len(expected)
    assert versions_of(current) == expected
    assert (
        sorted((r["ledger_id"], r["bookie"]) for r in read_current_index(root).to_pylist()) == expected_index
    )

    folded = DeltaTable(table_path(root, "ledgers")).to_pyarrow_table().column("ledger_id").to_pylist()
    assert len(folded) == len(set(folded))  # the fold never wrote a ledger twice

    log = LedgerLog(root, APP)  # a new process's view, then the index's append and a fold of everything
    log.open(last + 1)
    mzxid, gone = log.versions(np.arange(LEDGERS))
    loaded = zip(range(LEDGERS), mzxid.tolist(), gone.tolist(), strict=True)
    assert {i: (m, g) for i, m, g in loaded if m >= 0} == expected
    log.flush_index()
    log.fold(through=last)
    assert versions_of(DeltaTable(table_path(root, "ledgers")).to_pyarrow_table()) == expected
    assert (
        sorted((r["ledger_id"], r["bookie"]) for r in read_current_index(root).to_pylist()) == expected_index
    )

    raw = DeltaTable(table_path(root, "ledger_bookies")).to_pyarrow_table()
    current_versions = {
        ledger_id: version for ledger_id, (version, deleted) in expected.items() if not deleted
    }
    stored = [
        (ledger_id, bookie)
        for ledger_id, bookie, version in zip(
            *(raw.column(name).to_pylist() for name in ("ledger_id", "bookie", "mzxid")), strict=True
        )
        if current_versions.get(ledger_id) == version
    ]
    assert sorted(stored) == expected_index  # each current version's rows in the table, once
