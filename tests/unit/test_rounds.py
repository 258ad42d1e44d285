"""BP-34's round counting (core.domain.rules.rounds): properties against a plain oracle."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.rules.rounds import FailureRounds, confirms, count_round, failure_kind

# A round's outcome: healthy (None) or one of a few failure kinds.
outcomes = st.lists(
    st.sampled_from([None, "LESS_THAN_AQ", "LESS_THAN_WQ", "UNKNOWN_BOOKIES:b1"]), max_size=30
)


def fold(results):
    count = None
    for failure in results:
        count = count_round(count, failure)
    return count


def trailing_run(results):
    """The oracle: the last outcome and how many rounds in a row ended with it."""
    if not results or results[-1] is None:
        return None
    run = 0
    for failure in reversed(results):
        if failure != results[-1]:
            break
        run += 1
    return FailureRounds(results[-1], run)


@settings(max_examples=300, deadline=None)
@given(outcomes)
def test_the_count_is_the_run_of_the_same_failure_at_the_end(results):
    assert fold(results) == trailing_run(results)


@settings(max_examples=300, deadline=None)
@given(outcomes, st.integers(min_value=1, max_value=5))
def test_an_alert_only_when_the_same_failure_filled_every_round(results, reprobe_rounds):
    # Confirmed iff the finding round and reprobe_rounds re-probes (the last ones) all failed alike.
    needed = reprobe_rounds + 1
    last = results[-needed:]
    same = len(last) == needed and last[0] is not None and all(r == last[0] for r in last)
    assert confirms(fold(results), reprobe_rounds) == same


@settings(max_examples=200, deadline=None)
@given(outcomes, outcomes)
def test_a_healthy_round_or_another_kind_leaves_nothing_of_an_earlier_episode(before, after):
    # Whatever an earlier episode counted, a healthy round makes the count that of the later rounds alone.
    assert fold([*before, None, *after]) == fold(after)
    if after and after[0] is not None and before and before[-1] not in (None, after[0]):
        assert fold([*before, *after]) == fold(after)  # a new kind starts a new count


def test_failure_kinds():
    assert failure_kind({"failing": False, "outcome": {"result": "LESS_THAN_AQ"}}) is None
    assert failure_kind({"failing": True, "outcome": {"result": "NO_REPLICA", "unresolved": ["b1"]}}) == (
        "NO_REPLICA"
    )
    silent = {"failing": True, "outcome": {"result": "OK", "unresponsive": ["b2"], "unresolved": ["b1"]}}
    assert failure_kind(silent) == "UNKNOWN_BOOKIES:b1,b2"
    # A different silent bookie is a different failure.
    assert failure_kind({**silent, "outcome": {"result": "OK", "unresponsive": ["b3"]}}) != failure_kind(
        silent
    )
    assert failure_kind({"failing": True}) == "FAILING"
