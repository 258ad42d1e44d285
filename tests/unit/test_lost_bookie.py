"""The lost-bookie debounce rule (behaviour contract item 2)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.rules.lost_bookie import BookieMembership, BookieStatus, DisruptionRule, TransitionKind

W, R, G = BookieStatus.WRITABLE, BookieStatus.READ_ONLY, BookieStatus.GONE


def kinds(transitions):
    return [(t.kind.value, t.bookie_id, t.at_ms) for t in transitions]


def cluster(delay_s: int, *bookies: str) -> BookieMembership:
    membership = BookieMembership(default_delay_s=delay_s)
    for bookie in bookies:
        membership.observe(bookie, W, at_ms=0)
    return membership


def test_a_flap_shorter_than_the_delay_raises_nothing_and_is_counted():
    m = cluster(30, "b1", "b2")
    assert m.observe("b1", G, 1_000) == []
    assert m.advance(30_998) == []
    assert kinds(m.observe("b1", W, 30_999)) == [("FLAPPED", "b1", 30_999)]
    assert m.flaps("b1") == 1
    assert m.advance(10**9) == []
    assert m.lost() == []


def test_missing_past_the_delay_is_lost_at_the_deadline():
    m = cluster(30, "b1", "b2")
    m.observe("b1", G, 1_000)
    assert m.next_deadline_ms() == 31_000
    assert kinds(m.advance(45_000)) == [("LOST", "b1", 31_000)]
    assert m.lost() == ["b1"]
    assert m.next_deadline_ms() is None
    assert m.advance(50_000) == []  # fires once


def test_delay_zero_means_lost_at_once():
    m = cluster(0, "b1", "b2")
    assert kinds(m.observe("b1", G, 5)) == [("LOST", "b1", 5)]


def test_more_than_one_missing_cancels_the_delay_for_all_of_them():
    m = cluster(600, "b1", "b2", "b3")
    assert m.observe("b1", G, 10) == []
    transitions = m.observe("b2", G, 20)
    assert kinds(transitions) == [("LOST", "b1", 20), ("LOST", "b2", 20)]
    assert [t.missing_since_ms for t in transitions] == [10, 20]


def test_read_only_is_not_missing():
    m = cluster(0, "b1", "b2")
    assert m.observe("b1", R, 10) == []
    assert m.missing() == []
    assert m.observe("b1", W, 20) == []


def test_a_lost_bookie_that_returns_resolves():
    m = cluster(0, "b1", "b2")
    m.observe("b1", G, 10)
    assert kinds(m.observe("b1", R, 99)) == [("RETURNED", "b1", 99)]
    assert m.lost() == []


def test_znode_delay_overrides_the_default_and_zero_triggers_at_once():
    m = cluster(0, "b1", "b2")
    m.set_recovery_delay(120, at_ms=0)
    assert m.observe("b1", G, 1_000) == []
    assert m.next_deadline_ms() == 121_000
    assert kinds(m.set_recovery_delay(0, at_ms=2_000)) == [("LOST", "b1", 2_000)]


def test_znode_removed_falls_back_to_the_default():
    m = cluster(10, "b1", "b2")
    m.set_recovery_delay(1000, at_ms=0)
    m.set_recovery_delay(None, at_ms=1)
    assert m.delay_ms == 10_000


def test_stale_observations_are_ignored():
    m = cluster(0, "b1", "b2")
    m.observe("b1", W, 100)
    assert m.observe("b1", G, 50) == []
    assert m.missing() == []


def test_a_bookie_known_only_by_its_cookie_is_missing_from_first_sight():
    m = cluster(5, "b1")
    m.observe("b9", G, 1_000)
    assert kinds(m.advance(6_000)) == [("LOST", "b9", 6_000)]


def test_state_survives_serialisation():
    m = cluster(30, "b1", "b2")
    m.observe("b1", G, 1_000)
    m.set_recovery_delay(40, 2_000)
    restored = BookieMembership.from_json(m.to_json())
    assert restored.to_json() == m.to_json()
    assert kinds(restored.advance(41_000)) == [("LOST", "b1", 41_000)]


# -- a triggered audit: the delay znode written again (`bookkeeper shell triggeraudit`) ---------------------


def test_rewriting_the_delay_in_force_ends_a_pending_delay_as_triggeraudit_does():
    m = cluster(0, "b1", "b2", "b3")
    m.set_recovery_delay(600, at_ms=0, mzxid=5)
    m.observe("b1", G, 1_000)
    assert m.next_deadline_ms() == 601_000
    assert m.set_recovery_delay(600, at_ms=2_000, mzxid=5) == []  # the same write, published again
    transitions = m.set_recovery_delay(600, at_ms=3_000, mzxid=8)  # written again: a new mzxid
    assert kinds(transitions) == [("LOST", "b1", 3_000)]
    assert transitions[0].missing_since_ms == 1_000
    assert m.next_deadline_ms() is None and m.delay_ms == 600_000
    # A bookie that goes missing after the audit waits for the whole delay again.
    assert kinds(m.observe("b1", W, 4_000)) == [("RETURNED", "b1", 4_000)]
    assert m.observe("b2", G, 5_000) == []
    assert m.next_deadline_ms() == 605_000
    assert kinds(m.advance(605_000)) == [("LOST", "b2", 605_000)]


def test_only_a_new_write_of_the_value_in_force_or_of_zero_triggers_an_audit():
    m = cluster(600, "b1", "b2", "b3")
    m.observe("b1", G, 1_000)
    assert m.set_recovery_delay(600, at_ms=2_000, mzxid=5) == []  # the first value seen: nothing says new
    assert m.set_recovery_delay(300, at_ms=3_000, mzxid=6) == []  # another value: a new delay, no audit
    assert m.set_recovery_delay(300, at_ms=4_000, mzxid=4) == []  # an older write read late
    assert m.set_recovery_delay(300, at_ms=5_000, mzxid=6) == []  # the write seen before, again
    assert m.set_recovery_delay(300, at_ms=6_000) == []  # no mzxid: unknown, never an audit
    assert kinds(m.set_recovery_delay(0, at_ms=7_000, mzxid=9)) == [("LOST", "b1", 7_000)]
    m = cluster(600, "b1", "b2")
    m.set_recovery_delay(None, at_ms=0, mzxid=0)  # the znode absent: the default 600 applies
    m.observe("b1", G, 1_000)
    assert kinds(m.set_recovery_delay(600, at_ms=2_000, mzxid=3)) == [("LOST", "b1", 2_000)]  # created


def test_a_triggered_audit_ends_delays_not_disruption_holds():
    m = disrupted_cluster(600, "b1", "b2", "b3", "b4")
    m.set_recovery_delay(600, at_ms=0, mzxid=5)
    for bookie in ("b1", "b2", "b3"):
        m.observe(bookie, G, 1_000)  # three of four at once: held once judged
    m.observe_probe("b1", answered=True, at_ms=1_010)
    m.advance(3_000)
    assert all(m.bookies[b].held for b in ("b1", "b2", "b3"))
    assert m.set_recovery_delay(600, at_ms=4_000, mzxid=7) == []  # b1 answers; b2, b3 wait for the grace
    assert m.registration_lost() == ["b1"] and m.lost() == []
    assert kinds(m.advance(31_000)) == [("LOST", "b2", 31_000), ("LOST", "b3", 31_000)]
    assert m.registration_lost() == ["b1"]


def test_a_bookie_not_yet_judged_at_the_audit_is_lost_once_judged_alone():
    m = disrupted_cluster(600, "b1", "b2", "b3", "b4", "b5")
    m.set_recovery_delay(600, at_ms=0, mzxid=5)
    m.observe("b1", G, 1_000)
    assert m.set_recovery_delay(600, at_ms=1_500, mzxid=6) == []  # b1 waits for its settle time (2 s)
    assert m.next_deadline_ms() == 3_000
    assert kinds(m.advance(3_000)) == [("LOST", "b1", 3_000)]


def test_a_triggered_audit_survives_serialisation():
    m = cluster(0, "b1", "b2", "b3")
    m.set_recovery_delay(600, at_ms=0, mzxid=5)
    restored = BookieMembership.from_json(m.to_json())
    restored.observe("b1", G, 1_000)
    assert restored.set_recovery_delay(600, at_ms=2_000, mzxid=5) == []  # still the write seen before
    assert kinds(restored.set_recovery_delay(600, at_ms=3_000, mzxid=6)) == [("LOST", "b1", 3_000)]
    m = cluster(600, "b1", "b2", "b3", "b4")
    m.disruption = DisruptionRule(settle_s=2, grace_s=30)
    m.observe("b1", G, 1_000)
    m.trigger_audit(1_500)
    again = BookieMembership.from_json(m.to_json())
    again.disruption = m.disruption
    assert again.audit_ms == 1_500
    assert kinds(again.advance(3_000)) == [("LOST", "b1", 3_000)]


events = st.lists(
    st.tuples(st.sampled_from(["b1", "b2", "b3"]), st.sampled_from([W, R, G]), st.integers(0, 5_000)),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(events=events, delay_s=st.integers(0, 3))
def test_lost_iff_missing_long_enough_or_together(events, delay_s):
    """Reference: replay in time order, checking the rule at every millisecond boundary that matters."""
    m = BookieMembership(default_delay_s=delay_s)
    fired: set[str] = set()
    for bookie, status, at in sorted(events, key=lambda e: e[2]):
        for t in m.observe(bookie, status, at):
            if t.kind is TransitionKind.LOST:
                assert t.bookie_id not in fired
                fired.add(t.bookie_id)
            elif t.kind is TransitionKind.RETURNED:
                fired.discard(t.bookie_id)
            else:
                assert t.bookie_id not in fired
    end = 10**7
    for t in m.advance(end):
        fired.add(t.bookie_id)
    # At the end of time every missing bookie is lost and nothing else is.
    assert fired == set(m.missing()) == set(m.lost())


# -- a ZooKeeper disruption: many bookies vanish together while they still serve --------------------------


def disrupted_cluster(delay_s: int, *bookies: str) -> BookieMembership:
    membership = BookieMembership(default_delay_s=delay_s, disruption=DisruptionRule(settle_s=2, grace_s=30))
    for bookie in bookies:
        membership.observe(bookie, W, at_ms=0)
    return membership


def test_bookies_that_vanish_together_but_answer_are_never_lost_and_show_as_registration_lost():
    m = disrupted_cluster(0, "b1", "b2", "b3")
    for bookie in ("b1", "b2", "b3"):
        assert m.observe(bookie, G, 1_000) == []  # held for the settle time or the probe
    for bookie in ("b1", "b2", "b3"):
        assert m.observe_probe(bookie, answered=True, at_ms=1_050) == []
    assert m.advance(10**9) == []  # past the grace too: they answer
    assert m.registration_lost() == ["b1", "b2", "b3"] and m.lost() == []
    assert m.next_deadline_ms() is None
    assert kinds(m.observe("b2", W, 10**9 + 1)) == [("FLAPPED", "b2", 10**9 + 1)]
    assert m.registration_lost() == ["b1", "b3"]


def test_held_bookies_that_do_not_answer_are_lost_at_once_and_unprobed_ones_after_the_grace():
    m = disrupted_cluster(0, "b1", "b2", "b3", "b4")
    for bookie in ("b1", "b2", "b3"):
        m.observe(bookie, G, 1_000)
    assert m.next_deadline_ms() == 3_000  # judged when the settle time has passed
    assert m.advance(3_000) == []  # three of four missing together: held
    assert kinds(m.observe_probe("b1", answered=False, at_ms=3_020)) == [("LOST", "b1", 3_020)]
    assert m.observe_probe("b2", answered=True, at_ms=3_030) == []
    assert m.next_deadline_ms() == 31_000  # b3: never probed, lost when the grace has passed
    assert kinds(m.advance(40_000)) == [("LOST", "b3", 31_000)]
    assert m.lost() == ["b1", "b3"] and m.registration_lost() == ["b2"]
    assert kinds(m.observe_probe("b2", answered=False, at_ms=50_000)) == [("LOST", "b2", 50_000)]


def test_one_missing_bookie_keeps_bookkeepers_rules_after_the_settle_time():
    m = disrupted_cluster(0, "b1", "b2", "b3")
    assert m.observe("b1", G, 1_000) == []
    assert m.next_deadline_ms() == 3_000
    assert kinds(m.advance(3_000)) == [("LOST", "b1", 3_000)]
    m = disrupted_cluster(0, "b1", "b2", "b3")
    m.observe("b1", G, 1_000)
    assert kinds(m.observe_probe("b1", answered=False, at_ms=1_005)) == [("LOST", "b1", 1_005)]
    m = disrupted_cluster(60, "b1", "b2", "b3")
    m.observe("b1", G, 1_000)
    assert m.observe_probe("b1", answered=False, at_ms=1_005) == []  # the recovery delay still applies
    assert kinds(m.advance(61_000)) == [("LOST", "b1", 61_000)]


def test_two_of_ten_missing_together_is_not_a_disruption():
    m = disrupted_cluster(60, *(f"b{i}" for i in range(10)))
    m.observe("b0", G, 1_000)
    m.observe("b1", G, 1_000)
    assert m.observe_probe("b0", answered=True, at_ms=1_010) == []  # an answer waits for the settle time
    assert m.observe_probe("b1", answered=True, at_ms=1_020) == []
    assert kinds(m.advance(3_000)) == [("LOST", "b0", 3_000), ("LOST", "b1", 3_000)]


def test_the_rule_off_is_bookkeepers_rule():
    m = cluster(60, "b1", "b2", "b3")
    m.observe("b1", G, 1_000)
    assert kinds(m.observe("b2", G, 1_000)) == [("LOST", "b1", 1_000), ("LOST", "b2", 1_000)]


def test_held_state_survives_serialisation():
    m = disrupted_cluster(0, "b1", "b2", "b3")
    m.observe("b1", G, 1_000)
    m.observe("b2", G, 1_000)
    m.observe_probe("b1", answered=True, at_ms=1_010)
    m.observe_probe("b2", answered=True, at_ms=1_010)
    m.advance(3_000)
    again = BookieMembership.from_json(m.to_json())
    again.disruption = m.disruption
    assert again.registration_lost() == ["b1", "b2"]
    assert again.advance(10**9) == []


def test_state_saved_before_the_rule_still_loads():
    old = (
        '{"v":1,"default_delay_s":0,"znode_delay_s":null,"bookies":{"b1":["GONE",5,true,0]},'
        '"last_change_ms":{}}'
    )
    assert BookieMembership.from_json(old).lost() == ["b1"]


@given(
    vanish=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3_000)), min_size=1, max_size=8),
    answers=st.dictionaries(st.integers(0, 4), st.booleans()),
    delay_s=st.integers(0, 3),
)
@settings(max_examples=200, deadline=None)
def test_a_bookie_whose_probe_answered_is_lost_only_when_judged_alone(vanish, answers, delay_s):
    """Whatever the order: a bookie that answered its probe is never lost while it was held."""
    m = disrupted_cluster(delay_s, *(f"b{i}" for i in range(5)))
    lost_while_held = []
    for bookie, at_ms in sorted(vanish, key=lambda v: v[1]):
        m.observe(f"b{bookie}", G, at_ms)
        if bookie in answers:
            for t in m.observe_probe(f"b{bookie}", answered=answers[bookie], at_ms=at_ms + 1):
                if m.bookies[t.bookie_id].held and m.bookies[t.bookie_id].answering:
                    lost_while_held.append(t.bookie_id)
    for t in m.advance(10**9):
        if m.bookies[t.bookie_id].held and m.bookies[t.bookie_id].answering:
            lost_while_held.append(t.bookie_id)
    assert lost_while_held == []
    for bookie_id, state in m.bookies.items():
        if state.held and state.answering:
            assert not state.lost, bookie_id


def test_a_bookie_left_behind_by_a_wave_that_came_back_is_still_held():
    """Found by the chaos freeze: the others re-registered before the last one was judged; the wave is who
    vanished together, not who is still missing."""
    m = disrupted_cluster(0, "b1", "b2", "b3", "b4")
    for bookie in ("b1", "b2", "b3", "b4"):
        m.observe(bookie, G, 1_000 + int(bookie[1]) * 50)
        m.observe_probe(bookie, answered=True, at_ms=1_300)
    for bookie in ("b2", "b3", "b4"):
        assert kinds(m.observe(bookie, W, 1_500)) == [("FLAPPED", bookie, 1_500)]
    assert m.advance(3_100) == []  # b1's settle time: it vanished with the others, so it is held
    assert m.registration_lost() == ["b1"] and m.lost() == []
