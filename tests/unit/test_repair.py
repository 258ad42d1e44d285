"""`bkaudit repair` on a lakehouse the job's own writers wrote: damage a derived table, repair it through
the CLI, and the table holds the rows it held before; the job's start gate then opens.

``violations`` is rebuilt from the alerts topic in tests/integration/test_repair_violations.py (Kafka);
here the tables whose sources are Delta tables.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from connectors.delta.ledger_log import LedgerLog
from connectors.delta.repair import open_alert_rows
from connectors.delta.tables import LEDGER_BUCKETS, BatchWriter, ensure_tables, read_table
from core.domain.alert_book import AlertBook
from core.domain.alerts import AlertKind
from core.settings import load_settings
from streaming.loss import record_transitions

APP = "repair-test"
T0 = 1_780_000_000_000


def ledger(ledger_id: int, mzxid: int, bookies: tuple[str, ...] = ("b1", "b2"), **extra: Any) -> dict:
    return {
        "ledger_id": ledger_id,
        "ledger_bucket": ledger_id % LEDGER_BUCKETS,
        "cluster": "c1",
        "state": "CLOSED",
        "ensemble_size": len(bookies),
        "write_quorum": 2,
        "ack_quorum": 2,
        "segments": [{"first_entry_id": 0, "ensemble": list(bookies)}],
        "bookies": sorted(bookies),
        "mzxid": mzxid,
        "deleted": False,
        "updated_at": datetime.fromtimestamp(mzxid, tz=UTC),
        **extra,
    }


def write_batches(root: Path) -> list[list[Any]]:
    """Two batches as the job writes them: ledger changes (the first folded, the second not yet: a job
    killed before its fold), the index appended, and alert transitions; returns each batch's transitions."""
    ensure_tables(root)
    log = LedgerLog(root, APP)
    log.open(0)
    log.record(BatchWriter(root, APP, 0), [ledger(i, 10 + i) for i in range(1, 31)])
    log.flush_index()
    log.fold(through=0)
    changed = [ledger(i, 100 + i, ("b2", "b3")) for i in range(1, 6)] + [ledger(6, 200, deleted=True)]
    log.batch_started(1)
    log.record(BatchWriter(root, APP, 1), changed)
    log.flush_index()
    transitions = []
    book = AlertBook("c1")
    book.set_bookie_condition(AlertKind.BOOKIE_LOST, "b1", True, at_ms=T0, detail={"missing_since": "x"})
    for ledger_id in range(1, 9):
        book.set_ledger_condition(
            AlertKind.LEDGER_UNDER_REPLICATED, ledger_id, True, at_ms=T0 + ledger_id, bookies=["b1"]
        )
    book.set_cluster_condition(AlertKind.RACK_MAP_INVALID, True, at_ms=T0 + 20, detail={"reason": "é"})
    record_transitions(BatchWriter(root, APP, 0), book)
    transitions.append(list(book.transitions))
    book = AlertBook.from_rows("c1", read_table(root, "open_alerts").to_pylist())
    for ledger_id in (1, 2, 3):
        book.set_ledger_condition(AlertKind.LEDGER_UNDER_REPLICATED, ledger_id, False, at_ms=T0 + 50)
    book.set_ledger_condition(AlertKind.METADATA_CORRUPT, 40, True, at_ms=T0 + 60, detail={"reason": "cut"})
    record_transitions(BatchWriter(root, APP, 1), book)
    transitions.append(list(book.transitions))
    return transitions


def rows_of(root: Path, name: str, drop: tuple[str, ...] = ()) -> list[str]:
    """The table's rows as the job's readers see them, canonical and sorted (columns in ``drop`` left out)."""
    table = read_table(root, name)
    table = table.drop([c for c in drop if c in table.column_names])
    return sorted(json.dumps(row, sort_keys=True, default=str) for row in table.to_pylist())


def cut_short(table: Path) -> Path:
    newest = sorted((table / "_delta_log").glob("*.json"))[-1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    return newest


def delete_a_data_file(table: Path) -> Path:
    gone = Path(DeltaTable(str(table)).file_uris()[0].removeprefix("file://"))
    gone.unlink()
    return gone


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two batches, written once per module (each test takes a copy: the log's paths are relative)."""
    root = tmp_path_factory.mktemp("written") / "lakehouse"
    write_batches(root)
    return root


def copy_of(template: Path, lakehouse: Path) -> None:
    shutil.copytree(template, lakehouse)


@pytest.fixture
def job_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in list(os.environ):
        if name.startswith("BKAUDIT_"):
            monkeypatch.delenv(name)

    def no_spark(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the job asked for Spark: its start checks passed")

    monkeypatch.setattr("streaming.session.build_spark_session", no_spark)
    lakehouse = tmp_path / "lakehouse"
    monkeypatch.setenv("BKAUDIT_LAKEHOUSE_ROOT", str(lakehouse))
    monkeypatch.setenv("BKAUDIT_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("BKAUDIT_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("BKAUDIT_STREAM__APP_ID", APP)
    return lakehouse


def starts(lakehouse: Path) -> None:
    """The job's start gate (lock, lease, layout, every table it created whole) opens, and its ledger
    state loads."""
    from streaming.job import exclusive_checkpoint

    with exclusive_checkpoint(load_settings()):
        LedgerLog(lakehouse, APP).ensure_open()


def test_repair_rebuilds_ledgers_the_index_and_open_alerts_equal_to_before(cli, job_env, written):
    lakehouse = job_env
    copy_of(written, lakehouse)
    derived = ("ledgers", "ledger_bookies", "open_alerts")
    before = {name: rows_of(lakehouse, name) for name in derived}
    cut_short(lakehouse / "ledgers")
    gone = delete_a_data_file(lakehouse / "ledger_bookies")
    shutil.rmtree(lakehouse / "open_alerts")

    refused = cli("stream")
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1
    assert (
        f"the Delta table 'ledger_bookies' is damaged: its log names {gone}, which is gone" in refused.stderr
    )
    assert "rebuild it from ledgers with `bkaudit repair`" in refused.stderr

    dry = cli("repair", "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert [line.split(" (")[0] for line in dry.text.splitlines()] == [
        "would rebuild ledgers from ledger_changes",
        "would rebuild ledger_bookies from ledgers",
        "would rebuild open_alerts from violations",
    ]
    assert (lakehouse / "ledgers" / "_delta_log").is_dir() and not (lakehouse / "open_alerts").exists()

    done = cli("repair")
    assert done.exit_code == 0, done.stderr
    assert "rebuilt ledgers from ledger_changes: 30 rows" in done.text
    assert "restart `bkaudit watch`" in done.text  # what ledger_changes no longer holds
    assert "rebuilt open_alerts from violations: 8 rows" in done.text
    assert {name: rows_of(lakehouse, name) for name in derived} == before
    assert sorted(p.name.split("-")[0] for p in (lakehouse / "_damaged").iterdir()) == [
        "ledger_bookies",
        "ledgers",
    ]  # set aside, not deleted; a table that was gone has nothing to set aside
    starts(lakehouse)
    assert cli("repair").text == "every table is whole: nothing to repair\n"


def test_a_batch_replayed_after_the_repair_is_not_written_twice(job_env, cli, written):
    lakehouse = job_env
    copy_of(written, lakehouse)
    cut_short(lakehouse / "open_alerts")
    assert cli("repair").exit_code == 0
    book = AlertBook("c1")
    book.set_ledger_condition(AlertKind.LEDGER_UNDER_REPLICATED, 99, True, at_ms=T0)
    assert record_transitions(BatchWriter(lakehouse, APP, 1), book) == (False, False)


def test_a_table_without_a_source_is_named_and_the_job_still_refuses(cli, job_env, written):
    lakehouse = job_env
    copy_of(written, lakehouse)
    truncated = cut_short(lakehouse / "ledger_changes")
    cut_short(lakehouse / "ledgers")
    result = cli("repair")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert f"the Delta table 'ledger_changes' is damaged ({truncated} is cut short" in result.stderr
    assert "it cannot be rebuilt (nothing else holds its rows): restore it from a backup" in result.stderr
    assert "cannot rebuild ledgers: its source ledger_changes is damaged" in result.stderr
    assert not (lakehouse / "_damaged").exists()  # nothing was touched
    assert "'ledger_changes' is damaged" in cli("stream").stderr
    assert "cannot be rebuilt" in cli("repair", "--table", "ledger_changes").stderr


def test_repair_of_a_path_without_the_jobs_lakehouse_says_so(cli, job_env):
    result = cli("repair")
    assert result.exit_code == 2
    assert f"no lakehouse written by `bkaudit stream` at {job_env}" in result.stderr
    assert not job_env.exists()  # nothing created there


def test_repair_of_a_lakehouse_on_an_object_store_is_refused_in_one_line(cli, job_env, written):
    # Not the local lakehouse_root that happens to be configured too: the job's tables are on the store.
    copy_of(written, job_env)
    result = cli("--set", "object_store.lakehouse_url=s3://bucket/lakehouse", "repair")
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "a local lakehouse only: object_store.lakehouse_url is s3://bucket/lakehouse" in result.stderr


def test_repair_is_refused_while_a_job_holds_the_checkpoint(cli, job_env, tmp_path, written):
    from streaming.checkpoint_lock import CheckpointLock

    copy_of(written, job_env)
    shutil.rmtree(job_env / "open_alerts")
    checkpoint = tmp_path / "checkpoints" / APP
    checkpoint.mkdir(parents=True)
    with CheckpointLock(checkpoint):
        result = cli("repair")
    assert result.exit_code == 2
    assert f"checkpoint {checkpoint} is in use by pid" in result.stderr
    assert not (job_env / "open_alerts").exists()


def test_a_rebuild_cut_short_keeps_the_job_refusing(cli, job_env, monkeypatch, written):
    lakehouse = job_env
    copy_of(written, lakehouse)
    shutil.rmtree(lakehouse / "open_alerts")

    def dies(_table: pa.Table) -> None:
        raise RuntimeError("killed")

    monkeypatch.setattr("connectors.delta.repair.open_alert_rows", dies)
    with pytest.raises(RuntimeError):
        cli("repair")
    assert (lakehouse / "open_alerts" / "_delta_log").is_dir()  # created empty, never filled
    assert "'open_alerts' is damaged: its rebuild did not finish" in cli("stream").stderr
    monkeypatch.setattr("connectors.delta.repair.open_alert_rows", open_alert_rows)
    assert cli("repair").exit_code == 0
    assert read_table(lakehouse, "open_alerts").num_rows == 8


def test_the_job_removes_the_temporary_files_a_stop_on_a_full_disk_left(job_env, tmp_path, written):
    """What Spark's checkpoint file manager (``.<name>.<uuid>.tmp`` and its ``.crc``, in every folder of
    the timers query's checkpoint, RocksDB's state included), the driver lanes and the fold leave when a
    write fails for want of space; the job's start removes them and nothing else."""
    lakehouse = job_env
    copy_of(written, lakehouse)
    checkpoint = tmp_path / "checkpoints" / APP
    left = [
        "timers/offsets/.7.1b2c.tmp",
        "timers/offsets/..7.1b2c.tmp.crc",
        "timers/commits/.6.9f8e.tmp",
        "timers/state/0/3/.12.zip.77aa.tmp",
        "timers/state/0/3/SSTs/.000009-4d.sst.5e.tmp",
        "ledger-lane/offsets/.41.json.tmp",
        "membership/state/.9.json.tmp",
        "ledger-lane/bkaudit-source-status.tmp",
    ]
    kept = ["timers/offsets/7", "timers/state/0/3/12.zip", "ledger-lane/offsets/41.json", "timers/metadata"]
    for name in left + kept:
        (checkpoint / name).parent.mkdir(parents=True, exist_ok=True)
        (checkpoint / name).write_bytes(b"x" * 10)
    scratch = lakehouse / "_fold"
    scratch.mkdir(exist_ok=True)  # the fold's scratch folder of the copied lakehouse, if it has one
    for name in [f"{APP}-12.arrow", f"{APP}-13.request.json", "other-12.arrow", "other-13.request.json"]:
        (scratch / name).touch()

    starts(lakehouse)
    files = sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file())
    assert files == sorted([*kept, "bkaudit.lock", "bkaudit-state-layout.json"])
    assert sorted(p.name for p in scratch.iterdir()) == ["other-12.arrow", "other-13.request.json"]


def test_a_whole_table_is_rebuilt_on_request_unless_its_source_lost_rows(cli, job_env, written):
    lakehouse = job_env
    copy_of(written, lakehouse)
    before = rows_of(lakehouse, "open_alerts")
    assert cli("repair", "--table", "open_alerts").text == "rebuilt open_alerts from violations: 8 rows\n"
    assert rows_of(lakehouse, "open_alerts") == before
    # The change log's retention removed the changes of ledgers 21..30: they are only in ledgers now.
    DeltaTable(str(lakehouse / "ledger_changes")).delete("batch_id = 0 AND ledger_id > 20")
    result = cli("repair", "--table", "ledgers")
    assert result.exit_code == 2
    assert "ledger_changes holds 20 rows of the 30 in ledgers" in result.stderr
    assert "ledgers is whole, left as it is" in result.stderr
    assert len(rows_of(lakehouse, "ledgers")) == 30


def test_ledgers_and_their_index_both_cut_short(cli, job_env, written):
    """The fold appends to the index: the index is rebuilt empty first, then written whole."""
    lakehouse = job_env
    copy_of(written, lakehouse)
    before = {name: rows_of(lakehouse, name) for name in ("ledgers", "ledger_bookies")}
    cut_short(lakehouse / "ledgers")
    cut_short(lakehouse / "ledger_bookies")
    done = cli("repair")
    assert done.exit_code == 0, done.stderr
    assert {name: rows_of(lakehouse, name) for name in before} == before
    starts(lakehouse)
