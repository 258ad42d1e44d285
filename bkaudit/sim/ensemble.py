"""Ensemble selection for the simulated writer: rack-aware like BookKeeper's client, or deliberately bad.

Pure code (the randomness comes from the caller's ``random.Random``). Adherence is judged
with the project's one placement rule (``core.domain.rules.placement.check_placement``), so an
ensemble this module calls good is one the auditor calls good.

- :func:`choose_ensemble`: ``E`` distinct bookies, interleaved across racks so that every write set spans
  at least ``min(WQ, 2)`` racks whenever the candidates allow it (BookKeeper's rack-aware policy); when no
  arrangement can adhere (too few racks) it returns the interleaved pick anyway, as BookKeeper does without
  ``enforceMinNumRacksPerWriteQuorum``.
- :func:`choose_replacement`: the bookie an ensemble change puts in place of a failed one, preferring one
  that keeps the ensemble adhering and, among those, the failed bookie's rack.
- :func:`choose_single_rack_ensemble`: every member from one rack (the BP-54 disaster-recovery story).

Example:
    >>> import random
    >>> racks = {"a1": "/a", "a2": "/a", "b1": "/b", "b2": "/b", "c1": "/c"}
    >>> ensemble = choose_ensemble(racks, 3, 2, 2, random.Random(1))
    >>> len(set(ensemble)), is_adhering(ensemble, 2, 2, racks)
    (3, True)
    >>> sorted({racks[b] for b in choose_single_rack_ensemble(racks, 2, random.Random(1))})
    ['/a']
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from bkaudit.sim.errors import NotEnoughBookiesError
from core.domain.rules.placement import PlacementAdherence, check_placement

__all__ = [
    "NotEnoughBookiesError",
    "choose_ensemble",
    "choose_replacement",
    "choose_single_rack_ensemble",
    "is_adhering",
]

_SHUFFLE_ATTEMPTS = 64


def is_adhering(
    ensemble: Sequence[str], write_quorum: int, ack_quorum: int, racks: Mapping[str, str | None]
) -> bool:
    """True when the rack-aware rule does not FAIL the ensemble.

    Example:
        >>> is_adhering(["a", "b"], 2, 2, {"a": "/r1", "b": "/r1"})
        False
    """
    verdict = check_placement("rackaware", list(ensemble), write_quorum, ack_quorum, dict(racks))
    return verdict.adherence is not PlacementAdherence.FAIL


def _by_rack(candidates: Mapping[str, str | None], rng: random.Random) -> list[list[str]]:
    groups: dict[str, list[str]] = {}
    for bookie_id in sorted(candidates):
        groups.setdefault(candidates[bookie_id] or "", []).append(bookie_id)
    racks = sorted(groups)
    rng.shuffle(racks)
    ordered = [groups[rack] for rack in racks]
    for group in ordered:
        rng.shuffle(group)
    # Largest racks first, so the interleaving does not run out of other racks early.
    ordered.sort(key=len, reverse=True)
    return ordered


def choose_ensemble(
    candidates: Mapping[str, str | None],
    ensemble_size: int,
    write_quorum: int,
    ack_quorum: int,
    rng: random.Random,
) -> tuple[str, ...]:
    """``ensemble_size`` distinct bookies from ``candidates`` (bookie id → rack), rack-aware.

    Raises :class:`NotEnoughBookiesError` when there are too few candidates.

    Example:
        >>> import random
        >>> choose_ensemble({"a": "/r1"}, 2, 2, 2, random.Random(0))
        Traceback (most recent call last):
        ...
        bkaudit.sim.errors.NotEnoughBookiesError: need 2 bookies for the ensemble, 1 available
    """
    if len(candidates) < ensemble_size:
        raise NotEnoughBookiesError(
            f"need {ensemble_size} bookies for the ensemble, {len(candidates)} available"
        )
    groups = _by_rack(candidates, rng)
    interleaved: list[str] = []
    depth = 0
    while len(interleaved) < ensemble_size:
        for group in groups:
            if depth < len(group) and len(interleaved) < ensemble_size:
                interleaved.append(group[depth])
        depth += 1
    if is_adhering(interleaved, write_quorum, ack_quorum, candidates):
        return tuple(interleaved)
    # Rotations and re-picks can fix the wrap-around write set; give up (and keep the spread) otherwise.
    pool = sorted(candidates)
    for _ in range(_SHUFFLE_ATTEMPTS):
        attempt = rng.sample(pool, ensemble_size)
        if is_adhering(attempt, write_quorum, ack_quorum, candidates):
            return tuple(attempt)
    return tuple(interleaved)


def choose_replacement(
    ensemble: Sequence[str],
    failed_index: int,
    candidates: Mapping[str, str | None],
    write_quorum: int,
    ack_quorum: int,
    rng: random.Random,
    racks: Mapping[str, str | None] | None = None,
) -> str:
    """The bookie to put at ``failed_index`` of ``ensemble`` (candidates: eligible bookie id → rack).

    ``racks`` gives the racks of the ensemble's current members (default: ``candidates``). Members of the
    ensemble are never chosen. Raises :class:`NotEnoughBookiesError` when no candidate is left.

    Example:
        >>> import random
        >>> racks = {"a1": "/a", "b1": "/b", "a2": "/a", "b2": "/b"}
        >>> choose_replacement(["a1", "b1"], 0, {"a2": "/a", "b2": "/b"}, 2, 2, random.Random(0), racks)
        'a2'
    """
    known = dict(racks or {})
    known.update(candidates)
    failed = ensemble[failed_index]
    pool = [bookie for bookie in sorted(candidates) if bookie not in ensemble]
    if not pool:
        raise NotEnoughBookiesError(f"no bookie left to replace {failed} in the ensemble")
    rng.shuffle(pool)
    failed_rack = known.get(failed)
    pool.sort(key=lambda bookie: candidates[bookie] != failed_rack)  # same rack first, stable otherwise
    for bookie in pool:
        attempt = list(ensemble)
        attempt[failed_index] = bookie
        if is_adhering(attempt, write_quorum, ack_quorum, known):
            return bookie
    return pool[0]


def choose_single_rack_ensemble(
    candidates: Mapping[str, str | None],
    ensemble_size: int,
    rng: random.Random,
    rack: str | None = None,
) -> tuple[str, ...]:
    """``ensemble_size`` bookies all in ``rack`` (default: the rack with the most candidates).

    Example:
        >>> import random
        >>> choose_single_rack_ensemble({"a": "/r1", "b": "/r2"}, 2, random.Random(0))
        Traceback (most recent call last):
        ...
        bkaudit.sim.errors.NotEnoughBookiesError: no rack has 2 eligible bookies (largest: 1)
    """
    groups: dict[str | None, list[str]] = {}
    for bookie_id in sorted(candidates):
        groups.setdefault(candidates[bookie_id], []).append(bookie_id)
    if rack is not None:
        members = groups.get(rack, [])
        if len(members) < ensemble_size:
            raise NotEnoughBookiesError(
                f"rack {rack} has {len(members)} eligible bookies, the ensemble needs {ensemble_size}"
            )
    else:
        members = max(groups.values(), key=len, default=[])
        if len(members) < ensemble_size:
            raise NotEnoughBookiesError(
                f"no rack has {ensemble_size} eligible bookies (largest: {len(members)})"
            )
    return tuple(rng.sample(members, ensemble_size))
