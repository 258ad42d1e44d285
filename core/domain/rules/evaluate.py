"""Which placement conditions hold for a ledger right now: pure functions over its metadata and the rack
map. The sink calls them for exactly the ledgers a batch touched (the lost-bookie conditions of those
ledgers come from :mod:`core.domain.rules.lost_ledgers`, all at once).

Example:
    >>> ledger = {"state": "CLOSED", "ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2,
    ...           "last_entry_id": 9, "length": 100, "segments": [[0, ["b1", "b2", "b3"]]]}
    >>> placement_condition(ledger, {"b1": "/r1", "b2": "/r1", "b3": "/r2"}, PlacementPolicyConfig())[0]
    'PLACEMENT_NOT_ADHERING'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.domain.rules.placement import PlacementAdherence, check_placement


@dataclass(frozen=True)
class PlacementPolicyConfig:
    """The placement policy the cluster is audited against (BookKeeper's defaults)."""

    policy: str = "rackaware"
    min_racks_per_write_quorum: int = 2
    enforce_min_racks_per_write_quorum: bool = False
    min_zones_per_write_quorum: int = 2
    desired_zones_per_write_quorum: int = 3
    min_regions_for_durability: int = 2

    def options(self) -> dict[str, Any]:
        """The policy parameters as :func:`~core.domain.rules.placement.check_placement`'s keywords.

        Example:
            >>> PlacementPolicyConfig().options()["min_racks_per_write_quorum"]
            2
        """
        return {
            "min_racks_per_write_quorum": self.min_racks_per_write_quorum,
            "enforce_min_racks_per_write_quorum": self.enforce_min_racks_per_write_quorum,
            "min_zones_per_write_quorum": self.min_zones_per_write_quorum,
            "desired_zones_per_write_quorum": self.desired_zones_per_write_quorum,
            "min_regions_for_durability": self.min_regions_for_durability,
        }


def ledger_bookies(ledger: Mapping[str, Any]) -> set[str]:
    """Every bookie named in any segment."""
    return {bookie for _, ensemble in ledger.get("segments") or [] for bookie in ensemble}


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
            **config.options(),
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
