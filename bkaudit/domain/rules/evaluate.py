"""Which alert conditions hold for a ledger right now: pure functions over its metadata, the lost bookies
and the rack map. The sink calls them for exactly the ledgers a batch touched.

Example:
    >>> ledger = {"state": "CLOSED", "ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2,
    ...           "last_entry_id": 9, "length": 100, "segments": [[0, ["b1", "b2", "b3"]]]}
    >>> lost_bookie_condition(ledger, {"b1"})
    ('LEDGER_UNDER_REPLICATED', {'lost_bookies': ['b1']})
    >>> lost_bookie_condition(ledger, {"b1", "b2"})[0]
    'LEDGER_UNRECOVERABLE'
    >>> placement_condition(ledger, {"b1": "/r1", "b2": "/r1", "b3": "/r2"}, PlacementPolicyConfig())[0]
    'PLACEMENT_NOT_ADHERING'
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any

from bkaudit.domain.metadata import LedgerMetadata, LedgerState, Segment
from bkaudit.domain.rules.placement import PlacementAdherence, check_placement
from bkaudit.errors import FormatError


@dataclass(frozen=True)
class PlacementPolicyConfig:
    """The placement policy the cluster is audited against (BookKeeper's defaults)."""

    policy: str = "rackaware"
    min_racks_per_write_quorum: int = 2
    enforce_min_racks_per_write_quorum: bool = False
    min_zones_per_write_quorum: int = 2
    desired_zones_per_write_quorum: int = 3
    min_regions_for_durability: int = 2


def ledger_bookies(ledger: Mapping[str, Any]) -> set[str]:
    """Every bookie named in any segment."""
    return {bookie for _, ensemble in ledger.get("segments") or [] for bookie in ensemble}


def to_metadata(ledger: Mapping[str, Any]) -> LedgerMetadata:
    """A password-less :class:`LedgerMetadata` from a ledger payload (for the pure derived facts)."""
    return LedgerMetadata(
        format_version=int(ledger.get("format_version") or 3),
        ensemble_size=int(ledger["ensemble_size"]),
        write_quorum=int(ledger["write_quorum"]),
        ack_quorum=int(ledger["ack_quorum"]),
        state=LedgerState(ledger["state"]),
        last_entry_id=int(ledger["last_entry_id"]) if ledger["state"] == "CLOSED" else -1,
        length=int(ledger.get("length") or 0) if ledger["state"] == "CLOSED" else 0,
        segments=tuple(Segment(int(first), tuple(ensemble)) for first, ensemble in ledger["segments"]),
    )


def lost_bookie_condition(ledger: Mapping[str, Any], lost: Set[str]) -> tuple[str, dict[str, Any]] | None:
    """``LEDGER_UNDER_REPLICATED`` / ``LEDGER_UNRECOVERABLE`` with detail; None when no lost bookie is named.

    Any segment counts, open or closed (BookKeeper's index does the same). Unrecoverable when some entry has
    no surviving copy (:meth:`LedgerMetadata.is_recoverable`).
    """
    named = sorted(ledger_bookies(ledger) & set(lost))
    if not named or not ledger.get("state"):
        return None
    detail: dict[str, Any] = {"lost_bookies": named}
    try:
        metadata = to_metadata(ledger)
    except (FormatError, KeyError, ValueError, TypeError):
        return "LEDGER_UNDER_REPLICATED", detail
    if metadata.is_recoverable(named):
        return "LEDGER_UNDER_REPLICATED", detail
    detail["unrecoverable_entries_sample"] = list(metadata.unrecoverable_entries(named, limit=10))
    return "LEDGER_UNRECOVERABLE", detail


def placement_condition(
    ledger: Mapping[str, Any], racks: Mapping[str, str | None], config: PlacementPolicyConfig
) -> tuple[str, dict[str, Any]] | None:
    """``PLACEMENT_NOT_ADHERING`` / ``PLACEMENT_SOFT`` for a closed ledger, None when it adheres (or is open).

    Every segment is checked; every ensemble member counts with its rack whatever its liveness.
    """
    if ledger.get("state") != "CLOSED":
        return None
    worst = PlacementAdherence.MEETS_STRICT
    failing: list[list[str]] = []
    soft: list[list[str]] = []
    for _, ensemble in ledger["segments"]:
        verdict = check_placement(
            config.policy,
            list(ensemble),
            int(ledger["write_quorum"]),
            int(ledger["ack_quorum"]),
            {b: rack for b in ensemble if (rack := racks.get(b)) is not None},
            min_racks_per_write_quorum=config.min_racks_per_write_quorum,
            enforce_min_racks_per_write_quorum=config.enforce_min_racks_per_write_quorum,
            min_zones_per_write_quorum=config.min_zones_per_write_quorum,
            desired_zones_per_write_quorum=config.desired_zones_per_write_quorum,
            min_regions_for_durability=config.min_regions_for_durability,
        )
        failing.extend(list(ws) for ws in verdict.failing_write_sets)
        soft.extend(list(ws) for ws in verdict.soft_write_sets)
        if verdict.adherence.value < worst.value:
            worst = verdict.adherence
    if worst is PlacementAdherence.FAIL:
        return "PLACEMENT_NOT_ADHERING", {"policy": config.policy, "failing_write_sets": failing[:20]}
    if worst is PlacementAdherence.MEETS_SOFT:
        return "PLACEMENT_SOFT", {"policy": config.policy, "soft_write_sets": soft[:20]}
    return None


def placement_column(ledger: Mapping[str, Any], condition: tuple[str, dict[str, Any]] | None) -> str | None:
    """The ``placement`` column from the ledger's :func:`placement_condition` (None: it adheres):
    FAIL / MEETS_SOFT / MEETS_STRICT for a closed ledger, None for any other.

    Example:
        >>> conditions = (None, ("PLACEMENT_SOFT", {}), ("PLACEMENT_NOT_ADHERING", {}))
        >>> [placement_column({"state": "CLOSED"}, c) for c in conditions]
        ['MEETS_STRICT', 'MEETS_SOFT', 'FAIL']
        >>> placement_column({"state": "OPEN"}, None) is None
        True
    """
    if ledger.get("state") != "CLOSED":
        return None
    if condition is None:
        return "MEETS_STRICT"
    return "FAIL" if condition[0] == "PLACEMENT_NOT_ADHERING" else "MEETS_SOFT"
