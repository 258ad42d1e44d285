"""Scenario files: a YAML timeline of simulator actions, validated up front, run against a cluster.

Loading and validation are pure; :func:`run_timeline` sleeps and calls an executor (a
local :class:`~bkaudit.sim.cluster.SimulatedCluster` or the control channel of a running one).

A scenario has an optional ``cluster`` (how to build a new simulated cluster: bookies, racks, ledgers...),
optional ``truth`` parameters (the auditor configuration ground truth assumes), ``steps`` and ``end_at``::

    cluster: {bookies: 6, racks: 3, ledgers: 20, lost_bookie_recovery_delay_s: 2}
    truth: {under_replication_grace_s: 60}
    steps:
      - {at: 0.0, action: create_ledger, name: hot, entries: 50, close: false}
      - {at: 1.0, action: kill_bookie, bookie: 1, hard: true}
      - {at: 2.5, action: add_entries, ledger: hot, count: 10}
    end_at: 8.0

Each step is ``at`` (seconds from the start), ``action`` (a name from :data:`bkaudit.sim.actions.ACTIONS`)
and that action's arguments, inline. Steps run in ``at`` order (file order for equal times); the run then
waits until ``end_at`` (if given) so that delays can elapse before the truth is taken. Any unknown key,
unknown action or bad argument is reported as one :class:`~core.errors.ConfigError` line naming the
step.

Example:
    >>> scenario = parse_scenario('''
    ... cluster: {bookies: 4, racks: 2}
    ... steps:
    ...   - {at: 1.5, action: kill_bookie, bookie: 0, hard: true}
    ...   - {at: 0, action: make_silent, bookie: bookie-02}
    ... ''')
    >>> [(step.at, step.action) for step in scenario.ordered_steps()]
    [(0.0, 'make_silent'), (1.5, 'kill_bookie')]
    >>> parse_scenario("steps: [{at: 1, action: kill_bookie, bookie: 0, hardd: true}]")
    Traceback (most recent call last):
    ...
    core.errors.ConfigError: scenario: step 1 (kill_bookie): hardd: extra inputs are not permitted
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from bkaudit.sim.actions import validate_action
from bkaudit.sim.truth import TruthParameters
from core.domain.rackmap import PULSAR_RACK_MAP_ZNODE
from core.domain.rules.autorecovery import AutoRecoveryGraces
from core.domain.rules.lost_bookie import DisruptionRule
from core.errors import BkauditError, ConfigError

__all__ = [
    "ClusterSpec",
    "Scenario",
    "Step",
    "TruthSpec",
    "build_cluster",
    "load_scenario",
    "parse_scenario",
    "run_timeline",
]

logger = logging.getLogger(__name__)

Executor = Callable[[str, Mapping[str, Any]], Any]


class ClusterSpec(BaseModel):
    """How to build a new simulated cluster (``sim up`` options and a scenario's ``cluster``).

    ``id_style``: ``bp41`` (``bookie-01``…), ``legacy`` (``127.0.0.1:<port>``) or ``mixed`` (alternating).
    ``ledgers`` closed ledgers with ``entries`` entries each, plus ``open_ledgers`` open ones.

    Example:
        >>> ClusterSpec().bookies, ClusterSpec().manager
        (5, 'hierarchical')
    """

    model_config = ConfigDict(extra="forbid")

    bookies: int = Field(5, ge=0, le=1000)
    racks: int = Field(3, ge=1)
    ledgers: int = Field(10, ge=0)
    open_ledgers: int = Field(0, ge=0)
    entries: int = Field(20, ge=0)
    ensemble_size: int = Field(3, ge=1)
    write_quorum: int = Field(2, ge=1)
    ack_quorum: int = Field(2, ge=1)
    id_style: Literal["bp41", "legacy", "mixed"] = "mixed"
    # DbLedgerStorage (Pulsar's default) never answers entry-list requests; mixed: every other bookie.
    storage: Literal["SortedLedgerStorage", "DbLedgerStorage", "mixed"] = "SortedLedgerStorage"
    manager: Literal["hierarchical", "longhierarchical", "legacyhierarchical", "flat"] = "hierarchical"
    root: str = "/ledgers"
    rack_map_path: str = PULSAR_RACK_MAP_ZNODE
    lost_bookie_recovery_delay_s: int = Field(0, ge=0)
    session_timeout_s: float = Field(10.0, gt=0)
    bookie_session_timeout_s: float = Field(10.0, gt=0)
    seed: int | None = None
    # Where DbLedgerStorage bookies write their RocksDB indexes (BookKeeper's layout, for `bkaudit agent`).
    index_root: str | None = None

    @model_validator(mode="after")
    def _quorums(self) -> ClusterSpec:
        if not 1 <= self.ack_quorum <= self.write_quorum <= self.ensemble_size:
            raise ValueError("quorums must satisfy 1 <= ack_quorum <= write_quorum <= ensemble_size")
        return self


class TruthSpec(BaseModel):
    """Ground-truth parameters (the auditor configuration it assumes); see ``TruthParameters``.

    Example:
        >>> TruthSpec(under_replication_grace_s=30).to_parameters().under_replication_grace_s
        30.0
    """

    model_config = ConfigDict(extra="forbid")

    placement_policy: Literal["rackaware", "regionaware", "zoneaware"] = "rackaware"
    min_racks_per_write_quorum: int = Field(2, ge=1)
    enforce_min_racks_per_write_quorum: bool = False
    probe_timeout_s: float = Field(5.0, gt=0)
    under_replication_grace_s: float | None = Field(600.0, ge=0)
    autorecovery_disabled_grace_s: float = Field(900.0, ge=0)
    auditor_missing_grace_s: float = Field(300.0, ge=0)
    replication_lock_grace_s: float = Field(1800.0, ge=0)
    auditor_checks_overdue_grace_s: float = Field(86400.0, ge=0)
    auditor_periodic_check_interval_s: float = Field(604800.0, ge=0)
    auditor_periodic_placement_policy_check_interval_s: float = Field(0.0, ge=0)
    auditor_periodic_replicas_check_interval_s: float = Field(0.0, ge=0)
    auditor_lagging_grace_s: float = Field(600.0, ge=0)
    zookeeper_disruption_settle_s: float = Field(1.0, ge=0)
    zookeeper_disruption_grace_s: float = Field(30.0, ge=0)
    zookeeper_disruption_share: float = Field(0.5, gt=0, le=1)

    def to_parameters(self) -> TruthParameters:
        """The pure module's parameter object.

        Example:
            >>> TruthSpec(auditor_missing_grace_s=2).to_parameters().autorecovery.auditor_missing_s
            2.0
        """
        values = self.model_dump()
        graces = AutoRecoveryGraces(
            disabled_s=values.pop("autorecovery_disabled_grace_s"),
            auditor_missing_s=values.pop("auditor_missing_grace_s"),
            lock_held_s=values.pop("replication_lock_grace_s"),
            checks_overdue_s=values.pop("auditor_checks_overdue_grace_s"),
            check_all_ledgers_interval_s=values.pop("auditor_periodic_check_interval_s"),
            placement_policy_check_interval_s=values.pop(
                "auditor_periodic_placement_policy_check_interval_s"
            ),
            replicas_check_interval_s=values.pop("auditor_periodic_replicas_check_interval_s"),
            lagging_s=values.pop("auditor_lagging_grace_s"),
        )
        disruption = DisruptionRule(
            settle_s=values.pop("zookeeper_disruption_settle_s"),
            grace_s=values.pop("zookeeper_disruption_grace_s"),
            share=values.pop("zookeeper_disruption_share"),
        )
        return TruthParameters(**values, autorecovery=graces, disruption=disruption)


class Step(BaseModel):
    """One timed action; the action's arguments sit next to ``at`` and ``action``.

    Example:
        >>> Step.model_validate({"at": 2, "action": "make_slow", "bookie": 0, "delay_s": 3}).args
        {'bookie': 0, 'delay_s': 3}
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    at: float = Field(ge=0)
    action: str

    @property
    def args(self) -> dict[str, Any]:
        """The action's arguments (every key but ``at`` and ``action``)."""
        return dict(self.model_extra or {})


class Scenario(BaseModel):
    """A whole scenario file.

    Example:
        >>> Scenario().steps, Scenario().end_at
        ([], None)
    """

    model_config = ConfigDict(extra="forbid")

    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    truth: TruthSpec = Field(default_factory=TruthSpec)
    steps: list[Step] = Field(default_factory=list)
    end_at: float | None = Field(None, ge=0)

    def ordered_steps(self) -> list[Step]:
        """Steps by ``at``; steps with the same time keep their file order."""
        return sorted(self.steps, key=lambda step: step.at)


def _problem(err: ValidationError) -> tuple[tuple[Any, ...], str]:
    first = err.errors(include_url=False)[0]
    message = first["msg"]
    return tuple(first["loc"]), (message[0].lower() + message[1:]) if message else "invalid"


def parse_scenario(text: str, *, source: str = "scenario") -> Scenario:
    """Parse and validate scenario YAML (every step's arguments included); one ``ConfigError`` line if bad.

    Example:
        >>> parse_scenario("steps: [{at: 0, action: nope}]")
        Traceback (most recent call last):
        ...
        core.errors.ConfigError: scenario: step 1 (nope): unknown action 'nope' (known: add_bookie, ...
    """
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{source}: not valid YAML{where}") from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: the top level must be a mapping (cluster, truth, steps, end_at)")
    try:
        scenario = Scenario.model_validate(document)
    except ValidationError as err:
        loc, message = _problem(err)
        if len(loc) >= 2 and loc[0] == "steps" and isinstance(loc[1], int):
            rest = ".".join(str(part) for part in loc[2:])
            raise ConfigError(
                f"{source}: step {loc[1] + 1}: {rest + ': ' if rest else ''}{message}"
            ) from None
        where = ".".join(str(part) for part in loc)
        raise ConfigError(f"{source}: {where + ': ' if where else ''}{message}") from None
    for number, step in enumerate(scenario.steps, start=1):
        try:
            validate_action(step.action, step.args)
        except BkauditError as err:
            detail = str(err)
            prefix = f"{step.action}: "
            detail = detail[len(prefix) :] if detail.startswith(prefix) else detail
            raise ConfigError(f"{source}: step {number} ({step.action}): {detail}") from None
    return scenario


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file.

    Example:
        >>> load_scenario("/nonexistent.yaml")
        Traceback (most recent call last):
        ...
        core.errors.ConfigError: scenario /nonexistent.yaml: cannot read it (No such file or directory)
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"scenario {file}: cannot read it ({err.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"scenario {file}: not UTF-8 text") from None
    return parse_scenario(text, source=f"scenario {file}")


def run_timeline(
    scenario: Scenario,
    execute: Executor,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[dict[str, Any]]:
    """Run the steps at their times through ``execute(action, args)``, then wait until ``end_at``.

    Returns one log entry per step: ``at``, ``action``, ``args``, ``started_s`` (actual offset) and
    ``result``. The first failing step stops the run with a ``BkauditError`` naming it.

    Example:
        >>> calls = []
        >>> fake_time = [0.0]
        >>> scenario = parse_scenario("steps: [{at: 2, action: heal_bookie, bookie: 0}]\\nend_at: 5")
        >>> log = run_timeline(scenario, lambda name, args: calls.append((name, args)),
        ...                    clock=lambda: fake_time[0],
        ...                    sleep=lambda s: fake_time.__setitem__(0, fake_time[0] + s))
        >>> calls, log[0]["started_s"], fake_time[0]
        ([('heal_bookie', {'bookie': 0})], 2.0, 5.0)
    """
    start = clock()
    log: list[dict[str, Any]] = []
    for number, step in enumerate(scenario.ordered_steps(), start=1):
        wait = start + step.at - clock()
        if wait > 0:
            sleep(wait)
        started = clock() - start
        logger.info("scenario step %d at %.2f s: %s %s", number, started, step.action, step.args)
        try:
            result = execute(step.action, step.args)
        except BkauditError as err:
            raise type(err)(f"scenario step {number} ({step.action} at {step.at:g} s): {err}") from None
        log.append(
            {
                "at": step.at,
                "action": step.action,
                "args": step.args,
                "started_s": round(started, 3),
                "result": result,
            }
        )
    if scenario.end_at is not None:
        wait = start + scenario.end_at - clock()
        if wait > 0:
            sleep(wait)
    return log


def build_cluster(
    spec: ClusterSpec,
    zk_hosts: str,
    *,
    reset: bool = False,
    truth: TruthSpec | None = None,
) -> Any:
    """A new, initialised :class:`~bkaudit.sim.cluster.SimulatedCluster` populated as ``spec`` says.

    Bookies first (ids per ``id_style``, racks round robin), then closed and open ledgers. The caller owns
    the cluster and must ``close()`` it.

    Example:
        >>> # sim = build_cluster(ClusterSpec(bookies=3, ledgers=5), "127.0.0.1:2181/x", reset=True)
    """
    from bkaudit.sim.cluster import SimulatedCluster

    sim = SimulatedCluster(
        zk_hosts,
        root=spec.root,
        manager=spec.manager,
        racks=spec.racks,
        session_timeout_s=spec.session_timeout_s,
        bookie_session_timeout_s=spec.bookie_session_timeout_s,
        rack_map_path=spec.rack_map_path,
        lost_bookie_recovery_delay_s=spec.lost_bookie_recovery_delay_s,
        seed=spec.seed,
        truth_parameters=(truth or TruthSpec()).to_parameters(),
        index_root=Path(spec.index_root) if spec.index_root else None,
    )
    try:
        sim.init(reset=reset)
        for index in range(spec.bookies):
            legacy = spec.id_style == "legacy" or (spec.id_style == "mixed" and index % 2 == 1)
            storage = spec.storage
            if storage == "mixed":
                storage = "DbLedgerStorage" if index % 2 == 0 else "SortedLedgerStorage"
            sim.add_bookie(legacy_id=legacy, storage=storage)
        for index in range(spec.ledgers + spec.open_ledgers):
            sim.create_ledger(
                ensemble_size=spec.ensemble_size,
                write_quorum=spec.write_quorum,
                ack_quorum=spec.ack_quorum,
                entries=spec.entries,
                close=index < spec.ledgers,
            )
    except BaseException:
        sim.close()
        raise
    return sim
