"""Is anything repairing? AutoRecovery's health from its own znodes, with grace periods in event time.

BookKeeper's AutoRecovery keeps its state under ``<root>/underreplication``
(:mod:`core.domain.underreplication`): the ``disable`` znode switches re-replication off, the
``auditorelection`` votes elect the Auditor (the lowest sequence number wins), and every ReplicationWorker
holds a ``locks/urL<id>`` znode while it re-replicates a ledger. Three conditions mean nothing is being
repaired, whatever else the auditor alerts:

- ``AUTORECOVERY_DISABLED``: ``disable`` exists; it started when the znode was created (its ctime);
- ``AUDITOR_MISSING``: no vote while at least one bookie is registered; it started when both became true
  (never before AutoRecovery's state was observed at all);
- ``REPLICATION_STALLED``: one per ledger whose lock has been held since its ctime (a fragment takes seconds
  to copy, so a lock held for long means a stuck worker).

A fourth asks whether the elected Auditor does its periodic work. It records when each periodic check last
completed in a binary znode (``checkallledgersctime``, ``placementpolicycheckctime``,
``replicascheckctime``, :class:`~core.domain.underreplication.CtimeZnode`):

- ``AUDITOR_CHECKS_OVERDUE``: one for the cluster while an Auditor is elected, AutoRecovery is on and a
  check whose configured interval is above 0 has not completed when due. A check is due at
  ``max(last completion + interval, elected)``, where ``elected`` is since when the job has seen the
  current Auditor elected: BookKeeper's Auditor, once elected, runs at once a check that never ran or
  whose last run is older than its interval, and the next one an interval after the last (its
  ``initialDelay``). A check that never ran (no znode, or no time in it) is therefore due at ``elected``.
  The condition holds since the earliest due time among the checks; its detail names each check with its
  last completion and due time, and, when it fires, the ones overdue past the grace. While ``disable``
  exists the Auditor skips its checks and ``AUTORECOVERY_DISABLED`` says why, so this one does not hold.

A fifth asks whether the Auditor marks what it should (:mod:`core.domain.rules.auditor_lag`):

- ``AUDITOR_LAGGING``: one for the cluster while some ledger bkaudit finds at risk (an open
  ``LEDGER_UNDER_REPLICATED`` or ``LEDGER_UNRECOVERABLE``, started when its bookie was lost, after
  ``lostBookieRecoveryDelay``) has had no under-replication mark for the grace, counted from the later of
  its start and since when the Auditor can mark (elected, AutoRecovery on:
  :func:`~core.domain.rules.auditor_lag.auditor_active_since`). The caller feeds the summary of the
  unmarked at-risk ledgers (:meth:`AutoRecoveryHealth.set_unmarked`). Without an Auditor, or with
  AutoRecovery off, it does not hold: ``AUDITOR_MISSING`` or ``AUTORECOVERY_DISABLED`` says why. Unlike the
  others it keeps its alert while the list of ledgers unmarked past the grace stays non-empty, whichever
  ledgers are on it, and resolves when the list is empty (ledgers marked, healed or deleted).

Each fires once it has held for its grace period (a grace of 0 turns its check off) and resolves when the
condition clears, or when it changes its start (a lock taken anew, the overdue check completing while
another is still overdue: the first alert resolves and the next fires at once with a new id).
:func:`due_conditions` is the rule (the simulator's ground truth calls it); :class:`AutoRecoveryHealth` is
the job's state machine around it: it remembers since when each condition holds, fires at the event time
that passes the grace, and resolves at the event time the znodes changed.
Pure: no I/O, no clock.

Example:
    >>> graces = AutoRecoveryGraces(disabled_s=60, auditor_missing_s=0, lock_held_s=0)
    >>> health = AutoRecoveryHealth(graces)
    >>> health.observe(AutoRecoveryZnodes(disabled_since_ms=1_000), at_ms=2_000)
    []
    >>> [(t.kind.value, t.firing) for t in health.advance(61_000)]
    [('AUTORECOVERY_DISABLED', True)]
    >>> [(t.kind.value, t.firing) for t in health.observe(AutoRecoveryZnodes(), at_ms=70_000)]
    [('AUTORECOVERY_DISABLED', False)]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.domain.alerts import AlertKind
from core.domain.rules.auditor_lag import UnmarkedAtRisk, auditor_active_since, lagging_since_ms
from core.domain.underreplication import CtimeZnode

AUTORECOVERY_KINDS = frozenset(
    {
        AlertKind.AUTORECOVERY_DISABLED,
        AlertKind.AUDITOR_MISSING,
        AlertKind.REPLICATION_STALLED,
        AlertKind.AUDITOR_CHECKS_OVERDUE,
        AlertKind.AUDITOR_LAGGING,
    }
)
"""The alert kinds of this rule."""


@dataclass(frozen=True)
class AutoRecoveryGraces:
    """How long each condition must hold before it fires, in seconds; 0 turns that check off. Also the
    intervals the cluster's Auditor runs its periodic checks with (BookKeeper's
    ``auditorPeriodicCheckInterval``, ``auditorPeriodicPlacementPolicyCheckInterval`` and
    ``auditorPeriodicReplicasCheckInterval``, seconds, defaults BookKeeper's: weekly, off, off); a check
    with an interval of 0 is off and never overdue. ``lagging_s``: how long an at-risk ledger may go
    unmarked (``AUDITOR_LAGGING``, the same grace as ``bkaudit query auditor-diff --grace``).

    Example:
        >>> AutoRecoveryGraces().grace_ms(AlertKind.AUDITOR_MISSING)
        300000
        >>> AutoRecoveryGraces().check_interval_ms(CtimeZnode.CHECK_ALL_LEDGERS)
        604800000
    """

    disabled_s: float = 900.0
    auditor_missing_s: float = 300.0
    lock_held_s: float = 1800.0
    checks_overdue_s: float = 86400.0
    check_all_ledgers_interval_s: float = 604800.0
    placement_policy_check_interval_s: float = 0.0
    replicas_check_interval_s: float = 0.0
    lagging_s: float = 600.0

    def grace_ms(self, kind: AlertKind) -> int:
        """The grace of ``kind`` in milliseconds (0: the check is off).

        Example:
            >>> AutoRecoveryGraces(lock_held_s=1.5).grace_ms(AlertKind.REPLICATION_STALLED)
            1500
        """
        seconds = {
            AlertKind.AUTORECOVERY_DISABLED: self.disabled_s,
            AlertKind.AUDITOR_MISSING: self.auditor_missing_s,
            AlertKind.REPLICATION_STALLED: self.lock_held_s,
            AlertKind.AUDITOR_CHECKS_OVERDUE: self.checks_overdue_s,
            AlertKind.AUDITOR_LAGGING: self.lagging_s,
        }[kind]
        return round(seconds * 1000)

    def check_interval_ms(self, check: CtimeZnode) -> int:
        """The interval of one of the Auditor's periodic checks in milliseconds (0: the check is off).

        Example:
            >>> AutoRecoveryGraces(replicas_check_interval_s=60).check_interval_ms(CtimeZnode.REPLICAS_CHECK)
            60000
        """
        seconds = {
            CtimeZnode.CHECK_ALL_LEDGERS: self.check_all_ledgers_interval_s,
            CtimeZnode.PLACEMENT_POLICY_CHECK: self.placement_policy_check_interval_s,
            CtimeZnode.REPLICAS_CHECK: self.replicas_check_interval_s,
        }[check]
        return round(seconds * 1000)


@dataclass(frozen=True)
class ReplicationLock:
    """One ``locks/urL<id>`` znode: who holds it (the worker's host name, if it said) and since when (ms).

    Example:
        >>> ReplicationLock("worker-1", 1_000).since_ms
        1000
    """

    holder: str | None
    since_ms: int


@dataclass(frozen=True)
class AutoRecoveryZnodes:
    """AutoRecovery's znodes at one moment: ``disable``'s creation time (None: absent), the elected Auditor
    (the lowest vote's bookie id, ``""`` when the vote does not say; None: no vote), the locks by ledger and
    when each of the Auditor's periodic checks last completed (ms, the Auditor's clock; a check not in
    ``checks`` never ran as far as its znode tells).

    Example:
        >>> AutoRecoveryZnodes(auditor="10.0.0.1:3181").auditor
        '10.0.0.1:3181'
    """

    disabled_since_ms: int | None = None
    auditor: str | None = None
    locks: Mapping[int, ReplicationLock] = field(default_factory=dict)
    checks: Mapping[CtimeZnode, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Condition:
    """A condition that holds: its kind, its ledger (REPLICATION_STALLED only) and since when (which may
    lie ahead for AUDITOR_CHECKS_OVERDUE: the check is not due yet, the condition is pending).

    Example:
        >>> Condition(AlertKind.AUDITOR_MISSING, None, 5).key
        ('AUDITOR_MISSING', None)
    """

    kind: AlertKind
    ledger_id: int | None
    since_ms: int
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, int | None]:
        """What identifies the condition while it holds (its kind and ledger)."""
        return self.kind.value, self.ledger_id


def checks_condition(
    znodes: AutoRecoveryZnodes, auditor_elected_since_ms: int | None, graces: AutoRecoveryGraces
) -> Condition | None:
    """``AUDITOR_CHECKS_OVERDUE``'s condition, pending or holding: since the earliest time a check with an
    interval above 0 was due to complete (None: no Auditor elected, AutoRecovery off, or every check off).

    ``auditor_elected_since_ms`` is since when the current Auditor is elected (as far as the caller saw).

    Example:
        >>> graces = AutoRecoveryGraces(check_all_ledgers_interval_s=10, replicas_check_interval_s=5)
        >>> znodes = AutoRecoveryZnodes(auditor="b1", checks={CtimeZnode.CHECK_ALL_LEDGERS: 4_000})
        >>> condition = checks_condition(znodes, 1_000, graces)
        >>> condition.since_ms, sorted(condition.detail["checks"])
        (1000, ['checkallledgersctime', 'replicascheckctime'])
        >>> condition.detail["checks"]["checkallledgersctime"]["due_ms"]
        14000
        >>> checks_condition(AutoRecoveryZnodes(), 1_000, graces) is None  # no Auditor
        True
    """
    if znodes.auditor is None or auditor_elected_since_ms is None or znodes.disabled_since_ms is not None:
        return None
    checks: dict[str, dict[str, Any]] = {}
    for check in CtimeZnode:
        interval = graces.check_interval_ms(check)
        if interval <= 0:
            continue
        last = znodes.checks.get(check)
        due = auditor_elected_since_ms if last is None else max(last + interval, auditor_elected_since_ms)
        checks[check.value] = {"last_completed_ms": last, "interval_s": interval / 1000, "due_ms": due}
    if not checks:
        return None
    since = min(check["due_ms"] for check in checks.values())
    return Condition(AlertKind.AUDITOR_CHECKS_OVERDUE, None, since, {"checks": checks})


def lagging_condition(
    znodes: AutoRecoveryZnodes, unmarked: UnmarkedAtRisk, auditor_active_since_ms: int | None
) -> Condition | None:
    """``AUDITOR_LAGGING``'s condition, pending or holding: since the later of the oldest unmarked at-risk
    ledger's start and ``auditor_active_since_ms`` (since when the Auditor can mark); None when nothing is
    unmarked, no Auditor is elected or AutoRecovery is off.

    Example:
        >>> unmarked = UnmarkedAtRisk(count=3, oldest_since_ms=5_000, sample=(9, 4, 6))
        >>> condition = lagging_condition(AutoRecoveryZnodes(auditor="b1"), unmarked, 1_000)
        >>> condition.since_ms, condition.detail["unmarked_ledgers"], condition.detail["sample_ledger_ids"]
        (5000, 3, [9, 4, 6])
        >>> lagging_condition(AutoRecoveryZnodes(auditor="b1", disabled_since_ms=1), unmarked, 1_000) is None
        True
    """
    if znodes.auditor is None or znodes.disabled_since_ms is not None:
        return None
    since = lagging_since_ms(unmarked, auditor_active_since_ms)
    if since is None:
        return None
    detail = {
        "unmarked_ledgers": unmarked.count,
        "oldest_at_risk_since_ms": unmarked.oldest_since_ms,
        "sample_ledger_ids": list(unmarked.sample),
        "auditor": znodes.auditor,
        "auditor_active_since_ms": auditor_active_since_ms,
    }
    return Condition(AlertKind.AUDITOR_LAGGING, None, since, detail)


def holding_conditions(
    znodes: AutoRecoveryZnodes,
    auditor_missing_since_ms: int | None,
    *,
    graces: AutoRecoveryGraces | None = None,
    auditor_elected_since_ms: int | None = None,
    unmarked: UnmarkedAtRisk | None = None,
    auditor_active_since_ms: int | None = None,
) -> list[Condition]:
    """Every condition that holds now, whatever its age (``auditor_missing_since_ms``: since when no vote
    was seen while bookies ran, None when an Auditor is elected or no bookie runs). The Auditor's checks
    are judged only with ``graces`` (their intervals) and ``auditor_elected_since_ms``
    (:func:`checks_condition`); its marks only with ``unmarked`` and ``auditor_active_since_ms``
    (:func:`lagging_condition`).

    Example:
        >>> locks = {7: ReplicationLock("w1", 100)}
        >>> [c.key for c in holding_conditions(AutoRecoveryZnodes(locks=locks), None)]
        [('REPLICATION_STALLED', 7)]
    """
    conditions: list[Condition] = []
    if znodes.disabled_since_ms is not None:
        conditions.append(Condition(AlertKind.AUTORECOVERY_DISABLED, None, znodes.disabled_since_ms))
    if auditor_missing_since_ms is not None:
        conditions.append(Condition(AlertKind.AUDITOR_MISSING, None, auditor_missing_since_ms))
    for ledger_id in sorted(znodes.locks):
        lock = znodes.locks[ledger_id]
        conditions.append(
            Condition(AlertKind.REPLICATION_STALLED, ledger_id, lock.since_ms, {"holder": lock.holder})
        )
    if graces is not None:
        overdue = checks_condition(znodes, auditor_elected_since_ms, graces)
        if overdue is not None:
            conditions.append(overdue)
    if unmarked is not None:
        lagging = lagging_condition(znodes, unmarked, auditor_active_since_ms)
        if lagging is not None:
            conditions.append(lagging)
    return conditions


def due_at_ms(condition: Condition, graces: AutoRecoveryGraces) -> int | None:
    """The event time at which ``condition`` fires if it still holds (None: its check is off).

    Example:
        >>> disabled = Condition(AlertKind.AUTORECOVERY_DISABLED, None, 1_000)
        >>> due_at_ms(disabled, AutoRecoveryGraces(disabled_s=2))
        3000
    """
    grace = graces.grace_ms(condition.kind)
    return condition.since_ms + grace if grace > 0 else None


def due_conditions(
    znodes: AutoRecoveryZnodes,
    auditor_missing_since_ms: int | None,
    now_ms: int,
    graces: AutoRecoveryGraces,
    auditor_elected_since_ms: int | None = None,
    *,
    unmarked: UnmarkedAtRisk | None = None,
    auditor_active_since_ms: int | None = None,
) -> list[Condition]:
    """The conditions that must be alerting at ``now_ms``: holding for at least their grace.

    Example:
        >>> znodes = AutoRecoveryZnodes(disabled_since_ms=0, locks={3: ReplicationLock(None, 5_000)})
        >>> [c.key for c in due_conditions(znodes, 1_000, 6_000, AutoRecoveryGraces(5, 5, 5))]
        [('AUTORECOVERY_DISABLED', None), ('AUDITOR_MISSING', None)]
        >>> checked = AutoRecoveryZnodes(auditor="b1", checks={CtimeZnode.CHECK_ALL_LEDGERS: 0})
        >>> weekly = AutoRecoveryGraces(checks_overdue_s=3600)
        >>> [c.key for c in due_conditions(checked, None, 608_400_000, weekly, auditor_elected_since_ms=0)]
        [('AUDITOR_CHECKS_OVERDUE', None)]
        >>> due_conditions(checked, None, 608_399_999, weekly, auditor_elected_since_ms=0)
        []
        >>> unmarked = UnmarkedAtRisk(count=1, oldest_since_ms=10_000, sample=(7,))
        >>> [c.key for c in due_conditions(AutoRecoveryZnodes(auditor="b1"), None, 610_000,
        ...     AutoRecoveryGraces(), unmarked=unmarked, auditor_active_since_ms=0)]
        [('AUDITOR_LAGGING', None)]
    """
    holding = holding_conditions(
        znodes,
        auditor_missing_since_ms,
        graces=graces,
        auditor_elected_since_ms=auditor_elected_since_ms,
        unmarked=unmarked,
        auditor_active_since_ms=auditor_active_since_ms,
    )
    return [
        condition
        for condition in holding
        if (due := due_at_ms(condition, graces)) is not None and now_ms >= due
    ]


@dataclass(frozen=True)
class HealthTransition:
    """A condition fired (``firing``) or cleared, at event time ``at_ms``, with the alert's detail.

    Example:
        >>> HealthTransition(AlertKind.AUDITOR_MISSING, None, True, 9, {}).firing
        True
    """

    kind: AlertKind
    ledger_id: int | None
    firing: bool
    at_ms: int
    detail: Mapping[str, Any]


def _detail(condition: Condition, graces: AutoRecoveryGraces, now_ms: int) -> dict[str, Any]:
    detail = {
        **condition.detail,
        "since_ms": condition.since_ms,
        "grace_s": graces.grace_ms(condition.kind) / 1000,
    }
    if condition.kind is AlertKind.AUDITOR_CHECKS_OVERDUE:
        grace = graces.grace_ms(condition.kind)
        checks = condition.detail["checks"]
        detail["overdue"] = sorted(name for name, c in checks.items() if now_ms >= c["due_ms"] + grace)
    return detail


class AutoRecoveryHealth:
    """The job's state machine: feed it the znodes (:meth:`observe`), whether bookies run
    (:meth:`set_bookies_running`), the unmarked at-risk ledgers (:meth:`set_unmarked`) and event time
    (:meth:`advance`); each returns the transitions it caused.
    State round-trips through :meth:`to_json` / :meth:`from_json` (a few hundred bytes).

    Example:
        >>> health = AutoRecoveryHealth(AutoRecoveryGraces(auditor_missing_s=10))
        >>> health.set_bookies_running(True, at_ms=0)
        []
        >>> health.observe(AutoRecoveryZnodes(auditor=None), at_ms=1_000)  # no vote from now on
        []
        >>> health.next_deadline_ms()
        11000
        >>> [t.kind.value for t in health.advance(11_000)]
        ['AUDITOR_MISSING']
    """

    def __init__(self, graces: AutoRecoveryGraces) -> None:
        self.graces = graces
        self.znodes: AutoRecoveryZnodes | None = None  # None: never observed (no alert can hold)
        self.bookies_running = False
        self.auditor_missing_since_ms: int | None = None
        # Since when the current Auditor has been seen elected (None: none is, or not seen since a restore
        # of a state saved before this was kept).
        self.auditor_elected_since_ms: int | None = None
        # Since when the job has seen AutoRecovery on (no ``disable``; None: off, or not seen since a restore
        # of a state saved before this was kept) and the unmarked at-risk ledgers last fed (AUDITOR_LAGGING).
        self.autorecovery_enabled_since_ms: int | None = None
        self.unmarked = UnmarkedAtRisk()
        self.firing: dict[tuple[str, int | None], int] = {}  # condition key -> since_ms of the fired one

    # -- inputs ---------------------------------------------------------------------------------------------
    def observe(self, znodes: AutoRecoveryZnodes, at_ms: int) -> list[HealthTransition]:
        """AutoRecovery's znodes as read at event time ``at_ms``."""
        previous = self.znodes.auditor if self.znodes is not None else None
        was_enabled = self.znodes is not None and self.znodes.disabled_since_ms is None
        self.znodes = znodes
        if znodes.auditor is None:
            self.auditor_elected_since_ms = None
        elif znodes.auditor != previous or self.auditor_elected_since_ms is None:
            self.auditor_elected_since_ms = at_ms  # another Auditor schedules its checks anew
        if znodes.disabled_since_ms is not None:
            self.autorecovery_enabled_since_ms = None
        elif not was_enabled:
            self.autorecovery_enabled_since_ms = at_ms  # the Auditor resumes its audits from now
        return self._update_auditor(at_ms) + self.advance(at_ms)

    def set_unmarked(self, unmarked: UnmarkedAtRisk) -> None:
        """The at-risk ledgers with no under-replication mark, as they are now; the next :meth:`advance`
        fires or resolves ``AUDITOR_LAGGING`` with them."""
        self.unmarked = unmarked

    @property
    def auditor_active_since_ms(self) -> int | None:
        """Since when the Auditor can mark (elected, AutoRecovery on), as far as the job saw."""
        if self.znodes is None:
            return None
        return auditor_active_since(
            self.znodes.auditor,
            self.znodes.disabled_since_ms is not None,
            self.auditor_elected_since_ms,
            self.autorecovery_enabled_since_ms,
        )

    def set_bookies_running(self, running: bool, at_ms: int) -> list[HealthTransition]:
        """Whether at least one bookie is registered (writable or read-only) from ``at_ms`` on."""
        self.bookies_running = running
        return self._update_auditor(at_ms) + self.advance(at_ms)

    def _update_auditor(self, at_ms: int) -> list[HealthTransition]:
        missing = self.znodes is not None and self.znodes.auditor is None and self.bookies_running
        if not missing:
            self.auditor_missing_since_ms = None
        elif self.auditor_missing_since_ms is None:
            self.auditor_missing_since_ms = at_ms
        return []

    def _holding(self) -> dict[tuple[str, int | None], Condition]:
        if self.znodes is None:
            return {}
        holding = holding_conditions(
            self.znodes,
            self.auditor_missing_since_ms,
            graces=self.graces,
            auditor_elected_since_ms=self.auditor_elected_since_ms,
            unmarked=self.unmarked,
            auditor_active_since_ms=self.auditor_active_since_ms,
        )
        return {c.key: c for c in holding}

    def advance(self, now_ms: int) -> list[HealthTransition]:
        """Event time moved to ``now_ms``: resolve what no longer holds, fire what is due."""
        holding = self._holding()
        out: list[HealthTransition] = []
        for key, since in self._firing_sorted():
            current = holding.get(key)
            if not self._still_firing(current, since, now_ms):
                del self.firing[key]
                kind = AlertKind(key[0])
                out.append(HealthTransition(kind, key[1], False, now_ms, {"since_ms": since}))
        for key, condition in holding.items():
            due = due_at_ms(condition, self.graces)
            if key not in self.firing and due is not None and now_ms >= due:
                self.firing[key] = condition.since_ms
                detail = _detail(condition, self.graces, now_ms)
                out.append(HealthTransition(condition.kind, condition.ledger_id, True, now_ms, detail))
        return out

    def _still_firing(self, current: Condition | None, fired_since_ms: int, now_ms: int) -> bool:
        """Whether a fired condition goes on: it still holds from the same start (a new start means it
        cleared and held anew), except ``AUDITOR_LAGGING``, which goes on while it is still due, whichever
        ledger is now the oldest unmarked."""
        if current is None:
            return False
        if current.kind is AlertKind.AUDITOR_LAGGING:
            due = due_at_ms(current, self.graces)
            return due is not None and now_ms >= due
        return current.since_ms == fired_since_ms

    def _firing_sorted(self) -> list[tuple[tuple[str, int | None], int]]:
        return sorted(self.firing.items(), key=lambda item: (item[0][0], item[0][1] or -1))

    def next_deadline_ms(self) -> int | None:
        """The earliest event time at which a holding condition becomes due (None: nothing pending).

        Example:
            >>> AutoRecoveryHealth(AutoRecoveryGraces()).next_deadline_ms() is None
            True
        """
        pending = [
            due
            for key, condition in self._holding().items()
            if key not in self.firing and (due := due_at_ms(condition, self.graces)) is not None
        ]
        return min(pending) if pending else None

    # -- state ----------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The state as JSON-able data.

        Example:
            >>> AutoRecoveryHealth(AutoRecoveryGraces()).to_json()["znodes"] is None
            True
        """
        znodes = None
        if self.znodes is not None:
            znodes = {
                "disabled_since_ms": self.znodes.disabled_since_ms,
                "auditor": self.znodes.auditor,
                "locks": [[i, lock.holder, lock.since_ms] for i, lock in sorted(self.znodes.locks.items())],
                "checks": {check.value: ms for check, ms in sorted(self.znodes.checks.items(), key=_by_name)},
            }
        return {
            "znodes": znodes,
            "bookies_running": self.bookies_running,
            "auditor_missing_since_ms": self.auditor_missing_since_ms,
            "auditor_elected_since_ms": self.auditor_elected_since_ms,
            "autorecovery_enabled_since_ms": self.autorecovery_enabled_since_ms,
            "unmarked": self.unmarked.to_json(),
            "firing": [[kind, ledger, since] for (kind, ledger), since in self._firing_sorted()],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None, graces: AutoRecoveryGraces) -> AutoRecoveryHealth:
        """The state saved by :meth:`to_json` (None: a fresh state), under the current graces.

        Example:
            >>> health = AutoRecoveryHealth(AutoRecoveryGraces())
            >>> _ = health.observe(AutoRecoveryZnodes(disabled_since_ms=5), at_ms=6)
            >>> AutoRecoveryHealth.from_json(health.to_json(), AutoRecoveryGraces()).znodes.disabled_since_ms
            5
        """
        health = cls(graces)
        if not data:
            return health
        znodes = data.get("znodes")
        if znodes is not None:
            health.znodes = AutoRecoveryZnodes(
                disabled_since_ms=znodes["disabled_since_ms"],
                auditor=znodes["auditor"],
                locks={int(i): ReplicationLock(holder, int(since)) for i, holder, since in znodes["locks"]},
                checks={CtimeZnode(name): int(ms) for name, ms in (znodes.get("checks") or {}).items()},
            )
        health.bookies_running = bool(data.get("bookies_running"))
        health.auditor_missing_since_ms = data.get("auditor_missing_since_ms")
        health.auditor_elected_since_ms = data.get("auditor_elected_since_ms")
        health.autorecovery_enabled_since_ms = data.get("autorecovery_enabled_since_ms")
        health.unmarked = UnmarkedAtRisk.from_json(data.get("unmarked"))
        health.firing = {(kind, ledger): int(since) for kind, ledger, since in data.get("firing", [])}
        return health


def _by_name(item: tuple[CtimeZnode, int]) -> str:
    return item[0].value


__all__ = [
    "AUTORECOVERY_KINDS",
    "AutoRecoveryGraces",
    "AutoRecoveryHealth",
    "AutoRecoveryZnodes",
    "Condition",
    "HealthTransition",
    "ReplicationLock",
    "checks_condition",
    "due_at_ms",
    "due_conditions",
    "holding_conditions",
    "lagging_condition",
]
