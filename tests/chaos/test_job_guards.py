"""What the job must refuse: a second job on its checkpoint, heartbeats dated 2100, writes on a full volume.

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

A volume that fills: the job's lakehouse and checkpoint move onto one small tmpfs of a private mount
namespace (:class:`tests.integration.full_volume.PrivateVolume`; the job runs in it), which fills while a
bookie is lost and ledgers change. The job stops before its next write (``stream.disk_floor_mb``) with one
line naming the lakehouse and exit 2 (no traceback, no Rust panic, no abort), ``bkaudit status`` names the
volume, a restart while it is still full is refused in one line; once there is room, the restarted job
brings the tables to the ground truth with no alert lost, and the temporary files the stop left are gone.
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path

import pytest

from bkaudit.testing.kafka_io import read_topic
from connectors.process import free_port
from core import events as ev
from tests.chaos.recovery import after_future_heartbeat, bkaudit, one_line_exit, second_job_on_same_checkpoint
from tests.chaos.stack import PARTITIONS, JobProcess, tail, wait_for
from tests.integration.event_fixtures import Watcher
from tests.integration.full_volume import PrivateVolume
from tests.integration.job_process import planned_offsets

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

YEAR_2100_MS = 4_102_444_800_000  # 2100-01-01T00:00:00Z
VOLUME_SIZE = "32m"
FLOOR_MB = 8
RESTART_SETTLE_S = 420.0


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


def test_a_volume_that_fills_stops_the_job_in_one_line_and_a_restart_with_room_converges(stack, chaos_seed):
    rng = random.Random(chaos_seed + 7)
    stack.start_healthy("a volume that fills")
    assert stack.job is not None
    stack.job.stop()  # the lakehouse and the checkpoint move onto a small volume while nothing writes them
    run = stack.run
    with PrivateVolume(run.root / "volume", VOLUME_SIZE, [run.lakehouse, run.root / "checkpoints"]) as volume:
        stack.run = dataclasses.replace(
            run,
            root=volume.seen(run.root),
            command_prefix=volume.enter,
            stream_settings={**run.stream_settings, "DISK_FLOOR_MB": str(FLOOR_MB)},
        )
        stack.read_rows = lambda name: volume.table_rows(run.lakehouse, name)
        try:
            started = time.monotonic()
            line, refused, left = _fill_while_running_then_restart_full(stack, volume, rng)
            stopped_s = time.monotonic() - started
            volume.make_room()
            stack.start_job()
            stack.cluster.create_ledger(entries=2)
            # The lost bookie's ledgers changed while the job was down reach the tables through the timers
            # query, whose first batch after a start takes up to two minutes on a busy host.
            stack.settle("the job restarted on the volume with room again", timeout_s=RESTART_SETTLE_S)
            stack.wait_read_to_end()
            stack.assert_no_alert_lost()
            still = [p for p in left if p.exists()]
            assert still == [], f"temporary files of the stopped job are still in the checkpoint: {still}"
        finally:
            stack.job.kill9()  # before the volume goes
            stack.read_rows = None
    print(
        f"\nvolume full: {line!r}\nrestart while full: {refused!r}; {len(left)} temporary files removed; "
        f"stopped and refused after {stopped_s:.0f} s, "
        f"converged {time.monotonic() - started - stopped_s:.0f} s later"
    )


def _fill_while_running_then_restart_full(stack, volume, rng):
    """The job runs on the volume, which fills while a bookie is lost and the cluster changes: one line
    naming the directory, exit 2, ``bkaudit status`` names it; a restart while it is still full is refused
    in one line. Returns both lines and the temporary files left."""
    job = stack.start_job()
    log = job.run.log_path(job.attempt)
    wait_for(
        "the job to run on the volume",
        lambda: not job.alive() or "bkaudit running" in log.read_text(errors="replace"),
        300,
    )
    stack.require_alive()
    stack.lose_bookie(rng)  # while the volume fills: its alerts are owed after the restart
    volume.fill(leave_bytes=FLOOR_MB * 2**20 // 2)
    with stack.churning(random.Random(rng.random())):
        wait_for("the job to stop on the full volume", lambda: not job.alive(), 180)
    line = _one_line_naming_the_lakehouse(stack, job)
    status = bkaudit(stack, "bkaudit status")
    assert f"low disk: lakehouse_root {stack.run.lakehouse}" in status.stdout, status.stdout + status.stderr
    left = _temporary_files(stack.run.checkpoint.parent)  # reached through the volume's namespace
    again = stack.start_job()
    wait_for("the restart on the full volume to exit", lambda: not again.alive(), 120)
    return line, _one_line_naming_the_lakehouse(stack, again), left


def _one_line_naming_the_lakehouse(stack, job) -> str:
    log = job.run.log_path(job.attempt)
    line = one_line_exit(log, job.exit_code())
    console = log.read_text(errors="replace")
    assert "panicked" not in console and "terminate called" not in console, tail(log, 60)
    assert line.startswith(
        f"bkaudit: too little space left on the device of lakehouse_root {stack.run.lakehouse}: "
    )
    return line


def _temporary_files(checkpoint: Path) -> list[Path]:
    return sorted(p for p in checkpoint.rglob(".*") if p.is_file() and ".tmp" in p.name)
