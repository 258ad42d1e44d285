"""Change events (``proto/change_events.proto``): build, key, encode, decode and replay them.

The watcher (``bkaudit watch``) builds events here and the streaming job decodes them with the same code, so
both sides agree on keys, validation and meaning. Pure code: no I/O (the clock is injected).

* Payload builders turn domain objects (:mod:`core.domain`) into protobuf payloads. The ledger password is
  never copied: :func:`ledger_metadata_message` only sets ``has_password``.
* :class:`EventBuilder` wraps a payload into the ``ChangeEvent`` envelope: cluster, run id, a strictly
  increasing sequence, a non-decreasing event time, and the entity key derived from the payload.
* :func:`encode_event` / :func:`decode_event` are the Kafka value codec; :func:`kafka_key` the record key.
  :func:`decode_event` raises :class:`~core.errors.FormatError` (and only that) for anything that is not a
  valid event of a schema version this code knows.
* :class:`ReplayedState` applies events the way a consumer must (highest ``mzxid`` wins, FULL snapshot
  brackets reveal what vanished) — the reference semantics for the streaming job and the tests.

Example:
    >>> builder = EventBuilder("cluster-uuid", "run-1", clock_ms=lambda: 1_000)
    >>> event = builder.build(ledger_deleted(59, last_mzxid=7, last_version=2))
    >>> event.entity_key, event.sequence, event.event_time_ms
    ('ledger/59', 1, 1000)
    >>> decode_event(encode_event(event)) == event
    True
    >>> kafka_key(event)
    b'ledger/59'
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from core.domain.metadata import DigestType, LedgerMetadata, LedgerState
from core.domain.rackmap import RackMap
from core.domain.registration import BookieServiceInfo, bookie_rpc_address
from core.domain.underreplication import CtimeZnode, UnderreplicatedLedger
from core.errors import FormatError
from core.pb import change_events_pb2 as pb

__all__ = [
    "CHECK_TIME_FIELDS",
    "CLUSTER_KEY",
    "SCHEMA_VERSION",
    "BookieStatusValue",
    "EntityKind",
    "EventBuilder",
    "ReplayedState",
    "SnapshotCounts",
    "auto_recovery_checks",
    "auto_recovery_state",
    "bookie_key",
    "bookie_probe",
    "bookie_status",
    "decode_event",
    "encode_event",
    "entity_key_of",
    "heartbeat",
    "kafka_key",
    "ledger_deleted",
    "ledger_key",
    "ledger_metadata_message",
    "ledger_undecodable",
    "ledger_upserted",
    "managed_ledger_changed",
    "managed_ledger_deleted",
    "managed_ledger_key",
    "parse_entity_key",
    "payload_type",
    "rack_map_event",
    "recovery_delay",
    "redact_reason",
    "snapshot_begin",
    "snapshot_end",
    "underreplication_cleared",
    "underreplication_set",
    "znode_stat",
]

SCHEMA_VERSION = 1
CLUSTER_KEY = "cluster"
LEDGER_KEY_PREFIX = "ledger/"
BOOKIE_KEY_PREFIX = "bookie/"
MANAGED_LEDGER_KEY_PREFIX = "managed-ledger/"
MAX_LEDGER_ID = 2**63 - 1
#: Events larger than this are refused by :func:`decode_event` (a ledger event is a few hundred bytes).
MAX_EVENT_BYTES = 8 * 1024 * 1024
#: Longest ``reason`` text an undecodable-znode event carries.
MAX_REASON_CHARS = 300

BookieStatusValue = pb.BookieStatus.Status
SnapshotReason = pb.SnapshotBegin.Reason
SnapshotMode = pb.SnapshotBegin.Mode


class ZnodeStatLike(Protocol):
    """What the builders read from a znode's stat (kazoo's ``ZnodeStat`` has these attributes)."""

    @property
    def czxid(self) -> int: ...
    @property
    def mzxid(self) -> int: ...
    @property
    def ctime(self) -> int: ...
    @property
    def mtime(self) -> int: ...
    @property
    def version(self) -> int: ...
    @property
    def dataLength(self) -> int: ...  # ZooKeeper's (and kazoo's) name


# ------------------------------------------------------------------------------------------- entity keys


class EntityKind(enum.Enum):
    """What an entity key names.

    Example:
        >>> parse_entity_key("bookie/10.0.0.1:3181")
        (<EntityKind.BOOKIE: 'bookie'>, '10.0.0.1:3181')
    """

    LEDGER = "ledger"
    BOOKIE = "bookie"
    CLUSTER = "cluster"
    MANAGED_LEDGER = "managed-ledger"


def ledger_key(ledger_id: int) -> str:
    """Entity key (and Kafka key) of a ledger.

    Example:
        >>> ledger_key(12345)
        'ledger/12345'
    """
    return f"{LEDGER_KEY_PREFIX}{ledger_id}"


def bookie_key(bookie_id: str) -> str:
    """Entity key (and Kafka key) of a bookie.

    Example:
        >>> bookie_key("bk-1")
        'bookie/bk-1'
    """
    return f"{BOOKIE_KEY_PREFIX}{bookie_id}"


def managed_ledger_key(name: str) -> str:
    """Entity key (and Kafka key) of a Pulsar managed ledger and its cursors.

    Example:
        >>> managed_ledger_key("public/default/persistent/orders")
        'managed-ledger/public/default/persistent/orders'
    """
    return f"{MANAGED_LEDGER_KEY_PREFIX}{name}"


_LEDGER_KEY = re.compile(r"ledger/(0|[1-9][0-9]{0,18})")


def parse_entity_key(key: str) -> tuple[EntityKind, int | str | None]:
    """Split an entity key into its kind and id (int for ledgers, str for bookies, None for the cluster).

    Example:
        >>> parse_entity_key("ledger/59"), parse_entity_key("cluster")
        ((<EntityKind.LEDGER: 'ledger'>, 59), (<EntityKind.CLUSTER: 'cluster'>, None))
        >>> parse_entity_key("ledger/059")
        Traceback (most recent call last):
        ...
        core.errors.FormatError: entity key 'ledger/059' is not ledger/<id>, bookie/<id> or cluster
    """
    if key == CLUSTER_KEY:
        return EntityKind.CLUSTER, None
    match = _LEDGER_KEY.fullmatch(key)
    if match is not None and int(match.group(1)) <= MAX_LEDGER_ID:
        return EntityKind.LEDGER, int(match.group(1))
    if key.startswith(BOOKIE_KEY_PREFIX) and len(key) > len(BOOKIE_KEY_PREFIX):
        return EntityKind.BOOKIE, key[len(BOOKIE_KEY_PREFIX) :]
    if key.startswith(MANAGED_LEDGER_KEY_PREFIX) and len(key) > len(MANAGED_LEDGER_KEY_PREFIX):
        return EntityKind.MANAGED_LEDGER, key[len(MANAGED_LEDGER_KEY_PREFIX) :]
    raise FormatError(f"entity key {key[:120]!r} is not ledger/<id>, bookie/<id> or cluster")


# ------------------------------------------------------------------------------------------- payloads


def znode_stat(stat: ZnodeStatLike | None) -> pb.ZnodeStat:
    """The event form of a znode ``Stat`` (all zero for None).

    Example:
        >>> from collections import namedtuple
        >>> Stat = namedtuple("Stat", "czxid mzxid ctime mtime version dataLength")
        >>> znode_stat(Stat(5, 9, 1000, 2000, 3, 120)).mzxid
        9
    """
    if stat is None:
        return pb.ZnodeStat()
    return pb.ZnodeStat(
        czxid=stat.czxid,
        mzxid=stat.mzxid,
        ctime_ms=stat.ctime,
        mtime_ms=stat.mtime,
        version=stat.version,
        data_length=stat.dataLength,
    )


_STATE = {
    LedgerState.OPEN: pb.LedgerMetadata.OPEN,
    LedgerState.IN_RECOVERY: pb.LedgerMetadata.IN_RECOVERY,
    LedgerState.CLOSED: pb.LedgerMetadata.CLOSED,
}
_DIGEST = {
    None: pb.LedgerMetadata.DIGEST_TYPE_UNSPECIFIED,
    DigestType.CRC32: pb.LedgerMetadata.CRC32,
    DigestType.HMAC: pb.LedgerMetadata.HMAC,
    DigestType.CRC32C: pb.LedgerMetadata.CRC32C,
    DigestType.DUMMY: pb.LedgerMetadata.DUMMY,
}


def ledger_metadata_message(md: LedgerMetadata) -> pb.LedgerMetadata:
    """Decoded ledger metadata as an event message — everything but the password (only ``has_password``).

    Example:
        >>> from core.domain.metadata import LedgerPassword, Segment
        >>> md = LedgerMetadata(ensemble_size=2, write_quorum=2, ack_quorum=1, digest_type=DigestType.CRC32C,
        ...                     password=LedgerPassword(b"s3cret"), segments=(Segment(0, ("b1:1", "b2:1")),),
        ...                     znode_ctime=1700000000000)
        >>> message = ledger_metadata_message(md)
        >>> message.has_password, message.creation_time_ms, message.HasField("ctime_ms")
        (True, 1700000000000, False)
        >>> b"s3cret" in message.SerializeToString()
        False
    """
    message = pb.LedgerMetadata(
        format_version=md.format_version,
        ensemble_size=md.ensemble_size,
        write_quorum=md.write_quorum,
        ack_quorum=md.ack_quorum,
        state=_STATE[md.state],
        last_entry_id=md.last_entry_id,
        length=md.length,
        digest_type=_DIGEST[md.digest_type],
        has_password=md.has_password,
        creation_time_ms=md.creation_time or 0,
    )
    segments = message.segments
    for segment in md.segments:
        segments.add(first_entry_id=segment.first_entry_id, ensemble=segment.ensemble)
    if md.ctime is not None:
        message.ctime_ms = md.ctime
    if md.ctoken is not None:
        message.ctoken = md.ctoken
    for key, value in md.custom_metadata:
        message.custom_metadata.add(key=key, value=value)
    topic = md.pulsar_topic if md.custom_metadata else None
    if topic is not None:
        message.pulsar_topic = topic
    return message


def ledger_upserted(ledger_id: int, md: LedgerMetadata, stat: ZnodeStatLike, path: str) -> pb.LedgerUpserted:
    """A ledger znode created or changed (or read by a snapshot).

    Example:
        >>> from collections import namedtuple
        >>> from core.domain.metadata import Segment
        >>> Stat = namedtuple("Stat", "czxid mzxid ctime mtime version dataLength")
        >>> md = LedgerMetadata(ensemble_size=1, write_quorum=1, ack_quorum=1,
        ...                     segments=(Segment(0, ("b:1",)),))
        >>> ledger_upserted(7, md, Stat(3, 4, 0, 0, 1, 50), "/ledgers/00/0000/L0007").znode.version
        1
    """
    return pb.LedgerUpserted(
        ledger_id=ledger_id, metadata=ledger_metadata_message(md), znode=znode_stat(stat), path=path
    )


def ledger_deleted(
    ledger_id: int, *, last_mzxid: int = 0, last_version: int = -1, inferred: bool = False
) -> pb.LedgerDeleted:
    """A ledger znode deleted (observed) or found gone by a reconciliation scan (``inferred``).

    Example:
        >>> ledger_deleted(59, inferred=True).last_version
        -1
    """
    return pb.LedgerDeleted(
        ledger_id=ledger_id, last_mzxid=last_mzxid, last_version=last_version, inferred=inferred
    )


# Quoted literals in a decoder message may be copied from the input.
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", re.DOTALL)
_TOKEN = re.compile(r"[^\s'\"(),;=\[\]{}]+")
_MIN_COPIED_TOKEN = 4


def redact_reason(reason: str, data: bytes) -> str:
    """A decoder's error message made safe to publish next to undecodable znode ``data``.

    Quoted literals are replaced by ``<…>``, and any remaining token of 4+ characters that occurs verbatim in
    ``data`` by ``…``, so no run of the znode's bytes (which may hold a password) leaks into the event. The
    result is cut to :data:`MAX_REASON_CHARS`.

    Example:
        >>> redact_reason("format version is not a number: 'foobar'", b"BookieMetadataFormatVersion\\tfoobar")
        'format version is not a number: <…>'
        >>> redact_reason("bad token hunter2x at 3:1", b"password: hunter2x")
        'bad token … at 3:1'
    """
    text = _QUOTED.sub("<…>", reason)

    def scrub(match: re.Match[str]) -> str:
        token = match.group(0)
        if len(token) >= _MIN_COPIED_TOKEN and token.encode("utf-8", "surrogatepass") in data:
            return "…"
        return token

    text = _TOKEN.sub(scrub, text)
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 1] + "…"
    return text


def ledger_undecodable(ledger_id: int, path: str, stat: ZnodeStatLike, reason: str) -> pb.LedgerUndecodable:
    """A ledger znode whose data does not decode. ``reason`` must already be redacted (:func:`redact_reason`).

    Example:
        >>> from collections import namedtuple
        >>> Stat = namedtuple("Stat", "czxid mzxid ctime mtime version dataLength")
        >>> ledger_undecodable(1, "/ledgers/00/0000/L0001", Stat(1, 1, 0, 0, 0, 3), "empty").znode.data_length
        3
    """
    return pb.LedgerUndecodable(ledger_id=ledger_id, path=path, znode=znode_stat(stat), reason=reason)


def bookie_status(
    bookie_id: str,
    status: BookieStatusValue,
    *,
    info: BookieServiceInfo | None = None,
    registration: ZnodeStatLike | None = None,
    has_cookie: bool = False,
    registration_error: str = "",
    cookie: tuple[ZnodeStatLike, bytes | None] | None = None,
) -> pb.BookieStatus:
    """A bookie's membership: WRITABLE / READ_ONLY / GONE, with its registration (endpoints, stat) if any,
    and its cookie's stat and digest when the cookie was read (``cookie``: its stat and bytes).

    Example:
        >>> from core.domain.registration import decode_bookie_service_info
        >>> info = decode_bookie_service_info("10.0.0.1:3181", b"")
        >>> message = bookie_status("10.0.0.1:3181", BookieStatusValue.WRITABLE, info=info, has_cookie=True)
        >>> message.rpc_address, message.endpoints[0].protocol
        ('10.0.0.1:3181', 'bookie-rpc')
    """
    message = pb.BookieStatus(
        bookie_id=bookie_id, status=status, has_cookie=has_cookie, registration_error=registration_error
    )
    if info is not None:
        for endpoint in info.endpoints:
            message.endpoints.add(
                id=endpoint.id,
                host=endpoint.host,
                port=endpoint.port,
                protocol=endpoint.protocol,
                auth=endpoint.auth,
                extensions=endpoint.extensions,
            )
        for key, value in info.properties:
            message.properties.add(key=key, value=value)
        address = bookie_rpc_address(info)
        if address is not None:
            message.rpc_address = str(address)
    if registration is not None:
        message.registration.CopyFrom(znode_stat(registration))
    if cookie is not None:
        message.cookie.CopyFrom(znode_stat(cookie[0]))
        message.cookie_sha256 = hashlib.sha256(cookie[1] or b"").hexdigest()
    return message


def underreplication_set(
    ledger_id: int, mark: UnderreplicatedLedger | None, stat: ZnodeStatLike, *, error: str = ""
) -> pb.UnderReplicationMark:
    """A ledger's under-replication mark exists (``mark`` None with an ``error`` when it does not parse).

    Example:
        >>> from collections import namedtuple
        >>> Stat = namedtuple("Stat", "czxid mzxid ctime mtime version dataLength")
        >>> mark = UnderreplicatedLedger(("b1:3181",), 1718000000000)
        >>> m = underreplication_set(59, mark, Stat(1, 2, 0, 0, 0, 9))
        >>> list(m.replicas), m.mark_ctime_ms, m.state == pb.UnderReplicationMark.SET
        (['b1:3181'], 1718000000000, True)
    """
    message = pb.UnderReplicationMark(
        ledger_id=ledger_id, state=pb.UnderReplicationMark.SET, znode=znode_stat(stat), error=error
    )
    if mark is not None:
        message.replicas.extend(mark.replicas)
        if mark.ctime is not None:
            message.mark_ctime_ms = mark.ctime
    return message


def underreplication_cleared(
    ledger_id: int, *, last_mzxid: int = 0, last_version: int = -1, inferred: bool = False
) -> pb.UnderReplicationMark:
    """A ledger's under-replication mark was removed (observed, or ``inferred`` by a reconciliation scan).

    Example:
        >>> underreplication_cleared(59).state == pb.UnderReplicationMark.CLEARED
        True
    """
    message = pb.UnderReplicationMark(
        ledger_id=ledger_id, state=pb.UnderReplicationMark.CLEARED, inferred=inferred
    )
    message.znode.mzxid = last_mzxid
    message.znode.version = last_version
    return message


def recovery_delay(
    seconds: int | None, *, present: bool, stat: ZnodeStatLike | None = None, error: str = ""
) -> pb.RecoveryDelay:
    """The ``lostBookieRecoveryDelay`` znode's value (None: absent or unparsable).

    Example:
        >>> recovery_delay(30, present=True).seconds
        30
        >>> recovery_delay(None, present=False).HasField("seconds")
        False
    """
    message = pb.RecoveryDelay(present=present, znode=znode_stat(stat), error=error)
    if seconds is not None:
        message.seconds = seconds
    return message


#: The field of :class:`pb.AutoRecoveryState` holding each of the Auditor's check times.
CHECK_TIME_FIELDS = {
    CtimeZnode.CHECK_ALL_LEDGERS: "check_all_ledgers_ctime_ms",
    CtimeZnode.PLACEMENT_POLICY_CHECK: "placement_policy_check_ctime_ms",
    CtimeZnode.REPLICAS_CHECK: "replicas_check_ctime_ms",
}


def auto_recovery_state(
    *,
    disabled_ctime_ms: int | None,
    votes: Iterable[tuple[int, str | None]] = (),
    locks: Iterable[tuple[int, str | None, int]] = (),
    checks: Mapping[CtimeZnode, int] | None = None,
    error: str = "",
) -> pb.AutoRecoveryState:
    """AutoRecovery's znodes: ``disable``'s ctime (None: absent), the votes as ``(sequence, bookie id)``,
    the locks as ``(ledger id, holder, ctime ms)`` and when the Auditor's checks last completed (a check
    absent never ran); votes and locks are sorted here.

    Example:
        >>> state = auto_recovery_state(disabled_ctime_ms=None, votes=[(4, "b2"), (2, "b1")],
        ...                             locks=[(9, "worker-1", 1000)],
        ...                             checks={CtimeZnode.CHECK_ALL_LEDGERS: 5_000})
        >>> state.disabled, [v.bookie_id for v in state.votes], state.locks[0].holder
        (False, ['b1', 'b2'], 'worker-1')
        >>> state.check_all_ledgers_ctime_ms, state.HasField("replicas_check_ctime_ms")
        (5000, False)
    """
    message = pb.AutoRecoveryState(
        disabled=disabled_ctime_ms is not None, disabled_ctime_ms=disabled_ctime_ms or 0, error=error
    )
    for sequence, bookie_id in sorted(votes, key=lambda vote: vote[0]):
        message.votes.add(sequence=sequence, bookie_id=bookie_id or "")
    for ledger_id, holder, ctime_ms in sorted(locks, key=lambda lock: lock[0]):
        message.locks.add(ledger_id=ledger_id, holder=holder or "", ctime_ms=ctime_ms)
    for check, ctime_ms in (checks or {}).items():
        setattr(message, CHECK_TIME_FIELDS[check], ctime_ms)
    return message


def auto_recovery_checks(state: pb.AutoRecoveryState) -> dict[CtimeZnode, int]:
    """The Auditor's check times an :class:`pb.AutoRecoveryState` carries (a check absent never ran).

    Example:
        >>> state = auto_recovery_state(disabled_ctime_ms=None, checks={CtimeZnode.REPLICAS_CHECK: 7})
        >>> auto_recovery_checks(state)
        {<CtimeZnode.REPLICAS_CHECK: 'replicascheckctime'>: 7}
    """
    return {check: getattr(state, name) for check, name in CHECK_TIME_FIELDS.items() if state.HasField(name)}


def rack_map_event(
    source: str, rack_map: RackMap | None, *, present: bool, error: str = "", source_version: int = 0
) -> pb.RackMap:
    """The whole rack map after a change; ``rack_map`` None (entries empty) with an ``error`` when invalid.

    Example:
        >>> from core.domain.rackmap import parse_rack_map
        >>> m = rack_map_event("file:/etc/racks.json", parse_rack_map('{"bk-1": "r1"}'), present=True)
        >>> m.entries[0].bookie_id, m.entries[0].rack, m.entries[0].HasField("group")
        ('bk-1', '/r1', False)
    """
    message = pb.RackMap(source=source, present=present, error=error, source_version=source_version)
    if rack_map is not None:
        for bookie_id, info in rack_map.entries:
            entry = message.entries.add(bookie_id=bookie_id)
            if info.rack is not None:
                entry.rack = info.rack
            if info.hostname is not None:
                entry.hostname = info.hostname
            if info.group is not None:
                entry.group = info.group
    return message


def snapshot_begin(
    snapshot_id: str, reason: SnapshotReason, mode: SnapshotMode, *, partition: int, partition_count: int
) -> pb.SnapshotBegin:
    """The opening marker of a snapshot bracket, for one partition.

    Example:
        >>> snapshot_begin("s1", SnapshotReason.START, SnapshotMode.FULL, partition=0, partition_count=4).mode
        1
    """
    return pb.SnapshotBegin(
        snapshot_id=snapshot_id,
        reason=reason,
        mode=mode,
        partition=partition,
        partition_count=partition_count,
    )


@dataclass
class SnapshotCounts:
    """Whole-snapshot totals carried by every :func:`snapshot_end` copy.

    Example:
        >>> SnapshotCounts(ledgers_scanned=3).ledgers_scanned
        3
    """

    ledgers_scanned: int = 0
    ledgers_published: int = 0
    ledgers_deleted: int = 0
    ledgers_undecodable: int = 0
    bookies_published: int = 0
    marks_published: int = 0


def snapshot_end(
    snapshot_id: str,
    mode: SnapshotMode,
    *,
    complete: bool,
    partition: int,
    partition_count: int,
    partition_events: int,
    counts: SnapshotCounts,
    duration_ms: int,
) -> pb.SnapshotEnd:
    """The closing marker of a snapshot bracket, for one partition.

    Example:
        >>> end = snapshot_end("s1", SnapshotMode.DELTA, complete=True, partition=1, partition_count=4,
        ...                    partition_events=2, counts=SnapshotCounts(ledgers_published=5), duration_ms=10)
        >>> end.complete, end.partition_events, end.ledgers_published
        (True, 2, 5)
    """
    return pb.SnapshotEnd(
        snapshot_id=snapshot_id,
        complete=complete,
        mode=mode,
        partition=partition,
        partition_count=partition_count,
        partition_events=partition_events,
        ledgers_scanned=counts.ledgers_scanned,
        ledgers_published=counts.ledgers_published,
        ledgers_deleted=counts.ledgers_deleted,
        ledgers_undecodable=counts.ledgers_undecodable,
        bookies_published=counts.bookies_published,
        marks_published=counts.marks_published,
        duration_ms=duration_ms,
    )


def heartbeat(
    watcher_time_ms: int, *, partition: int, partition_count: int, last_zxid: int = 0
) -> pb.Heartbeat:
    """A heartbeat for one partition (the envelope's event time is set to ``watcher_time_ms``).

    Example:
        >>> heartbeat(5000, partition=2, partition_count=4).partition
        2
    """
    return pb.Heartbeat(
        watcher_time_ms=watcher_time_ms,
        partition=partition,
        partition_count=partition_count,
        last_zxid=last_zxid,
    )


def bookie_probe(bookie_id: str, *, answered: bool, address: str, detail: str) -> pb.BookieProbe:
    """The watcher's liveness probe of a bookie whose registration vanished.

    Example:
        >>> message = bookie_probe("10.0.0.1:3181", answered=False, address="10.0.0.1:3181",
        ...                        detail="connection refused")
        >>> entity_key_of(message), message.answered
        ('bookie/10.0.0.1:3181', False)
    """
    return pb.BookieProbe(bookie_id=bookie_id, answered=answered, address=address, detail=detail)


def managed_ledger_changed(
    name: str, cursor: str, data: bytes, stat: ZnodeStatLike
) -> pb.ManagedLedgerChanged:
    """A managed ledger's znode (``cursor`` empty) or a cursor's, as read: its bytes and stat.

    Example:
        >>> entity_key_of(managed_ledger_changed("t/n/persistent/x", "", b"", None))  # type: ignore[arg-type]
        'managed-ledger/t/n/persistent/x'
    """
    return pb.ManagedLedgerChanged(name=name, cursor=cursor, znode=znode_stat(stat), data=data)


def managed_ledger_deleted(name: str, cursor: str = "", *, inferred: bool = False) -> pb.ManagedLedgerDeleted:
    """A managed ledger's znode (``cursor`` empty) or a cursor's was deleted.

    Example:
        >>> managed_ledger_deleted("t/n/persistent/x", "sub", inferred=True).inferred
        True
    """
    return pb.ManagedLedgerDeleted(name=name, cursor=cursor, inferred=inferred)


Payload = (
    pb.BookieStatus
    | pb.BookieProbe
    | pb.LedgerUpserted
    | pb.LedgerDeleted
    | pb.LedgerUndecodable
    | pb.UnderReplicationMark
    | pb.RecoveryDelay
    | pb.RackMap
    | pb.AutoRecoveryState
    | pb.SnapshotBegin
    | pb.SnapshotEnd
    | pb.Heartbeat
    | pb.ManagedLedgerChanged
    | pb.ManagedLedgerDeleted
)

_FIELD_BY_TYPE: dict[type, str] = {
    pb.BookieStatus: "bookie_status",
    pb.BookieProbe: "bookie_probe",
    pb.LedgerUpserted: "ledger_upserted",
    pb.LedgerDeleted: "ledger_deleted",
    pb.LedgerUndecodable: "ledger_undecodable",
    pb.UnderReplicationMark: "under_replication_mark",
    pb.RecoveryDelay: "recovery_delay",
    pb.RackMap: "rack_map",
    pb.AutoRecoveryState: "auto_recovery_state",
    pb.SnapshotBegin: "snapshot_begin",
    pb.SnapshotEnd: "snapshot_end",
    pb.Heartbeat: "heartbeat",
    pb.ManagedLedgerChanged: "managed_ledger_changed",
    pb.ManagedLedgerDeleted: "managed_ledger_deleted",
}
_LEDGER_PAYLOADS = ("ledger_upserted", "ledger_deleted", "ledger_undecodable", "under_replication_mark")
#: The payload field names, i.e. the values :func:`payload_type` returns.
PAYLOAD_TYPES = tuple(_FIELD_BY_TYPE.values())


def entity_key_of(payload: Payload) -> str:
    """The entity key an event with this payload must carry.

    Example:
        >>> entity_key_of(underreplication_cleared(3)), entity_key_of(recovery_delay(None, present=False))
        ('ledger/3', 'cluster')
    """
    if isinstance(payload, pb.BookieStatus | pb.BookieProbe):
        return bookie_key(payload.bookie_id)
    if isinstance(
        payload, pb.LedgerUpserted | pb.LedgerDeleted | pb.LedgerUndecodable | pb.UnderReplicationMark
    ):
        return ledger_key(payload.ledger_id)
    if isinstance(payload, pb.ManagedLedgerChanged | pb.ManagedLedgerDeleted):
        return managed_ledger_key(payload.name)
    return CLUSTER_KEY


def payload_type(event: pb.ChangeEvent) -> str:
    """The name of the payload an event carries (``""`` when none), e.g. for metrics labels.

    Example:
        >>> payload_type(pb.ChangeEvent(heartbeat=heartbeat(1, partition=0, partition_count=1)))
        'heartbeat'
    """
    return event.WhichOneof("payload") or ""


# ------------------------------------------------------------------------------------------- envelope


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class EventBuilder:
    """Wraps payloads into envelopes for one watcher run: sequence and event time are assigned here.

    Not thread-safe: one builder per emitting thread (the watcher's single worker).

    Example:
        >>> times = iter([2000, 1000])  # the wall clock steps back: event time must not
        >>> builder = EventBuilder("c", "run", clock_ms=lambda: next(times))
        >>> first = builder.build(recovery_delay(0, present=True))
        >>> second = builder.build(ledger_deleted(1), snapshot_id="snap-1")
        >>> (first.sequence, first.event_time_ms), (second.sequence, second.event_time_ms), second.snapshot_id
        ((1, 2000), (2, 2000), 'snap-1')
    """

    def __init__(self, cluster: str, run_id: str, *, clock_ms: Callable[[], int] = _wall_clock_ms) -> None:
        if not cluster:
            raise FormatError("change events need a cluster id")
        self.cluster = cluster
        self.run_id = run_id
        self._clock_ms = clock_ms
        self._sequence = itertools.count(1)
        self._last_time_ms = 0

    def now_ms(self) -> int:
        """The next event time: the clock, but never below an event time already handed out.

        Example:
            >>> EventBuilder("c", "r", clock_ms=lambda: 42).now_ms()
            42
        """
        self._last_time_ms = max(self._last_time_ms, self._clock_ms())
        return self._last_time_ms

    def build(
        self, payload: Payload, *, snapshot_id: str = "", event_time_ms: int | None = None
    ) -> pb.ChangeEvent:
        """The envelope around ``payload`` (the entity key is derived from the payload).

        ``event_time_ms`` (e.g. a heartbeat's own time) is raised to the run's last event time if lower.

        Example:
            >>> EventBuilder("c", "r", clock_ms=lambda: 5).build(heartbeat(9, partition=0, partition_count=1),
            ...                                                 event_time_ms=9).event_time_ms
            9
        """
        if event_time_ms is None:
            time_ms = self.now_ms()
        else:
            time_ms = self._last_time_ms = max(self._last_time_ms, event_time_ms)
        event = pb.ChangeEvent(
            schema_version=SCHEMA_VERSION,
            cluster=self.cluster,
            event_time_ms=time_ms,
            entity_key=entity_key_of(payload),
            watcher_run_id=self.run_id,
            sequence=next(self._sequence),
            snapshot_id=snapshot_id,
        )
        getattr(event, _FIELD_BY_TYPE[type(payload)]).CopyFrom(payload)
        return event


# ------------------------------------------------------------------------------------------- codec


def encode_event(event: pb.ChangeEvent) -> bytes:
    """The Kafka record value: the binary protobuf of the envelope (deterministic field order).

    Example:
        >>> encode_event(pb.ChangeEvent(schema_version=1))
        b'\\x08\\x01'
    """
    return event.SerializeToString(deterministic=True)


def kafka_key(event: pb.ChangeEvent) -> bytes:
    """The Kafka record key: the entity key in UTF-8.

    Example:
        >>> kafka_key(pb.ChangeEvent(entity_key="bookie/bk-1"))
        b'bookie/bk-1'
    """
    return event.entity_key.encode("utf-8")


def decode_event(data: bytes) -> pb.ChangeEvent:
    """Decode and validate a Kafka record value; anything else than a valid v1 event raises FormatError.

    Checks: protobuf parses (strings are UTF-8), ``schema_version`` is known, a cluster and exactly one
    payload are set, the entity key is the one the payload implies, ledger ids are in 0..2^63-1.

    Example:
        >>> decode_event(b"\\x08\\x02")
        Traceback (most recent call last):
        ...
        core.errors.FormatError: change event: schema version 2 is newer than this reader (1)
        >>> decode_event(b"\\xff")
        Traceback (most recent call last):
        ...
        core.errors.FormatError: change event: not a valid protobuf message
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise FormatError(f"change event: expected bytes, got {type(data).__name__}")
    if len(data) > MAX_EVENT_BYTES:
        raise FormatError(f"change event: {len(data)} bytes is more than the {MAX_EVENT_BYTES} accepted")
    event = pb.ChangeEvent()
    try:
        event.ParseFromString(bytes(data))
    except Exception:  # DecodeError, RuntimeError (recursion) ...: all bad input
        raise FormatError("change event: not a valid protobuf message") from None
    validate_event(event)
    return event


def validate_event(event: pb.ChangeEvent) -> None:
    """Raise FormatError unless ``event`` is a consistent event of a known schema version.

    Example:
        >>> validate_event(pb.ChangeEvent(schema_version=1, cluster="c", entity_key="cluster"))
        Traceback (most recent call last):
        ...
        core.errors.FormatError: change event: no payload
    """
    if event.schema_version == 0:
        raise FormatError("change event: no schema version")
    if event.schema_version > SCHEMA_VERSION:
        raise FormatError(
            f"change event: schema version {event.schema_version} "
            f"is newer than this reader ({SCHEMA_VERSION})"
        )
    if not event.cluster:
        raise FormatError("change event: no cluster")
    kind = event.WhichOneof("payload")
    if kind is None:
        raise FormatError("change event: no payload")
    payload = getattr(event, kind)
    if kind in _LEDGER_PAYLOADS and payload.ledger_id < 0:
        raise FormatError(f"change event: negative ledger id {payload.ledger_id}")
    if kind in ("bookie_status", "bookie_probe") and not payload.bookie_id:
        raise FormatError(f"change event: {kind.replace('_', ' ')} without a bookie id")
    if kind in ("managed_ledger_changed", "managed_ledger_deleted") and not payload.name:
        raise FormatError(f"change event: {kind.replace('_', ' ')} without a name")
    expected = entity_key_of(payload)
    if event.entity_key != expected:
        raise FormatError(
            f"change event: entity key {event.entity_key[:120]!r} does not match its {kind} payload "
            f"({expected[:120]!r})"
        )


# ------------------------------------------------------------------------------------------- replay


@dataclass
class LedgerRecord:
    """What a replay knows about one ledger: the last applied upsert (or undecodable read) and its stat.

    Example:
        >>> LedgerRecord(mzxid=5, version=0).undecodable_reason is None
        True
    """

    mzxid: int
    version: int
    metadata: pb.LedgerMetadata | None = None
    undecodable_reason: str | None = None


@dataclass
class ReplayedState:
    """Cluster state rebuilt from change events, applying them the way a consumer must.

    * Ledgers: an upsert (or undecodable read) applies only if its ``mzxid`` is higher than the ledger's
      last applied one, or than its tombstone after a delete; a delete removes the ledger and leaves a
      tombstone at the highest mzxid known.
    * Bookies and under-replication marks: the last event wins (they are ordered per entity key).
    * FULL snapshot brackets, per partition: an entity last seen on that partition that no event between
      the markers of a *complete* bracket mentions (snapshot or live) has vanished (ledger deleted, bookie
      GONE, mark cleared).

    ``apply`` takes the Kafka partition the event was read from (needed for the bracket rule).

    Example:
        >>> from collections import namedtuple
        >>> from core.domain.metadata import Segment
        >>> Stat = namedtuple("Stat", "czxid mzxid ctime mtime version dataLength")
        >>> md = LedgerMetadata(ensemble_size=1, write_quorum=1, ack_quorum=1,
        ...                     segments=(Segment(0, ("b:1",)),))
        >>> b = EventBuilder("c", "r", clock_ms=lambda: 0)
        >>> state = ReplayedState()
        >>> state.apply(b.build(ledger_upserted(1, md, Stat(1, 9, 0, 0, 2, 10), "/p")), partition=0)
        >>> state.apply(b.build(ledger_upserted(1, md, Stat(1, 5, 0, 0, 1, 10), "/p")), partition=0)  # stale
        >>> state.ledger_versions()
        {1: (9, 2)}
    """

    ledgers: dict[int, LedgerRecord] = field(default_factory=dict)
    tombstones: dict[int, int] = field(default_factory=dict)
    bookies: dict[str, pb.BookieStatus] = field(default_factory=dict)
    marks: dict[int, pb.UnderReplicationMark] = field(default_factory=dict)
    recovery_delay: pb.RecoveryDelay | None = None
    rack_map: pb.RackMap | None = None
    auto_recovery: pb.AutoRecoveryState | None = None
    clusters: set[str] = field(default_factory=set)
    last_heartbeat_ms: dict[int, int] = field(default_factory=dict)
    completed_snapshots: list[str] = field(default_factory=list)
    # entity key -> partition it was last seen on; open FULL brackets: partition -> (snapshot id, seen). A
    # ledger key stands for two things (metadata and under-replication mark), so "seen" holds (key, family).
    _partition_of: dict[str, int] = field(default_factory=dict)
    _open_full: dict[int, tuple[str, set[tuple[str, str]]]] = field(default_factory=dict)

    def apply_all(self, events: Iterable[tuple[pb.ChangeEvent, int]]) -> ReplayedState:
        """Apply ``(event, partition)`` pairs in order; returns self.

        Example:
            >>> ReplayedState().apply_all([]).ledgers
            {}
        """
        for event, partition in events:
            self.apply(event, partition=partition)
        return self

    def apply(self, event: pb.ChangeEvent, *, partition: int) -> None:
        """Apply one event read from ``partition``."""
        self.clusters.add(event.cluster)
        kind = event.WhichOneof("payload")
        if kind == "heartbeat":
            self.last_heartbeat_ms[partition] = event.heartbeat.watcher_time_ms
            return
        if kind == "snapshot_begin":
            if event.snapshot_begin.mode == pb.SnapshotBegin.FULL:
                self._open_full[partition] = (event.snapshot_begin.snapshot_id, set())
            return
        if kind == "snapshot_end":
            self._close_bracket(event.snapshot_end, partition)
            return
        if event.entity_key != CLUSTER_KEY:
            self._partition_of[event.entity_key] = partition
            bracket = self._open_full.get(partition)
            # Live events inside the bracket count too: an entity created after the scan passed its
            # directory is only ever seen live, and it exists all the same.
            if bracket is not None:
                family = "mark" if kind == "under_replication_mark" else kind.split("_")[0]
                bracket[1].add((event.entity_key, family))
        if kind == "ledger_upserted":
            upsert = event.ledger_upserted
            self._put_ledger(upsert.ledger_id, upsert.znode, upsert.metadata, None)
        elif kind == "ledger_undecodable":
            bad = event.ledger_undecodable
            self._put_ledger(bad.ledger_id, bad.znode, None, bad.reason)
        elif kind == "ledger_deleted":
            self._delete_ledger(event.ledger_deleted.ledger_id, event.ledger_deleted.last_mzxid)
        elif kind == "bookie_status":
            self.bookies[event.bookie_status.bookie_id] = event.bookie_status
        elif kind == "under_replication_mark":
            mark = event.under_replication_mark
            if mark.state == pb.UnderReplicationMark.SET:
                self.marks[mark.ledger_id] = mark
            else:
                self.marks.pop(mark.ledger_id, None)
        elif kind == "recovery_delay":
            self.recovery_delay = event.recovery_delay
        elif kind == "rack_map":
            self.rack_map = event.rack_map
        elif kind == "auto_recovery_state":
            self.auto_recovery = event.auto_recovery_state

    def _put_ledger(
        self, ledger_id: int, stat: pb.ZnodeStat, metadata: pb.LedgerMetadata | None, reason: str | None
    ) -> None:
        current = self.ledgers.get(ledger_id)
        floor = current.mzxid if current is not None else self.tombstones.get(ledger_id, -1)
        if stat.mzxid <= floor:
            return  # duplicate or stale read
        self.tombstones.pop(ledger_id, None)
        self.ledgers[ledger_id] = LedgerRecord(stat.mzxid, stat.version, metadata, reason)

    def _delete_ledger(self, ledger_id: int, last_mzxid: int) -> None:
        current = self.ledgers.pop(ledger_id, None)
        known = max(
            last_mzxid, current.mzxid if current is not None else 0, self.tombstones.get(ledger_id, 0)
        )
        self.tombstones[ledger_id] = known

    def _close_bracket(self, end: pb.SnapshotEnd, partition: int) -> None:
        bracket = self._open_full.get(partition)
        if bracket is None or bracket[0] != end.snapshot_id:
            return
        del self._open_full[partition]
        if not end.complete:
            return
        seen = bracket[1]
        self.completed_snapshots.append(end.snapshot_id)
        for key in [key for key, p in self._partition_of.items() if p == partition]:
            entity, entity_id = parse_entity_key(key)
            if entity is EntityKind.LEDGER and isinstance(entity_id, int):
                if (key, "ledger") not in seen and entity_id in self.ledgers:
                    self._delete_ledger(entity_id, 0)
                if (key, "mark") not in seen:
                    self.marks.pop(entity_id, None)
            elif (
                entity is EntityKind.BOOKIE
                and isinstance(entity_id, str)
                and (key, "bookie") not in seen
                and entity_id in self.bookies
            ):
                self.bookies[entity_id] = pb.BookieStatus(bookie_id=entity_id, status=pb.BookieStatus.GONE)

    # ----------------------------------------------------------------------------------------- views

    def ledger_versions(self) -> dict[int, tuple[int, int]]:
        """``{ledger id: (mzxid, version)}`` of every live ledger (decodable or not)."""
        return {ledger_id: (r.mzxid, r.version) for ledger_id, r in self.ledgers.items()}

    def bookie_statuses(self) -> dict[str, str]:
        """``{bookie id: "WRITABLE" | "READ_ONLY" | "GONE"}`` for every bookie seen."""
        return {b: pb.BookieStatus.Status.Name(s.status) for b, s in self.bookies.items()}

    def live_bookie_statuses(self) -> dict[str, str]:
        """Like :meth:`bookie_statuses` without the GONE bookies."""
        return {b: s for b, s in self.bookie_statuses().items() if s != "GONE"}

    def mark_replicas(self) -> dict[int, tuple[str, ...]]:
        """``{ledger id: replicas}`` of every current under-replication mark."""
        return {ledger_id: tuple(m.replicas) for ledger_id, m in self.marks.items()}
