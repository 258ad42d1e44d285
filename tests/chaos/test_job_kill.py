"""kill -9 of the streaming job at seeded random moments while the cluster churns and a bookie is lost.

The simulator keeps creating, closing and deleting ledgers in the background; the real watcher publishes
every change; the real job (``bkaudit stream``, long-running) is killed with SIGKILL (its whole process
group: driver, JVM, Python workers) three times: at a random moment after a batch commit, right after the
sink's first Delta commit of a batch that carries a bookie loss (tables half written, alerts maybe already
published), and at a random moment again. The kill machinery is the crash test's
(:mod:`tests.integration.job_process`); the restart is :func:`tests.chaos.recovery.after_job_kill`.
"""

from __future__ import annotations

import random
import time

import pytest

from tests.chaos.recovery import after_job_kill
from tests.chaos.stack import chaos_stack, wait_for
from tests.integration.job_process import Kill, kill_during_batch

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

JOB_START_TIMEOUT_S = 300.0


def kill_running_job_after_next_commit(stack, rng: random.Random) -> Kill:
    """SIGKILL the running job a random 0-2 s after its next batch commit."""
    job = stack.job
    committed = stack.run.last("commits")

    def next_commit() -> bool:
        stack.require_alive()
        return stack.run.last("commits") > committed

    started = time.monotonic()
    wait_for(f"a commit after batch {committed}", next_commit, JOB_START_TIMEOUT_S, every_s=0.02)
    time.sleep(rng.uniform(0.0, 2.0))
    job.kill9()
    planned, done = stack.run.last("offsets"), stack.run.last("commits")
    written = stack.run.tables_with_batch(planned) if planned > done else []
    return Kill("random", round(time.monotonic() - started, 1), planned, done, tuple(written))


def test_kill9_of_the_job_at_random_points_during_churn_and_a_bookie_loss(
    chaos_services, chaos_seed, tmp_path_factory
):
    rng = random.Random(chaos_seed)
    started = time.monotonic()
    with chaos_stack(chaos_services, tmp_path_factory.mktemp("job-kill"), chaos_seed) as stack:
        ready_s = time.monotonic() - started
        kills = []
        with stack.churning(random.Random(rng.random())):
            kills.append(kill_running_job_after_next_commit(stack, rng))
            lost = stack.lose_bookie(rng)
            kills.append(
                kill_during_batch(
                    stack.run,
                    "kill-2",
                    stack.run.last("commits") + 1,
                    "sink",
                    0.0,
                    available_now=False,
                    timeout_s=JOB_START_TIMEOUT_S,
                )
            )
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
            f"\nseed {chaos_seed}: ready in {ready_s:.0f} s, settled {settle_s:.0f} s after the last "
            f"restart; {len(stack.cluster.ledger_ids())} live ledgers, {len(stack.deleted)} deleted, "
            f"lost {lost}; kills:"
        )
        for kill in kills:
            print(f"  {kill}")
        assert kills[1].mid_batch, kills  # the sink kill interrupted a batch half written to Delta
