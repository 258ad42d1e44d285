"""When a missing bookie becomes *lost*: the debounce rule of the behaviour contract, as pure code.

A bookie is *writable* under ``available/``, *read-only* under ``available/readonly/`` and *known* once seen
in either (or under ``cookies/``). Read-only is not missing. A known bookie that is in neither is *missing
since t*. It becomes **lost** when

- it has been missing for at least ``lostBookieRecoveryDelay`` seconds (the ZooKeeper znode's value, else the
  configured default), or
- the delay is 0, or
- more than one bookie is missing at the same moment (BookKeeper's rule: several missing bookies are audited
  at once, cancelling any pending delayed audit).

A bookie that comes back before it is lost *flapped*: no alert, a flap is counted. A lost bookie that comes
back *returned*, which resolves its alerts. :class:`BookieMembership` applies these rules to a sequence of
observations; the streaming job keeps one instance in its state store, and the simulator's ground truth
replays the same observations through the same class.

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


@dataclass
class _Bookie:
    status: BookieStatus
    missing_since_ms: int | None = None
    lost: bool = False
    flaps: int = 0


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
                self.bookies[bookie_id] = _Bookie(BookieStatus.GONE, missing_since_ms=at_ms)
            else:
                self.bookies[bookie_id] = _Bookie(status)
        elif status is BookieStatus.GONE:
            if state.status is not BookieStatus.GONE:
                state.status = BookieStatus.GONE
                state.missing_since_ms = at_ms
        else:
            if state.status is BookieStatus.GONE:
                since = state.missing_since_ms if state.missing_since_ms is not None else at_ms
                kind = TransitionKind.RETURNED if state.lost else TransitionKind.FLAPPED
                if not state.lost:
                    state.flaps += 1
                transitions.append(Transition(kind, bookie_id, at_ms, since))
                state.lost = False
                state.missing_since_ms = None
            state.status = status
        return transitions + self._declare_lost(at_ms)

    def set_recovery_delay(self, seconds: int | None, at_ms: int) -> list[Transition]:
        """The ``lostBookieRecoveryDelay`` znode changed (None: znode absent, the default applies)."""
        transitions = self.advance(at_ms)
        self.znode_delay_s = seconds
        # A shorter delay can put a deadline in the past: the bookie is lost now, not back then.
        return transitions + self._declare_lost(at_ms, not_before_ms=at_ms)

    def advance(self, now_ms: int) -> list[Transition]:
        """Let event time reach ``now_ms``: bookies whose delay expired become lost."""
        return self._declare_lost(now_ms)

    def _declare_lost(self, now_ms: int, not_before_ms: int | None = None) -> list[Transition]:
        pending = [
            (b, s) for b, s in sorted(self.bookies.items()) if s.status is BookieStatus.GONE and not s.lost
        ]
        if not pending:
            return []
        several_missing = len(self.missing()) > 1
        out: list[Transition] = []
        for bookie_id, state in pending:
            since = state.missing_since_ms if state.missing_since_ms is not None else now_ms
            due = since + self.delay_ms
            if several_missing or self.delay_ms == 0 or now_ms >= due:
                state.lost = True
                # Effective time: when the rule was met (the deadline if it passed unobserved, else now).
                effective = due if now_ms >= due else now_ms
                if not_before_ms is not None:
                    effective = max(effective, not_before_ms)
                effective = max(effective, since)
                out.append(Transition(TransitionKind.LOST, bookie_id, effective, since))
        return out

    def next_deadline_ms(self) -> int | None:
        """The earliest event time at which a pending bookie becomes lost (for a timer), or None."""
        deadlines = [
            s.missing_since_ms + self.delay_ms
            for s in self.bookies.values()
            if s.status is BookieStatus.GONE and not s.lost and s.missing_since_ms is not None
        ]
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
                    b: [s.status.value, s.missing_since_ms, s.lost, s.flaps]
                    for b, s in sorted(self.bookies.items())
                },
                "last_change_ms": self.last_change_ms,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> BookieMembership:
        data = json.loads(text)
        membership = cls(default_delay_s=data["default_delay_s"], znode_delay_s=data["znode_delay_s"])
        for bookie_id, (status, since, lost, flaps) in data["bookies"].items():
            membership.bookies[bookie_id] = _Bookie(BookieStatus(status), since, lost, flaps)
        membership.last_change_ms = {k: int(v) for k, v in data["last_change_ms"].items()}
        return membership
