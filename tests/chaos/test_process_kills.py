"""kill -9 of the streaming job and of the watcher, while the cluster changes; restarts end at the truth.

Job: the simulator keeps creating, closing and deleting ledgers in the background; the real job
(``bkaudit stream``, long-running) is killed with SIGKILL (its whole process group: driver, JVM, Python
workers) three times: at a random moment after a batch commit, right after the sink's first Delta commit
of a batch that carries a bookie loss (tables half written, alerts maybe already published; tried again
until a kill lands there), and at a random moment again. The kill machinery is the crash test's
(:mod:`tests.integration.job_process`); the restart is :func:`tests.chaos.recovery.after_job_kill`.

Watcher: killed at a random moment while the cluster churns, with deletions and a bookie loss while no
watcher runs (its next START snapshot must reconcile them); then killed right after its snapshot began
(the topic holds the snapshot's begin marker and no end marker), the cluster changes again, and the next
watcher's snapshot must repair it all. Snapshot reads are made one at a time in this module, so that a
snapshot of 600 ledgers lasts about a second and can be interrupted. The restart is
:func:`tests.chaos.recovery.after_watcher_kill`.

Damaged tables: with the job stopped after a bookie loss, the newest commit of ``ledgers`` is cut to half
and the ``violations`` table deleted. The job refuses to start in one line (exit 2) naming the table and the
file instead of recreating ``violations`` empty; the command that line names (``bkaudit repair``) rebuilds
both, and the restarted job ends at the truth with every transition of ``violations`` back and no alert
lost. The restart is :func:`tests.chaos.recovery.restart_after_named_command`.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

import pytest

from bkaudit.testing.kafka_io import TopicTail, read_topic
from core import events as ev
from tests.chaos.recovery import (
    after_job_kill,
    after_watcher_kill,
    one_line_exit,
    restart_after_named_command,
)
from tests.chaos.stack import wait_for
from tests.integration.job_process import Kill, kill_during_batch

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

# One read at a time over 600 ledgers: a snapshot lasts long enough (about a second) to be interrupted.
STACK_OPTIONS = {
    "ledgers": 600,
    "watcher_settings": {"SNAPSHOT_BATCH_SIZE": "1", "SNAPSHOT_CONCURRENCY": "1"},
}
JOB_START_TIMEOUT_S = 300.0


def kill_running_job_after_next_commit(stack, rng: random.Random) -> Kill:
    """SIGKILL the running job a random 0-2 s after its next batch commit."""
    committed = stack.run.last("commits")

    def next_commit() -> bool:
        stack.require_alive()
        return stack.run.last("commits") > committed

    started = time.monotonic()
    wait_for(f"a commit after batch {committed}", next_commit, JOB_START_TIMEOUT_S, every_s=0.02)
    time.sleep(rng.uniform(0.0, 2.0))
    stack.job.kill9()
    planned, done = stack.run.last("offsets"), stack.run.last("commits")
    written = stack.run.tables_with_batch(planned) if planned > done else []
    return Kill("random", round(time.monotonic() - started, 1), planned, done, tuple(written))


def kill_in_the_sink(stack) -> list[Kill]:
    """SIGKILL the running job as its sink commits the first table of a batch, until a kill lands while
    the batch is half written (a small batch's tables may all be committed before the kill on a loaded
    machine; each try is a restart the next one recovers from); every kill made."""
    kills: list[Kill] = []
    while len(kills) < KILL_TRIES and not (kills and kills[-1].mid_batch):
        kills.append(
            kill_during_batch(
                stack.run,
                f"kill-sink-{len(kills)}",
                stack.run.last("commits") + 1,
                "sink",
                0.0,
                available_now=False,
                timeout_s=JOB_START_TIMEOUT_S,
            )
        )
    return kills


def snapshot_markers(kafka) -> dict[str, set[str]]:
    """snapshot id → the marker kinds seen for it on the changes topic (``begin``, ``end``)."""
    markers: dict[str, set[str]] = {}
    for record in read_topic(kafka, kafka.changes_topic, timeout_s=60):
        event = ev.decode_event(record.value)
        kind = ev.payload_type(event)
        if kind in ("snapshot_begin", "snapshot_end"):
            marker = getattr(event, kind)
            markers.setdefault(marker.snapshot_id, set()).add(kind.removeprefix("snapshot_"))
    return markers


KILL_TRIES = 5


def kill_watcher_after_snapshot_begins(stack, rng: random.Random) -> dict[str, set[str]]:
    """Start the watcher, SIGKILL it 0-20 ms after its snapshot's begin marker is on the topic; returns the
    new snapshots' markers."""
    before = set(snapshot_markers(stack.kafka))
    # A short fetch wait: the embedded broker holds an idle fetch for all of it before returning new records.
    quick = stack.kafka.model_copy(update={"extra_config": {"fetch.wait.max.ms": "10"}})
    changes = TopicTail(quick, stack.kafka.changes_topic)
    try:
        changes.read_to_end()
        stack.watcher.start()

        def begin_marker_published() -> bool:
            # On the topic, not only in the watcher's log: a kill between the log line and the broker's
            # acknowledgement would interrupt no snapshot the job can see.
            return any(
                ev.payload_type(ev.decode_event(record.value)) == "snapshot_begin"
                and ev.decode_event(record.value).snapshot_begin.snapshot_id not in before
                for record in changes.poll(0.05)
            )

        wait_for("the restarted watcher's snapshot to begin", begin_marker_published, 60, every_s=0.0)
    finally:
        changes.close()
    time.sleep(rng.uniform(0.0, 0.02))
    stack.watcher.kill9()
    return {k: v for k, v in snapshot_markers(stack.kafka).items() if k not in before}


def test_kill9_of_the_job_at_random_points_during_churn_and_a_bookie_loss(stack, chaos_seed):
    rng = random.Random(chaos_seed + 1)
    stack.start_healthy("the job kills")
    kills = []
    with stack.churning(random.Random(rng.random())):
        kills.append(kill_running_job_after_next_commit(stack, rng))
        lost = stack.lose_bookie(rng)
        sink_kills = kill_in_the_sink(stack)
        kills.extend(sink_kills)
        kills.append(
            kill_during_batch(
                stack.run,
                "kill-3",
                stack.run.last("commits") + 1,
                "random",
                rng.uniform(0.2, 2.0),
                available_now=False,
                timeout_s=JOB_START_TIMEOUT_S,
            )
        )
        after_job_kill(stack)
        time.sleep(2.0)  # a last burst of churn while the restarted job catches up
    settle_s = stack.settle(f"after {len(kills)} kills, churn and the loss of {lost}")
    stack.wait_read_to_end()
    stack.assert_no_alert_lost()
    assert stack.kafka_dead_letters() == [], "the watcher published nothing a job should reject"
    print(
        f"\nseed {chaos_seed}: settled {settle_s:.0f} s after the last restart; "
        f"{len(stack.cluster.ledger_ids())} live ledgers, {len(stack.deleted)} deleted, lost {lost}; kills:"
    )
    for kill in kills:
        print(f"  {kill}")
    assert sink_kills[-1].mid_batch, kills  # a sink kill interrupted a batch half written to Delta


def test_kill9_of_the_watcher_mid_stream_and_mid_snapshot_then_restart(stack, chaos_seed):
    rng = random.Random(chaos_seed + 2)
    stack.start_healthy("the watcher kills")
    # Mid-stream.
    with stack.churning(random.Random(rng.random())):
        time.sleep(rng.uniform(0.5, 2.5))
        stack.watcher.kill9()
        for ledger_id in rng.sample(stack.cluster.ledger_ids(), 5):
            stack.delete_ledger(ledger_id)
        lost = stack.lose_bookie(rng)
        time.sleep(1.0)
        after_watcher_kill(stack)
        time.sleep(2.0)
    stream_s = stack.settle(f"watcher killed mid-stream, {lost} lost while it was down")

    # Mid-snapshot.
    stack.watcher.kill9()
    for ledger_id in rng.sample(stack.cluster.ledger_ids(), 5):
        stack.delete_ledger(ledger_id)
    for _ in range(5):
        stack.cluster.create_ledger(entries=2)
    # A kill lands inside a snapshot only if it comes after the begin marker is on the topic and before
    # the end marker; on a loaded machine either can be missed, so try again (each try is a restart the
    # next one's START snapshot reconciles).
    tries: list[dict[str, set[str]]] = []
    interrupted: list[str] = []
    while not interrupted and len(tries) < KILL_TRIES:
        markers = kill_watcher_after_snapshot_begins(stack, rng)
        tries.append(markers)
        interrupted = [k for k, kinds in markers.items() if "end" not in kinds]
    assert interrupted, f"no kill of {KILL_TRIES} landed inside a snapshot: {tries}"
    for ledger_id in rng.sample(stack.cluster.ledger_ids(), 3):
        stack.delete_ledger(ledger_id)
    stack.cluster.create_ledger(entries=2)
    after_watcher_kill(stack)
    snapshot_s = stack.settle("watcher killed mid-snapshot, then restarted")
    stack.wait_read_to_end()
    stack.assert_no_alert_lost()
    assert stack.kafka_dead_letters() == [], "the watcher published nothing a job should reject"
    print(
        f"\nseed {chaos_seed}: settled {stream_s:.0f} s after the mid-stream kill, "
        f"{snapshot_s:.0f} s after the mid-snapshot kill (snapshot {interrupted[0][:8]} interrupted)"
    )


def damage_tables(lakehouse: Path) -> Path:
    """Cut the newest commit of ``ledgers`` to half and delete ``violations``; returns the cut commit."""
    newest = max((lakehouse / "ledgers" / "_delta_log").glob("*.json"), key=lambda path: int(path.stem))
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])
    shutil.rmtree(lakehouse / "violations")
    return newest


def transitions(rows: list[dict]) -> set[tuple]:
    return {(row["alert_id"], row["kind"], row["state"]) for row in rows}


def test_a_damaged_ledgers_log_and_a_deleted_violations_table_are_named_and_repaired(stack, chaos_seed):
    rng = random.Random(chaos_seed + 3)
    stack.start_healthy("the damaged tables")
    lost = stack.lose_bookie(rng)
    stack.settle(f"the loss of {lost}")
    recorded = transitions(stack.table("violations"))
    assert any(kind == "BOOKIE_LOST" for _, kind, _ in recorded), recorded
    stack.job.stop()
    cut = damage_tables(stack.run.lakehouse)

    refused = stack.start_job()
    wait_for("the job to refuse the damaged lakehouse", lambda: not refused.alive(), 180.0)
    line = one_line_exit(refused.run.log_path(refused.attempt), refused.exit_code())
    assert "'ledgers' is damaged" in line or "'violations' is gone" in line, line
    assert "bkaudit repair" in line, line
    if "'ledgers' is damaged" in line:
        assert cut.name in line, line

    command = restart_after_named_command(stack, refused)
    stack.settle(f"`{command}` and a restart")
    stack.wait_read_to_end()
    stack.assert_no_alert_lost()
    rebuilt = transitions(stack.table("violations"))
    assert recorded <= rebuilt, f"transitions missing after the repair: {sorted(recorded - rebuilt)[:10]}"
