"""Is BookKeeper's Auditor marking what it should? At-risk ledgers with no under-replication mark.

When a bookie is lost, BookKeeper's Auditor marks every ledger on it under-replicated
(``<root>/underreplication/ledgers/.../urL<id>``) so that a ReplicationWorker repairs it. bkaudit finds
the same ledgers at risk on its own: an open ``LEDGER_UNDER_REPLICATED`` or ``LEDGER_UNRECOVERABLE``,
which starts when the bookie is lost, that is ``lostBookieRecoveryDelay`` after it went missing (when
the Auditor audits). A ledger at risk since ``since_ms`` is *unmarked past the grace* at ``now_ms`` when
it has no mark and ``since_ms + grace <= now_ms``: nothing will repair it.

:func:`unmarked_past_grace` is that test; ``bkaudit query auditor-diff`` (its ``at_risk_unmarked`` list)
and the job's ``AUDITOR_LAGGING`` (:mod:`core.domain.rules.autorecovery`) both call it, so the two agree.
The job keeps only a summary of the unmarked at-risk ledgers (:class:`UnmarkedAtRisk`: how many, since
when the oldest, a few ids), since the oldest alone decides whether the list past the grace is empty.

Pure: numpy only, no I/O, no clock.

Example:
    >>> import numpy as np
    >>> since = np.array([1_000, 5_000, np.nan])  # the third ledger is not at risk
    >>> unmarked_past_grace(since, np.array([False, False, False]), now_ms=6_000, grace_ms=2_000).tolist()
    [True, False, False]
    >>> unmarked_at_risk([7, 8], [5_000, 1_000], [False, False])
    UnmarkedAtRisk(count=2, oldest_since_ms=1000, sample=(8, 7))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

#: How many ledger ids an ``AUDITOR_LAGGING`` alert names (the oldest first).
LAG_SAMPLE = 10


def unmarked_past_grace(
    since_ms: npt.ArrayLike, marked: npt.ArrayLike, now_ms: float, grace_ms: float
) -> npt.NDArray[np.bool_]:
    """Per ledger: at risk (``since_ms`` not NaN) for at least ``grace_ms`` at ``now_ms`` with no mark.

    Example:
        >>> unmarked_past_grace([0, 0, 10], [False, True, False], now_ms=10, grace_ms=10).tolist()
        [True, False, False]
    """
    since = np.asarray(since_ms, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        due = since + float(grace_ms) <= float(now_ms)
    return due & ~np.asarray(marked, dtype=bool)


@dataclass(frozen=True)
class UnmarkedAtRisk:
    """The at-risk ledgers with no under-replication mark: how many, since when the oldest is at risk
    (None: none), and up to :data:`LAG_SAMPLE` ids, the oldest first.

    Example:
        >>> UnmarkedAtRisk.from_json(UnmarkedAtRisk(2, 5, (3, 4)).to_json())
        UnmarkedAtRisk(count=2, oldest_since_ms=5, sample=(3, 4))
    """

    count: int = 0
    oldest_since_ms: int | None = None
    sample: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """As JSON-able data (a few hundred bytes at most)."""
        return {"count": self.count, "oldest_since_ms": self.oldest_since_ms, "sample": list(self.sample)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> UnmarkedAtRisk:
        """What :meth:`to_json` gave (None: none unmarked)."""
        if not data:
            return cls()
        oldest = data.get("oldest_since_ms")
        return cls(
            int(data.get("count") or 0),
            None if oldest is None else int(oldest),
            tuple(int(i) for i in data.get("sample") or ()),
        )


def unmarked_at_risk(
    ledger_ids: npt.ArrayLike | Sequence[int],
    since_ms: npt.ArrayLike | Sequence[int],
    marked: npt.ArrayLike | Sequence[bool],
    sample: int = LAG_SAMPLE,
) -> UnmarkedAtRisk:
    """The summary of the at-risk ledgers (``ledger_ids``, at risk since ``since_ms``) without a mark.

    Example:
        >>> unmarked_at_risk([1, 2, 3], [30, 10, 20], [False, True, False])
        UnmarkedAtRisk(count=2, oldest_since_ms=20, sample=(3, 1))
        >>> unmarked_at_risk([], [], [])
        UnmarkedAtRisk(count=0, oldest_since_ms=None, sample=())
    """
    ids = np.asarray(ledger_ids, dtype=np.int64)
    since = np.asarray(since_ms, dtype=np.int64)
    keep = ~np.asarray(marked, dtype=bool)
    ids, since = ids[keep], since[keep]
    if not len(ids):
        return UnmarkedAtRisk()
    order = np.lexsort((ids, since))[:sample]
    return UnmarkedAtRisk(len(ids), int(since.min()), tuple(int(i) for i in ids[order]))


def auditor_active_since(
    auditor: str | None,
    disabled: bool,
    elected_since_ms: int | None,
    enabled_since_ms: int | None = None,
) -> int | None:
    """Since when the Auditor can mark: an Auditor elected and AutoRecovery on, from the later of the
    election and the end of the last ``disable`` (None for ``enabled_since_ms``: never disabled). None
    when there is no Auditor, AutoRecovery is off, or the election time is unknown.

    Example:
        >>> auditor_active_since("b1", False, 100, 250), auditor_active_since("b1", False, 100)
        (250, 100)
        >>> auditor_active_since("b1", True, 100) is None, auditor_active_since(None, False, 100) is None
        (True, True)
    """
    if auditor is None or disabled or elected_since_ms is None:
        return None
    return elected_since_ms if enabled_since_ms is None else max(elected_since_ms, enabled_since_ms)


def lagging_since_ms(unmarked: UnmarkedAtRisk, active_since_ms: int | None) -> int | None:
    """Since when the Auditor has owed a mark: the oldest unmarked at-risk ledger's start, or the Auditor's
    becoming able to mark when later (None: nothing unmarked, or no Auditor that can mark). The list of
    ledgers unmarked past the grace is non-empty exactly when this plus the grace has passed.

    Example:
        >>> lagging_since_ms(UnmarkedAtRisk(1, 500, (7,)), 200), lagging_since_ms(UnmarkedAtRisk(), 200)
        (500, None)
    """
    if unmarked.oldest_since_ms is None or active_since_ms is None:
        return None
    return max(unmarked.oldest_since_ms, active_since_ms)


__all__ = [
    "LAG_SAMPLE",
    "UnmarkedAtRisk",
    "auditor_active_since",
    "lagging_since_ms",
    "unmarked_at_risk",
    "unmarked_past_grace",
]
