"""BP-54 relocation plans on random rack maps and ensembles: verified, minimal, only failing write sets, lost
members first; the bytes a move copies."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.rules.placement import PlacementAdherence, check_placement
from core.domain.rules.relocation import moved_bytes, plan_relocation
from core.domain.striping import count_entries_striped_to_bookie, entries_striped_to_bookie

LOCATIONS = {
    "rackaware": ["/r1", "/r2", "/r3", "/r4", None],
    "zoneaware": ["/z1/u1", "/z1/u2", "/z2/u1", "/z3/u1", None],
    "regionaware": ["/east/r1", "/east/r2", "/west/r1", "/north/r1", None],
}


@st.composite
def clusters(draw: Any) -> dict[str, Any]:
    policy = draw(st.sampled_from(sorted(LOCATIONS)))
    count = draw(st.integers(3, 12))
    bookies = [f"b{i}" for i in range(count)]
    racks = {b: draw(st.sampled_from(LOCATIONS[policy])) for b in bookies}
    size = draw(st.integers(2, min(5, count)))
    ensemble = draw(st.permutations(bookies))[:size]
    write_quorum = draw(st.integers(1, size))
    writable = draw(st.sets(st.sampled_from(bookies)))
    counts = {b: draw(st.integers(0, 50)) for b in sorted(writable)}
    return {"policy": policy, "racks": racks, "ensemble": ensemble, "wq": write_quorum, "counts": counts}


def _verdict(cluster: dict[str, Any], ensemble: Any) -> Any:
    return check_placement(cluster["policy"], ensemble, cluster["wq"], cluster["wq"], cluster["racks"])


def _single_moves_that_work(cluster: dict[str, Any]) -> list[tuple[int, str]]:
    ensemble = cluster["ensemble"]
    found = []
    for position in range(len(ensemble)):
        for bookie in cluster["counts"]:
            if bookie in ensemble:
                continue
            planned = list(ensemble)
            planned[position] = bookie
            if _verdict(cluster, planned).adherence is PlacementAdherence.MEETS_STRICT:
                found.append((position, bookie))
    return found


@settings(max_examples=400, deadline=None)
@given(cluster=clusters())
def test_every_plan_meets_the_policy_and_moves_only_members_of_failing_write_sets(cluster):
    before = _verdict(cluster, cluster["ensemble"])
    counts = dict(cluster["counts"])
    plan = plan_relocation(cluster["policy"], cluster["ensemble"], cluster["wq"], cluster["racks"], counts)
    if before.adherence is PlacementAdherence.MEETS_STRICT:
        assert plan.valid and plan.moves == ()
        return
    failing = {b for write_set in before.failing_write_sets or before.soft_write_sets for b in write_set}
    if not plan.valid:
        assert plan.reason and plan.moves == ()
        assert not _single_moves_that_work(cluster)  # a plan of one move would have been found
        return
    assert _verdict(cluster, plan.ensemble).adherence is PlacementAdherence.MEETS_STRICT
    assert len(set(plan.ensemble)) == len(plan.ensemble)
    for move in plan.moves:
        assert move.from_bookie in failing and cluster["ensemble"][move.position] == move.from_bookie
        assert move.to_bookie in cluster["counts"] and move.to_bookie not in cluster["ensemble"]
        assert counts[move.to_bookie] == cluster["counts"][move.to_bookie] + 1  # counted for the next plan
    if _single_moves_that_work(cluster):
        assert len(plan.moves) == 1


def test_targets_spread_by_ledger_counts_across_plans():
    racks = {"a": "/r1", "b": "/r1", "c": "/r1", "d": "/r1", "x": "/r2", "y": "/r2"}
    counts = {"x": 10, "y": 10}
    first = plan_relocation("rackaware", ["a", "b"], 2, racks, counts)
    second = plan_relocation("rackaware", ["c", "d"], 2, racks, counts)
    assert [m.to_bookie for m in first.moves] == ["x"]
    assert [m.to_bookie for m in second.moves] == ["y"]  # x holds one more ledger now
    assert counts == {"x": 11, "y": 11}


def test_a_ledger_without_a_valid_target_says_why():
    racks = {"a": "/r1", "b": "/r1", "c": "/r1"}
    plan = plan_relocation("rackaware", ["a", "b"], 2, racks, {"c": 0})
    assert not plan.valid and "meets the policy" in plan.reason


@st.composite
def clusters_with_lost_members(draw: Any) -> dict[str, Any]:
    cluster = draw(clusters())
    lost = draw(st.sets(st.sampled_from(cluster["ensemble"]), max_size=len(cluster["ensemble"])))
    writable = {b: n for b, n in cluster["counts"].items() if b not in lost}  # a lost bookie takes nothing
    return {**cluster, "counts": writable, "lost": lost}


def _single_replacements_that_work(cluster: dict[str, Any], position: int) -> list[str]:
    planned = list(cluster["ensemble"])
    found = []
    for bookie in cluster["counts"]:
        if bookie in cluster["ensemble"]:
            continue
        planned[position] = bookie
        if _verdict(cluster, planned).adherence is PlacementAdherence.MEETS_STRICT:
            found.append(bookie)
    return found


@settings(max_examples=400, deadline=None)
@given(cluster=clusters_with_lost_members())
def test_lost_members_are_moved_first_within_the_budget_and_plans_stay_verified(cluster):
    before = _verdict(cluster, cluster["ensemble"])
    lost = cluster["lost"]
    policy, ensemble, racks, counts = (
        cluster["policy"],
        cluster["ensemble"],
        cluster["racks"],
        cluster["counts"],
    )
    plan = plan_relocation(
        policy, ensemble, cluster["wq"], racks, dict(counts), replace_first=lost, max_moves=3
    )
    if before.adherence is PlacementAdherence.MEETS_STRICT:
        assert plan.valid and plan.moves == ()
        return
    if len(lost) > 3:
        assert not plan.valid and "more than 3 moves" in plan.reason
        return
    if not plan.valid:
        assert plan.moves == ()
        if len(lost) == 1:  # replacing the lost member alone would have been found
            (position,) = [i for i, b in enumerate(cluster["ensemble"]) if b in lost]
            assert not _single_replacements_that_work(cluster, position)
        return
    moved = [m.from_bookie for m in plan.moves]
    assert set(moved[: len(lost)]) == lost  # every lost member, before any other move
    assert len(moved) <= 3 and len(set(moved)) == len(moved)
    assert _verdict(cluster, plan.ensemble).adherence is PlacementAdherence.MEETS_STRICT
    assert not set(plan.ensemble) & lost
    assert all(
        m.to_bookie in cluster["counts"] and m.to_bookie not in cluster["ensemble"] for m in plan.moves
    )
    if len(lost) == 1:
        (position,) = [i for i, b in enumerate(cluster["ensemble"]) if b in lost]
        if _single_replacements_that_work(cluster, position):
            assert len(plan.moves) == 1  # the lost member's replacement alone fixes placement


def test_a_lost_member_is_replaced_first_which_can_fix_placement_in_fewer_moves():
    racks = {"a": "/r1", "b": "/r1", "x": "/r2", "y": "/r3"}
    # Without the loss the plan moves a (position 0) to x; b would still have to be re-replicated: two moves.
    unaware = plan_relocation("rackaware", ["a", "b"], 2, racks, {"x": 0, "y": 5})
    assert [(m.position, m.to_bookie) for m in unaware.moves] == [(0, "x")]
    plan = plan_relocation("rackaware", ["a", "b"], 2, racks, {"x": 0, "y": 5}, replace_first={"b"})
    assert [(m.position, m.from_bookie, m.to_bookie) for m in plan.moves] == [(1, "b", "x")]
    assert plan.ensemble == ("a", "x")


def test_a_lost_member_outside_the_failing_write_sets_still_moves_first_and_counts_in_the_budget():
    racks = {"a": "/r1", "b": "/r1", "c": "/r2", "d": "/r3", "x": "/r2", "y": "/r4"}
    ensemble, targets = ["a", "b", "c", "d"], {"x": 0, "y": 0}
    # E=4, WQ=2: only [a, b] fails; c is lost and sits in [b, c] and [c, d], which pass.
    plan = plan_relocation("rackaware", ensemble, 2, racks, targets, replace_first=["c"])
    assert plan.moves[0].from_bookie == "c" and len(plan.moves) == 2
    assert plan.moves[1].from_bookie in ("a", "b")
    verdict = check_placement("rackaware", plan.ensemble, 2, 2, racks)
    assert verdict.adherence is PlacementAdherence.MEETS_STRICT
    tight = plan_relocation("rackaware", ensemble, 2, racks, targets, replace_first=["c"], max_moves=1)
    assert not tight.valid and "at most 1 replica(s), the 1 lost or unregistered member(s)" in tight.reason
    over = plan_relocation("rackaware", ["a", "b"], 2, racks, targets, replace_first=["a", "b"], max_moves=1)
    assert not over.valid and over.reason == "2 lost or unregistered members, more than 1 moves"


def test_moved_bytes_is_the_ledgers_bytes_per_entry_times_the_entries_on_the_moved_position():
    # 10 entries, 1000 bytes, segments [0..4] and [5..9], E=3, WQ=2: entry e is on positions e%3, (e+1)%3.
    # Segment 1, position 0 stores 5, 6, 8, 9 (4 entries); position 1: 6, 7, 9 (3); position 2: 5, 7, 8 (3).
    assert [moved_bytes(1000, 9, [0, 5], 1, p, 2, 3) for p in range(3)] == [400, 300, 300]
    # Segment 0 (entries 0..4): position 0 stores 0, 2, 3 → 300; E = WQ: every entry → 500.
    assert moved_bytes(1000, 9, [0, 5], 0, 0, 2, 3) == 300
    assert moved_bytes(1000, 9, [0, 5], 0, 1, 3, 3) == 500
    # A segment that starts past the last entry holds nothing; an empty ledger moves nothing.
    assert moved_bytes(1000, 9, [0, 12], 1, 0, 2, 3) == 0
    assert moved_bytes(0, -1, [0], 0, 0, 2, 3) == 0


@settings(max_examples=300, deadline=None)
@given(
    ensemble_size=st.integers(1, 7),
    data=st.data(),
    first=st.integers(0, 40),
    span=st.integers(-2, 60),
)
def test_the_count_of_striped_entries_is_the_length_of_the_striped_entries(ensemble_size, data, first, span):
    write_quorum = data.draw(st.integers(1, ensemble_size))
    index = data.draw(st.integers(0, ensemble_size - 1))
    last = first + span
    expected = (
        len(list(entries_striped_to_bookie(index, first, last, ensemble_size, write_quorum)))
        if last >= first
        else 0
    )
    assert count_entries_striped_to_bookie(index, first, last, ensemble_size, write_quorum) == expected
