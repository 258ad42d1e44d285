"""Stage 2 of the job: the event-time state machine (``transformWithStateInPandas``, RocksDB, timers).

Grouped by ``state_key``:

- ``"cluster"``: one :class:`~core.domain.rules.lost_bookie.BookieMembership` (registrations, the recovery
  delay, the several-missing rule), AutoRecovery's health
  (:class:`~core.domain.rules.autorecovery.AutoRecoveryHealth`) and the rack map. An event-time timer at
  the next deadline lets a delay or a grace period expire on an idle cluster: the watcher's heartbeats move
  the watermark.
- ``"ledgers/<bucket>"`` (ledger id modulo ``stream.ledger_state_buckets``): in a map state, only the
  *tracked* ledgers — those with a suspicion of a failing replicas probe (its re-probe timer and round,
  BP-34) or an under-replication mark (its grace timer) — with their last znode version and deleted/corrupt
  flags. Everything else passes through without a state call; duplicate and older versions of those are
  dropped by the sink, which reads each ledger's row anyway. Buckets, not a group per ledger: Spark's
  per-group cost (~10 ms of Python round trips) capped the job near 100 ledger events/s.
- ``"dead"``: undecodable records, passed through.

Output rows follow :data:`streaming.schemas.DECISION_SCHEMA`; the sink acts on them. A ledger whose bookie
is *missing* is governed by the lost-bookie delay: when it expires the registration is re-checked (the
membership) and only a still-missing bookie raises alerts — that is the re-probe of BP-34 for missing bookies.
Probe failures (timeouts, too few replicas) are re-probed ``reprobe_rounds`` times, ``reprobe_delay`` apart
(doubling), before ``replicas_confirmed``: the rounds are counted per kind of failure
(:mod:`core.domain.rules.rounds`), so a healthy round or a different failure starts the count again.

The decision logic lives in :class:`ClusterLogic` and :class:`LedgerLogic` (plain Python, unit-tested
without Spark); :class:`AuditProcessor` adapts them to Spark's state and timer API.

Example:
    >>> logic = LedgerLogic(ProcessorConfig())
    >>> state, out, timers = logic.apply(None, [{"kind": "ledger_deleted", "event_time_ms": 5, "ledger_id": 1,
    ...                                          "payload": {"last_mzxid": 0, "inferred": False}}])
    >>> [d["kind"] for d in out], state["deleted"]
    (['ledger_deleted'], True)
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from core.domain.cookie import cookie_replaced
from core.domain.rules.auditor_lag import UnmarkedAtRisk
from core.domain.rules.autorecovery import (
    AutoRecoveryGraces,
    AutoRecoveryHealth,
    AutoRecoveryZnodes,
    HealthTransition,
    ReplicationLock,
)
from core.domain.rules.lost_bookie import (
    NO_DISRUPTION_RULE,
    BookieMembership,
    BookieStatus,
    DisruptionRule,
    Transition,
    TransitionKind,
)
from core.domain.rules.rounds import FailureRounds, confirms, count_round, failure_kind
from core.domain.underreplication import CtimeZnode
from streaming.state_keys import DEAD_LETTER_STATE_KEY

Decision = dict[str, Any]
AUTORECOVERY_DEFAULT_GRACES = AutoRecoveryGraces()


@dataclass(frozen=True)
class ProcessorConfig:
    """Knobs of the state machine (all in event time)."""

    default_recovery_delay_s: int = 0  # when the lostBookieRecoveryDelay znode is absent
    reprobe_delay_s: float = 30.0  # first re-probe of a suspect; doubles every round
    reprobe_rounds: int = 3  # failing rounds before replicas_confirmed
    reprobe_max_delay_s: float = 600.0
    confirmed_recheck_s: float = 300.0  # how often a confirmed failure is re-probed to notice a repair
    under_replication_grace_s: float = 0.0  # 0 disables UNDER_REPLICATION_STUCK
    autorecovery: AutoRecoveryGraces = AUTORECOVERY_DEFAULT_GRACES  # AutoRecovery health (membership only)
    disruption: DisruptionRule = NO_DISRUPTION_RULE  # many bookies vanishing together (membership only)
    # False in the job: registrations and the recovery delay are the membership lane's
    # (streaming.membership), and the cluster group keeps only the rack map and snapshot brackets.
    membership: bool = True


#: Changes that only membership reads (skipped by a cluster group without it; the membership lane's input).
MEMBERSHIP_CHANGES = frozenset(
    {"bookie_status", "bookie_probe", "recovery_delay", "auto_recovery_state", "heartbeat"}
)


def _decision(kind: str, event_time_ms: int, **fields: Any) -> Decision:
    payload = fields.pop("payload", None)
    return {
        "kind": kind,
        "event_time_ms": event_time_ms,
        "ledger_id": fields.get("ledger_id"),
        "bookie_id": fields.get("bookie_id"),
        "payload": payload if payload is not None else {},
    }


# ------------------------------------------------------------------------------------------------ cluster


def autorecovery_znodes(payload: dict[str, Any], at_ms: int) -> AutoRecoveryZnodes:
    """An ``auto_recovery_state`` row's payload as the rule's input; a znode time unknown (0) is ``at_ms``.

    Example:
        >>> znodes = autorecovery_znodes({"disabled": True, "disabled_ctime_ms": None, "auditor": None,
        ...     "locks": [[7, "w1", 5]], "checks": {"replicascheckctime": 3}}, at_ms=9)
        >>> znodes.disabled_since_ms, znodes.locks[7], [(c.value, t) for c, t in znodes.checks.items()]
        (9, ReplicationLock(holder='w1', since_ms=5), [('replicascheckctime', 3)])
    """
    disabled = payload.get("disabled_ctime_ms") or at_ms if payload.get("disabled") else None
    locks = {
        int(ledger_id): ReplicationLock(holder, int(ctime_ms or at_ms))
        for ledger_id, holder, ctime_ms in payload.get("locks") or ()
    }
    checks = {CtimeZnode(name): int(ms) for name, ms in (payload.get("checks") or {}).items()}
    return AutoRecoveryZnodes(
        disabled_since_ms=disabled, auditor=payload.get("auditor"), locks=locks, checks=checks
    )


def _health_decisions(transitions: list[HealthTransition]) -> list[Decision]:
    return [
        _decision(
            "autorecovery_alert",
            t.at_ms,
            ledger_id=t.ledger_id,
            payload={"kind": t.kind.value, "firing": t.firing, "detail": dict(t.detail)},
        )
        for t in transitions
    ]


def _disruption_decisions(
    membership: BookieMembership, before: list[str], at_ms: int, out: list[Decision]
) -> list[str]:
    """Fire ``ZOOKEEPER_DISRUPTION`` when bookies start answering without a registration, resolve it when
    none does any more; returns the bookies that do now."""
    now = membership.registration_lost()
    if bool(now) != bool(before):
        detail = {"bookies": now} if now else {}
        out.append(
            _decision(
                "cluster_alert",
                at_ms,
                payload={"kind": "ZOOKEEPER_DISRUPTION", "firing": bool(now), "detail": detail},
            )
        )
    return now


def bookie_registration(
    known: Mapping[str, Any] | None, payload: Mapping[str, Any], at_ms: int
) -> tuple[dict[str, Any], bool]:
    """What the state keeps of a ``bookie_status`` payload, and whether it shows the bookie's cookie
    replaced (formatted again under the same id). The last cookie seen is kept while the bookie has none,
    so a cookie deleted and created again counts; a first sighting or the same cookie again does not.

    Example:
        >>> first, replaced = bookie_registration(None, {"has_cookie": True, "cookie": "5:aa"}, 10)
        >>> replaced, first["cookie"], first["cookie_changed_ms"]
        (False, '5:aa', None)
        >>> gone, _ = bookie_registration(first, {"has_cookie": False, "cookie": None}, 20)
        >>> again, replaced = bookie_registration(gone, {"has_cookie": True, "cookie": "9:bb"}, 30)
        >>> replaced, again["cookie"], again["cookie_changed_ms"]
        (True, '9:bb', 30)
    """
    known = known or {}
    seen = payload.get("cookie")
    replaced = cookie_replaced(known.get("cookie"), seen)
    registration = {k: payload.get(k) for k in ("rpc_address", "host", "port", "has_cookie")}
    registration["cookie"] = seen or known.get("cookie")
    registration["cookie_changed_ms"] = at_ms if replaced else known.get("cookie_changed_ms")
    return registration, replaced


class ClusterLogic:
    """Membership, recovery delay and rack map: the ``"cluster"`` group.

    Example:
        >>> logic = ClusterLogic(ProcessorConfig(default_recovery_delay_s=0))
        >>> rows = [{"kind": "bookie_status", "event_time_ms": 1, "bookie_id": "b1",
        ...          "payload": {"status": "WRITABLE"}},
        ...         {"kind": "bookie_status", "event_time_ms": 2, "bookie_id": "b1",
        ...          "payload": {"status": "GONE"}}]
        >>> state, out, deadline = logic.apply(None, rows)
        >>> [d["kind"] for d in out]
        ['bookie_state', 'bookie_state', 'bookie_lost', 'bookie_state']
    """

    def __init__(self, config: ProcessorConfig) -> None:
        self.config = config

    def _load(self, state: dict[str, Any] | None) -> tuple[BookieMembership, dict[str, Any]]:
        if state is None:
            membership = BookieMembership(default_delay_s=self.config.default_recovery_delay_s)
            state = {"bookies": {}, "racks": {}}
        else:
            membership = BookieMembership.from_json(state["membership"])
            membership.default_delay_s = self.config.default_recovery_delay_s
        membership.disruption = self.config.disruption
        return membership, state

    def _health(self, info: dict[str, Any]) -> AutoRecoveryHealth:
        return AutoRecoveryHealth.from_json(info.get("autorecovery"), self.config.autorecovery)

    def _bookie_state(
        self, membership: BookieMembership, info: dict[str, Any], bookie_id: str, at_ms: int
    ) -> Decision:
        registration = info["bookies"].get(bookie_id, {})
        member = membership.bookies.get(bookie_id)
        payload = {
            **registration,
            "status": member.status.value if member else registration.get("status", "GONE"),
            "missing_since_ms": member.missing_since_ms if member else None,
            "lost": bool(member and member.lost),
            "flaps": member.flaps if member else 0,
            "rack": info["racks"].get(bookie_id),
        }
        return _decision("bookie_state", at_ms, bookie_id=bookie_id, payload=payload)

    def _transitions(
        self, membership: BookieMembership, info: dict[str, Any], transitions: list[Transition]
    ) -> list[Decision]:
        out: list[Decision] = []
        names = {
            TransitionKind.LOST: "bookie_lost",
            TransitionKind.RETURNED: "bookie_returned",
            TransitionKind.FLAPPED: "bookie_flapped",
        }
        for transition in transitions:
            payload: dict[str, Any] = {"missing_since_ms": transition.missing_since_ms}
            if transition.kind is TransitionKind.FLAPPED:
                payload["flaps"] = membership.flaps(transition.bookie_id)
            out.append(
                _decision(
                    names[transition.kind], transition.at_ms, bookie_id=transition.bookie_id, payload=payload
                )
            )
            out.append(self._bookie_state(membership, info, transition.bookie_id, transition.at_ms))
        return out

    def apply(
        self,
        state: dict[str, Any] | None,
        rows: list[dict[str, Any]],
        unmarked: UnmarkedAtRisk | None = None,
    ) -> tuple[dict[str, Any], list[Decision], int | None]:
        """Apply rows in order; returns the new state, the decisions and the next membership deadline.
        ``unmarked``: the at-risk ledgers with no under-replication mark as the batch starts (the loss
        owner's, :meth:`streaming.loss.LossAuditor.unmarked_at_risk`), judged at the batch's event times."""
        membership, info = self._load(state)
        health = self._health(info)
        if unmarked is not None:
            health.set_unmarked(unmarked)
        out: list[Decision] = []
        registration_lost = membership.registration_lost()
        for row in rows:
            kind, at_ms, payload = row["kind"], row["event_time_ms"], row["payload"]
            if not self.config.membership and kind in MEMBERSHIP_CHANGES:
                continue
            if kind == "bookie_status":
                bookie_id = row["bookie_id"]
                registration, replaced = bookie_registration(info["bookies"].get(bookie_id), payload, at_ms)
                info["bookies"][bookie_id] = registration
                transitions = membership.observe(bookie_id, BookieStatus(payload["status"]), at_ms)
                out.append(self._bookie_state(membership, info, bookie_id, at_ms))
                if replaced:  # the loss owner probes its ledgers (once: the flag is this decision's only)
                    out[-1]["payload"]["cookie_replaced"] = True
                out.extend(self._transitions(membership, info, transitions))
                running = any(b.status is not BookieStatus.GONE for b in membership.bookies.values())
                out.extend(_health_decisions(health.set_bookies_running(running, at_ms)))
            elif kind == "bookie_probe":
                answered = bool(payload.get("answered"))
                transitions = membership.observe_probe(row["bookie_id"], answered=answered, at_ms=at_ms)
                out.extend(self._transitions(membership, info, transitions))
            elif kind == "auto_recovery_state":
                out.extend(_health_decisions(health.observe(autorecovery_znodes(payload, at_ms), at_ms)))
            elif kind == "recovery_delay":
                transitions = membership.set_recovery_delay(
                    payload.get("seconds"), at_ms, mzxid=payload.get("mzxid")
                )
                out.append(
                    _decision("recovery_delay", at_ms, payload={"seconds": membership.delay_ms // 1000})
                )
                out.extend(self._transitions(membership, info, transitions))
            elif kind == "rack_map":
                if payload.get("error"):
                    # Keep the last valid map (the next valid one is diffed against it); the sink marks
                    # placement unknown while the current map is invalid.
                    out.append(_decision("rack_map", at_ms, payload={"error": payload["error"]}))
                    continue
                racks = dict(payload.get("racks") or {})
                previous = info["racks"]
                moved = sorted(b for b in set(previous) | set(racks) if previous.get(b) != racks.get(b))
                info["racks"] = racks
                groups = dict(payload.get("groups") or {})  # the sink diffs them against its bookies
                decided = {"racks": racks, "moved": moved, "groups": groups}
                out.append(_decision("rack_map", at_ms, payload=decided))
            elif kind == "snapshot_begin":
                if payload.get("mode") == "FULL":
                    # Kept until its END: the sink needs the begin's time to tell live events from older ones.
                    brackets = info.setdefault("brackets", {})
                    brackets[str(payload.get("partition", 0))] = [payload.get("snapshot_id"), at_ms]
                if self.config.membership:
                    out.extend(self._transitions(membership, info, membership.advance(at_ms)))
                    out.extend(_health_decisions(health.advance(at_ms)))
            elif kind == "snapshot_end":
                opened = (info.get("brackets") or {}).pop(str(payload.get("partition", 0)), None)
                if payload.get("complete") and payload.get("mode") == "FULL":
                    begin_ms = opened[1] if opened and opened[0] == payload.get("snapshot_id") else None
                    out.append(
                        _decision("snapshot_complete", at_ms, payload={**payload, "begin_ms": begin_ms})
                    )
            elif kind == "heartbeat":
                out.extend(self._transitions(membership, info, membership.advance(at_ms)))
                out.extend(_health_decisions(health.advance(at_ms)))
            registration_lost = _disruption_decisions(membership, registration_lost, at_ms, out)
        info["membership"] = membership.to_json()
        info["autorecovery"] = health.to_json()
        return info, out, self._deadline(membership, health)

    def _deadline(self, membership: BookieMembership, health: AutoRecoveryHealth) -> int | None:
        if not self.config.membership:
            return None
        deadlines = [d for d in (membership.next_deadline_ms(), health.next_deadline_ms()) if d is not None]
        return min(deadlines) if deadlines else None

    def on_timer(
        self, state: dict[str, Any] | None, at_ms: int
    ) -> tuple[dict[str, Any], list[Decision], int | None]:
        """A membership deadline passed in event time."""
        membership, info = self._load(state)
        health = self._health(info)
        out: list[Decision] = []
        if self.config.membership:
            registration_lost = membership.registration_lost()
            out = self._transitions(membership, info, membership.advance(at_ms))
            out.extend(_health_decisions(health.advance(at_ms)))
            _disruption_decisions(membership, registration_lost, at_ms, out)
        info["membership"] = membership.to_json()
        info["autorecovery"] = health.to_json()
        return info, out, self._deadline(membership, health)


# ------------------------------------------------------------------------------------------------ ledgers


class LedgerLogic:
    """Version dedupe, suspicion rounds and the under-replication grace: one ``"ledger/<id>"`` group."""

    def __init__(self, config: ProcessorConfig) -> None:
        self.config = config

    @staticmethod
    def new_state() -> dict[str, Any]:
        return {"mzxid": -1, "deleted": False, "corrupt": False, "suspect": None, "mark": None}

    @staticmethod
    def needs_state(state: dict[str, Any]) -> bool:
        """Whether the ledger must be *tracked* (kept in Spark state) after this event.

        Only a suspicion or an under-replication mark outlives an event. Version dedupe of everything else
        is the sink's (it reads each ledger's row before applying a decision), so the common case — an
        upsert of a healthy ledger — costs no state-server round trip.

        Example:
            >>> LedgerLogic.needs_state(LedgerLogic.new_state())
            False
        """
        return state.get("suspect") is not None or state.get("mark") is not None

    def _reprobe_delay_ms(self, round_number: int) -> int:
        delay = min(
            self.config.reprobe_delay_s * (2 ** max(0, round_number - 1)), self.config.reprobe_max_delay_s
        )
        return int(delay * 1000)

    def timers(self, state: dict[str, Any]) -> set[int]:
        """Event times at which this ledger needs attention."""
        due: set[int] = set()
        if state.get("suspect"):
            due.add(state["suspect"]["due_ms"])
        mark = state.get("mark")
        if mark and mark.get("due_ms") is not None and not mark.get("fired"):
            due.add(mark["due_ms"])
        return due

    def apply(
        self, state: dict[str, Any] | None, rows: list[dict[str, Any]]
    ) -> tuple[dict[str, Any], list[Decision], set[int]]:
        state = dict(state) if state is not None else self.new_state()
        out: list[Decision] = []
        for row in rows:
            handler = getattr(self, f"_on_{row['kind']}", None)
            if handler is not None:
                out.extend(handler(state, row))
        return state, out, self.timers(state)

    # -- metadata ---------------------------------------------------------------------------------------
    def _on_ledger_upserted(self, state: dict[str, Any], row: dict[str, Any]) -> list[Decision]:
        payload, at_ms, ledger_id = row["payload"], row["event_time_ms"], row["ledger_id"]
        snapshot_id = row.get("snapshot_id")
        if payload["mzxid"] <= state["mzxid"]:
            return _seen(state, row)  # stale or duplicate
        changed_while_suspect = state["suspect"] is not None and state["mzxid"] >= 0
        state.update(mzxid=payload["mzxid"], deleted=False, corrupt=False)
        if changed_while_suspect:
            # BP-34: metadata changed → re-evaluate instead of alerting (a new episode, a new count).
            state["suspect"] = self._new_episode(state["suspect"], at_ms)
        return [
            _decision(
                "ledger_state", at_ms, ledger_id=ledger_id, payload={**payload, "snapshot_id": snapshot_id}
            )
        ]

    def _on_ledger_deleted(self, state: dict[str, Any], row: dict[str, Any]) -> list[Decision]:
        if state["deleted"]:
            return []
        state.update(
            deleted=True,
            suspect=None,
            mark=None,
            mzxid=max(state["mzxid"], row["payload"].get("last_mzxid", -1)),
        )
        return [
            _decision(
                "ledger_deleted", row["event_time_ms"], ledger_id=row["ledger_id"], payload=row["payload"]
            )
        ]

    def _on_ledger_undecodable(self, state: dict[str, Any], row: dict[str, Any]) -> list[Decision]:
        payload = row["payload"]
        if payload["mzxid"] < state["mzxid"] or (payload["mzxid"] == state["mzxid"] and state["corrupt"]):
            return _seen(state, row)  # stale or duplicate: the znode exists (and still does not decode)
        state.update(mzxid=max(state["mzxid"], payload["mzxid"]), corrupt=True, deleted=False, suspect=None)
        return [
            _decision("ledger_corrupt", row["event_time_ms"], ledger_id=row["ledger_id"], payload=payload)
        ]

    # -- under-replication marks ------------------------------------------------------------------------
    def _on_under_replication_mark(self, state: dict[str, Any], row: dict[str, Any]) -> list[Decision]:
        payload, at_ms, ledger_id = row["payload"], row["event_time_ms"], row["ledger_id"]
        # A grace period that ended before this event ended first, whatever the batches: its timer would
        # have fired had the event come in a later batch.
        out = self._overdue_mark(state, ledger_id, at_ms)
        out.append(_decision("under_replication", at_ms, ledger_id=ledger_id, payload=payload))
        if payload["state"] == "CLEARED":
            state["mark"] = None
            return out
        since = payload["mark_ctime_ms"] if payload.get("mark_ctime_ms") is not None else at_ms
        previous = state.get("mark")
        fired = bool(previous and previous.get("since_ms") == since and previous.get("fired"))
        due = None
        if self.config.under_replication_grace_s > 0 and not fired:
            due = since + int(self.config.under_replication_grace_s * 1000)
        state["mark"] = {
            "since_ms": since,
            "due_ms": due,
            "fired": fired,
            "replicas": payload.get("replicas", []),
        }
        if due is not None and due <= at_ms:
            out.extend(self._fire_mark(state, ledger_id, at_ms))
        return out

    def _overdue_mark(self, state: dict[str, Any], ledger_id: int, at_ms: int) -> list[Decision]:
        mark = state.get("mark")
        if mark and not mark.get("fired") and mark.get("due_ms") is not None and mark["due_ms"] <= at_ms:
            return self._fire_mark(state, ledger_id, mark["due_ms"])
        return []

    def _fire_mark(self, state: dict[str, Any], ledger_id: int, at_ms: int) -> list[Decision]:
        mark = state["mark"]
        mark["fired"] = True
        payload = {
            "mark_ctime_ms": mark["since_ms"],
            "grace_s": self.config.under_replication_grace_s,
            "replicas": mark["replicas"],
        }
        return [_decision("under_replication_stuck", at_ms, ledger_id=ledger_id, payload=payload)]

    # -- probes (feedback) ------------------------------------------------------------------------------
    def _on_probe_result(self, state: dict[str, Any], row: dict[str, Any]) -> list[Decision]:
        payload, at_ms, ledger_id = row["payload"], row["event_time_ms"], row["ledger_id"]
        if state["deleted"] or state["corrupt"]:
            return []
        suspect = state["suspect"]
        probe_round = int(payload.get("round", 0))
        expected_round = suspect["round"] if suspect else 0
        if probe_round != expected_round:
            return []  # duplicate or stale feedback (a replayed batch, an older round)
        if payload.get("mzxid") is not None and payload["mzxid"] != state["mzxid"] and state["mzxid"] >= 0:
            # The probe saw other metadata: the new version is evaluated on its own (a new episode).
            state["suspect"] = self._new_episode(suspect, at_ms)
            return []
        if state["mzxid"] < 0 and payload.get("mzxid") is not None:
            # An untracked ledger (see make_processor): the probe saw this version, so a later upsert of a
            # newer one still ends the suspicion.
            state["mzxid"] = payload["mzxid"]
        alerted = _alerted(suspect)
        count = count_round(_counted(suspect), failure_kind(payload))
        if count is None:  # a healthy round ends the suspicion and resolves its alert
            state["suspect"] = None
            if alerted is not None:
                return [
                    _decision("replicas_cleared", at_ms, ledger_id=ledger_id, payload={"round": probe_round})
                ]
            return []
        out: list[Decision] = []
        if confirms(count, self.config.reprobe_rounds) and alerted != count.failure:
            alerted = count.failure
            out.append(
                _decision(
                    "replicas_confirmed",
                    at_ms,
                    ledger_id=ledger_id,
                    payload={"round": probe_round, "failing_rounds": count.rounds, "outcome": payload},
                )
            )
        delay_ms = (
            int(self.config.confirmed_recheck_s * 1000)
            if alerted == count.failure
            else self._reprobe_delay_ms(count.rounds)
        )
        state["suspect"] = {
            "round": probe_round + 1,
            "due_ms": at_ms + delay_ms,
            "failure": count.failure,
            "count": count.rounds,
            "alerted": alerted,
            "reason": payload.get("reason", "probe"),
        }
        return out

    def _new_episode(self, suspect: dict[str, Any] | None, at_ms: int) -> dict[str, Any] | None:
        """What is left of a suspicion when the ledger's metadata changed: nothing, unless its alert is open.

        An open alert is kept until a round decides it (healthy: resolved; failing: counted anew), so it is
        re-probed after the first delay with its count at zero; the pending round's result is ignored.
        """
        alerted = _alerted(suspect)
        if suspect is None or alerted is None:
            return None
        return {
            "round": int(suspect["round"]) + 1,
            "due_ms": at_ms + self._reprobe_delay_ms(1),
            "failure": None,
            "count": 0,
            "alerted": alerted,
            "reason": suspect.get("reason", "probe"),
        }

    def on_timer(
        self, state: dict[str, Any] | None, at_ms: int, ledger_id: int
    ) -> tuple[dict[str, Any], list[Decision], set[int]]:
        state = dict(state) if state is not None else self.new_state()
        out: list[Decision] = []
        suspect = state.get("suspect")
        if suspect and suspect["due_ms"] <= at_ms:
            out.append(
                _decision(
                    "probe_request",
                    at_ms,
                    ledger_id=ledger_id,
                    payload={
                        "round": suspect["round"],
                        "reason": suspect.get("reason"),
                        "mzxid": state["mzxid"],
                    },
                )
            )
            # Wait for the result; if it never comes (lost feedback), ask again after the next delay.
            suspect["due_ms"] = at_ms + self._reprobe_delay_ms(suspect["round"] + 1)
        mark = state.get("mark")
        if mark and mark.get("due_ms") is not None and not mark.get("fired") and mark["due_ms"] <= at_ms:
            out.extend(self._fire_mark(state, ledger_id, at_ms))
        return state, out, self.timers(state)


def _seen(state: dict[str, Any], row: dict[str, Any]) -> list[Decision]:
    """A stale or duplicate read of a ledger that exists: nothing to apply, but the sink's vanished-ledger
    reconciliation must know the ledger was there at this event's time (and in this snapshot, if any)."""
    if state["deleted"]:
        return []
    payload = {"snapshot_id": row.get("snapshot_id")}
    return [_decision("ledger_seen", row["event_time_ms"], ledger_id=row["ledger_id"], payload=payload)]


def _alerted(suspect: dict[str, Any] | None) -> str | None:
    """The failure kind whose ``REPLICAS_*`` alert this suspicion raised (``None``: no alert open)."""
    if not suspect:
        return None
    if "alerted" in suspect:
        return suspect["alerted"]
    return "CONFIRMED" if suspect.get("confirmed") else None  # a suspect stored before failure kinds


def _counted(suspect: dict[str, Any] | None) -> FailureRounds | None:
    """The suspect's count of consecutive failing rounds (none before its first round, or stored before
    failure kinds: those start a new count)."""
    if not suspect or not suspect.get("failure"):
        return None
    return FailureRounds(suspect["failure"], int(suspect.get("count") or 0))


# --------------------------------------------------------------------------------------- Spark adapter


_ROW_COLUMNS = (
    "event_time",
    "run_id",
    "sequence",
    "kind",
    "ledger_id",
    "bookie_id",
    "snapshot_id",
    "cluster",
    "payload",
)


def _missing(value: Any) -> bool:
    import pandas as pd

    return value is None or bool(pd.isna(value))


def _epoch_ms(value: Any) -> int:
    # pd.Timestamp.value is nanoseconds since the epoch whatever the column's unit; floor to milliseconds.
    import pandas as pd

    ns = value.value if isinstance(value, pd.Timestamp) else pd.Timestamp(value).value
    return int(ns) // 1_000_000


def _order(entry: tuple[int, Any, Any, int]) -> tuple[Any, ...]:
    # (event time, run id, sequence), missing values first, stable: what sort_values(na_position="first") did.
    at_ms, run_id, sequence, _ = entry
    return (
        at_ms,
        (0, "") if _missing(run_id) else (1, run_id),
        (0, 0) if _missing(sequence) else (1, sequence),
    )


def rows_from_frames(frames: Iterator[Any]) -> list[dict[str, Any]]:
    """The group's input rows in event-time order (then run id, sequence).

    Plain Python over column lists: most groups hold one row (a ledger's upsert), and pandas' per-call
    overhead (concat, to_datetime, a three-key sort_values, to_dict) cost ~10 ms per group.
    """
    import pandas as pd

    collected = [frame for frame in frames if len(frame)]
    if not collected:
        return []
    df = collected[0] if len(collected) == 1 else pd.concat(collected, ignore_index=True)
    columns = {name: df[name].tolist() for name in _ROW_COLUMNS}
    entries = [
        (_epoch_ms(at), run_id, sequence, index)
        for index, (at, run_id, sequence) in enumerate(
            zip(columns["event_time"], columns["run_id"], columns["sequence"], strict=True)
        )
    ]
    if len(entries) > 1:
        entries.sort(key=_order)
    rows = []
    for at_ms, _, _, index in entries:
        ledger_id, bookie_id = columns["ledger_id"][index], columns["bookie_id"][index]
        snapshot_id, payload = columns["snapshot_id"][index], columns["payload"][index]
        rows.append(
            {
                "kind": columns["kind"][index],
                "event_time_ms": at_ms,
                "ledger_id": None if _missing(ledger_id) else int(ledger_id),
                "bookie_id": bookie_id if isinstance(bookie_id, str) else None,
                "snapshot_id": snapshot_id if isinstance(snapshot_id, str) else None,
                "cluster": columns["cluster"][index],
                "payload": json.loads(payload) if payload else {},
            }
        )
    return rows


#: The decision columns, in :data:`streaming.schemas.DECISION_SCHEMA` order.
DECISION_COLUMNS = (
    "kind",
    "event_time",
    "cluster",
    "ledger_id",
    "bookie_id",
    "payload",
    "topic",
    "partition",
    "offset",
)


def _frame(decisions: list[Decision], cluster: str | None) -> Any:
    import pandas as pd

    if not decisions:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in DECISION_COLUMNS})
    return pd.DataFrame(
        {
            "kind": [d["kind"] for d in decisions],
            "event_time": pd.to_datetime([d["event_time_ms"] for d in decisions], unit="ms", utc=True),
            "cluster": [cluster] * len(decisions),
            "ledger_id": pd.array([d.get("ledger_id") for d in decisions], dtype="Int64"),
            "bookie_id": [d.get("bookie_id") for d in decisions],
            "payload": [json.dumps(d["payload"], separators=(",", ":"), sort_keys=True) for d in decisions],
            "topic": [None] * len(decisions),
            "partition": pd.array([None] * len(decisions), dtype="Int32"),
            "offset": pd.array([None] * len(decisions), dtype="Int64"),
        }
    )


def _untracked_upserts(frames: list[Any], tracked: set[int]) -> bool:
    """Whether a bucket's input is only upserts of untracked ledgers: each becomes its ``ledger_state``
    decision as it is, with no state to read (the sink drops stale and duplicate versions)."""
    for frame in frames:
        if not (frame["kind"] == "ledger_upserted").all():
            return False
        if tracked and frame["ledger_id"].isin(list(tracked)).any():
            return False
    return True


def _upserts_as_decisions(frames: list[Any], cluster: str | None) -> Any:
    """Upserts of untracked ledgers as ``ledger_state`` decisions, column by column (the decoder's payload
    carries the snapshot id, so it passes on unparsed)."""
    import pandas as pd

    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    df = df.sort_values("event_time", kind="stable", ignore_index=True)  # event-time order, as the logic's
    n = len(df)
    return pd.DataFrame(
        {
            "kind": ["ledger_state"] * n,
            "event_time": df["event_time"],
            "cluster": df["cluster"].fillna(cluster) if cluster is not None else df["cluster"],
            "ledger_id": df["ledger_id"].astype("Int64"),
            "bookie_id": [None] * n,
            "payload": df["payload"],
            "topic": [None] * n,
            "partition": pd.array([None] * n, dtype="Int32"),
            "offset": pd.array([None] * n, dtype="Int64"),
        }
    )


def _passed_through(frames: Iterator[Any]) -> Iterator[Any]:
    """Dead letters: the input rows as decisions, unchanged (the sink records them with their reason)."""
    for frame in frames:
        if len(frame):
            yield frame[list(DECISION_COLUMNS)]


def _by_ledger(rows: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """A bucket's rows split per ledger, each ledger's rows still in order (first appearance order)."""
    grouped: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["ledger_id"], []).append(row)
    return grouped


def _next_due(agenda: dict[str, int]) -> int | None:
    return min(agenda.values()) if agenda else None


def _timer_set(agenda: dict[str, int]) -> set[int]:
    """A bucket keeps one timer: at its agenda's earliest due time."""
    due = _next_due(agenda)
    return {due} if due is not None else set()


def make_processor(config: ProcessorConfig) -> Any:
    """The :class:`StatefulProcessor` for ``transformWithStateInPandas`` (imports pyspark lazily).

    Two kinds of group (see :func:`streaming.state_keys.ledger_state_key`):

    - ``"cluster"``: the value state ``state`` holds :class:`ClusterLogic`'s state; one timer at its deadline.
    - ``"ledgers/<bucket>"``: the map state ``ledgers`` holds each ledger's :class:`LedgerLogic` state (ledger
      id → JSON); the value state ``state`` holds the bucket's *agenda* (ledger id → its next due time, only
      for ledgers that need a timer) and the bucket keeps exactly one timer, at the agenda's earliest time.
      When it fires, every ledger due by the watermark is handled at its own due time.
    """
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class AuditProcessor(StatefulProcessor):
        """Adapts :class:`ClusterLogic` / :class:`LedgerLogic` to Spark state."""

        def init(self, handle: Any) -> None:
            self.handle = handle
            self.state = handle.getValueState("state", "json STRING, cluster STRING")
            self.ledgers = handle.getMapState("ledgers", "ledger_id LONG", "json STRING")
            self.cluster_logic = ClusterLogic(config)
            self.ledger_logic = LedgerLogic(config)

        def _load(self) -> tuple[dict[str, Any] | None, str | None]:
            value = self.state.get()  # None when the group has no state (one state-server call, not two)
            if value is None:
                return None, None
            return json.loads(value[0]), value[1]

        def _save(self, state: dict[str, Any], cluster: str | None) -> None:
            self.state.update((json.dumps(state, separators=(",", ":")), cluster))

        def _set_timers(self, wanted: set[int], fired: int | None = None) -> None:
            # Inside handleExpiredTimer the firing timer is still listed but already being removed by Spark:
            # deleting it again only makes Spark log a warning per group.
            existing = set(self.handle.listTimers()) - {fired}
            for stale in existing - wanted:
                self.handle.deleteTimer(stale)
            for due in wanted - existing:
                self.handle.registerTimer(due)

        # -- one ledger inside a bucket ---------------------------------------------------------------------
        def _ledger_state(self, ledger_id: int) -> tuple[dict[str, Any] | None, str | None]:
            value = self.ledgers.getValue((ledger_id,))
            if value is None:
                return None, None
            return json.loads(value[0]), value[0]

        def _store_ledger(
            self,
            ledger_id: int,
            state: dict[str, Any],
            before: str | None,
            agenda: dict[str, int],
            due: set[int],
            tracked: set[int],
        ) -> None:
            if LedgerLogic.needs_state(state):
                encoded = json.dumps(state, separators=(",", ":"))
                if encoded != before:  # a duplicate or stale event changes nothing: no state write
                    self.ledgers.updateValue((ledger_id,), (encoded,))
                tracked.add(ledger_id)
            elif ledger_id in tracked:
                self.ledgers.removeKey((ledger_id,))
                tracked.discard(ledger_id)
            if due:
                agenda[str(ledger_id)] = min(due)
            else:
                agenda.pop(str(ledger_id), None)

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            state_key = key[0]
            if state_key == DEAD_LETTER_STATE_KEY:
                yield from _passed_through(rows)
                return
            frames = [frame for frame in rows if len(frame)]
            state, stored_cluster = self._load()
            tracked_before = set((state or {}).get("tracked") or [])
            if state_key != "cluster" and frames and _untracked_upserts(frames, tracked_before):
                clusters = [c for f in frames for c in f["cluster"].dropna().tail(1)]
                cluster = clusters[-1] if clusters else stored_cluster
                if state is None or cluster != stored_cluster:
                    agenda = dict((state or {}).get("agenda") or {})
                    self._save({"agenda": agenda, "tracked": sorted(tracked_before)}, cluster)
                yield _upserts_as_decisions(frames, cluster)
                return
            decoded = rows_from_frames(iter(frames))
            cluster = next((r["cluster"] for r in reversed(decoded) if r.get("cluster")), stored_cluster)
            if state_key == "cluster":
                new_state, out, deadline = self.cluster_logic.apply(state, decoded)
                self._set_timers({deadline} if deadline is not None else set())
                self._save(new_state, cluster)
                yield _frame(out, cluster)
                return
            before = dict((state or {}).get("agenda") or {})
            agenda, tracked = dict(before), set(tracked_before)
            out = []
            for ledger_id, ledger_rows in _by_ledger(decoded).items():
                if ledger_id in tracked:
                    ledger_state, encoded = self._ledger_state(ledger_id)
                else:
                    ledger_state, encoded = None, None  # untracked: no state-server round trip at all
                new_state, decisions, due = self.ledger_logic.apply(ledger_state, ledger_rows)
                self._store_ledger(ledger_id, new_state, encoded, agenda, due, tracked)
                out.extend(decisions)
            if state is None or agenda != before or tracked != tracked_before or cluster != stored_cluster:
                self._save({"agenda": agenda, "tracked": sorted(tracked)}, cluster)
            if _next_due(agenda) != _next_due(before):
                self._set_timers(_timer_set(agenda))
            yield _frame(out, cluster)

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
            state_key = key[0]
            at_ms = int(expiredTimerInfo.getExpiryTimeInMs())
            state, cluster = self._load()
            if state_key == "cluster":
                new_state, out, deadline = self.cluster_logic.on_timer(state, at_ms)
                self._set_timers({deadline} if deadline is not None else set(), fired=at_ms)
                self._save(new_state, cluster)
                yield _frame(out, cluster)
                return
            # Everything due by the watermark is due now (its own timer would fire in this batch anyway).
            limit = max(at_ms, int(timerValues.getCurrentWatermarkInMs()))
            before = dict((state or {}).get("agenda") or {})
            agenda, tracked = dict(before), set((state or {}).get("tracked") or [])
            out = []
            for ledger_key, due_ms in sorted(before.items(), key=lambda item: (item[1], int(item[0]))):
                if due_ms > limit:
                    continue
                ledger_id = int(ledger_key)
                ledger_state, encoded = self._ledger_state(ledger_id)
                if ledger_state is None:
                    agenda.pop(ledger_key, None)
                    tracked.discard(ledger_id)
                    continue
                new_state, decisions, due = self.ledger_logic.on_timer(ledger_state, due_ms, ledger_id)
                self._store_ledger(ledger_id, new_state, encoded, agenda, due, tracked)
                out.extend(decisions)
            self._save({"agenda": agenda, "tracked": sorted(tracked)}, cluster)
            # The fired timer is gone: always register the next one.
            self._set_timers(_timer_set(agenda), fired=at_ms)
            yield _frame(out, cluster)

        def close(self) -> None:
            pass

    return AuditProcessor()
