"""Re-probe rounds of a suspect ledger (BP-34): an alert only when the SAME failure persists.

Pure code: no I/O, no Spark. The processor keeps one :class:`FailureRounds` per suspect ledger and folds
every probe result into it with :func:`count_round`:

* a healthy round ends the count (``None``);
* a failing round of the kind being counted adds one;
* a failing round of another kind starts a new count at one: a leftover count from an earlier episode
  (say, bookies unknown during a bookie loss) never lends its rounds to a new, transient fault.

:func:`confirms` says when the count is long enough to alert: the round that found the failure plus
``reprobe_rounds`` re-probes, all failing the same way.

The kind of a failure (:func:`failure_kind`) is the replicas classification when data is short
(``NO_REPLICA``, ``LESS_THAN_AQ``, ``LESS_THAN_WQ``); otherwise, when only some bookies could not be asked,
``UNKNOWN_BOOKIES:`` with those bookies (a different silent bookie is a different failure).

Example:
    >>> count = None
    >>> for kind in ["UNKNOWN_BOOKIES:b1", "UNKNOWN_BOOKIES:b1", "LESS_THAN_AQ"]:
    ...     count = count_round(count, kind)
    >>> count, confirms(count, reprobe_rounds=1)
    (FailureRounds(failure='LESS_THAN_AQ', rounds=1), False)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Replicas classifications that mean data is short (the ``REPLICAS_*`` alert kinds).
SHORT_RESULTS = ("NO_REPLICA", "LESS_THAN_AQ", "LESS_THAN_WQ")
#: Prefix of the kind of a failure where data is not short but some bookies did not answer or resolve.
UNKNOWN_BOOKIES = "UNKNOWN_BOOKIES"
#: The kind of a failing result that carries no classification (an older or partial feedback record).
UNCLASSIFIED = "FAILING"


@dataclass(frozen=True)
class FailureRounds:
    """Consecutive failing rounds of one kind of failure.

    Example:
        >>> FailureRounds("LESS_THAN_WQ", 2).rounds
        2
    """

    failure: str
    rounds: int


def failure_kind(result: Mapping[str, Any]) -> str | None:
    """The kind of failure a probe result reports, or ``None`` for a healthy round.

    ``result`` is a probe feedback record: ``{"failing": bool, "outcome": {"result": ..., "unresponsive":
    [...], "unresolved": [...]}}``.

    Example:
        >>> failure_kind({"failing": False})
        >>> failure_kind({"failing": True, "outcome": {"result": "LESS_THAN_AQ", "unresponsive": ["b2"]}})
        'LESS_THAN_AQ'
        >>> failure_kind({"failing": True, "outcome": {"result": "OK", "unresolved": ["b2", "b1"]}})
        'UNKNOWN_BOOKIES:b1,b2'
    """
    if not result.get("failing"):
        return None
    outcome = result.get("outcome") or {}
    classification = outcome.get("result")
    if classification in SHORT_RESULTS:
        return str(classification)
    unknown = sorted({*(outcome.get("unresponsive") or []), *(outcome.get("unresolved") or [])})
    if unknown:
        return f"{UNKNOWN_BOOKIES}:{','.join(unknown)}"
    return UNCLASSIFIED


def count_round(previous: FailureRounds | None, failure: str | None) -> FailureRounds | None:
    """Fold one round's failure kind (``None``: healthy) into the count.

    Example:
        >>> count_round(FailureRounds("LESS_THAN_WQ", 2), "LESS_THAN_WQ")
        FailureRounds(failure='LESS_THAN_WQ', rounds=3)
        >>> count_round(FailureRounds("LESS_THAN_WQ", 2), "NO_REPLICA")
        FailureRounds(failure='NO_REPLICA', rounds=1)
        >>> count_round(FailureRounds("LESS_THAN_WQ", 2), None) is None
        True
    """
    if failure is None:
        return None
    if previous is None or previous.failure != failure:
        return FailureRounds(failure, 1)
    return FailureRounds(failure, previous.rounds + 1)


def confirms(count: FailureRounds | None, reprobe_rounds: int) -> bool:
    """Whether the count is an alert: the finding round plus ``reprobe_rounds`` re-probes failed alike.

    Example:
        >>> confirms(FailureRounds("NO_REPLICA", 3), 3), confirms(FailureRounds("NO_REPLICA", 4), 3)
        (False, True)
    """
    return count is not None and count.rounds > reprobe_rounds


__all__ = ["FailureRounds", "confirms", "count_round", "failure_kind"]
