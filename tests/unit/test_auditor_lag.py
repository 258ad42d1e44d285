"""AUDITOR_LAGGING: at-risk ledgers BookKeeper's Auditor has not marked past the grace. The shared test, the
summary the job keeps, the state machine around it, the cluster group that runs it, and the ground truth."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bkaudit.sim.truth import (
    Absence,
    BookieSnapshot,
    ClusterSnapshot,
    Registration,
    TruthParameters,
    ground_truth,
)
from core.domain.alerts import Alert, AlertKind
from core.domain.metadata import LedgerMetadata, LedgerState, Segment
from core.domain.rules.auditor_lag import (
    LAG_SAMPLE,
    UnmarkedAtRisk,
    unmarked_at_risk,
    unmarked_past_grace,
)
from core.domain.rules.autorecovery import (
    AutoRecoveryGraces,
    AutoRecoveryHealth,
    AutoRecoveryZnodes,
    due_conditions,
)
from streaming.processor import ClusterLogic, ProcessorConfig

LAGGING = AlertKind.AUDITOR_LAGGING
KEY = (LAGGING.value, None)
GRACES = AutoRecoveryGraces(
    disabled_s=0, auditor_missing_s=0, lock_held_s=0, checks_overdue_s=0, lagging_s=10
)
ON = AutoRecoveryZnodes(auditor="auditor-0")


def kinds(transitions: list[Any]) -> list[tuple[str, bool]]:
    return [(t.kind.value, t.firing) for t in transitions]


# ------------------------------------------------------------------------------------- the shared test

ledgers = st.lists(
    st.tuples(st.integers(0, 50), st.one_of(st.none(), st.integers(0, 100_000)), st.booleans()),
    max_size=40,
    unique_by=lambda row: row[0],
)


@settings(max_examples=200, deadline=None)
@given(ledgers, st.integers(0, 200_000), st.integers(0, 50_000))
def test_unmarked_past_grace_is_at_risk_for_the_grace_with_no_mark(rows, now_ms, grace_ms):
    since = np.array([np.nan if s is None else s for _, s, _ in rows], dtype=np.float64)
    marked = np.array([m for _, _, m in rows], dtype=bool)
    expected = [s is not None and not m and s + grace_ms <= now_ms for _, s, m in rows]
    assert unmarked_past_grace(since, marked, now_ms, grace_ms).tolist() == expected


@settings(max_examples=200, deadline=None)
@given(ledgers)
def test_the_summary_counts_the_unmarked_and_names_the_oldest_first(rows):
    at_risk = [(i, s, m) for i, s, m in rows if s is not None]
    summary = unmarked_at_risk(
        [i for i, _, _ in at_risk], [s for _, s, _ in at_risk], [m for *_, m in at_risk]
    )
    unmarked = sorted((s, i) for i, s, m in at_risk if not m)
    assert summary.count == len(unmarked)
    assert summary.oldest_since_ms == (unmarked[0][0] if unmarked else None)
    assert list(summary.sample) == [i for _, i in unmarked[:LAG_SAMPLE]]
    assert UnmarkedAtRisk.from_json(json.loads(json.dumps(summary.to_json()))) == summary


@settings(max_examples=100, deadline=None)
@given(ledgers, st.integers(0, 200_000), st.integers(1, 50_000))
def test_the_alert_is_due_exactly_when_the_querys_list_is_non_empty(rows, now_ms, grace_ms):
    """The Auditor elected long ago: the job's condition is due exactly when ``auditor-diff``'s
    ``at_risk_unmarked`` (the same test over the same ledgers) lists a ledger (a grace of 0 turns the alert
    off; the query then lists every unmarked ledger at risk)."""
    at_risk = [(i, s, m) for i, s, m in rows if s is not None]
    since = [s for _, s, _ in at_risk]
    marked = [m for *_, m in at_risk]
    listed = unmarked_past_grace(np.array(since, dtype=np.float64), np.array(marked, bool), now_ms, grace_ms)
    summary = unmarked_at_risk([i for i, _, _ in at_risk], since, marked)
    graces = replace(GRACES, lagging_s=grace_ms / 1000)
    due = due_conditions(ON, None, now_ms, graces, unmarked=summary, auditor_active_since_ms=0)
    assert (KEY in {c.key for c in due}) == bool(listed.any())


# ---------------------------------------------------------------------------------- the state machine


def started(graces: AutoRecoveryGraces = GRACES, at_ms: int = 0) -> AutoRecoveryHealth:
    health = AutoRecoveryHealth(graces)
    assert health.observe(ON, at_ms=at_ms) == []
    return health


def test_fires_once_the_oldest_unmarked_ledger_is_past_the_grace_and_resolves_when_all_are_marked():
    health = started()
    health.set_unmarked(unmarked_at_risk([7, 8], [2_000, 5_000], [False, False]))
    assert health.next_deadline_ms() == 12_000
    assert health.advance(11_999) == []
    (fired,) = health.advance(12_000)
    assert (fired.kind, fired.firing, fired.ledger_id) == (LAGGING, True, None)
    assert fired.detail["unmarked_ledgers"] == 2 and fired.detail["sample_ledger_ids"] == [7, 8]
    assert fired.detail["oldest_at_risk_since_ms"] == 2_000 and fired.detail["since_ms"] == 2_000
    assert fired.detail["grace_s"] == 10
    # The oldest is marked; the other is past the grace too: the same alert goes on.
    health.set_unmarked(unmarked_at_risk([8], [5_000], [False]))
    assert health.advance(16_000) == []
    health.set_unmarked(unmarked_at_risk([8], [5_000], [True]))
    (resolved,) = health.advance(17_000)
    assert (resolved.kind, resolved.firing, resolved.detail["since_ms"]) == (LAGGING, False, 2_000)


def test_a_list_that_empties_resolves_even_while_a_younger_ledger_waits_for_its_grace():
    health = started()
    health.set_unmarked(unmarked_at_risk([7], [0], [False]))
    assert kinds(health.advance(10_000)) == [(LAGGING.value, True)]
    health.set_unmarked(unmarked_at_risk([9], [9_000], [False]))  # 7 marked, 9 at risk for 1 s only
    assert kinds(health.advance(10_500)) == [(LAGGING.value, False)]
    assert kinds(health.advance(19_000)) == [(LAGGING.value, True)]  # 9 past its grace: a new alert


def test_no_auditor_or_autorecovery_off_never_lags_and_resolves_a_firing_one():
    health = started()
    health.set_unmarked(UnmarkedAtRisk(1, 0, (7,)))
    assert kinds(health.advance(10_000)) == [(LAGGING.value, True)]
    assert kinds(health.observe(replace(ON, disabled_since_ms=10_500), at_ms=11_000)) == [
        (LAGGING.value, False)
    ]
    assert health.advance(100_000) == []  # AUTORECOVERY_DISABLED says why, not this one
    assert health.observe(AutoRecoveryZnodes(), at_ms=100_500) == []  # nor without an Auditor
    assert health.advance(200_000) == []


def test_the_auditor_gets_the_grace_from_its_election_and_from_autorecovery_switched_back_on():
    health = started(at_ms=50_000)  # first seen elected at 50 s: ledgers at risk since 0 are owed from then
    health.set_unmarked(UnmarkedAtRisk(1, 0, (7,)))
    assert health.advance(59_999) == []
    assert kinds(health.advance(60_000)) == [(LAGGING.value, True)]
    assert kinds(health.observe(replace(ON, disabled_since_ms=61_000), at_ms=61_000)) == [
        (LAGGING.value, False)
    ]
    assert health.observe(ON, at_ms=70_000) == []  # on again: the Auditor resumes its audits from now
    assert health.advance(79_999) == []
    assert kinds(health.advance(80_000)) == [(LAGGING.value, True)]


def test_a_grace_of_zero_turns_it_off():
    health = started(replace(GRACES, lagging_s=0))
    health.set_unmarked(UnmarkedAtRisk(3, 0, (1, 2, 3)))
    assert health.advance(10**9) == [] and health.next_deadline_ms() is None


def test_a_restart_keeps_what_fired_and_the_input():
    health = started()
    health.set_unmarked(UnmarkedAtRisk(2, 1_000, (4, 5)))
    assert kinds(health.advance(11_000)) == [(LAGGING.value, True)]
    restored = AutoRecoveryHealth.from_json(json.loads(json.dumps(health.to_json())), GRACES)
    assert restored.unmarked == UnmarkedAtRisk(2, 1_000, (4, 5))
    assert restored.advance(12_000) == []
    restored.set_unmarked(UnmarkedAtRisk())
    assert kinds(restored.advance(13_000)) == [(LAGGING.value, False)]


steps = st.lists(
    st.tuples(
        st.sampled_from(["at_risk", "mark", "heal", "disable", "enable", "vote", "unvote", "tick"]),
        st.integers(0, 5),
        st.integers(0, 6_000),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(steps, st.integers(0, 40))
def test_after_every_input_it_fires_exactly_while_the_rule_says_due(history, restore_at):
    """The state machine against the rule: after each call ``AUDITOR_LAGGING`` is open exactly while
    ``due_conditions`` (an oracle tracking since when the Auditor can mark) says it is due, fire and resolve
    alternate, each firing comes when due, and a save/restore through JSON mid-way changes nothing."""
    health = AutoRecoveryHealth(GRACES)
    now, disabled, voted = 0, False, True
    at_risk: dict[int, int] = {}
    marked: set[int] = set()
    elected_since: int | None = None
    enabled_since: int | None = None
    observed, open_now = False, False
    for index, (kind, ledger, step) in enumerate(history):
        if index == restore_at:
            health = AutoRecoveryHealth.from_json(json.loads(json.dumps(health.to_json())), GRACES)
        now += step
        if kind == "at_risk":
            at_risk.setdefault(ledger, now - ledger * 1_000)  # the loss may predate what the job reads
        elif kind == "mark":
            marked.add(ledger)
        elif kind == "heal":
            at_risk.pop(ledger, None)
            marked.discard(ledger)
        elif kind in ("disable", "enable"):
            disabled = kind == "disable"
        elif kind in ("vote", "unvote"):
            voted = kind == "vote"
        ids = sorted(at_risk)
        summary = unmarked_at_risk(ids, [at_risk[i] for i in ids], [i in marked for i in ids])
        znodes = AutoRecoveryZnodes(disabled_since_ms=0 if disabled else None, auditor="a" if voted else None)
        health.set_unmarked(summary)
        if kind == "tick" or kind in ("at_risk", "mark", "heal"):
            transitions = health.advance(now)
        else:
            if not observed or (enabled_since is None and not disabled):
                enabled_since = now
            elected_since = (elected_since if elected_since is not None else now) if voted else None
            enabled_since = None if disabled else enabled_since
            observed = True
            transitions = health.observe(znodes, now)
        for t in transitions:
            assert t.kind is LAGGING and t.at_ms == now
            assert t.firing != open_now
            open_now = t.firing
        active = None
        if observed and voted and not disabled and elected_since is not None:
            active = max(elected_since, enabled_since or elected_since)
        due = due_conditions(znodes, None, now, GRACES, unmarked=summary, auditor_active_since_ms=active)
        assert open_now == (observed and KEY in {c.key for c in due})


# ------------------------------------------------------------------------------- the job's cluster group


def test_the_cluster_group_judges_the_unmarked_ledgers_at_its_heartbeats():
    logic = ClusterLogic(ProcessorConfig(autorecovery=GRACES))
    payload = {"disabled": False, "auditor": "auditor-0", "locks": [], "checks": {}}
    rows = [{"kind": "auto_recovery_state", "event_time_ms": 1_000, "payload": payload}]
    state, out, _ = logic.apply(None, rows, UnmarkedAtRisk(1, 2_000, (7,)))
    assert [d for d in out if d["kind"] == "autorecovery_alert"] == []
    beat = [{"kind": "heartbeat", "event_time_ms": 12_000, "payload": {}}]
    state, out, _ = logic.apply(state, beat, UnmarkedAtRisk(1, 2_000, (7,)))
    (alert,) = [d for d in out if d["kind"] == "autorecovery_alert"]
    assert alert["payload"]["kind"] == "AUDITOR_LAGGING" and alert["payload"]["firing"] is True
    assert alert["payload"]["detail"]["sample_ledger_ids"] == [7] and alert["event_time_ms"] == 12_000
    beat = [{"kind": "heartbeat", "event_time_ms": 13_000, "payload": {}}]
    _, out, _ = logic.apply(state, beat, UnmarkedAtRisk())
    assert [(d["payload"]["kind"], d["payload"]["firing"]) for d in out] == [("AUDITOR_LAGGING", False)]


def test_it_is_one_warning_for_the_cluster():
    alert = Alert.cluster_level(cluster="c", kind=LAGGING, started_at_ms=1, detected_at_ms=2)
    assert alert.kafka_key() == "c/auditor-lag" and alert.to_json()["severity"] == "warning"


# ------------------------------------------------------------------------------------------ ground truth


def lost_snapshot(now_ms: int, **extra: Any) -> ClusterSnapshot:
    md = LedgerMetadata(
        ensemble_size=2,
        write_quorum=2,
        ack_quorum=2,
        state=LedgerState.CLOSED,
        last_entry_id=1,
        length=2,
        segments=(Segment(0, ("b1", "b2")),),
    )
    options: dict[str, Any] = {
        "autorecovery": ON,
        "auditor_elected_since_ms": 0,
        "lost_bookie_recovery_delay_s": 5,
        **extra,
    }
    return ClusterSnapshot(
        now_ms=now_ms,
        bookies={
            "b1": BookieSnapshot("b1", Registration.WRITABLE, "/r1", holdings={7: frozenset({0, 1})}),
            "b2": BookieSnapshot("b2", Registration.NONE, "/r2", serving=False),
        },
        ledgers={7: md},
        absences=(Absence("b2", since_ms=1_000),),
        **options,
    )


def test_ground_truth_dates_an_unmarked_ledger_from_its_bookies_loss_with_the_jobs_rule():
    params = TruthParameters(autorecovery=GRACES)
    # b2 missing at 1 s, lost at 6 s (the delay), owed a mark until 16 s; within a second of that: allowed.
    for now_ms, required, allowed in [
        (14_900, [], []),
        (15_500, [], ["auditor-lag"]),
        (17_100, ["auditor-lag"], []),
    ]:
        truth = ground_truth(lost_snapshot(now_ms), params)
        assert truth["alerts"]["LEDGER_UNDER_REPLICATED"] == [7]
        assert (truth["alerts"]["AUDITOR_LAGGING"], truth["may_alert"]["AUDITOR_LAGGING"]) == (
            required,
            allowed,
        )
    marked = ground_truth(lost_snapshot(60_000, underreplicated={7: 7_000}), params)
    assert marked["alerts"]["AUDITOR_LAGGING"] == [] and marked["may_alert"]["AUDITOR_LAGGING"] == []
    disabled = ground_truth(lost_snapshot(60_000, autorecovery=replace(ON, disabled_since_ms=2_000)), params)
    assert disabled["alerts"]["AUDITOR_LAGGING"] == []
    enabled_late = ground_truth(lost_snapshot(60_000, autorecovery_enabled_since_ms=55_000), params)
    assert enabled_late["alerts"]["AUDITOR_LAGGING"] == []  # the Auditor resumed 5 s ago
    assert ground_truth(lost_snapshot(60_000), params)["parameters"]["auditor_lagging_grace_s"] == 10
