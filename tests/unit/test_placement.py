"""Placement adherence: BookKeeper's rack- and zone-aware rules, our region-aware rule, and a brute force."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.rules.placement import (
    PlacementAdherence,
    PlacementVerdict,
    check_placement,
    normalize_location,
    rackaware_adherence,
    region_and_rack,
    regionaware_adherence,
    write_set_windows,
    zone_and_upgrade_domain,
    zoneaware_adherence,
)

FAIL, SOFT, STRICT = PlacementAdherence.FAIL, PlacementAdherence.MEETS_SOFT, PlacementAdherence.MEETS_STRICT


# --- windows and locations ------------------------------------------------------------------------


def test_windows_are_cyclic_and_wrap_when_ensemble_is_smaller_than_wq() -> None:
    assert write_set_windows(["a", "b", "c", "d"], 3) == [
        ("a", "b", "c"),
        ("b", "c", "d"),
        ("c", "d", "a"),
        ("d", "a", "b"),
    ]
    assert write_set_windows(["a"], 2) == [("a", "a")]
    assert write_set_windows([], 2) == []


def test_locations_are_normalised_like_pulsar_and_nodebase() -> None:
    assert normalize_location("rack0") == "/rack0"
    assert normalize_location("/eu/r1/") == "/eu/r1"
    assert normalize_location("") is None
    assert normalize_location("/") is None
    assert normalize_location(" / ") is None
    assert normalize_location(None) is None


def test_region_and_zone_parsing() -> None:
    assert region_and_rack("/eu/r1") == ("eu", "r1")
    assert region_and_rack("eu/r1") == ("eu", "r1")
    assert region_and_rack("/eu") == ("eu", "default-rack")
    assert region_and_rack("/eu/a/b") == ("eu", "a/b")
    assert region_and_rack("/default-region/default-rack") is None
    assert region_and_rack("/default-rack") is None
    assert region_and_rack(None) is None
    assert zone_and_upgrade_domain("/z1/u1") == ("/z1", "/u1")
    assert zone_and_upgrade_domain("z1/u1/") == ("/z1", "/u1")
    assert zone_and_upgrade_domain("/z1") is None
    assert zone_and_upgrade_domain("/z1/u1/x") is None
    assert zone_and_upgrade_domain("/default-zone/default-upgradedomain") is None
    assert zone_and_upgrade_domain("/default-zone/u1") == ("/default-zone", "/u1")


# --- rack-aware -----------------------------------------------------------------------------------


def test_rackaware_without_any_mapping_fails_every_ensemble_with_wq_2() -> None:
    verdict = rackaware_adherence(["a", "b", "c"], 2, {})
    assert verdict.adherence is FAIL
    assert verdict.failing_write_sets == (("a", "b"), ("b", "c"), ("c", "a"))
    assert verdict.reason == "write set [a, b]: spans 1 rack(s), needs 2"


def test_rackaware_wq1_needs_one_rack_only() -> None:
    assert rackaware_adherence(["a", "b"], 1, {}).adherence is STRICT


def test_rackaware_counts_every_member_whatever_its_liveness() -> None:
    # BookKeeper would drop a read-only/dead member and FAIL this ensemble; we know its rack, so it passes.
    assert rackaware_adherence(["a", "b"], 2, {"a": "/r1", "b": "/r2"}).adherence is STRICT


def test_rackaware_wraps_an_ensemble_smaller_than_wq_and_counts_racks_as_a_set() -> None:
    """BookKeeper's windows ``ensemble[(i + j) % E]``: a repeated bookie adds its rack once."""
    two_racks = rackaware_adherence(["a", "b"], 3, {"a": "/r1", "b": "/r2"})
    assert two_racks == PlacementVerdict(STRICT)
    one_rack = rackaware_adherence(["a", "b"], 3, {"a": "/r1", "b": "/r1"})
    assert one_rack.adherence is FAIL
    assert one_rack.failing_write_sets == (("a", "b", "a"), ("b", "a", "b"))
    assert one_rack.reason == "write set [a, b, a]: spans 1 rack(s), needs 2"
    single = rackaware_adherence(["a"], 2, {"a": "/r1"})
    assert single.failing_write_sets == (("a", "a"),)
    assert rackaware_adherence(["a"], 2, {"a": "/r1"}, min_racks_per_write_quorum=1).adherence is STRICT


def test_rackaware_never_meets_soft_and_lists_only_failing_windows() -> None:
    racks = {"a": "/r1", "b": "/r1", "c": "/r2", "d": "/r2"}
    verdict = rackaware_adherence(["a", "b", "c", "d"], 2, racks)
    assert verdict.adherence is FAIL
    assert verdict.failing_write_sets == (("a", "b"), ("c", "d"))
    assert verdict.soft_write_sets == ()


def test_rackaware_min_racks_is_capped_by_wq_and_configurable() -> None:
    racks = {"a": "/r1", "b": "/r2", "c": "/r2"}
    assert rackaware_adherence(["a", "b", "c"], 3, racks).adherence is STRICT
    assert rackaware_adherence(["a", "b", "c"], 3, racks, min_racks_per_write_quorum=3).adherence is FAIL
    assert rackaware_adherence(["a", "b", "c"], 2, racks, min_racks_per_write_quorum=1).adherence is STRICT


def test_rackaware_enforcement_rejects_the_default_rack() -> None:
    racks = {"a": "/r1", "b": "/r2"}
    assert rackaware_adherence(["a", "b", "c"], 3, racks).adherence is STRICT
    enforced = rackaware_adherence(["a", "b", "c"], 3, racks, enforce_min_racks_per_write_quorum=True)
    assert enforced.adherence is FAIL
    assert enforced.failing_write_sets == (("a", "b", "c"),)  # rotations of one write set count once
    explicit = {"a": "/r1", "b": "/r2", "c": "/default-rack"}
    assert (
        rackaware_adherence(["a", "b", "c"], 2, explicit, enforce_min_racks_per_write_quorum=True).adherence
        is FAIL
    )


def test_rack_names_are_normalised_before_comparing() -> None:
    assert rackaware_adherence(["a", "b"], 2, {"a": "r1", "b": "/r1/"}).adherence is FAIL
    # "" and "/" mean "not mapped": both land in /default-rack.
    assert rackaware_adherence(["a", "b"], 2, {"a": "", "b": "/"}).adherence is FAIL


def test_smaller_ensembles_than_wq_for_zone_and_region_aware() -> None:
    zones = {"a": "/z1/u1", "b": "/z2/u1"}
    zone_verdict = zoneaware_adherence(["a", "b"], 3, zones)
    assert zone_verdict.adherence is FAIL  # BookKeeper's E % WQ != 0 test: an ensemble-level FAIL
    assert zone_verdict.reason == "ensemble size 2 is not a multiple of write quorum 3"
    regions = {"a": "/eu/r1", "b": "/us/r1", "c": "/eu/r2"}
    # Windows (a, b, a) and (b, a, b): a repeated bookie is one member, not two sharing eu/r1.
    assert regionaware_adherence(["a", "b"], 3, regions) == PlacementVerdict(STRICT)
    one_region = regionaware_adherence(["a", "c"], 3, regions)
    assert one_region.failing_write_sets == (("a", "c", "a"), ("c", "a", "c"))


def test_empty_ensemble_fails_for_every_policy() -> None:
    for policy in ("rackaware", "regionaware", "zoneaware"):
        verdict = check_placement(policy, [], 2, 2, {})
        assert verdict == PlacementVerdict(FAIL, (), (), "empty ensemble")


# --- zone-aware -----------------------------------------------------------------------------------

ZONES = {"a": "/z1/u1", "b": "/z2/u1", "c": "/z3/u1", "d": "/z1/u2", "e": "/z2/u2", "f": "/z3/u2"}


def test_zoneaware_strict_soft_and_fail() -> None:
    assert zoneaware_adherence(["a", "b", "c"], 3, ZONES).adherence is STRICT
    soft = zoneaware_adherence(["a", "b", "d"], 3, ZONES)  # two zones; z1 has two upgrade domains
    assert soft.adherence is SOFT
    assert soft.soft_write_sets == (("a", "b", "d"),)
    same_domain = zoneaware_adherence(["a", "b", "x"], 3, {**ZONES, "x": "/z1/u1"})
    assert same_domain.adherence is FAIL
    assert same_domain.reason == "write set [a, b, x]: 2 bookies of zone /z1 share one upgrade domain"


def test_zoneaware_ensemble_level_failures() -> None:
    not_multiple = zoneaware_adherence(["a", "b", "c", "d"], 3, ZONES)
    assert not_multiple.adherence is FAIL and not_multiple.failing_write_sets == ()
    assert not_multiple.reason == "ensemble size 4 is not a multiple of write quorum 3"
    too_small = zoneaware_adherence(["a", "b"], 2, ZONES)
    assert too_small.adherence is FAIL and too_small.failing_write_sets == ()
    assert too_small.reason == "write quorum 2 is not above min zones per write quorum 2"
    # desired = min(WQ, 3) = 2 zones, which a and b reach.
    assert zoneaware_adherence(["a", "b"], 2, ZONES, min_zones_per_write_quorum=1).adherence is STRICT


def test_zoneaware_unresolved_members_fail() -> None:
    for location in (None, "/z1", "/z1/u1/x", "/default-zone/default-upgradedomain"):
        racks = {**ZONES, "x": location}
        verdict = zoneaware_adherence(["a", "b", "x"], 3, racks)
        assert verdict.adherence is FAIL, location


def test_zoneaware_too_few_zones_fails() -> None:
    racks = {"a": "/z1/u1", "b": "/z1/u2", "c": "/z1/u3"}
    verdict = zoneaware_adherence(["a", "b", "c"], 3, racks)
    assert verdict.adherence is FAIL and verdict.reason == "write set [a, b, c]: spans 1 zone(s), needs 2"


def test_zoneaware_six_bookies_wq3() -> None:
    verdict = zoneaware_adherence(["a", "b", "c", "d", "e", "f"], 3, ZONES)
    assert verdict.adherence is STRICT


# --- region-aware ---------------------------------------------------------------------------------

REGIONS = {"a": "/eu/r1", "b": "/us/r1", "c": "/eu/r2", "d": "/eu/r1"}


def test_regionaware_documented_examples() -> None:
    assert regionaware_adherence(["a", "b"], 2, REGIONS).adherence is STRICT
    fail = regionaware_adherence(["a", "c"], 2, REGIONS)
    assert fail.adherence is FAIL and fail.failing_write_sets == (("a", "c"),)
    assert fail.reason == "write set [a, c]: spans 1 known region(s), needs 2"
    soft = regionaware_adherence(["a", "d", "b"], 3, REGIONS)
    assert soft.adherence is SOFT and soft.soft_write_sets == (("a", "d", "b"),)
    assert regionaware_adherence(["a", "x"], 2, REGIONS).adherence is FAIL


def test_regionaware_required_regions_is_capped_by_the_map() -> None:
    one_region = {"a": "/eu/r1", "c": "/eu/r2"}
    assert regionaware_adherence(["a", "c"], 2, one_region).adherence is STRICT
    assert regionaware_adherence(["a", "x"], 2, one_region).adherence is STRICT  # a alone spans 1 region
    assert regionaware_adherence(["x", "y"], 2, one_region).adherence is FAIL
    assert regionaware_adherence(["x", "y"], 2, {}).adherence is STRICT  # no region information at all


def test_regionaware_unknown_region_never_counts() -> None:
    racks = {"a": "/eu/r1", "x": "/default-region/default-rack", "y": "/default-rack"}
    # Only one real region in the map, so one region is required; x and y bring none.
    assert regionaware_adherence(["x", "y"], 2, racks).adherence is FAIL
    assert regionaware_adherence(["a", "x"], 2, racks).adherence is STRICT


def test_regionaware_single_level_location_is_a_region() -> None:
    racks = {"a": "/eu", "b": "/us"}
    assert regionaware_adherence(["a", "b"], 2, racks).adherence is STRICT
    assert regionaware_adherence(["a", "a2"], 2, {**racks, "a2": "eu"}).adherence is FAIL


def test_regionaware_soft_needs_another_rack_in_the_region() -> None:
    racks = {"a": "/eu/r1", "d": "/eu/r1", "b": "/us/r1"}
    assert regionaware_adherence(["a", "d", "b"], 3, racks).adherence is STRICT  # eu has only r1
    racks_with_spare = {**racks, "spare": "/eu/r9"}  # a bookie outside the ensemble gives eu another rack
    assert regionaware_adherence(["a", "d", "b"], 3, racks_with_spare).adherence is SOFT


def test_regionaware_min_regions_setting() -> None:
    racks = {"a": "/eu/r1", "b": "/us/r1", "c": "/ap/r1"}
    assert regionaware_adherence(["a", "b", "c"], 3, racks).adherence is STRICT
    assert regionaware_adherence(["a", "b", "c"], 2, racks, min_regions_for_durability=3).adherence is STRICT
    assert regionaware_adherence(["a", "a", "b"], 3, racks, min_regions_for_durability=3).adherence is FAIL
    assert regionaware_adherence(["a", "b"], 2, racks, min_regions_for_durability=1).adherence is STRICT


# --- dispatcher and JSON --------------------------------------------------------------------------


def test_dispatcher_uses_bookkeeper_defaults_and_rejects_unknown_policies() -> None:
    assert check_placement("rackaware", ["a", "b"], 2, 2).adherence is FAIL
    assert check_placement("zoneaware", ["a", "b", "c"], 3, 2, ZONES).adherence is STRICT
    assert check_placement("regionaware", ["a", "b"], 2, 1, REGIONS).adherence is STRICT
    with pytest.raises(ValueError, match="unknown placement policy"):
        check_placement("random", ["a"], 1, 1)
    with pytest.raises(ValueError, match="write quorum"):
        check_placement("rackaware", ["a"], 0, 0)


def test_to_json_shape() -> None:
    verdict = check_placement("rackaware", ["a", "b"], 2, 2, {"a": "/r1"})
    assert verdict.to_json() == {
        "adherence": "MEETS_STRICT",
        "failing_write_sets": [],
        "soft_write_sets": [],
        "reason": None,
    }


# --- brute-force reference ------------------------------------------------------------------------

LOCATIONS = [
    None, "", "/", " / ", "/r1", "/r2", "r3", "/eu/r1", "/eu/r2", "/us/r1", "/us", "/ap/r1/x",
    "/default-rack", "/default-region/default-rack", "/z1/u1", "/z1/u2", "/z2/u1", "/z3/u1",
    "/default-zone/default-upgradedomain",
]  # fmt: skip


def _norm(location: str | None) -> str | None:
    if location is None or location.strip().strip("/") == "":
        return None
    return "/" + location.strip("/")


def reference(
    policy: str, ensemble: list[str], wq: int, racks: Mapping[str, str | None], **settings_: int
) -> tuple:
    """Naive window enumeration and per-policy rules written independently of the module."""
    if not ensemble:
        return FAIL, []
    n = len(ensemble)
    windows = []
    for i in range(n):
        windows.append(tuple(ensemble[(i + j) % n] for j in range(wq)))

    def loc(b: str) -> str | None:
        return _norm(racks.get(b))

    if policy == "zoneaware":
        min_zones, desired = settings_["min_zones"], settings_["desired_zones"]
        if n % wq != 0 or wq <= min_zones:
            return FAIL, []
        verdicts = []
        for w in windows:
            parsed: list[tuple[str, str] | None] = []
            for b in w:
                location = loc(b)
                parts = location.split("/")[1:] if location else []
                ok = location not in (None, "/default-zone/default-upgradedomain") and len(parts) == 2
                parsed.append((parts[0], parts[1]) if ok else None)
            pairs = [p for p in parsed if p is not None]
            if len(pairs) < len(parsed):
                verdicts.append(FAIL)
                continue
            zones = {zone for zone, _ in pairs}
            bad_ud = any(
                sum(1 for z, _ in pairs if z == zone) > 1 and len({u for z, u in pairs if z == zone}) < 2
                for zone in zones
            )
            if len(zones) < min_zones or bad_ud:
                verdicts.append(FAIL)
            elif len(zones) < min(wq, desired):
                verdicts.append(SOFT)
            else:
                verdicts.append(STRICT)
    elif policy == "rackaware":
        needed = min(wq, settings_["min_racks"])
        verdicts = []
        for w in windows:
            rack_set = {loc(b) or "/default-rack" for b in w}
            bad = len(rack_set) < needed or (settings_["enforce"] and "/default-rack" in rack_set)
            verdicts.append(FAIL if bad else STRICT)
    else:

        def region_rack(location: str | None) -> tuple[str, str] | None:
            if location is None or location in ("/default-rack", "/default-region/default-rack"):
                return None
            parts = location.split("/")[1:]
            return parts[0], "/".join(parts[1:]) or "default-rack"

        mapped = [rr for v in racks.values() if (rr := region_rack(_norm(v))) is not None]
        all_regions = {r for r, _ in mapped}
        required = min(wq, settings_["min_regions"], len(all_regions))
        verdicts = []
        for w in windows:
            members = [rr for b in dict.fromkeys(w) if (rr := region_rack(loc(b))) is not None]
            if len({r for r, _ in members}) < required:
                verdicts.append(FAIL)
            elif any(members.count(m) > 1 and len({k for r, k in mapped if r == m[0]}) > 1 for m in members):
                verdicts.append(SOFT)
            else:
                verdicts.append(STRICT)
    failing: list[tuple[str, ...]] = []
    for w, v in zip(windows, verdicts, strict=True):
        if v is FAIL and all(sorted(w) != sorted(f) for f in failing):
            failing.append(w)
    overall = FAIL if FAIL in verdicts else SOFT if SOFT in verdicts else STRICT
    return overall, failing


POOLS = {
    "rackaware": ["/r1", "/r2", "/r3", "r4", "/eu/r1"],
    "zoneaware": ["/z1/u1", "/z1/u2", "/z2/u1", "/z2/u2", "/z3/u1", "/z4/u3"],
    "regionaware": ["/eu/r1", "/eu/r2", "/us/r1", "/us/r2", "/ap", "/ap/r1/x"],
}


@st.composite
def placement_cases(draw: st.DrawFn) -> dict[str, object]:
    """Mostly well-formed maps for the drawn policy (so every verdict occurs), with some noise."""
    policy = draw(st.sampled_from(sorted(POOLS)))
    ensemble = draw(st.lists(st.sampled_from([f"b{i}" for i in range(9)]), min_size=0, max_size=7))
    if ensemble and policy == "zoneaware" and draw(st.booleans()):
        wq = draw(st.sampled_from([d for d in range(1, len(ensemble) + 1) if len(ensemble) % d == 0]))
    else:
        wq = draw(st.integers(1, 7))
    location = st.sampled_from(POOLS[policy]) | st.sampled_from(LOCATIONS)
    racks = draw(st.dictionaries(st.sampled_from([f"b{i}" for i in range(12)]), location, max_size=12))
    if draw(st.integers(0, 9)) < 7:  # usually every member is mapped, from the policy's own pool
        racks.update({bookie: draw(st.sampled_from(POOLS[policy])) for bookie in ensemble})
    return {
        "policy": policy,
        "ensemble": ensemble,
        "wq": wq,
        "racks": racks,
        "min_racks": draw(st.integers(0, 4)),
        "enforce": draw(st.booleans()),
        "min_zones": draw(st.sampled_from([2, 2, 0, 1, 3])),
        "desired_zones": draw(st.integers(1, 4)),
        "min_regions": draw(st.sampled_from([2, 2, 0, 1, 3, 4])),
    }


@given(placement_cases())
@settings(max_examples=800, deadline=None)
def test_placement_matches_brute_force(case: dict[str, object]) -> None:
    policy, ensemble, wq, racks = case["policy"], case["ensemble"], case["wq"], case["racks"]
    min_racks, enforce, min_zones = case["min_racks"], case["enforce"], case["min_zones"]
    desired_zones, min_regions = case["desired_zones"], case["min_regions"]
    assert isinstance(policy, str) and isinstance(ensemble, list) and isinstance(wq, int)
    assert isinstance(racks, dict) and isinstance(enforce, bool)
    assert isinstance(min_racks, int) and isinstance(min_zones, int)
    assert isinstance(desired_zones, int) and isinstance(min_regions, int)
    verdict = check_placement(
        policy,
        ensemble,
        wq,
        1,
        racks,
        min_racks_per_write_quorum=min_racks,
        enforce_min_racks_per_write_quorum=enforce,
        min_zones_per_write_quorum=min_zones,
        desired_zones_per_write_quorum=desired_zones,
        min_regions_for_durability=min_regions,
    )
    expected_adherence, expected_failing = reference(
        policy,
        ensemble,
        wq,
        racks,
        min_racks=min_racks,
        enforce=enforce,
        min_zones=min_zones,
        desired_zones=desired_zones,
        min_regions=min_regions,
    )
    assert verdict.adherence is expected_adherence
    assert list(verdict.failing_write_sets) == expected_failing
    if verdict.adherence is not FAIL:
        assert verdict.failing_write_sets == () and verdict.reason is None
    else:
        assert verdict.reason
    if policy == "rackaware":
        assert verdict.soft_write_sets == ()
