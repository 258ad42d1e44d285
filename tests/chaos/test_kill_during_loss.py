"""kill -9 of the job while its membership lane handles a bookie loss: the restart loses and repeats nothing.

The membership lane publishes a lost bookie's alerts (``BOOKIE_LOST`` and one ``LEDGER_*`` per ledger),
then records them in Delta, then saves its state (the batch's commit). The job is killed with SIGKILL (its
whole process group) as soon as the loss's ``BOOKIE_LOST`` is on the alerts topic, or a random moment up to
0.3 s later: after the publish, in the middle of the Delta commits, or after the state file. After the
restart, every alert of the loss is on the topic under exactly one id (the same id published twice is
allowed, two ids for one alert are not), ``open_alerts`` and ``violations`` agree with the ground truth
and with each other, and when the bookie comes back each alert resolves once.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from typing import Any

import pytest

from bkaudit.testing.kafka_io import TopicTail
from tests.chaos.recovery import after_job_kill
from tests.chaos.stack import ChaosStack, wait_for
from tests.integration.event_fixtures import alerts_on

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

LOSS_KINDS = ("BOOKIE_LOST", "LEDGER_UNDER_REPLICATED", "LEDGER_UNRECOVERABLE")


def entity(alert: dict[str, Any]) -> str:
    ledger = alert.get("ledger_id")
    return str(ledger) if ledger is not None else (alert.get("bookies") or ["?"])[0]


def ids_by_alert(stack: ChaosStack, state: str, earlier: set[str]) -> dict[tuple[str, str], set[str]]:
    """(kind, entity) → the ids published with ``state`` on the whole alerts topic, but ``earlier`` ones
    (the alerts of earlier scenarios, resolved before this one began)."""
    found: dict[tuple[str, str], set[str]] = defaultdict(set)
    for _, alert in alerts_on(stack.kafka):
        if alert["kind"] in LOSS_KINDS and alert["state"] == state and alert["alert_id"] not in earlier:
            found[(alert["kind"], entity(alert))].add(alert["alert_id"])
    return found


def published_ids(stack: ChaosStack) -> set[str]:
    return {alert["alert_id"] for _, alert in alerts_on(stack.kafka)}


def kill_when_the_loss_is_published(stack: ChaosStack, bookie: str, delay_s: float) -> float:
    """SIGKILL the job ``delay_s`` after the loss's BOOKIE_LOST reached the alerts topic; returns how long
    after the bookie stopped that was."""
    tail = TopicTail(stack.kafka, stack.kafka.alerts_topic)
    try:
        tail.read_to_end()
        started = time.monotonic()
        stack.cluster.kill_bookie(bookie)

        def published() -> bool:
            stack.require_alive()
            return any(
                a.get("kind") == "BOOKIE_LOST"
                and a.get("state") == "firing"
                and bookie in a.get("bookies", [])
                for a in (_json(r.value) for r in tail.poll(0.05))
            )

        wait_for(f"BOOKIE_LOST of {bookie} on the alerts topic", published, 120, every_s=0.0)
        time.sleep(delay_s)
        stack.job.kill9()  # type: ignore[union-attr]
        return time.monotonic() - started
    finally:
        tail.close()


def _json(value: bytes | None) -> dict[str, Any]:
    import json

    return json.loads(value) if value else {}


def assert_one_id_per_alert(stack: ChaosStack, earlier: set[str]) -> None:
    for state in ("firing", "resolved"):
        doubled = {key: ids for key, ids in ids_by_alert(stack, state, earlier).items() if len(ids) > 1}
        assert not doubled, f"{state} alerts published under two ids: {dict(list(doubled.items())[:5])}"
    open_keys = [(r["kind"], r["entity"]) for r in stack.table("open_alerts") if r["kind"] in LOSS_KINDS]
    assert len(open_keys) == len(set(open_keys)), "two open_alerts rows for one alert"
    recorded: dict[tuple[str, str], set[str]] = defaultdict(set)
    for row in stack.table("violations"):
        if row["kind"] in LOSS_KINDS and row["state"] == "firing" and row["alert_id"] not in earlier:
            recorded[(row["kind"], entity(row))].add(row["alert_id"])
    doubled_rows = {key: ids for key, ids in recorded.items() if len(ids) > 1}
    assert not doubled_rows, f"violations holds two firing ids for: {dict(list(doubled_rows.items())[:5])}"


@pytest.mark.parametrize("moment", ["at once", "a random moment"])
def test_kill9_while_the_membership_lane_handles_a_loss(
    stack: ChaosStack, chaos_seed: int, moment: str
) -> None:
    rng = random.Random(chaos_seed + (3 if moment == "at once" else 4))
    stack.start_healthy(f"the kill during a loss ({moment})")
    running = sorted(b for b, info in stack.truth()["bookies"].items() if info["registration"] != "none")
    bookie = rng.choice(running)
    delay_s = 0.0 if moment == "at once" else rng.uniform(0.0, 0.3)

    earlier = published_ids(stack)

    killed_after_s = kill_when_the_loss_is_published(stack, bookie, delay_s)
    after_job_kill(stack)
    stack.settle(f"{bookie} lost, the job killed {killed_after_s:.2f} s after and restarted")
    stack.wait_read_to_end()
    stack.assert_no_alert_lost()
    assert_one_id_per_alert(stack, earlier)
    fired = ids_by_alert(stack, "firing", earlier)
    assert ("BOOKIE_LOST", bookie) in fired and len(fired) > 1, fired

    stack.cluster.restart_bookie(bookie)
    stack.settle(f"{bookie} back")
    stack.wait_read_to_end()
    resolved = ids_by_alert(stack, "resolved", earlier)
    assert resolved == fired, {key: (fired.get(key), resolved.get(key)) for key in set(fired) ^ set(resolved)}
    assert_one_id_per_alert(stack, earlier)
    stack.require_alive()
