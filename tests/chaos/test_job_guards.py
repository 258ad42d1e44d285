"""What the job must refuse: a second job on its checkpoint, and heartbeats dated 2100.

Two jobs: two queries on one checkpoint would interleave their batch logs and their Delta commits (and may
publish alerts twice). The second must stop at once with exit 2 and one line
(:func:`tests.chaos.recovery.second_job_on_same_checkpoint`); the first must not notice: a bookie loss and
ledger changes afterwards end in the ground truth with no alert lost.

Future heartbeat: a heartbeat advances event time; one from the future (a watcher whose clock jumped, or a
hostile record) on every partition of the changes topic must not move the watermark there, or every later
real event would be dropped as late. Once the job has committed the batch that read them, a bookie is lost
(after a short recovery delay, so its loss waits for an event-time timer) and ledgers change. The job must
keep auditing and account for the rejected records: each injected heartbeat is a dead letter with its
reason, the dead-letter metric counts them, and the watermark is not ahead of the wall clock
(``bkaudit_stream_watermark_ahead_seconds`` is 0); :func:`tests.chaos.recovery.after_future_heartbeat`:
nothing to do.

The stack of this module keeps its tables and the lanes' checkpoint files on an S3 API (moto in server
mode, private to the module, behind a :class:`~bkaudit.testing.tcp_proxy.ProxyProcess`) and takes the
ZooKeeper lease, as a checkpoint there requires; so the guards above are shown there too, and so are the
faults of such a store:

- Store down (the proxy refuses connections) while the cluster changes and a bookie is lost: the job stops
  with exit 2 and one line (a bounded wait: the clients' retries, seconds against a refused connection),
  the store comes back on the same port with the same data, and the restarted job ends at the truth with
  no alert lost (:func:`tests.chaos.recovery.after_object_store_outage`).
- Store hung (the server frozen with SIGSTOP past the clients' 30 s request timeout), then continued: the
  job rides it out or stops as above; the same end.
- kill -9 of the whole job with its tables and checkpoint on the store (after a commit, and as the sink
  commits a batch's first table), restarted: the same end (:func:`tests.chaos.recovery.after_job_kill`).
- The lease lost: the job is frozen past its ZooKeeper session, another holder takes the lease, the job is
  continued: it stops with exit 2 and one line naming the lease, and nothing of it reaches the tables, the
  checkpoint or the alerts topic after the freeze (:func:`tests.chaos.recovery.after_lease_lost`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from deltalake import DeltaTable
from kazoo.client import KazooClient

from bkaudit.testing.harness import ServiceHarness
from bkaudit.testing.kafka_io import end_offsets, read_topic
from bkaudit.testing.s3_server import S3Server
from bkaudit.testing.tcp_proxy import ProxyProcess
from connectors import storage
from connectors.delta.tables import TABLES, table_path
from connectors.process import free_port
from core import events as ev
from core.settings import Settings
from tests.chaos.recovery import (
    DECISION_S,
    after_future_heartbeat,
    after_job_kill,
    after_lease_lost,
    after_object_store_outage,
    second_job_on_same_checkpoint,
)
from tests.chaos.stack import PARTITIONS, ChaosStack, JobProcess, chaos_stack, wait_for
from tests.chaos.test_process_kills import kill_in_the_sink, kill_running_job_after_next_commit
from tests.integration.event_fixtures import Watcher
from tests.integration.job_process import planned_offsets

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

YEAR_2100_MS = 4_102_444_800_000  # 2100-01-01T00:00:00Z
#: How long the store refuses connections: longer than delta-rs's retries against a refused connection
#: (10 retries, about 4 s) and pyarrow's (3 attempts, about 2 s), so every write of the job meets it.
#: BKAUDIT_CHAOS_STORE_DOWN_S / _HUNG_S lengthen them for a run by hand (60 s in docs/journal.md).
DOWN_S = float(os.environ.get("BKAUDIT_CHAOS_STORE_DOWN_S", "20"))
#: How long the store is frozen: longer than one request's timeout of delta-rs (30 s, object_store's
#: default) and of pyarrow (30 s, connectors/storage.py), so requests time out and are retried.
HUNG_S = float(os.environ.get("BKAUDIT_CHAOS_STORE_HUNG_S", "40"))
#: The job's ZooKeeper session (the chaos stack's zookeeper.session_timeout_s) and a freeze past it.
SESSION_S = 10.0
FROZEN_S = SESSION_S + 8.0


@pytest.fixture(scope="module")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[S3Server, ProxyProcess]]:
    """The module's own S3 server (frozen and cut off by its tests) and the proxy the job reaches it by."""
    server = S3Server(tmp_path_factory.mktemp("job-guards-s3"))
    server.start()
    proxy = ProxyProcess(server.port).start()
    try:
        yield server, proxy
    finally:
        proxy.stop()
        server.stop()


@pytest.fixture(scope="module")
def stack(
    chaos_services: ServiceHarness,
    chaos_seed: int,
    tmp_path_factory: pytest.TempPathFactory,
    object_store: tuple[S3Server, ProxyProcess],
) -> Iterator[ChaosStack]:
    """The chaos stack with the job's tables and checkpoint files on the S3 server, through the proxy; this
    process reads them from the server itself (its ``AWS_*`` variables, set for the module, put back)."""
    server, proxy = object_store
    bucket = server.new_bucket()
    store = server.object_store(storage.join(bucket, "lakehouse")).model_copy(
        update={"checkpoint_url": storage.join(bucket, "checkpoints")}
    )
    environ: dict[str, str] = {}
    storage.configure_from(Settings(object_store=store), environ)
    store = store.model_copy(update={"endpoint_url": proxy.url})
    saved = {name: os.environ.get(name) for name in environ}
    os.environ.update(environ)
    try:
        root = tmp_path_factory.mktemp("job_guards")
        with chaos_stack(chaos_services, root, chaos_seed, object_store=store) as built:
            yield built
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def heartbeats_dated(kafka, at_ms: int) -> set[tuple[int, int]]:
    """(partition, offset) of every heartbeat on the changes topic dated ``at_ms``."""
    found: set[tuple[int, int]] = set()
    for record in read_topic(kafka, kafka.changes_topic, timeout_s=60):
        event = ev.decode_event(record.value)
        if ev.payload_type(event) == "heartbeat" and event.heartbeat.watcher_time_ms == at_ms:
            found.add((record.partition, record.offset))
    return found


def change_the_cluster(stack, rng: random.Random) -> str:
    """A bookie loss and a few ledger changes; returns the lost bookie."""
    lost = stack.lose_bookie(rng)
    for ledger_id in rng.sample(stack.cluster.ledger_ids(), 3):
        stack.delete_ledger(ledger_id)
    for _ in range(5):
        stack.cluster.create_ledger(entries=2)
    return lost


def test_a_second_job_on_the_same_checkpoint_is_refused_and_the_first_runs_on(stack, chaos_seed):
    rng = random.Random(chaos_seed + 6)
    stack.start_healthy("a second job")
    # Same checkpoint, lakehouse, app id and topics; only its metrics port differs (not the lock's job).
    twin = dataclasses.replace(
        stack.run, stream_settings={**stack.run.stream_settings, "METRICS_PORT": str(free_port())}
    )
    second = JobProcess(twin, "second", twin.start("second", available_now=False))
    try:
        line = second_job_on_same_checkpoint(stack, second)
    finally:
        second.stop()
    stack.require_alive()
    lost = stack.lose_bookie(rng)
    with stack.churning(random.Random(rng.random())):
        time.sleep(3.0)
    settle_s = stack.settle(f"the first job after the second was refused, churn, {lost} lost")
    stack.wait_read_to_end()
    stack.assert_no_alert_lost()
    assert stack.kafka_dead_letters() == [], "the watcher published nothing a job should reject"
    print(f"\nsecond job: {line!r}; tables = truth {settle_s:.0f} s later")


def test_a_heartbeat_from_2100_neither_stops_the_audit_nor_goes_unaccounted(stack, chaos_seed):
    rng = random.Random(chaos_seed + 5)
    stack.start_healthy("heartbeats dated 2100")
    rogue = Watcher(stack.kafka, lambda: YEAR_2100_MS, cluster=stack.cluster.instance_id)
    rogue.heartbeat(YEAR_2100_MS, PARTITIONS)
    rogue.close()
    injected = heartbeats_dated(stack.kafka, YEAR_2100_MS)
    assert len(injected) == PARTITIONS, injected

    def read_past_them() -> bool:
        stack.require_alive()
        plans = planned_offsets(stack.run)
        batches = [
            batch
            for batch, offsets in plans.items()
            if offsets and all(offsets.get(str(p), -1) > offset for p, offset in injected)
        ]
        return bool(batches) and stack.run.last("commits") >= min(batches)

    # The real changes come in later batches than the heartbeats, after the watermark could move.
    wait_for("the job to commit the batch that read the heartbeats dated 2100", read_past_them, 120)
    after_future_heartbeat(stack)
    stack.cluster.set_lost_bookie_recovery_delay(2)
    lost = change_the_cluster(stack, rng)
    settle_s = stack.settle(f"real changes after heartbeats dated 2100, {lost} lost")
    stack.wait_read_to_end()
    stack.assert_no_alert_lost()

    def dead_lettered() -> set[tuple[int, int]]:
        return {(r["partition"], r["offset"]) for r in stack.kafka_dead_letters() if r["reason"]}

    wait_for(
        f"dead letters for the heartbeats dated 2100 at {sorted(injected)}",
        lambda: injected <= dead_lettered(),
        60,
    )
    assert dead_lettered() == injected, "only the heartbeats from 2100 are rejected"
    ahead = stack.metric_sum("bkaudit_stream_watermark_ahead_seconds")
    assert ahead == 0, f"the watermark is {ahead:.0f} s ahead of the wall clock"
    counted = stack.metric_sum("bkaudit_stream_dead_letters_total")
    assert counted >= len(injected), (
        f"the dead-letter metric counts {counted}, not the {len(injected)} rejected"
    )
    print(
        f"\nheartbeats dated 2100 at {sorted(injected)}: dead letters; tables = truth {settle_s:.0f} s later"
    )


def wait_for_exit(job: JobProcess, timeout_s: float) -> float | None:
    """Seconds until ``job`` exited, or None when it still runs after ``timeout_s``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if not job.alive():
            return time.monotonic() - started
        time.sleep(0.2)
    return None


def test_the_object_store_down_then_back_loses_no_change_and_no_alert(stack, chaos_seed, object_store):
    _, proxy = object_store
    rng = random.Random(chaos_seed + 7)
    stack.start_healthy("the object store down")
    job = stack.job
    with stack.churning(random.Random(rng.random())):
        time.sleep(1.0)
        proxy.refuse()
        try:
            lost = stack.lose_bookie(rng)
            stopped_s = wait_for_exit(job, DECISION_S)
            time.sleep(max(0.0, DOWN_S - (stopped_s or 0.0)))  # down for DOWN_S at least
        finally:
            proxy.accept()
        assert stopped_s is not None, (
            f"the job did not stop within {DECISION_S:.0f} s of the store refusing connections:\n"
            f"{stack.describe()}"
        )
        how = after_object_store_outage(stack, job)
        time.sleep(2.0)  # churn while the restarted job catches up
    settle_s = stack.settle(f"the object store back after {DOWN_S:.0f} s down, {lost} lost meanwhile")
    stack.wait_read_to_end()
    stack.assert_no_alert_lost()
    assert stack.kafka_dead_letters() == [], "the watcher published nothing a job should reject"
    print(
        f"\nstore down: the job stopped {stopped_s:.1f} s after; {how}; tables = truth {settle_s:.0f} s later"
    )


def test_the_object_store_hung_then_back_loses_no_change_and_no_alert(stack, chaos_seed, object_store):
    server, _ = object_store
    rng = random.Random(chaos_seed + 8)
    stack.start_healthy("the object store hung")
    job = stack.job
    pid = server._process.pid()
    assert pid is not None
    with stack.churning(random.Random(rng.random())):
        time.sleep(1.0)
        os.kill(pid, signal.SIGSTOP)
        try:
            lost = stack.lose_bookie(rng)
            time.sleep(HUNG_S)
        finally:
            os.kill(pid, signal.SIGCONT)
        # A request in flight when the store froze is retried within delta-rs's retry window (180 s).
        wait_for_exit(job, 15.0)
        how = after_object_store_outage(stack, job)
        time.sleep(2.0)
    settle_s = stack.settle(f"the object store continued after {HUNG_S:.0f} s frozen, {lost} lost meanwhile")
    stack.wait_read_to_end()
    stack.assert_no_alert_lost()
    print(f"\nstore hung {HUNG_S:.0f} s: {how}; tables = truth {settle_s:.0f} s later")


def test_kill9_of_the_job_with_its_tables_and_checkpoint_on_the_object_store(stack, chaos_seed):
    rng = random.Random(chaos_seed + 9)
    stack.start_healthy("the kills on the object store")
    assert str(stack.run.checkpoint).startswith("s3://") and str(stack.run.lakehouse).startswith("s3://")
    kills = []
    with stack.churning(random.Random(rng.random())):
        kills.append(kill_running_job_after_next_commit(stack, rng))
        lost = stack.lose_bookie(rng)
        sink_kills = kill_in_the_sink(stack)  # each try starts the job from the checkpoint, then kills it
        kills.extend(sink_kills)
        after_job_kill(stack)
        time.sleep(2.0)
    try:
        # A wide guard: the restarted job starts Spark, reloads its state and catches up through a store
        # that answers each small object in tens of milliseconds (195 s once at load 25-30).
        settle_s = stack.settle(
            f"after {len(kills)} kills on the object store, churn and the loss of {lost}", timeout_s=420
        )
    except AssertionError as err:
        raise AssertionError(f"{err}\nkills: {kills}\n{changes_of_deleted(stack)}") from None
    stack.wait_read_to_end()
    stack.assert_no_alert_lost()
    print(f"\nkills on the object store (tables = truth {settle_s:.0f} s after the last restart):")
    for kill in kills:
        print(f"  {kill}")
    assert sink_kills[-1].mid_batch, kills


def changes_of_deleted(stack: ChaosStack) -> str:
    """The ``ledger_changes`` rows of deleted ledgers the tables still show live (what a failure reports)."""
    live = {r["ledger_id"] for r in stack.table("ledgers") if not r["deleted"]}
    shown = sorted(live & stack.deleted)
    rows = [
        {k: r.get(k) for k in ("ledger_id", "deleted", "batch_id", "mzxid")}
        for r in stack.table("ledger_changes")
        if r["ledger_id"] in shown
    ]
    return f"deleted in the cluster, live in the tables: {shown}; their changes: {rows}"


def written(stack: ChaosStack) -> dict[str, Any]:
    """What the job has written so far: each table's version, the alerts topic's end offsets, the newest
    batch in each lane's offset log and state."""
    lanes = {
        folder: sorted(storage.list_files(storage.join(stack.run.checkpoint, folder), recursive=True))
        for folder in ("ledger-lane", "membership", "sink")
    }
    return {
        "tables": {name: DeltaTable(table_path(stack.run.lakehouse, name)).version() for name in TABLES},
        "alerts": end_offsets(stack.kafka, stack.kafka.alerts_topic),
        "checkpoint": lanes,
    }


def quiet(stack: ChaosStack) -> dict[str, Any]:
    """Freeze the watcher until the job has nothing left to do (what it wrote is the same on two readings
    two seconds apart), then freeze the job and continue the watcher; returns what the job had written.
    The job is frozen between batches, so nothing it began before the freeze can land after it."""
    assert stack.watcher.process is not None
    watcher, job = stack.watcher.process.pid, stack.job.process.pid
    os.killpg(watcher, signal.SIGSTOP)  # for seconds: its ZooKeeper session (10 s) outlives it
    try:
        last: list[dict[str, Any]] = [written(stack)]

        def settled() -> bool:
            now = written(stack)
            same = now == last[0]
            last[0] = now
            return same

        wait_for("the job to finish its batches", settled, 60, every_s=2.0)
        os.killpg(job, signal.SIGSTOP)
        return written(stack)
    finally:
        os.killpg(watcher, signal.SIGCONT)


def test_a_job_that_lost_its_lease_stops_before_it_writes_again(stack, chaos_seed):
    rng = random.Random(chaos_seed + 10)
    stack.start_healthy("the lost lease")
    job = stack.job
    lease = f"/bkaudit/leases/{stack.run.app_id}"
    other = KazooClient(hosts=stack.cluster.zk_hosts)
    other.start(30)
    try:
        before = quiet(stack)
        try:
            lost = stack.lose_bookie(rng)  # something for the job to write once it runs again
            for ledger_id in rng.sample(stack.cluster.ledger_ids(), 3):
                stack.delete_ledger(ledger_id)
            wait_for("the frozen job's lease to go with its session", lambda: not other.exists(lease), 60)
            holder = {"pid": 1, "host": "another-host", "started": "2026-11-30T00:00:00Z"}
            other.create(lease, json.dumps(holder).encode(), ephemeral=True, makepath=True)
        finally:
            os.killpg(job.process.pid, signal.SIGCONT)
        stopped_s = wait_for_exit(job, DECISION_S)
        assert stopped_s is not None, f"the job runs on without its lease:\n{stack.describe()}"
        assert written(stack) == before, "the job wrote after it lost its lease"
        other.delete(lease)
        line = after_lease_lost(stack, job)
    finally:
        other.stop()
        other.close()
    settle_s = stack.settle(f"the job restarted after its lease was lost, {lost} lost meanwhile")
    stack.wait_read_to_end()
    stack.assert_no_alert_lost()
    print(
        f"\nlease lost: stopped {stopped_s:.1f} s after it ran again: {line!r}; truth {settle_s:.0f} s later"
    )
