"""Stage 1 of the job: Kafka records → :data:`streaming.schemas.CHANGE_SCHEMA` rows (``mapInArrow``).

Change events are decoded with :func:`core.events.decode_event` (the same code the watcher's tests use);
feedback records (the job's own re-probe results) are JSON. A record that cannot be decoded becomes a
``dead_letter`` row carrying the reason and the record's key and value bytes (base64 in the payload), so one
bad message never stops the query. So does an event dated too far ahead of the receiving clock
(:mod:`core.domain.rules.event_time`): it would move the watermark past every later event.

Pure (no I/O); Arrow in, Arrow out. A batch is decoded into columns (no row dictionaries), and a ledger
upsert's payload, the bulk of the stream, is written as JSON text directly (:func:`ledger_payload_json`,
held byte for byte to the encoder of :func:`ledger_payload` by a property test).

Example:
    >>> rows = decode_record(b"k", b"\\xff", "bkaudit.changes", 0, 7, feedback_topic="bkaudit.feedback")
    >>> payload = json.loads(rows["payload"])
    >>> rows["kind"], rows["state_key"], payload["reason"]
    ('dead_letter', 'dead', 'change event: not a valid protobuf message')
    >>> payload["source"], base64.b64decode(payload["key_b64"]), base64.b64decode(payload["value_b64"])
    ('kafka', b'k', b'\\xff')
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from core import events as ev
from core.domain.cookie import cookie_identity
from core.domain.metadata import HEADER_KEY
from core.domain.rules.event_time import future_event_reason, receiving_clock_ms
from core.errors import FormatError
from core.pb import change_events_pb2 as pb
from streaming.state_keys import (
    CLUSTER_STATE_KEY,
    DEAD_LETTER_STATE_KEY,
    MANAGED_LEDGER_STATE_KEY,
    ledger_state_key,
)

#: Ledger state groups when the caller does not say (the job passes ``stream.ledger_state_buckets``).
DEFAULT_LEDGER_BUCKETS = 64

ARROW_CHANGE_SCHEMA = pa.schema(
    [
        pa.field("state_key", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("event_time", pa.timestamp("us", tz="UTC"), nullable=False),
        ("cluster", pa.string()),
        ("run_id", pa.string()),
        ("sequence", pa.int64()),
        ("snapshot_id", pa.string()),
        ("ledger_id", pa.int64()),
        ("bookie_id", pa.string()),
        ("payload", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("watermark_time", pa.timestamp("us", tz="UTC")),
    ]
)

_STATE = {1: "OPEN", 2: "IN_RECOVERY", 3: "CLOSED"}
_DIGEST = {1: "CRC32", 2: "HMAC", 3: "CRC32C", 4: "DUMMY"}
_BOOKIE_STATUS = {1: "WRITABLE", 2: "READ_ONLY", 3: "GONE"}
_MARK_STATE = {1: "SET", 2: "CLEARED"}
_SNAPSHOT_REASON = {1: "START", 2: "RECONNECT", 3: "SESSION_EXPIRED", 4: "PERIODIC", 5: "PUBLISH_FAILED"}
_SNAPSHOT_MODE = {1: "FULL", 2: "DELTA"}


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


#: Ledger payloads, the bulk of the stream: built in a fixed key order, so not sorted again (a third of the
#: encoding's cost).
_encode_ledger_payload = json.JSONEncoder(separators=(",", ":")).encode


def _stat(stat: pb.ZnodeStat) -> dict[str, int]:
    return {
        "mzxid": stat.mzxid,
        "version": stat.version,
        "znode_ctime_ms": stat.ctime_ms,
        "znode_mtime_ms": stat.mtime_ms,
        "data_length": stat.data_length,
    }


def ledger_payload(upserted: pb.LedgerUpserted) -> dict[str, Any]:
    """The ``ledger_upserted`` payload: metadata (no password) plus the znode's stat.

    Segments and custom metadata are lists of objects with the ``ledgers`` table's field names (custom
    values in base64): the sink parses a whole batch of payloads into Arrow columns at once.
    """
    md = upserted.metadata
    payload: dict[str, Any] = {
        "format_version": md.format_version,
        "ensemble_size": md.ensemble_size,
        "write_quorum": md.write_quorum,
        "ack_quorum": md.ack_quorum,
        "state": _STATE.get(md.state, "OPEN"),
        "last_entry_id": md.last_entry_id,
        "length": md.length,
        "digest_type": _DIGEST.get(md.digest_type),
        "has_password": md.has_password,
        "segments": [{"first_entry_id": s.first_entry_id, "ensemble": list(s.ensemble)} for s in md.segments],
        "ctime_ms": md.creation_time_ms,
        "custom_metadata": [
            {"key": c.key, "value_b64": base64.b64encode(c.value).decode("ascii")} for c in md.custom_metadata
        ],
        "pulsar_topic": md.pulsar_topic if md.HasField("pulsar_topic") else None,
        "path": upserted.path,
    }
    payload.update(_stat(upserted.znode))
    return payload


_quoted = json.encoder.encode_basestring_ascii


def _json_text(value: str | None) -> str:
    return "null" if value is None else _quoted(value)


def _json_bool(value: bool) -> str:
    return "true" if value else "false"


def _segments_json(md: pb.LedgerMetadata) -> str:
    return ",".join(
        f'{{"first_entry_id":{s.first_entry_id},"ensemble":[{",".join(map(_quoted, s.ensemble))}]}}'
        for s in md.segments
    )


def _custom_metadata_json(md: pb.LedgerMetadata) -> str:
    return ",".join(
        f'{{"key":{_quoted(c.key)},"value_b64":"{binascii.b2a_base64(c.value, newline=False).decode()}"}}'
        for c in md.custom_metadata
    )


def ledger_payload_json(upserted: pb.LedgerUpserted, snapshot_id: str | None) -> str:
    """The ``ledger_upserted`` row's payload as JSON text: :func:`ledger_payload` plus the snapshot id, in
    the same bytes as encoding that dictionary, without building it (the decoder's hot path).

    Example:
        >>> upserted = pb.LedgerUpserted(ledger_id=7, path="/ledgers/L7")
        >>> _ = upserted.metadata.segments.add(first_entry_id=0, ensemble=["b:1"])
        >>> text = ledger_payload_json(upserted, "snap")
        >>> text == _encode_ledger_payload({**ledger_payload(upserted), "snapshot_id": "snap"})
        True
    """
    md, stat = upserted.metadata, upserted.znode
    topic = md.pulsar_topic if md.HasField("pulsar_topic") else None
    return (
        f'{{"format_version":{md.format_version},"ensemble_size":{md.ensemble_size},'
        f'"write_quorum":{md.write_quorum},"ack_quorum":{md.ack_quorum},'
        f'"state":{_quoted(_STATE.get(md.state, "OPEN"))},'
        f'"last_entry_id":{md.last_entry_id},"length":{md.length},'
        f'"digest_type":{_json_text(_DIGEST.get(md.digest_type))},'
        f'"has_password":{_json_bool(md.has_password)},"segments":[{_segments_json(md)}],'
        f'"ctime_ms":{md.creation_time_ms},"custom_metadata":[{_custom_metadata_json(md)}],'
        f'"pulsar_topic":{_json_text(topic)},"path":{_quoted(upserted.path)},'
        f'"mzxid":{stat.mzxid},"version":{stat.version},"znode_ctime_ms":{stat.ctime_ms},'
        f'"znode_mtime_ms":{stat.mtime_ms},"data_length":{stat.data_length},'
        f'"snapshot_id":{_json_text(snapshot_id)}}}'
    )


def _bookie_payload(status: pb.BookieStatus) -> dict[str, Any]:
    host, port = None, None
    for endpoint in status.endpoints:
        if endpoint.protocol == "bookie-rpc":
            host, port = endpoint.host, endpoint.port
            break
    return {
        "status": _BOOKIE_STATUS.get(status.status, "GONE"),
        "rpc_address": status.rpc_address or None,
        "host": host,
        "port": port,
        "has_cookie": status.has_cookie,
        "registration_error": status.registration_error or None,
        "cookie": cookie_identity(status.cookie.czxid, status.cookie_sha256),
    }


def _auto_recovery_payload(state: pb.AutoRecoveryState) -> dict[str, Any]:
    # The lowest vote is the Auditor ("" when its vote does not name it); None when nobody votes.
    auditor = min(state.votes, key=lambda vote: vote.sequence).bookie_id if state.votes else None
    return {
        "disabled_ctime_ms": (state.disabled_ctime_ms or None) if state.disabled else None,
        "disabled": state.disabled,
        "auditor": auditor,
        "votes": len(state.votes),
        "locks": [[lock.ledger_id, lock.holder or None, lock.ctime_ms] for lock in state.locks],
        "checks": {check.value: ms for check, ms in ev.auto_recovery_checks(state).items()},
        "error": state.error or None,
    }


def managed_ledger_payload(changed: pb.ManagedLedgerChanged) -> dict[str, Any]:
    """The ``managed_ledger_changed`` payload: the znode decoded (a managed ledger's ledgers with their
    offload state, or a cursor's ledger), or ``error`` with why it does not decode (and its bytes, in base64:
    Pulsar's managed-ledger znodes hold no password).

    Example:
        >>> from core.domain.managed_ledger import ManagedLedgerInfo, TopicLedger, encode_managed_ledger_info
        >>> data = encode_managed_ledger_info(ManagedLedgerInfo((TopicLedger(7, entries=3, size=90),)))
        >>> managed_ledger_payload(pb.ManagedLedgerChanged(name="t/n/persistent/x", data=data))["ledgers"]
        [[7, 3, 90, False, False]]
        >>> managed_ledger_payload(pb.ManagedLedgerChanged(name="t/n/persistent/x", data=b"\\xff"))["error"]
        'ManagedLedgerInfo does not decode: neither protobuf nor text'
    """
    from core.domain.managed_ledger import decode_managed_cursor_info, decode_managed_ledger_info

    payload: dict[str, Any] = {"name": changed.name, "cursor": changed.cursor or None, **_stat(changed.znode)}
    try:
        if changed.cursor:
            payload["cursor_ledger"] = decode_managed_cursor_info(changed.data).cursor_ledger_id
        else:
            info = decode_managed_ledger_info(changed.data)
            payload["ledgers"] = [
                [t.ledger_id, t.entries, t.size, t.offloaded, t.bookkeeper_deleted] for t in info.ledgers
            ]
    except FormatError as err:
        payload["error"] = str(err)[: ev.MAX_REASON_CHARS]
        payload["data_b64"] = base64.b64encode(changed.data).decode("ascii")
    return payload


def _event_row(event: pb.ChangeEvent, ledger_buckets: int) -> dict[str, Any]:
    kind = ev.payload_type(event)
    row: dict[str, Any] = {
        "kind": kind,
        "state_key": CLUSTER_STATE_KEY,
        "event_time": event.event_time_ms * 1000,
        "cluster": event.cluster,
        "run_id": event.watcher_run_id,
        "sequence": event.sequence,
        "snapshot_id": event.snapshot_id or None,
        "ledger_id": None,
        "bookie_id": None,
    }
    payload: dict[str, Any]
    if kind == "bookie_status":
        row["bookie_id"] = event.bookie_status.bookie_id
        payload = _bookie_payload(event.bookie_status)
    elif kind == "bookie_probe":
        probe = event.bookie_probe
        row["bookie_id"] = probe.bookie_id
        payload = {"answered": probe.answered, "address": probe.address, "detail": probe.detail}
    elif kind == "ledger_upserted":
        row["ledger_id"] = event.ledger_upserted.ledger_id
        # With the snapshot id, the payload is already the ledger_state decision's (a processor passes it on).
        payload = {**ledger_payload(event.ledger_upserted), "snapshot_id": row["snapshot_id"]}
    elif kind == "ledger_deleted":
        deleted = event.ledger_deleted
        row["ledger_id"] = deleted.ledger_id
        payload = {"last_mzxid": deleted.last_mzxid, "inferred": deleted.inferred}
    elif kind == "ledger_undecodable":
        bad = event.ledger_undecodable
        row["ledger_id"] = bad.ledger_id
        payload = {"reason": bad.reason, "path": bad.path, **_stat(bad.znode)}
    elif kind == "under_replication_mark":
        mark = event.under_replication_mark
        row["ledger_id"] = mark.ledger_id
        payload = {
            "state": _MARK_STATE.get(mark.state, "CLEARED"),
            "replicas": list(mark.replicas),
            "mark_ctime_ms": mark.mark_ctime_ms if mark.HasField("mark_ctime_ms") else None,
            "mzxid": mark.znode.mzxid,
            "inferred": mark.inferred,
            "error": mark.error or None,
        }
    elif kind == "recovery_delay":
        delay = event.recovery_delay
        payload = {
            "seconds": delay.seconds if delay.HasField("seconds") else None,
            "present": delay.present,
            "mzxid": delay.znode.mzxid,  # a new write of the same value is a triggered audit
        }
    elif kind == "rack_map":
        racks = event.rack_map
        payload = {
            "racks": {e.bookie_id: (e.rack if e.HasField("rack") else None) for e in racks.entries},
            "hostnames": {e.bookie_id: e.hostname for e in racks.entries if e.HasField("hostname")},
            "groups": {e.bookie_id: e.group for e in racks.entries if e.HasField("group")},
            "error": racks.error or None,
            "present": racks.present,
        }
    elif kind == "auto_recovery_state":
        payload = _auto_recovery_payload(event.auto_recovery_state)
    elif kind in ("snapshot_begin", "snapshot_end"):
        marker = getattr(event, kind)
        payload = {
            "snapshot_id": marker.snapshot_id,
            "mode": _SNAPSHOT_MODE.get(marker.mode, "FULL"),
            "partition": marker.partition,
            "partition_count": marker.partition_count,
        }
        if kind == "snapshot_begin":
            payload["reason"] = _SNAPSHOT_REASON.get(event.snapshot_begin.reason, "START")
        else:
            payload["complete"] = event.snapshot_end.complete
            payload["partition_events"] = event.snapshot_end.partition_events
    elif kind == "heartbeat":
        payload = {"partition": event.heartbeat.partition}
    elif kind == "managed_ledger_changed":
        row["state_key"] = MANAGED_LEDGER_STATE_KEY
        payload = managed_ledger_payload(event.managed_ledger_changed)
    elif kind == "managed_ledger_deleted":
        row["state_key"] = MANAGED_LEDGER_STATE_KEY
        gone = event.managed_ledger_deleted
        payload = {"name": gone.name, "cursor": gone.cursor or None, "inferred": gone.inferred}
    else:  # decode_event guarantees a known payload; keep the type checker and future versions honest
        raise FormatError(f"change event: unsupported payload {kind!r}")
    if row["ledger_id"] is not None:
        row["state_key"] = ledger_state_key(row["ledger_id"], ledger_buckets)
    row["payload"] = _encode_ledger_payload(payload) if kind == "ledger_upserted" else _json(payload)
    return row


def _feedback_row(value: bytes, ledger_buckets: int) -> dict[str, Any]:
    try:
        message = json.loads(value.decode("utf-8"))
        kind = message["kind"]
        ledger_id = int(message["ledger_id"])
        event_time_ms = int(message["event_time_ms"])
        cluster = str(message["cluster"])
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise FormatError(f"feedback record: {type(err).__name__}: {err}") from None
    if kind != "probe_result":
        raise FormatError(f"feedback record: unknown kind {kind!r}")
    return {
        "kind": kind,
        "state_key": ledger_state_key(ledger_id, ledger_buckets),
        "event_time": event_time_ms * 1000,
        "cluster": cluster,
        "run_id": "feedback",
        "sequence": int(message.get("round", 0)),
        "snapshot_id": None,
        "ledger_id": ledger_id,
        "bookie_id": None,
        "payload": _json(message),
    }


#: The dead letter ``source`` of a Kafka record that is not a change event (or not a feedback record).
UNDECODABLE_SOURCE = "kafka"
#: The dead letter ``source`` of a change event dated too far ahead of the receiving clock.
FUTURE_SOURCE = "future"

# Raw ledger metadata carries the ledger password; a record holding it (published to the changes topic by
# mistake) keeps its reason but not its bytes.
_LEDGER_METADATA_MARK = HEADER_KEY.rstrip(b"\t")
_WITHHELD = "not kept: it looks like BookKeeper ledger metadata, which can hold the ledger password"


def _kept_bytes(name: str, data: bytes | None, notes: list[str]) -> dict[str, str]:
    """``{name}_b64`` for the dead letter payload, unless the bytes may hold a ledger password."""
    if data is None:
        return {}
    if _LEDGER_METADATA_MARK in data:
        notes.append(f"{name} {_WITHHELD}")
        return {}
    return {f"{name}_b64": base64.b64encode(data).decode("ascii")}


def dead_letter_row(
    reason: str, source: str, key: bytes | None, value: bytes | None, *, event_time_us: int = 0
) -> dict[str, Any]:
    """A ``dead_letter`` row: the reason, where it comes from and the record's bytes (base64 in the payload).

    Example:
        >>> row = dead_letter_row("bad", "kafka", None, b"BookieMetadataFormatVersion\\t3\\n...")
        >>> json.loads(row["payload"])["reason"]
        'bad; value not kept: it looks like BookKeeper ledger metadata, which can hold the ledger password'
    """
    notes: list[str] = []
    payload: dict[str, Any] = {"source": source}
    payload.update(_kept_bytes("key", key, notes))
    payload.update(_kept_bytes("value", value, notes))
    payload["reason"] = "; ".join([reason, *notes])
    return {
        "kind": "dead_letter",
        "state_key": DEAD_LETTER_STATE_KEY,
        "event_time": event_time_us,
        "cluster": None,
        "run_id": None,
        "sequence": None,
        "snapshot_id": None,
        "ledger_id": None,
        "bookie_id": None,
        "payload": _json(payload),
    }


def decode_record(
    key: bytes | None,
    value: bytes | None,
    topic: str,
    partition: int,
    offset: int,
    *,
    feedback_topic: str,
    ledger_buckets: int = DEFAULT_LEDGER_BUCKETS,
    received_ms: int | None = None,
    max_event_time_skew_s: float | None = None,
) -> dict[str, Any]:
    """One Kafka record → one change row (a ``dead_letter`` row when it cannot be decoded).

    With ``max_event_time_skew_s`` and a ``received_ms``
    (:func:`~core.domain.rules.event_time.receiving_clock_ms`), an event dated further ahead than the skew
    is a dead letter too, stamped with the receiving clock.

    Example:
        >>> heartbeat = ev.encode_event(
        ...     ev.EventBuilder("c", "run", clock_ms=lambda: 0).build(
        ...         ev.heartbeat(4_102_444_800_000, partition=0, partition_count=1),
        ...         event_time_ms=4_102_444_800_000,
        ...     )
        ... )
        >>> row = decode_record(
        ...     b"cluster", heartbeat, "bkaudit.changes", 0, 8, feedback_topic="bkaudit.feedback",
        ...     received_ms=1_700_000_000_000, max_event_time_skew_s=300,
        ... )
        >>> row["kind"], row["event_time"], json.loads(row["payload"])["reason"][:56]
        ('dead_letter', 1700000000000000, 'event time 2100-01-01T00:00:00Z is more than 300 s ahead')
    """
    try:
        if value is None:
            raise FormatError("record has no value")
        if topic == feedback_topic:
            row = _feedback_row(value, ledger_buckets)
        else:
            row = _event_row(ev.decode_event(value), ledger_buckets)
    except FormatError as err:
        row = dead_letter_row(str(err), UNDECODABLE_SOURCE, key, value)
    else:
        if max_event_time_skew_s is not None and received_ms is not None:
            reason = future_event_reason(row["event_time"] // 1000, received_ms, max_event_time_skew_s)
            if reason is not None:
                row = dead_letter_row(reason, FUTURE_SOURCE, key, value, event_time_us=received_ms * 1000)
    row["topic"], row["partition"], row["offset"] = topic, partition, offset
    return row


def _epoch_ms_column(batch: pa.RecordBatch, name: str) -> list[int | None]:
    """A timestamp column as epoch milliseconds (all ``None`` when the batch has no such column)."""
    if name not in batch.schema.names:
        return [None] * batch.num_rows
    micros = batch.column(name).cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    return [None if us is None else us // 1000 for us in micros.to_pylist()]


#: The columns a record's decoding fills; ``topic``, ``partition`` and ``offset`` come from the input.
_DECODED_COLUMNS = tuple(
    name for name in ARROW_CHANGE_SCHEMA.names if name not in ("topic", "partition", "offset")
)


class _ChangeColumns:
    """The decoded rows of one batch, column by column."""

    def __init__(self, ledger_buckets: int) -> None:
        self.columns: dict[str, list[Any]] = {name: [] for name in _DECODED_COLUMNS}
        self.buckets = ledger_buckets
        self.bucket_keys: dict[int, str] = {}

    def add_row(self, row: dict[str, Any]) -> None:
        for name, column in self.columns.items():
            column.append(row.get(name))

    def add_upsert(self, event: pb.ChangeEvent) -> None:
        """A ledger upsert (the bulk of the stream), appended without a row dictionary."""
        columns, upserted = self.columns, event.ledger_upserted
        event_time = event.event_time_ms * 1000
        snapshot_id = event.snapshot_id or None
        bucket = upserted.ledger_id % self.buckets
        state_key = self.bucket_keys.get(bucket)
        if state_key is None:
            state_key = self.bucket_keys[bucket] = ledger_state_key(upserted.ledger_id, self.buckets)
        columns["state_key"].append(state_key)
        columns["kind"].append("ledger_upserted")
        columns["event_time"].append(event_time)
        columns["cluster"].append(event.cluster)
        columns["run_id"].append(event.watcher_run_id)
        columns["sequence"].append(event.sequence)
        columns["snapshot_id"].append(snapshot_id)
        columns["ledger_id"].append(upserted.ledger_id)
        columns["bookie_id"].append(None)
        columns["payload"].append(ledger_payload_json(upserted, snapshot_id))
        columns["watermark_time"].append(event_time)

    def batch(self, source: pa.RecordBatch) -> pa.RecordBatch:
        arrays = []
        for field in ARROW_CHANGE_SCHEMA:
            if field.name in self.columns:
                arrays.append(pa.array(self.columns[field.name], type=field.type))
            else:
                arrays.append(source.column(field.name).cast(field.type))
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_CHANGE_SCHEMA)


def _admitted_upsert(
    value: bytes | None, topic: str, feedback_topic: str, received_ms: int | None, max_skew_s: float | None
) -> pb.ChangeEvent | None:
    """The decoded event when ``value`` is a valid ledger upsert dated within the skew; else ``None`` (the
    record then takes :func:`decode_record`'s general path, which also words any error)."""
    if value is None or topic == feedback_topic:
        return None
    try:
        event = ev.decode_event(value)
    except FormatError:
        return None
    if event.WhichOneof("payload") != "ledger_upserted":
        return None
    if max_skew_s is not None and future_event_reason(event.event_time_ms, received_ms, max_skew_s):
        return None
    return event


def decode_batches(
    batches: Iterator[pa.RecordBatch],
    feedback_topic: str,
    ledger_buckets: int = DEFAULT_LEDGER_BUCKETS,
    max_event_time_skew_s: float | None = None,
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function: Kafka source batches → change rows (the rows of :func:`decode_record`).

    The input has the Kafka source's columns plus, optionally, ``batch_time`` (Spark's
    ``current_timestamp()``: the micro-batch timestamp, the same when the batch is replayed). Each record's
    receiving clock is the earlier of its Kafka timestamp and that batch time; with
    ``max_event_time_skew_s`` an event dated further ahead of it is a dead letter. Dead letters get the
    receiving clock as event time and no watermark time, so the watermark never drops them and they never
    move it.
    """
    for batch in batches:
        yield _decode_batch(batch, feedback_topic, ledger_buckets, max_event_time_skew_s)


def _decode_batch(
    batch: pa.RecordBatch, feedback_topic: str, ledger_buckets: int, max_skew_s: float | None
) -> pa.RecordBatch:
    decoded = _ChangeColumns(ledger_buckets)
    records = zip(
        batch.column("key").to_pylist(),
        batch.column("value").to_pylist(),
        batch.column("topic").to_pylist(),
        batch.column("partition").to_pylist(),
        batch.column("offset").to_pylist(),
        _epoch_ms_column(batch, "timestamp"),
        _epoch_ms_column(batch, "batch_time"),
        strict=True,
    )
    for key, value, topic, partition, offset, kafka_ms, batch_ms in records:
        received_ms = receiving_clock_ms(kafka_ms, batch_ms)
        upsert = _admitted_upsert(value, topic, feedback_topic, received_ms, max_skew_s)
        if upsert is not None:
            decoded.add_upsert(upsert)
            continue
        row = decode_record(
            key,
            value,
            topic,
            partition,
            offset,
            feedback_topic=feedback_topic,
            ledger_buckets=ledger_buckets,
            received_ms=received_ms,
            max_event_time_skew_s=max_skew_s,
        )
        if row["kind"] == "dead_letter":
            if received_ms is not None:
                row["event_time"] = received_ms * 1000
            row["watermark_time"] = None  # never late, never moves the watermark (see CHANGE_SCHEMA)
        else:
            row["watermark_time"] = row["event_time"]
        decoded.add_row(row)
    return decoded.batch(batch)
