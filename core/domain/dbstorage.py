"""DbLedgerStorage's RocksDB index layout: keys and values of the ``locations`` and ``ledgers`` databases.

Pure code (no I/O). A DbLedgerStorage bookie keeps, under each ledger (or index) directory's ``current/``:

- ``locations``: key = ledger id ‖ entry id (16 bytes, two signed 64-bit big-endian integers), value = the
  entry's location (8 bytes, signed big-endian: entry log id in the high 32 bits, offset in the low 32).
  A location of 0 means "not stored" (``EntryLocationIndex.getLocation`` returns 0 for a missing key and
  the bookie then answers ``ENOENTRY``). A deleted ledger's keys are removed with one range delete from
  (ledger, 0) to (ledger, 2^63 - 1).
- ``ledgers``: key = ledger id (8 bytes, signed big-endian), value = a serialized ``LedgerData`` protobuf
  (exists, fenced, masterKey, explicitLac, limbo). Negative keys are not ledgers: the bookie keeps its
  storage flags under -0xeefd. A ledger absent here does not exist on the bookie, whatever ``locations``
  still holds (a read answers ``ENOLEDGER``).

Keys sort bytewise, so one ledger's entries are contiguous and ascending for entry ids >= 0. The
``masterKey`` is a secret derived from the ledger password: :func:`decode_ledger_data` drops it.

Example:
    >>> key = location_key(7, 3)
    >>> key.hex()
    '00000000000000070000000000000003'
    >>> decode_location_key(key), decode_ledger_key(ledger_key(7))
    ((7, 3), 7)
    >>> split_location(decode_location(location_value(2, 4096)))
    (2, 4096)
    >>> decode_ledger_data(encode_ledger_data(fenced=True, master_key=b"k" * 20))
    LedgerFlags(exists=True, fenced=True, limbo=False)
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from google.protobuf.message import DecodeError

from core.errors import FormatError
from core.pb.db_ledger_storage_pb2 import LedgerData

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: Key of the bookie's storage flags in ``ledgers`` (not a ledger: BookKeeper skips negative ids).
STORAGE_FLAGS_ID = -0xEEFD
LOCATIONS_DB = "locations"
LEDGERS_DB = "ledgers"

_LONG = struct.Struct(">q")
_LONG_PAIR = struct.Struct(">qq")
_KEYS_DTYPE = np.dtype(">i8")


def _checked_long(name: str, value: int, low: int = INT64_MIN) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise FormatError(f"{name} must be an integer, got {type(value).__name__}")
    if not low <= int(value) <= INT64_MAX:
        raise FormatError(f"{name} {value} is outside [{low}, 2^63 - 1]")
    return int(value)


def checked_ledger_id(ledger_id: int) -> int:
    """``ledger_id`` when it is a ledger id BookKeeper can hold (0 .. 2^63 - 1), else :class:`FormatError`.

    Example:
        >>> checked_ledger_id(2**63 - 1) == 2**63 - 1
        True
    """
    return _checked_long("ledger id", ledger_id, 0)


def location_key(ledger_id: int, entry_id: int) -> bytes:
    """The ``locations`` key of one entry (16 bytes).

    Example:
        >>> location_key(1, -1).hex()[16:]
        'ffffffffffffffff'
    """
    return _LONG_PAIR.pack(_checked_long("ledger id", ledger_id), _checked_long("entry id", entry_id))


def decode_location_key(key: bytes) -> tuple[int, int]:
    """(ledger id, entry id) of a ``locations`` key; anything but 16 bytes is a :class:`FormatError`.

    Example:
        >>> decode_location_key(bytes(15) + b"\\x09")
        (0, 9)
    """
    if len(key) != _LONG_PAIR.size:
        raise FormatError(f"locations key: {len(key)} bytes, expected 16")
    ledger_id, entry_id = _LONG_PAIR.unpack(key)
    return ledger_id, entry_id


def ledger_bounds(ledger_id: int) -> tuple[bytes, bytes]:
    """The ``locations`` key range [lower, upper) holding ``ledger_id``'s entries with ids >= 0.

    Example:
        >>> lower, upper = ledger_bounds(5)
        >>> decode_location_key(lower), decode_location_key(upper) == (5, 2**63 - 1)
        ((5, 0), True)
    """
    return location_key(ledger_id, 0), location_key(ledger_id, INT64_MAX)


def location_value(entry_log_id: int, offset: int) -> bytes:
    """The 8-byte ``locations`` value for an entry at ``offset`` in entry log ``entry_log_id``.

    Example:
        >>> location_value(1, 8).hex()
        '0000000100000008'
    """
    if not 0 <= entry_log_id < 2**31 or not 0 <= offset < 2**32:
        raise FormatError(f"location: entry log {entry_log_id} offset {offset} out of range")
    return _LONG.pack((entry_log_id << 32) | offset)


def decode_location(value: bytes) -> int:
    """The location stored in a ``locations`` value (0 means "not stored").

    Example:
        >>> decode_location(bytes(8))
        0
    """
    if len(value) != _LONG.size:
        raise FormatError(f"locations value: {len(value)} bytes, expected 8")
    location: int = _LONG.unpack(value)[0]
    return location


def split_location(location: int) -> tuple[int, int]:
    """(entry log id, offset) of a location.

    Example:
        >>> split_location((3 << 32) | 17)
        (3, 17)
    """
    return location >> 32, location & 0xFFFFFFFF


def ledger_key(ledger_id: int) -> bytes:
    """The ``ledgers`` key of a ledger (8 bytes; the storage flags use a negative id).

    Example:
        >>> ledger_key(STORAGE_FLAGS_ID).hex()
        'ffffffffffff1103'
    """
    return _LONG.pack(_checked_long("ledger id", ledger_id))


def decode_ledger_key(key: bytes) -> int:
    """The id under a ``ledgers`` key; anything but 8 bytes is a :class:`FormatError`.

    Example:
        >>> decode_ledger_key(bytes(7) + b"\\x2a")
        42
    """
    if len(key) != _LONG.size:
        raise FormatError(f"ledgers key: {len(key)} bytes, expected 8")
    ledger_id: int = _LONG.unpack(key)[0]
    return ledger_id


@dataclass(frozen=True)
class LedgerFlags:
    """What the ``ledgers`` value says of a ledger, without its master key (a secret)."""

    exists: bool
    fenced: bool
    limbo: bool


def encode_ledger_data(
    *,
    exists: bool = True,
    fenced: bool = False,
    master_key: bytes,
    explicit_lac: bytes | None = None,
    limbo: bool | None = None,
) -> bytes:
    """A ``ledgers`` value as the bookie writes it (``LedgerData.toByteArray``).

    Example:
        >>> encode_ledger_data(master_key=b"").hex()
        '080110001a00'
    """
    data = LedgerData(exists=exists, fenced=fenced, masterKey=master_key)
    if explicit_lac is not None:
        data.explicitLac = explicit_lac
    if limbo is not None:
        data.limbo = limbo
    return data.SerializeToString()


def decode_ledger_data(value: bytes) -> LedgerFlags:
    """The flags of a ``ledgers`` value; bytes that are not a complete ``LedgerData`` are a
    :class:`FormatError`. The master key is read past and never returned.

    Example:
        >>> decode_ledger_data(bytes.fromhex("080110011a002801"))
        LedgerFlags(exists=True, fenced=True, limbo=True)
    """
    data = LedgerData()
    try:
        data.ParseFromString(value)
    except DecodeError as err:
        raise FormatError(f"ledgers value: not a LedgerData ({err})") from None
    if not data.IsInitialized():
        raise FormatError("ledgers value: LedgerData lacks a required field")
    return LedgerFlags(exists=data.exists, fenced=data.fenced, limbo=data.limbo)


def stored_entries(ledger_id: int, keys: bytes, values: bytes) -> np.ndarray:
    """The entry ids stored for ``ledger_id`` among concatenated ``locations`` keys and values (columnar).

    Keys of other ledgers, negative entry ids and zero locations (not stored) are left out. Returns an
    ascending int64 array.

    Example:
        >>> keys = location_key(4, 0) + location_key(4, 2) + location_key(4, -1) + location_key(5, 1)
        >>> values = location_value(1, 1) + location_value(1, 9) + location_value(1, 5) + bytes(8)
        >>> stored_entries(4, keys, values).tolist()
        [0, 2]
    """
    if len(keys) % _LONG_PAIR.size or len(values) % _LONG.size or len(keys) // 2 != len(values):
        raise FormatError(f"locations: {len(keys)} key bytes do not pair with {len(values)} value bytes")
    pairs = np.frombuffer(keys, dtype=_KEYS_DTYPE).reshape(-1, 2)
    locations = np.frombuffer(values, dtype=_KEYS_DTYPE)
    keep = (pairs[:, 0] == ledger_id) & (pairs[:, 1] >= 0) & (locations != 0)
    return np.sort(pairs[keep, 1].astype(np.int64))


def entry_log_id(name: str) -> int | None:
    """The id of an entry log file named ``<hex id>.log`` (DbLedgerStorage's ``current/`` directory), else
    None.

    Example:
        >>> entry_log_id("1a.log"), entry_log_id("lastId"), entry_log_id("000004.log.tmp")
        (26, None, None)
    """
    stem, dot, suffix = name.partition(".")
    if suffix != "log" or not dot or not stem or len(stem) > 16:
        return None
    try:
        return int(stem, 16)
    except ValueError:
        return None


def readable_entries(ledger_id: int, keys: bytes, values: bytes, log_sizes: Mapping[int, int]) -> np.ndarray:
    """:func:`stored_entries` whose location is inside an entry log that exists: ``log_sizes`` maps entry log
    id → file size, and an entry counts only when its log is there and its offset is below the size. A
    bookie whose entry log was deleted or truncated answers ``EIO`` to a read of such an entry while its
    index still lists it.

    Example:
        >>> keys = location_key(4, 0) + location_key(4, 1) + location_key(4, 2)
        >>> values = location_value(1, 1028) + location_value(2, 1028) + location_value(3, 9000)
        >>> readable_entries(4, keys, values, {1: 4096, 3: 4096}).tolist()
        [0]
    """
    if len(keys) % _LONG_PAIR.size or len(values) % _LONG.size or len(keys) // 2 != len(values):
        raise FormatError(f"locations: {len(keys)} key bytes do not pair with {len(values)} value bytes")
    pairs = np.frombuffer(keys, dtype=_KEYS_DTYPE).reshape(-1, 2)
    locations = np.frombuffer(values, dtype=_KEYS_DTYPE).astype(np.int64)
    keep = (pairs[:, 0] == ledger_id) & (pairs[:, 1] >= 0) & (locations != 0)
    logs, offsets = locations >> 32, locations & 0xFFFFFFFF
    sizes = np.full(locations.shape, -1, dtype=np.int64)
    for log_id in np.unique(logs[keep]).tolist():
        sizes[logs == log_id] = log_sizes.get(int(log_id), -1)
    keep &= offsets < sizes
    return np.sort(pairs[keep, 1].astype(np.int64))


def entry_runs(entry_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inclusive runs (starts, ends) of an ascending array of distinct entry ids (columnar).

    Example:
        >>> firsts, lasts = entry_runs(np.array([0, 1, 2, 5, 7, 8]))
        >>> firsts.tolist(), lasts.tolist()
        ([0, 5, 7], [2, 5, 8])
    """
    ids = np.asarray(entry_ids, dtype=np.int64)
    if ids.size == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty
    breaks = np.flatnonzero(np.diff(ids) != 1)
    firsts = np.concatenate(([ids[0]], ids[breaks + 1]))
    lasts = np.concatenate((ids[breaks], [ids[-1]]))
    return firsts, lasts


def ledger_ids_of_keys(keys: bytes) -> np.ndarray:
    """The ledger ids (>= 0) under concatenated ``ledgers`` keys, ascending (columnar).

    Example:
        >>> ledger_ids_of_keys(ledger_key(3) + ledger_key(9) + ledger_key(STORAGE_FLAGS_ID)).tolist()
        [3, 9]
    """
    if len(keys) % _LONG.size:
        raise FormatError(f"ledgers keys: {len(keys)} bytes is not a multiple of 8")
    ids = np.frombuffer(keys, dtype=_KEYS_DTYPE).astype(np.int64)
    return np.sort(ids[ids >= 0])
