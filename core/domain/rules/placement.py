"""Placement-policy adherence of one ensemble: rack-aware, zone-aware and region-aware.

Pure code: no I/O, no Spark; shared by ``bkaudit check placement``, the streaming job and
the simulator. docs/placement.md states the rules in prose, including the region-aware rule BookKeeper
never implemented.

Every policy looks at the cyclic *write-set windows* of the ensemble: for each start index ``i`` in
``0..E-1`` the members ``ensemble[(i + j) % E]`` for ``j < WQ`` (the write set of entries ≡ i mod E; it wraps
and repeats members when ``E < WQ``, exactly as BookKeeper computes it). A bookie repeated in a window is one
place holding the entry: it contributes its location once (racks, zones and regions are counted as sets,
as BookKeeper does) and is never "two members sharing a rack". Unlike BookKeeper's rack-aware check, every
member counts with its mapped location whether it is writable, read-only or gone. A bookie absent from
``racks`` is in the policy's default location.

Locations are normalised the way Pulsar's rack map and BookKeeper's ``NodeBase.normalize`` do: null, an
empty string or ``/`` (ignoring surrounding whitespace) means "not mapped", a missing leading ``/`` is added
and trailing ``/`` are removed.

Results carry ``failing_write_sets`` (distinct windows that FAIL, in start-index order; windows holding the
same bookies count once) plus ``soft_write_sets`` and a one-line ``reason`` for FAIL.

Example:
    >>> racks = {"b1": "/r1", "b2": "/r1", "b3": "/r2"}
    >>> verdict = check_placement("rackaware", ["b1", "b2", "b3"], 2, 2, racks)
    >>> verdict.adherence.name, verdict.failing_write_sets
    ('FAIL', (('b1', 'b2'),))
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from core.domain.rackmap import (
    DEFAULT_RACK,
    DEFAULT_REGION_AND_RACK,
    DEFAULT_UPGRADEDOMAIN,
    DEFAULT_ZONE,
    normalize_rack,
)

DEFAULT_ZONE_AND_UPGRADE_DOMAIN = DEFAULT_ZONE + DEFAULT_UPGRADEDOMAIN
"""Zone-aware default fault domain; a bookie there is *unresolved*."""

POLICIES = ("rackaware", "regionaware", "zoneaware")
"""Policy names accepted by :func:`check_placement`."""

DEFAULT_MIN_RACKS_PER_WRITE_QUORUM = 2
DEFAULT_ENFORCE_MIN_RACKS_PER_WRITE_QUORUM = False
DEFAULT_MIN_ZONES_PER_WRITE_QUORUM = 2
DEFAULT_DESIRED_ZONES_PER_WRITE_QUORUM = 3
DEFAULT_MIN_REGIONS_FOR_DURABILITY = 2


class PlacementAdherence(Enum):
    """BookKeeper's ``PlacementPolicyAdherence``, with its numeric values (higher is better).

    Example:
        >>> [member.value for member in PlacementAdherence]
        [1, 3, 5]
    """

    FAIL = 1
    MEETS_SOFT = 3
    MEETS_STRICT = 5


WriteSet = tuple[str, ...]


@dataclass(frozen=True)
class PlacementVerdict:
    """Outcome of one adherence check.

    Example:
        >>> PlacementVerdict(PlacementAdherence.MEETS_STRICT).to_json()
        {'adherence': 'MEETS_STRICT', 'failing_write_sets': [], 'soft_write_sets': [], 'reason': None}
    """

    adherence: PlacementAdherence
    failing_write_sets: tuple[WriteSet, ...] = ()
    soft_write_sets: tuple[WriteSet, ...] = ()
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The CLI's JSON object: ``adherence``, ``failing_write_sets``, ``soft_write_sets``, ``reason``.

        Example:
            >>> verdict = PlacementVerdict(PlacementAdherence.FAIL, (("a", "b"),), (), "x")
            >>> verdict.to_json()["failing_write_sets"]
            [['a', 'b']]
        """
        return {
            "adherence": self.adherence.name,
            "failing_write_sets": [list(write_set) for write_set in self.failing_write_sets],
            "soft_write_sets": [list(write_set) for write_set in self.soft_write_sets],
            "reason": self.reason,
        }


@functools.lru_cache(maxsize=4096)  # pure, and a cluster has few distinct racks: each evaluated once
def normalize_location(location: str | None) -> str | None:
    """A network location in canonical form, or ``None`` when it means "not mapped".

    Example:
        >>> [normalize_location(raw) for raw in ("rack0", "/r/a/", "/", " / ", "")]
        ['/rack0', '/r/a', None, None, None]
    """
    # Pulsar's rule (core.domain.rackmap.normalize_rack), then NodeBase drops a trailing "/".
    rack = normalize_rack(location)
    return rack.rstrip("/") or None if rack is not None else None


def write_set_windows(ensemble: Sequence[str], write_quorum: int) -> list[WriteSet]:
    """The cyclic window starting at every index ``0..E-1`` (wraps, and repeats members, when ``E < WQ``).

    Example:
        >>> write_set_windows(["a", "b", "c"], 2)
        [('a', 'b'), ('b', 'c'), ('c', 'a')]
        >>> write_set_windows(["a", "b"], 3)
        [('a', 'b', 'a'), ('b', 'a', 'b')]
    """
    size = len(ensemble)
    return [
        tuple(ensemble[(start + offset) % size] for offset in range(write_quorum)) for start in range(size)
    ]


def _distinct(write_sets: Sequence[WriteSet]) -> tuple[WriteSet, ...]:
    """First occurrence of each window, where windows holding the same bookies (a rotation) are one."""
    seen: set[tuple[str, ...]] = set()
    kept: list[WriteSet] = []
    for write_set in write_sets:
        key = tuple(sorted(write_set))
        if key not in seen:
            seen.add(key)
            kept.append(write_set)
    return tuple(kept)


def _check_common(ensemble: Sequence[str], write_quorum: int) -> PlacementVerdict | None:
    if write_quorum < 1:
        raise ValueError(f"write quorum must be at least 1, got {write_quorum}")
    if not ensemble:
        return PlacementVerdict(PlacementAdherence.FAIL, reason="empty ensemble")
    return None


def _evaluate_windows(
    ensemble: Sequence[str],
    write_quorum: int,
    judge: Callable[[WriteSet], tuple[PlacementAdherence, str | None]],
) -> PlacementVerdict:
    """Judge every window; the ensemble's adherence is the worst window's."""
    failing: list[WriteSet] = []
    soft: list[WriteSet] = []
    first_reason: str | None = None
    for window in write_set_windows(ensemble, write_quorum):
        adherence, reason = judge(window)
        if adherence is PlacementAdherence.FAIL:
            failing.append(window)
            first_reason = first_reason or f"write set [{', '.join(window)}]: {reason}"
        elif adherence is PlacementAdherence.MEETS_SOFT:
            soft.append(window)
    if failing:
        overall = PlacementAdherence.FAIL
    elif soft:
        overall = PlacementAdherence.MEETS_SOFT
    else:
        overall = PlacementAdherence.MEETS_STRICT
    return PlacementVerdict(overall, _distinct(failing), _distinct(soft), first_reason)


def rackaware_adherence(
    ensemble: Sequence[str],
    write_quorum: int,
    racks: Mapping[str, str | None],
    min_racks_per_write_quorum: int = DEFAULT_MIN_RACKS_PER_WRITE_QUORUM,
    enforce_min_racks_per_write_quorum: bool = DEFAULT_ENFORCE_MIN_RACKS_PER_WRITE_QUORUM,
) -> PlacementVerdict:
    """BookKeeper's rack-aware check, counting every member's rack; never MEETS_SOFT.

    A window FAILs when it spans fewer than ``min(WQ, min_racks_per_write_quorum)`` racks, or, with
    enforcement on, when a member is in ``/default-rack``.

    Example:
        >>> rackaware_adherence(["a", "b", "c"], 2, {"a": "/r1", "b": "/r2", "c": "/r3"}).adherence.name
        'MEETS_STRICT'
        >>> rackaware_adherence(["a", "b"], 2, {}).failing_write_sets
        (('a', 'b'),)
    """
    early = _check_common(ensemble, write_quorum)
    if early is not None:
        return early
    needed = min(write_quorum, min_racks_per_write_quorum)
    location = {bookie: normalize_location(racks.get(bookie)) or DEFAULT_RACK for bookie in ensemble}

    def judge(window: WriteSet) -> tuple[PlacementAdherence, str | None]:
        racks_in_window = {location[bookie] for bookie in window}
        if len(racks_in_window) < needed:
            return PlacementAdherence.FAIL, f"spans {len(racks_in_window)} rack(s), needs {needed}"
        if enforce_min_racks_per_write_quorum and DEFAULT_RACK in racks_in_window:
            return PlacementAdherence.FAIL, f"has a bookie in {DEFAULT_RACK} while the minimum is enforced"
        return PlacementAdherence.MEETS_STRICT, None

    return _evaluate_windows(ensemble, write_quorum, judge)


def zone_and_upgrade_domain(location: str | None) -> tuple[str, str] | None:
    """``(zone, upgrade_domain)`` of a location, or ``None`` when BookKeeper calls it unresolved.

    Unresolved: not mapped, the default fault domain, or not exactly two levels.

    Example:
        >>> [zone_and_upgrade_domain(raw) for raw in ("/az1/ud2", "/az1", None)]
        [('/az1', '/ud2'), None, None]
    """
    normalized = normalize_location(location)
    if normalized is None or normalized == DEFAULT_ZONE_AND_UPGRADE_DOMAIN:
        return None
    parts = [part for part in normalized.split("/") if part]
    if len(parts) != 2:
        return None
    return "/" + parts[0], "/" + parts[1]


def zoneaware_adherence(
    ensemble: Sequence[str],
    write_quorum: int,
    racks: Mapping[str, str | None],
    min_zones_per_write_quorum: int = DEFAULT_MIN_ZONES_PER_WRITE_QUORUM,
    desired_zones_per_write_quorum: int = DEFAULT_DESIRED_ZONES_PER_WRITE_QUORUM,
) -> PlacementVerdict:
    """BookKeeper's zone-aware check, exactly; locations are ``/zone/upgradedomain``.

    Ensemble-level FAIL (empty, ``E % WQ != 0``, ``WQ <= min zones``) lists no write set and says why in
    ``reason``. Per window: an unresolved member, fewer than ``min_zones`` zones, or a zone with several
    members all in one upgrade domain FAILs; fewer than ``min(WQ, desired_zones)`` zones is MEETS_SOFT.

    Example:
        >>> zones = {"a": "/z1/u1", "b": "/z2/u1", "c": "/z3/u1"}
        >>> zoneaware_adherence(["a", "b", "c"], 3, zones).adherence.name
        'MEETS_STRICT'
        >>> zoneaware_adherence(["a", "b", "c"], 2, zones).reason
        'ensemble size 3 is not a multiple of write quorum 2'
    """
    early = _check_common(ensemble, write_quorum)
    if early is not None:
        return early
    if len(ensemble) % write_quorum != 0:
        reason = f"ensemble size {len(ensemble)} is not a multiple of write quorum {write_quorum}"
        return PlacementVerdict(PlacementAdherence.FAIL, reason=reason)
    if write_quorum <= min_zones_per_write_quorum:
        reason = f"write quorum {write_quorum} is not above min zones per write quorum "
        reason += str(min_zones_per_write_quorum)
        return PlacementVerdict(PlacementAdherence.FAIL, reason=reason)
    desired = min(write_quorum, desired_zones_per_write_quorum)
    location = {bookie: zone_and_upgrade_domain(racks.get(bookie)) for bookie in ensemble}

    def judge(window: WriteSet) -> tuple[PlacementAdherence, str | None]:
        members_per_zone: Counter[str] = Counter()
        domains_per_zone: dict[str, set[str]] = {}
        for bookie in window:
            zone_and_domain = location[bookie]
            if zone_and_domain is None:
                return PlacementAdherence.FAIL, f"bookie {bookie} has no resolvable /zone/upgradedomain"
            zone, domain = zone_and_domain
            members_per_zone[zone] += 1
            domains_per_zone.setdefault(zone, set()).add(domain)
        if len(members_per_zone) < min_zones_per_write_quorum:
            return PlacementAdherence.FAIL, (
                f"spans {len(members_per_zone)} zone(s), needs {min_zones_per_write_quorum}"
            )
        for zone, members in members_per_zone.items():
            if members > 1 and len(domains_per_zone[zone]) < 2:
                return PlacementAdherence.FAIL, f"{members} bookies of zone {zone} share one upgrade domain"
        if len(members_per_zone) < desired:
            return PlacementAdherence.MEETS_SOFT, None
        return PlacementAdherence.MEETS_STRICT, None

    return _evaluate_windows(ensemble, write_quorum, judge)


def region_and_rack(location: str | None) -> tuple[str, str] | None:
    """``(region, rack)`` of a region-aware location, or ``None`` for the unknown region.

    ``/region/rack`` → ``(region, rack)``; ``/region`` → ``(region, default-rack)`` (BookKeeper also reads
    the first level as the region); deeper paths keep the rest as the rack. Unknown region: not mapped,
    ``/default-region/default-rack`` or ``/default-rack``.

    Example:
        >>> region_and_rack("/eu/r1"), region_and_rack("/eu"), region_and_rack(None)
        (('eu', 'r1'), ('eu', 'default-rack'), None)
    """
    normalized = normalize_location(location)
    if normalized is None or normalized in (DEFAULT_REGION_AND_RACK, DEFAULT_RACK):
        return None
    parts = [part for part in normalized.split("/") if part]
    return parts[0], "/".join(parts[1:]) or "default-rack"


def regionaware_adherence(
    ensemble: Sequence[str],
    write_quorum: int,
    racks: Mapping[str, str | None],
    min_regions_for_durability: int = DEFAULT_MIN_REGIONS_FOR_DURABILITY,
) -> PlacementVerdict:
    """This project's region-aware rule (BookKeeper's always says MEETS_STRICT); see docs/placement.md.

    ``required = min(WQ, min_regions_for_durability, regions in the rack map)``, where the rack map's regions
    are those of *all* mapped bookies (in the ensemble or not) and the unknown region never counts — neither
    there nor in a window. A window FAILs when its members span fewer than ``required`` known regions; it is
    MEETS_SOFT when two members share a rack of a region that has other racks in the map.

    Example:
        >>> regions = {"a": "/eu/r1", "b": "/us/r1", "c": "/eu/r2", "d": "/eu/r1"}
        >>> regionaware_adherence(["a", "b"], 2, regions).adherence.name
        'MEETS_STRICT'
        >>> regionaware_adherence(["a", "c"], 2, regions).failing_write_sets
        (('a', 'c'),)
        >>> regionaware_adherence(["a", "d", "b"], 3, regions).adherence.name
        'MEETS_SOFT'
        >>> regionaware_adherence(["a", "b"], 3, regions).adherence.name  # windows (a, b, a), (b, a, b)
        'MEETS_STRICT'
    """
    early = _check_common(ensemble, write_quorum)
    if early is not None:
        return early
    racks_per_region: dict[str, set[str]] = {}
    for mapped_location in racks.values():
        region_rack = region_and_rack(mapped_location)
        if region_rack is not None:
            racks_per_region.setdefault(region_rack[0], set()).add(region_rack[1])
    required = min(write_quorum, min_regions_for_durability, len(racks_per_region))
    location = {bookie: region_and_rack(racks.get(bookie)) for bookie in ensemble}

    def judge(window: WriteSet) -> tuple[PlacementAdherence, str | None]:
        # dict.fromkeys: a bookie repeated by the wrap (E < WQ) is one member, not two sharing a rack.
        distinct = dict.fromkeys(window)
        known = [region_rack for bookie in distinct if (region_rack := location[bookie]) is not None]
        regions = {region for region, _ in known}
        if len(regions) < required:
            return PlacementAdherence.FAIL, f"spans {len(regions)} known region(s), needs {required}"
        members_per_rack = Counter(known)
        for (region, _), members in members_per_rack.items():
            if members > 1 and len(racks_per_region.get(region, ())) > 1:
                return PlacementAdherence.MEETS_SOFT, None
        return PlacementAdherence.MEETS_STRICT, None

    return _evaluate_windows(ensemble, write_quorum, judge)


def check_placement(
    policy: str,
    ensemble: Sequence[str],
    write_quorum: int,
    ack_quorum: int,
    racks: Mapping[str, str | None] | None = None,
    *,
    min_racks_per_write_quorum: int = DEFAULT_MIN_RACKS_PER_WRITE_QUORUM,
    enforce_min_racks_per_write_quorum: bool = DEFAULT_ENFORCE_MIN_RACKS_PER_WRITE_QUORUM,
    min_zones_per_write_quorum: int = DEFAULT_MIN_ZONES_PER_WRITE_QUORUM,
    desired_zones_per_write_quorum: int = DEFAULT_DESIRED_ZONES_PER_WRITE_QUORUM,
    min_regions_for_durability: int = DEFAULT_MIN_REGIONS_FOR_DURABILITY,
) -> PlacementVerdict:
    """Dispatch on ``policy`` with the CLI's parameter names; defaults are BookKeeper's.

    ``ack_quorum`` is accepted for symmetry with BookKeeper's API; none of the three checks uses it.
    An unknown policy raises ``ValueError``.

    Example:
        >>> check_placement("zoneaware", ["a", "b", "c"], 3, 2, {}).reason
        'write set [a, b, c]: bookie a has no resolvable /zone/upgradedomain'
    """
    rack_map: Mapping[str, str | None] = racks or {}
    if policy == "rackaware":
        return rackaware_adherence(
            ensemble, write_quorum, rack_map, min_racks_per_write_quorum, enforce_min_racks_per_write_quorum
        )
    if policy == "zoneaware":
        return zoneaware_adherence(
            ensemble, write_quorum, rack_map, min_zones_per_write_quorum, desired_zones_per_write_quorum
        )
    if policy == "regionaware":
        return regionaware_adherence(ensemble, write_quorum, rack_map, min_regions_for_durability)
    raise ValueError(f"unknown placement policy {policy!r} (expected one of {', '.join(POLICIES)})")
