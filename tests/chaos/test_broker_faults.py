"""The broker fails under the running watcher and job: it restarts empty, or it freezes for a while.

Both run on one stack, the hang first: the data loss ends the alerts topic's history.

- Data loss: the broker restarts without its data (``stop_broker(lose_data=True)``), a real cluster losing (or
  an operator recreating) its topics. A bookie is lost and ledgers change right after. The job must not skip
  anything silently: it recovers by itself from the watcher's next full snapshot, or stops with exit 2 and one
  line naming a recovery command (:func:`tests.chaos.recovery.after_broker_data_loss` drives either, then
  republishes the open alerts, whose topic history is gone).
- Hang: the broker process is stopped with SIGSTOP for twice the clients' request timeout (10 s here, 30 s
  by default) while a bookie is lost, then continued. The job and the watcher ride it out
  (:func:`tests.chaos.recovery.after_broker_hang`).

Both scenarios run on the chaos suite's own broker (the suite's harness, not the session's).
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from tests.chaos.recovery import after_broker_data_loss, after_broker_hang

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

REQUEST_TIMEOUT_MS = 10_000
HANG_S = 2 * REQUEST_TIMEOUT_MS / 1000  # past the clients' request timeout, where the job used to die
STACK_OPTIONS = {"kafka_request_timeout_ms": REQUEST_TIMEOUT_MS}


def change_the_cluster(stack, rng: random.Random) -> str:
    """A bookie loss and a few ledger changes; returns the lost bookie."""
    lost = stack.lose_bookie(rng)
    for ledger_id in rng.sample(stack.cluster.ledger_ids(), 3):
        stack.delete_ledger(ledger_id)
    for _ in range(5):
        stack.cluster.create_ledger(entries=2)
    return lost


def test_a_broker_hang_longer_than_the_request_timeout_is_ridden_out(stack, chaos_services, chaos_seed):
    rng = random.Random(chaos_seed + 4)
    stack.start_healthy("the broker hang")
    pid = chaos_services.cluster.broker.pid()
    assert pid is not None, "the chaos suite's broker is not running"
    frozen = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        lost = change_the_cluster(stack, rng)
        time.sleep(max(0.0, HANG_S - (time.monotonic() - frozen)))
    finally:
        os.kill(pid, signal.SIGCONT)
    after_broker_hang(stack)
    settle_s = stack.settle(f"after a {HANG_S:.0f} s broker hang and the loss of {lost}")
    stack.wait_read_to_end()
    stack.assert_no_alert_lost()
    assert stack.kafka_dead_letters() == [], "the watcher published nothing a job should reject"
    print(f"\nbroker hang {HANG_S:.0f} s: tables = truth {settle_s:.0f} s after SIGCONT")


def test_a_broker_restart_with_data_loss_skips_nothing(stack, chaos_services, chaos_seed):
    rng = random.Random(chaos_seed + 3)
    stack.start_healthy("the broker's data loss")
    chaos_services.stop_broker(lose_data=True)
    chaos_services.start_broker()
    assert chaos_services.kafka_bootstrap == stack.kafka.bootstrap_servers, "broker moved to another port"
    # Every alert published so far went with the broker's data: only what is settled from now on counts.
    stack.forget_alert_history()
    lost = change_the_cluster(stack, rng)
    started = time.monotonic()
    how = after_broker_data_loss(stack)
    settle_s = stack.settle(f"after the broker's data loss and the loss of {lost}")
    stack.wait_read_to_end()
    stack.assert_no_alert_lost()
    assert stack.kafka_dead_letters() == [], "the watcher published nothing a job should reject"
    print(
        f"\nbroker data loss: {how}; tables = truth {time.monotonic() - started:.0f} s later "
        f"({settle_s:.0f} s after recovery)"
    )
