"""The ledgers' state on real Delta tables: appended per batch, folded in the background, read as current.

What readers see (the staleness bound in docs/design.md, "The ledger state and its fold"):
``read_table``/``bkaudit query`` every finished batch at once; the raw ``ledgers`` table within the fold
interval plus one fold; the index only the rows of current versions, before and after their cleanup.
"""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from deltalake import DeltaTable

from connectors.delta._fold_process import FoldRequest
from connectors.delta.ledger_log import LedgerLog, read_current_index, read_current_ledgers
from connectors.delta.queries import Lakehouse
from connectors.delta.tables import LEDGER_BUCKETS, BatchWriter, ensure_tables, read_table, table_path
from connectors.process import pid_alive

pytestmark = pytest.mark.integration

APP = "test-log"
REPO = Path(__file__).resolve().parents[2]


def row(ledger_id: int, mzxid: int, *, state: str = "CLOSED", deleted: bool = False, bookies=("b1", "b2")):
    return {
        "ledger_id": ledger_id,
        "ledger_bucket": ledger_id % LEDGER_BUCKETS,
        "state": state,
        "ensemble_size": len(bookies),
        "write_quorum": 2,
        "ack_quorum": 2,
        "segments": [{"first_entry_id": 0, "ensemble": list(bookies)}],
        "bookies": sorted(bookies),
        "mzxid": mzxid,
        "deleted": deleted,
        "updated_at": datetime.fromtimestamp(mzxid, tz=UTC),
    }


def record(log: LedgerLog, root, batch_id: int, rows: list[dict[str, Any]], *, append_index=True) -> None:
    """One batch as the sink records it; with ``append_index`` its index rows are appended at once (the
    sink's ``index_append_interval_s`` = 0), else they wait for a later :meth:`LedgerLog.flush_index`."""
    log.open(batch_id)
    log.batch_started(batch_id)
    log.record(BatchWriter(root, APP, batch_id), rows)
    if append_index:
        log.flush_index()


def raw_index(root) -> list[tuple[str, int, int]]:
    """Every row of the ``ledger_bookies`` table as (bookie, ledger, version), sorted."""
    table = DeltaTable(table_path(root, "ledger_bookies")).to_pyarrow_table()
    columns = (table.column(name).to_pylist() for name in ("bookie", "ledger_id", "mzxid"))
    return sorted(zip(*columns, strict=True))


def every_reader_of_the_index(log: LedgerLog, root, bookies: list[str]) -> list[list[tuple[str, int, int]]]:
    """The current index rows on ``bookies`` as the job's readers, ``read_table`` and ``bkaudit query`` see
    them, each as sorted (bookie, ledger, version)."""
    table = DeltaTable(table_path(root, "ledger_bookies"))
    in_job = log.read_index(table, bookies, ["bookie", "ledger_id", "mzxid"]).to_pylist()
    outside = [r for r in read_table(root, "ledger_bookies").to_pylist() if r["bookie"] in bookies]
    with Lakehouse(root) as lakehouse:
        lakehouse._view("ledger_bookies")
        queried = lakehouse._con.execute("SELECT bookie, ledger_id, mzxid FROM ledger_bookies").fetchall()
    return [
        sorted((r["bookie"], r["ledger_id"], r["mzxid"]) for r in in_job),
        sorted((r["bookie"], r["ledger_id"], r["mzxid"]) for r in outside),
        sorted(q for q in queried if q[0] in bookies),
    ]


def raw_ledgers(root) -> dict[int, int]:
    table = DeltaTable(table_path(root, "ledgers")).to_pyarrow_table()
    return dict(zip(table.column("ledger_id").to_pylist(), table.column("mzxid").to_pylist(), strict=True))


@pytest.fixture
def root(tmp_path):
    ensure_tables(tmp_path)
    return tmp_path


def test_readers_see_every_finished_batch_and_the_raw_table_catches_up_within_the_fold_interval(root):
    log = LedgerLog(root, APP)
    record(log, root, 0, [row(1, 10), row(2, 11)])
    record(log, root, 1, [row(1, 12, bookies=("b1", "b3"))])
    # Finished batches: visible at once through read_table and bkaudit query; the raw table has no fold yet.
    current = {r["ledger_id"]: r["mzxid"] for r in read_table(root, "ledgers").to_pylist()}
    assert current == {1: 12, 2: 11}
    by_query = {r["ledger_id"]: r["bookies"] for r in Lakehouse(root).ledgers().to_pylist()}
    assert by_query == {1: ["b1", "b3"], 2: ["b1", "b2"]}  # ledger 1 at its batch-1 version
    assert raw_ledgers(root) == {}
    interval_s = 0.3
    log.start_folding(interval_s)
    try:
        record(log, root, 2, [row(3, 13)])  # batch 1 is done (Spark started 2): foldable
        started = time.monotonic()
        while raw_ledgers(root) != {1: 12, 2: 11} and time.monotonic() - started < 30:
            time.sleep(0.05)
        caught_up = time.monotonic() - started
    finally:
        log.stop_folding(fold_all=False)
    assert raw_ledgers(root) == {1: 12, 2: 11}
    fold = log.last_fold
    assert fold is not None and fold.through == 1
    assert caught_up <= interval_s + fold.seconds + 1.0  # the bound, with scheduling slack
    log.stop_folding(fold_all=True)  # the job's stop folds the running batch too
    assert raw_ledgers(root) == {1: 12, 2: 11, 3: 13}


def test_the_index_shows_only_current_versions_before_and_after_its_cleanup(root):
    log = LedgerLog(root, APP)
    record(log, root, 0, [row(1, 10, bookies=("b1", "b2")), row(2, 11, bookies=("b1", "b3"))])
    record(log, root, 1, [row(1, 12, bookies=("b2", "b4")), row(2, 13, deleted=True)])
    current = sorted((r["bookie"], r["ledger_id"]) for r in read_table(root, "ledger_bookies").to_pylist())
    assert current == [("b2", 1), ("b4", 1)]
    raw = DeltaTable(table_path(root, "ledger_bookies")).to_pyarrow_table()
    assert raw.num_rows == 6  # the old versions' rows are still there
    assert log.current_index(raw).num_rows == 2
    removed = sum(log.clean_index(max_bookies=2) for _ in range(3))
    assert removed == 4
    raw = DeltaTable(table_path(root, "ledger_bookies")).to_pyarrow_table()
    assert sorted(
        zip(raw.column("bookie").to_pylist(), raw.column("ledger_id").to_pylist(), strict=True)
    ) == [
        ("b2", 1),
        ("b4", 1),
    ]
    assert sorted((r["bookie"], r["ledger_id"]) for r in read_current_index(root).to_pylist()) == current


def test_until_the_index_append_every_reader_indexes_changed_ledgers_by_their_current_rows(root):
    log = LedgerLog(root, APP)
    record(log, root, 0, [row(1, 10, bookies=("b1", "b2")), row(2, 11, bookies=("b1", "b3"))])
    record(
        log, root, 1, [row(1, 12, bookies=("b2", "b4")), row(3, 13, bookies=("b1", "b4"))], append_index=False
    )
    record(log, root, 2, [row(2, 14, deleted=True), row(3, 15, bookies=("b3", "b4"))], append_index=False)
    expected = [("b2", 1, 12), ("b3", 3, 15), ("b4", 1, 12), ("b4", 3, 15)]
    assert raw_index(root) == [("b1", 1, 10), ("b1", 2, 11), ("b2", 1, 10), ("b3", 2, 11)]  # batch 0's only
    assert every_reader_of_the_index(log, root, ["b1", "b2", "b3", "b4"]) == [expected] * 3
    assert every_reader_of_the_index(log, root, ["b3"]) == [[("b3", 3, 15)]] * 3
    assert log.fold(through=2).through == 0  # a fold never passes the index's last append

    assert log.flush_index() == 4  # the current versions only: ledger 3's version 13 was replaced before
    assert raw_index(root) == sorted([("b1", 1, 10), ("b1", 2, 11), ("b2", 1, 10), ("b3", 2, 11), *expected])
    assert every_reader_of_the_index(log, root, ["b1", "b2", "b3", "b4"]) == [expected] * 3
    assert log.flush_index() == 0  # nothing recorded since
    assert log.fold(through=2).through == 2
    assert every_reader_of_the_index(log, root, ["b1", "b2", "b3", "b4"]) == [expected] * 3


def test_the_job_reads_appended_versions_from_the_index_and_later_ones_from_memory(root):
    log = LedgerLog(root, APP)
    record(log, root, 0, [row(1, 10, bookies=("b1", "b2")), row(2, 11, bookies=("b1", "b2"))])
    before_append = DeltaTable(table_path(root, "ledger_bookies"))  # holds batch 0's versions
    record(log, root, 1, [row(1, 12, bookies=("b1", "b3"))])  # appended at once
    record(log, root, 2, [row(2, 13, bookies=("b3", "b4"))], append_index=False)  # in memory only
    columns = ["bookie", "ledger_id", "mzxid"]

    def on(table, bookies):
        return sorted(tuple(r.values()) for r in log.read_index(table, bookies, columns).to_pylist())

    newest = DeltaTable(table_path(root, "ledger_bookies"))
    assert on(newest, ["b2"]) == []  # both ledgers left b2: the stored rows of older versions are not current
    assert on(newest, ["b1", "b3", "b4"]) == [("b1", 1, 12), ("b3", 1, 12), ("b3", 2, 13), ("b4", 2, 13)]
    # A handle opened before batch 1's append (a reader's table not yet brought up to date): ledger 1's new
    # version is past what it holds, so it comes from memory too.
    assert on(before_append, ["b1", "b3", "b4"]) == on(newest, ["b1", "b3", "b4"])


def test_after_a_crash_the_versions_not_appended_to_the_index_are_appended_once(root):
    log = LedgerLog(root, APP)
    record(log, root, 0, [row(1, 10, bookies=("b1", "b2")), row(2, 11, bookies=("b1", "b3"))])
    log.fold(through=0)
    record(log, root, 1, [row(1, 12, bookies=("b2", "b4"))])  # appended, not folded
    record(log, root, 2, [row(2, 13, state="OPEN", bookies=("b1", "b3")), row(4, 14)], append_index=False)
    record(log, root, 3, [row(4, 15)], append_index=False)
    del log  # the process dies: batches 2 and 3 are in ledger_changes, not in the index
    expected = [("b1", 2, 13), ("b1", 4, 15), ("b2", 1, 12), ("b2", 4, 15), ("b3", 2, 13), ("b4", 1, 12)]

    restarted = LedgerLog(root, APP)
    restarted.open(4)
    assert every_reader_of_the_index(restarted, root, ["b1", "b2", "b3", "b4"]) == [expected] * 3
    assert restarted.flush_index() == 4  # ledgers 2 and 4; ledger 1's version was appended before
    restarted.fold(through=3)
    del restarted  # and dies again after the append, before anything else

    again = LedgerLog(root, APP)
    again.open(4)
    assert again.flush_index() == 0  # found in the index: nothing appended twice
    assert every_reader_of_the_index(again, root, ["b1", "b2", "b3", "b4"]) == [expected] * 3
    assert [r for r in raw_index(root) if r in set(expected)] == expected  # each current row once


def test_an_index_cleanup_past_its_time_budget_stops_after_its_first_partition(root):
    log = LedgerLog(root, APP)
    record(log, root, 0, [row(1, 10, bookies=("b1", "b2")), row(2, 11, bookies=("b3", "b4"))])
    record(log, root, 1, [row(1, 12, bookies=("b1", "b2")), row(2, 13, bookies=("b3", "b4"))])
    assert log.clean_index(max_bookies=4, budget_s=0.0) == 1  # one partition's old row, then out of time
    assert len(raw_index(root)) == 7
    assert log.clean_index(max_bookies=4) == 3  # the next run goes on from the next partition
    assert raw_index(root) == [("b1", 1, 12), ("b2", 1, 12), ("b3", 2, 13), ("b4", 2, 13)]


def test_the_index_cleanup_rewrites_a_partition_of_many_files_as_one_with_no_old_row_to_remove(root):
    # Each index append adds a file to every bookie it touches; a loss reads its bookie's partition.
    log = LedgerLog(root, APP)
    appends = 12  # more than ledger_log.INDEX_PARTITION_FILES
    for batch_id in range(appends):  # new ledgers only: nothing for the cleanup to remove
        record(log, root, batch_id, [row(batch_id, 10 + batch_id, bookies=("b1", "b2"))])
    table = DeltaTable(table_path(root, "ledger_bookies"))
    assert len(table.file_uris(file_pruning_predicate=[("bookie", "=", "b1")])) == appends
    before = raw_index(root)
    assert sum(log.clean_index(max_bookies=1) for _ in range(2)) == 0
    table = DeltaTable(table_path(root, "ledger_bookies"))
    assert [len(table.file_uris(file_pruning_predicate=[("bookie", "=", b)])) for b in ("b1", "b2")] == [1, 1]
    assert raw_index(root) == before


def test_folding_with_vacuum_rounds_bounds_the_commit_files_kept_by_ledgers_and_by_the_index(root):
    log = LedgerLog(root, APP)
    record(log, root, 0, [row(1, 10)])
    log.start_folding(3600.0, vacuum_rounds=3)
    log.stop_folding(fold_all=False)
    kept = {
        name: DeltaTable(table_path(root, name)).metadata().configuration.get("delta.logRetentionDuration")
        for name in ("ledgers", "ledger_bookies")
    }
    assert kept == {"ledgers": "interval 1 hours", "ledger_bookies": "interval 10 minutes"}


def test_a_replayed_batch_already_in_the_index_is_not_appended_again(root):
    log = LedgerLog(root, APP)
    record(log, root, 0, [row(1, 10, bookies=("b1", "b2"))])
    record(log, root, 1, [row(1, 12, bookies=("b2", "b3"))])  # appended; then a crash before Spark's commit
    replay = LedgerLog(root, APP)
    record(replay, root, 1, [row(1, 12, bookies=("b2", "b3"))])
    assert raw_index(root) == [("b1", 1, 10), ("b2", 1, 10), ("b2", 1, 12), ("b3", 1, 12)]


def test_an_index_cleanup_with_nothing_recorded_since_the_last_reads_nothing(root, monkeypatch):
    import connectors.delta.ledger_log as ledger_log

    scans: list[Any] = []
    real_scan = ledger_log.scan_partitions
    monkeypatch.setattr(
        ledger_log, "scan_partitions", lambda *a, **k: scans.append(a[2]) or real_scan(*a, **k)
    )
    log = LedgerLog(root, APP)
    record(log, root, 0, [row(1, 10, bookies=("b1", "b2"))])
    record(log, root, 1, [row(1, 12, bookies=("b2", "b3"))])
    assert sum(log.clean_index(max_bookies=1) for _ in range(5)) == 2  # b1 and b2 held version 10's rows
    read = len(scans)
    assert [log.clean_index(max_bookies=1) for _ in range(3)] == [0, 0, 0]
    assert len(scans) == read  # idle: no partition read
    record(log, root, 2, [row(1, 14, bookies=("b3", "b4"))])
    assert sum(log.clean_index(max_bookies=1) for _ in range(6)) == 2  # version 12's rows on b2 and b3
    assert sorted((r["bookie"], r["ledger_id"]) for r in read_current_index(root).to_pylist()) == [
        ("b3", 1),
        ("b4", 1),
    ]
    raw = DeltaTable(table_path(root, "ledger_bookies")).to_pyarrow_table()
    assert raw.num_rows == 2


def test_a_replayed_batch_sees_the_state_before_it_even_after_a_fold_covered_it(root):
    log = LedgerLog(root, APP)
    record(log, root, 0, [row(1, 10)])
    record(log, root, 1, [row(1, 12), row(2, 13)])
    log.fold(through=1)  # a stop folded batch 1; then a crash before Spark recorded it done
    replay = LedgerLog(root, APP)
    replay.open(1)
    mzxid, gone = replay.versions(np.array([1, 2]))
    assert mzxid.tolist() == [10, -1] and gone.tolist() == [False, False]
    assert replay.rows([1])[1]["mzxid"] == 10
    record(replay, root, 1, [row(1, 12), row(2, 13)])  # the replay's writes are skipped, memory updated
    assert replay.versions(np.array([1, 2]))[0].tolist() == [12, 13]
    assert replay.fold(through=1).merged is False  # ledgers already holds it
    assert raw_ledgers(root) == {1: 12, 2: 13}


def test_a_batch_run_again_by_the_same_process_forgets_its_first_attempt_and_the_next_keeps_it(root):
    log = LedgerLog(root, APP)
    record(log, root, 0, [row(1, 10)])
    record(log, root, 1, [row(1, 12), row(2, 13)])
    log.open(1)  # batch 1 again (its first attempt failed after recording): the state before it
    assert log.versions(np.array([1, 2]))[0].tolist() == [10, -1]
    assert log.rows([1])[1]["mzxid"] == 10
    record(log, root, 1, [row(1, 12), row(2, 13)])
    log.open(2)  # the next batch: nothing to forget, batch 1 stays
    assert log.versions(np.array([1, 2]))[0].tolist() == [12, 13]
    assert log.rows([2])[2]["mzxid"] == 13


def test_the_background_check_walks_closed_live_ledgers_from_memory(root):
    log = LedgerLog(root, APP)
    record(log, root, 0, [row(i, 10 + i) for i in range(1, 7)])
    log.fold(through=0)
    record(log, root, 1, [row(2, 30, deleted=True), row(3, 31, state="OPEN"), row(9, 32)])
    assert log.closed_after(-1, 10) == [1, 4, 5, 6, 9]
    assert log.closed_after(4, 2) == [5, 6]


def test_the_background_check_walks_open_ledgers_too_but_not_those_in_recovery(root):
    log = LedgerLog(root, APP)
    record(log, root, 0, [row(1, 10), row(2, 11, state="OPEN"), row(3, 12, state="IN_RECOVERY")])
    log.fold(through=0)
    record(
        log, root, 1, [row(4, 20, state="OPEN"), row(1, 21, state="IN_RECOVERY"), row(5, 22, deleted=True)]
    )
    assert log.checked_after(-1, 10) == [2, 4]
    assert log.checked_after(2, 10) == [4] and log.checked_count() == 2
    assert log.closed_after(-1, 10) == [] and log.closed_count() == 0


def test_folded_changes_older_than_the_retention_are_expired_and_the_state_stays(root):
    log = LedgerLog(root, APP)
    record(log, root, 0, [row(1, 10), row(2, 11)])  # updated_at in 1970: long past any retention
    record(log, root, 1, [row(1, 12)])
    assert log.expire_changes(retention_hours=1) is False  # nothing folded yet: nothing may go
    log.fold(through=0)
    assert log.expire_changes(retention_hours=1) is True
    changes = DeltaTable(table_path(root, "ledger_changes")).to_pyarrow_table()
    assert changes.column("batch_id").to_pylist() == [1]  # batch 0 folded and old: gone; batch 1 kept
    current = {r["ledger_id"]: r["mzxid"] for r in read_table(root, "ledgers").to_pylist()}
    assert current == {1: 12, 2: 11}


def test_a_fold_rewrites_only_the_partitions_its_changes_fall_in(root):
    log = LedgerLog(root, APP)
    record(log, root, 0, [row(i, 10 + i) for i in range(LEDGER_BUCKETS * 2)])  # every bucket
    log.fold(through=0)
    before = set(DeltaTable(table_path(root, "ledgers")).file_uris())
    record(log, root, 1, [row(1, 100), row(1 + LEDGER_BUCKETS, 101)])  # both in bucket 1
    log.fold(through=1)
    after = set(DeltaTable(table_path(root, "ledgers")).file_uris())
    bucket_1 = {uri for uri in before ^ after if "ledger_bucket=1/" in uri}
    assert before - after and before - after <= bucket_1 and after - before <= bucket_1
    expected = {i: 10 + i for i in range(LEDGER_BUCKETS * 2)} | {1: 100, 1 + LEDGER_BUCKETS: 101}
    assert raw_ledgers(root) == expected


def test_lookups_after_many_folds_match_the_changes_applied_in_order(root):
    """After many folds (the base in memory swapped each time), every lookup equals the changes applied."""
    import random

    rng = random.Random(7)
    log = LedgerLog(root, APP)
    model: dict[int, tuple[int, bool, str]] = {}  # ledger → (mzxid, deleted, state)
    for batch_id in range(40):
        rows = []
        for ledger_id in rng.sample(range(60), 12):
            mzxid, deleted = 1000 * batch_id + ledger_id, rng.random() < 0.15
            state = rng.choice(["OPEN", "CLOSED"])
            rows.append(row(ledger_id, mzxid, state=state, deleted=deleted))
            model[ledger_id] = (mzxid, deleted, state)
        record(log, root, batch_id, rows)
        if rng.random() < 0.8:
            log.fold(through=batch_id)
    ids = np.arange(-1, 62)
    mzxid, gone = log.versions(ids)
    assert {
        i: (m, g) for i, m, g in zip(ids.tolist(), mzxid.tolist(), gone.tolist(), strict=True) if m >= 0
    } == {i: (m, d) for i, (m, d, _) in model.items()}
    taken = log.take(np.array(sorted(model)), ["ledger_id", "mzxid"])
    assert sorted(zip(*(taken.column(c).to_pylist() for c in ("ledger_id", "mzxid")), strict=True)) == sorted(
        (i, m) for i, (m, _, _) in model.items()
    )
    closed = sorted(i for i, (_, d, s) in model.items() if s == "CLOSED" and not d)
    assert log.closed_after(-1, 100) == closed
    assert log.closed_after(closed[2], 3) == closed[3:6]


def test_a_fold_in_a_process_of_its_own_leaves_the_state_a_fold_here_would(root):
    here, there = root / "here", root / "there"
    logs = {}
    for name, path in (("here", here), ("there", there)):
        ensure_tables(path)
        logs[name] = log = LedgerLog(path, APP)
        log.fold_in_child_from_rows = 10**9
        record(log, path, 0, [row(1, 10), row(2, 11, bookies=("b1", "b3"))])
        log.fold(through=0)  # folded here by both
        log.fold_in_child_from_rows = 10**9 if name == "here" else 0  # the next ticks in the child
        record(log, path, 1, [row(1, 12, state="OPEN"), row(3, 13, deleted=True)])
        log.fold(through=1)
        record(log, path, 2, [row(2, 14), row(4, 15)])
        log.fold(through=2)
    assert raw_ledgers(there) == raw_ledgers(here) == {1: 12, 2: 14, 3: 13, 4: 15}
    ids = np.arange(6)
    assert [v.tolist() for v in logs["there"].versions(ids)] == [
        v.tolist() for v in logs["here"].versions(ids)
    ]
    assert logs["there"].closed_after(-1, 10) == logs["here"].closed_after(-1, 10) == [2, 4]
    assert DeltaTable(table_path(there, "ledgers")).transaction_version(f"{APP}.fold") == 2
    assert not list(there.glob("_fold/*.arrow"))  # no copy of the whole state: the rows stay in ledgers

    restarted = LedgerLog(there, APP)  # from ledgers at its version, then a fold by the child again
    restarted.fold_in_child_from_rows = 0
    record(restarted, there, 3, [row(4, 16)])
    assert restarted.fold(through=3).merged
    assert raw_ledgers(there) == {1: 12, 2: 14, 3: 13, 4: 16}
    restarted.stop_folding()


def test_the_first_fold_of_a_snapshot_into_an_empty_table_runs_in_a_process_of_its_own(root):
    log = LedgerLog(root, APP)
    log.fold_in_child_from_rows = 0
    record(log, root, 0, [row(1, 10), row(2, 11)])
    record(log, root, 1, [row(3, 12)])
    assert log.fold(through=1).merged  # an empty base, 3 rows of changes
    assert raw_ledgers(root) == {1: 10, 2: 11, 3: 12}
    log.stop_folding()


def test_a_fold_whose_process_fails_says_why_and_the_next_fold_takes_the_changes(root, monkeypatch):
    from connectors.delta import _fold_process

    log = LedgerLog(root, APP)
    log.fold_in_child_from_rows = 0
    record(log, root, 0, [row(1, 10), row(2, 11)])
    monkeypatch.setattr(_fold_process, "__name__", "connectors.delta.no_such_module")
    with pytest.raises(RuntimeError, match=r"the fold through batch 0 failed \(exit 1\): .*no_such_module"):
        log.fold(through=0)
    monkeypatch.undo()
    assert raw_ledgers(root) == {}
    assert log.fold(through=0).merged
    assert raw_ledgers(root) == {1: 10, 2: 11}


def _child_pids(pid: int) -> list[int]:
    """The live children of process ``pid`` (every thread's, from /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:  # the thread ended meanwhile
            continue
    return found


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the fold's process through /proc")
def test_a_fold_process_whose_job_dies_while_it_starts_commits_nothing(root):
    log = LedgerLog(root, APP)
    record(log, root, 0, [row(1, 10), row(2, 11)])
    request = FoldRequest(
        root=str(root),
        app=f"{APP}.fold",
        folded=-1,
        through=0,
        buckets=LEDGER_BUCKETS,
        complete=0,
        reached=0,
        base_version=DeltaTable(table_path(root, "ledgers")).version(),
    )
    job = subprocess.Popen(
        [sys.executable, "-c", f"from connectors.delta._fold_process import *; fold_in_child({request!r})"],
        cwd=REPO,
    )
    try:
        started = time.monotonic()
        while not (fold := _child_pids(job.pid)) and time.monotonic() - started < 60:
            time.sleep(0.001)
        assert fold, "the job never started the fold's process"
    finally:
        job.kill()  # while the fold's process is still importing: before it could ask to die with the job
        job.wait(30)
    started = time.monotonic()
    while pid_alive(fold[0]) and time.monotonic() - started < 120:
        time.sleep(0.05)
    assert not pid_alive(fold[0])  # gone, or a zombie its new parent has not reaped yet
    assert raw_ledgers(root) == {}
    assert DeltaTable(table_path(root, "ledgers")).transaction_version(f"{APP}.fold") is None


def _fold_commits(root) -> list[dict[str, Any]]:
    """The fold commits of ``ledgers``, oldest first."""
    history = DeltaTable(table_path(root, "ledgers")).history()
    return [c for c in reversed(history) if c.get("bkaudit.app_id") == f"{APP}.fold"]


def test_folds_in_rotation_rewrite_a_few_buckets_each_and_the_watermark_waits_for_the_last(root):
    log = LedgerLog(root, APP, buckets=4)
    record(log, root, 0, [row(i, 10 + i) for i in range(8)])  # every bucket
    record(log, root, 1, [row(1, 101), row(5, 105)])  # bucket 1 only
    first = log.fold(through=1, max_buckets=2)
    assert (first.buckets, first.through, first.complete) == (2, 1, -1)  # two buckets still hold batch 0
    assert read_current_ledgers_mzxid(root) == {i: 10 + i for i in range(8)} | {1: 101, 5: 105}
    second = log.fold(through=1, max_buckets=2)
    assert (second.buckets, second.complete) == (2, 1)  # the last ones with batch 0: every batch folded
    assert raw_ledgers(root) == {i: 10 + i for i in range(8)} | {1: 101, 5: 105}
    assert DeltaTable(table_path(root, "ledgers")).transaction_version(f"{APP}.fold") == 1
    record(log, root, 2, [row(2, 202)])
    third = log.fold(through=2, max_buckets=2)
    assert (third.buckets, third.complete) == (1, 2)  # only the bucket that changed
    commits = _fold_commits(root)
    assert [c["bkaudit.fold_through"] for c in commits] == ["-1", "1", "2"]
    assert [c["operationParameters"].get("predicate", "").count("ledger_bucket") for c in commits] == [
        2,
        2,
        1,
    ]
    again = LedgerLog(root, APP, buckets=4)  # a restart mid-rotation loads the same state
    again.open(3)
    assert again.versions(np.arange(8))[0].tolist() == log.versions(np.arange(8))[0].tolist()


def test_a_restart_mid_rotation_folds_the_buckets_left_and_replays_change_nothing(root):
    log = LedgerLog(root, APP, buckets=4)
    record(log, root, 0, [row(i, 10 + i) for i in range(8)])
    record(log, root, 1, [row(3, 103)])
    log.fold(through=1, max_buckets=1)  # bucket 0 folded through batch 1; the watermark stays before batch 0
    restarted = LedgerLog(root, APP, buckets=4)
    record(restarted, root, 1, [row(3, 103)])  # a replay of batch 1: the table already holds it
    record(restarted, root, 2, [row(4, 204)])
    while (report := restarted.fold(through=2, max_buckets=1)) is not None and report.complete < 2:
        pass
    expected = {i: 10 + i for i in range(8)} | {3: 103, 4: 204}
    assert raw_ledgers(root) == expected == read_current_ledgers_mzxid(root)
    folded = DeltaTable(table_path(root, "ledgers")).to_pyarrow_table().column("ledger_id").to_pylist()
    assert len(folded) == len(set(folded))


def test_a_table_of_another_bucket_count_is_rewritten_whole_by_the_first_fold(root):
    old = LedgerLog(root, APP, buckets=16)
    record(old, root, 0, [row(i, 10 + i) for i in range(40)])
    old.fold(through=0)
    new = LedgerLog(root, APP, buckets=4)
    record(new, root, 1, [row(5, 105)])
    report = new.fold(through=1, max_buckets=1)  # one bucket per tick, but the old layout goes at once
    assert report.buckets == 4 and report.complete == 1
    table = DeltaTable(table_path(root, "ledgers")).to_pyarrow_table()
    ids, buckets = (table.column(name).to_numpy() for name in ("ledger_id", "ledger_bucket"))
    assert len(ids) == len(set(ids.tolist())) == 40 and (buckets == ids % 4).all()
    assert raw_ledgers(root) == {i: 10 + i for i in range(40)} | {5: 105}


def test_files_the_folds_replaced_are_vacuumed_after_the_rounds_kept(root):
    log = LedgerLog(root, APP, buckets=2)
    log.vacuum_rounds = 2
    path = table_path(root, "ledgers")
    on_disk = []
    index = Path(table_path(root, "ledger_bookies"))
    index_files = []
    for batch in range(8):
        record(log, root, batch, [row(i, 100 * batch + i) for i in range(4)])
        log.fold(through=batch)
        on_disk.append(len(list(Path(path).glob("ledger_bucket=*/*.parquet"))))
        log.clean_index(max_bookies=2)  # the sink's cleanup, then its vacuum of the index
        log.vacuum_index()
        index_files.append(len(list(index.glob("bookie=*/*.parquet"))))
    assert on_disk[-1] == on_disk[-2] == on_disk[-3] == 2 * 3  # two buckets' files of the last three rounds
    assert index_files[-1] == index_files[-2] < 2 * 8  # two bookies: cleaned files gone, not 8 appends each
    assert sorted(
        (r["bookie"], r["ledger_id"], r["mzxid"]) for r in read_current_index(root).to_pylist()
    ) == [(b, i, 700 + i) for b in ("b1", "b2") for i in range(4)]
    current = DeltaTable(path).version()
    for version in range(current - 2, current + 1):  # the versions of the rounds kept are still readable
        assert DeltaTable(path, version=version).to_pyarrow_table().num_rows == 4
    assert raw_ledgers(root) == {i: 700 + i for i in range(4)}


def read_current_ledgers_mzxid(root) -> dict[int, int]:
    table = read_table(root, "ledgers")
    return dict(zip(table.column("ledger_id").to_pylist(), table.column("mzxid").to_pylist(), strict=True))


def test_whole_rows_read_by_bucket_and_in_chunks_equal_the_current_rows_mid_rotation(root):
    """The rows stay in ``ledgers``: a lookup of whole rows, and a walk of every ledger a few buckets at a
    time, equal the current rows from Delta alone, while some buckets are folded ahead of the watermark."""
    log = LedgerLog(root, APP, buckets=4)
    record(log, root, 0, [row(i, 10 + i) for i in range(12)])
    log.fold(through=0)
    record(log, root, 1, [row(1, 101, state="OPEN"), row(6, 106, deleted=True), row(13, 113)])
    record(log, root, 2, [row(2, 202, bookies=("b3", "b4"))])
    log.fold(through=2, max_buckets=1)  # one bucket ahead, the watermark still at batch 0
    record(log, root, 3, [row(5, 305)])
    expected = sorted(read_current_ledgers(root).to_pylist(), key=lambda r: r["ledger_id"])
    assert len(expected) == 13
    taken = log.take(np.arange(20)).to_pylist()
    assert sorted(taken, key=lambda r: r["ledger_id"]) == expected
    chunks = list(log.current_chunks(chunk_buckets=1))
    assert all(len({r["ledger_id"] % 4 for r in chunk.to_pylist()}) <= 1 for chunk in chunks)
    walked = [r for chunk in chunks for r in chunk.to_pylist()]
    assert sorted(walked, key=lambda r: r["ledger_id"]) == expected
    held = log.held_bytes()
    assert held["base_ledgers"] == 12 and held["base_columns"] < 12 * 40  # columns, not rows
