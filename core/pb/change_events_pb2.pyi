from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChangeEvent(_message.Message):
    __slots__ = ("schema_version", "cluster", "event_time_ms", "entity_key", "watcher_run_id", "sequence", "snapshot_id", "bookie_status", "ledger_upserted", "ledger_deleted", "ledger_undecodable", "under_replication_mark", "recovery_delay", "rack_map", "snapshot_begin", "snapshot_end", "heartbeat", "auto_recovery_state", "bookie_probe", "managed_ledger_changed", "managed_ledger_deleted")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    ENTITY_KEY_FIELD_NUMBER: _ClassVar[int]
    WATCHER_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    BOOKIE_STATUS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_UPSERTED_FIELD_NUMBER: _ClassVar[int]
    LEDGER_DELETED_FIELD_NUMBER: _ClassVar[int]
    LEDGER_UNDECODABLE_FIELD_NUMBER: _ClassVar[int]
    UNDER_REPLICATION_MARK_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_DELAY_FIELD_NUMBER: _ClassVar[int]
    RACK_MAP_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_BEGIN_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_END_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    AUTO_RECOVERY_STATE_FIELD_NUMBER: _ClassVar[int]
    BOOKIE_PROBE_FIELD_NUMBER: _ClassVar[int]
    MANAGED_LEDGER_CHANGED_FIELD_NUMBER: _ClassVar[int]
    MANAGED_LEDGER_DELETED_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    cluster: str
    event_time_ms: int
    entity_key: str
    watcher_run_id: str
    sequence: int
    snapshot_id: str
    bookie_status: BookieStatus
    ledger_upserted: LedgerUpserted
    ledger_deleted: LedgerDeleted
    ledger_undecodable: LedgerUndecodable
    under_replication_mark: UnderReplicationMark
    recovery_delay: RecoveryDelay
    rack_map: RackMap
    snapshot_begin: SnapshotBegin
    snapshot_end: SnapshotEnd
    heartbeat: Heartbeat
    auto_recovery_state: AutoRecoveryState
    bookie_probe: BookieProbe
    managed_ledger_changed: ManagedLedgerChanged
    managed_ledger_deleted: ManagedLedgerDeleted
    def __init__(self, schema_version: _Optional[int] = ..., cluster: _Optional[str] = ..., event_time_ms: _Optional[int] = ..., entity_key: _Optional[str] = ..., watcher_run_id: _Optional[str] = ..., sequence: _Optional[int] = ..., snapshot_id: _Optional[str] = ..., bookie_status: _Optional[_Union[BookieStatus, _Mapping]] = ..., ledger_upserted: _Optional[_Union[LedgerUpserted, _Mapping]] = ..., ledger_deleted: _Optional[_Union[LedgerDeleted, _Mapping]] = ..., ledger_undecodable: _Optional[_Union[LedgerUndecodable, _Mapping]] = ..., under_replication_mark: _Optional[_Union[UnderReplicationMark, _Mapping]] = ..., recovery_delay: _Optional[_Union[RecoveryDelay, _Mapping]] = ..., rack_map: _Optional[_Union[RackMap, _Mapping]] = ..., snapshot_begin: _Optional[_Union[SnapshotBegin, _Mapping]] = ..., snapshot_end: _Optional[_Union[SnapshotEnd, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., auto_recovery_state: _Optional[_Union[AutoRecoveryState, _Mapping]] = ..., bookie_probe: _Optional[_Union[BookieProbe, _Mapping]] = ..., managed_ledger_changed: _Optional[_Union[ManagedLedgerChanged, _Mapping]] = ..., managed_ledger_deleted: _Optional[_Union[ManagedLedgerDeleted, _Mapping]] = ...) -> None: ...

class ZnodeStat(_message.Message):
    __slots__ = ("czxid", "mzxid", "ctime_ms", "mtime_ms", "version", "data_length")
    CZXID_FIELD_NUMBER: _ClassVar[int]
    MZXID_FIELD_NUMBER: _ClassVar[int]
    CTIME_MS_FIELD_NUMBER: _ClassVar[int]
    MTIME_MS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DATA_LENGTH_FIELD_NUMBER: _ClassVar[int]
    czxid: int
    mzxid: int
    ctime_ms: int
    mtime_ms: int
    version: int
    data_length: int
    def __init__(self, czxid: _Optional[int] = ..., mzxid: _Optional[int] = ..., ctime_ms: _Optional[int] = ..., mtime_ms: _Optional[int] = ..., version: _Optional[int] = ..., data_length: _Optional[int] = ...) -> None: ...

class BookieStatus(_message.Message):
    __slots__ = ("bookie_id", "status", "endpoints", "properties", "rpc_address", "has_cookie", "registration", "registration_error", "cookie", "cookie_sha256")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATUS_UNSPECIFIED: _ClassVar[BookieStatus.Status]
        WRITABLE: _ClassVar[BookieStatus.Status]
        READ_ONLY: _ClassVar[BookieStatus.Status]
        GONE: _ClassVar[BookieStatus.Status]
    STATUS_UNSPECIFIED: BookieStatus.Status
    WRITABLE: BookieStatus.Status
    READ_ONLY: BookieStatus.Status
    GONE: BookieStatus.Status
    class Endpoint(_message.Message):
        __slots__ = ("id", "host", "port", "protocol", "auth", "extensions")
        ID_FIELD_NUMBER: _ClassVar[int]
        HOST_FIELD_NUMBER: _ClassVar[int]
        PORT_FIELD_NUMBER: _ClassVar[int]
        PROTOCOL_FIELD_NUMBER: _ClassVar[int]
        AUTH_FIELD_NUMBER: _ClassVar[int]
        EXTENSIONS_FIELD_NUMBER: _ClassVar[int]
        id: str
        host: str
        port: int
        protocol: str
        auth: _containers.RepeatedScalarFieldContainer[str]
        extensions: _containers.RepeatedScalarFieldContainer[str]
        def __init__(self, id: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., protocol: _Optional[str] = ..., auth: _Optional[_Iterable[str]] = ..., extensions: _Optional[_Iterable[str]] = ...) -> None: ...
    class Property(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BOOKIE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    RPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HAS_COOKIE_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_ERROR_FIELD_NUMBER: _ClassVar[int]
    COOKIE_FIELD_NUMBER: _ClassVar[int]
    COOKIE_SHA256_FIELD_NUMBER: _ClassVar[int]
    bookie_id: str
    status: BookieStatus.Status
    endpoints: _containers.RepeatedCompositeFieldContainer[BookieStatus.Endpoint]
    properties: _containers.RepeatedCompositeFieldContainer[BookieStatus.Property]
    rpc_address: str
    has_cookie: bool
    registration: ZnodeStat
    registration_error: str
    cookie: ZnodeStat
    cookie_sha256: str
    def __init__(self, bookie_id: _Optional[str] = ..., status: _Optional[_Union[BookieStatus.Status, str]] = ..., endpoints: _Optional[_Iterable[_Union[BookieStatus.Endpoint, _Mapping]]] = ..., properties: _Optional[_Iterable[_Union[BookieStatus.Property, _Mapping]]] = ..., rpc_address: _Optional[str] = ..., has_cookie: _Optional[bool] = ..., registration: _Optional[_Union[ZnodeStat, _Mapping]] = ..., registration_error: _Optional[str] = ..., cookie: _Optional[_Union[ZnodeStat, _Mapping]] = ..., cookie_sha256: _Optional[str] = ...) -> None: ...

class LedgerMetadata(_message.Message):
    __slots__ = ("format_version", "ensemble_size", "write_quorum", "ack_quorum", "state", "last_entry_id", "length", "digest_type", "has_password", "segments", "ctime_ms", "creation_time_ms", "ctoken", "custom_metadata", "pulsar_topic")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[LedgerMetadata.State]
        OPEN: _ClassVar[LedgerMetadata.State]
        IN_RECOVERY: _ClassVar[LedgerMetadata.State]
        CLOSED: _ClassVar[LedgerMetadata.State]
    STATE_UNSPECIFIED: LedgerMetadata.State
    OPEN: LedgerMetadata.State
    IN_RECOVERY: LedgerMetadata.State
    CLOSED: LedgerMetadata.State
    class DigestType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DIGEST_TYPE_UNSPECIFIED: _ClassVar[LedgerMetadata.DigestType]
        CRC32: _ClassVar[LedgerMetadata.DigestType]
        HMAC: _ClassVar[LedgerMetadata.DigestType]
        CRC32C: _ClassVar[LedgerMetadata.DigestType]
        DUMMY: _ClassVar[LedgerMetadata.DigestType]
    DIGEST_TYPE_UNSPECIFIED: LedgerMetadata.DigestType
    CRC32: LedgerMetadata.DigestType
    HMAC: LedgerMetadata.DigestType
    CRC32C: LedgerMetadata.DigestType
    DUMMY: LedgerMetadata.DigestType
    class Segment(_message.Message):
        __slots__ = ("first_entry_id", "ensemble")
        FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
        ENSEMBLE_FIELD_NUMBER: _ClassVar[int]
        first_entry_id: int
        ensemble: _containers.RepeatedScalarFieldContainer[str]
        def __init__(self, first_entry_id: _Optional[int] = ..., ensemble: _Optional[_Iterable[str]] = ...) -> None: ...
    class CustomMetadata(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENSEMBLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUORUM_FIELD_NUMBER: _ClassVar[int]
    ACK_QUORUM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    DIGEST_TYPE_FIELD_NUMBER: _ClassVar[int]
    HAS_PASSWORD_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    CTIME_MS_FIELD_NUMBER: _ClassVar[int]
    CREATION_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    CTOKEN_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_METADATA_FIELD_NUMBER: _ClassVar[int]
    PULSAR_TOPIC_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    state: LedgerMetadata.State
    last_entry_id: int
    length: int
    digest_type: LedgerMetadata.DigestType
    has_password: bool
    segments: _containers.RepeatedCompositeFieldContainer[LedgerMetadata.Segment]
    ctime_ms: int
    creation_time_ms: int
    ctoken: int
    custom_metadata: _containers.RepeatedCompositeFieldContainer[LedgerMetadata.CustomMetadata]
    pulsar_topic: str
    def __init__(self, format_version: _Optional[int] = ..., ensemble_size: _Optional[int] = ..., write_quorum: _Optional[int] = ..., ack_quorum: _Optional[int] = ..., state: _Optional[_Union[LedgerMetadata.State, str]] = ..., last_entry_id: _Optional[int] = ..., length: _Optional[int] = ..., digest_type: _Optional[_Union[LedgerMetadata.DigestType, str]] = ..., has_password: _Optional[bool] = ..., segments: _Optional[_Iterable[_Union[LedgerMetadata.Segment, _Mapping]]] = ..., ctime_ms: _Optional[int] = ..., creation_time_ms: _Optional[int] = ..., ctoken: _Optional[int] = ..., custom_metadata: _Optional[_Iterable[_Union[LedgerMetadata.CustomMetadata, _Mapping]]] = ..., pulsar_topic: _Optional[str] = ...) -> None: ...

class LedgerUpserted(_message.Message):
    __slots__ = ("ledger_id", "metadata", "znode", "path")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ZNODE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    metadata: LedgerMetadata
    znode: ZnodeStat
    path: str
    def __init__(self, ledger_id: _Optional[int] = ..., metadata: _Optional[_Union[LedgerMetadata, _Mapping]] = ..., znode: _Optional[_Union[ZnodeStat, _Mapping]] = ..., path: _Optional[str] = ...) -> None: ...

class LedgerDeleted(_message.Message):
    __slots__ = ("ledger_id", "last_mzxid", "last_version", "inferred")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_MZXID_FIELD_NUMBER: _ClassVar[int]
    LAST_VERSION_FIELD_NUMBER: _ClassVar[int]
    INFERRED_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    last_mzxid: int
    last_version: int
    inferred: bool
    def __init__(self, ledger_id: _Optional[int] = ..., last_mzxid: _Optional[int] = ..., last_version: _Optional[int] = ..., inferred: _Optional[bool] = ...) -> None: ...

class LedgerUndecodable(_message.Message):
    __slots__ = ("ledger_id", "path", "znode", "reason")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ZNODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    path: str
    znode: ZnodeStat
    reason: str
    def __init__(self, ledger_id: _Optional[int] = ..., path: _Optional[str] = ..., znode: _Optional[_Union[ZnodeStat, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class UnderReplicationMark(_message.Message):
    __slots__ = ("ledger_id", "state", "replicas", "mark_ctime_ms", "znode", "error", "inferred")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[UnderReplicationMark.State]
        SET: _ClassVar[UnderReplicationMark.State]
        CLEARED: _ClassVar[UnderReplicationMark.State]
    STATE_UNSPECIFIED: UnderReplicationMark.State
    SET: UnderReplicationMark.State
    CLEARED: UnderReplicationMark.State
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MARK_CTIME_MS_FIELD_NUMBER: _ClassVar[int]
    ZNODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    INFERRED_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    state: UnderReplicationMark.State
    replicas: _containers.RepeatedScalarFieldContainer[str]
    mark_ctime_ms: int
    znode: ZnodeStat
    error: str
    inferred: bool
    def __init__(self, ledger_id: _Optional[int] = ..., state: _Optional[_Union[UnderReplicationMark.State, str]] = ..., replicas: _Optional[_Iterable[str]] = ..., mark_ctime_ms: _Optional[int] = ..., znode: _Optional[_Union[ZnodeStat, _Mapping]] = ..., error: _Optional[str] = ..., inferred: _Optional[bool] = ...) -> None: ...

class RecoveryDelay(_message.Message):
    __slots__ = ("seconds", "present", "znode", "error")
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    ZNODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    seconds: int
    present: bool
    znode: ZnodeStat
    error: str
    def __init__(self, seconds: _Optional[int] = ..., present: _Optional[bool] = ..., znode: _Optional[_Union[ZnodeStat, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class AutoRecoveryState(_message.Message):
    __slots__ = ("disabled", "disabled_ctime_ms", "votes", "locks", "error", "check_all_ledgers_ctime_ms", "placement_policy_check_ctime_ms", "replicas_check_ctime_ms")
    class Vote(_message.Message):
        __slots__ = ("sequence", "bookie_id")
        SEQUENCE_FIELD_NUMBER: _ClassVar[int]
        BOOKIE_ID_FIELD_NUMBER: _ClassVar[int]
        sequence: int
        bookie_id: str
        def __init__(self, sequence: _Optional[int] = ..., bookie_id: _Optional[str] = ...) -> None: ...
    class Lock(_message.Message):
        __slots__ = ("ledger_id", "holder", "ctime_ms")
        LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
        HOLDER_FIELD_NUMBER: _ClassVar[int]
        CTIME_MS_FIELD_NUMBER: _ClassVar[int]
        ledger_id: int
        holder: str
        ctime_ms: int
        def __init__(self, ledger_id: _Optional[int] = ..., holder: _Optional[str] = ..., ctime_ms: _Optional[int] = ...) -> None: ...
    DISABLED_FIELD_NUMBER: _ClassVar[int]
    DISABLED_CTIME_MS_FIELD_NUMBER: _ClassVar[int]
    VOTES_FIELD_NUMBER: _ClassVar[int]
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CHECK_ALL_LEDGERS_CTIME_MS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_POLICY_CHECK_CTIME_MS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_CHECK_CTIME_MS_FIELD_NUMBER: _ClassVar[int]
    disabled: bool
    disabled_ctime_ms: int
    votes: _containers.RepeatedCompositeFieldContainer[AutoRecoveryState.Vote]
    locks: _containers.RepeatedCompositeFieldContainer[AutoRecoveryState.Lock]
    error: str
    check_all_ledgers_ctime_ms: int
    placement_policy_check_ctime_ms: int
    replicas_check_ctime_ms: int
    def __init__(self, disabled: _Optional[bool] = ..., disabled_ctime_ms: _Optional[int] = ..., votes: _Optional[_Iterable[_Union[AutoRecoveryState.Vote, _Mapping]]] = ..., locks: _Optional[_Iterable[_Union[AutoRecoveryState.Lock, _Mapping]]] = ..., error: _Optional[str] = ..., check_all_ledgers_ctime_ms: _Optional[int] = ..., placement_policy_check_ctime_ms: _Optional[int] = ..., replicas_check_ctime_ms: _Optional[int] = ...) -> None: ...

class RackMap(_message.Message):
    __slots__ = ("source", "present", "entries", "error", "source_version")
    class Entry(_message.Message):
        __slots__ = ("bookie_id", "rack", "hostname", "group")
        BOOKIE_ID_FIELD_NUMBER: _ClassVar[int]
        RACK_FIELD_NUMBER: _ClassVar[int]
        HOSTNAME_FIELD_NUMBER: _ClassVar[int]
        GROUP_FIELD_NUMBER: _ClassVar[int]
        bookie_id: str
        rack: str
        hostname: str
        group: str
        def __init__(self, bookie_id: _Optional[str] = ..., rack: _Optional[str] = ..., hostname: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    source: str
    present: bool
    entries: _containers.RepeatedCompositeFieldContainer[RackMap.Entry]
    error: str
    source_version: int
    def __init__(self, source: _Optional[str] = ..., present: _Optional[bool] = ..., entries: _Optional[_Iterable[_Union[RackMap.Entry, _Mapping]]] = ..., error: _Optional[str] = ..., source_version: _Optional[int] = ...) -> None: ...

class SnapshotBegin(_message.Message):
    __slots__ = ("snapshot_id", "reason", "mode", "partition", "partition_count")
    class Reason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        REASON_UNSPECIFIED: _ClassVar[SnapshotBegin.Reason]
        START: _ClassVar[SnapshotBegin.Reason]
        RECONNECT: _ClassVar[SnapshotBegin.Reason]
        SESSION_EXPIRED: _ClassVar[SnapshotBegin.Reason]
        PERIODIC: _ClassVar[SnapshotBegin.Reason]
        PUBLISH_FAILED: _ClassVar[SnapshotBegin.Reason]
    REASON_UNSPECIFIED: SnapshotBegin.Reason
    START: SnapshotBegin.Reason
    RECONNECT: SnapshotBegin.Reason
    SESSION_EXPIRED: SnapshotBegin.Reason
    PERIODIC: SnapshotBegin.Reason
    PUBLISH_FAILED: SnapshotBegin.Reason
    class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        MODE_UNSPECIFIED: _ClassVar[SnapshotBegin.Mode]
        FULL: _ClassVar[SnapshotBegin.Mode]
        DELTA: _ClassVar[SnapshotBegin.Mode]
    MODE_UNSPECIFIED: SnapshotBegin.Mode
    FULL: SnapshotBegin.Mode
    DELTA: SnapshotBegin.Mode
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    PARTITION_COUNT_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    reason: SnapshotBegin.Reason
    mode: SnapshotBegin.Mode
    partition: int
    partition_count: int
    def __init__(self, snapshot_id: _Optional[str] = ..., reason: _Optional[_Union[SnapshotBegin.Reason, str]] = ..., mode: _Optional[_Union[SnapshotBegin.Mode, str]] = ..., partition: _Optional[int] = ..., partition_count: _Optional[int] = ...) -> None: ...

class SnapshotEnd(_message.Message):
    __slots__ = ("snapshot_id", "complete", "mode", "partition", "partition_count", "partition_events", "ledgers_scanned", "ledgers_published", "ledgers_deleted", "ledgers_undecodable", "bookies_published", "marks_published", "duration_ms")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    PARTITION_COUNT_FIELD_NUMBER: _ClassVar[int]
    PARTITION_EVENTS_FIELD_NUMBER: _ClassVar[int]
    LEDGERS_SCANNED_FIELD_NUMBER: _ClassVar[int]
    LEDGERS_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    LEDGERS_DELETED_FIELD_NUMBER: _ClassVar[int]
    LEDGERS_UNDECODABLE_FIELD_NUMBER: _ClassVar[int]
    BOOKIES_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    MARKS_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    complete: bool
    mode: SnapshotBegin.Mode
    partition: int
    partition_count: int
    partition_events: int
    ledgers_scanned: int
    ledgers_published: int
    ledgers_deleted: int
    ledgers_undecodable: int
    bookies_published: int
    marks_published: int
    duration_ms: int
    def __init__(self, snapshot_id: _Optional[str] = ..., complete: _Optional[bool] = ..., mode: _Optional[_Union[SnapshotBegin.Mode, str]] = ..., partition: _Optional[int] = ..., partition_count: _Optional[int] = ..., partition_events: _Optional[int] = ..., ledgers_scanned: _Optional[int] = ..., ledgers_published: _Optional[int] = ..., ledgers_deleted: _Optional[int] = ..., ledgers_undecodable: _Optional[int] = ..., bookies_published: _Optional[int] = ..., marks_published: _Optional[int] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class BookieProbe(_message.Message):
    __slots__ = ("bookie_id", "answered", "address", "detail")
    BOOKIE_ID_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    bookie_id: str
    answered: bool
    address: str
    detail: str
    def __init__(self, bookie_id: _Optional[str] = ..., answered: _Optional[bool] = ..., address: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("watcher_time_ms", "partition", "partition_count", "last_zxid")
    WATCHER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    PARTITION_COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_ZXID_FIELD_NUMBER: _ClassVar[int]
    watcher_time_ms: int
    partition: int
    partition_count: int
    last_zxid: int
    def __init__(self, watcher_time_ms: _Optional[int] = ..., partition: _Optional[int] = ..., partition_count: _Optional[int] = ..., last_zxid: _Optional[int] = ...) -> None: ...

class ManagedLedgerChanged(_message.Message):
    __slots__ = ("name", "cursor", "znode", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    ZNODE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    cursor: str
    znode: ZnodeStat
    data: bytes
    def __init__(self, name: _Optional[str] = ..., cursor: _Optional[str] = ..., znode: _Optional[_Union[ZnodeStat, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ManagedLedgerDeleted(_message.Message):
    __slots__ = ("name", "cursor", "inferred")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    INFERRED_FIELD_NUMBER: _ClassVar[int]
    name: str
    cursor: str
    inferred: bool
    def __init__(self, name: _Optional[str] = ..., cursor: _Optional[str] = ..., inferred: _Optional[bool] = ...) -> None: ...
