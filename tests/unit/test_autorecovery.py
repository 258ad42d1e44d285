"""AutoRecovery health: the rule, its state machine, the cluster group that runs it, and the ground truth."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bkaudit.sim.truth import ClusterSnapshot, TruthParameters, ground_truth
from core import events as ev
from core.domain.alerts import Alert, AlertKind
from core.domain.rules.autorecovery import (
    AutoRecoveryGraces,
    AutoRecoveryHealth,
    AutoRecoveryZnodes,
    ReplicationLock,
    due_conditions,
)
from core.domain.underreplication import CtimeZnode
from streaming.decode import _auto_recovery_payload
from streaming.processor import ClusterLogic, ProcessorConfig

GRACES = AutoRecoveryGraces(disabled_s=10, auditor_missing_s=5, lock_held_s=20)
DISABLED, MISSING, STALLED, OVERDUE = (
    AlertKind.AUTORECOVERY_DISABLED,
    AlertKind.AUDITOR_MISSING,
    AlertKind.REPLICATION_STALLED,
    AlertKind.AUDITOR_CHECKS_OVERDUE,
)
CHECK_ALL, PLACEMENT, REPLICAS = (
    CtimeZnode.CHECK_ALL_LEDGERS,
    CtimeZnode.PLACEMENT_POLICY_CHECK,
    CtimeZnode.REPLICAS_CHECK,
)
# The Auditor checks all ledgers every 600 s and its replicas every 300 s (placement off); 60 s of grace.
CHECK_GRACES = replace(
    GRACES, checks_overdue_s=60, check_all_ledgers_interval_s=600, replicas_check_interval_s=300
)


# ------------------------------------------------------------------------------------------ the rule


def test_each_condition_is_due_exactly_at_its_grace():
    znodes = AutoRecoveryZnodes(disabled_since_ms=1_000, locks={7: ReplicationLock("w", 2_000)})

    def due(now_ms: int) -> set[tuple[str, int | None]]:
        return {c.key for c in due_conditions(znodes, 3_000, now_ms, GRACES)}

    assert due(7_999) == set()
    assert due(8_000) == {(MISSING.value, None)}
    assert due(11_000) == {(MISSING.value, None), (DISABLED.value, None)}
    assert due(22_000) == {(MISSING.value, None), (DISABLED.value, None), (STALLED.value, 7)}


def test_a_grace_of_zero_turns_its_check_off():
    znodes = AutoRecoveryZnodes(disabled_since_ms=0, locks={1: ReplicationLock(None, 0)})
    off = AutoRecoveryGraces(disabled_s=0, auditor_missing_s=0, lock_held_s=0)
    assert due_conditions(znodes, 0, 10**12, off) == []
    health = AutoRecoveryHealth(off)
    health.set_bookies_running(True, 0)
    assert health.observe(znodes, 1) == [] and health.advance(10**12) == []
    assert health.next_deadline_ms() is None


def test_no_auditor_is_not_missing_before_the_state_is_known_or_while_no_bookie_runs():
    health = AutoRecoveryHealth(GRACES)
    assert health.set_bookies_running(True, 0) == [] and health.advance(10**9) == []  # never observed
    health = AutoRecoveryHealth(GRACES)
    health.observe(AutoRecoveryZnodes(), 0)  # no vote, but no bookie either
    assert health.advance(10**9) == []
    health.set_bookies_running(True, 10**9)  # missing from the moment bookies run
    assert health.advance(10**9 + 4_999) == []
    assert [t.kind for t in health.advance(10**9 + 5_000)] == [MISSING]


def test_a_lock_taken_again_is_a_new_condition_with_its_own_grace():
    health = AutoRecoveryHealth(GRACES)
    health.observe(AutoRecoveryZnodes(auditor="a", locks={3: ReplicationLock("w1", 0)}), 0)
    fired = health.advance(20_000)
    assert [(t.kind, t.ledger_id, t.firing, t.detail["holder"]) for t in fired] == [(STALLED, 3, True, "w1")]
    # Released and taken again by another worker between two reads: the old alert resolves at once.
    again = health.observe(AutoRecoveryZnodes(auditor="a", locks={3: ReplicationLock("w2", 21_000)}), 22_000)
    assert [(t.ledger_id, t.firing, t.at_ms) for t in again] == [(3, False, 22_000)]
    assert health.advance(40_999) == []
    assert [(t.firing, t.detail["holder"]) for t in health.advance(41_000)] == [(True, "w2")]


# ------------------------------------------------------------------------ the Auditor's periodic checks


def elected(checks: dict[CtimeZnode, int], *, auditor: str = "b1", **more: Any) -> AutoRecoveryZnodes:
    return AutoRecoveryZnodes(auditor=auditor, checks=checks, **more)


def test_an_overdue_check_fires_once_its_interval_and_grace_have_passed_and_not_before():
    health = AutoRecoveryHealth(CHECK_GRACES)
    # Seen elected at 2 000; all ledgers checked at 1 000 and the replicas at 1 500.
    assert health.observe(elected({CHECK_ALL: 1_000, REPLICAS: 1_500}), 2_000) == []
    assert health.next_deadline_ms() == 1_500 + 300_000 + 60_000  # the replicas check is due first
    assert health.advance(361_499) == []
    (fired,) = health.advance(361_500)
    assert (fired.kind, fired.ledger_id, fired.firing, fired.at_ms) == (OVERDUE, None, True, 361_500)
    assert fired.detail["overdue"] == ["replicascheckctime"]
    assert fired.detail["since_ms"] == 301_500 and fired.detail["grace_s"] == 60
    assert fired.detail["checks"] == {
        "checkallledgersctime": {"last_completed_ms": 1_000, "interval_s": 600.0, "due_ms": 601_000},
        "replicascheckctime": {"last_completed_ms": 1_500, "interval_s": 300.0, "due_ms": 301_500},
    }
    assert health.advance(10**9) == []  # fired once, stays open


def test_the_alert_resolves_when_the_overdue_check_completes_and_fires_anew_for_one_still_overdue():
    health = AutoRecoveryHealth(CHECK_GRACES)
    health.observe(elected({CHECK_ALL: 1_000, REPLICAS: 1_500}), 2_000)
    assert [t.detail["overdue"] for t in health.advance(700_000)] == [
        ["checkallledgersctime", "replicascheckctime"]
    ]
    # The check of all ledgers completes: the alert (since the replicas' due time) holds on.
    assert health.observe(elected({CHECK_ALL: 700_500, REPLICAS: 1_500}), 701_000) == []
    # The replicas check completes too: the znode's time moved forward, the alert resolves.
    (resolved,) = health.observe(elected({CHECK_ALL: 700_500, REPLICAS: 701_500}), 702_000)
    assert (resolved.kind, resolved.firing, resolved.at_ms) == (OVERDUE, False, 702_000)
    assert resolved.detail == {"since_ms": 301_500}
    assert health.next_deadline_ms() == 701_500 + 300_000 + 60_000
    # Only the replicas check is overdue at first; when it completes the check of all ledgers is overdue
    # too by then: the first alert resolves and the second fires at once, from its own due time.
    health.advance(1_061_500)
    transitions = health.observe(elected({CHECK_ALL: 700_500, REPLICAS: 1_400_000}), 1_400_000)
    assert [(t.firing, t.detail["since_ms"]) for t in transitions] == [(False, 1_001_500), (True, 1_300_500)]


def test_a_check_switched_off_never_fires_and_nothing_fires_at_start_up():
    # BookKeeper's defaults: the placement and replicas checks are off; a check that never ran is given
    # the grace from when the Auditor was first seen elected, never judged at once.
    health = AutoRecoveryHealth(AutoRecoveryGraces())
    assert health.observe(elected({}), 5_000) == []
    assert health.next_deadline_ms() == 5_000 + 86_400_000
    (fired,) = health.advance(5_000 + 86_400_000)
    assert fired.detail["overdue"] == ["checkallledgersctime"]
    assert list(fired.detail["checks"]) == ["checkallledgersctime"]  # the two switched off are not judged
    every_check_off = replace(CHECK_GRACES, check_all_ledgers_interval_s=0, replicas_check_interval_s=0)
    health = AutoRecoveryHealth(every_check_off)
    assert health.observe(elected({}), 0) == [] and health.advance(10**13) == []
    assert health.next_deadline_ms() is None
    assert due_conditions(elected({}), None, 10**13, every_check_off, auditor_elected_since_ms=0) == []
    no_grace = replace(CHECK_GRACES, checks_overdue_s=0)
    assert due_conditions(elected({}), None, 10**13, no_grace, auditor_elected_since_ms=0) == []


def test_a_new_auditor_gets_the_grace_to_catch_up_and_none_is_judged_without_an_auditor_or_when_off():
    health = AutoRecoveryHealth(CHECK_GRACES)
    health.observe(elected({CHECK_ALL: 0, REPLICAS: 0}), 1_000)
    assert health.next_deadline_ms() == 360_000
    # Another Auditor is elected at 500 000, past both due times: BookKeeper's runs them at once.
    assert health.observe(elected({CHECK_ALL: 0, REPLICAS: 0}, auditor="b2"), 500_000) == []
    assert health.next_deadline_ms() == 560_000
    health.observe(AutoRecoveryZnodes(checks={CHECK_ALL: 0}), 510_000)  # no Auditor: AUDITOR_MISSING's
    assert health.advance(10**12) == [] and health.next_deadline_ms() is None
    switched_off = elected({CHECK_ALL: 0}, disabled_since_ms=10**12)  # the Auditor skips its checks
    assert health.observe(switched_off, 10**12) == []
    assert [t.kind for t in health.advance(10**13)] == [DISABLED]  # and only that one fires
    # Back on, the same Auditor: it skipped the runs that fell due and makes up for them only at its next
    # tick, so the check is overdue at once.
    on_again = health.observe(elected({CHECK_ALL: 0}), 10**13)
    assert [(t.kind, t.firing) for t in on_again] == [(DISABLED, False), (OVERDUE, True)]


def test_a_restart_keeps_since_when_the_auditor_is_elected_and_what_fired():
    health = AutoRecoveryHealth(CHECK_GRACES)
    health.observe(elected({}), 1_000)  # neither check ever ran: due from the election on
    saved = json.loads(json.dumps(health.to_json()))
    restored = AutoRecoveryHealth.from_json(saved, CHECK_GRACES)
    assert restored.observe(elected({}), 50_000) == []  # the same Auditor, read again after the restart
    assert restored.next_deadline_ms() == 61_000
    (fired,) = restored.advance(61_000)
    assert fired.detail["overdue"] == ["checkallledgersctime", "replicascheckctime"]
    again = AutoRecoveryHealth.from_json(json.loads(json.dumps(restored.to_json())), CHECK_GRACES)
    assert again.znodes == elected({}) and again.advance(10**9) == []  # still open, not fired twice
    (resolved,) = again.observe(elected({CHECK_ALL: 70_000, REPLICAS: 70_000}), 70_000)
    assert (resolved.firing, resolved.detail["since_ms"]) == (False, 1_000)
    assert AutoRecoveryHealth.from_json(again.to_json(), CHECK_GRACES).znodes.checks == {
        CHECK_ALL: 70_000,
        REPLICAS: 70_000,
    }


# Steps of a random history: (kind, value, time step ms).
steps = st.lists(
    st.tuples(
        st.sampled_from(
            ["disable", "enable", "vote", "unvote", "run", "stop", "lock", "unlock", "tick", "checked"]
        ),
        st.integers(0, 3),
        st.integers(0, 12_000),
    ),
    max_size=40,
)
# Short enough for the histories above to reach: checks every 10 s and 4 s, 3 s late.
PROPERTY_GRACES = replace(
    GRACES, checks_overdue_s=3, check_all_ledgers_interval_s=10, replicas_check_interval_s=4
)


@settings(max_examples=200, deadline=None)
@given(steps, st.integers(0, 40))
def test_after_every_input_exactly_the_due_conditions_are_firing(history, restore_at):
    """The state machine against the rule: after each call, what fired and is still open is exactly what
    ``due_conditions`` says is due (an oracle tracks since when the Auditor is missing, and since when it is
    seen elected), every firing comes after its grace, fire and resolve alternate per condition, and a
    save/restore (through JSON) mid-way changes nothing."""
    graces = PROPERTY_GRACES
    health = AutoRecoveryHealth(graces)
    now, disabled_since, voted, running, locks = 0, None, False, False, {}
    checks: dict[CtimeZnode, int] = {}
    missing_since: int | None = None
    elected_since: int | None = None
    observed = False
    open_now: dict[tuple[str, int | None], int] = {}
    for index, (kind, value, step) in enumerate(history):
        if index == restore_at:
            health = AutoRecoveryHealth.from_json(json.loads(json.dumps(health.to_json())), graces)
        now += step
        if kind == "disable" and disabled_since is None:
            disabled_since = now - value * 1_000  # the znode's ctime may predate the read
        elif kind == "enable":
            disabled_since = None
        elif kind in ("vote", "unvote"):
            voted = kind == "vote"
        elif kind == "lock" and value not in locks:
            locks[value] = ReplicationLock(f"w{value}", now)
        elif kind == "unlock":
            locks.pop(value, None)
        elif kind == "checked":  # the Auditor completed a check, up to 3 s before the read
            checks[REPLICAS if value % 2 else CHECK_ALL] = now - value * 1_000
        znodes = AutoRecoveryZnodes(disabled_since, "auditor" if voted else None, dict(locks), dict(checks))
        if kind in ("run", "stop"):
            running = kind == "run"
            transitions = health.set_bookies_running(running, now)
        elif kind == "tick":
            transitions = health.advance(now)
        else:
            observed = True
            elected_since = (elected_since if elected_since is not None else now) if voted else None
            transitions = health.observe(znodes, now)
        holds = observed and running and not voted
        missing_since = (missing_since if missing_since is not None else now) if holds else None
        for t in transitions:
            key = (t.kind.value, t.ledger_id)
            assert t.at_ms == now
            if t.firing:
                assert key not in open_now
                assert now - t.detail["since_ms"] >= graces.grace_ms(t.kind)
                open_now[key] = t.detail["since_ms"]
            else:
                assert open_now.pop(key) == t.detail["since_ms"]
        due = due_conditions(znodes, missing_since, now, graces, elected_since) if observed else []
        assert open_now == {c.key: c.since_ms for c in due}


# ------------------------------------------------------------------------------ alerts and events


def test_cluster_kinds_have_their_own_entity_and_key():
    alert = Alert.cluster_level(
        cluster="c", kind=AlertKind.AUDITOR_MISSING, started_at_ms=1, detected_at_ms=2
    )
    assert alert.kafka_key() == "c/auditor" and alert.to_json()["ledger_id"] is None
    assert AlertKind.REPLICATION_STALLED.is_cluster_kind is False
    stalled = Alert.ledger(cluster="c", kind=STALLED, ledger_id=9, started_at_ms=1, detected_at_ms=2)
    assert stalled.kafka_key() == "c/ledger/9"


def test_the_decoded_payload_names_the_lowest_vote_as_the_auditor():
    state = ev.auto_recovery_state(
        disabled_ctime_ms=500, votes=[(9, "late"), (4, "first")], locks=[(7, None, 1_000)]
    )
    event = ev.EventBuilder("c", "run", clock_ms=lambda: 0).build(state)
    assert ev.entity_key_of(state) == "cluster"
    payload = _auto_recovery_payload(ev.decode_event(ev.encode_event(event)).auto_recovery_state)
    assert payload["auditor"] == "first" and payload["votes"] == 2
    assert payload["disabled"] and payload["disabled_ctime_ms"] == 500
    assert payload["locks"] == [[7, None, 1_000]]
    none = _auto_recovery_payload(ev.auto_recovery_state(disabled_ctime_ms=None))
    assert none["auditor"] is None and not none["disabled"] and none["disabled_ctime_ms"] is None


# ---------------------------------------------------------------------------------- the cluster group


def row(kind: str, t: int, bookie_id: str | None = None, **payload: Any) -> dict[str, Any]:
    return {"kind": kind, "event_time_ms": t, "ledger_id": None, "bookie_id": bookie_id, "payload": payload}


AUTORECOVERY_OFF = row(
    "auto_recovery_state",
    1_000,
    disabled=True,
    disabled_ctime_ms=900,
    auditor=None,
    votes=0,
    locks=[[5, "w1", 1_000]],
)


def alerts_of(decisions: list[dict[str, Any]]) -> list[tuple[str, int | None, bool]]:
    return [
        (d["payload"]["kind"], d["ledger_id"], d["payload"]["firing"])
        for d in decisions
        if d["kind"] == "autorecovery_alert"
    ]


def test_the_cluster_group_fires_at_the_deadline_it_asks_a_timer_for_and_resolves_on_the_next_state():
    logic = ClusterLogic(ProcessorConfig(autorecovery=GRACES))
    rows = [row("bookie_status", 500, bookie_id="b1", status="WRITABLE"), AUTORECOVERY_OFF]
    state, out, deadline = logic.apply(None, rows)
    assert alerts_of(out) == [] and deadline == 6_000  # the Auditor, missing since 1 000, first
    state, out, deadline = logic.on_timer(state, 6_000)
    assert alerts_of(out) == [("AUDITOR_MISSING", None, True)] and deadline == 10_900
    state, out, _ = logic.apply(state, [row("heartbeat", 21_000, partition=0)])
    assert sorted(alerts_of(out)) == [("AUTORECOVERY_DISABLED", None, True), ("REPLICATION_STALLED", 5, True)]
    healthy = row("auto_recovery_state", 22_000, disabled=False, auditor="b1", votes=1, locks=[])
    state, out, deadline = logic.apply(state, [healthy])
    assert sorted(alerts_of(out)) == [
        ("AUDITOR_MISSING", None, False),
        ("AUTORECOVERY_DISABLED", None, False),
        ("REPLICATION_STALLED", 5, False),
    ]
    # What is left pending: BookKeeper's weekly check of all ledgers, never seen run, a day (the default
    # grace) after the Auditor was first seen.
    assert deadline == 22_000 + 86_400_000


def test_a_cluster_group_without_membership_ignores_autorecovery_state():
    logic = ClusterLogic(ProcessorConfig(membership=False, autorecovery=GRACES))
    _, out, deadline = logic.apply(None, [AUTORECOVERY_OFF, row("heartbeat", 10**9, partition=0)])
    assert alerts_of(out) == [] and deadline is None


# ---------------------------------------------------------------------------------- the ground truth


def test_ground_truth_requires_what_is_due_and_allows_what_is_at_its_deadline():
    znodes = AutoRecoveryZnodes(disabled_since_ms=0, locks={4: ReplicationLock("w", 15_500)})
    snapshot = ClusterSnapshot(
        now_ms=35_000, bookies={}, ledgers={}, autorecovery=znodes, auditor_missing_since_ms=34_500
    )
    truth = ground_truth(snapshot, TruthParameters(autorecovery=GRACES))
    assert truth["alerts"]["AUTORECOVERY_DISABLED"] == ["autorecovery"]
    assert truth["alerts"]["REPLICATION_STALLED"] == [] and truth["may_alert"]["REPLICATION_STALLED"] == [4]
    assert truth["alerts"]["AUDITOR_MISSING"] == [] and truth["may_alert"]["AUDITOR_MISSING"] == []
    healthy = ground_truth(ClusterSnapshot(now_ms=10**12, bookies={}, ledgers={}))
    assert all(healthy["alerts"][k] == [] for k in ("AUTORECOVERY_DISABLED", "AUDITOR_MISSING"))


def test_the_decoded_payload_carries_the_check_times_by_znode_name():
    state = ev.auto_recovery_state(
        disabled_ctime_ms=None, votes=[(1, "b1")], checks={CHECK_ALL: 1_000, PLACEMENT: 0}
    )
    payload = _auto_recovery_payload(
        ev.decode_event(ev.encode_event(ev.EventBuilder("c", "r").build(state))).auto_recovery_state
    )
    assert payload["checks"] == {"checkallledgersctime": 1_000, "placementpolicycheckctime": 0}
    assert _auto_recovery_payload(ev.auto_recovery_state(disabled_ctime_ms=None))["checks"] == {}


def test_the_cluster_group_fires_an_overdue_check_from_its_deadline_and_keeps_it_across_a_restart():
    logic = ClusterLogic(ProcessorConfig(autorecovery=CHECK_GRACES))
    checked = row(
        "auto_recovery_state",
        2_000,
        disabled=False,
        auditor="b1",
        votes=1,
        locks=[],
        checks={"checkallledgersctime": 1_000, "replicascheckctime": 1_500},
    )
    state, out, deadline = logic.apply(None, [checked])
    assert alerts_of(out) == [] and deadline == 361_500
    state = json.loads(json.dumps(state))  # what the lane saves and a restarted job reads
    state, out, deadline = logic.on_timer(state, 361_500)
    assert alerts_of(out) == [("AUDITOR_CHECKS_OVERDUE", None, True)] and deadline is None  # one alert
    state = json.loads(json.dumps(state))
    later = {**checked["payload"], "checks": {"checkallledgersctime": 1_000, "replicascheckctime": 400_000}}
    state, out, deadline = logic.apply(state, [row("auto_recovery_state", 400_000, **later)])
    assert alerts_of(out) == [("AUDITOR_CHECKS_OVERDUE", None, False)] and deadline == 661_000


def test_ground_truth_requires_an_overdue_check_with_the_jobs_rule():
    znodes = elected({CHECK_ALL: 0})
    params = TruthParameters(autorecovery=CHECK_GRACES)

    def truth_at(now_ms: int) -> tuple[list[Any], list[Any]]:
        snapshot = ClusterSnapshot(
            now_ms=now_ms, bookies={}, ledgers={}, autorecovery=znodes, auditor_elected_since_ms=100
        )
        truth = ground_truth(snapshot, params)
        return truth["alerts"]["AUDITOR_CHECKS_OVERDUE"], truth["may_alert"]["AUDITOR_CHECKS_OVERDUE"]

    # The replicas check never ran: due when the Auditor was elected (100), overdue 60 s later.
    assert truth_at(58_000) == ([], [])
    assert truth_at(60_100) == ([], ["auditor-checks"])
    assert truth_at(61_200) == (["auditor-checks"], [])
    assert (
        ground_truth(ClusterSnapshot(now_ms=61_200, bookies={}, ledgers={}), params)["alerts"][
            "AUDITOR_CHECKS_OVERDUE"
        ]
        == []
    )  # no Auditor: AUDITOR_MISSING's business
