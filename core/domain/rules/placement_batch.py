"""The rack-aware placement check over a whole batch of ledgers at once (numpy), as a screen.

A batch of changed ledgers is almost always placed well. :func:`rackaware_screen` finds, for many ledgers in
one pass, which ones meet the rack-aware policy in every write set of every segment (BookKeeper's rule, as
:func:`~core.domain.rules.placement.rackaware_adherence` states it: a window fails when it spans fewer
than ``min(WQ, min_racks_per_write_quorum)`` racks, or, enforced, holds a bookie in the default rack). Those
need nothing more; the others go through the per-ledger rule, which also says which write sets fail. One
rule, two forms: ``tests/unit/test_placement_batch.py`` holds them equal.

Example:
    >>> racks = {"b1": "/r1", "b2": "/r1", "b3": "/r2"}
    >>> rackaware_screen([[["b1", "b3"]], [["b1", "b2", "b3"]]], [2, 2], racks).tolist()
    [True, False]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from core.domain.rackmap import DEFAULT_RACK
from core.domain.rules.placement import (
    DEFAULT_ENFORCE_MIN_RACKS_PER_WRITE_QUORUM,
    DEFAULT_MIN_RACKS_PER_WRITE_QUORUM,
    normalize_location,
)

#: The default rack's code in :func:`rack_codes`.
DEFAULT_RACK_CODE = 0


def rack_codes(bookies: Sequence[str], racks: Mapping[str, str | None]) -> np.ndarray:
    """Each bookie's rack as an integer code, equal codes for equal (normalised) racks; an unmapped bookie
    is in the default rack, code :data:`DEFAULT_RACK_CODE`.

    Example:
        >>> rack_codes(["b1", "b2", "b3"], {"b1": "/r1", "b2": "/r1/"}).tolist()
        [1, 1, 0]
    """
    codes: dict[str | None, int] = {DEFAULT_RACK: DEFAULT_RACK_CODE}
    return np.asarray(
        [codes.setdefault(normalize_location(racks.get(b)) or DEFAULT_RACK, len(codes)) for b in bookies],
        dtype=np.int64,
    )


def _member_codes(ensembles: Sequence[Sequence[str]], racks: Mapping[str, str | None]) -> np.ndarray:
    """Every member's rack code (:func:`rack_codes`), the ensembles one after another."""
    members = [bookie for ensemble in ensembles for bookie in ensemble]
    distinct = sorted(set(members))
    code_of = dict(zip(distinct, rack_codes(distinct, racks).tolist(), strict=True))
    return np.asarray([code_of[bookie] for bookie in members], dtype=np.int64)


def rackaware_screen(
    segments: Sequence[Sequence[Sequence[str]]],
    write_quorums: Sequence[int],
    racks: Mapping[str, str | None],
    *,
    min_racks_per_write_quorum: int = DEFAULT_MIN_RACKS_PER_WRITE_QUORUM,
    enforce_min_racks_per_write_quorum: bool = DEFAULT_ENFORCE_MIN_RACKS_PER_WRITE_QUORUM,
) -> np.ndarray:
    """Per ledger (its segments' ensembles, its write quorum): True when every cyclic write set of every
    segment meets the rack-aware policy; False when one fails, or when the ledger is not one the rule can
    judge in bulk (an empty ensemble, a write quorum below 1): the per-ledger rule decides those."""
    ensembles = [ensemble for ledger in segments for ensemble in ledger]
    return rackaware_screen_codes(
        _member_codes(ensembles, racks),
        np.asarray([len(e) for e in ensembles], dtype=np.int64),
        np.repeat(np.arange(len(segments)), [len(ledger) for ledger in segments]),
        np.asarray(write_quorums, dtype=np.int64),
        DEFAULT_RACK_CODE,
        min_racks_per_write_quorum=min_racks_per_write_quorum,
        enforce_min_racks_per_write_quorum=enforce_min_racks_per_write_quorum,
    )


def rackaware_screen_codes(
    member_racks: np.ndarray,
    ensemble_sizes: np.ndarray,
    ensemble_ledger: np.ndarray,
    write_quorums: np.ndarray,
    default_rack: int,
    *,
    min_racks_per_write_quorum: int = DEFAULT_MIN_RACKS_PER_WRITE_QUORUM,
    enforce_min_racks_per_write_quorum: bool = DEFAULT_ENFORCE_MIN_RACKS_PER_WRITE_QUORUM,
) -> np.ndarray:
    """:func:`rackaware_screen` over flat columns: every ensemble member's rack code (ensembles one after
    another), each ensemble's size and ledger (ledger positions ascending), each ledger's write quorum, and
    the default rack's code. For callers that hold the ensembles as columns already (Arrow lists).

    Example:
        >>> rackaware_screen_codes(np.array([1, 2, 1, 1]), np.array([2, 2]), np.array([0, 1]),
        ...                        np.array([2, 2]), 0).tolist()
        [True, False]
    """
    ledgers = len(write_quorums)
    owner = np.asarray(ensemble_ledger, dtype=np.int64)
    sizes = np.asarray(ensemble_sizes, dtype=np.int64)
    quorum = np.asarray(write_quorums, dtype=np.int64)[owner] if ledgers else np.empty(0, np.int64)
    ok = np.ones(ledgers, dtype=bool)
    judgeable = (sizes > 0) & (quorum >= 1)
    np.logical_and.at(ok, owner[~judgeable], False)
    if not judgeable.any():
        return ok
    codes = np.asarray(member_racks, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    for write_quorum in np.unique(quorum[judgeable]):
        chosen = np.flatnonzero(judgeable & (quorum == write_quorum))
        # One window per member position: (segment, first member) → the WQ members after it, cyclic.
        window_segment = np.repeat(chosen, sizes[chosen])
        first = np.arange(len(window_segment)) - np.repeat(
            np.cumsum(sizes[chosen]) - sizes[chosen], sizes[chosen]
        )
        offsets = (first[:, None] + np.arange(write_quorum)[None, :]) % sizes[window_segment][:, None]
        window = np.sort(codes[starts[window_segment][:, None] + offsets], axis=1)
        distinct = 1 + (np.diff(window, axis=1) != 0).sum(axis=1)
        failing = distinct < min(int(write_quorum), min_racks_per_write_quorum)
        if enforce_min_racks_per_write_quorum:
            failing |= (window == default_rack).any(axis=1)
        np.logical_and.at(ok, owner[window_segment[failing]], False)
    return ok
