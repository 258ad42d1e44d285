"""AutoRecovery health: the rule, its state machine, the cluster group that runs it, and the ground truth."""

from __future__ import annotations

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
from streaming.decode import _auto_recovery_payload
from streaming.processor import ClusterLogic, ProcessorConfig

GRACES = AutoRecoveryGraces(disabled_s=10, auditor_missing_s=5, lock_held_s=20)
DISABLED, MISSING, STALLED = (
    AlertKind.AUTORECOVERY_DISABLED,
    AlertKind.AUDITOR_MISSING,
    AlertKind.REPLICATION_STALLED,
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


# Steps of a random history: (kind, value, time step ms).
steps = st.lists(
    st.tuples(
        st.sampled_from(["disable", "enable", "vote", "unvote", "run", "stop", "lock", "unlock", "tick"]),
        st.integers(0, 3),
        st.integers(0, 12_000),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(steps, st.integers(0, 40))
def test_after_every_input_exactly_the_due_conditions_are_firing(history, restore_at):
    """The state machine against the rule: after each call, what fired and is still open is exactly what
    ``due_conditions`` says is due (an oracle tracks since when the Auditor is missing), every firing comes
    after its grace, fire and resolve alternate per condition, and a save/restore mid-way changes nothing."""
    health = AutoRecoveryHealth(GRACES)
    now, disabled_since, voted, running, locks = 0, None, False, False, {}
    missing_since: int | None = None
    observed = False
    open_now: dict[tuple[str, int | None], int] = {}
    for index, (kind, value, step) in enumerate(history):
        if index == restore_at:
            health = AutoRecoveryHealth.from_json(health.to_json(), GRACES)
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
        znodes = AutoRecoveryZnodes(disabled_since, "auditor" if voted else None, dict(locks))
        if kind in ("run", "stop"):
            running = kind == "run"
            transitions = health.set_bookies_running(running, now)
        elif kind == "tick":
            transitions = health.advance(now)
        else:
            observed = True
            transitions = health.observe(znodes, now)
        holds = observed and running and not voted
        missing_since = (missing_since if missing_since is not None else now) if holds else None
        for t in transitions:
            key = (t.kind.value, t.ledger_id)
            assert t.at_ms == now
            if t.firing:
                assert key not in open_now
                assert now - t.detail["since_ms"] >= GRACES.grace_ms(t.kind)
                open_now[key] = t.detail["since_ms"]
            else:
                assert open_now.pop(key) == t.detail["since_ms"]
        due = due_conditions(znodes, missing_since, now, GRACES) if observed else []
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
    assert deadline is None


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
