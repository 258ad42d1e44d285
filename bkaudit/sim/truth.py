"""Ground truth: which ledgers and bookies a correct auditor must flag at one moment, per alert kind.

Pure code: no I/O, no clock. The simulator builds a :class:`ClusterSnapshot` of what it
knows (it broke things on purpose) and :func:`ground_truth` applies the rules below (each kind's section
of docs/alerts.md) with the project's shared rules (``LedgerMetadata.is_recoverable``,
``core.domain.rules.placement.check_placement``,
``core.domain.rules.replicas.classify_replicas``). End-to-end tests and benchmarks compare the auditor's
output with it.

Rules, per kind (ledger kinds list ledger ids, bookie kinds list bookie ids; corrupt ledgers only ever
appear under ``METADATA_CORRUPT``, since nobody can read their bookies; deleted ledgers are not in the
snapshot at all):

- **Missing / lost.** A bookie registered under ``available/`` or ``available/readonly/`` is present
  (read-only is not missing). A bookie that is neither is *missing since* the start of its open
  :class:`Absence` (the time its znode disappeared). It is *lost* (``BOOKIE_LOST``) when it has been missing
  for at least ``lost_bookie_recovery_delay_s``, or at once when another bookie was missing at the same
  time during its absence (BookKeeper: more than one bookie missing → no delay), or from a triggered audit
  during its absence (``audits_ms``: the delay written again with its value or with 0). A bookie that came
  back in time raises nothing; its closed absences are counted as ``flaps``. A bookie named in ledger metadata
  that the snapshot does not know at all is lost. Bookies that vanished together in a ZooKeeper disruption
  (:class:`~core.domain.rules.lost_bookie.DisruptionRule`, ``TruthParameters.disruption``) are lost only
  if their absence is not ``serving``; while the serving ones are missing, ``ZOOKEEPER_DISRUPTION``.
- ``LEDGER_UNDER_REPLICATED`` / ``LEDGER_UNRECOVERABLE``: every ledger (open, in recovery or closed) that
  names a lost bookie in any segment; UNRECOVERABLE (instead of UNDER_REPLICATED) when
  ``is_recoverable(lost)`` is false, i.e. some entry has no surviving copy.
- ``PLACEMENT_NOT_ADHERING`` / ``PLACEMENT_SOFT``: closed ledgers, every segment checked with the
  configured policy; every member counts with its rack whatever its liveness. Any FAIL → NOT_ADHERING,
  otherwise any MEETS_SOFT → SOFT.
- ``PLACEMENT_ISOLATION_VIOLATED``: ledgers (any state) whose custom metadata carries a decodable Pulsar
  isolation config, with a member (any segment) outside the affinity groups it allows now
  (:func:`core.domain.rules.isolation.isolation_verdict`, the writable bookies counted for "room").
- ``REPLICAS_NO_REPLICA`` / ``REPLICAS_LESS_THAN_AQ`` / ``REPLICAS_LESS_THAN_WQ``: closed ledgers with
  entries, and open ledgers up to their last add confirmed (:func:`open_ledger_lac`: the highest LAC the
  answering bookies of the last segment carry in their last entry, the id before it; no answer, no
  check; never a ledger in recovery), classified from what each bookie would answer: its held entries,
  ``NO_LEDGER`` (ENOLEDGER fault or a ledger it does not hold) or unknown (not registered, not serving,
  silent, failing with a status, or slower than ``probe_timeout_s``). Unknown counts neither as holding
  nor as missing. A DbLedgerStorage bookie cannot list its entries, so an auditor reads each fragment's
  first and last entry from it (:mod:`core.domain.rules.entry_reads`): where that sees another kind than
  the full holdings (a loss inside a fragment, which only a sample may find), both kinds are
  ``may_alert`` and neither is required.
- ``BOOKIE_UNRESPONSIVE``: a registered bookie that never answers (silent, or slower than the probe
  timeout) while it is expected to hold at least one entry a check judges (otherwise nothing would ever
  probe it: listed under ``may_alert`` instead). A registered bookie whose server is down (a hard kill
  before the session expires) or that answers with an error status is also only ``may_alert``.
- ``BOOKIE_AUTH_REFUSED``: never; the simulator's bookies accept what the auditor is configured to present
  (TLS with the cluster's CA and client certificate, when they speak TLS), so any is a mismatch.
- ``UNDER_REPLICATION_STUCK``: ``urL`` marks whose stored ctime is more than ``under_replication_grace_s``
  old (marks without ctime never are, as in BookKeeper); disabled when the grace is ``None``.
- ``METADATA_CORRUPT``: ledger znodes that do not decode.
- ``AUTORECOVERY_DISABLED`` / ``AUDITOR_MISSING`` / ``AUDITOR_CHECKS_OVERDUE`` (subjects ``autorecovery``
  / ``auditor`` / ``auditor-checks``) and ``REPLICATION_STALLED`` (ledger ids): AutoRecovery's conditions
  that have held for their grace (:func:`core.domain.rules.autorecovery.due_conditions`, the job's rule);
  a condition within a second of its deadline is only ``may_alert`` (the job dates it by the watcher's
  clock, the simulator by its own). The Auditor counts as elected since its vote's creation (the job: since
  it first saw the vote, the same moment when it watched from the start).
- ``AUDITOR_LAGGING`` (subject ``auditor-lag``): the same rule
  (:func:`core.domain.rules.autorecovery.lagging_condition`) over the ``LEDGER_UNDER_REPLICATED`` /
  ``LEDGER_UNRECOVERABLE`` ledgers above that have no ``urL`` mark, each at risk since the loss of a bookie
  it names (the replayed membership's loss time); required when it holds dated by the latest such loss,
  allowed when it holds dated by the earliest. The Auditor can mark from the later of its vote's creation
  and the last deletion of ``disable``. The simulator's Auditor never marks by itself: a lost bookie's
  ledgers stay unmarked until a test or a user marks them (``bkaudit sim mark-underreplicated``).

``may_alert`` lists what an auditor may flag without being wrong (transitional states); an auditor's
output is correct when it contains every ``alerts`` entry and nothing outside ``alerts`` ∪ ``may_alert``.

Example:
    >>> md = LedgerMetadata(ensemble_size=2, write_quorum=2, ack_quorum=2, state=LedgerState.CLOSED,
    ...                     last_entry_id=1, length=2, segments=(Segment(0, ("b1", "b2")),))
    >>> snapshot = ClusterSnapshot(
    ...     now_ms=10_000,
    ...     bookies={
    ...         "b1": BookieSnapshot("b1", Registration.WRITABLE, "/r1", holdings={7: frozenset({0, 1})}),
    ...         "b2": BookieSnapshot("b2", Registration.NONE, "/r2", serving=False)},
    ...     ledgers={7: md}, absences=(Absence("b2", since_ms=1_000),), lost_bookie_recovery_delay_s=5)
    >>> truth = ground_truth(snapshot)
    >>> truth["alerts"]["BOOKIE_LOST"], truth["alerts"]["LEDGER_UNDER_REPLICATED"]
    (['b2'], [7])
    >>> truth["alerts"]["PLACEMENT_NOT_ADHERING"], truth["alerts"]["REPLICAS_LESS_THAN_WQ"]
    ([], [])
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import pyarrow as pa

from core.domain.alerts import AlertKind
from core.domain.isolation import isolation_config_of
from core.domain.managed_ledger import decode_managed_cursor_info, decode_managed_ledger_info
from core.domain.metadata import LedgerMetadata, LedgerState, Segment, pulsar_topic_from_managed_ledger
from core.domain.rules.auditor_lag import UnmarkedAtRisk, auditor_active_since, unmarked_at_risk
from core.domain.rules.autorecovery import (
    AutoRecoveryGraces,
    AutoRecoveryZnodes,
    due_conditions,
    holding_conditions,
)
from core.domain.rules.entry_reads import ReadAnswer, answers_from_reads, entries_to_read
from core.domain.rules.isolation import isolation_verdict
from core.domain.rules.lost_bookie import (
    NO_DISRUPTION_RULE,
    BookieMembership,
    DisruptionRule,
    Transition,
    TransitionKind,
)
from core.domain.rules.lost_bookie import BookieStatus as Membership
from core.domain.rules.placement import (
    DEFAULT_DESIRED_ZONES_PER_WRITE_QUORUM,
    DEFAULT_ENFORCE_MIN_RACKS_PER_WRITE_QUORUM,
    DEFAULT_MIN_RACKS_PER_WRITE_QUORUM,
    DEFAULT_MIN_REGIONS_FOR_DURABILITY,
    DEFAULT_MIN_ZONES_PER_WRITE_QUORUM,
    POLICIES,
    PlacementAdherence,
    check_placement,
)
from core.domain.rules.replicas import (
    BookieAnswer,
    BookieStatus,
    ReplicasResult,
    checked_through,
    classify_replicas,
    last_add_confirmed,
)
from core.domain.rules.topics import Listing, component_of, listed_table, missing_pairs, orphaned_ledgers
from core.errors import FormatError

__all__ = [
    "ALERT_KINDS",
    "BOOKIE_KINDS",
    "CLUSTER_KINDS",
    "LEDGER_KINDS",
    "Absence",
    "BookieSnapshot",
    "ClusterSnapshot",
    "Registration",
    "TruthParameters",
    "ground_truth",
    "lost_bookies",
    "what_if_truth",
]

LEDGER_KINDS = (
    "LEDGER_UNDER_REPLICATED",
    "LEDGER_UNRECOVERABLE",
    "PLACEMENT_NOT_ADHERING",
    "PLACEMENT_SOFT",
    "PLACEMENT_ISOLATION_VIOLATED",
    "REPLICAS_NO_REPLICA",
    "REPLICAS_LESS_THAN_AQ",
    "REPLICAS_LESS_THAN_WQ",
    "UNDER_REPLICATION_STUCK",
    "METADATA_CORRUPT",
    "REPLICATION_STALLED",
    "LEDGER_ORPHANED",
)
"""Alert kinds whose subjects are ledger ids."""

TOPIC_KINDS = ("TOPIC_LEDGER_MISSING",)
"""Alert kinds whose subjects are ``<managed ledger>/<ledger id>`` (the alert's entity without ``topic/`` and
``ledger/``)."""

BOOKIE_KINDS = ("BOOKIE_LOST", "BOOKIE_UNRESPONSIVE", "BOOKIE_AUTH_REFUSED")
"""Alert kinds whose subjects are bookie ids."""

CLUSTER_KINDS = (
    "AUTORECOVERY_DISABLED",
    "AUDITOR_MISSING",
    "ZOOKEEPER_DISRUPTION",
    "AUDITOR_CHECKS_OVERDUE",
    "AUDITOR_LAGGING",
)
"""Alert kinds of the whole cluster; their subject is the alert's entity (``autorecovery``, ``auditor``,
``zookeeper``, ``auditor-checks``, ``auditor-lag``)."""

ALERT_KINDS = LEDGER_KINDS + BOOKIE_KINDS + CLUSTER_KINDS + TOPIC_KINDS
"""Every alert kind of the alert stream (interfaces.md §2)."""

_REPLICAS_KIND = {
    ReplicasResult.NO_REPLICA: "REPLICAS_NO_REPLICA",
    ReplicasResult.LESS_THAN_AQ: "REPLICAS_LESS_THAN_AQ",
    ReplicasResult.LESS_THAN_WQ: "REPLICAS_LESS_THAN_WQ",
}


class Registration(StrEnum):
    """Where a bookie is registered in ZooKeeper right now.

    Example:
        >>> Registration("readonly") is Registration.READONLY
        True
    """

    WRITABLE = "writable"
    READONLY = "readonly"
    NONE = "none"


@dataclass(frozen=True)
class BookieSnapshot:
    """One bookie as the simulator knows it: registration, rack, server state, faults and stored entries.

    ``holdings`` maps ledger id → the entry ids the bookie's store holds; a ledger absent from it answers
    ENOLEDGER. ``serving`` is false while the bookie's protocol server is down (killed).

    Example:
        >>> BookieSnapshot("b1", Registration.WRITABLE, "/r1").answers_probes(5.0)
        True
        >>> BookieSnapshot("b1", Registration.WRITABLE, delay_s=9.0).answers_probes(5.0)
        False
    """

    bookie_id: str
    registration: Registration
    rack: str | None = None
    serving: bool = True
    silent: bool = False
    delay_s: float = 0.0
    fail_status: int | None = None
    enoledger_for: frozenset[int] = frozenset()
    holdings: Mapping[int, frozenset[int]] = field(default_factory=dict)
    answers_entry_lists: bool = True  # False: DbLedgerStorage, checked with entry reads
    group: str | None = None  # affinity group in Pulsar's /bookies (None: listed under no group)

    def answers_probes(self, probe_timeout_s: float) -> bool:
        """True when a probe of this bookie gets a usable answer in time (EOK or ENOLEDGER).

        Example:
            >>> BookieSnapshot("b1", Registration.NONE).answers_probes(5.0)
            False
        """
        return (
            self.registration is not Registration.NONE
            and self.serving
            and not self.silent
            and self.fail_status is None
            and self.delay_s < probe_timeout_s
        )

    def never_answers(self, probe_timeout_s: float) -> bool:
        """True when the bookie runs but a probe can only time out (silent, or slower than the timeout).

        Example:
            >>> BookieSnapshot("b1", Registration.WRITABLE, silent=True).never_answers(5.0)
            True
        """
        return self.serving and (self.silent or self.delay_s >= probe_timeout_s)

    def answer_for(self, ledger_id: int, probe_timeout_s: float) -> BookieAnswer:
        """What ``GET_LIST_OF_ENTRIES_OF_LEDGER`` for ``ledger_id`` yields, in the replicas rule's terms.

        Example:
            >>> b = BookieSnapshot("b1", Registration.WRITABLE, holdings={3: frozenset({0})})
            >>> b.answer_for(3, 5.0), b.answer_for(4, 5.0)
            (frozenset({0}), <BookieStatus.NO_LEDGER: 'NO_LEDGER'>)
        """
        if not self.answers_probes(probe_timeout_s):
            return BookieStatus.UNAVAILABLE
        held = self.holdings.get(ledger_id)
        if held is None or ledger_id in self.enoledger_for:
            return BookieStatus.NO_LEDGER
        return held


@dataclass(frozen=True)
class Absence:
    """A time a bookie was registered nowhere: from ``since_ms`` until ``until_ms`` (``None``: still gone).

    Example:
        >>> Absence("b1", 1000, 1500).is_open
        False
    """

    bookie_id: str
    since_ms: int
    until_ms: int | None = None
    serving: bool = False  # the bookie kept serving (its ZooKeeper session expired, the process did not die)

    @property
    def is_open(self) -> bool:
        """True while the bookie is still missing.

        Example:
            >>> Absence("b1", 1000).is_open
            True
        """
        return self.until_ms is None


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything ground truth needs about one moment (``now_ms``, epoch milliseconds).

    ``ledgers`` holds the live, decodable ledgers by id; ``corrupt_ledgers`` the ids whose znode does not
    decode; ``underreplicated`` maps each ``urL`` mark's ledger id to its stored ctime (``None``: no ctime);
    ``absences`` is the history of bookies being missing (closed ones count as flaps); ``audits_ms`` the
    times ``lostBookieRecoveryDelay`` was written again with the value in force or with 0 (a triggered audit,
    as ``bookkeeper shell triggeraudit``), which end the delay of every bookie missing then.

    Example:
        >>> ClusterSnapshot(now_ms=0, bookies={}, ledgers={}).lost_bookie_recovery_delay_s
        0
    """

    now_ms: int
    bookies: Mapping[str, BookieSnapshot]
    ledgers: Mapping[int, LedgerMetadata]
    absences: tuple[Absence, ...] = ()
    corrupt_ledgers: frozenset[int] = frozenset()
    underreplicated: Mapping[int, int | None] = field(default_factory=dict)
    lost_bookie_recovery_delay_s: int = 0
    audits_ms: tuple[int, ...] = ()
    autorecovery: AutoRecoveryZnodes = field(default_factory=AutoRecoveryZnodes)
    auditor_missing_since_ms: int | None = None
    auditor_elected_since_ms: int | None = None
    autorecovery_enabled_since_ms: int | None = None  # when ``disable`` was last deleted (None: never)
    # Pulsar: the znodes under /managed-ledgers by path below it (a managed ledger's, or a cursor's as
    # "<name>/<cursor>"), and each live ledger's creation time.
    managed_znodes: Mapping[str, bytes] = field(default_factory=dict)
    ledger_created_ms: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class TruthParameters:
    """The auditor configuration ground truth assumes (defaults are BookKeeper's where it has one).

    ``under_replication_grace_s`` is the age after which a ``urL`` mark is stuck (``None`` disables the
    kind); ``autorecovery`` holds AutoRecovery's grace periods; ``probe_timeout_s`` is the auditor's probe
    timeout (BookKeeper's ``readEntryTimeoutSec``).

    Example:
        >>> TruthParameters().placement_policy, TruthParameters().probe_timeout_s
        ('rackaware', 5.0)
    """

    placement_policy: str = "rackaware"
    min_racks_per_write_quorum: int = DEFAULT_MIN_RACKS_PER_WRITE_QUORUM
    enforce_min_racks_per_write_quorum: bool = DEFAULT_ENFORCE_MIN_RACKS_PER_WRITE_QUORUM
    min_zones_per_write_quorum: int = DEFAULT_MIN_ZONES_PER_WRITE_QUORUM
    desired_zones_per_write_quorum: int = DEFAULT_DESIRED_ZONES_PER_WRITE_QUORUM
    min_regions_for_durability: int = DEFAULT_MIN_REGIONS_FOR_DURABILITY
    probe_timeout_s: float = 5.0
    under_replication_grace_s: float | None = 600.0
    autorecovery: AutoRecoveryGraces = field(default_factory=AutoRecoveryGraces)
    disruption: DisruptionRule = field(default_factory=DisruptionRule)
    orphan_grace_s: float = 86_400.0

    def __post_init__(self) -> None:
        if self.placement_policy not in POLICIES:
            raise ValueError(f"unknown placement policy {self.placement_policy!r} (one of {POLICIES})")
        if self.probe_timeout_s <= 0:
            raise ValueError("probe_timeout_s must be positive")

    def to_json(self) -> dict[str, Any]:
        """The parameters as a JSON object (echoed in the truth).

        Example:
            >>> TruthParameters().to_json()["under_replication_grace_s"]
            600.0
        """
        return {
            "placement_policy": self.placement_policy,
            "min_racks_per_write_quorum": self.min_racks_per_write_quorum,
            "enforce_min_racks_per_write_quorum": self.enforce_min_racks_per_write_quorum,
            "min_zones_per_write_quorum": self.min_zones_per_write_quorum,
            "desired_zones_per_write_quorum": self.desired_zones_per_write_quorum,
            "min_regions_for_durability": self.min_regions_for_durability,
            "probe_timeout_s": self.probe_timeout_s,
            "under_replication_grace_s": self.under_replication_grace_s,
            "autorecovery_disabled_grace_s": self.autorecovery.disabled_s,
            "auditor_missing_grace_s": self.autorecovery.auditor_missing_s,
            "replication_lock_grace_s": self.autorecovery.lock_held_s,
            "auditor_checks_overdue_grace_s": self.autorecovery.checks_overdue_s,
            "auditor_periodic_check_interval_s": self.autorecovery.check_all_ledgers_interval_s,
            "auditor_periodic_placement_policy_check_interval_s": (
                self.autorecovery.placement_policy_check_interval_s
            ),
            "auditor_periodic_replicas_check_interval_s": self.autorecovery.replicas_check_interval_s,
            "auditor_lagging_grace_s": self.autorecovery.lagging_s,
            "zookeeper_disruption_settle_s": self.disruption.settle_s,
            "zookeeper_disruption_grace_s": self.disruption.grace_s,
            "zookeeper_disruption_share": self.disruption.share,
            "orphan_grace_s": self.orphan_grace_s,
        }


# ------------------------------------------------------------------------------------------ lost bookies


def _missing_intervals(snapshot: ClusterSnapshot) -> dict[str, list[tuple[int, int | None]]]:
    """Every absence per bookie, plus an open one starting now for a missing bookie with no record."""
    intervals: dict[str, list[tuple[int, int | None]]] = {}
    for absence in snapshot.absences:
        intervals.setdefault(absence.bookie_id, []).append((absence.since_ms, absence.until_ms))
    for bookie in snapshot.bookies.values():
        if bookie.registration is Registration.NONE and not any(
            until is None for _, until in intervals.get(bookie.bookie_id, ())
        ):
            intervals.setdefault(bookie.bookie_id, []).append((snapshot.now_ms, None))
    return intervals


def lost_bookies(snapshot: ClusterSnapshot, rule: DisruptionRule = NO_DISRUPTION_RULE) -> dict[str, int]:
    """``{bookie id: missing since (ms)}`` for every bookie a correct auditor treats as lost now.

    Example:
        >>> bookies = {b: BookieSnapshot(b, Registration.NONE) for b in ("b1", "b2")}
        >>> one = ClusterSnapshot(now_ms=2000, bookies={"b1": bookies["b1"]}, ledgers={},
        ...                       absences=(Absence("b1", 1000),), lost_bookie_recovery_delay_s=60)
        >>> lost_bookies(one)
        {}
        >>> two = ClusterSnapshot(now_ms=2000, bookies=bookies, ledgers={},
        ...                       absences=(Absence("b1", 1000), Absence("b2", 1900)),
        ...                       lost_bookie_recovery_delay_s=60)
        >>> lost_bookies(two)
        {'b1': 1000, 'b2': 1900}
    """
    return _lost_in(replayed_membership(snapshot, rule), snapshot)


def _lost_in(membership: BookieMembership, snapshot: ClusterSnapshot) -> dict[str, int]:
    return {
        bookie_id: state.missing_since_ms
        for bookie_id, state in sorted(membership.bookies.items())
        if state.lost and state.missing_since_ms is not None and bookie_id in snapshot.bookies
    }


#: A triggered audit's place among the changes of one instant: after returns, departures and probes.
_AUDIT = 3


def replayed_membership(
    snapshot: ClusterSnapshot,
    rule: DisruptionRule = NO_DISRUPTION_RULE,
    lost_at: dict[str, int] | None = None,
) -> BookieMembership:
    """The registration history replayed through the job's own debounce (one rule, one implementation),
    each absence with the liveness probe the watcher sends when a registration vanishes, and each triggered
    audit after the changes of its instant. ``lost_at``, when given, receives the event time at which each
    bookie lost now was lost (its ledgers' alerts start then).

    Example:
        >>> bookies = {b: BookieSnapshot(b, Registration.NONE) for b in ("b1", "b2", "b3")}
        >>> outage = ClusterSnapshot(now_ms=9000, bookies=bookies, ledgers={},
        ...                          absences=tuple(Absence(b, 1000, serving=True) for b in bookies))
        >>> membership = replayed_membership(outage, DisruptionRule())
        >>> membership.lost(), membership.registration_lost()
        ([], ['b1', 'b2', 'b3'])
        >>> two = {"b1": bookies["b1"], "b2": BookieSnapshot("b2", Registration.WRITABLE)}
        >>> audited = ClusterSnapshot(now_ms=9000, bookies=two, ledgers={}, absences=(Absence("b1", 1000),),
        ...                           lost_bookie_recovery_delay_s=60, audits_ms=(5000,))
        >>> replayed_membership(audited).lost()
        ['b1']
    """
    membership = BookieMembership(default_delay_s=snapshot.lost_bookie_recovery_delay_s, disruption=rule)
    serving = {(a.bookie_id, a.since_ms): a.serving for a in snapshot.absences}
    changes: list[tuple[int, int, str, Membership | None]] = []
    for bookie_id, intervals in _missing_intervals(snapshot).items():
        for since, until in intervals:
            changes.append((since, 1, bookie_id, Membership.GONE))
            changes.append((since, 2, bookie_id, None))  # its liveness probe's answer
            if until is not None:
                changes.append((until, 0, bookie_id, Membership.WRITABLE))
    changes.extend((at_ms, _AUDIT, "", None) for at_ms in snapshot.audits_ms)
    for bookie_id in snapshot.bookies:
        membership.observe(bookie_id, Membership.WRITABLE, at_ms=-1)
    transitions: list[Transition] = []
    # Returns before departures at the same instant: an interval is [since, until).
    for at_ms, order, bookie_id, status in sorted(changes, key=lambda c: c[:3]):
        if order == _AUDIT:
            transitions += membership.trigger_audit(at_ms)
        elif status is None:
            answered = serving.get((bookie_id, at_ms), False)
            transitions += membership.observe_probe(bookie_id, answered=answered, at_ms=at_ms)
        else:
            transitions += membership.observe(bookie_id, status, at_ms)
    transitions += membership.advance(snapshot.now_ms)
    if lost_at is not None:
        for transition in transitions:
            if transition.kind is TransitionKind.LOST:
                lost_at[transition.bookie_id] = transition.at_ms
    return membership


# ------------------------------------------------------------------------------------------- ground truth


def _placement_adherence(
    md: LedgerMetadata,
    racks: Mapping[str, str | None],
    params: TruthParameters,
    cache: dict[tuple[tuple[str, ...], int, int], PlacementAdherence],
) -> PlacementAdherence:
    worst = PlacementAdherence.MEETS_STRICT
    for segment in md.segments:
        key = (segment.ensemble, md.write_quorum, md.ack_quorum)
        adherence = cache.get(key)
        if adherence is None:
            adherence = check_placement(
                params.placement_policy,
                segment.ensemble,
                md.write_quorum,
                md.ack_quorum,
                racks,
                min_racks_per_write_quorum=params.min_racks_per_write_quorum,
                enforce_min_racks_per_write_quorum=params.enforce_min_racks_per_write_quorum,
                min_zones_per_write_quorum=params.min_zones_per_write_quorum,
                desired_zones_per_write_quorum=params.desired_zones_per_write_quorum,
                min_regions_for_durability=params.min_regions_for_durability,
            ).adherence
            cache[key] = adherence
        if adherence.value < worst.value:
            worst = adherence
    return worst


def _isolation_violated(
    md: LedgerMetadata, groups: Mapping[str, str | None], writable: Collection[str]
) -> bool:
    """The core isolation rule on one ledger; a config that does not decode is not judged."""
    config = isolation_config_of(md.custom_metadata).groups
    if config is None:
        return False
    ensembles = [segment.ensemble for segment in md.segments]
    return isolation_verdict(ensembles, md.ensemble_size, config, groups, writable).violated


def _segment_pairs(segments: Iterable[Segment]) -> list[tuple[int, tuple[str, ...]]]:
    return [(segment.first_entry_id, segment.ensemble) for segment in segments]


def open_ledger_lac(
    snapshot: ClusterSnapshot, md: LedgerMetadata, ledger_id: int, timeout: float
) -> int | None:
    """An open ledger's LAC as an auditor learns it: each answering bookie of the last segment reads its last
    entry, whose header carries that entry's id - 1 (the simulated writer had every earlier entry
    acknowledged); -1 from a bookie holding none; the highest wins (None: no bookie answered).

    Example:
        >>> md = LedgerMetadata(ensemble_size=2, write_quorum=2, ack_quorum=2, state=LedgerState.OPEN,
        ...                     segments=(Segment(0, ("b1", "b2")),))
        >>> snapshot = ClusterSnapshot(now_ms=0, bookies={
        ...     "b1": BookieSnapshot("b1", Registration.WRITABLE, holdings={7: frozenset({0, 1, 2})}),
        ...     "b2": BookieSnapshot("b2", Registration.WRITABLE, silent=True)}, ledgers={7: md})
        >>> open_ledger_lac(snapshot, md, 7, 5.0)
        1
    """
    if md.state is not LedgerState.OPEN or not md.segments:
        return None
    views = []
    for bookie_id in dict.fromkeys(md.segments[-1].ensemble):
        bookie = snapshot.bookies.get(bookie_id)
        answer = BookieStatus.UNAVAILABLE if bookie is None else bookie.answer_for(ledger_id, timeout)
        if answer is BookieStatus.UNAVAILABLE:
            continue
        held = () if isinstance(answer, BookieStatus) else tuple(answer)  # type: ignore[arg-type]
        views.append(max(held) - 1 if held else -1)
    return last_add_confirmed(views, md.segments[-1].first_entry_id)


def _replicas_verdict(md: LedgerMetadata, answers: Mapping[str, BookieAnswer], lac: int | None = None) -> Any:
    return classify_replicas(
        ensemble_size=md.ensemble_size,
        write_quorum=md.write_quorum,
        ack_quorum=md.ack_quorum,
        state=md.state.value,
        last_entry_id=md.last_entry_id,
        segments=_segment_pairs(md.segments),
        answers=answers,
        last_add_confirmed=lac,
    )


def _entry_read_answers(
    snapshot: ClusterSnapshot,
    md: LedgerMetadata,
    ledger_id: int,
    timeout: float,
    answers: Mapping[str, BookieAnswer],
    lac: int | None = None,
) -> dict[str, BookieAnswer] | None:
    """``answers`` with each DbLedgerStorage bookie's answer as its fragment ends' reads give it (None when
    the ledger has no such bookie that answers)."""
    readers = [
        b
        for b in md.all_bookies
        if (bookie := snapshot.bookies.get(b)) is not None
        and not bookie.answers_entry_lists
        and bookie.answers_probes(timeout)
    ]
    through = checked_through(md.state.value, md.last_entry_id, lac)
    if not readers or through < 0:
        return None
    planned = entries_to_read(
        _segment_pairs(md.segments),
        ensemble_size=md.ensemble_size,
        write_quorum=md.write_quorum,
        last_entry_id=through,
    )
    reads: dict[str, dict[int, ReadAnswer]] = {}
    for bookie_id in readers:
        answer = answers[bookie_id]
        reads[bookie_id] = {
            e: ReadAnswer.NO_LEDGER
            if isinstance(answer, BookieStatus)
            else (ReadAnswer.PRESENT if e in answer else ReadAnswer.NO_ENTRY)
            for e in planned.get(bookie_id, [])
        }
    return {**answers, **answers_from_reads(reads, through)}


#: BookKeeper's EIO status: the answer of a DbLedgerStorage bookie that lists an entry it cannot read.
_EIO = 501


def _eio_readers_kind(
    snapshot: ClusterSnapshot, md: LedgerMetadata, answers: Mapping[str, BookieAnswer], lac: int | None = None
) -> str | None:
    """The replicas kind when this ledger's DbLedgerStorage bookies failing with ``EIO`` count as holding
    nothing: what entry reads conclude once such a bookie is known to answer reads (its entry lists stay
    unknown), so that kind may be raised."""
    failing = [
        b
        for b in md.all_bookies
        if (bookie := snapshot.bookies.get(b)) is not None
        and bookie.fail_status == _EIO
        and not bookie.answers_entry_lists
        and bookie.serving
        and bookie.registration is not Registration.NONE
    ]
    if not failing:
        return None
    return _REPLICAS_KIND.get(
        _replicas_verdict(md, {**answers, **dict.fromkeys(failing, BookieStatus.NO_LEDGER)}, lac).result
    )


#: How far from its deadline an AutoRecovery condition counts as either way (the two clocks differ).
_DEADLINE_SLACK_MS = 1000


def _unmarked_at_risk(
    snapshot: ClusterSnapshot, at_risk: Iterable[int], lost_at: Mapping[str, int], *, latest: bool
) -> UnmarkedAtRisk:
    """The at-risk ledgers without a ``urL`` mark, each at risk since a loss of a bookie it names: the
    latest (``latest``: its alert may have started anew when another bookie was lost, UNDER_REPLICATED
    turning UNRECOVERABLE) or the earliest. A bookie lost without a known time (named, never registered)
    counts as lost now, or at 0."""
    ids, since = [], []
    for ledger_id in sorted(at_risk):
        times = [
            lost_at.get(b, snapshot.now_ms if latest else 0)
            for b in snapshot.ledgers[ledger_id].all_bookies
            if b in lost_at or b not in snapshot.bookies
        ]
        ids.append(ledger_id)
        since.append(max(times) if latest else min(times))
    marked = [ledger_id in snapshot.underreplicated for ledger_id in ids]
    return unmarked_at_risk(ids, since, marked)


def _autorecovery_truth(
    snapshot: ClusterSnapshot,
    graces: AutoRecoveryGraces,
    alerts: dict[str, set[Any]],
    may: dict[str, set[Any]],
    lagging: tuple[UnmarkedAtRisk, UnmarkedAtRisk] = (UnmarkedAtRisk(), UnmarkedAtRisk()),
) -> None:
    """AutoRecovery's due conditions into ``alerts``, those near their deadline into ``may``. ``lagging``:
    the unmarked at-risk ledgers dated by their latest and by their earliest possible start."""
    znodes, missing_since = snapshot.autorecovery, snapshot.auditor_missing_since_ms
    elected_since = snapshot.auditor_elected_since_ms
    active_since = auditor_active_since(
        znodes.auditor,
        znodes.disabled_since_ms is not None,
        elected_since,
        snapshot.autorecovery_enabled_since_ms,
    )

    def due_at(now_ms: int, unmarked: UnmarkedAtRisk) -> set[tuple[str, int | None]]:
        due = due_conditions(
            znodes,
            missing_since,
            now_ms,
            graces,
            elected_since,
            unmarked=unmarked,
            auditor_active_since_ms=active_since,
        )
        return {c.key for c in due}

    late = due_at(snapshot.now_ms - _DEADLINE_SLACK_MS, lagging[0])
    early = due_at(snapshot.now_ms + _DEADLINE_SLACK_MS, lagging[1])
    holding = holding_conditions(
        znodes,
        missing_since,
        graces=graces,
        auditor_elected_since_ms=elected_since,
        unmarked=lagging[1],
        auditor_active_since_ms=active_since,
    )
    for condition in holding:
        subject = condition.ledger_id if condition.ledger_id is not None else condition.kind.cluster_entity
        if condition.key in late:
            alerts[condition.kind.value].add(subject)
        elif condition.key in early:
            may[condition.kind.value].add(subject)


def _topics_truth(snapshot: ClusterSnapshot, params: TruthParameters, alerts: dict[str, set[Any]]) -> None:
    """``TOPIC_LEDGER_MISSING`` and ``LEDGER_ORPHANED`` by the job's rule (:mod:`core.domain.rules.topics`),
    once their grace periods have passed (the truth has no event-time grace: a listed ledger that is
    absent is required). Undecodable managed-ledger znodes list nothing (their ``METADATA_CORRUPT`` is the
    job's, by topic, and not in this truth)."""
    listings: dict[str, Listing] = {}
    cursors: dict[str, dict[str, int | None]] = {}
    for path, data in sorted(snapshot.managed_znodes.items()):
        if pulsar_topic_from_managed_ledger(path) is not None:
            with contextlib.suppress(FormatError):
                listings[path] = Listing(decode_managed_ledger_info(data).ledgers, {})
        else:
            name, _, cursor = path.rpartition("/")
            with contextlib.suppress(FormatError):
                cursors.setdefault(name, {})[cursor] = decode_managed_cursor_info(data).cursor_ledger_id
    for name, found in cursors.items():
        if name in listings:
            listings[name] = Listing(listings[name].ledgers, found)
    if not listings:
        return
    listed = listed_table(listings)
    live = np.array(sorted(set(snapshot.ledgers) | set(snapshot.corrupt_ledgers)), np.int64)
    missing = missing_pairs(listed, live)
    alerts["TOPIC_LEDGER_MISSING"].update(
        f"{n}/{i}"
        for n, i in zip(missing["managed_ledger"].to_pylist(), missing["ledger_id"].to_pylist(), strict=True)
    )
    ids = sorted(snapshot.ledgers)
    ledgers = pa.table(
        {
            "ledger_id": pa.array(ids, pa.int64()),
            "pulsar_topic": pa.array([snapshot.ledgers[i].pulsar_topic for i in ids], pa.string()),
            "ctime_ms": pa.array([snapshot.ledger_created_ms.get(i) for i in ids], pa.int64()),
            "length": pa.array([snapshot.ledgers[i].length for i in ids], pa.int64()),
            "component": pa.array(
                [
                    component_of([{"key": k, "value": v} for k, v in snapshot.ledgers[i].custom_metadata])
                    for i in ids
                ],
                pa.string(),
            ),
        }
    )
    orphans = orphaned_ledgers(ledgers, listed, snapshot.now_ms, int(params.orphan_grace_s * 1000))
    alerts["LEDGER_ORPHANED"].update(orphans["ledger_id"].to_pylist())


def ground_truth(snapshot: ClusterSnapshot, params: TruthParameters | None = None) -> dict[str, Any]:
    """What a correct auditor must (``alerts``) and may (``may_alert``) flag at ``snapshot.now_ms``.

    Returns a JSON-serialisable object: ``at_ms``, ``parameters``, ``lost_bookie_recovery_delay_s``,
    ``alerts`` and ``may_alert`` (every kind, sorted ids), ``counts`` (per kind), ``bookies`` (per bookie:
    registration, rack, missing_since_ms, lost, flaps) and ``ledgers`` (how many per state, corrupt).
    No password is read, so none can leak.

    Example:
        >>> snapshot = ClusterSnapshot(now_ms=0, bookies={}, ledgers={}, corrupt_ledgers=frozenset({4}))
        >>> truth = ground_truth(snapshot)
        >>> truth["alerts"]["METADATA_CORRUPT"], truth["counts"]["BOOKIE_LOST"]
        ([4], 0)
    """
    params = params or TruthParameters()
    alerts: dict[str, set[Any]] = {kind: set() for kind in ALERT_KINDS}
    may: dict[str, set[Any]] = {kind: set() for kind in ALERT_KINDS}
    timeout = params.probe_timeout_s

    lost_at: dict[str, int] = {}
    membership = replayed_membership(snapshot, params.disruption, lost_at)
    lost = _lost_in(membership, snapshot)
    if membership.registration_lost():
        alerts["ZOOKEEPER_DISRUPTION"].add(AlertKind.ZOOKEEPER_DISRUPTION.cluster_entity)
    # A bookie named by a ledger but unknown to the snapshot never registered: lost from the start.
    for md in snapshot.ledgers.values():
        for bookie_id in md.all_bookies:
            if bookie_id not in snapshot.bookies:
                lost.setdefault(bookie_id, snapshot.now_ms)
    lost_set = frozenset(lost)
    alerts["BOOKIE_LOST"].update(lost_set)

    racks = {bookie_id: bookie.rack for bookie_id, bookie in snapshot.bookies.items()}
    groups = {bookie_id: bookie.group for bookie_id, bookie in snapshot.bookies.items()}
    writable = {b for b, bookie in snapshot.bookies.items() if bookie.registration is Registration.WRITABLE}
    placement_cache: dict[tuple[tuple[str, ...], int, int], PlacementAdherence] = {}
    expected_but_unknown: set[str] = set()
    states = {state.value: 0 for state in LedgerState}

    for ledger_id, md in snapshot.ledgers.items():
        if ledger_id in snapshot.corrupt_ledgers:
            continue
        states[md.state.value] += 1
        if not lost_set.isdisjoint(md.all_bookies):
            recoverable = md.is_recoverable(lost_set)
            alerts["LEDGER_UNDER_REPLICATED" if recoverable else "LEDGER_UNRECOVERABLE"].add(ledger_id)
        if md.state is LedgerState.CLOSED:
            adherence = _placement_adherence(md, racks, params, placement_cache)
            if adherence is PlacementAdherence.FAIL:
                alerts["PLACEMENT_NOT_ADHERING"].add(ledger_id)
            elif adherence is PlacementAdherence.MEETS_SOFT:
                alerts["PLACEMENT_SOFT"].add(ledger_id)
        if _isolation_violated(md, groups, writable):
            alerts["PLACEMENT_ISOLATION_VIOLATED"].add(ledger_id)
        lac = open_ledger_lac(snapshot, md, ledger_id, timeout)
        if checked_through(md.state.value, md.last_entry_id, lac) < 0:
            continue
        answers: dict[str, BookieAnswer] = {}
        for bookie_id in md.all_bookies:
            bookie = snapshot.bookies.get(bookie_id)
            answers[bookie_id] = (
                BookieStatus.UNAVAILABLE if bookie is None else bookie.answer_for(ledger_id, timeout)
            )
        verdict = _replicas_verdict(md, answers, lac)
        kind = _REPLICAS_KIND.get(verdict.result)
        read_answers = _entry_read_answers(snapshot, md, ledger_id, timeout, answers, lac)
        seen = _REPLICAS_KIND.get(_replicas_verdict(md, read_answers, lac).result) if read_answers else kind
        if seen != kind:  # entry reads may miss what the holdings show: either kind may be raised
            may.update({k: may[k] | {ledger_id} for k in (kind, seen) if k is not None})
        elif kind is not None:
            alerts[kind].add(ledger_id)
        unreadable = _eio_readers_kind(snapshot, md, answers, lac)
        if unreadable is not None:
            may[unreadable].add(ledger_id)
        expected_but_unknown.update(verdict.unknown_bookies)

    for bookie_id, bookie in snapshot.bookies.items():
        if bookie.registration is Registration.NONE:
            continue
        if bookie.never_answers(timeout):
            target = alerts if bookie_id in expected_but_unknown else may
            target["BOOKIE_UNRESPONSIVE"].add(bookie_id)
        elif not bookie.serving or bookie.fail_status is not None:
            may["BOOKIE_UNRESPONSIVE"].add(bookie_id)

    if params.under_replication_grace_s is not None:
        grace_ms = params.under_replication_grace_s * 1000
        for ledger_id, ctime in snapshot.underreplicated.items():
            if ctime is not None and snapshot.now_ms - ctime > grace_ms:
                alerts["UNDER_REPLICATION_STUCK"].add(ledger_id)
    alerts["METADATA_CORRUPT"].update(snapshot.corrupt_ledgers)
    at_risk = alerts["LEDGER_UNDER_REPLICATED"] | alerts["LEDGER_UNRECOVERABLE"]
    lagging = (
        _unmarked_at_risk(snapshot, at_risk, lost_at, latest=True),
        _unmarked_at_risk(snapshot, at_risk, lost_at, latest=False),
    )
    _topics_truth(snapshot, params, alerts)
    _autorecovery_truth(snapshot, params.autorecovery, alerts, may, lagging)

    flaps: dict[str, int] = {}
    for absence in snapshot.absences:
        if not absence.is_open:
            flaps[absence.bookie_id] = flaps.get(absence.bookie_id, 0) + 1
    open_since = {a.bookie_id: a.since_ms for a in snapshot.absences if a.is_open}
    bookies_doc = {
        bookie_id: {
            "registration": bookie.registration.value,
            "rack": bookie.rack,
            "serving": bookie.serving,
            "missing_since_ms": (
                open_since.get(bookie_id, snapshot.now_ms)
                if bookie.registration is Registration.NONE
                else None
            ),
            "lost": bookie_id in lost_set,
            "flaps": flaps.get(bookie_id, 0),
        }
        for bookie_id, bookie in sorted(snapshot.bookies.items())
    }
    return {
        "at_ms": snapshot.now_ms,
        "parameters": params.to_json(),
        "lost_bookie_recovery_delay_s": snapshot.lost_bookie_recovery_delay_s,
        "alerts": {kind: sorted(ids) for kind, ids in alerts.items()},
        "may_alert": {kind: sorted(ids) for kind, ids in may.items()},
        "counts": {kind: len(ids) for kind, ids in alerts.items()},
        "bookies": bookies_doc,
        "ledgers": {
            "live": sum(states.values()),
            **{state.lower(): count for state, count in states.items()},
            "corrupt": len(snapshot.corrupt_ledgers),
            "underreplication_marks": len(snapshot.underreplicated),
        },
    }


def what_if_truth(snapshot: ClusterSnapshot, down: Iterable[str]) -> dict[str, list[int]]:
    """What ``bkaudit query what-if`` must answer: per verdict, the ledgers naming a ``down`` bookie.

    With the ``down`` bookies gone, and those already gone (not registered, or named by a ledger but unknown
    to the snapshot): ``UNRECOVERABLE`` when ``is_recoverable`` is false, ``BELOW_ACK_QUORUM`` when some
    entry keeps fewer copies than the ack quorum (``fewest_copies_left``), else ``UNDER_REPLICATED``.
    Corrupt ledgers are not graded (nobody can read their bookies).

    Example:
        >>> md = LedgerMetadata(ensemble_size=2, write_quorum=2, ack_quorum=2, state=LedgerState.CLOSED,
        ...                     last_entry_id=1, length=2, segments=(Segment(0, ("b1", "b2")),))
        >>> snapshot = ClusterSnapshot(now_ms=0, ledgers={7: md}, bookies={
        ...     "b1": BookieSnapshot("b1", Registration.WRITABLE, "/r1"),
        ...     "b2": BookieSnapshot("b2", Registration.WRITABLE, "/r1")})
        >>> what_if_truth(snapshot, ["b1"])
        {'UNRECOVERABLE': [], 'BELOW_ACK_QUORUM': [7], 'UNDER_REPLICATED': []}
    """
    down_set = frozenset(down)
    gone = set(down_set)
    gone.update(b for b, bookie in snapshot.bookies.items() if bookie.registration is Registration.NONE)
    graded: dict[str, list[int]] = {"UNRECOVERABLE": [], "BELOW_ACK_QUORUM": [], "UNDER_REPLICATED": []}
    for ledger_id, md in sorted(snapshot.ledgers.items()):
        if ledger_id in snapshot.corrupt_ledgers or down_set.isdisjoint(md.all_bookies):
            continue
        gone_here = gone | {b for b in md.all_bookies if b not in snapshot.bookies}
        fewest = md.fewest_copies_left(gone_here)
        if not md.is_recoverable(gone_here):
            graded["UNRECOVERABLE"].append(ledger_id)
        elif fewest is not None and fewest < md.ack_quorum:
            graded["BELOW_ACK_QUORUM"].append(ledger_id)
        else:
            graded["UNDER_REPLICATED"].append(ledger_id)
    return graded
