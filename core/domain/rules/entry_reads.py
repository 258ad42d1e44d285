"""The replicas check by reading entries, for bookies that cannot list them (BookKeeper's LedgerChecker).

DbLedgerStorage bookies (Pulsar's default) never answer ``GET_LIST_OF_ENTRIES_OF_LEDGER``, but they answer
``READ_ENTRY``. BookKeeper's own checker reads, for every *fragment* (the entries of one segment striped to
one ensemble position), the fragment's first and last entry from the bookie at that position, plus a
sample of the others (``auditorLedgerVerificationPercentage``). This module decides which entries to read
(:func:`entries_to_read`) and turns what the bookies answered into the per-bookie answers of
:func:`~core.domain.rules.replicas.classify_replicas` (:func:`answers_from_reads`), so both ways of
asking end in the same rule:

- a bookie that answered ``ENOENTRY`` for an entry misses it; every entry it was not asked about, or that
  got no answer, counts as held (unknown is not missing: BookKeeper's optimistic rule for silent bookies);
- ``EIO`` to a read means the bookie lists the entry but cannot read it (a lost or truncated entry log on a
  DbLedgerStorage bookie answers so): it counts as missing, as in BookKeeper's LedgerChecker, where any
  failed read makes the fragment bad;
- ``ENOLEDGER`` means the bookie holds nothing of the ledger;
- a bookie none of whose reads was answered is ``UNAVAILABLE``.

Reading every striped entry gives the verdict of the entry lists exactly; a sample gives a verdict that is
never worse than the truth, and a lost first or last entry of a fragment is always seen.

Pure: no I/O.

Example:
    >>> reads = entries_to_read([(0, ("b0", "b1", "b2"))], ensemble_size=3, write_quorum=2, last_entry_id=9)
    >>> reads["b0"]  # b0 holds 0, 2, 3, 5, 6, 8, 9: its fragment's first and last
    [0, 9]
    >>> answers = answers_from_reads({"b0": {0: ReadAnswer.PRESENT, 8: ReadAnswer.NO_ENTRY}}, 9)
    >>> 8 in answers["b0"], 7 in answers["b0"]
    (False, True)
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from enum import Enum

from core.domain.availability import EntryAvailability
from core.domain.rules.replicas import BookieStatus, LedgerSegment, segment_ranges
from core.domain.striping import has_entry


class ReadAnswer(Enum):
    """What a bookie answered to one ``READ_ENTRY`` (without fencing).

    Example:
        >>> ReadAnswer("NO_ENTRY") is ReadAnswer.NO_ENTRY
        True
    """

    PRESENT = "PRESENT"  # EOK
    NO_ENTRY = "NO_ENTRY"  # ENOENTRY: the bookie has the ledger but not this entry
    NO_LEDGER = "NO_LEDGER"  # ENOLEDGER: the bookie has nothing of the ledger
    UNREADABLE = "UNREADABLE"  # EIO: the bookie answered but cannot read the entry (counts as missing)
    UNKNOWN = "UNKNOWN"  # no usable answer (timeout, refused, another status)


def _first_striped(index: int, first: int, end: int, ensemble_size: int, write_quorum: int) -> int | None:
    """The lowest entry in ``[first, end]`` striped to position ``index`` (within one period of E ids)."""
    for entry_id in range(first, min(end, first + ensemble_size - 1) + 1):
        if has_entry(entry_id, index, ensemble_size, write_quorum):
            return entry_id
    return None


def _last_striped(index: int, first: int, end: int, ensemble_size: int, write_quorum: int) -> int | None:
    for entry_id in range(end, max(first, end - ensemble_size + 1) - 1, -1):
        if has_entry(entry_id, index, ensemble_size, write_quorum):
            return entry_id
    return None


def _sample(
    index: int,
    first: int,
    end: int,
    ensemble_size: int,
    write_quorum: int,
    percent: float,
    rng: random.Random,
) -> set[int]:
    """About ``percent`` % of the fragment's entries, drawn at random (each draw moves up to the next
    entry striped to ``index``)."""
    striped = (end - first + 1) * write_quorum / ensemble_size
    wanted = min(math.ceil(striped * percent / 100.0), end - first + 1)
    chosen: set[int] = set()
    for _ in range(wanted):
        start = rng.randint(first, end)
        entry_id = _first_striped(index, start, end, ensemble_size, write_quorum)
        if entry_id is None:
            entry_id = _last_striped(index, first, start, ensemble_size, write_quorum)
        if entry_id is not None:
            chosen.add(entry_id)
    return chosen


def entries_to_read(
    segments: Sequence[LedgerSegment | tuple[int, Sequence[str]]],
    *,
    ensemble_size: int,
    write_quorum: int,
    last_entry_id: int,
    sample_percent: float = 0.0,
    seed: int = 0,
) -> dict[str, list[int]]:
    """Per bookie, the entries to read: each fragment's first and last entry on the bookie holding the
    fragment, plus ``sample_percent`` % of the fragment's entries (deterministic in ``seed``, e.g. the
    ledger id, so a re-probe reads the same ones). Nothing for a ledger without entries.

    Example:
        >>> entries_to_read([(0, ("a", "b")), (4, ("a", "c"))], ensemble_size=2, write_quorum=1,
        ...                 last_entry_id=7)
        {'a': [0, 2, 4, 6], 'b': [1, 3], 'c': [5, 7]}
    """
    if not 0.0 <= sample_percent <= 100.0:
        raise ValueError(f"sample percent must be in [0, 100], got {sample_percent}")
    shaped = [s if isinstance(s, LedgerSegment) else LedgerSegment(s[0], tuple(s[1])) for s in segments]
    rng = random.Random(seed)
    wanted: dict[str, set[int]] = {}
    for segment_index, first, end in segment_ranges(shaped, last_entry_id):
        for index, bookie in enumerate(shaped[segment_index].ensemble):
            low = _first_striped(index, first, end, ensemble_size, write_quorum)
            if low is None:
                continue  # a segment shorter than the stripe: nothing of it is on this position
            entries = wanted.setdefault(bookie, set())
            entries.add(low)
            high = _last_striped(index, first, end, ensemble_size, write_quorum)
            entries.add(low if high is None else high)
            if sample_percent > 0:
                entries |= _sample(index, first, end, ensemble_size, write_quorum, sample_percent, rng)
    return {bookie: sorted(entries) for bookie, entries in sorted(wanted.items())}


def answers_from_reads(
    reads: Mapping[str, Mapping[int, ReadAnswer]], last_entry_id: int
) -> dict[str, EntryAvailability | BookieStatus]:
    """The per-bookie answers of ``classify_replicas`` from what each bookie answered to its reads.

    Example:
        >>> answers = answers_from_reads(
        ...     {"a": {0: ReadAnswer.NO_LEDGER}, "b": {0: ReadAnswer.UNKNOWN}, "c": {}}, last_entry_id=3)
        >>> [answers[b].value for b in "abc"]
        ['NO_LEDGER', 'UNAVAILABLE', 'UNAVAILABLE']
        >>> answers_from_reads({"d": {0: ReadAnswer.UNREADABLE, 3: ReadAnswer.PRESENT}}, 3)["d"].entry_list()
        [1, 2, 3]
    """
    answers: dict[str, EntryAvailability | BookieStatus] = {}
    for bookie, answered in reads.items():
        kinds = set(answered.values())
        if ReadAnswer.NO_LEDGER in kinds:
            answers[bookie] = BookieStatus.NO_LEDGER
        elif not kinds - {ReadAnswer.UNKNOWN}:
            answers[bookie] = BookieStatus.UNAVAILABLE
        else:
            lost = (ReadAnswer.NO_ENTRY, ReadAnswer.UNREADABLE)
            missing = sorted(e for e, answer in answered.items() if answer in lost)
            # Through the highest entry read too: a segment of odd metadata may reach past the last entry.
            answers[bookie] = _all_but(missing, max(last_entry_id, max(answered)))
    return answers


def _all_but(missing: list[int], last_entry_id: int) -> EntryAvailability:
    """Every entry in ``[0, last_entry_id]`` except ``missing`` (ascending)."""
    runs: list[tuple[int, int]] = []
    start = 0
    for entry_id in missing:
        if entry_id > start:
            runs.append((start, entry_id - 1))
        start = entry_id + 1
    if start <= last_entry_id:
        runs.append((start, last_entry_id))
    return EntryAvailability.from_runs(runs) if runs else EntryAvailability.empty()
