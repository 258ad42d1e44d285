"""The rack-aware placement screen over a batch equals the per-ledger rule (pure code, hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.rules.evaluate import PlacementPolicyConfig, placement_condition
from core.domain.rules.placement_batch import rackaware_screen

BOOKIES = [f"b{i}" for i in range(8)]
LOCATIONS = [None, "/r1", "/r2", "r3", "/r1/", "/default-rack", "/", ""]


@st.composite
def ledgers(draw):
    size = draw(st.integers(1, 6))
    write_quorum = draw(st.integers(1, 6))
    segments = draw(
        st.lists(
            st.lists(st.sampled_from(BOOKIES), min_size=size, max_size=size, unique=draw(st.booleans())),
            min_size=1,
            max_size=3,
        )
    )
    return segments, write_quorum


@settings(max_examples=300, deadline=None)
@given(
    batch=st.lists(ledgers(), min_size=1, max_size=12),
    racks=st.dictionaries(st.sampled_from(BOOKIES), st.sampled_from(LOCATIONS)),
    min_racks=st.integers(1, 4),
    enforce=st.booleans(),
)
def test_the_screen_passes_exactly_the_ledgers_the_per_ledger_rule_finds_adhering(
    batch, racks, min_racks, enforce
):
    config = PlacementPolicyConfig(
        policy="rackaware", min_racks_per_write_quorum=min_racks, enforce_min_racks_per_write_quorum=enforce
    )
    screened = rackaware_screen(
        [segments for segments, _ in batch],
        [write_quorum for _, write_quorum in batch],
        racks,
        min_racks_per_write_quorum=min_racks,
        enforce_min_racks_per_write_quorum=enforce,
    )
    for (segments, write_quorum), passed in zip(batch, screened.tolist(), strict=True):
        ledger = {
            "state": "CLOSED",
            "write_quorum": write_quorum,
            "ack_quorum": 1,
            "segments": [[i * 10, ensemble] for i, ensemble in enumerate(segments)],
        }
        assert passed == (placement_condition(ledger, racks, config) is None), (segments, write_quorum)


def test_ledgers_the_screen_cannot_judge_go_to_the_per_ledger_rule():
    assert rackaware_screen([[[]], [["b1", "b2"]]], [2, 0], {}).tolist() == [False, False]
    assert rackaware_screen([], [], {}).tolist() == []
