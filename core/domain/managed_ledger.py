"""Pulsar's managed-ledger metadata: which BookKeeper ledgers a topic (and each of its cursors) still needs.

Pulsar keeps one znode per topic under ``/managed-ledgers`` of its metadata store,
``/managed-ledgers/<tenant>/<namespace>/<domain>/<encoded topic>`` (:func:`managed_ledger_path`), holding a
``ManagedLedgerInfo``: the topic's ledgers in order, each with its entries, size and, when tiered storage
moved it, its offload state. Each child znode is a cursor (a subscription) holding a ``ManagedCursorInfo``:
the ledger that stores its acknowledgements (``cursorsLedgerId``) and its mark-delete position.

Formats, as Pulsar's ``MetaStoreImpl`` reads them:

- binary protobuf (``MLDataFormats.proto``; :mod:`core.pb.managed_ledger_pb2` mirrors its field numbers);
- compressed: ``0x4778`` (2 bytes), the size of a ``ManagedLedgerInfoMetadata`` (4 bytes, big-endian),
  that message (compression type, uncompressed size), then the compressed bytes in Pulsar's codecs: ``ZLIB``
  (zlib stream), ``LZ4`` (raw block), ``ZSTD`` (frame), ``SNAPPY`` (raw). Decompression never writes past
  the size the header states (at most 64 MiB), so a hostile znode cannot exhaust memory. Like Pulsar, bytes
  that start with the magic but do not decode that way are read as plain protobuf;
- the protobuf text format, which Pulsar 1.x wrote and still reads.

An empty znode is an empty managed ledger (Pulsar creates it so). Anything else that does not decode raises
:class:`~core.errors.FormatError`.

Example:
    >>> info = ManagedLedgerInfo(ledgers=(TopicLedger(7, entries=10, size=1000),))
    >>> decode_managed_ledger_info(encode_managed_ledger_info(info)).ledger_ids
    (7,)
    >>> managed_ledger_path("persistent://public/default/orders")
    '/managed-ledgers/public/default/persistent/orders'
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import cramjam
import numpy as np
from google.protobuf.message import DecodeError, EncodeError
from google.protobuf.text_format import ParseError

from core.errors import FormatError
from core.pb import managed_ledger_pb2 as pb

MANAGED_LEDGERS_ROOT = "/managed-ledgers"
#: The first two bytes of a compressed ``ManagedLedgerInfo`` (``MetaStoreImpl``).
COMPRESSION_MAGIC = 0x4778
_HEADER = struct.Struct(">HI")
#: The largest uncompressed size read (ZooKeeper's znodes are at most jute.maxbuffer, a few MB in practice).
MAX_UNCOMPRESSED_BYTES = 64 * 1024 * 1024
#: Pulsar's codecs as ``CompressionCodecProvider`` writes them, each decompressing into a buffer of the
#: stated size (the ``*_into`` calls fail rather than write past it).
_DECOMPRESS_INTO: dict[str, Callable[[bytes, Any], int]] = {
    "LZ4": cramjam.lz4.decompress_block_into,
    "ZSTD": cramjam.zstd.decompress_into,
    "SNAPPY": cramjam.snappy.decompress_raw_into,
}


@dataclass(frozen=True)
class TopicLedger:
    """One ledger of a managed ledger: its id, entries and bytes, and whether tiered storage holds it.

    ``offloaded``: the offload is complete; ``bookkeeper_deleted``: its BookKeeper copy was then deleted
    (so the ledger missing from BookKeeper is expected).

    Example:
        >>> TopicLedger(7, offloaded=True, bookkeeper_deleted=True).gone_from_bookkeeper_by_design
        True
    """

    ledger_id: int
    entries: int | None = None
    size: int | None = None
    timestamp_ms: int | None = None
    offloaded: bool = False
    bookkeeper_deleted: bool = False

    @property
    def gone_from_bookkeeper_by_design(self) -> bool:
        """Offloaded completely and deleted from BookKeeper: not a missing ledger."""
        return self.offloaded and self.bookkeeper_deleted


@dataclass(frozen=True)
class ManagedLedgerInfo:
    """A topic's ``ManagedLedgerInfo``: its ledgers in order, and where it was terminated, if it was.

    Example:
        >>> ManagedLedgerInfo(ledgers=(TopicLedger(3), TopicLedger(5))).ledger_ids
        (3, 5)
    """

    ledgers: tuple[TopicLedger, ...] = ()
    terminated_at: tuple[int, int] | None = None  # (ledger id, entry id) of the last entry ever written
    properties: tuple[tuple[str, str], ...] = ()

    @property
    def ledger_ids(self) -> tuple[int, ...]:
        return tuple(ledger.ledger_id for ledger in self.ledgers)


@dataclass(frozen=True)
class ManagedCursorInfo:
    """A cursor's ``ManagedCursorInfo``: the ledger its acknowledgements are written to (None: -1, the
    position is kept in the znode itself) and its mark-delete position.

    Example:
        >>> ManagedCursorInfo(cursor_ledger_id=12, mark_delete=(7, 3)).ledger_ids
        (12,)
    """

    cursor_ledger_id: int | None
    mark_delete: tuple[int, int] | None = None
    last_active_ms: int | None = None

    @property
    def ledger_ids(self) -> tuple[int, ...]:
        """The BookKeeper ledgers this cursor needs."""
        return () if self.cursor_ledger_id is None else (self.cursor_ledger_id,)


def managed_ledger_path(topic: str) -> str:
    """The znode of a topic's managed ledger, from its name (``persistent://tenant/namespace/topic``, or
    the v1 ``persistent://property/cluster/namespace/topic``). The local name is URL-encoded, as Pulsar's
    ``TopicName.getPersistenceNamingEncoding`` does.

    Example:
        >>> managed_ledger_path("persistent://public/default/my topic-partition-0")
        '/managed-ledgers/public/default/persistent/my%20topic-partition-0'
    """
    domain, separator, rest = topic.partition("://")
    parts = rest.split("/")
    if not separator or domain not in ("persistent", "non-persistent") or len(parts) not in (3, 4):
        raise FormatError(
            f"topic {topic[:200]!r} is not persistent://tenant/namespace/topic "
            "(or persistent://property/cluster/namespace/topic)"
        )
    if domain != "persistent" or not all(parts):
        raise FormatError(f"topic {topic[:200]!r} has no managed ledger (only persistent topics do)")
    namespace, local = "/".join(parts[:-1]), parts[-1]
    return f"{MANAGED_LEDGERS_ROOT}/{namespace}/{domain}/{quote(local, safe='')}"


# -- decoding -------------------------------------------------------------------------------------------


def decode_managed_ledger_info(data: bytes) -> ManagedLedgerInfo:
    """A topic znode's ``ManagedLedgerInfo`` (any of the formats in the module docstring).

    Example:
        >>> decode_managed_ledger_info(b"").ledgers
        ()
        >>> decode_managed_ledger_info(b'ledgerInfo { ledgerId: 4 entries: 2 }').ledgers[0].entries
        2
    """
    message = _parse(pb.ManagedLedgerInfo, _uncompressed(data), "ManagedLedgerInfo")
    ledgers = tuple(_topic_ledger(info) for info in message.ledgerInfo)
    terminated = None
    if message.HasField("terminatedPosition"):
        terminated = (message.terminatedPosition.ledgerId, message.terminatedPosition.entryId)
    properties = tuple((kv.key, kv.value) for kv in message.properties)
    return ManagedLedgerInfo(ledgers, terminated, properties)


def decode_managed_cursor_info(data: bytes) -> ManagedCursorInfo:
    """A cursor znode's ``ManagedCursorInfo``.

    Example:
        >>> encoded = encode_managed_cursor_info(ManagedCursorInfo(cursor_ledger_id=-1, mark_delete=(7, 2)))
        >>> decode_managed_cursor_info(encoded)
        ManagedCursorInfo(cursor_ledger_id=None, mark_delete=(7, 2), last_active_ms=None)
    """
    message = _parse(pb.ManagedCursorInfo, _uncompressed(data), "ManagedCursorInfo")
    cursor_ledger = message.cursorsLedgerId if message.cursorsLedgerId >= 0 else None
    mark_delete = None
    if message.HasField("markDeleteLedgerId") and message.HasField("markDeleteEntryId"):
        mark_delete = (message.markDeleteLedgerId, message.markDeleteEntryId)
    last_active = message.lastActive if message.HasField("lastActive") else None
    return ManagedCursorInfo(cursor_ledger, mark_delete, last_active)


def _topic_ledger(info: Any) -> TopicLedger:
    offload = info.offloadContext if info.HasField("offloadContext") else None
    return TopicLedger(
        ledger_id=info.ledgerId,
        entries=info.entries if info.HasField("entries") else None,
        size=info.size if info.HasField("size") else None,
        timestamp_ms=info.timestamp if info.HasField("timestamp") else None,
        offloaded=bool(offload is not None and offload.complete),
        bookkeeper_deleted=bool(offload is not None and offload.bookkeeperDeleted),
    )


def _uncompressed(data: bytes) -> bytes:
    """The protobuf bytes of a znode: decompressed when it starts with the magic and decodes that way."""
    if len(data) < _HEADER.size or _HEADER.unpack_from(data)[0] != COMPRESSION_MAGIC:
        return data
    _, size = _HEADER.unpack_from(data)
    start, end = _HEADER.size, _HEADER.size + size
    metadata = pb.ManagedLedgerInfoMetadata()
    try:
        if end > len(data):
            raise DecodeError("metadata runs past the end")
        metadata.ParseFromString(data[start:end])
        codec = pb.CompressionType.Name(metadata.compressionType)
    except (DecodeError, ValueError):
        return data  # not a compressed record after all: Pulsar then reads the bytes as they are
    body = _decompressed(codec, data[end:], metadata.uncompressedSize)
    if len(body) != metadata.uncompressedSize:
        expected = metadata.uncompressedSize
        raise FormatError(
            f"managed-ledger metadata: {len(body)} bytes after {codec}, the header says {expected}"
        )
    return body


def _decompressed(codec: str, body: bytes, size: int) -> bytes:
    """``body`` decompressed with Pulsar's ``codec``, never past ``size`` bytes (and one more for ZLIB, to
    tell a longer stream)."""
    if codec == "NONE":
        return body
    if size > MAX_UNCOMPRESSED_BYTES:
        raise FormatError(
            f"managed-ledger metadata: the header states {size} uncompressed bytes (at most "
            f"{MAX_UNCOMPRESSED_BYTES} are read)"
        )
    try:
        if codec == "ZLIB":
            return zlib.decompressobj().decompress(body, size + 1)
        into = np.zeros(size, dtype=np.uint8)
        written = _DECOMPRESS_INTO[codec](body, into)
        return into[:written].tobytes()
    except (zlib.error, cramjam.DecompressionError) as err:
        raise FormatError(f"managed-ledger metadata: {codec} data does not decompress ({err})") from None
    except KeyError:
        raise FormatError(f"managed-ledger metadata: unknown compression {codec}") from None


def _parse(kind: Any, body: bytes, what: str) -> Any:
    """``body`` as binary protobuf, else as the text format (Pulsar 1.x); required fields must be set."""
    message = kind()
    try:
        message.ParseFromString(body)
        message.ByteSize()  # raises for a required field that is missing
        return message
    except (DecodeError, EncodeError):
        pass
    try:
        from google.protobuf import text_format

        text = body.decode("utf-8")
        message = kind()
        text_format.Parse(text, message)
        return message
    except (UnicodeDecodeError, ParseError) as err:
        detail = (
            str(err).splitlines()[0][:200] if isinstance(err, ParseError) else "neither protobuf nor text"
        )
        raise FormatError(f"{what} does not decode: {detail}") from None


# -- the cross-check ------------------------------------------------------------------------------------

#: What a topic's ledger is in BookKeeper, worst first.
TOPIC_LEDGER_STATES = ("MISSING", "ok", "offloaded", "offloaded, still in BookKeeper")


def topic_ledger_rows(
    info: ManagedLedgerInfo, cursors: dict[str, ManagedCursorInfo], in_bookkeeper: dict[int, bool]
) -> list[dict[str, Any]]:
    """One row per ledger a topic needs (its own, then each cursor's) with what BookKeeper has of it:
    ``MISSING`` (BookKeeper has no such ledger and no complete offload deleted it: the topic cannot load),
    ``ok``, ``offloaded`` (complete, BookKeeper's copy deleted: expected), or ``offloaded, still in
    BookKeeper``.

    Example:
        >>> gone = TopicLedger(2, offloaded=True, bookkeeper_deleted=True)
        >>> info = ManagedLedgerInfo((TopicLedger(1), gone))
        >>> rows = topic_ledger_rows(info, {"sub": ManagedCursorInfo(9)}, {1: True, 2: False, 9: False})
        >>> [(r["ledger_id"], r["owner"], r["state"]) for r in rows]
        [(1, 'topic', 'ok'), (2, 'topic', 'offloaded'), (9, 'cursor sub', 'MISSING')]
    """
    rows = []
    for ledger in info.ledgers:
        present = in_bookkeeper.get(ledger.ledger_id, False)
        if ledger.gone_from_bookkeeper_by_design:
            state = "offloaded, still in BookKeeper" if present else "offloaded"
        else:
            state = "ok" if present else "MISSING"
        rows.append(
            {
                "ledger_id": ledger.ledger_id,
                "owner": "topic",
                "state": state,
                "entries": ledger.entries,
                "size": ledger.size,
            }
        )
    for name, cursor in sorted(cursors.items()):
        for ledger_id in cursor.ledger_ids:
            state = "ok" if in_bookkeeper.get(ledger_id, False) else "MISSING"
            rows.append(
                {
                    "ledger_id": ledger_id,
                    "owner": f"cursor {name}",
                    "state": state,
                    "entries": None,
                    "size": None,
                }
            )
    return rows


# -- encoding (the simulator and tests write what Pulsar writes) ----------------------------------------


def encode_managed_ledger_info(info: ManagedLedgerInfo, *, compression: str = "NONE") -> bytes:
    """``info`` as Pulsar writes it: binary protobuf, or compressed (``ZLIB``) behind the magic header.

    Example:
        >>> data = encode_managed_ledger_info(ManagedLedgerInfo((TopicLedger(9),)), compression="ZLIB")
        >>> data[:2] == b"\\x47\\x78", decode_managed_ledger_info(data).ledger_ids
        (True, (9,))
    """
    message = pb.ManagedLedgerInfo()
    for ledger in info.ledgers:
        entry = message.ledgerInfo.add(ledgerId=ledger.ledger_id)
        for name, value in (
            ("entries", ledger.entries),
            ("size", ledger.size),
            ("timestamp", ledger.timestamp_ms),
        ):
            if value is not None:
                setattr(entry, name, value)
        if ledger.offloaded or ledger.bookkeeper_deleted:
            entry.offloadContext.complete = ledger.offloaded
            entry.offloadContext.bookkeeperDeleted = ledger.bookkeeper_deleted
    if info.terminated_at is not None:
        message.terminatedPosition.ledgerId, message.terminatedPosition.entryId = info.terminated_at
    for key, text in info.properties:
        message.properties.add(key=key, value=text)
    return _compressed(message.SerializeToString(), compression)


def encode_managed_cursor_info(cursor: ManagedCursorInfo) -> bytes:
    """``cursor`` as Pulsar writes it (binary protobuf)."""
    message = pb.ManagedCursorInfo(
        cursorsLedgerId=-1 if cursor.cursor_ledger_id is None else cursor.cursor_ledger_id
    )
    if cursor.mark_delete is not None:
        message.markDeleteLedgerId, message.markDeleteEntryId = cursor.mark_delete
    if cursor.last_active_ms is not None:
        message.lastActive = cursor.last_active_ms
    return message.SerializeToString()


_COMPRESS: dict[str, Callable[[bytes], Any]] = {
    "ZLIB": zlib.compress,
    "LZ4": lambda body: cramjam.lz4.compress_block(body, store_size=False),
    "ZSTD": cramjam.zstd.compress,
    "SNAPPY": cramjam.snappy.compress_raw,
}


def _compressed(body: bytes, compression: str) -> bytes:
    if compression == "NONE":
        return body
    if compression not in _COMPRESS:
        raise ValueError(f"compression {compression!r}: NONE, {', '.join(_COMPRESS)}")
    metadata = pb.ManagedLedgerInfoMetadata(
        compressionType=compression, uncompressedSize=len(body)
    ).SerializeToString()
    compressed = bytes(_COMPRESS[compression](body))
    return _HEADER.pack(COMPRESSION_MAGIC, len(metadata)) + metadata + compressed


__all__ = [
    "COMPRESSION_MAGIC",
    "MANAGED_LEDGERS_ROOT",
    "TOPIC_LEDGER_STATES",
    "ManagedCursorInfo",
    "ManagedLedgerInfo",
    "TopicLedger",
    "decode_managed_cursor_info",
    "decode_managed_ledger_info",
    "encode_managed_cursor_info",
    "encode_managed_ledger_info",
    "managed_ledger_path",
    "topic_ledger_rows",
]
