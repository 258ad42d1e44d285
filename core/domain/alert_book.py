"""The set of open alerts and the firing → resolved transitions a batch causes (pure).

The sink loads the open alerts (as of before the batch), asks :meth:`AlertBook.set_condition` for each
condition it evaluated, and publishes :attr:`AlertBook.transitions` in order. One condition per
``(entity, kind)`` is open at a time; a condition that keeps holding keeps its alert (and its id).

Example:
    >>> from core.domain.alerts import AlertKind
    >>> book = AlertBook("c1")
    >>> _ = book.set_ledger_condition(AlertKind.PLACEMENT_SOFT, 7, True, at_ms=10)
    >>> _ = book.set_ledger_condition(AlertKind.PLACEMENT_SOFT, 7, True, at_ms=20)  # still the same alert
    >>> _ = book.set_ledger_condition(AlertKind.PLACEMENT_SOFT, 7, False, at_ms=30)
    >>> [(a.state.value, a.detected_at_ms) for a in book.transitions]
    [('firing', 10), ('resolved', 30)]
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from core.domain.alerts import Alert, AlertKind, AlertState, topic_entity


def _ms(value: Any) -> int:
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=UTC)
        return int(moment.timestamp() * 1000)
    return int(value)


def alert_from_row(row: dict[str, Any]) -> Alert:
    """An ``open_alerts`` row back to an :class:`Alert` (same id)."""
    kind = AlertKind(row["kind"])
    return Alert(
        cluster=row["cluster"],
        kind=kind,
        entity=row["entity"],
        started_at_ms=_ms(row["started_at"]),
        detected_at_ms=_ms(row["detected_at"]),
        ledger_id=row.get("ledger_id"),
        bookies=tuple(row.get("bookies") or ()),
        pulsar_topic=row.get("pulsar_topic"),
        detail=json.loads(row["detail"]) if row.get("detail") else {},
    )


def alert_to_row(alert: Alert) -> dict[str, Any]:
    """An :class:`Alert` as an ``open_alerts`` / ``violations`` row (timestamps in UTC)."""
    return {
        "alert_id": alert.alert_id,
        "cluster": alert.cluster,
        "kind": alert.kind.value,
        "state": alert.state.value,
        "entity": alert.entity,
        "severity": alert.kind.severity,
        "ledger_id": alert.ledger_id,
        "bookies": list(alert.bookies),
        "pulsar_topic": alert.pulsar_topic,
        "started_at": datetime.fromtimestamp(alert.started_at_ms / 1000, tz=UTC),
        "detected_at": datetime.fromtimestamp(alert.detected_at_ms / 1000, tz=UTC),
        "detected_date": datetime.fromtimestamp(alert.detected_at_ms / 1000, tz=UTC).date(),
        "detail": json.dumps(alert.detail, separators=(",", ":"), sort_keys=True),
    }


@dataclass
class AlertBook:
    """Open alerts by ``(entity, kind)`` plus the transitions recorded since construction."""

    cluster: str
    open: dict[tuple[str, AlertKind], Alert] = field(default_factory=dict)
    transitions: list[Alert] = field(default_factory=list)

    @classmethod
    def from_rows(cls, cluster: str, rows: Iterable[dict[str, Any]]) -> AlertBook:
        book = cls(cluster)
        for row in rows:
            alert = alert_from_row(row)
            book.open[(alert.entity, alert.kind)] = alert
        return book

    def is_open(self, entity: str, kind: AlertKind) -> bool:
        return (entity, kind) in self.open

    def kinds_open(self, entity: str) -> list[AlertKind]:
        return sorted((k for e, k in self.open if e == entity), key=lambda k: k.value)

    def _fire(self, alert: Alert) -> Alert:
        self.open[(alert.entity, alert.kind)] = alert
        self.transitions.append(alert)
        return alert

    def _resolve(
        self, entity: str, kind: AlertKind, at_ms: int, detail: dict[str, Any] | None = None
    ) -> Alert | None:
        alert = self.open.pop((entity, kind), None)
        if alert is None:
            return None
        resolved = alert.resolved(at_ms=max(at_ms, alert.detected_at_ms), detail=detail)
        self.transitions.append(resolved)
        return resolved

    def set_ledger_condition(
        self,
        kind: AlertKind,
        ledger_id: int,
        holds: bool,
        *,
        at_ms: int,
        bookies: Iterable[str] = (),
        pulsar_topic: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> Alert | None:
        """Fire when ``holds`` and not open; resolve when open and not ``holds``; returns the transition."""
        entity = f"ledger/{ledger_id}"
        if holds:
            if (entity, kind) in self.open:
                return None
            return self._fire(
                Alert.ledger(
                    cluster=self.cluster,
                    kind=kind,
                    ledger_id=ledger_id,
                    started_at_ms=at_ms,
                    detected_at_ms=at_ms,
                    bookies=list(bookies),
                    pulsar_topic=pulsar_topic,
                    detail=detail,
                )
            )
        return self._resolve(entity, kind, at_ms, detail)

    def set_topic_condition(
        self,
        kind: AlertKind,
        managed_ledger: str,
        holds: bool,
        *,
        at_ms: int,
        started_at_ms: int | None = None,
        ledger_id: int | None = None,
        pulsar_topic: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> Alert | None:
        """Like :meth:`set_ledger_condition`, for a managed ledger (or one ledger it lists); a firing
        condition started at ``started_at_ms`` (default ``at_ms``: detected when it started).

        Example:
            >>> book = AlertBook("c")
            >>> book.set_topic_condition(AlertKind.TOPIC_LEDGER_MISSING, "t/n/persistent/x", True, at_ms=5,
            ...                          ledger_id=7).entity
            'topic/t/n/persistent/x/ledger/7'
        """
        entity = topic_entity(managed_ledger, ledger_id)
        if holds:
            if (entity, kind) in self.open:
                return None
            return self._fire(
                Alert.topic(
                    cluster=self.cluster,
                    kind=kind,
                    managed_ledger=managed_ledger,
                    ledger_id=ledger_id,
                    started_at_ms=at_ms if started_at_ms is None else started_at_ms,
                    detected_at_ms=at_ms,
                    pulsar_topic=pulsar_topic,
                    detail=detail,
                )
            )
        return self._resolve(entity, kind, at_ms, detail)

    def set_bookie_condition(
        self,
        kind: AlertKind,
        bookie_id: str,
        holds: bool,
        *,
        at_ms: int,
        detail: dict[str, Any] | None = None,
    ) -> Alert | None:
        entity = f"bookie/{bookie_id}"
        if holds:
            if (entity, kind) in self.open:
                return None
            return self._fire(
                Alert.bookie(
                    cluster=self.cluster,
                    kind=kind,
                    bookie_id=bookie_id,
                    started_at_ms=at_ms,
                    detected_at_ms=at_ms,
                    detail=detail,
                )
            )
        return self._resolve(entity, kind, at_ms, detail)

    def set_cluster_condition(
        self, kind: AlertKind, holds: bool, *, at_ms: int, detail: dict[str, Any] | None = None
    ) -> Alert | None:
        """Like :meth:`set_ledger_condition`, for a cluster-level kind (``RACK_MAP_INVALID``...)."""
        entity = kind.cluster_entity
        if holds:
            if (entity, kind) in self.open:
                return None
            return self._fire(
                Alert.cluster_level(
                    cluster=self.cluster, kind=kind, started_at_ms=at_ms, detected_at_ms=at_ms, detail=detail
                )
            )
        return self._resolve(entity, kind, at_ms, detail)

    def resolve_entity(self, entity: str, at_ms: int, reason: str) -> list[Alert]:
        """Resolve every open alert of ``entity`` (a deleted ledger, for example)."""
        return [
            resolved
            for kind in self.kinds_open(entity)
            if (resolved := self._resolve(entity, kind, at_ms, {"resolution": reason})) is not None
        ]

    @property
    def resolved_ids(self) -> list[str]:
        return [a.alert_id for a in self.transitions if a.state is AlertState.RESOLVED]
