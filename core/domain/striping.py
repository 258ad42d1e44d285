"""BookKeeper's RoundRobinDistributionSchedule: which ensemble positions hold which entries.

Entry ``e`` of a segment with ensemble size ``E`` and write quorum ``WQ`` is written to the ensemble
indexes ``(e + 0) % E, …, (e + WQ - 1) % E``, where ``e`` is the *absolute* entry id (not an offset from the
segment start). BookKeeper's ``getWriteSetBookieIndex`` truncates ids ≥ 2^31 to ``int`` before the modulo;
this module uses exact integer arithmetic throughout (the behaviour of BookKeeper's BitSet path).

Example:
    >>> write_set(1, ensemble_size=5, write_quorum=3)
    [1, 2, 3]
    >>> has_entry(4, 2, ensemble_size=3, write_quorum=2)
    True
    >>> list(entries_striped_to_bookie(2, 0, 5, ensemble_size=3, write_quorum=2))
    [1, 2, 4, 5]
"""

from __future__ import annotations

from collections.abc import Iterator


def _check_quorums(ensemble_size: int, write_quorum: int) -> None:
    if ensemble_size <= 0:
        raise ValueError(f"ensemble size must be positive, got {ensemble_size}")
    if not 0 < write_quorum <= ensemble_size:
        raise ValueError(f"write quorum must be in [1, {ensemble_size}], got {write_quorum}")


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> list[int]:
    """Ensemble indexes that store ``entry_id``, in BookKeeper's order.

    Example:
        >>> write_set(7, ensemble_size=3, write_quorum=3)
        [1, 2, 0]
    """
    _check_quorums(ensemble_size, write_quorum)
    if entry_id < 0:
        raise ValueError(f"entry id must be non-negative, got {entry_id}")
    return [(entry_id + w) % ensemble_size for w in range(write_quorum)]


def has_entry(entry_id: int, bookie_index: int, ensemble_size: int, write_quorum: int) -> bool:
    """True when the bookie at ``bookie_index`` is in the write set of ``entry_id``.

    Example:
        >>> has_entry(0, 2, ensemble_size=3, write_quorum=2)
        False
    """
    _check_quorums(ensemble_size, write_quorum)
    if not 0 <= bookie_index < ensemble_size:
        raise ValueError(f"bookie index must be in [0, {ensemble_size}), got {bookie_index}")
    # Distance from the first write-set member, walking forward around the ensemble.
    return (bookie_index - entry_id) % ensemble_size < write_quorum


def entries_striped_to_bookie(
    bookie_index: int, first_entry_id: int, last_entry_id: int, ensemble_size: int, write_quorum: int
) -> Iterator[int]:
    """Entry ids in ``[first_entry_id, last_entry_id]`` that the bookie at ``bookie_index`` must store.

    Mirrors ``getEntriesStripedToTheBookie`` (which returns a BitSet relative to ``first_entry_id``) and its
    argument checks. The ids come in ascending order; the walk jumps a whole stripe at a time, so the cost is
    proportional to the number of ids yielded, not the range width.

    Example:
        >>> list(entries_striped_to_bookie(0, 0, 9, ensemble_size=5, write_quorum=2))
        [0, 4, 5, 9]
    """
    _check_quorums(ensemble_size, write_quorum)
    if first_entry_id < 0 or last_entry_id < 0 or last_entry_id < first_entry_id:
        raise ValueError(f"bad entry range [{first_entry_id}, {last_entry_id}]")
    if not 0 <= bookie_index < ensemble_size:
        raise ValueError(f"bookie index must be in [0, {ensemble_size}), got {bookie_index}")
    # Entry e is on the bookie iff (bookie_index - e) mod E < WQ, i.e. e ≡ bookie_index - k (mod E) for
    # some k in [0, WQ). Within each period of E ids that is a run of WQ residues ending at bookie_index.
    entry_id = first_entry_id
    while entry_id <= last_entry_id:
        offset = (bookie_index - entry_id) % ensemble_size
        if offset < write_quorum:
            # Inside a run: the run lasts until e ≡ bookie_index (offset reaches 0).
            run_end = min(entry_id + offset, last_entry_id)
            yield from range(entry_id, run_end + 1)
            entry_id = run_end + 1
        else:
            # Skip to the first id of the next run (where offset == write_quorum - 1).
            entry_id += offset - (write_quorum - 1)


def count_entries_striped_to_bookie(
    bookie_index: int, first_entry_id: int, last_entry_id: int, ensemble_size: int, write_quorum: int
) -> int:
    """How many entry ids in ``[first_entry_id, last_entry_id]`` the bookie at ``bookie_index`` stores: the
    length of :func:`entries_striped_to_bookie`, in O(E) whatever the range (0 for an empty range,
    ``last_entry_id < first_entry_id``). Each whole period of E ids holds WQ of them.

    Example:
        >>> count_entries_striped_to_bookie(0, 0, 9, ensemble_size=5, write_quorum=2)
        4
        >>> count_entries_striped_to_bookie(1, 10, 9, ensemble_size=3, write_quorum=2)
        0
    """
    _check_quorums(ensemble_size, write_quorum)
    if first_entry_id < 0:
        raise ValueError(f"bad entry range [{first_entry_id}, {last_entry_id}]")
    if not 0 <= bookie_index < ensemble_size:
        raise ValueError(f"bookie index must be in [0, {ensemble_size}), got {bookie_index}")
    span = max(0, last_entry_id - first_entry_id + 1)
    periods, rest = divmod(span, ensemble_size)
    start = first_entry_id + periods * ensemble_size
    tail = sum(1 for e in range(start, start + rest) if (bookie_index - e) % ensemble_size < write_quorum)
    return periods * write_quorum + tail
