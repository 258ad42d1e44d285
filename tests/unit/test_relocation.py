"""BP-54 relocation plans on random rack maps and ensembles: verified, minimal, only failing write sets."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.rules.placement import PlacementAdherence, check_placement
from core.domain.rules.relocation import plan_relocation

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
