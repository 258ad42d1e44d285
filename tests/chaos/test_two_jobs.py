"""Two ``bkaudit stream`` on one checkpoint: the second is refused at start, the first audits on.

Two queries on one checkpoint would interleave their batch logs and their Delta commits (and may publish
alerts twice). The second must stop at once with exit 2 and one line
(:func:`tests.chaos.recovery.second_job_on_same_checkpoint`); the first must not notice: a bookie loss and
ledger changes afterwards end in the ground truth with no alert lost.
"""

from __future__ import annotations

import dataclasses
import random
import time

import pytest

from connectors.process import free_port
from tests.chaos.recovery import second_job_on_same_checkpoint
from tests.chaos.stack import JobProcess, chaos_stack

pytestmark = [pytest.mark.chaos, pytest.mark.integration]


def test_a_second_job_on_the_same_checkpoint_is_refused_and_the_first_runs_on(
    chaos_services, chaos_seed, tmp_path_factory
):
    rng = random.Random(chaos_seed + 6)
    with chaos_stack(chaos_services, tmp_path_factory.mktemp("two-jobs"), chaos_seed + 6) as stack:
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
        print(f"\nsecond job: {line!r}; tables = truth {settle_s:.0f} s later")
