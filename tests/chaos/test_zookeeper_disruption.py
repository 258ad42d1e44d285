"""A ZooKeeper outage is not a data loss, and a real loss during one still alerts.

The suite's ZooKeeper is frozen (SIGSTOP) for longer than the bookies' session timeout and continued: it
then expires every bookie's session at once and their registrations vanish together, while every bookie
process still serves. BookKeeper's Auditor (and bkaudit before its disruption rule) declared them all lost
and paged for every ledger; the bookies registered again a moment later.

1. The bookies register again at once (as BookKeeper's do): no ``BOOKIE_LOST`` and no ``LEDGER_*`` alert.
2. The bookies stay unregistered for seconds (a ZooKeeper slow to serve them again) and two bookies die
   during the freeze: one ``ZOOKEEPER_DISRUPTION`` for the cluster naming the bookies that answer, resolved
   when they are back; the two dead ones are ``BOOKIE_LOST`` with their ledgers, within the grace in event
   time; no alert for the others.

Whether a freeze expires a session is ZooKeeper's race (a client reconnecting as the server wakes keeps
it), so a freeze that expired fewer than half the sessions is repeated. The few it expired are no
disruption: BookKeeper's rules judge them (with the suite's recovery delay 0, lost at once), so the first
test checks the alerts of the freeze that expired the wave; the checks are on what happened.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import pytest

from bkaudit.sim.truth import Absence
from bkaudit.testing.harness import ServiceHarness
from tests.chaos.stack import ChaosStack, wait_for
from tests.integration.event_fixtures import alerts_on

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

#: Longer than the simulator's bookie session timeout (2 s), shorter than the watcher's and the
#: simulator's own (10 s): only the bookies' sessions expire.
FREEZE_S = 6.0
LOSS_KINDS = ("BOOKIE_LOST", "LEDGER_UNDER_REPLICATED", "LEDGER_UNRECOVERABLE")
#: stream.zookeeper_disruption_grace_s's default
GRACE_S = 30.0


def published_ids(stack: ChaosStack) -> set[str]:
    return {alert["alert_id"] for _, alert in alerts_on(stack.kafka)}


def new_alerts(stack: ChaosStack, earlier: set[str]) -> list[dict[str, Any]]:
    return [alert for _, alert in alerts_on(stack.kafka) if alert["alert_id"] not in earlier]


def running_bookies(stack: ChaosStack) -> list[str]:
    return sorted(b for b, info in stack.truth()["bookies"].items() if info["registration"] != "none")


def expired_since(stack: ChaosStack, since_ms: int) -> list[Absence]:
    """The session expiries of serving bookies the simulator recorded since ``since_ms``."""
    return [a for a in stack.cluster.snapshot().absences if a.serving and a.since_ms >= since_ms]


@dataclass(frozen=True)
class Freeze:
    """The freezes one call made: when the first began, and when the one that expired enough sessions
    began (epoch ms). Sessions a freeze before it expired, too few to be a disruption, were judged by
    BookKeeper's rules: with the suite's recovery delay 0, a bookie missing alone is lost at once."""

    first_ms: int
    wave_ms: int


def freeze_until_sessions_expire(
    stack: ChaosStack, services: ServiceHarness, during: Any = None, attempts: int = 3
) -> Freeze:
    """Freeze ZooKeeper until at least half the running bookies lost their session in one freeze; the
    expiries since are :func:`expired_since` the wave's start, read once the bookies are back (the
    simulator records each when kazoo reports it, some after others)."""
    running = running_bookies(stack)
    expired: list[Absence] = []
    first_ms: int | None = None
    for _ in range(attempts):
        started_ms = int(time.time() * 1000)
        first_ms = started_ms if first_ms is None else first_ms
        pid = services.cluster.zookeeper.pid()
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            if during is not None:
                during()
                during = None
            time.sleep(FREEZE_S)
        finally:
            os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the simulator records an expiry when kazoo reports it
            expired = expired_since(stack, started_ms)
            if len(expired) * 2 >= len(running):
                return Freeze(first_ms, started_ms)
            time.sleep(0.2)
    raise AssertionError(f"{attempts} freezes of {FREEZE_S} s expired only {expired} of {running}")


def alerts_since(alerts: list[dict[str, Any]], since_ms: int) -> list[dict[str, Any]]:
    """The transitions of the alerts that fired at or after ``since_ms`` (a resolution goes with its
    firing, by id)."""
    fired = {
        a["alert_id"] for a in alerts if a["state"] == "firing" and _epoch_ms(a["detected_at"]) >= since_ms
    }
    return [a for a in alerts if a["alert_id"] in fired]


def test_bookies_that_lose_their_sessions_to_a_frozen_zookeeper_page_no_one(
    stack: ChaosStack, chaos_services: ServiceHarness
) -> None:
    stack.start_healthy("the ZooKeeper freeze")
    earlier = published_ids(stack)
    freeze = freeze_until_sessions_expire(stack, chaos_services)
    wait_for("every bookie to register again", lambda: all(a.until_ms for a in expired_since(stack, 0)), 60)
    expired = expired_since(stack, freeze.wave_ms)
    stack.assert_final(f"after a {FREEZE_S:.0f} s ZooKeeper freeze expired {len(expired)} bookie sessions")
    paged = [
        (a["kind"], a["state"], a["bookies"], a["detected_at"], a.get("detail"))
        for a in alerts_since(new_alerts(stack, earlier), freeze.wave_ms)
        if a["kind"] in LOSS_KINDS
    ]
    absences = [(a.bookie_id, a.since_ms, a.until_ms) for a in expired_since(stack, freeze.first_ms)]
    assert paged == [], f"alerts for bookies that never stopped serving: {paged[:10]}; expiries {absences}"
    flaps = {r["bookie_id"]: r["flaps"] for r in stack.table("bookies")}
    assert all(flaps[a.bookie_id] >= 1 for a in expired), flaps


def test_a_lasting_disruption_warns_once_and_bookies_dead_during_it_are_still_lost(
    stack: ChaosStack, chaos_services: ServiceHarness
) -> None:
    stack.start_healthy("the lasting ZooKeeper disruption")
    earlier = published_ids(stack)
    dead = running_bookies(stack)[:2]
    stack.cluster.reregister_delay_s = 8.0  # past the settle time: they are held, answering
    try:

        def kill_two() -> None:
            for bookie in dead:
                stack.cluster.kill_bookie(bookie, hard=True)

        frozen_ms = freeze_until_sessions_expire(stack, chaos_services, during=kill_two).first_ms
        wait_for(
            "the expired bookies to register again",
            lambda: all(a.until_ms for a in expired_since(stack, 0)),
            60,
        )
        expired = expired_since(stack, frozen_ms)
    finally:
        stack.cluster.reregister_delay_s = 0.0
    stack.assert_final(f"after {', '.join(dead)} died in a ZooKeeper disruption")

    alerts = new_alerts(stack, earlier)
    disruption = [a for a in alerts if a["kind"] == "ZOOKEEPER_DISRUPTION"]
    assert [a["state"] for a in disruption][:1] == ["firing"] and disruption[-1]["state"] == "resolved"
    held = set(disruption[0]["detail"]["bookies"])
    assert held and held <= {a.bookie_id for a in expired} and not held & set(dead), (held, dead)
    lost = {a["bookies"][0]: a for a in alerts if a["kind"] == "BOOKIE_LOST" and a["state"] == "firing"}
    assert set(lost) == set(dead), f"BOOKIE_LOST for {sorted(lost)}, the dead are {dead}"
    for bookie, alert in lost.items():
        detected_ms = _epoch_ms(alert["detected_at"])
        assert detected_ms - alert["detail"]["missing_since"] <= GRACE_S * 1000, (bookie, alert)
    others = [a for a in alerts if a["kind"] in LOSS_KINDS and not set(a["bookies"]) & set(dead)]
    assert others == [], f"alerts for bookies that kept serving: {others[:5]}"


def _epoch_ms(rfc3339: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)
