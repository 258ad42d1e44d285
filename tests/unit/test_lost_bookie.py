"""The lost-bookie debounce rule (behaviour contract item 2)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.rules.lost_bookie import BookieMembership, BookieStatus, TransitionKind

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
