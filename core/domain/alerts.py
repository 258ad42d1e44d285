"""Alerts as published on ``bkaudit.alerts`` and recorded in the ``violations`` table (docs/alerts.md,
"The alert object").

An alert is one *condition* (a kind on one entity, starting at an event time) in one *state*: ``firing``
when detected, ``resolved`` when it no longer holds. Its ``alert_id`` is a hash of the cluster, the kind, the
entity and the event time at which the condition started, so the same condition has the same id across
restarts and replays (event times come from the change stream, not from the wall clock), and a condition
that resolves and later fires again gets a new id.

Pure: no I/O, no Spark.

Example:
    >>> alert = Alert.ledger(cluster="c1", kind=AlertKind.LEDGER_UNDER_REPLICATED, ledger_id=7,
    ...     bookies=["b1"], started_at_ms=1_700_000_000_000, detected_at_ms=1_700_000_000_500)
    >>> alert.kafka_key()
    'c1/ledger/7'
    >>> alert.to_json()["state"], alert.to_json()["severity"], alert.to_json()["detected_at"]
    ('firing', 'warning', '2023-11-14T22:13:20.500Z')
    >>> alert.resolved(at_ms=1_700_000_100_000).alert_id == alert.alert_id
    True
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any


class AlertKind(enum.Enum):
    """Every alert kind (docs/alerts.md has a section and an example alert object per kind)."""

    LEDGER_UNDER_REPLICATED = "LEDGER_UNDER_REPLICATED"
    LEDGER_UNRECOVERABLE = "LEDGER_UNRECOVERABLE"
    PLACEMENT_NOT_ADHERING = "PLACEMENT_NOT_ADHERING"
    PLACEMENT_SOFT = "PLACEMENT_SOFT"
    PLACEMENT_ISOLATION_VIOLATED = "PLACEMENT_ISOLATION_VIOLATED"
    REPLICAS_NO_REPLICA = "REPLICAS_NO_REPLICA"
    REPLICAS_LESS_THAN_AQ = "REPLICAS_LESS_THAN_AQ"
    REPLICAS_LESS_THAN_WQ = "REPLICAS_LESS_THAN_WQ"
    BOOKIE_LOST = "BOOKIE_LOST"
    BOOKIE_UNRESPONSIVE = "BOOKIE_UNRESPONSIVE"
    # A live bookie that refuses bkaudit's TLS or credentials (or wants ones it was not given).
    BOOKIE_AUTH_REFUSED = "BOOKIE_AUTH_REFUSED"
    UNDER_REPLICATION_STUCK = "UNDER_REPLICATION_STUCK"
    METADATA_CORRUPT = "METADATA_CORRUPT"
    RACK_MAP_INVALID = "RACK_MAP_INVALID"
    AUTORECOVERY_DISABLED = "AUTORECOVERY_DISABLED"
    AUDITOR_MISSING = "AUDITOR_MISSING"
    REPLICATION_STALLED = "REPLICATION_STALLED"
    ZOOKEEPER_DISRUPTION = "ZOOKEEPER_DISRUPTION"
    AUDITOR_CHECKS_OVERDUE = "AUDITOR_CHECKS_OVERDUE"
    # At-risk ledgers BookKeeper's Auditor has not marked under-replicated past a grace.
    AUDITOR_LAGGING = "AUDITOR_LAGGING"

    # Pulsar's managed ledgers against BookKeeper (core.domain.rules.topics).
    TOPIC_LEDGER_MISSING = "TOPIC_LEDGER_MISSING"
    LEDGER_ORPHANED = "LEDGER_ORPHANED"

    @property
    def severity(self) -> str:
        """``critical`` when data is or may be gone, ``warning`` when redundancy is reduced, else ``info``."""
        return _SEVERITY[self]

    @property
    def is_bookie_kind(self) -> bool:
        return self in (AlertKind.BOOKIE_LOST, AlertKind.BOOKIE_UNRESPONSIVE, AlertKind.BOOKIE_AUTH_REFUSED)

    @property
    def is_topic_kind(self) -> bool:
        """A condition of one ledger a Pulsar managed ledger lists (entity :func:`topic_entity`).

        Example:
            >>> AlertKind.TOPIC_LEDGER_MISSING.is_topic_kind, AlertKind.LEDGER_ORPHANED.is_topic_kind
            (True, False)
        """
        return self is AlertKind.TOPIC_LEDGER_MISSING

    @property
    def is_cluster_kind(self) -> bool:
        """A condition of the whole cluster (entity :attr:`cluster_entity`), not of one ledger or bookie."""
        return self in _CLUSTER_ENTITIES

    @property
    def cluster_entity(self) -> str:
        """The entity of a cluster-level kind (Kafka key ``<cluster>/<entity>``).

        Example:
            >>> AlertKind.AUTORECOVERY_DISABLED.cluster_entity
            'autorecovery'
        """
        return _CLUSTER_ENTITIES[self]


def topic_entity(managed_ledger: str, ledger_id: int | None = None) -> str:
    """The entity of a managed ledger's alert, or of one ledger it lists.

    Example:
        >>> topic_entity("public/default/persistent/t"), topic_entity("public/default/persistent/t", 7)
        ('topic/public/default/persistent/t', 'topic/public/default/persistent/t/ledger/7')
    """
    entity = f"topic/{managed_ledger}"
    return entity if ledger_id is None else f"{entity}/ledger/{ledger_id}"


RACK_MAP_ENTITY = "rackmap"
"""Entity of :attr:`AlertKind.RACK_MAP_INVALID`, the cluster's one rack map (key ``<cluster>/rackmap``)."""

_CLUSTER_ENTITIES = {
    AlertKind.RACK_MAP_INVALID: RACK_MAP_ENTITY,
    AlertKind.AUTORECOVERY_DISABLED: "autorecovery",
    AlertKind.AUDITOR_MISSING: "auditor",
    AlertKind.AUDITOR_CHECKS_OVERDUE: "auditor-checks",
    AlertKind.ZOOKEEPER_DISRUPTION: "zookeeper",
    # The Auditor's marks lagging behind the losses.
    AlertKind.AUDITOR_LAGGING: "auditor-lag",
}

_SEVERITY = {
    AlertKind.LEDGER_UNRECOVERABLE: "critical",
    AlertKind.REPLICAS_NO_REPLICA: "critical",
    AlertKind.REPLICAS_LESS_THAN_AQ: "critical",
    AlertKind.METADATA_CORRUPT: "critical",
    AlertKind.TOPIC_LEDGER_MISSING: "critical",
    AlertKind.LEDGER_ORPHANED: "warning",
    AlertKind.LEDGER_UNDER_REPLICATED: "warning",
    AlertKind.REPLICAS_LESS_THAN_WQ: "warning",
    AlertKind.BOOKIE_LOST: "warning",
    AlertKind.BOOKIE_UNRESPONSIVE: "warning",
    AlertKind.BOOKIE_AUTH_REFUSED: "warning",
    AlertKind.UNDER_REPLICATION_STUCK: "warning",
    AlertKind.PLACEMENT_NOT_ADHERING: "warning",
    AlertKind.PLACEMENT_ISOLATION_VIOLATED: "warning",
    AlertKind.RACK_MAP_INVALID: "warning",
    AlertKind.AUTORECOVERY_DISABLED: "warning",
    AlertKind.AUDITOR_MISSING: "warning",
    AlertKind.REPLICATION_STALLED: "warning",
    AlertKind.AUDITOR_CHECKS_OVERDUE: "warning",
    AlertKind.ZOOKEEPER_DISRUPTION: "warning",
    # The Auditor's marks lagging behind the losses.
    AlertKind.AUDITOR_LAGGING: "warning",
    AlertKind.PLACEMENT_SOFT: "info",
}


class AlertState(enum.Enum):
    FIRING = "firing"
    RESOLVED = "resolved"


@functools.lru_cache(maxsize=1024)  # a lost bookie's thousands of alerts share a handful of timestamps
def rfc3339_ms(epoch_ms: int) -> str:
    """``2023-11-14T22:13:20.500Z`` for an epoch in milliseconds (UTC, millisecond precision).

    Example:
        >>> rfc3339_ms(0)
        '1970-01-01T00:00:00.000Z'
    """
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


def make_alert_id(cluster: str, kind: AlertKind, entity: str, started_at_ms: int) -> str:
    """The stable id of one condition: 32 hex digits of SHA-256 over its identity.

    Example:
        >>> first = make_alert_id("c", AlertKind.BOOKIE_LOST, "bookie/b1", 5)
        >>> first == make_alert_id("c", AlertKind.BOOKIE_LOST, "bookie/b1", 5), len(first)
        (True, 32)
    """
    return alert_id_of(cluster, kind.value, entity, started_at_ms)


def alert_id_of(cluster: str, kind: str, entity: str, started_at_ms: int) -> str:
    """:func:`make_alert_id` with the kind as its name (the columnar form calls it per row).

    Example:
        >>> alert_id_of("c", "BOOKIE_LOST", "bookie/b1", 5) == make_alert_id("c", AlertKind.BOOKIE_LOST,
        ...                                                                "bookie/b1", 5)
        True
    """
    identity = f"{cluster}\x1f{kind}\x1f{entity}\x1f{started_at_ms}".encode()
    return hashlib.sha256(identity).hexdigest()[:32]


@dataclass(frozen=True)
class Alert:
    """One alert transition. Build with :meth:`ledger` or :meth:`bookie`."""

    cluster: str
    kind: AlertKind
    entity: str  # "ledger/<id>" or "bookie/<id>"
    started_at_ms: int
    detected_at_ms: int
    state: AlertState = AlertState.FIRING
    ledger_id: int | None = None
    bookies: tuple[str, ...] = ()
    pulsar_topic: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def ledger(
        cls,
        *,
        cluster: str,
        kind: AlertKind,
        ledger_id: int,
        started_at_ms: int,
        detected_at_ms: int,
        bookies: list[str] | tuple[str, ...] = (),
        pulsar_topic: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> Alert:
        """A ledger alert (every kind except the bookie and cluster kinds)."""
        if kind.is_bookie_kind or kind.is_cluster_kind:
            raise ValueError(f"{kind.value} is not a ledger alert")
        return cls(
            cluster,
            kind,
            f"ledger/{ledger_id}",
            started_at_ms,
            detected_at_ms,
            ledger_id=ledger_id,
            bookies=tuple(sorted(bookies)),
            pulsar_topic=pulsar_topic,
            detail=dict(detail or {}),
        )

    @classmethod
    def topic(
        cls,
        *,
        cluster: str,
        kind: AlertKind,
        managed_ledger: str,
        started_at_ms: int,
        detected_at_ms: int,
        ledger_id: int | None = None,
        pulsar_topic: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> Alert:
        """A managed ledger's alert (entity :func:`topic_entity`): ``METADATA_CORRUPT`` of its znode, or
        ``TOPIC_LEDGER_MISSING`` of one ledger it lists.

        Example:
            >>> Alert.topic(cluster="c", kind=AlertKind.TOPIC_LEDGER_MISSING,
            ...             managed_ledger="t/n/persistent/x", ledger_id=7, started_at_ms=1,
            ...             detected_at_ms=2).kafka_key()
            'c/topic/t/n/persistent/x/ledger/7'
        """
        if kind.is_bookie_kind or kind.is_cluster_kind:
            raise ValueError(f"{kind.value} is not a topic alert")
        return cls(
            cluster,
            kind,
            topic_entity(managed_ledger, ledger_id),
            started_at_ms,
            detected_at_ms,
            ledger_id=ledger_id,
            pulsar_topic=pulsar_topic,
            detail=dict(detail or {}),
        )

    @classmethod
    def bookie(
        cls,
        *,
        cluster: str,
        kind: AlertKind,
        bookie_id: str,
        started_at_ms: int,
        detected_at_ms: int,
        detail: dict[str, Any] | None = None,
    ) -> Alert:
        """A bookie alert (``BOOKIE_LOST``, ``BOOKIE_UNRESPONSIVE``).

        Example:
            >>> Alert.bookie(cluster="c", kind=AlertKind.BOOKIE_LOST, bookie_id="b1",
            ...              started_at_ms=1, detected_at_ms=2).kafka_key()
            'c/bookie/b1'
        """
        if not kind.is_bookie_kind:
            raise ValueError(f"{kind.value} is not a bookie alert")
        return cls(
            cluster,
            kind,
            f"bookie/{bookie_id}",
            started_at_ms,
            detected_at_ms,
            bookies=(bookie_id,),
            detail=dict(detail or {}),
        )

    @classmethod
    def cluster_level(
        cls,
        *,
        cluster: str,
        kind: AlertKind,
        started_at_ms: int,
        detected_at_ms: int,
        detail: dict[str, Any] | None = None,
    ) -> Alert:
        """A cluster-level alert (``RACK_MAP_INVALID``, ``AUTORECOVERY_DISABLED``, ``AUDITOR_MISSING``,
        ``AUDITOR_CHECKS_OVERDUE``, ``ZOOKEEPER_DISRUPTION``, ``AUDITOR_LAGGING``): no ledger, no bookies.

        Example:
            >>> Alert.cluster_level(cluster="c", kind=AlertKind.RACK_MAP_INVALID,
            ...                     started_at_ms=1, detected_at_ms=2).kafka_key()
            'c/rackmap'
        """
        if not kind.is_cluster_kind:
            raise ValueError(f"{kind.value} is not a cluster-level alert")
        entity = kind.cluster_entity
        return cls(cluster, kind, entity, started_at_ms, detected_at_ms, detail=dict(detail or {}))

    @functools.cached_property
    def alert_id(self) -> str:
        # Cached: the id is read several times per alert (book, tables, logs) and costs a SHA-256.
        return make_alert_id(self.cluster, self.kind, self.entity, self.started_at_ms)

    def resolved(self, *, at_ms: int, detail: dict[str, Any] | None = None) -> Alert:
        """The resolution of this condition (same ``alert_id``)."""
        merged = {**self.detail, **(detail or {})}
        return replace(self, state=AlertState.RESOLVED, detected_at_ms=at_ms, detail=merged)

    def kafka_key(self) -> str:
        return f"{self.cluster}/{self.entity}"

    def to_json(self) -> dict[str, Any]:
        """The alert object as published (docs/alerts.md, "The alert object")."""
        return {
            "alert_id": self.alert_id,
            "cluster": self.cluster,
            "kind": self.kind.value,
            "state": self.state.value,
            "severity": self.kind.severity,
            "ledger_id": self.ledger_id,
            "bookies": list(self.bookies),
            "pulsar_topic": self.pulsar_topic,
            "detected_at": rfc3339_ms(self.detected_at_ms),
            "detail": self.detail,
        }

    def to_bytes(self) -> bytes:
        """UTF-8 JSON value for Kafka."""
        return alert_bytes(self.to_json())


def alert_bytes(body: dict[str, Any]) -> bytes:
    """An alert object (:meth:`Alert.to_json`) as the UTF-8 JSON value published on Kafka.

    Example:
        >>> alert_bytes({"kind": "BOOKIE_LOST", "detail": {}})
        b'{"kind":"BOOKIE_LOST","detail":{}}'
    """
    return _ALERT_ENCODER.encode(body).encode()


# One encoder (json.dumps with options builds a new one per call: a measurable cost at 30 k alerts).
_ALERT_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=False)
