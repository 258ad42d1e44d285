"""BookKeeper's ``AvailabilityOfEntriesOfLedger``: the entry ids a bookie holds for one ledger.

Pure code (no I/O). A bookie answers ``GET_LIST_OF_ENTRIES_OF_LEDGER`` with these bytes
(BookKeeper's AvailabilityOfEntriesOfLedger), all integers big-endian::

    offset 0   int32 header version (0; versions above 0 are rejected, negative ones accepted like BookKeeper)
    offset 4   int32 number of sequence groups n
    offset 8   56 zero bytes (ignored when decoding, as BookKeeper does)
    64 + 24k   int64 firstSequenceStart, int64 lastSequenceStart, int32 sequenceSize, int32 sequencePeriod

A group stands for runs of ``sequenceSize`` consecutive ids starting at ``first``, ``first + period``, …,
``last`` (``period == 0``: one run). A real bookie writes one group per maximal run,
``(start, start, len, 0)``; the decoder also understands ``period != 0`` (BP-34's ``(1, 10, 2, 3)`` is
1, 2, 4, 5, 7, 8, 10, 11).

Sets can be astronomically large (one 88-byte group can stand for 2^31 ids), so nothing here expands a group
unless asked: membership, counting, gap finding and :func:`missing_entries` all work on runs, and entry lists
are produced lazily (:meth:`EntryAvailability.iter_entries`) or with an explicit cap.

:func:`missing_entries` has correct set semantics, unlike BookKeeper's ``getUnavailableEntries``, which stops
looking after a gap of two or more ids and reports every later expected id as missing.

Example:
    >>> data = encode_availability([1, 2, 3, 5, 6, 7, 8])
    >>> len(data), data[:8].hex()
    (112, '0000000000000002')
    >>> available = decode_availability(data)
    >>> [group.as_list() for group in available.groups]
    [[1, 1, 3, 0], [5, 5, 4, 0]]
    >>> 4 in available, 5 in available, available.count
    (False, True, 7)
    >>> missing_entries(decode_availability(encode_availability([1, 2, 6])), 0, 7, [4, 6])
    [4]
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from itertools import islice, pairwise

from core.errors import FormatError

HEADER_SIZE = 64
"""Bytes before the first group (BookKeeper's ``HEADER_SIZE``)."""

GROUP_SIZE = 24
"""Bytes per sequence group: two int64 and two int32."""

CURRENT_HEADER_VERSION = 0
"""The only header version BookKeeper has defined (``V0``)."""

MAX_ENTRY_ID = 2**63 - 1
"""Largest id an int64 field can carry."""

MAX_SEQUENCE_SIZE = 2**31 - 1
"""Largest run one group can describe (``sequenceSize`` is an int32); longer runs are split."""

DEFAULT_ENTRY_LIMIT = 1_000_000
"""Default cap when an entry list is materialised (see :meth:`EntryAvailability.entry_list`)."""

_HEADER = struct.Struct(">ii")
_GROUP = struct.Struct(">qqii")

Run = tuple[int, int]
"""An inclusive range of consecutive entry ids ``(first, last)``."""


@dataclass(frozen=True)
class SequenceGroup:
    """One sequence group: ``size`` consecutive ids at ``first``, ``first + period``, …, ``last``.

    Construct through :class:`EntryAvailability` (which validates); a lone group is not checked.

    Example:
        >>> group = SequenceGroup(1, 10, 2, 3)
        >>> group.entry_count, 5 in group, 6 in group, list(group.runs())
        (8, True, False, [(1, 2), (4, 5), (7, 8), (10, 11)])
    """

    first_sequence_start: int
    last_sequence_start: int
    sequence_size: int
    sequence_period: int

    @property
    def sequence_count(self) -> int:
        """How many runs the group stands for.

        Example:
            >>> SequenceGroup(5, 5, 4, 0).sequence_count
            1
        """
        if self.sequence_period == 0:
            return 1
        return (self.last_sequence_start - self.first_sequence_start) // self.sequence_period + 1

    @property
    def entry_count(self) -> int:
        """How many ids the group stands for (BookKeeper's formula).

        Example:
            >>> SequenceGroup(0, 0, 3, 0).entry_count
            3
        """
        return self.sequence_count * self.sequence_size

    @property
    def last_entry_id(self) -> int:
        """The highest id in the group.

        Example:
            >>> SequenceGroup(1, 10, 2, 3).last_entry_id
            11
        """
        return self.last_sequence_start + self.sequence_size - 1

    def __contains__(self, entry_id: object) -> bool:
        """Membership without expanding the group.

        Example:
            >>> 3 in SequenceGroup(1, 10, 2, 3)
            False
        """
        if not isinstance(entry_id, int) or not self.first_sequence_start <= entry_id <= self.last_entry_id:
            return False
        offset = entry_id - self.first_sequence_start
        if self.sequence_period == 0:
            return offset < self.sequence_size
        return offset % self.sequence_period < self.sequence_size

    def runs(self, low: int | None = None, high: int | None = None) -> Iterator[Run]:
        """The group's runs, clipped to ``[low, high]``, ascending; jumps straight to the first relevant run.

        Example:
            >>> list(SequenceGroup(1, 10, 2, 3).runs(5, 8))
            [(5, 5), (7, 8)]
        """
        low = self.first_sequence_start if low is None else max(low, self.first_sequence_start)
        high = self.last_entry_id if high is None else min(high, self.last_entry_id)
        if low > high:
            return
        size, period = self.sequence_size, self.sequence_period
        if period == 0:
            yield (low, high)
            return
        # First sequence whose end (start + size - 1) reaches `low`: ceil((low - first - size + 1) / period).
        index = max(0, -(-(low - self.first_sequence_start - size + 1) // period))
        start = self.first_sequence_start + index * period
        while start <= high:
            yield (max(start, low), min(start + size - 1, high))
            start += period

    def as_list(self) -> list[int]:
        """``[first, last, size, period]``, the CLI's JSON shape.

        Example:
            >>> SequenceGroup(1, 1, 3, 0).as_list()
            [1, 1, 3, 0]
        """
        return [self.first_sequence_start, self.last_sequence_start, self.sequence_size, self.sequence_period]


def _check_group(group: SequenceGroup, index: int) -> None:
    """Reject a group BookKeeper's decoder would misread (or crash on); messages name the group."""
    first, last = group.first_sequence_start, group.last_sequence_start
    size, period = group.sequence_size, group.sequence_period
    where = f"availability: group {index} ({first}, {last}, {size}, {period})"
    if first < 0:
        raise FormatError(f"{where}: negative entry id")
    if not 1 <= size <= MAX_SEQUENCE_SIZE:
        raise FormatError(f"{where}: sequence size must be in [1, {MAX_SEQUENCE_SIZE}]")
    if period < 0:
        raise FormatError(f"{where}: negative sequence period")
    if period == 0 and last != first:
        # BookKeeper divides by the period here and would throw ArithmeticException.
        raise FormatError(f"{where}: period 0 requires last sequence start == first sequence start")
    if last < first:
        raise FormatError(f"{where}: last sequence start is before the first")
    if period > 0:
        if (last - first) % period != 0:
            raise FormatError(
                f"{where}: last sequence start is not a whole number of periods after the first"
            )
        if size > period:
            raise FormatError(f"{where}: sequences overlap (size larger than period)")
    if last > MAX_ENTRY_ID - (size - 1):
        raise FormatError(f"{where}: entry ids overflow int64")


def _merge_adjacent(runs: Iterable[Run]) -> Iterator[Run]:
    """Coalesce ascending, non-overlapping runs that touch, so callers see maximal runs."""
    pending: Run | None = None
    for first, last in runs:
        if pending is not None and first == pending[1] + 1:
            pending = (pending[0], last)
            continue
        if pending is not None:
            yield pending
        pending = (first, last)
    if pending is not None:
        yield pending


def _split_long_run(first: int, last: int) -> Iterator[SequenceGroup]:
    """One group per run, as a real bookie writes; runs longer than an int32 become several groups."""
    while first <= last:
        size = min(last - first + 1, MAX_SEQUENCE_SIZE)
        yield SequenceGroup(first, first, size, 0)
        first += size


def _checked_entry_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"entry ids must be integers, got {value!r}")
    if not 0 <= value <= MAX_ENTRY_ID:
        raise ValueError(f"entry id {value} is outside [0, 2^63-1]")
    return value


@dataclass(frozen=True)
class EntryAvailability:
    """A decoded (or built) set of entry ids, kept as validated, ascending, disjoint sequence groups.

    Build with :meth:`from_entry_ids`, :meth:`from_runs`, :meth:`from_groups` or :func:`decode_availability`.

    Example:
        >>> available = EntryAvailability.from_runs([(0, 9), (20, 2**40)])
        >>> available.count, 15 in available, 2**40 in available
        (1099511627767, False, True)
        >>> list(available.gaps(5, 25))
        [(10, 19)]
    """

    groups: tuple[SequenceGroup, ...]
    header_version: int = CURRENT_HEADER_VERSION
    _group_starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for index, group in enumerate(self.groups):
            _check_group(group, index)
        # BookKeeper keys groups by firstSequenceStart in a TreeMap, so byte order does not matter: sort.
        ordered = tuple(sorted(self.groups, key=lambda group: group.first_sequence_start))
        for previous, current in pairwise(ordered):
            if current.first_sequence_start <= previous.last_entry_id:
                # Overlapping spans would make BookKeeper's floorEntry lookup give wrong answers.
                raise FormatError(
                    f"availability: group ({', '.join(map(str, current.as_list()))}) overlaps group "
                    f"({', '.join(map(str, previous.as_list()))})"
                )
        object.__setattr__(self, "groups", ordered)
        object.__setattr__(self, "_group_starts", tuple(group.first_sequence_start for group in ordered))

    @classmethod
    def from_groups(cls, groups: Iterable[SequenceGroup], header_version: int = 0) -> EntryAvailability:
        """Validate and sort ``groups``; bad groups raise :class:`FormatError`.

        Example:
            >>> EntryAvailability.from_groups([SequenceGroup(1, 10, 2, 3)]).count
            8
        """
        return cls(tuple(groups), header_version)

    @classmethod
    def from_runs(cls, runs: Iterable[Run]) -> EntryAvailability:
        """The union of inclusive runs (any order, overlaps allowed), one group per maximal run.

        Example:
            >>> [g.as_list() for g in EntryAvailability.from_runs([(5, 8), (1, 3), (2, 4)]).groups]
            [[1, 1, 8, 0]]
        """
        merged: list[Run] = []
        for first, last in sorted((_checked_entry_id(a), _checked_entry_id(b)) for a, b in runs):
            if first > last:
                raise ValueError(f"bad run ({first}, {last})")
            if merged and first <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], last))
            else:
                merged.append((first, last))
        return cls(tuple(group for first, last in merged for group in _split_long_run(first, last)))

    @classmethod
    def from_entry_ids(cls, entry_ids: Iterable[int]) -> EntryAvailability:
        """The *set* of ``entry_ids`` (any order, duplicates count once), grouped as a real bookie does.

        Example:
            >>> [g.as_list() for g in EntryAvailability.from_entry_ids([8, 1, 2, 2, 3, 5, 6, 7]).groups]
            [[1, 1, 3, 0], [5, 5, 4, 0]]
        """
        ids = sorted({_checked_entry_id(entry_id) for entry_id in entry_ids})
        runs: list[Run] = []
        for entry_id in ids:
            if runs and entry_id == runs[-1][1] + 1:
                runs[-1] = (runs[-1][0], entry_id)
            else:
                runs.append((entry_id, entry_id))
        return cls(tuple(group for first, last in runs for group in _split_long_run(first, last)))

    @classmethod
    def empty(cls) -> EntryAvailability:
        """The empty set (what an ENOLEDGER answer means).

        Example:
            >>> EntryAvailability.empty().to_bytes() == bytes(64)
            True
        """
        return cls(())

    @cached_property
    def count(self) -> int:
        """Number of ids in the set (never expands a group).

        Example:
            >>> EntryAvailability.from_entry_ids([0, 1, 2]).count
            3
        """
        return sum(group.entry_count for group in self.groups)

    def __contains__(self, entry_id: object) -> bool:
        """Membership in O(log groups).

        Example:
            >>> 2 in EntryAvailability.from_entry_ids([0, 1, 2]), 3 in EntryAvailability.from_entry_ids([0])
            (True, False)
        """
        if not isinstance(entry_id, int):
            return False
        index = bisect.bisect_right(self._group_starts, entry_id) - 1
        return index >= 0 and entry_id in self.groups[index]

    @cached_property
    def _plain_runs(self) -> tuple[list[int], list[int]] | None:
        """Starts and ends of the maximal runs when no group is periodic (what real bookies send), else None.

        Two flat lists let :meth:`runs` and :meth:`gaps` slice by binary search instead of walking groups one
        by one, which matters for answers with hundreds of thousands of groups (E > WQ stripes).
        """
        if any(group.sequence_period != 0 for group in self.groups):
            return None
        starts: list[int] = []
        ends: list[int] = []
        for group in self.groups:
            if ends and group.first_sequence_start == ends[-1] + 1:
                ends[-1] = group.last_entry_id
            else:
                starts.append(group.first_sequence_start)
                ends.append(group.last_entry_id)
        return starts, ends

    def runs(self, low: int | None = None, high: int | None = None) -> Iterator[Run]:
        """Maximal runs of held ids, clipped to ``[low, high]``, ascending.

        Example:
            >>> list(EntryAvailability.from_entry_ids([1, 2, 3, 5, 6, 7, 8]).runs(2, 6))
            [(2, 3), (5, 6)]
        """
        if low is not None and high is not None and low > high:
            return iter(())
        plain = self._plain_runs
        if plain is not None:
            starts, ends = plain
            first_index = 0 if low is None else bisect.bisect_left(ends, low)
            stop_index = len(starts) if high is None else bisect.bisect_right(starts, high)
            if first_index >= stop_index:
                return iter(())
            selected = list(zip(starts[first_index:stop_index], ends[first_index:stop_index], strict=True))
            if low is not None and selected[0][0] < low:
                selected[0] = (low, selected[0][1])
            if high is not None and selected[-1][1] > high:
                selected[-1] = (selected[-1][0], high)
            return iter(selected)
        start_index = 0
        if low is not None:
            # The group that may contain `low` is the last one starting at or before it.
            start_index = max(0, bisect.bisect_right(self._group_starts, low) - 1)

        def clipped() -> Iterator[Run]:
            for group in self.groups[start_index:]:
                if high is not None and group.first_sequence_start > high:
                    return
                yield from group.runs(low, high)

        return _merge_adjacent(clipped())

    def gaps(self, low: int, high: int) -> Iterator[Run]:
        """Maximal runs of ids in ``[low, high]`` that are *not* held, ascending.

        Example:
            >>> list(EntryAvailability.from_entry_ids([1, 2, 6]).gaps(0, 7))
            [(0, 0), (3, 5), (7, 7)]
        """
        if low > high:
            return iter(())
        if self._plain_runs is None:
            return self._lazy_gaps(low, high)  # periodic groups may stand for astronomically many runs
        held = list(self.runs(low, high))
        if not held:
            return iter([(low, high)])
        # Between consecutive held runs (maximal, so never touching) lies exactly one gap.
        between = zip([end + 1 for _, end in held[:-1]], [start - 1 for start, _ in held[1:]], strict=True)
        gaps = list(between)
        if held[0][0] > low:
            gaps.insert(0, (low, held[0][0] - 1))
        if held[-1][1] < high:
            gaps.append((held[-1][1] + 1, high))
        return iter(gaps)

    def _lazy_gaps(self, low: int, high: int) -> Iterator[Run]:
        next_unchecked = low
        for first, last in self.runs(low, high):
            if first > next_unchecked:
                yield (next_unchecked, first - 1)
            next_unchecked = last + 1
        if next_unchecked <= high:
            yield (next_unchecked, high)

    def iter_entries(self) -> Iterator[int]:
        """Every held id, ascending, generated lazily.

        Example:
            >>> list(EntryAvailability.from_groups([SequenceGroup(1, 10, 2, 3)]).iter_entries())
            [1, 2, 4, 5, 7, 8, 10, 11]
        """
        for first, last in self.runs():
            yield from range(first, last + 1)

    def entry_list(self, limit: int = DEFAULT_ENTRY_LIMIT) -> list[int]:
        """The first ``limit`` held ids, ascending (the whole set when ``count <= limit``).

        Example:
            >>> EntryAvailability.from_runs([(0, 2**40)]).entry_list(limit=3)
            [0, 1, 2]
        """
        return list(islice(self.iter_entries(), limit))

    def to_bytes(self) -> bytes:
        """The wire bytes: 64-byte header, then one 24-byte record per group, big-endian.

        Example:
            >>> EntryAvailability.from_entry_ids([0, 1, 2]).to_bytes()[64:].hex()
            '000000000000000000000000000000000000000300000000'
        """
        parts = [_HEADER.pack(self.header_version, len(self.groups)), bytes(HEADER_SIZE - _HEADER.size)]
        parts.extend(_GROUP.pack(*group.as_list()) for group in self.groups)
        return b"".join(parts)

    def missing(self, start: int, last: int, expected: Iterable[int]) -> list[int]:
        """Expected ids in ``[start, last]`` that are not held; see :func:`missing_entries`.

        Example:
            >>> EntryAvailability.from_entry_ids([1, 2, 6]).missing(0, 7, [4, 6])
            [4]
        """
        return missing_entries(self, start, last, expected)


def encode_availability(entry_ids: Iterable[int]) -> bytes:
    """The bytes a real bookie sends for the *set* ``entry_ids`` (sorted, deduplicated, one group per run).

    Example:
        >>> encode_availability([]) == bytes(64)
        True
        >>> len(encode_availability([2, 0, 1, 1]))
        88
    """
    return EntryAvailability.from_entry_ids(entry_ids).to_bytes()


def decode_availability(data: bytes | bytearray | memoryview) -> EntryAvailability:
    """Parse bookie bytes; anything malformed or hostile raises :class:`FormatError` with a one-line reason.

    Example:
        >>> decode_availability(bytes(64)).count
        0
        >>> decode_availability(b"\\x00" * 10)
        Traceback (most recent call last):
        ...
        core.errors.FormatError: availability: truncated header: 10 bytes, need 64
    """
    data = bytes(data)
    if len(data) < HEADER_SIZE:
        raise FormatError(f"availability: truncated header: {len(data)} bytes, need {HEADER_SIZE}")
    header_version, group_count = _HEADER.unpack_from(data, 0)
    if header_version > CURRENT_HEADER_VERSION:
        raise FormatError(
            f"availability: unsupported header version {header_version} "
            f"(only {CURRENT_HEADER_VERSION} is known)"
        )
    if group_count < 0:
        raise FormatError(f"availability: negative group count {group_count}")
    # Checked before anything is allocated, so an absurd count costs nothing.
    expected_length = HEADER_SIZE + GROUP_SIZE * group_count
    if len(data) != expected_length:
        problem = "truncated" if len(data) < expected_length else "trailing bytes"
        raise FormatError(
            f"availability: {problem}: header declares {group_count} groups ({expected_length} bytes), "
            f"got {len(data)} bytes"
        )
    groups = tuple(SequenceGroup(*fields) for fields in _GROUP.iter_unpack(data[HEADER_SIZE:]))
    return EntryAvailability(groups, header_version)


def missing_entries(
    available: EntryAvailability | Iterable[int], start: int, last: int, expected: Iterable[int]
) -> list[int]:
    """The ids of ``expected`` that lie in ``[start, last]`` and are not available, ascending, each once.

    Correct set semantics (BookKeeper's ``getUnavailableEntries`` gives up after a gap of two or more ids and
    reports everything after it). Expected ids outside ``[start, last]`` are ignored; an empty range
    (``start > last``) gives ``[]``. Cost: sorting the in-range expected ids plus one binary search each;
    available ranges are never expanded.

    Example:
        >>> missing_entries([1, 2, 6], 0, 7, [4, 6])
        [4]
        >>> missing_entries([0, 4, 5, 9, 10, 14, 15], 0, 15, [0, 4, 5, 9, 10, 14, 15])
        []
    """
    if not isinstance(available, EntryAvailability):
        available = EntryAvailability.from_entry_ids(available)
    checked = (_checked_entry_id(entry_id) for entry_id in expected)
    wanted = sorted({entry_id for entry_id in checked if start <= entry_id <= last})
    # One O(log groups) membership test per expected id: never walks (or expands) the runs in between,
    # which for a periodic group can be astronomically many.
    return [entry_id for entry_id in wanted if entry_id not in available]
