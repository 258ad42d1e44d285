"""The watcher's liveness probes of vanished bookies: what is reported, when, and when probing stops.

The prober is a scripted stand-in for the bookie client (its answers per address), and the clock is a
counter: the behaviour under test is the scheduling and reporting, not the wire protocol (which
tests/integration/test_liveness_probe.py runs against a real protocol server).
"""

from __future__ import annotations

from connectors.bookie.client import ConnectionFailed, NoLedger, ProbeRequest, ProbeResult, Timeout
from connectors.bookie.liveness import LIVENESS_LEDGER_ID, LivenessProbes


class ScriptedBookies:
    def __init__(self) -> None:
        self.answers: dict[str, ProbeResult] = {}
        self.asked: list[ProbeRequest] = []

    def probe_many(
        self, requests: list[ProbeRequest], concurrency: int = 64, timeout: float | None = None
    ) -> list[ProbeResult]:
        self.asked.extend(requests)
        return [self.answers.get(r.address, ConnectionFailed("connection refused")) for r in requests]

    def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def probes(bookies: ScriptedBookies, clock: Clock, reports: list[tuple[str, bool, str, str]], **kw):
    return LivenessProbes(
        lambda *report: reports.append(report),
        interval_s=5.0,
        timeout_s=1.0,
        client=bookies,
        clock=clock,
        **kw,
    )


def test_a_vanished_bookie_is_probed_at_once_with_a_read_of_a_ledger_no_cluster_has():
    bookies, clock, reports = ScriptedBookies(), Clock(), []
    bookies.answers["10.0.0.1:3181"] = NoLedger()
    prober = probes(bookies, clock, reports)
    prober.watch("b1", "10.0.0.1:3181")
    assert prober.probe_due() == 105.0
    assert reports == [("b1", True, "10.0.0.1:3181", "answered no_ledger")]
    (asked,) = bookies.asked
    assert (asked.ledger_id, asked.entry_id, asked.operation) == (LIVENESS_LEDGER_ID, 0, "READ_ENTRY")


def test_only_the_first_answer_and_each_change_are_reported():
    bookies, clock, reports = ScriptedBookies(), Clock(), []
    bookies.answers["a1"] = NoLedger()
    prober = probes(bookies, clock, reports)
    prober.watch("b1", "a1")
    prober.probe_due()
    clock.now += 5
    prober.probe_due()  # still answering: nothing new
    assert [r[1] for r in reports] == [True]
    bookies.answers["a1"] = Timeout(1.0)
    clock.now += 5
    prober.probe_due()
    assert reports[-1] == ("b1", False, "a1", "no answer in 1.0 s")
    clock.now += 1  # not due yet
    prober.probe_due()
    assert len(bookies.asked) == 3


def test_a_bookie_forgotten_is_no_longer_probed_and_a_late_answer_is_dropped():
    bookies, clock, reports = ScriptedBookies(), Clock(), []
    prober = probes(bookies, clock, reports)
    prober.watch("b1", "a1")
    prober.forget("b1")
    assert prober.probe_due() is None
    assert reports == [] and bookies.asked == []
    prober.watch("b2", "a2")
    prober._record("b1", "a1", True, "answered no_ledger")  # an answer for a bookie forgotten meanwhile
    assert reports == []


def test_a_bookie_silent_past_the_give_up_time_is_no_longer_probed():
    bookies, clock, reports = ScriptedBookies(), Clock(), []
    prober = probes(bookies, clock, reports, give_up_s=12.0)
    prober.watch("b1", "a1")
    for _ in range(3):
        prober.probe_due()
        clock.now += 5
    prober.probe_due()
    assert prober.watched() == []
    assert reports == [("b1", False, "a1", "connection refused")]
