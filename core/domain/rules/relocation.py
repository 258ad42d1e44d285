"""BP-54 relocation plans: which replicas to move so that an ensemble meets its placement policy strictly.

BookKeeper can repair placement itself (BP-54, ``repairedPlacementPolicyNotAdheringBookieEnabled``, off by
default); an operator who keeps it off, or runs a version without it, needs a plan. For one ensemble that
does not adhere, :func:`plan_relocation` proposes replacements: which ensemble position to give to which
bookie, so that every write set meets the policy strictly
(:func:`~core.domain.rules.placement.check_placement` on the planned ensemble is ``MEETS_STRICT``; each
plan is verified that way before it is returned).

- **Targets** are the bookies of ``ledger_counts`` outside the ensemble: the caller passes only those that
  can take writes now (registered writable, not lost, not unresponsive). Among candidates of the same
  location (rack, zone or region: the policy only sees locations), the one holding the fewest ledgers;
  the counts are raised as plans are made, so a batch of plans spreads its targets.
- **Members that must go** (``replace_first``: lost, or no longer registered) are moved in every plan,
  first: re-replication has to replace them anyway, and where their replacement goes decides how many
  other moves placement needs. Their positions count in the ``max_moves`` budget; a plan has no other
  form, so an ensemble with more of them than the budget has no plan.
- **The other moves** are positions of the failing (or soft) write sets, as few as possible: the search
  tries them in growing numbers (at most ``max_moves`` moves in all) and, per position, one candidate per
  distinct location, so it stays small whatever the cluster's size; when nothing within it works, the
  plan says why. Positions outside every failing write set are not tried: moving one changes only windows
  that already pass.

Pure: no I/O. :func:`moved_bytes` estimates what one move copies, from the ledger's length and the
entries the moved position stores.

Example:
    >>> racks = {"b1": "/r1", "b2": "/r1", "b3": "/r2", "b4": "/r2", "b5": "/r3"}
    >>> plan = plan_relocation("rackaware", ["b1", "b2"], 2, racks, {"b3": 4, "b4": 1, "b5": 9})
    >>> [(m.position, m.from_bookie, m.to_bookie) for m in plan.moves], plan.ensemble
    ([(0, 'b1', 'b4')], ('b4', 'b2'))
    >>> plan = plan_relocation("rackaware", ["b1", "b2"], 2, racks, {"b3": 4, "b4": 1}, replace_first=["b2"])
    >>> [(m.position, m.from_bookie, m.to_bookie) for m in plan.moves]  # b2 is lost: it moves, b1 stays
    [(1, 'b2', 'b4')]
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.domain.rules.placement import PlacementAdherence, check_placement, normalize_location
from core.domain.striping import count_entries_striped_to_bookie

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


def _movable_positions(
    ensemble: Sequence[str], failing: Sequence[Sequence[str]], forced: Collection[int]
) -> list[int]:
    """Positions (not forced) of the members of ``failing`` write sets, in ensemble order."""
    members = {bookie for write_set in failing for bookie in write_set}
    return [index for index, bookie in enumerate(ensemble) if bookie in members and index not in forced]


def _position_sets(
    forced: tuple[int, ...], optional: Sequence[int], max_moves: int
) -> Iterator[tuple[int, ...]]:
    """The sets of positions a plan may move, fewest first: every one holds all of ``forced`` (first) and
    adds positions of ``optional``, at most ``max_moves`` in all.

    Example:
        >>> list(_position_sets((2,), [0, 1], 2))
        [(2,), (2, 0), (2, 1)]
    """
    for extra in range(0, min(max_moves - len(forced), len(optional)) + 1):
        if not forced and extra == 0:
            continue
        for chosen in itertools.combinations(optional, extra):
            yield forced + chosen


def plan_relocation(
    policy: str,
    ensemble: Sequence[str],
    write_quorum: int,
    racks: Mapping[str, str | None],
    ledger_counts: MutableMapping[str, int] | Mapping[str, int],
    *,
    replace_first: Collection[str] = (),
    max_moves: int = DEFAULT_MAX_MOVES,
    **policy_options: Any,
) -> RelocationPlan:
    """The fewest replica moves that make ``ensemble`` meet ``policy`` strictly (see the module docstring).

    ``ledger_counts`` names the bookies that may receive a replica (writable now) with how many ledgers
    each holds; when it is mutable, a valid plan's targets are counted in it. The members in
    ``replace_first`` (lost or unregistered) are moved in every plan, before any other move, and count in
    ``max_moves``. ``policy_options`` are :func:`~core.domain.rules.placement.check_placement`'s
    (``min_racks_per_write_quorum``, ...). An ensemble that already meets the policy strictly gets an
    empty plan.

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
    forced = tuple(index for index, bookie in enumerate(members) if bookie in replace_first)
    if len(forced) > max_moves:
        return RelocationPlan(
            (), members, f"{len(forced)} lost or unregistered members, more than {max_moves} moves"
        )
    optional = _movable_positions(members, current.failing_write_sets or current.soft_write_sets, forced)
    candidates = _candidates_by_location(members, racks, ledger_counts)
    if not candidates:
        return RelocationPlan((), members, "no writable bookie outside the ensemble to move a replica to")
    evaluations = 0
    for chosen in _position_sets(forced, optional, max_moves):
        for targets in itertools.permutations(candidates, len(chosen)):  # distinct, lightest first
            evaluations += 1
            if evaluations > MAX_EVALUATIONS:
                return RelocationPlan((), members, f"no plan within {MAX_EVALUATIONS} placement checks")
            planned = list(members)
            for position, target in zip(chosen, targets, strict=True):
                planned[position] = target
            if verdict(planned).adherence is PlacementAdherence.MEETS_STRICT:
                return _accepted(members, chosen, targets, ledger_counts)
    most = min(max_moves, len(forced) + len(optional))
    lost = f", the {len(forced)} lost or unregistered member(s) among them," if forced else ""
    return RelocationPlan(
        (),
        members,
        f"no move of at most {most} replica(s){lost} of the failing write sets to the "
        f"{len(candidates)} location(s) with a writable bookie outside the ensemble meets the policy",
    )


def moved_bytes(
    length: int,
    last_entry_id: int,
    first_entry_ids: Sequence[int],
    segment: int,
    position: int,
    write_quorum: int,
    ensemble_size: int,
) -> int:
    """Bytes a move of ``position`` of ``segment`` copies, estimated for a closed ledger of ``length`` bytes
    and entries ``0..last_entry_id`` whose segments start at ``first_entry_ids``: ``length`` × (entries
    of the segment whose write set holds the position) / (entries of the ledger), rounded. About WQ/E of
    the segment's entries sit on each position; the count is exact
    (:func:`~core.domain.striping.count_entries_striped_to_bookie`), the bytes per entry the ledger's mean.

    Example:
        >>> # 10 entries, 1000 bytes; segment 1 holds entries 5..9 on E=3, WQ=2: position 0 stores 5, 6, 8, 9
        >>> moved_bytes(1000, 9, [0, 5], 1, 0, write_quorum=2, ensemble_size=3)
        400
    """
    entries = last_entry_id + 1
    if entries <= 0 or length <= 0:
        return 0
    first = first_entry_ids[segment]
    last = first_entry_ids[segment + 1] - 1 if segment + 1 < len(first_entry_ids) else last_entry_id
    stored = count_entries_striped_to_bookie(
        position, first, min(last, last_entry_id), ensemble_size, min(write_quorum, ensemble_size)
    )
    return (length * stored + entries // 2) // entries


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
