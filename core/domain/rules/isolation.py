"""Bookie isolation: is a ledger placed on the affinity groups its isolation config allows?

Pure code: no I/O, no Spark; shared by the streaming job and the simulator's ground truth. The rule mirrors
Pulsar's ``IsolatedBookieEnsemblePlacementPolicy``, which excludes every bookie listed under a group of the
rack map (``/bookies``) that is not a primary group, and lets the secondary groups' bookies back in only
when the primary groups hold fewer writable bookies than the ensemble needs. A bookie the rack map lists
under no group is never excluded by Pulsar, so it is never outside.

A member is *outside* when its group is neither primary nor (when the primary groups lack room) secondary.
"Room" is judged as the auditor sees the cluster now: the writable bookies of the primary groups against
the ledger's ensemble size. Every segment's ensemble is checked (an ensemble change replaces a bookie under
the same config).

Two forms of one rule: :func:`isolation_verdict` for one ledger (the alert's detail, the simulator's truth)
and :func:`isolation_outside_codes` / :func:`isolation_screen` over a batch; ``tests/unit/test_isolation.py``
holds them equal.

Example:
    >>> groups = {"b1": "orders", "b2": "orders", "b3": "shared"}
    >>> config = IsolationGroups(("orders",), ("shared",))
    >>> verdict = isolation_verdict([["b1", "b3"]], 2, config, groups, {"b1", "b2"})
    >>> verdict.outside, verdict.allowed
    (('b3',), ('orders',))
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.domain.isolation import IsolationGroups

NO_GROUP = -1
"""Group code of a bookie the rack map lists under no group."""


@dataclass(frozen=True)
class IsolationVerdict:
    """The groups a ledger may use now, and its members outside them (sorted, once each).

    Example:
        >>> IsolationVerdict(("g",), ("b9",)).violated
        True
    """

    allowed: tuple[str, ...]
    outside: tuple[str, ...] = ()

    @property
    def violated(self) -> bool:
        return bool(self.outside)

    def detail(self, groups: IsolationGroups) -> dict[str, Any]:
        """The alert's detail: the configured and allowed groups, and each outside member's group.

        Example:
            >>> IsolationVerdict(("g",), ("b9",)).detail(IsolationGroups(("g",)))["outside"]
            ['b9']
        """
        return {
            "primary_groups": list(groups.primary),
            "secondary_groups": list(groups.secondary),
            "allowed_groups": list(self.allowed),
            "outside": list(self.outside)[:50],
        }


def primary_writable(
    groups: IsolationGroups, group_of: Mapping[str, str | None], writable: Collection[str]
) -> int:
    """How many writable bookies the primary groups hold (Pulsar's ``totalAvailableBookiesInPrimaryGroup``).

    Example:
        >>> primary_writable(IsolationGroups(("g",)), {"a": "g", "b": "g", "c": "h"}, {"a", "c"})
        1
    """
    primary = set(groups.primary)
    return sum(1 for bookie in writable if group_of.get(bookie) in primary)


def allowed_groups(groups: IsolationGroups, ensemble_size: int, writable_in_primary: int) -> tuple[str, ...]:
    """The primary groups, and the secondary ones when the primary hold fewer writable bookies than
    ``ensemble_size``; sorted, once each.

    Example:
        >>> config = IsolationGroups(("a",), ("b",))
        >>> allowed_groups(config, 3, 2), allowed_groups(config, 2, 2)
        (('a', 'b'), ('a',))
    """
    allowed = set(groups.primary)
    if writable_in_primary < ensemble_size:
        allowed.update(groups.secondary)
    return tuple(sorted(allowed))


def isolation_verdict(
    ensembles: Sequence[Sequence[str]],
    ensemble_size: int,
    groups: IsolationGroups,
    group_of: Mapping[str, str | None],
    writable: Collection[str],
) -> IsolationVerdict:
    """One ledger's verdict: its segments' ``ensembles``, its ensemble size, its isolation ``groups``, each
    bookie's affinity group (absent or None: no group) and the writable bookies.

    Example:
        >>> config = IsolationGroups(("g",), ("h",))
        >>> isolation_verdict([["b1", "b2"]], 2, config, {"b1": "g", "b2": "h"}, {"b1"})
        IsolationVerdict(allowed=('g', 'h'), outside=())
    """
    allowed = allowed_groups(groups, ensemble_size, primary_writable(groups, group_of, writable))
    permitted = set(allowed)
    outside = {
        bookie
        for ensemble in ensembles
        for bookie in ensemble
        if (group := group_of.get(bookie)) is not None and group not in permitted
    }
    return IsolationVerdict(allowed, tuple(sorted(outside)))


def isolation_outside_codes(
    member_groups: np.ndarray,
    member_ledger: np.ndarray,
    ledger_config: np.ndarray,
    ledger_ensemble_size: np.ndarray,
    primary: np.ndarray,
    secondary: np.ndarray,
    writable_in_primary: np.ndarray,
) -> np.ndarray:
    """Per ledger: whether a member is outside its allowed groups, over flat columns. ``member_groups``:
    every member's group code (:data:`NO_GROUP` for none); ``member_ledger``: its ledger's position;
    ``ledger_config``: each ledger's config index (-1: not isolated); ``primary`` / ``secondary``: one bool
    row per config, one column per group code; ``writable_in_primary``: per config.

    Example:
        >>> primary, secondary = np.array([[True, False]]), np.array([[False, True]])
        >>> isolation_outside_codes(np.array([0, 1, 1]), np.array([0, 0, 1]), np.array([0, -1]),
        ...     np.array([2, 2]), primary, secondary, np.array([5])).tolist()
        [True, False]
    """
    ledgers = len(ledger_config)
    violated = np.zeros(ledgers, dtype=bool)
    if not len(member_groups) or not ledgers:
        return violated
    config = np.asarray(ledger_config, dtype=np.int64)[member_ledger]
    group = np.asarray(member_groups, dtype=np.int64)
    judged = (config >= 0) & (group != NO_GROUP)
    if not judged.any():
        return violated
    config, group, owner = config[judged], group[judged], np.asarray(member_ledger)[judged]
    needs_secondary = np.asarray(writable_in_primary)[config] < np.asarray(ledger_ensemble_size)[owner]
    inside = primary[config, group] | (needs_secondary & secondary[config, group])
    violated[np.unique(owner[~inside])] = True
    return violated


def isolation_screen(
    ledgers: Sequence[tuple[Sequence[Sequence[str]], int, IsolationGroups | None]],
    group_of: Mapping[str, str | None],
    writable: Collection[str],
) -> np.ndarray:
    """:func:`isolation_outside_codes` for ``(ensembles, ensemble size, groups or None)`` per ledger.

    Example:
        >>> g = IsolationGroups(("a",))
        >>> isolation_screen([([["b1"]], 1, g), ([["b2"]], 1, g), ([["b2"]], 1, None)],
        ...                  {"b1": "a", "b2": "z"}, {"b1"}).tolist()
        [False, True, False]
    """
    configs: dict[IsolationGroups, int] = {}
    ledger_config = [
        -1 if groups is None else configs.setdefault(groups, len(configs)) for *_, groups in ledgers
    ]
    members = [bookie for ensembles, _, _ in ledgers for ensemble in ensembles for bookie in ensemble]
    names: dict[str, int] = {}
    member_index = np.asarray([names.setdefault(b, len(names)) for b in members], dtype=np.int64)
    sizes = [sum(len(e) for e in ensembles) for ensembles, _, _ in ledgers]
    return isolation_screen_columns(
        list(names),
        member_index,
        np.repeat(np.arange(len(ledgers)), sizes),
        np.asarray(ledger_config, dtype=np.int64),
        np.asarray([size for _, size, _ in ledgers], dtype=np.int64),
        list(configs),
        group_of,
        writable,
    )


def isolation_screen_columns(
    bookies: Sequence[str],
    member_index: np.ndarray,
    member_ledger: np.ndarray,
    ledger_config: np.ndarray,
    ledger_ensemble_size: np.ndarray,
    configs: Sequence[IsolationGroups],
    group_of: Mapping[str, str | None],
    writable: Collection[str],
) -> np.ndarray:
    """:func:`isolation_outside_codes` for members given as positions into the distinct ``bookies`` (an
    Arrow dictionary's), ledgers' config indexes into ``configs`` (-1: not isolated), each bookie's group
    and the writable bookies.

    Example:
        >>> isolation_screen_columns(["b1", "b2"], np.array([0, 1]), np.array([0, 1]), np.array([0, 0]),
        ...     np.array([1, 1]), [IsolationGroups(("a",))], {"b1": "a", "b2": "z"}, {"b1"}).tolist()
        [False, True]
    """
    names = {g for g in group_of.values() if g is not None}
    code = {name: index for index, name in enumerate(sorted(names))}
    bookie_groups = np.asarray(
        [NO_GROUP if (g := group_of.get(b)) is None else code[g] for b in bookies], dtype=np.int64
    )
    primary, secondary = group_masks(configs, code)
    counts = np.asarray([primary_writable(c, group_of, writable) for c in configs], dtype=np.int64)
    return isolation_outside_codes(
        bookie_groups[np.asarray(member_index, dtype=np.int64)]
        if len(member_index)
        else np.zeros(0, np.int64),
        np.asarray(member_ledger, dtype=np.int64),
        ledger_config,
        ledger_ensemble_size,
        primary,
        secondary,
        counts,
    )


def group_masks(configs: Sequence[IsolationGroups], code: Mapping[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """One bool row per config, one column per group code: its primary groups, its secondary groups
    (a group no bookie is in has no column, so it never matches).

    Example:
        >>> [m.tolist() for m in group_masks([IsolationGroups(("b",), ("a", "x"))], {"a": 0, "b": 1})]
        [[[False, True]], [[True, False]]]
    """
    primary = np.zeros((len(configs), len(code)), dtype=bool)
    secondary = np.zeros((len(configs), len(code)), dtype=bool)
    for row, config in enumerate(configs):
        primary[row, [code[g] for g in config.primary if g in code]] = True
        secondary[row, [code[g] for g in config.secondary if g in code]] = True
    return primary, secondary
