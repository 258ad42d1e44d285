"""A DbLedgerStorage bookie's RocksDB indexes: read without disturbing the bookie, written by the simulator.

Each ledger (or index) directory of a DbLedgerStorage bookie holds ``current/ledgers`` and
``current/locations`` (layout: :mod:`core.domain.dbstorage`). :class:`DbStorageIndexReader` opens them
read-only through a private *view*: a directory of its own with a symbolic link to each of the database's
files (never ``LOCK`` or ``LOG``), so nothing is ever created, renamed or locked in the bookie's directory,
which may even be mounted read-only. RocksDB's read-only mode sees what was flushed or written to the
write-ahead log when the view was opened; the reader reopens a database when its files changed, at most
every ``refresh_s``. (The bookie keeps recent entries in its write cache until its next flush, by default
within a minute; the index shows them from then on.)

An entry counts as held only when the entry log its location points into is there: in a ledger directory
(one whose ``current/`` has the entry logger's ``lastId`` file) the reader lists the ``<hex id>.log`` files
and leaves out entries whose log is missing or shorter than their offset, which a real bookie answers with
``EIO`` while its index still lists them. A directory without ``lastId`` (a separate ``indexDirectories``
entry) is not checked.

:class:`DbStorageIndexWriter` writes the same layout with BookKeeper's table options, for the simulator's
DbLedgerStorage bookies (:class:`IndexedEntryStore`), so the agent is tested against real RocksDB files.

Example:
    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> writer = DbStorageIndexWriter(root)
    >>> writer.add_entries(9, [0, 1, 2, 4], master_key=b"k" * 20)
    >>> reader = DbStorageIndexReader([root], view_root=root / "views", refresh_s=0)
    >>> reader.entries_of(9).tolist(), reader.flags_of(9).fenced, reader.flags_of(10)
    ([0, 1, 2, 4], False, None)
    >>> reader.close(); writer.close()
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import cast

import numpy as np
from rocksdict import (
    AccessType,
    BlockBasedOptions,
    ChecksumType,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
)

from connectors.bookie.server import InMemoryEntryStore
from core.domain.dbstorage import (
    INT64_MAX,
    LEDGERS_DB,
    LOCATIONS_DB,
    LedgerFlags,
    decode_ledger_data,
    encode_ledger_data,
    entry_log_id,
    ledger_bounds,
    ledger_ids_of_keys,
    ledger_key,
    location_key,
    location_value,
    readable_entries,
    stored_entries,
)
from core.errors import ServiceError

logger = logging.getLogger(__name__)

#: Files of a RocksDB directory a reader must never touch (the writer's lock, its info logs) plus the
#: Python binding's own config file.
_NOT_LINKED = ("LOCK", "LOG", "rocksdict-config.json")
_OPEN_ATTEMPTS = 5  # a compaction may delete a file between listing and opening: list again


def index_dirs(ledger_dir: Path) -> Path:
    """The directory holding ``ledgers`` and ``locations`` for one configured ledger (or index) dir.

    Accepts the configured directory or its ``current/`` itself.

    Example:
        >>> index_dirs(Path("/data/ledgers")), index_dirs(Path("/data/ledgers/current"))
        (PosixPath('/data/ledgers/current'), PosixPath('/data/ledgers/current'))
    """
    return ledger_dir if ledger_dir.name == "current" else ledger_dir / "current"


def _raw_options() -> Options:
    return Options(raw_mode=True)


def entry_log_sizes(ledger_dir: Path) -> dict[int, int] | None:
    """Entry log id → size of the entry logs in a DbLedgerStorage ledger directory, or None when the
    directory holds no entry logger (no ``current/lastId``: an index-only directory).

    Example:
        >>> import tempfile
        >>> current = Path(tempfile.mkdtemp()) / "current"; current.mkdir()
        >>> entry_log_sizes(current)
        >>> (current / "lastId").write_text("1\\n"); (current / "a.log").write_bytes(bytes(1024))
        2
        1024
        >>> entry_log_sizes(current)
        {10: 1024}
    """
    current = index_dirs(ledger_dir)
    if not (current / "lastId").is_file():
        return None
    sizes: dict[int, int] = {}
    with contextlib.suppress(FileNotFoundError):
        for path in current.iterdir():
            log_id = entry_log_id(path.name)
            if log_id is not None:
                with contextlib.suppress(FileNotFoundError):
                    sizes[log_id] = path.stat().st_size
    return sizes


def _fingerprint(db_dir: Path) -> tuple[tuple[str, int], ...]:
    """Names and sizes of the database's files: any flush, compaction or WAL write changes it."""
    try:
        return tuple(
            sorted((p.name, p.stat().st_size) for p in db_dir.iterdir() if not p.name.startswith(_NOT_LINKED))
        )
    except FileNotFoundError:
        return ()


class _ReadOnlyView:
    """One database opened read-only through a directory of symbolic links to its files."""

    def __init__(self, db_dir: Path, view_root: Path) -> None:
        self.db_dir = db_dir
        self.view_root = view_root
        self.fingerprint: tuple[tuple[str, int], ...] = ()
        self.opened_at = 0.0
        self.view: Path | None = None
        self.db: Rdict | None = None

    def open(self) -> Rdict:
        if not (self.db_dir / "CURRENT").is_file():
            raise ServiceError(f"{self.db_dir}: not a RocksDB database (no CURRENT file)")
        last_error: Exception | None = None
        for _ in range(_OPEN_ATTEMPTS):
            fingerprint = _fingerprint(self.db_dir)
            view = Path(tempfile.mkdtemp(prefix=f"{self.db_dir.name}-", dir=self.view_root))
            for name, _size in fingerprint:
                (view / name).symlink_to(self.db_dir / name)
            try:
                db = Rdict(str(view), options=_raw_options(), access_type=AccessType.read_only())
            except Exception as err:  # rocksdict raises plain Exception for RocksDB errors
                shutil.rmtree(view, ignore_errors=True)
                last_error = err
                continue
            self._swap(db, view, fingerprint)
            return db
        raise ServiceError(f"{self.db_dir}: cannot open read-only: {last_error}")

    def _swap(self, db: Rdict, view: Path, fingerprint: tuple[tuple[str, int], ...]) -> None:
        self.close()
        self.db, self.view, self.fingerprint, self.opened_at = db, view, fingerprint, time.monotonic()

    def current(self, refresh_s: float) -> Rdict:
        """The open database, reopened first when its files changed and ``refresh_s`` has passed."""
        if self.db is None:
            return self.open()
        if time.monotonic() - self.opened_at >= refresh_s and _fingerprint(self.db_dir) != self.fingerprint:
            return self.open()
        return self.db

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None
        if self.view is not None:
            shutil.rmtree(self.view, ignore_errors=True)
            self.view = None


def _ledger_locations(locations: Rdict, ledger_id: int) -> tuple[bytes, bytes]:
    """The joined keys and values of ``ledger_id``'s entries (ids >= 0) in one ``locations`` database."""
    lower, upper = ledger_bounds(ledger_id)
    bounds = ReadOptions()
    bounds.set_iterate_upper_bound(upper)
    keys: list[bytes] = []
    values: list[bytes] = []
    for key, value in locations.items(from_key=lower, read_opt=bounds):
        keys.append(cast(bytes, key))  # raw mode: bytes in, bytes out
        values.append(cast(bytes, value))
    return b"".join(keys), b"".join(values)


class DbStorageIndexReader:
    """Read-only answers from the indexes of every configured ledger directory of one bookie.

    ``ledger_dirs`` are the bookie's ``ledgerDirectories`` (or ``indexDirectories`` when it has them), in
    any order: a ledger is looked up in all of them. Thread-safe; every call sees the state of the last
    (re)open. Never returns a master key.
    """

    def __init__(
        self, ledger_dirs: Sequence[Path], *, refresh_s: float = 10.0, view_root: Path | None = None
    ):
        if not ledger_dirs:
            raise ServiceError("no ledger directories given")
        self.refresh_s = refresh_s
        self._own_root = view_root is None
        self.view_root = Path(tempfile.mkdtemp(prefix="bkaudit-agent-")) if view_root is None else view_root
        self.view_root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._ledger_dirs = [Path(d) for d in ledger_dirs]
        self._log_sizes: dict[int, tuple[float, dict[int, int] | None]] = {}
        self._views = [
            (
                _ReadOnlyView(index_dirs(d) / LEDGERS_DB, self.view_root),
                _ReadOnlyView(index_dirs(d) / LOCATIONS_DB, self.view_root),
            )
            for d in ledger_dirs
        ]
        try:
            with self._lock:
                for ledgers, locations in self._views:
                    ledgers.open()
                    locations.open()
        except BaseException:
            self.close()  # the views opened so far, and a view root of its own
            raise

    def _databases(self) -> list[tuple[Rdict, Rdict]]:
        return [(a.current(self.refresh_s), b.current(self.refresh_s)) for a, b in self._views]

    def flags_of(self, ledger_id: int) -> LedgerFlags | None:
        """The ledger's flags, or None when no directory holds it (the bookie answers ENOLEDGER).

        A ledger whose ``exists`` flag is false is absent too, as for the bookie.
        """
        key = ledger_key(ledger_id)
        with self._lock:
            for ledgers, _ in self._databases():
                value = ledgers.get(key)
                if value is not None:
                    flags = decode_ledger_data(value)
                    return flags if flags.exists else None
        return None

    def entries_of(self, ledger_id: int) -> np.ndarray:
        """The entry ids stored for ``ledger_id`` (ascending int64; empty when none), without those whose
        entry log file is missing or too short (see the module's notes)."""
        found: list[np.ndarray] = []
        with self._lock:
            for number, (_, locations_view) in enumerate(self._views):
                locations = locations_view.current(self.refresh_s)
                keys, values = _ledger_locations(locations, ledger_id)
                sizes = self._entry_logs(number)
                if sizes is None:
                    found.append(stored_entries(ledger_id, keys, values))
                    continue
                kept = readable_entries(ledger_id, keys, values, sizes)
                changed = _fingerprint(locations_view.db_dir) != locations_view.fingerprint
                if changed and kept.size < stored_entries(ledger_id, keys, values).size:
                    # A compaction moves entries to a new log before deleting the old one: read both again.
                    keys, values = _ledger_locations(locations_view.open(), ledger_id)
                    kept = readable_entries(
                        ledger_id, keys, values, self._entry_logs(number, fresh=True) or {}
                    )
                found.append(kept)
        return np.unique(np.concatenate(found)) if found else np.empty(0, dtype=np.int64)

    def _entry_logs(self, number: int, *, fresh: bool = False) -> dict[int, int] | None:
        """The entry log sizes of ledger directory ``number``, listed again at most every ``refresh_s``."""
        listed = self._log_sizes.get(number)
        if fresh or listed is None or time.monotonic() - listed[0] >= self.refresh_s:
            listed = (time.monotonic(), entry_log_sizes(self._ledger_dirs[number]))
            self._log_sizes[number] = listed
        return listed[1]

    def ledger_ids(self, after: int = -1, limit: int = 100_000) -> tuple[np.ndarray, bool]:
        """Up to ``limit`` ledger ids above ``after``, ascending, and whether more remain."""
        start = ledger_key(max(after + 1, 0)) if after < INT64_MAX else None
        if start is None:
            return np.empty(0, dtype=np.int64), False
        found: list[np.ndarray] = []
        with self._lock:
            for ledgers, _ in self._databases():
                keys: list[bytes] = []
                for item in ledgers.keys(from_key=start):
                    key = cast(bytes, item)
                    if key[0] & 0x80 or len(keys) > limit:  # negative ids (the storage flags) sort last
                        break
                    keys.append(key)  # limit + 1 at most: the last one only tells that more remain
                found.append(ledger_ids_of_keys(b"".join(keys)))
        merged = np.unique(np.concatenate(found)) if found else np.empty(0, dtype=np.int64)
        return merged[:limit], merged.size > limit

    def close(self) -> None:
        with self._lock:
            for ledgers, locations in self._views:
                ledgers.close()
                locations.close()
        if self._own_root:
            shutil.rmtree(self.view_root, ignore_errors=True)


def _bookie_options(entry_locations: bool) -> Options:
    """BookKeeper's table options (``KeyValueStorageRocksDB``): format version 5, xxHash checksums; the
    entry locations also LZ4-compressed, 64 KiB blocks and a 10-bit bloom filter."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    table = BlockBasedOptions()
    table.set_format_version(5)
    table.set_checksum_type(ChecksumType.xxhash())
    if entry_locations:
        options.set_compression_type(DBCompressionType.lz4())
        table.set_block_size(64 * 1024)
        table.set_bloom_filter(10, False)
        table.set_cache_index_and_filter_blocks(True)
    options.set_block_based_table_factory(table)
    return options


def _open_for_writing(db_dir: Path, entry_locations: bool) -> Rdict:
    db_dir.mkdir(parents=True, exist_ok=True)
    db = Rdict(str(db_dir), options=_bookie_options(entry_locations))
    # The binding's own file is not part of a bookie's layout, and is read only when opening.
    with contextlib.suppress(FileNotFoundError):
        (db_dir / "rocksdict-config.json").unlink()
    return db


class DbStorageIndexWriter:
    """Writes one bookie directory's ``current/ledgers`` and ``current/locations`` in BookKeeper's layout.

    Entry locations are made up (entry log ``1 + n // 100000``, growing offsets) but never 0, which would
    mean "not stored". Each call is one write batch, visible to a reader opened afterwards.
    """

    def __init__(self, ledger_dir: Path) -> None:
        current = index_dirs(ledger_dir)
        self.ledgers = _open_for_writing(current / LEDGERS_DB, entry_locations=False)
        self.locations = _open_for_writing(current / LOCATIONS_DB, entry_locations=True)
        self._written = 0
        self._closed = False
        self._lock = threading.Lock()

    def create_ledger(
        self, ledger_id: int, *, master_key: bytes, fenced: bool = False, limbo: bool | None = None
    ) -> None:
        """Write the ledger's ``LedgerData`` (exists) as the bookie does on its first add or fence."""
        value = encode_ledger_data(fenced=fenced, master_key=master_key, limbo=limbo)
        with self._lock:
            self.ledgers.put(ledger_key(ledger_id), value)

    def add_entries(self, ledger_id: int, entry_ids: Iterable[int], *, master_key: bytes) -> None:
        """Store ``entry_ids`` of ``ledger_id`` (its ``LedgerData`` first when the ledger is new)."""
        with self._lock:
            if self.ledgers.get(ledger_key(ledger_id)) is None:
                self.ledgers.put(ledger_key(ledger_id), encode_ledger_data(master_key=master_key))
            batch = WriteBatch(raw_mode=True)
            for entry_id in entry_ids:
                self._written += 1
                log_id, offset = 1 + self._written // 100_000, 1024 + 64 * (self._written % 100_000)
                batch.put(location_key(ledger_id, entry_id), location_value(log_id, offset))
            self.locations.write(batch)

    def remove_entries(self, ledger_id: int, entry_ids: Iterable[int]) -> None:
        """Remove single entries' locations (what a lost or corrupted index looks like)."""
        with self._lock:
            batch = WriteBatch(raw_mode=True)
            for entry_id in entry_ids:
                batch.delete(location_key(ledger_id, entry_id))
            self.locations.write(batch)

    def delete_ledger(self, ledger_id: int) -> None:
        """Delete the ledger as the bookie does: its ``LedgerData``, then one range delete of its entries."""
        with self._lock:
            self.ledgers.delete(ledger_key(ledger_id))
            self.locations.delete_range(*ledger_bounds(ledger_id))

    def put_raw(self, database: str, key: bytes, value: bytes) -> None:
        """Write one raw key (tests of hostile content)."""
        with self._lock:
            (self.ledgers if database == LEDGERS_DB else self.locations).put(key, value)

    def close(self) -> None:
        """Close both databases (again: a no-op)."""
        with self._lock:
            if not self._closed:
                self.ledgers.close()
                self.locations.close()
                self._closed = True


def sim_master_key(ledger_id: int) -> bytes:
    """A recognisable 20-byte stand-in for the master key the simulator stores (tests look for its leaks).

    Example:
        >>> len(sim_master_key(5)), sim_master_key(5)[:8]
        (20, b'SECRETMK')
    """
    return b"SECRETMK" + ledger_id.to_bytes(8, "big", signed=False) + b"\x5a" * 4


class IndexedEntryStore(InMemoryEntryStore):
    """The simulator's DbLedgerStorage store: the in-memory store the bookie server answers from, with every
    change also written to a real RocksDB index in BookKeeper's layout (for ``bkaudit agent``).

    Example:
        >>> import tempfile
        >>> store = IndexedEntryStore(Path(tempfile.mkdtemp()))
        >>> store.add_entries(3, range(4)); store.drop_entries(3, [2])
        >>> reader = DbStorageIndexReader([store.ledger_dir], refresh_s=0)
        >>> reader.entries_of(3).tolist()
        [0, 1, 3]
        >>> reader.close(); store.close()
    """

    def __init__(self, ledger_dir: Path) -> None:
        super().__init__()
        self.ledger_dir = ledger_dir
        self.index = DbStorageIndexWriter(ledger_dir)

    def create_ledger(self, ledger_id: int) -> None:
        super().create_ledger(ledger_id)
        self.index.create_ledger(ledger_id, master_key=sim_master_key(ledger_id))

    def add_entries(self, ledger_id: int, entry_ids: Iterable[int]) -> None:
        ids = list(entry_ids)
        super().add_entries(ledger_id, ids)
        self.index.add_entries(ledger_id, ids, master_key=sim_master_key(ledger_id))

    def drop_entries(self, ledger_id: int, entry_ids: Iterable[int]) -> None:
        ids = list(entry_ids)
        super().drop_entries(ledger_id, ids)
        self.index.remove_entries(ledger_id, ids)

    def drop_ledger(self, ledger_id: int) -> bool:
        self.index.delete_ledger(ledger_id)
        return super().drop_ledger(ledger_id)

    def close(self) -> None:
        self.index.close()
