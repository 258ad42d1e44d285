"""Tables and checkpoints on an S3 API (moto in server mode on 127.0.0.1, started by the harness): the
storage module, the lakehouse health check, concurrent Delta commits, and the job end to end with its tables
and checkpoint files there, `bkaudit query` and status reading them."""

from __future__ import annotations

import json
import random
import threading

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from bkaudit.cli._status_facts import audit_summary, ledger_lane_position
from bkaudit.cli.main import run as run_cli
from connectors import storage
from connectors.delta.health import check_lakehouse, record_tables
from connectors.delta.ledger_log import LedgerLog
from connectors.delta.tables import ensure_tables, read_current_ledgers, read_table
from core import events as ev
from core.domain.rackmap import RackMap
from core.errors import ConfigError, ServiceError
from core.settings import Settings
from tests.chaos.fold_worker import expected_state, recorded_batch
from tests.chaos.test_kill_during_fold import run_until_killed, versions_of
from tests.integration.event_fixtures import alerts_on
from tests.integration.test_ledger_log import APP, record, row
from tests.integration.test_stream_job import BOOKIES, RACKS, job_with_watcher, run_once

pytestmark = pytest.mark.integration


@pytest.fixture
def bucket(s3_server, monkeypatch):
    """A fresh bucket, with this process's object-store variables set for the server (and put back)."""
    url = s3_server.new_bucket()
    environ: dict[str, str] = {}
    storage.configure_from(Settings(object_store=s3_server.object_store(url)), environ)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    return url


def test_storage_functions_do_on_s3_what_they_do_on_a_local_path(bucket):
    root = storage.join(bucket, "lakehouse")
    assert not storage.exists(root) and storage.list_dirs(root) == [] and storage.size(root) == 0
    storage.write_atomic(storage.join(root, "a", "x.json"), b'{"v": 1}')
    storage.write_atomic(storage.join(root, "a", "x.json"), b'{"v": 2}')  # replaced whole
    storage.write_atomic(storage.join(root, "b", "y"), b"12345")
    assert json.loads(storage.read_bytes(storage.join(root, "a", "x.json"))) == {"v": 2}
    assert storage.list_dirs(root) == ["a", "b"]
    assert storage.list_files(root, recursive=True) == ["a/x.json", "b/y"]
    assert storage.is_dir(storage.join(root, "a")) and storage.exists(storage.join(root, "b", "y"))
    assert storage.size(root) == 8 + 5
    storage.delete(storage.join(root, "b", "y"))
    assert not storage.exists(storage.join(root, "b", "y"))
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(storage.join(root, "nothing"))
    storage.ensure_writable(root, "object_store.lakehouse_url")


def test_a_missing_bucket_is_one_line_naming_the_setting(bucket):
    with pytest.raises(ConfigError) as caught:
        storage.ensure_writable("s3://no-such-bucket-here/lh", "object_store.lakehouse_url")
    text = str(caught.value)
    assert text.startswith("object_store.lakehouse_url (BKAUDIT_OBJECT_STORE__LAKEHOUSE_URL) is not writable")
    assert "\n" not in text and "bkaudit-test-secret" not in text


def test_a_store_that_refuses_connections_is_told_from_one_that_answers_no(bucket, monkeypatch):
    # What delta-rs and pyarrow raise once their retries against a closed port are spent is "did not
    # answer" (the job stops with that line); a missing bucket is an answer, not an outage.
    from connectors.process import free_port

    missing = "s3://no-such-bucket-here/t"
    with pytest.raises(OSError) as answered:
        DeltaTable(missing)
    assert storage.unreachable(answered.value) is None, answered.value
    closed = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv(storage.ENV_ENDPOINT, closed)
    storage._s3_client.cache_clear()
    try:
        for attempt in (
            lambda: DeltaTable(storage.join(bucket, "t")),
            lambda: storage.read_bytes(bucket + "/x"),
        ):
            with pytest.raises(OSError) as refused:
                attempt()
            try:
                raise RuntimeError("ledger-lane failed") from refused.value
            except RuntimeError as wrapped:
                down = storage.unreachable(wrapped)
            assert down is not None, refused.value
            line = str(down)
            assert line.startswith(f"the object store did not answer (endpoint {closed}; ")
            assert "\n" not in line and "\x1b" not in line and "bkaudit-test-secret" not in line
    finally:
        storage._s3_client.cache_clear()


def test_the_health_check_names_a_missing_data_file_and_a_cut_short_commit_on_s3(bucket):
    root = storage.join(bucket, "lh")
    ensure_tables(root)
    check_lakehouse(root)  # whole
    write_deltalake(storage.join(root, "extra"), pa.table({"n": [1]}))
    record_tables(root, {"extra"})
    data = [f for f in storage.list_files(storage.join(root, "extra")) if f.endswith(".parquet")]
    storage.delete(storage.join(root, "extra", data[0]))
    with pytest.raises(ServiceError, match=r"'extra' is damaged: its log names s3://.*, which is gone"):
        check_lakehouse(root)

    other = storage.join(bucket, "lh2")
    ensure_tables(other)
    commit = storage.join(other, "violations", "_delta_log", "00000000000000000000.json")
    storage.write_atomic(commit, storage.read_bytes(commit)[:40])
    with pytest.raises(ServiceError, match=r"'violations' is damaged: .*0\.json is cut short"):
        check_lakehouse(other)


def test_two_writers_committing_at_once_lose_no_commit(bucket):
    # delta-rs commits a version with a conditional PUT (If-None-Match: *): a writer that loses the race
    # re-reads the log and commits the next version, so no locking provider or unsafe rename is needed.
    path = storage.join(bucket, "t")
    write_deltalake(path, pa.table({"n": pa.array([0], pa.int64())}))
    stale = [DeltaTable(path) for _ in range(4)]  # every one of them still at version 0
    errors: list[BaseException] = []

    def append(table: DeltaTable, n: int) -> None:
        try:
            write_deltalake(table, pa.table({"n": pa.array([n], pa.int64())}), mode="append")
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=append, args=(t, i + 1)) for i, t in enumerate(stale)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    table = DeltaTable(path)
    assert table.version() == 4
    assert sorted(table.to_pyarrow_table().column("n").to_pylist()) == [0, 1, 2, 3, 4]


def test_a_fold_in_a_process_of_its_own_reads_and_commits_on_s3_and_rows_are_read_back_by_bucket(bucket):
    # The child inherits the AWS_* variables; its request file is on local disk.
    root = storage.join(bucket, "lh")
    ensure_tables(root)
    log = LedgerLog(root, APP)
    log.fold_in_child_from_rows = 0
    record(log, root, 0, [row(1, 10), row(2, 11)])
    record(log, root, 1, [row(1, 12), row(3, 13)])
    assert log.fold(through=1).merged
    folded = read_table(root, "ledgers")
    assert dict(zip(*(folded.column(c).to_pylist() for c in ("ledger_id", "mzxid")), strict=True)) == {
        1: 12,
        2: 11,
        3: 13,
    }
    rows = log.rows([1, 2, 3])  # folded: whole rows read back from their buckets on S3
    assert {i: r["mzxid"] for i, r in rows.items()} == {1: 12, 2: 11, 3: 13}
    assert rows[2]["bookies"] == row(2, 11)["bookies"]
    assert "_fold" not in storage.list_dirs(root)
    log.stop_folding()


@pytest.mark.chaos
def test_kill9_between_batches_and_folds_on_s3_loses_and_repeats_nothing(bucket):
    # tests/chaos/test_kill_during_fold.py's worker (the sink's ledger writes, index appends, folds in the
    # background and in a child) on tables on S3, SIGKILLed at random moments and restarted.
    root = storage.join(bucket, "lakehouse")
    rng = random.Random(20261129)
    for round_number in range(4):
        run_until_killed(root, round_number, rng)  # type: ignore[arg-type]  # a location, str or Path
    last = recorded_batch(root)
    assert last >= 4
    expected = expected_state(last)
    current = read_current_ledgers(root)
    ids = current.column("ledger_id").to_pylist()
    assert len(ids) == len(set(ids)) == len(expected)
    assert versions_of(current) == expected
    folded = read_table(root, "ledgers").column("ledger_id").to_pylist()
    assert len(folded) == len(set(folded))  # the fold never wrote a ledger twice


def test_the_job_keeps_its_tables_and_checkpoint_on_s3_and_query_reads_them_there(
    spark, kafka_settings, tmp_path, s3_server, bucket, capsys
):
    settings, watcher, t0 = job_with_watcher(kafka_settings, tmp_path, clock_offset_ms=-60_000)
    lakehouse = storage.join(bucket, "lakehouse")
    store = s3_server.object_store(lakehouse).model_copy(
        update={"checkpoint_url": storage.join(bucket, "checkpoints")}
    )
    settings = settings.model_copy(update={"object_store": store})
    watcher.send(ev.rack_map_event("file:/racks.json", RackMap.from_racks(RACKS), present=True))
    for bookie in BOOKIES:
        watcher.bookie(bookie, "WRITABLE")
    watcher.ledger(1, BOOKIES[0:3])
    watcher.ledger(2, BOOKIES[1:4])
    watcher.ledger(3, [BOOKIES[0], BOOKIES[3], BOOKIES[4]], wq=1, aq=1)
    watcher.heartbeat(t0 + 50_000)
    watcher.flush()
    run_once(spark, settings)
    watcher.bookie(BOOKIES[0], "GONE")
    watcher.heartbeat(t0 + 55_000)
    watcher.flush()
    run_once(spark, settings)

    firing = {(a["kind"], a["ledger_id"]) for _, a in alerts_on(settings.kafka) if a["state"] == "firing"}
    assert firing == {("BOOKIE_LOST", None), ("LEDGER_UNDER_REPLICATED", 1), ("LEDGER_UNRECOVERABLE", 3)}
    assert not (tmp_path / "lh").exists()  # nothing of the tables went to lakehouse_root
    assert storage.list_dirs(lakehouse)[:3] == ["bookies", "dead_letters", "ledger_bookies"]
    assert sorted(read_table(lakehouse, "ledgers").column("ledger_id").to_pylist()) == [1, 2, 3]
    # The lanes' checkpoint files are on S3 (the second run went on from them); only the timers query's
    # Spark checkpoint and the sources' status files are local.
    assert settings.checkpoint.startswith("s3://")
    assert {"ledger-lane", "membership"} <= set(storage.list_dirs(settings.checkpoint))
    assert storage.exists(storage.join(settings.checkpoint, "bkaudit-state-layout.json"))
    lane = ledger_lane_position(settings.checkpoint, settings.kafka.changes_topic)
    assert lane is not None and lane.batch_id >= 1
    local = tmp_path / "cp" / settings.stream.app_id
    assert not (local / "ledger-lane" / "offsets").exists()
    assert not (local / "membership" / "offsets").exists()
    assert (local / "timers" / "offsets").is_dir()

    capsys.readouterr()
    assert run_cli(["query", "alerts", "--lakehouse", lakehouse, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["kind"], r["ledger_id"]) for r in rows} == firing
    summary = audit_summary(settings.lakehouse)  # what `bkaudit status` reports of the tables
    assert summary["lost_bookies"] == [BOOKIES[0]]
    assert summary["open_alerts"] == dict.fromkeys(
        ["BOOKIE_LOST", "LEDGER_UNDER_REPLICATED", "LEDGER_UNRECOVERABLE"], 1
    )
