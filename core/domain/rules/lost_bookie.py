"""When a missing bookie becomes *lost*: the debounce rule of the behaviour contract, as pure code.

A bookie is *writable* under ``available/``, *read-only* under ``available/readonly/`` and *known* once seen
in either (or under ``cookies/``). Read-only is not missing. A known bookie that is in neither is *missing
since t*. It becomes **lost** when

- it has been missing for at least ``lostBookieRecoveryDelay`` seconds (the ZooKeeper znode's value, else the
  configured default), or
- the delay is 0, or
- more than one bookie is missing at the same moment (BookKeeper's rule: several missing bookies are audited
  at once, cancelling any pending delayed audit), or
- the ``lostBookieRecoveryDelay`` znode is written again with the value in force, or with 0, while it is
  missing (``bookkeeper shell triggeraudit`` does the former: BookKeeper's Auditor then cancels the pending
  delayed audit and audits at once). Only a new write counts (a larger znode ``mzxid``): the same write
  published again, as every snapshot of the watcher does, changes nothing.

A bookie that comes back before it is lost *flapped*: no alert, a flap is counted. A lost bookie that comes
back *returned*, which resolves its alerts.

**A metadata-store hiccup is not data loss** (:class:`DisruptionRule`, off unless configured). A ZooKeeper
outage longer than the bookies' session timeout expires every session at once: every registration vanishes
while every bookie still serves. So a newly missing bookie is judged only once the watcher's liveness probe
of it has failed (:meth:`BookieMembership.observe_probe`) or ``settle_s`` has passed. If by then at least
two bookies, and at least ``share`` of the bookies not lost, are missing together, they are *held* instead
of lost: a held bookie whose probe fails is lost at once; one that answers has only lost its registration
(:meth:`BookieMembership.registration_lost`, the ``ZOOKEEPER_DISRUPTION`` warning) and stays held until it
registers again or stops answering; one never probed is lost when ``grace_s`` has passed. A triggered audit
ends recovery delays, not holds: a held bookie that answers is alive, and stays held (BookKeeper, which has
no probe, would take it as lost). A bookie missing for less than ``settle_s`` at the trigger is lost as soon
as it is judged and found not held.

:class:`BookieMembership` applies these rules to a sequence of observations; the streaming job keeps one
instance in its state store, and the simulator's ground truth replays the same observations through the same
class.

Example:
    >>> m = BookieMembership(default_delay_s=30)
    >>> m.observe("b1", BookieStatus.WRITABLE, at_ms=0)
    []
    >>> m.observe("b1", BookieStatus.GONE, at_ms=1_000)
    []
    >>> m.next_deadline_ms()
    31000
    >>> [t.kind.value for t in m.advance(31_000)]
    ['LOST']
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field


class BookieStatus(enum.Enum):
    """Registration state of one bookie as the watcher reports it."""

    WRITABLE = "WRITABLE"
    READ_ONLY = "READ_ONLY"
    GONE = "GONE"


class TransitionKind(enum.Enum):
    """What changed for a bookie, as far as alerts are concerned."""

    LOST = "LOST"  # missing past the delay (or with others): BOOKIE_LOST fires, its ledgers are checked
    RETURNED = "RETURNED"  # a lost bookie registered again: its alerts resolve
    FLAPPED = "FLAPPED"  # back before it was lost: counted, no alert


@dataclass(frozen=True)
class Transition:
    """One bookie transition with the event time it takes effect and when the bookie went missing."""

    kind: TransitionKind
    bookie_id: str
    at_ms: int
    missing_since_ms: int


@dataclass(frozen=True)
class DisruptionRule:
    """When many bookies vanishing together is held as a ZooKeeper disruption (see the module docstring).

    ``settle_s`` 0 turns the rule off (BookKeeper's own rules only).

    Example:
        >>> DisruptionRule().enabled, DisruptionRule(settle_s=0).enabled
        (True, False)
    """

    # Once ZooKeeper serves again it removes every overdue session's znodes in one pass: the watcher sees
    # the vanishing registrations as one burst, well within this.
    settle_s: float = 1.0
    grace_s: float = 30.0  # a held bookie nobody probed is lost after this
    share: float = 0.5  # of the bookies not lost; a host or a rack failing is well under half a cluster
    min_bookies: int = 2

    @property
    def enabled(self) -> bool:
        return self.settle_s > 0

    def applies(self, missing: int, not_lost: int) -> bool:
        """Whether ``missing`` bookies missing together, of ``not_lost``, look like a disruption.

        Example:
            >>> rule = DisruptionRule()
            >>> rule.applies(2, 3), rule.applies(2, 10), rule.applies(1, 1)
            (True, False, False)
        """
        return missing >= self.min_bookies and missing >= self.share * not_lost


#: BookKeeper's rules exactly: nothing is settled, held or probed.
NO_DISRUPTION_RULE = DisruptionRule(settle_s=0.0)


@dataclass
class _Bookie:
    status: BookieStatus
    missing_since_ms: int | None = None
    lost: bool = False
    flaps: int = 0
    answering: bool | None = None  # the latest liveness probe while missing; None: none yet
    held: bool = False  # missing in a disruption: lost only when silent (or never probed past the grace)
    judged: bool = True  # False while a newly missing bookie waits for the settle time (the rule enabled)
    vanished_ms: int | None = None  # when it last went missing, kept after it returns (who vanished together)


@dataclass
class BookieMembership:
    """Membership of every known bookie plus the recovery delay; emits :class:`Transition` s.

    ``observe`` and ``set_recovery_delay`` take effect at their event time; call ``advance(now)`` whenever
    event time moves (a watermark, a timer) to let delays expire. Observations must come in event-time
    order per bookie; stale ones (older than the bookie's last change) are ignored.

    Example:
        >>> m = BookieMembership(default_delay_s=60)
        >>> for b in ("b1", "b2", "b3"):
        ...     _ = m.observe(b, BookieStatus.WRITABLE, at_ms=0)
        >>> m.observe("b1", BookieStatus.GONE, at_ms=10)
        []
        >>> [(t.kind.value, t.bookie_id) for t in m.observe("b2", BookieStatus.GONE, at_ms=20)]
        [('LOST', 'b1'), ('LOST', 'b2')]
    """

    default_delay_s: int = 0
    znode_delay_s: int | None = None
    bookies: dict[str, _Bookie] = field(default_factory=dict)
    last_change_ms: dict[str, int] = field(default_factory=dict)
    disruption: DisruptionRule = NO_DISRUPTION_RULE
    delay_mzxid: int | None = None  # the largest mzxid of the delay znode seen; None: none seen yet
    audit_ms: int | None = None  # the last triggered audit: bookies missing by then have no delay left

    @property
    def delay_ms(self) -> int:
        """The delay in force: the znode's value when present, else the configured default."""
        seconds = self.znode_delay_s if self.znode_delay_s is not None else self.default_delay_s
        return max(0, seconds) * 1000

    def missing(self) -> list[str]:
        """Bookies currently missing (lost or not yet), sorted."""
        return sorted(b for b, s in self.bookies.items() if s.status is BookieStatus.GONE)

    def lost(self) -> list[str]:
        """Bookies currently lost, sorted."""
        return sorted(b for b, s in self.bookies.items() if s.lost)

    def registration_lost(self) -> list[str]:
        """Bookies held in a disruption that still answer their liveness probe, sorted.

        Example:
            >>> m = BookieMembership(disruption=DisruptionRule())
            >>> for b in ("b1", "b2", "b3"):
            ...     _ = m.observe(b, BookieStatus.WRITABLE, at_ms=0)
            >>> for b in ("b1", "b2"):
            ...     _ = m.observe(b, BookieStatus.GONE, at_ms=10)
            >>> m.observe_probe("b1", answered=True, at_ms=20)  # judged when the settle time has passed
            []
            >>> [(t.kind.value, t.bookie_id) for t in m.observe_probe("b2", answered=False, at_ms=20)]
            [('LOST', 'b2')]
            >>> m.advance(1_010)  # two of three vanished together: b1 is held, and answers
            []
            >>> m.registration_lost(), m.lost()
            (['b1'], ['b2'])
        """
        return sorted(
            b
            for b, s in self.bookies.items()
            if s.status is BookieStatus.GONE and s.held and not s.lost and s.answering
        )

    def flaps(self, bookie_id: str) -> int:
        """How many times ``bookie_id`` came back before it was declared lost."""
        state = self.bookies.get(bookie_id)
        return state.flaps if state else 0

    def observe(self, bookie_id: str, status: BookieStatus, at_ms: int) -> list[Transition]:
        """Apply one registration change at event time ``at_ms``; returns the transitions it causes."""
        if at_ms < self.last_change_ms.get(bookie_id, -1):
            return []
        self.last_change_ms[bookie_id] = at_ms
        transitions = self.advance(at_ms)
        state = self.bookies.get(bookie_id)
        if state is None:
            if status is BookieStatus.GONE:
                # Never seen registered: known only through its cookie. Missing from now on.
                self.bookies[bookie_id] = _Bookie(
                    BookieStatus.GONE,
                    missing_since_ms=at_ms,
                    judged=not self.disruption.enabled,
                    vanished_ms=at_ms,
                )
            else:
                self.bookies[bookie_id] = _Bookie(status)
        elif status is BookieStatus.GONE:
            if state.status is not BookieStatus.GONE:
                state.status = BookieStatus.GONE
                state.missing_since_ms = at_ms
                state.judged = not self.disruption.enabled
                state.vanished_ms = at_ms
        else:
            if state.status is BookieStatus.GONE:
                since = state.missing_since_ms if state.missing_since_ms is not None else at_ms
                kind = TransitionKind.RETURNED if state.lost else TransitionKind.FLAPPED
                if not state.lost:
                    state.flaps += 1
                transitions.append(Transition(kind, bookie_id, at_ms, since))
                state.lost = False
                state.missing_since_ms = None
                state.answering = None
                state.held = False
                state.judged = True
            state.status = status
        return transitions + self._declare_lost(at_ms)

    def observe_probe(self, bookie_id: str, *, answered: bool, at_ms: int) -> list[Transition]:
        """The watcher's liveness probe of a missing bookie answered (or not) at ``at_ms``.

        Ignored for a bookie that is not missing (it registered again before the answer came).
        """
        transitions = self.advance(at_ms)
        state = self.bookies.get(bookie_id)
        if state is None or state.status is not BookieStatus.GONE or state.lost:
            return transitions
        state.answering = answered
        return transitions + self._declare_lost(at_ms)

    def set_recovery_delay(
        self, seconds: int | None, at_ms: int, *, mzxid: int | None = None
    ) -> list[Transition]:
        """The ``lostBookieRecoveryDelay`` znode changed (None: znode absent, the default applies).

        ``mzxid`` is the znode's modification zxid (0 when absent, None when unknown). A write newer than
        every one seen before, of the value in force or of 0, triggers an audit (:meth:`trigger_audit`), as
        ``bookkeeper shell triggeraudit`` does; the first value seen never does (nothing says it is new).

        Example:
            >>> m = BookieMembership(default_delay_s=0)
            >>> for b in ("b1", "b2"):
            ...     _ = m.observe(b, BookieStatus.WRITABLE, at_ms=0)
            >>> m.set_recovery_delay(60, at_ms=0, mzxid=7)
            []
            >>> m.observe("b1", BookieStatus.GONE, at_ms=1_000)
            []
            >>> m.set_recovery_delay(60, at_ms=2_000, mzxid=7)  # the same write, published again
            []
            >>> [(t.kind.value, t.at_ms) for t in m.set_recovery_delay(60, at_ms=3_000, mzxid=9)]
            [('LOST', 3000)]
        """
        transitions = self.advance(at_ms)
        triggers = self._is_rewrite(mzxid) and seconds is not None and seconds in (0, self.delay_ms // 1000)
        if mzxid is not None:
            self.delay_mzxid = mzxid if self.delay_mzxid is None else max(self.delay_mzxid, mzxid)
        self.znode_delay_s = seconds
        if triggers:
            self._note_audit(at_ms)
        # A shorter delay (or an audit) can put a deadline in the past: the bookie is lost now, not back then.
        return transitions + self._declare_lost(at_ms, not_before_ms=at_ms)

    def _is_rewrite(self, mzxid: int | None) -> bool:
        """Whether a delay znode with ``mzxid`` is a write after the ones seen (not one seen again)."""
        return mzxid is not None and self.delay_mzxid is not None and mzxid > self.delay_mzxid

    def trigger_audit(self, at_ms: int) -> list[Transition]:
        """Audit now, as BookKeeper's Auditor does when the recovery delay is written again: every bookie
        missing by ``at_ms`` has no delay left and is lost (once judged, unless held in a disruption).

        Example:
            >>> m = BookieMembership(default_delay_s=600)
            >>> for b in ("b1", "b2"):
            ...     _ = m.observe(b, BookieStatus.WRITABLE, at_ms=0)
            >>> m.observe("b1", BookieStatus.GONE, at_ms=1_000)
            []
            >>> [(t.kind.value, t.bookie_id, t.at_ms) for t in m.trigger_audit(5_000)]
            [('LOST', 'b1', 5000)]
        """
        transitions = self.advance(at_ms)
        self._note_audit(at_ms)
        return transitions + self._declare_lost(at_ms, not_before_ms=at_ms)

    def _note_audit(self, at_ms: int) -> None:
        """Remember the latest triggered audit (an older one read late changes nothing)."""
        self.audit_ms = at_ms if self.audit_ms is None else max(self.audit_ms, at_ms)

    def advance(self, now_ms: int) -> list[Transition]:
        """Let event time reach ``now_ms``: bookies whose delay expired become lost."""
        return self._declare_lost(now_ms)

    def _declare_lost(self, now_ms: int, not_before_ms: int | None = None) -> list[Transition]:
        pending = [
            (b, s) for b, s in sorted(self.bookies.items()) if s.status is BookieStatus.GONE and not s.lost
        ]
        if not pending:
            return []
        judged_now: set[str] = set()
        if self.disruption.enabled:
            judged_now = self._judge(pending, now_ms)
        # BookKeeper's "several missing" rule waits until every missing bookie has been judged: whether they
        # vanished together in a disruption is known only then.
        several_missing = len(self.missing()) > 1 and all(s.judged for _, s in pending)
        out: list[Transition] = []
        for bookie_id, state in pending:
            since = state.missing_since_ms if state.missing_since_ms is not None else now_ms
            if not state.judged:
                continue
            state.held = state.held or self._vanished_together(since)
            if state.held:
                held_due = self._held_due_ms(state, since, now_ms)
                if held_due is None or now_ms < held_due:
                    continue
                due = held_due
            else:
                due = self._delay_due_ms(since)
                if not (several_missing or self.delay_ms == 0 or now_ms >= due):
                    continue
            state.lost = True
            # Effective time: when the rule was met (the deadline if it passed unobserved, else now).
            effective = due if now_ms >= due else now_ms
            if bookie_id in judged_now:
                effective = now_ms  # the failed probe met the rule
            elif self.disruption.enabled and not state.held:
                effective = max(effective, min(now_ms, since + self._settle_ms))  # judged no sooner
            if not_before_ms is not None:
                effective = max(effective, not_before_ms)
            effective = max(effective, since)
            out.append(Transition(TransitionKind.LOST, bookie_id, effective, since))
        return out

    def _judge(self, pending: list[tuple[str, _Bookie]], now_ms: int) -> set[str]:
        """Mark the missing bookies whose settle time has passed, or whose probe failed, as judged (a failed
        probe needs no wait: dead either way; an answer must wait to see whether others vanished with it);
        returns those judged by a failed probe now."""
        by_probe = set()
        for bookie_id, state in pending:
            since = state.missing_since_ms if state.missing_since_ms is not None else now_ms
            if state.judged:
                continue
            if now_ms >= since + self._settle_ms:
                state.judged = True
            elif state.answering is False:
                state.judged = True
                by_probe.add(bookie_id)
        return by_probe

    def _vanished_together(self, since_ms: int) -> bool:
        """Whether the bookies that went missing within the settle time of ``since_ms`` (lost since, back
        since, or still missing) are a disruption's share of the bookies that were not lost before them."""
        if not self.disruption.enabled:
            return False
        wave = [
            s
            for s in self.bookies.values()
            if s.vanished_ms is not None and abs(s.vanished_ms - since_ms) <= self._settle_ms
        ]
        before = sum(1 for s in self.bookies.values() if not s.lost) + sum(1 for s in wave if s.lost)
        return self.disruption.applies(len(wave), before)

    @property
    def _settle_ms(self) -> int:
        return int(self.disruption.settle_s * 1000)

    def _delay_due_ms(self, since: int) -> int:
        """When a bookie missing since ``since`` is past its delay: the delay's end, or the last triggered
        audit if it came first while the bookie was missing."""
        due = since + self.delay_ms
        if self.audit_ms is not None and since <= self.audit_ms:
            return min(due, self.audit_ms)
        return due

    def _held_due_ms(self, state: _Bookie, since: int, now_ms: int) -> int | None:
        """When a held bookie is lost: now if its probe failed, never while it answers, else after grace."""
        if state.answering is False:
            return now_ms
        if state.answering:
            return None
        return since + int(self.disruption.grace_s * 1000)

    def next_deadline_ms(self) -> int | None:
        """The earliest event time at which a pending bookie is judged or lost (for a timer), or None."""
        deadlines = []
        for s in self.bookies.values():
            if s.status is not BookieStatus.GONE or s.lost or s.missing_since_ms is None:
                continue
            if s.held:
                due = self._held_due_ms(s, s.missing_since_ms, s.missing_since_ms)
                if due is not None:
                    deadlines.append(due)
            elif not s.judged:
                deadlines.append(s.missing_since_ms + self._settle_ms)
            else:
                deadlines.append(self._delay_due_ms(s.missing_since_ms))
        return min(deadlines) if deadlines else None

    # -- persistence in a state store: small JSON, stable across versions ----------------------------
    def to_json(self) -> str:
        """Serialise for a state store.

        Example:
            >>> BookieMembership.from_json(BookieMembership(default_delay_s=5).to_json()).default_delay_s
            5
        """
        return json.dumps(
            {
                "v": 1,
                "default_delay_s": self.default_delay_s,
                "znode_delay_s": self.znode_delay_s,
                "bookies": {
                    b: [
                        s.status.value,
                        s.missing_since_ms,
                        s.lost,
                        s.flaps,
                        s.answering,
                        s.held,
                        s.judged,
                        s.vanished_ms,
                    ]
                    for b, s in sorted(self.bookies.items())
                },
                "last_change_ms": self.last_change_ms,
                "delay_mzxid": self.delay_mzxid,
                "audit_ms": self.audit_ms,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> BookieMembership:
        data = json.loads(text)
        membership = cls(default_delay_s=data["default_delay_s"], znode_delay_s=data["znode_delay_s"])
        for bookie_id, (status, since, lost, flaps, *probed) in data["bookies"].items():
            answering, held, judged, vanished = probed if probed else (None, False, True, since)
            membership.bookies[bookie_id] = _Bookie(
                BookieStatus(status), since, lost, flaps, answering, held, judged, vanished
            )
        membership.last_change_ms = {k: int(v) for k, v in data["last_change_ms"].items()}
        membership.delay_mzxid = data.get("delay_mzxid")
        membership.audit_ms = data.get("audit_ms")
        return membership
