"""BP-54 relocation plans: which replicas to move so that an ensemble meets its placement policy strictly.

BookKeeper can repair placement itself (BP-54, ``repairedPlacementPolicyNotAdheringBookieEnabled``, off by
default); an operator who keeps it off, or runs a version without it, needs a plan. For one ensemble that
does not adhere, :func:`plan_relocation` proposes replacements: which ensemble position (always a member of
a failing write set) to give to which bookie, so that every write set meets the policy strictly
(:func:`~core.domain.rules.placement.check_placement` on the planned ensemble is ``MEETS_STRICT``; each
plan is verified that way before it is returned). Fewest moves first; among candidate bookies of the same
location (rack, zone or region: the policy only sees locations), the one holding the fewest ledgers, and
the counts are raised as plans are made, so a batch of plans spreads its targets.

Pure: no I/O. The search tries the positions of failing write sets in growing numbers (at most
``max_moves``) and, per position, one candidate per distinct location, so it stays small whatever the
cluster's size; when nothing within it works, the plan says why.

Example:
    >>> racks = {"b1": "/r1", "b2": "/r1", "b3": "/r2", "b4": "/r2", "b5": "/r3"}
    >>> plan = plan_relocation("rackaware", ["b1", "b2"], 2, racks, {"b3": 4, "b4": 1, "b5": 9})
    >>> [(m.position, m.from_bookie, m.to_bookie) for m in plan.moves], plan.ensemble
    ([(0, 'b1', 'b4')], ('b4', 'b2'))
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.domain.rules.placement import PlacementAdherence, check_placement, normalize_location

#: Plans of more moves than this are not searched (a badly placed ensemble usually needs one or two).
DEFAULT_MAX_MOVES = 3
#: Placement checks one plan may spend at most.
MAX_EVALUATIONS = 20_000


@dataclass(frozen=True)
class Move:
    """Give ensemble ``position`` (held by ``from_bookie``) to ``to_bookie``.

    Example:
        >>> Move(1, "b2", "b7").to_json()
        {'position': 1, 'from_bookie': 'b2', 'to_bookie': 'b7'}
    """

    position: int
    from_bookie: str
    to_bookie: str

    def to_json(self) -> dict[str, Any]:
        return {"position": self.position, "from_bookie": self.from_bookie, "to_bookie": self.to_bookie}


@dataclass(frozen=True)
class RelocationPlan:
    """The moves, the ensemble they give (verified ``MEETS_STRICT``), or why there is no plan.

    Example:
        >>> RelocationPlan((), ("a", "b"), "no writable bookie outside the ensemble").valid
        False
    """

    moves: tuple[Move, ...]
    ensemble: tuple[str, ...]
    reason: str | None = None  # set when no plan was found

    @property
    def valid(self) -> bool:
        return self.reason is None

    def to_json(self) -> dict[str, Any]:
        return {
            "moves": [move.to_json() for move in self.moves],
            "ensemble": list(self.ensemble),
            "reason": self.reason,
        }


def _candidates_by_location(
    ensemble: Sequence[str],
    racks: Mapping[str, str | None],
    ledger_counts: Mapping[str, int],
) -> list[str]:
    """One candidate per distinct location: the least loaded bookie there (ties by id), outside the
    ensemble; locations in order of their candidate's load."""
    best: dict[str, str] = {}
    for bookie in sorted(ledger_counts):
        if bookie in ensemble:
            continue
        key = normalize_location(racks.get(bookie)) or ""  # what every policy tells bookies apart by
        current = best.get(key)
        if current is None or ledger_counts[bookie] < ledger_counts[current]:
            best[key] = bookie
    return sorted(best.values(), key=lambda b: (ledger_counts[b], b))


def _movable_positions(ensemble: Sequence[str], failing: Sequence[Sequence[str]]) -> list[int]:
    members = {bookie for write_set in failing for bookie in write_set}
    return [index for index, bookie in enumerate(ensemble) if bookie in members]


def plan_relocation(
    policy: str,
    ensemble: Sequence[str],
    write_quorum: int,
    racks: Mapping[str, str | None],
    ledger_counts: MutableMapping[str, int] | Mapping[str, int],
    *,
    max_moves: int = DEFAULT_MAX_MOVES,
    **policy_options: Any,
) -> RelocationPlan:
    """The fewest replica moves that make ``ensemble`` meet ``policy`` strictly (see the module docstring).

    ``ledger_counts`` names the bookies that may receive a replica (writable ones) with how many ledgers
    each holds; when it is mutable, a valid plan's targets are counted in it. ``policy_options`` are
    :func:`~core.domain.rules.placement.check_placement`'s (``min_racks_per_write_quorum``, ...). An
    ensemble that already meets the policy strictly gets an empty plan.

    Example:
        >>> plan_relocation("rackaware", ["a", "b"], 2, {"a": "/r1", "b": "/r1"}, {}).reason
        'no writable bookie outside the ensemble to move a replica to'
    """
    members = tuple(ensemble)

    def verdict(candidate: Sequence[str]) -> Any:
        return check_placement(policy, candidate, write_quorum, write_quorum, racks, **policy_options)

    current = verdict(members)
    if current.adherence is PlacementAdherence.MEETS_STRICT:
        return RelocationPlan((), members)
    positions = _movable_positions(members, current.failing_write_sets or current.soft_write_sets)
    candidates = _candidates_by_location(members, racks, ledger_counts)
    if not candidates:
        return RelocationPlan((), members, "no writable bookie outside the ensemble to move a replica to")
    evaluations = 0
    for count in range(1, min(max_moves, len(positions)) + 1):
        for chosen in itertools.combinations(positions, count):
            for targets in itertools.permutations(candidates, count):  # distinct, lightest first
                evaluations += 1
                if evaluations > MAX_EVALUATIONS:
                    return RelocationPlan((), members, f"no plan within {MAX_EVALUATIONS} placement checks")
                planned = list(members)
                for position, target in zip(chosen, targets, strict=True):
                    planned[position] = target
                if verdict(planned).adherence is PlacementAdherence.MEETS_STRICT:
                    return _accepted(members, chosen, targets, ledger_counts)
    return RelocationPlan(
        (),
        members,
        f"no move of at most {min(max_moves, len(positions))} replica(s) of the failing write sets to the "
        f"{len(candidates)} location(s) with a writable bookie outside the ensemble meets the policy",
    )


def _accepted(
    members: tuple[str, ...],
    positions: Sequence[int],
    targets: Sequence[str],
    ledger_counts: MutableMapping[str, int] | Mapping[str, int],
) -> RelocationPlan:
    planned = list(members)
    moves = []
    for position, target in zip(positions, targets, strict=True):
        moves.append(Move(position, members[position], target))
        planned[position] = target
        if isinstance(ledger_counts, MutableMapping):
            ledger_counts[target] = ledger_counts.get(target, 0) + 1
    return RelocationPlan(tuple(moves), tuple(planned))
