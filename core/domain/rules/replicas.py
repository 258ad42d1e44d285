"""The replicas check of one ledger (BP-34 "scrutiny", classified as BookKeeper's Auditor does), on sets.

Pure code: no I/O, no Spark; shared by the CLI (``bkaudit check replicas``), the streaming
job and the simulator.

For a CLOSED ledger with ``last_entry_id >= 0``, and for an OPEN ledger up to its last add confirmed (LAC, as
its bookies answer it: the entries an ack quorum acknowledged, so they must be on their write sets; entries
above it are never judged, as in BookKeeper's LedgerChecker), every non-empty segment ``[first, end]`` and
every ensemble position ``i``: the entries striped to ``i`` (RoundRobin schedule, absolute ids) that the
bookie at ``i`` does not hold are *missing*. An entry's missing count is how many positions of its write set
miss it; ``min_replicas = WQ - max(missing count)``, and

* ``min_replicas == 0``   → NO_REPLICA
* ``min_replicas < AQ``   → LESS_THAN_AQ
* ``min_replicas < WQ``   → LESS_THAN_WQ
* otherwise               → OK

Decisions:

* One answer per distinct bookie, applied to every segment it appears in, at every position it occupies.
* ``NO_LEDGER`` (ENOLEDGER) means the bookie holds nothing. ``UNAVAILABLE`` (no answer) and a bookie with
  no answer at all count neither as holding nor as missing (BookKeeper's optimistic rule); such a bookie is
  listed in ``unknown_bookies`` if it was expected to hold at least one entry. ``unknown_bookies`` is sorted.
* Copies on bookies outside an entry's write set (over-replication) are ignored.
* ``worst_entries`` lists the entries with the minimum replica count, ascending, capped at
  :data:`WORST_ENTRIES_LIMIT`; ``worst_entry_count`` is the uncapped number. Both are empty / 0 when the
  result is OK (no entry is missing a replica) or SKIPPED.
* Cost: a sweep over the boundaries of the bookies' *gaps* (runs of ids they lack, trimmed to the ids
  striped to them) with one counter per write-set residue class. So it grows with the size of the answers
  and the number of real holes, not with the number of entries; a healthy E > WQ ledger whose bookies
  hold exactly their stripes costs next to nothing.

Example:
    >>> verdict = classify_replicas(
    ...     ensemble_size=4, write_quorum=3, ack_quorum=2, state="CLOSED", last_entry_id=3,
    ...     segments=[(0, ["b0", "b1", "b2", "b3"])],
    ...     answers={"b0": [0], "b1": [0, 1, 3], "b2": [0, 1], "b3": [1, 2, 3]})
    >>> verdict.result.value, verdict.min_replicas, verdict.worst_entries
    ('LESS_THAN_AQ', 1, (2,))
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from core.domain.availability import EntryAvailability
from core.domain.striping import entries_striped_to_bookie

WORST_ENTRIES_LIMIT = 1000
"""At most this many ids are listed in ``worst_entries`` (``worst_entry_count`` has the full number)."""

LEDGER_STATES = ("OPEN", "IN_RECOVERY", "CLOSED")
"""Ledger states as BookKeeper's metadata names them."""


class BookieStatus(Enum):
    """A bookie answer that is not a list of entries.

    Example:
        >>> BookieStatus("NO_LEDGER") is BookieStatus.NO_LEDGER
        True
    """

    NO_LEDGER = "NO_LEDGER"
    """ENOLEDGER: the bookie holds nothing of this ledger, so every entry expected on it is missing."""
    UNAVAILABLE = "UNAVAILABLE"
    """No usable answer (timeout, EIO, …): counts neither as holding nor as missing."""


BookieAnswer = EntryAvailability | BookieStatus | Iterable[int]
"""What a bookie answered: its entries (as an availability or any iterable of ids) or a status."""


class ReplicasResult(Enum):
    """Classification of one ledger (SKIPPED: in recovery, open with no known LAC, or no entries).

    Example:
        >>> ReplicasResult.LESS_THAN_WQ.value
        'LESS_THAN_WQ'
    """

    OK = "OK"
    NO_REPLICA = "NO_REPLICA"
    LESS_THAN_AQ = "LESS_THAN_AQ"
    LESS_THAN_WQ = "LESS_THAN_WQ"
    SKIPPED = "SKIPPED"


@dataclass(frozen=True)
class LedgerSegment:
    """One ensemble of a ledger: it covers entries from ``first_entry_id`` up to the next segment's first.

    Example:
        >>> LedgerSegment(0, ("b0", "b1")).ensemble
        ('b0', 'b1')
    """

    first_entry_id: int
    ensemble: tuple[str, ...]


@dataclass(frozen=True)
class ReplicasVerdict:
    """Outcome of :func:`classify_replicas`.

    Example:
        >>> ReplicasVerdict(ReplicasResult.SKIPPED, None, (), 0, ()).to_json()["result"]
        'SKIPPED'
    """

    result: ReplicasResult
    min_replicas: int | None
    worst_entries: tuple[int, ...]
    worst_entry_count: int
    unknown_bookies: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The CLI's JSON object (the ``bkaudit check replicas`` output).

        Example:
            >>> sorted(ReplicasVerdict(ReplicasResult.OK, 3, (), 0, ()).to_json())
            ['min_replicas', 'result', 'unknown_bookies', 'worst_entries', 'worst_entry_count']
        """
        return {
            "result": self.result.value,
            "min_replicas": self.min_replicas,
            "worst_entries": list(self.worst_entries),
            "worst_entry_count": self.worst_entry_count,
            "unknown_bookies": list(self.unknown_bookies),
        }


_SKIPPED = ReplicasVerdict(ReplicasResult.SKIPPED, None, (), 0, ())


def last_add_confirmed(answered: Iterable[int], last_segment_first: int) -> int | None:
    """An open ledger's LAC from what the bookies of its last segment answered; None when none answered.

    Each bookie answers its own view (the LAC its last entry carries; -1 when it holds none); the ledger's
    LAC is the highest, as BookKeeper's ``readLastAddConfirmed`` takes it. An ensemble change starts its
    segment at the writer's LAC + 1, so once any bookie answered, the LAC is at least the last segment's
    first entry - 1.

    Example:
        >>> last_add_confirmed([4, 7, -1], 0), last_add_confirmed([-1], 5), last_add_confirmed([], 5)
        (7, 4, None)
    """
    views = list(answered)
    if not views:
        return None
    return max(*views, last_segment_first - 1)


def checked_through(state: str, last_entry_id: int, lac: int | None = None) -> int:
    """The last entry a replicas check judges: a CLOSED ledger's last entry, an OPEN ledger's LAC (-1 when
    unknown), nothing (-1) of a ledger IN_RECOVERY, whose recovery fences and closes it.

    Example:
        >>> checked_through("CLOSED", 9), checked_through("OPEN", -1, 4), checked_through("OPEN", -1)
        (9, 4, -1)
        >>> checked_through("IN_RECOVERY", -1, 4)
        -1
    """
    if state == "CLOSED":
        return last_entry_id
    if state == "OPEN" and lac is not None:
        return lac
    return -1


def segment_ranges(segments: Sequence[LedgerSegment], last_entry_id: int) -> Iterator[tuple[int, int, int]]:
    """``(segment_index, first, end)`` for every non-empty segment of a closed ledger.

    Example:
        >>> list(segment_ranges([LedgerSegment(0, ("a",)), LedgerSegment(3, ("b",))], 2))
        [(0, 0, 2)]
    """
    for index, segment in enumerate(segments):
        end = segments[index + 1].first_entry_id - 1 if index + 1 < len(segments) else last_entry_id
        if segment.first_entry_id <= end:
            yield index, segment.first_entry_id, end


def _as_segment(segment: LedgerSegment | tuple[int, Sequence[str]]) -> LedgerSegment:
    if isinstance(segment, LedgerSegment):
        return segment
    first_entry_id, ensemble = segment
    return LedgerSegment(first_entry_id, tuple(ensemble))


def _as_answer(answer: BookieAnswer) -> EntryAvailability | BookieStatus:
    if isinstance(answer, EntryAvailability | BookieStatus):
        return answer
    return EntryAvailability.from_entry_ids(answer)


def _validate(
    ensemble_size: int, write_quorum: int, ack_quorum: int, state: str, segments: Sequence[LedgerSegment]
) -> None:
    if not 1 <= write_quorum <= ensemble_size:
        raise ValueError(f"write quorum {write_quorum} must be in [1, ensemble size {ensemble_size}]")
    if not 1 <= ack_quorum <= write_quorum:
        raise ValueError(f"ack quorum {ack_quorum} must be in [1, write quorum {write_quorum}]")
    if state not in LEDGER_STATES:
        raise ValueError(f"unknown ledger state {state!r} (expected one of {', '.join(LEDGER_STATES)})")
    previous_first = 0
    for index, segment in enumerate(segments):
        if len(segment.ensemble) != ensemble_size:
            raise ValueError(
                f"segment {index} has {len(segment.ensemble)} bookies, ensemble size is {ensemble_size}"
            )
        if segment.first_entry_id < previous_first:
            raise ValueError(
                f"segment {index} starts at {segment.first_entry_id}, before segment {index - 1}"
            )
        previous_first = segment.first_entry_id


def _gap_events(
    position: int,
    answer: EntryAvailability | BookieStatus,
    first: int,
    end: int,
    ensemble_size: int,
    write_quorum: int,
) -> Iterator[tuple[int, int, int]]:
    """``(entry_id, +1/-1, position)``: where the bookie at ``position`` starts and stops lacking entries.

    Each gap is trimmed to its first and last entries striped to the position: the ids outside are not in
    its write sets, so a bookie holding exactly its stripe (the common E > WQ case) produces no events.
    """
    # Only NO_LEDGER reaches here as a status: UNAVAILABLE bookies are never swept.
    gaps = [(first, end)] if isinstance(answer, BookieStatus) else answer.gaps(first, end)
    last_in_run = write_quorum - 1
    for gap_first, gap_last in gaps:
        # Entry e is striped here iff (position - e) % E < WQ; stepping e forward lowers that offset by one
        # (mod E) and stepping back raises it, which gives both trimmed ends in O(1). Inlined: hot loop.
        offset = (position - gap_first) % ensemble_size
        trimmed_first = gap_first if offset <= last_in_run else gap_first + offset - last_in_run
        offset = (position - gap_last) % ensemble_size
        trimmed_last = gap_last if offset <= last_in_run else gap_last - (ensemble_size - offset)
        if trimmed_first <= trimmed_last:
            yield (trimmed_first, 1, position)
            yield (trimmed_last + 1, -1, position)


def _count_in_residue(low: int, high: int, residue: int, modulus: int) -> int:
    """How many ids in ``[low, high]`` are ≡ ``residue`` (mod ``modulus``)."""
    return (high - residue) // modulus - (low - 1 - residue) // modulus


class _WorstTracker:
    """Keeps the highest missing count seen so far and the (capped) ascending list of entries that have it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.max_missing = 0
        self.entries: list[int] = []
        self.count = 0

    def offer(self, low: int, high: int, missing_by_residue: list[int], ensemble_size: int) -> None:
        """Entries in ``[low, high]`` have missing count ``missing_by_residue[e % E]``."""
        residues = (
            range(ensemble_size)
            if high - low + 1 >= ensemble_size
            else [(low + k) % ensemble_size for k in range(high - low + 1)]
        )
        piece_max = max(missing_by_residue[r] for r in residues)
        if piece_max == 0 or piece_max < self.max_missing:
            return
        if piece_max > self.max_missing:
            self.max_missing, self.entries, self.count = piece_max, [], 0
        worst_residues = {r for r in residues if missing_by_residue[r] == piece_max}
        self.count += sum(_count_in_residue(low, high, r, ensemble_size) for r in worst_residues)
        entry_id = low
        # Worst residues recur every E ids, so this walk takes at most E steps per listed entry.
        while len(self.entries) < self.limit and entry_id <= high:
            if entry_id % ensemble_size in worst_residues:
                self.entries.append(entry_id)
            entry_id += 1


def _sweep_segment(
    first: int,
    end: int,
    ensemble_size: int,
    write_quorum: int,
    lacking: list[tuple[int, EntryAvailability | BookieStatus]],
    tracker: _WorstTracker,
) -> None:
    """Feed ``tracker`` the missing counts of every entry of ``[first, end]``.

    ``missing_by_residue[r]`` = how many currently-lacking positions lie in the write set of entries ≡ r;
    position j is in the write set of r iff ``(j - r) % E < WQ``, i.e. r ∈ {j, j-1, …, j-WQ+1} (mod E).
    """
    missing_by_residue = [0] * ensemble_size
    events = heapq.merge(
        *(
            _gap_events(position, answer, first, end, ensemble_size, write_quorum)
            for position, answer in lacking
        )
    )
    lacking_now = 0
    piece_start = first
    for entry_id, delta, position in events:
        if entry_id > piece_start and lacking_now:
            tracker.offer(piece_start, min(entry_id - 1, end), missing_by_residue, ensemble_size)
        piece_start = max(piece_start, entry_id)
        lacking_now += delta
        for offset in range(write_quorum):
            missing_by_residue[(position - offset) % ensemble_size] += delta
    if lacking_now and piece_start <= end:
        tracker.offer(piece_start, end, missing_by_residue, ensemble_size)


def classify_replicas(
    *,
    ensemble_size: int,
    write_quorum: int,
    ack_quorum: int,
    state: str,
    last_entry_id: int,
    segments: Sequence[LedgerSegment | tuple[int, Sequence[str]]],
    answers: Mapping[str, BookieAnswer],
    worst_entries_limit: int = WORST_ENTRIES_LIMIT,
    last_add_confirmed: int | None = None,
) -> ReplicasVerdict:
    """Classify one ledger from its metadata and each bookie's answer (see the module docstring).

    An OPEN ledger is classified up to ``last_add_confirmed`` (SKIPPED when it is None or -1); what the
    bookies hold above it is ignored. A bookie of an ensemble that is absent from ``answers`` is treated as
    UNAVAILABLE. Bad parameters (quorums, state, segment shapes) raise ``ValueError``.

    Example:
        >>> classify_replicas(ensemble_size=3, write_quorum=2, ack_quorum=2, state="OPEN", last_entry_id=-1,
        ...                   segments=[(0, ["a", "b", "c"])], answers={}).result.value
        'SKIPPED'
        >>> v = classify_replicas(ensemble_size=3, write_quorum=2, ack_quorum=1, state="CLOSED",
        ...                       last_entry_id=5, segments=[(0, ["a", "b", "c"])],
        ...                       answers={"a": BookieStatus.NO_LEDGER, "b": [0, 1, 2, 3, 4, 5]})
        >>> v.result.value, v.min_replicas, v.worst_entries, v.unknown_bookies
        ('LESS_THAN_WQ', 1, (0, 2, 3, 5), ('c',))
        >>> classify_replicas(ensemble_size=2, write_quorum=2, ack_quorum=2, state="OPEN", last_entry_id=-1,
        ...                   segments=[(0, ["a", "b"])], answers={"a": [0], "b": [0]},
        ...                   last_add_confirmed=0).result.value  # entry 1 and later: above the LAC
        'OK'
    """
    ledger_segments = [_as_segment(segment) for segment in segments]
    _validate(ensemble_size, write_quorum, ack_quorum, state, ledger_segments)
    last_entry_id = checked_through(state, last_entry_id, last_add_confirmed)
    if last_entry_id < 0:
        return _SKIPPED

    resolved: dict[str, EntryAvailability | BookieStatus] = {}
    unknown: set[str] = set()
    tracker = _WorstTracker(worst_entries_limit)
    for index, first, end in segment_ranges(ledger_segments, last_entry_id):
        lacking: list[tuple[int, EntryAvailability | BookieStatus]] = []
        for position, bookie in enumerate(ledger_segments[index].ensemble):
            if (
                next(entries_striped_to_bookie(position, first, end, ensemble_size, write_quorum), None)
                is None
            ):
                continue  # nothing expected here, so BookKeeper would not even ask
            if bookie not in resolved:
                resolved[bookie] = _as_answer(answers.get(bookie, BookieStatus.UNAVAILABLE))
            answer = resolved[bookie]
            if answer is BookieStatus.UNAVAILABLE:
                unknown.add(bookie)
            else:
                lacking.append((position, answer))
        _sweep_segment(first, end, ensemble_size, write_quorum, lacking, tracker)

    min_replicas = write_quorum - tracker.max_missing
    if min_replicas == 0:
        result = ReplicasResult.NO_REPLICA
    elif min_replicas < ack_quorum:
        result = ReplicasResult.LESS_THAN_AQ
    elif min_replicas < write_quorum:
        result = ReplicasResult.LESS_THAN_WQ
    else:
        result = ReplicasResult.OK
    return ReplicasVerdict(
        result, min_replicas, tuple(tracker.entries), tracker.count, tuple(sorted(unknown))
    )
