"""Cluster simulation: a BookKeeper cluster in a real ZooKeeper (bookies, ledgers, faults), ground truth.

Modules (docs/simulator.md):

- :mod:`bkaudit.sim.cluster`: :class:`SimulatedCluster`: znodes, bookies, ledger lifecycle, faults;
- :mod:`bkaudit.sim.bookie`: one bookie's server, store and ZooKeeper session (graceful and hard kills);
- :mod:`bkaudit.sim.ensemble`: rack-aware (and deliberately bad) ensemble choice, pure;
- :mod:`bkaudit.sim.truth`: what a correct auditor must flag, pure;
- :mod:`bkaudit.sim.actions`: every operation by name with validated arguments;
- :mod:`bkaudit.sim.scenario`: YAML timelines; :mod:`bkaudit.sim.control`: the control channel;
- :mod:`bkaudit.sim.bulk`: the bulk loader for millions of ledgers.

The names below are imported lazily, so ``import bkaudit.sim.truth`` pulls in neither kazoo nor servers.

Example:
    >>> from bkaudit.sim import TruthParameters
    >>> TruthParameters().placement_policy
    'rackaware'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bkaudit.sim.cluster import SimulatedCluster
    from bkaudit.sim.errors import NotEnoughBookiesError, SimulatorError, UnknownEntityError
    from bkaudit.sim.scenario import ClusterSpec, Scenario, build_cluster, load_scenario
    from bkaudit.sim.truth import ClusterSnapshot, TruthParameters, ground_truth

__all__ = [
    "ClusterSnapshot",
    "ClusterSpec",
    "NotEnoughBookiesError",
    "Scenario",
    "SimulatedCluster",
    "SimulatorError",
    "TruthParameters",
    "UnknownEntityError",
    "build_cluster",
    "ground_truth",
    "load_scenario",
]

_HOMES = {
    "SimulatedCluster": "bkaudit.sim.cluster",
    "NotEnoughBookiesError": "bkaudit.sim.errors",
    "SimulatorError": "bkaudit.sim.errors",
    "UnknownEntityError": "bkaudit.sim.errors",
    "ClusterSpec": "bkaudit.sim.scenario",
    "Scenario": "bkaudit.sim.scenario",
    "build_cluster": "bkaudit.sim.scenario",
    "load_scenario": "bkaudit.sim.scenario",
    "ClusterSnapshot": "bkaudit.sim.truth",
    "TruthParameters": "bkaudit.sim.truth",
    "ground_truth": "bkaudit.sim.truth",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'bkaudit.sim' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
