"""The ledgers' state without a copy-on-write MERGE per micro-batch: append, fold, and hold it in memory.

A MERGE of one micro-batch's ledger rows into the 1 M-row ``ledgers`` table rewrote all of it (2–3 s on a
quiet machine, 5–10 s loaded, whatever the batch's size), and replacing their rows in the
``ledger_bookies`` index did the same to that table; de-duplicating by znode version read ``ledgers`` every
batch. The layout instead (docs/journal.md, "Ledger state without a MERGE per batch"):

- ``ledger_changes``: append-only; per micro-batch, one row per ledger it changed (the ledger's whole new
  row plus ``batch_id``), written with the batch's app transaction. It is also the ledgers' history.
- ``ledger_bookies``: appended too, with the rows of each new ledger version (``mzxid``), but not per
  batch: :meth:`LedgerLog.flush_index` appends the versions of every batch since its last run in one
  commit (the sink runs it every ``stream.index_append_interval_s``), its app transaction the last batch
  it covers. Until then a ledger changed since the last fold is indexed by its current row: every reader
  (:meth:`LedgerLog.read_index`, :func:`read_current_index`, ``bkaudit query``) takes the rows of those
  ledgers from their current rows and the table's rows for the others, so what it sees never depends on
  when the index was last appended. A fold never passes the last batch appended, so a folded ledger's rows
  are in the table; after a crash the versions not appended are found again from ``ledger_changes``. Rows
  of older versions stay until :meth:`LedgerLog.clean_index` removes them; every reader keeps only the
  rows of a ledger's current version.
- ``ledgers``: one row per ledger, the fold of the changes, partitioned in ``buckets``
  (``ledger_id % buckets``) and folded in rotation (:meth:`LedgerLog.fold`, ``fold_ticks`` times per
  ``stream.ledger_fold_interval_s`` in a background thread, each tick rewriting a few of the buckets holding
  changes, oldest first; from ``FOLD_IN_CHILD_FROM_ROWS`` rows on, computed and written by a child process,
  :mod:`connectors.delta._fold_process`). Each commit carries the watermark, the last batch every bucket
  holds, as the app transaction ``(<app>.fold, watermark)``: it advances past a batch once the last bucket
  holding one of its changes is folded. Files a fold replaced are vacuumed ``vacuum_rounds`` watermark
  advances later.
- In memory: ``ledgers`` as of the watermark as its hot columns only (:mod:`.ledger_columns`: id, version,
  state and flags, ~19 bytes per ledger, sorted by id), and the rows changed since (the overlay), so
  versions and the hot paths' columns are looked up without reading Delta. Any other column of a ledger not
  changed since is read from ``ledgers``, only the buckets of the ledgers asked for; a step that goes
  through every ledger walks :meth:`LedgerLog.current_chunks`, a few buckets at a time. No step holds a copy
  of the whole table, a fold included (:func:`._fold_process.folded_groups`).

Staleness: :func:`read_current_ledgers` and :func:`read_current_index` (used by ``bkaudit query`` and
:func:`connectors.delta.tables.read_table`) show every batch the job finished; a reader of the raw
``ledgers`` Delta table sees the state as of the last fold, at most ``ledger_fold_interval_s`` plus one fold
behind while the job runs (the job folds everything when it stops).

Example:
    >>> import tempfile
    >>> from connectors.delta.tables import BatchWriter, ensure_tables
    >>> root = tempfile.mkdtemp(); _ = ensure_tables(root)
    >>> log = LedgerLog(root, "doc")
    >>> log.open(0)
    >>> row = {"ledger_id": 7, "ledger_bucket": 7, "state": "CLOSED", "mzxid": 3, "deleted": False}
    >>> row = {**row, "bookies": ["b1", "b2"]}
    >>> log.record(BatchWriter(root, "doc", 0), [row])
    True
    >>> log.versions(np.array([7, 8]))[0].tolist()
    [3, -1]
    >>> read_current_ledgers(root).column("mzxid").to_pylist()
    [3]
    >>> sorted(read_current_index(root).column("bookie").to_pylist())  # before the index's append
    ['b1', 'b2']
    >>> log.fold(through=0) is None  # nothing folds past the index's last append
    True
    >>> log.flush_index()
    2
    >>> log.fold(through=0).rows
    1
    >>> DeltaTable(root + "/ledgers").to_pyarrow_table().column("ledger_id").to_pylist()
    [7]
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from connectors import storage
from connectors.delta._fold_process import (
    FOLD_SCRATCH,
    FoldCommit,
    FoldRequest,
    fold_in_child,
    folded_groups,
    in_buckets,
    with_buckets,
    write_fold,
)
from connectors.delta.ledger_columns import HOT_COLUMNS, LedgerColumns
from connectors.delta.scan import BucketReader, scan, scan_partitions
from connectors.delta.tables import (
    APP_METADATA_KEY,
    FOLD_METADATA_KEY,
    FOLD_REACHED_KEY,
    LEDGER_BOOKIES,
    LEDGER_BUCKETS,
    LEDGER_CHANGES,
    LEDGERS,
    BatchWriter,
    OpenTables,
    conform_to,
    index_rows_of_versions,
    index_rows_on,
    of_current_versions,
    read_current_index,
    read_current_ledgers,
    table_path,
)
from core.errors import BkauditError

__all__ = [
    "FoldReport",
    "LedgerLog",
    "fold_app",
    "index_rows_of_versions",
    "read_current_index",
    "read_current_ledgers",
]

logger = logging.getLogger(__name__)

_NO_VERSION = -1
#: How long ``ledgers`` keeps its commit files once folds vacuum it (a replay reads a few commits back).
LOG_RETENTION = "interval 1 hours"
#: How long ``ledger_bookies`` keeps its commit files: an append and a cleanup commit every 5 s, each
#: listing ~100 files (~2 MB of log a minute at 1 M ledgers), and no reader goes back past the vacuum's
#: rounds (its app transactions stay in the checkpoints).
INDEX_LOG_RETENTION = "interval 10 minutes"
#: A ``ledger_bookies`` partition of more files than this is rewritten as one by the index cleanup even
#: with no old row to remove: each index append adds a file to every bookie it touches, and a loss reads
#: its bookie's partition (80 files cost 3x the CPU of one). The periodic maintenance compacts it too, since
#: the cleanup visits a partition only once per rotation.
INDEX_PARTITION_FILES = 8
#: From this many rows folded (the base's and the changes'), a fold runs in a process of its own
#: (:mod:`._fold_process`).
FOLD_IN_CHILD_FROM_ROWS = 200_000
#: Buckets of ``ledgers`` read at once by a step that goes through every ledger's row
#: (:meth:`LedgerLog.current_chunks`): its memory is that share of the table's rows, not all of them.
CHUNK_BUCKETS = 16


def fold_app(app_id: str) -> str:
    """The app id of the fold's commits (its transaction version is the last batch folded).

    Example:
        >>> fold_app("bkaudit")
        'bkaudit.fold'
    """
    return f"{app_id}.fold"


@dataclass(frozen=True)
class FoldReport:
    """One fold (a tick of the rotation): the last batch it folded into the buckets it rewrote, the ledger
    rows merged, its seconds, the buckets rewritten, and the batch every bucket now holds (``complete``,
    the watermark readers and a restart rely on)."""

    through: int
    rows: int
    seconds: float
    merged: bool  # False: ``ledgers`` already held it (a replay after a crash), only memory was updated
    buckets: int = 0
    complete: int = _NO_VERSION


def _fold_marks(commit: Mapping[str, Any]) -> tuple[int, int]:
    """A fold commit's watermark (every bucket holds the batches through it) and the newest batch any bucket
    holds (the same before folds ran in rotation)."""
    complete = int(commit.get(FOLD_METADATA_KEY, _NO_VERSION))
    return complete, int(commit.get(FOLD_REACHED_KEY, complete))


def _last_fold_marks(table: DeltaTable, app: str) -> tuple[int, int]:
    """The watermark and the newest batch folded of ``app``'s last fold among the last 200 commits (-1:
    none)."""
    for commit in table.history(200):
        if commit.get(APP_METADATA_KEY) == app:
            return _fold_marks(commit)
    return _NO_VERSION, _NO_VERSION


def _fold_version_before(table: DeltaTable, app: str, batch_id: int) -> tuple[int, int, int]:
    """The newest version of ``ledgers`` whose folds hold only batches before ``batch_id`` in every bucket,
    its watermark and newest batch folded (-1: none). For a replay of a batch a fold already covered (a
    fold at a stop, then a crash before Spark recorded the batch done)."""
    oldest_covering: int | None = None
    for commit in table.history(200):
        if commit.get(APP_METADATA_KEY) != app:
            continue
        complete, reached = _fold_marks(commit)
        version = int(commit["version"])
        if reached < batch_id:
            return version, complete, reached
        oldest_covering = version
    if oldest_covering is None:
        raise RuntimeError(f"ledgers: no fold of {app} before batch {batch_id} in the last 200 commits")
    return oldest_covering - 1, _NO_VERSION, _NO_VERSION


def plan_tick(oldest: np.ndarray, through: int, limit: int | None) -> tuple[np.ndarray, int]:
    """Which buckets a fold tick rewrites and the watermark after it: ``oldest`` holds, per bucket, the
    oldest batch it has not folded (-1: none pending); the tick takes up to ``limit`` of the pending
    buckets (all when None), oldest first, folds them through batch ``through``, and every bucket then
    holds every batch before the oldest one still pending.

    Example:
        >>> plan_tick(np.array([4, -1, 2, 3]), through=6, limit=2)
        (array([2, 3]), 3)
        >>> plan_tick(np.array([4, -1, 2, 3]), through=6, limit=None)
        (array([0, 2, 3]), 6)
    """
    pending = np.flatnonzero(oldest >= 0)
    ordered = pending[np.lexsort((pending, oldest[pending]))]
    chosen = ordered if limit is None else ordered[:limit]
    left = ordered[len(chosen) :]
    complete = through if not len(left) else min(through, int(oldest[left].min()) - 1)
    return np.sort(chosen), complete


def tick_limit(per_tick: int, seconds: float, period: float, buckets: int) -> int:
    """How many buckets the next fold tick may rewrite: ``per_tick``, times the ticks' periods the last tick
    took (``seconds``), so a rotation still takes about one interval when ticks are slow (a starved
    machine, a snapshot's first folds) and each tick's fixed costs are shared by more buckets.

    Example:
        >>> tick_limit(26, 0.4, 3.0, 256), tick_limit(26, 7.0, 3.0, 256), tick_limit(26, 90.0, 3.0, 256)
        (26, 78, 256)
    """
    return min(buckets, per_tick * max(1, math.ceil(seconds / period)))


def oldest_pending(changes: Sequence[tuple[int, pa.Table]], folded: np.ndarray, buckets: int) -> np.ndarray:
    """Per bucket, the oldest batch among ``changes`` (batch id, rows; oldest first) with a row in it that
    the bucket has not folded yet (``folded``: the last batch each bucket holds); -1 where there is none.

    Example:
        >>> rows = lambda *ids: pa.table({"ledger_id": list(ids)})
        >>> oldest_pending([(3, rows(1, 2)), (4, rows(0, 1))], np.array([-1, 3, -1]), 3).tolist()
        [4, 4, 3]
    """
    oldest = np.full(buckets, _NO_VERSION, np.int64)
    for batch, rows in reversed(changes):  # newest first: an older batch overwrites
        if not rows.num_rows:
            continue
        hit = np.unique(rows.column("ledger_id").to_numpy() % buckets)
        hit = hit[folded[hit] < batch]
        oldest[hit] = batch
    return oldest


class LedgerLog:
    """The job's ledger state: Delta writes (append-only) and the current rows in memory.

    Thread-safe: the ledger lane records and reads, the loss owner reads versions, the fold thread folds.
    """

    def __init__(self, root: str | Path, app_id: str, *, buckets: int = LEDGER_BUCKETS) -> None:
        self.root = str(root)
        self.app_id = app_id
        #: Partitions of ``ledgers`` (``ledger_bucket = ledger_id % buckets``).
        self.buckets = buckets
        #: Fold ticks per fold interval: each rewrites at most ``ceil(buckets / fold_ticks)`` buckets.
        self.fold_ticks = 1
        #: Files the folds replaced are deleted once the watermark advanced this often since (0: never here).
        self.vacuum_rounds = 0
        self._bucket_folded = np.full(buckets, _NO_VERSION, np.int64)  # per bucket: last batch in ``ledgers``
        self._reached = _NO_VERSION  # the newest batch any bucket of ``ledgers`` holds
        # ``ledgers`` was written with another bucket count: the next fold rewrites all of it.
        self._rebucket = False
        # ``ledgers`` versions where the watermark advanced (oldest first), and ``ledger_bookies``' then.
        self._round_versions: list[int] = []
        self._index_round_versions: list[int] = []
        self._index_vacuumed: list[int] = []  # the latter when the index was last vacuumed
        self._lock = threading.Lock()  # base and overlay
        self.fold_lock = threading.Lock()  # one writer of ``ledgers`` at a time (the fold, maintenance)
        # ``ledgers`` as of the watermark: its hot columns; the rows are read from the table by bucket.
        self._base = LedgerColumns.empty()
        # The version of ``ledgers`` rows are read at (None: the newest). A replay opened at an older one
        # (the newest holds batches it is replaying) reads there until a fold rewrote the whole table.
        self._read_version: int | None = None
        self._ledgers_tables: dict[int | None, DeltaTable] = {}
        self._table_lock = threading.Lock()  # the ``ledgers`` handles
        self._overlay: list[tuple[int, pa.Table]] = []  # (batch id, rows), oldest first
        self._latest = _OverlayIndex.empty()  # per ledger in the overlay: its newest row's place and version
        self._folded_through = _NO_VERSION
        self._foldable_through = _NO_VERSION
        self._recorded_through = _NO_VERSION  # the last batch recorded
        self._index_through = _NO_VERSION  # the last batch whose new versions are in ledger_bookies
        self._opened = False
        self._changes = 0  # counts every change of the current rows (see ``changes``)
        self._index_cursor = 0
        self._rows_recorded = 0  # ledger rows recorded since open: a new version can leave old index rows
        self._index_clean_at: dict[str, int] = {}  # per bookie partition: _rows_recorded when last cleaned
        self._index_clean_through = -1  # every partition was clean when _rows_recorded was this
        self._index: DeltaTable | None = None
        self._folder: threading.Thread | None = None
        #: A tick folding this many rows (its buckets' and the changes') runs in a process of its own (below
        #: it a process costs more than the fold).
        self.fold_in_child_from_rows = FOLD_IN_CHILD_FROM_ROWS
        self._stop_folding = threading.Event()
        self.last_fold: FoldReport | None = None
        #: A step run after every fold by the fold thread and when folding stops, holding ``fold_lock``
        #: (the job keeps its ``placement_plans`` table current here).
        self.after_fold: Callable[[], object] | None = None
        # Raises once the job no longer holds its checkpoint: no fold or index append after that.
        self.write_check: Callable[[], None] = lambda: None

    # -- opening --------------------------------------------------------------------------------------------
    @property
    def opened(self) -> bool:
        return self._opened

    @property
    def changes(self) -> int:
        """A number that changes whenever a ledger's current row may have: a batch recorded, or the state
        loaded again (a fold changes none). What a reader computed from the current rows holds while it
        stays the same."""
        with self._lock:
            return self._changes

    def ensure_open(self) -> None:
        """Open with every batch recorded so far (for a reader that comes before the ledger lane's first
        batch: the membership lane's loss owner)."""
        with self._lock:
            if self._opened:
                return
        changes = DeltaTable(table_path(self.root, "ledger_changes"))
        recorded = changes.transaction_version(self.app_id)
        self.open(_NO_VERSION + 1 if recorded is None else int(recorded) + 1)

    def open(self, batch_id: int) -> None:
        """Load the state as of before ``batch_id``: ``ledgers`` at its last fold before it, and the changes
        of the batches between that fold and ``batch_id``. Already open at a fold before ``batch_id``, only
        the changes of ``batch_id`` and later (a replayed batch's first attempt) are forgotten."""
        with self._lock:
            if self._opened and self._reached < batch_id:
                if any(b >= batch_id for b, _ in self._overlay):  # a replay: forget its first attempt
                    self._overlay = [(b, rows) for b, rows in self._overlay if b < batch_id]
                    self._latest = _OverlayIndex.of(self._overlay)
                    self._changes += 1
                self._foldable_through = batch_id - 1
                self._recorded_through = min(self._recorded_through, batch_id - 1)
                return
        ledgers = DeltaTable(table_path(self.root, "ledgers"))
        app = fold_app(self.app_id)
        folded = ledgers.transaction_version(app)
        folded = _NO_VERSION if folded is None else int(folded)
        reached = max(folded, _last_fold_marks(ledgers, app)[1])
        pinned = None
        if reached >= batch_id:
            pinned, folded, reached = _fold_version_before(ledgers, app, batch_id)
            ledgers = DeltaTable(table_path(self.root, "ledgers"), version=pinned)
        base, rebucket = load_columns(ledgers, self.buckets)
        if rebucket:
            logger.info(
                "ledgers: written with another bucket count; the next fold rewrites it in %d buckets",
                self.buckets,
            )
        changes = scan(
            DeltaTable(table_path(self.root, "ledger_changes")),
            [("batch_id", ">", folded), ("batch_id", "<", batch_id)],
        )
        indexed = DeltaTable(table_path(self.root, "ledger_bookies")).transaction_version(self.app_id)
        scratch = storage.local_scratch(self.root, FOLD_SCRATCH)
        for stale in scratch.glob(f"{self.app_id}-*.arrow"):  # a killed job's
            stale.unlink(missing_ok=True)
        with self._table_lock:
            self._ledgers_tables = {}
        with self._lock:
            self._base = base
            self._read_version = pinned
            self._overlay = []
            if changes.num_rows:
                for one in np.unique(changes.column("batch_id").to_numpy()):
                    rows = changes.filter(pc.equal(changes.column("batch_id"), one)).drop(["batch_id"])
                    self._overlay.append((int(one), conform_to(rows, LEDGERS.schema)))
            self._latest = _OverlayIndex.of(self._overlay)
            self._changes += 1
            self._folded_through = folded
            self._bucket_folded = np.full(self.buckets, folded, np.int64)
            self._reached, self._rebucket, self._round_versions = max(reached, folded), rebucket, []
            self._foldable_through = batch_id - 1
            self._recorded_through = batch_id - 1
            # A fold never passes the index's last append (so a fold is a lower bound: an index written
            # per batch, before its append had a cadence, held every folded batch).
            self._index_through = max(folded, _NO_VERSION if indexed is None else int(indexed))
            self._opened = True
        logger.info(
            "ledger state loaded: %d folded rows (through batch %d), %d changed rows since",
            len(base),
            folded,
            changes.num_rows,
        )

    def held_bytes(self) -> dict[str, int]:
        """The bytes each part of the in-memory state holds: the base's columns (its rows are in Delta),
        the overlay's rows and its index.

        Example:
            >>> sorted(LedgerLog("/nonexistent", "doc").held_bytes())
            ['base_columns', 'base_ledgers', 'overlay_index', 'overlay_rows']
        """
        with self._lock:
            return {
                "base_ledgers": len(self._base),
                "base_columns": self._base.nbytes,
                "overlay_rows": sum(rows.nbytes for _, rows in self._overlay),
                "overlay_index": sum(column.nbytes for column in self._latest.columns()),
            }

    # -- reads ----------------------------------------------------------------------------------------------
    def versions(self, ledger_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per ledger id: its current ``mzxid`` (-1 when unknown or null) and whether it is deleted."""
        ids = np.asarray(ledger_ids, dtype=np.int64)
        with self._lock:
            mzxid = np.full(len(ids), _NO_VERSION, np.int64)
            gone = np.zeros(len(ids), bool)
            base = self._base
            at, hit = base.positions(ids)
            mzxid[hit] = base.mzxid[at[hit]]
            gone[hit] = base.gone_at(at[hit])
            at, hit = _positions(self._latest.ids, ids)
            mzxid[hit] = self._latest.mzxid[at[hit]]
            gone[hit] = self._latest.gone[at[hit]]
        return mzxid, gone

    def rows(self, ledger_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
        """The current rows (as dicts) of the ledgers among ``ledger_ids`` that have one."""
        wanted = np.unique(np.fromiter(ledger_ids, np.int64))
        found = self.take(wanted)
        return {row["ledger_id"]: row for row in found.to_pylist()}

    def take(self, ledger_ids: np.ndarray, columns: Sequence[str] | None = None) -> pa.Table:
        """The current rows of the known ledgers among ``ledger_ids`` (distinct ids), with ``columns`` (all
        when None), in no particular order: looked up in bulk, no dict per row. Ledgers changed since the
        watermark come from memory, the others from the hot columns when ``columns`` are among
        :data:`~connectors.delta.ledger_columns.HOT_COLUMNS`, else from ``ledgers``' rows in their
        buckets."""
        ids = np.asarray(ledger_ids, dtype=np.int64)
        with self._lock:
            base, overlay, latest = self._base, dict(self._overlay), self._latest
            version, rebucket = self._read_version, self._rebucket
        names = list(columns) if columns is not None else LEDGERS.schema.names
        at, in_overlay = _positions(latest.ids, ids)
        parts = []
        batches, places = latest.batch[at[in_overlay]], latest.position[at[in_overlay]]
        for batch in np.unique(batches).tolist():
            chosen = pa.array(places[batches == batch], pa.int64())
            parts.append(overlay[batch].select(names).take(chosen))
        at, in_base = base.positions(ids[~in_overlay])
        stored = base.ids[at[in_base]]
        if set(names) <= set(HOT_COLUMNS):
            parts.append(base.rows(stored, names))
        elif len(stored):
            parts.append(self._stored_rows(stored, names, version, rebucket))
        return pa.concat_tables(parts) if parts else LEDGERS.schema.empty_table().select(names)

    def _ledgers_table(self, version: int | None) -> tuple[DeltaTable, BucketReader]:
        """``ledgers`` at ``version`` (None: the newest, brought up to date), kept open, and a reader of its
        buckets (its files listed under the lock that guards the handle's update)."""
        with self._table_lock:
            table = self._ledgers_tables.get(version)
            if table is None:
                path = table_path(self.root, "ledgers")
                table = DeltaTable(path) if version is None else DeltaTable(path, version=version)
                self._ledgers_tables[version] = table
            elif version is None:
                table.update_incremental()
            return table, BucketReader(table, "ledger_bucket")

    def _stored_rows(
        self, ledger_ids: np.ndarray, names: Sequence[str], version: int | None, rebucket: bool
    ) -> pa.Table:
        """The rows of ``ledger_ids`` in ``ledgers`` (at ``version``), read by bucket (the whole table while
        it is in another bucket count: until the first fold rewrites it)."""
        table, reader = self._ledgers_table(version)
        read = [name for name in dict.fromkeys(["ledger_id", *names]) if name != "ledger_bucket"]
        if rebucket:
            rows = scan(table, [], read)
        else:
            rows = reader.read(np.unique(ledger_ids % self.buckets).tolist(), read)
        rows = rows.filter(pa.array(np.isin(rows.column("ledger_id").to_numpy(), ledger_ids)))
        return with_buckets(conform_to(rows, LEDGERS.schema), self.buckets).select(list(names))

    def current_chunks(
        self, columns: Sequence[str] | None = None, *, chunk_buckets: int = CHUNK_BUCKETS
    ) -> Iterator[pa.Table]:
        """Every ledger's current row (one per ledger, each in one chunk), with ``columns`` (all when None),
        ``chunk_buckets`` buckets of ``ledgers`` at a time: a step that goes through every ledger holds that
        share of the rows, never the whole table (the whole table at once while it is in another bucket
        count, until the first fold rewrites it)."""
        with self._lock:
            overlay, latest = dict(self._overlay), self._latest
            version, rebucket = self._read_version, self._rebucket
        names = list(columns) if columns is not None else LEDGERS.schema.names
        changed = _latest_rows(overlay, latest) if latest.ids.size else None
        table, reader = self._ledgers_table(version)
        read = [name for name in dict.fromkeys(["ledger_id", *names]) if name != "ledger_bucket"]
        if rebucket:
            groups: list[list[int]] = [[]]
        else:
            present = np.union1d(reader.values(), np.unique(latest.ids % self.buckets)).astype(np.int64)
            present = present[present >= 0]
            groups = [present[i : i + chunk_buckets].tolist() for i in range(0, len(present), chunk_buckets)]
        for group in groups:
            stored = scan(table, [], read) if rebucket else reader.read(group, read)
            stored = stored.filter(pa.array(~np.isin(stored.column("ledger_id").to_numpy(), latest.ids)))
            stored = with_buckets(conform_to(stored, LEDGERS.schema), self.buckets).select(names)
            if changed is None:
                yield stored
                continue
            mine = changed if rebucket else in_buckets(changed, np.array(group), self.buckets)
            yield pa.concat_tables([stored, conform_to(mine.select(names), stored.schema)])

    def closed_after(self, cursor: int, limit: int) -> list[int]:
        """Up to ``limit`` ids above ``cursor`` of closed ledgers that are not deleted, ascending."""
        with self._lock:
            base, latest = self._base, self._latest
        return _ids_after(cursor, limit, base.ids, base.closed(), latest.ids, latest.closed)

    def closed_count(self) -> int:
        """How many live ledgers are closed now."""
        with self._lock:
            base, latest = self._base, self._latest
        return _count_of(base.ids, base.closed(), latest.ids, latest.closed)

    def checked_after(self, cursor: int, limit: int) -> list[int]:
        """Up to ``limit`` ids above ``cursor`` of live ledgers that are closed or open, ascending (the
        background replicas check walks them: an open one is checked up to its last add confirmed)."""
        with self._lock:
            base, latest = self._base, self._latest
        return _ids_after(cursor, limit, base.ids, base.checked(), latest.ids, latest.checked)

    def checked_count(self) -> int:
        """How many live ledgers are closed or open now (what the background replicas check walks)."""
        with self._lock:
            base, latest = self._base, self._latest
        return _count_of(base.ids, base.checked(), latest.ids, latest.checked)

    def current_index(self, indexed: pa.Table) -> pa.Table:
        """The ``ledger_bookies`` rows of ``indexed`` that belong to their ledger's current version (rows of
        older versions, deleted and undecodable ledgers dropped)."""
        if indexed.num_rows == 0:
            return indexed
        mzxid, gone = self.versions(indexed.column("ledger_id").to_numpy())
        return of_current_versions(indexed, mzxid, gone)

    def read_index(self, table: DeltaTable, bookies: Sequence[str], columns: Sequence[str]) -> pa.Table:
        """The current index rows on ``bookies`` (``columns`` of ``ledger_bookies``), whether or not the
        index's append has run since their ledgers changed: a ledger changed after the last batch ``table``
        holds the index rows of (its app transaction) is indexed by its current row, the others by
        ``table``'s rows of their current version.

        The changed ledgers are taken first: a fold that runs meanwhile only covers appended batches, so a
        ledger it takes out of memory already has its rows in the table read after. Only the changes past
        the index's append are made into rows here: after a snapshot, the overlay holds every ledger until
        the folds catch up, and indexing all of it took 1–3 s of a loss at 1 M ledgers."""
        with self._lock:
            overlay, latest = dict(self._overlay), self._latest
        appended = table.transaction_version(self.app_id)
        unindexed = latest.ids[latest.batch > (_NO_VERSION if appended is None else int(appended))]
        pending = index_rows_on(_latest_rows(overlay, latest, unindexed), bookies).select(list(columns))
        stored = scan_partitions(table, "bookie", bookies, columns)
        stored = stored.filter(pa.array(~np.isin(stored.column("ledger_id").to_numpy(), unindexed)))
        return pa.concat_tables([self.current_index(stored), conform_to(pending, stored.schema)])

    # -- writes ---------------------------------------------------------------------------------------------
    def record(
        self, writer: BatchWriter, rows: Sequence[Mapping[str, Any]], versions: pa.Table | None = None
    ) -> bool:
        """Append a batch's changed ledger rows (``rows`` as dicts, ``versions`` as ``ledgers`` columns, built
        column by column), then make them current in memory. Their index rows wait for
        :meth:`flush_index`. Returns whether the table was written (False: a replay found it)."""
        table = pa.Table.from_pylist(list(rows), schema=LEDGERS.schema)
        if versions is not None and versions.num_rows:
            table = pa.concat_tables([table, conform_to(versions, LEDGERS.schema)])
        table = with_buckets(table, self.buckets)
        batch = writer.batch_id
        changes = table.append_column(
            LEDGER_CHANGES.schema.field("batch_id"), pa.array(np.full(table.num_rows, batch, np.int64))
        )
        written = writer.append("ledger_changes", changes) if table.num_rows else False
        with self._lock:
            if table.num_rows:
                self._rows_recorded += table.num_rows
                self._overlay = [(b, t) for b, t in self._overlay if b != batch]
                self._overlay.append((batch, table))
                self._latest = self._latest.updated_with(batch, table)
                self._changes += 1
            self._recorded_through = max(self._recorded_through, batch)
        return written

    def flush_index(self, tables: OpenTables | None = None) -> int:
        """Append to ``ledger_bookies`` the rows of every ledger version recorded since the last append (in
        one commit, its app transaction the last batch recorded; a replay finds it there); returns the
        rows appended. Runs in the ledger lane's thread, the index's only writer.

        The versions to append are those whose ledger's version now differs from its version as of the
        last append (``ledger_changes`` holds every batch since, so a restart finds the same ones); a
        version replaced before the append is never written, and a deleted ledger gets no rows."""
        with self._lock:
            through, since = self._recorded_through, self._index_through
            if through <= since:
                return 0
            rows = self._versions_since(since)
        index_rows = index_rows_of_versions(rows)
        if index_rows.num_rows:
            self.write_check()
            BatchWriter(self.root, self.app_id, through, tables).append("ledger_bookies", index_rows)
        with self._lock:
            self._index_through = max(self._index_through, through)
        return index_rows.num_rows

    def _versions_since(self, since: int) -> pa.Table:
        """The current rows of the live ledgers whose version changed in the batches after ``since`` (a
        batch at or after the last fold; holding ``_lock``)."""
        newer = [rows for batch, rows in self._overlay if batch > since]
        if not newer:
            return LEDGERS.schema.empty_table()
        ids = np.unique(np.concatenate([rows.column("ledger_id").to_numpy() for rows in newer]))
        before = np.full(len(ids), _NO_VERSION, np.int64)
        at, hit = self._base.positions(ids)
        before[hit] = self._base.mzxid[at[hit]]
        then = _OverlayIndex.of([(batch, rows) for batch, rows in self._overlay if batch <= since], ids)
        at, hit = _positions(then.ids, ids)
        before[hit] = then.mzxid[at[hit]]
        at, _ = _positions(self._latest.ids, ids)  # every id is in the overlay
        changed = (self._latest.mzxid[at] != before) & ~self._latest.gone[at]
        overlay = dict(self._overlay)
        return _latest_rows(overlay, self._latest, ids[changed])

    def batch_started(self, batch_id: int) -> None:
        """Spark runs a micro-batch only after recording the previous one done: those may be folded."""
        with self._lock:
            self._foldable_through = max(self._foldable_through, batch_id - 1)

    # -- folding --------------------------------------------------------------------------------------------
    def fold(self, through: int | None = None, *, max_buckets: int | None = None) -> FoldReport | None:
        """Fold the changes of the batches up to ``through`` (default: the last one Spark recorded done)
        into ``ledgers``: up to ``max_buckets`` of the buckets holding changes not folded yet, oldest
        first (all when None: every batch through ``through`` is then folded), rewritten through
        ``through``: each bucket's rows read from the table and the changes since the watermark applied.
        The watermark (every bucket holds every batch through it; the app transaction ``(<app>.fold,
        watermark)``) advances past a batch only once the last bucket holding one of its changes is
        folded; the in-memory columns then take the changes through it. None when there is nothing to
        fold. A tick of at least ``fold_in_child_from_rows`` rows (its buckets' and the changes') runs in
        a process of its own (:mod:`._fold_process`)."""
        with self.fold_lock:
            started = time.monotonic()
            with self._lock:
                through = self._foldable_through if through is None else through
                through = min(through, self._index_through)  # a folded ledger's rows are in the index
                tables = [(b, rows) for b, rows in self._overlay if b <= through]
                folded_before, stored = self._folded_through, len(self._base)
                done, rebucket, version = self._bucket_folded.copy(), self._rebucket, self._read_version
            if not tables:
                return None
            whole = rebucket or version is not None  # another layout, or a replay's older version
            oldest = oldest_pending(tables, done, self.buckets)
            chosen, complete = plan_tick(oldest, through, None if whole else max_buckets)
            if whole:
                chosen = np.arange(self.buckets)
            reached = max(self._reached, through) if len(chosen) else self._reached
            every = whole or len(chosen) == self.buckets
            commit = FoldCommit(complete, reached, self.buckets, None if every else tuple(chosen.tolist()))
            rows, written = 0, False
            if len(chosen):
                self.write_check()
                changed = sum(t.num_rows for _, t in tables)  # spread over the buckets as the ledgers are
                if (stored + changed) * len(chosen) // self.buckets >= self.fold_in_child_from_rows:
                    rows, written = self._fold_in_child(folded_before, through, commit, version, rebucket)
                else:
                    rows, written = self._fold_here(tables, chosen, commit, version, rebucket)
            if version is not None and not written:
                complete = folded_before  # ``ledgers`` holds batches not replayed yet: rows stay read there
            self._after_tick(chosen, through, reached, complete, written)
            report = FoldReport(
                through, rows, round(time.monotonic() - started, 3), written, len(chosen), complete
            )
        logger.debug(
            "folded %d ledger rows of %d buckets through batch %d (watermark %d) in %.3f s",
            report.rows,
            report.buckets,
            through,
            complete,
            report.seconds,
        )
        return report

    def _fold_here(
        self,
        tables: Sequence[tuple[int, pa.Table]],
        chosen: np.ndarray,
        commit: FoldCommit,
        version: int | None,
        read_all: bool,
    ) -> tuple[int, bool]:
        """A tick in this process: the chosen buckets folded a few at a time while they are written, each
        group's rows read and its changes applied (only theirs copied)."""
        batch_type = LEDGER_CHANGES.schema.field("batch_id")

        def changes_of(group: np.ndarray) -> pa.Table:
            parts = []
            for batch, rows in tables:
                mine = in_buckets(rows, group, self.buckets)
                ids = pa.array(np.full(mine.num_rows, batch), pa.int64())
                parts.append(mine.append_column(batch_type, ids))
            return pa.concat_tables(parts)

        table = self._ledgers_table(version)[0]
        rows, merged = folded_groups(table, changes_of, chosen, self.buckets, read_all=read_all)
        written = write_fold(self.root, fold_app(self.app_id), rows, commit)
        return sum(merged), written

    def _after_tick(
        self, chosen: np.ndarray, through: int, reached: int, complete: int, written: bool
    ) -> None:
        """Record what a tick folded; when the watermark advances, the hot columns take the changes through
        it and those leave the overlay."""
        with self._lock:
            self._bucket_folded[chosen] = np.maximum(self._bucket_folded[chosen], through)
            if self._rebucket and len(chosen) == self.buckets:
                self._rebucket = False
            if written and len(chosen) == self.buckets:
                self._read_version = None  # the whole table rewritten: its newest version holds the state
            self._reached = max(self._reached, reached)
            advanced = complete > self._folded_through
            if advanced:
                folded = [(b, rows) for b, rows in self._overlay if b <= complete]
                latest = _latest_rows(dict(folded), _OverlayIndex.of(folded))
                self._base = self._base.merged(latest.select(list(HOT_COLUMNS)))
                self._overlay = [(b, rows) for b, rows in self._overlay if b > complete]
                self._latest = _OverlayIndex.of(self._overlay)
                self._folded_through = complete
        if advanced:
            self._vacuum_after_round()

    def _fold_in_child(
        self, folded_before: int, through: int, commit: FoldCommit, version: int | None, read_all: bool
    ) -> tuple[int, bool]:
        """The tick by a child process: it reads the chosen buckets of ``ledgers`` (at ``version``: None,
        the newest) and the changes from ``ledger_changes``, folds and commits."""
        request = FoldRequest(
            root=str(self.root),
            app=fold_app(self.app_id),
            folded=folded_before,
            through=through,
            buckets=self.buckets,
            complete=commit.complete,
            reached=commit.reached,
            chosen=None if commit.chosen is None else list(commit.chosen),
            base_version=version,
            whole=read_all,
        )
        return fold_in_child(request)

    def _keep_log(self, retention: str) -> None:
        """Have delta-rs drop the commit files of ``ledgers`` older than ``retention``, and those of
        ``ledger_bookies`` older than :data:`INDEX_LOG_RETENTION`, at its checkpoints (a fold tick, an index
        append or cleanup commits some kB of file actions every few seconds; kept 30 days by default, they
        would outgrow the tables)."""
        key = "delta.logRetentionDuration"
        for name, kept in (("ledgers", retention), ("ledger_bookies", INDEX_LOG_RETENTION)):
            try:
                table = DeltaTable(table_path(self.root, name))
                if table.metadata().configuration.get(key) != kept:
                    with self.fold_lock:
                        table.alter.set_table_properties({key: kept}, raise_if_not_exists=False)
            except Exception:  # an optimisation: the log is then kept as long as delta-rs's default
                logger.warning("setting the %s table's log retention failed", name, exc_info=True)

    def _vacuum_after_round(self) -> None:
        """Delete the ``ledgers`` files no version since the watermark's last ``vacuum_rounds`` advances
        references (a reader or a replay reads those versions; nothing older)."""
        if self.vacuum_rounds <= 0:
            return
        try:
            index_version = DeltaTable(table_path(self.root, "ledger_bookies")).version()
            with self._lock:
                versions = [*self._index_round_versions, index_version]
                self._index_round_versions = versions[-self.vacuum_rounds - 1 :]
            table = DeltaTable(table_path(self.root, "ledgers"))
            self._round_versions.append(table.version())
            if len(self._round_versions) <= self.vacuum_rounds:
                return
            del self._round_versions[: -self.vacuum_rounds - 1]
            kept = list(range(self._round_versions[0], table.version() + 1))
            table.vacuum(
                retention_hours=0, dry_run=False, enforce_retention_duration=False, keep_versions=kept
            )
        except Exception as err:  # an optimisation: the periodic maintenance vacuums too
            _fold_failed(err, "vacuuming ledgers after a fold round failed")

    def vacuum_index(self) -> int:
        """Delete the ``ledger_bookies`` files (appends the cleanup rewrote) that no version since the fold
        watermark's last ``vacuum_rounds`` advances references, once per advance; returns the files
        deleted. Runs in the ledger lane's thread, the index's only writer (a vacuum commits too)."""
        with self._lock:
            versions = self._index_round_versions
        if self.vacuum_rounds <= 0 or len(versions) <= self.vacuum_rounds or versions == self._index_vacuumed:
            return 0
        table = self._index_table()
        kept = list(range(versions[0], table.version() + 1))
        removed = table.vacuum(
            retention_hours=0, dry_run=False, enforce_retention_duration=False, keep_versions=kept
        )
        self._index_vacuumed = versions
        return len(removed)

    def start_folding(self, interval_s: float, *, ticks: int = 1, vacuum_rounds: int = 0) -> None:
        """Fold in a daemon thread (off the ledger lane's batches) until :meth:`stop_folding`: ``ticks``
        times per ``interval_s``, each tick rewriting at most ``ceil(buckets / ticks)`` of the buckets
        holding changes, oldest first, so every changed bucket is folded within about ``interval_s`` and
        the work is spread over it. Files the folds replaced are deleted once the watermark advanced
        ``vacuum_rounds`` times since (0: left to the periodic maintenance)."""
        if interval_s <= 0 or self._folder is not None:
            return
        self.fold_ticks, self.vacuum_rounds = max(1, ticks), max(0, vacuum_rounds)
        if self.vacuum_rounds:
            self._keep_log(LOG_RETENTION)
        self._stop_folding.clear()
        self._folder = threading.Thread(
            target=self._fold_loop,
            args=(interval_s,),
            name="bkaudit-ledger-fold",
            daemon=True,
        )
        self._folder.start()

    def _fold_loop(self, interval_s: float) -> None:
        ticks = self.fold_ticks
        period = interval_s / ticks
        per_tick = -(-self.buckets // ticks)
        limit, tick = per_tick, 0
        while not self._stop_folding.wait(period):
            tick += 1
            try:
                report = self.fold(max_buckets=limit)
            except Exception as err:  # the changes stay in ledger_changes; the next fold takes them
                _fold_failed(err, f"folding ledger changes into ledgers failed; retrying in {period:.1f} s")
            else:
                self.last_fold = report or self.last_fold
                limit = tick_limit(per_tick, 0.0 if report is None else report.seconds, period, self.buckets)
            if tick % ticks == 0:  # once per interval, as its inputs change at most that often
                self._run_after_fold()

    def _run_after_fold(self) -> None:
        if self.after_fold is None:
            return
        try:
            with self.fold_lock:
                self.write_check()  # it writes placement_plans: not once the hold on the checkpoint is gone
                self.after_fold()
        except Exception as err:  # its inputs are still there; the next fold runs it again
            _fold_failed(err, "the step after the ledger fold failed; it runs again after the next fold")

    def stop_folding(self, *, fold_all: bool = True) -> None:
        """Stop the fold thread; with ``fold_all``, fold every recorded batch now (the job is stopping)."""
        self._stop_folding.set()
        if self._folder is not None:
            self._folder.join()
            self._folder = None
        if fold_all and self._opened:
            self.flush_index()
            with self._lock:
                last = self._overlay[-1][0] if self._overlay else None
            if last is not None:
                self.last_fold = self.fold(through=last) or self.last_fold
            self._run_after_fold()

    def expire_changes(self, retention_hours: float) -> bool:
        """Delete the ``ledger_changes`` rows older than ``retention_hours`` (event time) of batches already
        folded: the table keeps the ledgers' recent history, not all of it. Runs in the ledger lane's thread
        (the table's only writer). Returns whether a delete was committed."""
        with self._lock:
            folded = self._folded_through
        if folded < 0 or retention_hours <= 0:
            return False
        cutoff = datetime.now(tz=UTC) - timedelta(hours=retention_hours)
        stamp = cutoff.strftime("%Y-%m-%d %H:%M:%S")
        table = DeltaTable(table_path(self.root, "ledger_changes"))
        table.delete(f"batch_id <= {folded} AND updated_at < '{stamp}'")
        return True

    # -- the index's old rows -------------------------------------------------------------------------------
    def clean_index(self, max_bookies: int, *, budget_s: float | None = None) -> int:
        """Rewrite up to ``max_bookies`` of the index's bookie partitions (in rotation) with only the rows of
        current versions, each as one file (the index's compaction), stopping after the first once
        ``budget_s`` seconds are spent; returns the rows removed. A partition cleaned since the last
        recorded row is skipped without a read (old rows and new files appear only when a new version is
        recorded), so an idle batch costs nothing. Runs in the ledger lane's thread: the index's only
        writer (a rewrite beside one of its appends would fail). A partition rewrite costs one read and
        one write of it, with no join."""
        if not self._opened or max_bookies <= 0:  # versions unknown: every row would look old
            return 0
        started = time.monotonic()
        recorded = self._rows_recorded
        if self._index_clean_through == recorded:
            return 0  # every partition is clean, and no row was recorded since
        table = self._index_table()
        bookies = sorted({p["bookie"] for p in table.partitions()})
        start = self._index_cursor % len(bookies) if bookies else 0
        rotation = bookies[start:] + bookies[:start]
        stale = [b for b in rotation if self._index_clean_at.get(b, -1) < recorded]
        if not stale:
            self._index_clean_through = recorded
            return 0
        removed = 0
        for bookie in stale[:max_bookies]:
            if budget_s is not None and bookie != stale[0] and time.monotonic() - started >= budget_s:
                break
            removed += self._clean_partition(table, bookie)
            self._index_clean_at[bookie] = recorded
            self._index_cursor = bookies.index(bookie) + 1
        return removed

    def _clean_partition(self, table: DeltaTable, bookie: str) -> int:
        """Rewrite ``bookie``'s partition with only its current rows, as one file, when it holds old rows
        or more than :data:`INDEX_PARTITION_FILES` files; returns the rows removed."""
        files = len(table.file_uris(file_pruning_predicate=[("bookie", "=", bookie)]))
        rows = scan_partitions(table, "bookie", [bookie])
        kept = self.current_index(rows)
        if kept.num_rows == rows.num_rows and files <= INDEX_PARTITION_FILES:
            return 0
        literal = bookie.replace("'", "''")
        kept = conform_to(kept, LEDGER_BOOKIES.schema)
        write_deltalake(table, kept, mode="overwrite", predicate=f"bookie = '{literal}'")
        table.update_incremental()
        return rows.num_rows - kept.num_rows

    def _index_table(self) -> DeltaTable:
        """``ledger_bookies``, kept open and brought up to date with the commits since (opening it afresh
        reads a log of thousands of files every batch)."""
        if self._index is None:
            self._index = DeltaTable(table_path(self.root, "ledger_bookies"))
        else:
            self._index.update_incremental()
        return self._index


def load_columns(table: DeltaTable, buckets: int) -> tuple[LedgerColumns, bool]:
    """The hot columns of ``table``'s rows (``ledgers``), read ``CHUNK_BUCKETS`` partitions at a time, and
    whether any row is in another bucket than ``ledger_id % buckets`` (a table of another bucket count).

    Example:
        >>> import tempfile
        >>> from connectors.delta.tables import ensure_tables
        >>> root = tempfile.mkdtemp(); _ = ensure_tables(root)
        >>> columns, other = load_columns(DeltaTable(root + "/ledgers"), 16)
        >>> len(columns), other
        (0, False)
    """
    reader = BucketReader(table, "ledger_bucket")
    values = reader.values()
    parts, other = [], False
    for start in range(0, len(values), CHUNK_BUCKETS):
        rows = reader.read(values[start : start + CHUNK_BUCKETS], [*HOT_COLUMNS, "ledger_bucket"])
        other = other or _other_buckets(rows, buckets)
        parts.append(LedgerColumns.of(rows))
    return LedgerColumns.concat(parts), other


def _other_buckets(rows: pa.Table, buckets: int) -> bool:
    """Whether any of ``rows`` is in another bucket than ``ledger_id % buckets`` (a table written with
    another bucket count).

    Example:
        >>> _other_buckets(pa.table({"ledger_id": [17], "ledger_bucket": pa.array([1], pa.int32())}), 16)
        False
    """
    if not rows.num_rows:
        return False
    bucket = pc.fill_null(rows.column("ledger_bucket"), -1).to_numpy()
    return bool(np.any(bucket != rows.column("ledger_id").to_numpy() % buckets))


def _positions(sorted_ids: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``ids`` sits in ``sorted_ids`` (distinct, ascending) and whether it is there."""
    if not len(sorted_ids) or not len(ids):
        return np.zeros(len(ids), np.int64), np.zeros(len(ids), bool)
    at = np.searchsorted(sorted_ids, ids).clip(max=len(sorted_ids) - 1)
    return at, sorted_ids[at] == ids


def _latest_rows(
    overlay: Mapping[int, pa.Table], latest: _OverlayIndex, ids: np.ndarray | None = None
) -> pa.Table:
    """The newest overlay row of each ledger in ``ids`` (all of the overlay's when None; each must be in
    it), one ``take`` per batch."""
    chosen = np.ones(len(latest.ids), bool) if ids is None else np.isin(latest.ids, ids)
    batches, places = latest.batch[chosen], latest.position[chosen]
    parts = [
        overlay[batch].take(pa.array(places[batches == batch], pa.int64()))
        for batch in np.unique(batches).tolist()
    ]
    return pa.concat_tables(parts) if parts else LEDGERS.schema.empty_table()


def _checked_mask(rows: pa.Table) -> np.ndarray:
    """Which rows are of a ledger the replicas check judges: CLOSED, or OPEN (up to its LAC)."""
    state = rows.column("state")
    checked = pc.or_(pc.equal(state, "CLOSED"), pc.equal(state, "OPEN"))
    return pc.fill_null(checked, False).to_numpy(zero_copy_only=False)


def _ids_after(
    cursor: int,
    limit: int,
    ids: np.ndarray,
    mask: np.ndarray,
    latest_ids: np.ndarray,
    latest_mask: np.ndarray,
) -> list[int]:
    """Up to ``limit`` ids above ``cursor`` of the base's ``mask`` rows and the overlay's ``latest_mask`` rows
    (an overlay row replaces its ledger's base row), ascending.

    Example:
        >>> ids, latest = np.array([1, 2, 3]), np.array([2, 4])
        >>> _ids_after(0, 10, ids, np.array([True, True, False]), latest, np.array([False, True]))
        [1, 4]
    """
    start = int(np.searchsorted(ids, cursor, side="right"))
    picked = ids[start:][mask[start:]]
    changed = latest_ids[latest_ids > cursor]
    picked = picked[~np.isin(picked, changed)][: limit + len(changed)]
    extra = latest_ids[(latest_ids > cursor) & latest_mask]
    return np.union1d(picked, extra)[:limit].tolist()


def _count_of(ids: np.ndarray, mask: np.ndarray, latest_ids: np.ndarray, latest_mask: np.ndarray) -> int:
    """How many ledgers are ``mask`` in the base and not changed since, or ``latest_mask`` in the overlay.

    Example:
        >>> _count_of(np.array([1, 2]), np.array([True, True]), np.array([2]), np.array([False]))
        1
    """
    changed = np.isin(ids, latest_ids)
    return int(np.count_nonzero(mask & ~changed)) + int(np.count_nonzero(latest_mask))


@dataclass(frozen=True)
class _OverlayIndex:
    """For every ledger in the overlay, sorted by id: the batch and row of its newest change, and that
    row's version, deleted flag and whether it is a live closed ledger (numpy columns, looked up in bulk)."""

    ids: np.ndarray
    batch: np.ndarray
    position: np.ndarray
    mzxid: np.ndarray
    gone: np.ndarray
    closed: np.ndarray
    checked: np.ndarray  # live and CLOSED or OPEN: what the replicas check walks

    @classmethod
    def empty(cls) -> _OverlayIndex:
        return cls(*(np.empty(0, t) for t in (np.int64, np.int64, np.int64, np.int64, bool, bool, bool)))

    @classmethod
    def of(cls, overlay: Sequence[tuple[int, pa.Table]], ids: np.ndarray | None = None) -> _OverlayIndex:
        """The index of ``overlay`` (batches oldest first), of the ledgers in ``ids`` only when given: one
        sort of all the rows, not one per batch (an overlay holding a snapshot's million rows in ~80
        batches took 1 s the other way).

        Example:
            >>> rows = lambda ids, v: pa.table({"ledger_id": ids, "mzxid": [v] * len(ids),
            ...     "deleted": [False] * len(ids), "state": ["CLOSED"] * len(ids)})
            >>> index = _OverlayIndex.of([(0, rows([3, 1], 10)), (1, rows([3], 11))])
            >>> index.ids.tolist(), index.mzxid.tolist(), index.batch.tolist()
            ([1, 3], [10, 11], [0, 1])
        """
        if not overlay:
            return cls.empty()
        parts = [_index_columns(batch, rows) for batch, rows in overlay]
        columns = [np.concatenate(column) for column in zip(*parts, strict=True)]
        if ids is not None:
            wanted = np.isin(columns[0], ids)  # once, over all the rows
            columns = [column[wanted] for column in columns]
        return cls._newest_of(columns)

    def updated_with(self, batch: int, rows: pa.Table) -> _OverlayIndex:
        """This index with ``rows`` (batch ``batch``, newer than every row indexed) taking precedence: the
        batch's newest row per ledger merged into the sorted columns (a copy of them, not a sort of all:
        7.4 against 10.3 ms for 10 k rows into 700 k ledgers).

        Example:
            >>> rows = lambda ids, v: pa.table({"ledger_id": ids, "mzxid": [v] * len(ids),
            ...     "deleted": [False] * len(ids), "state": ["OPEN"] * len(ids)})
            >>> index = _OverlayIndex.of([(0, rows([1, 5], 10))]).updated_with(1, rows([5, 3, 5], 11))
            >>> index.ids.tolist(), index.batch.tolist(), index.position.tolist()
            ([1, 3, 5], [0, 1, 1], [0, 1, 2])
        """
        new = self._newest_of(_index_columns(batch, rows))
        at = np.searchsorted(self.ids, new.ids)
        known = at < len(self.ids)
        known[known] = self.ids[at[known]] == new.ids[known]
        merged = []
        for column, newer in zip(self.columns(), new.columns(), strict=True):
            replaced = column.copy()
            replaced[at[known]] = newer[known]
            merged.append(np.insert(replaced, at[~known], newer[~known]))
        return _OverlayIndex(*merged)

    def columns(self) -> tuple[np.ndarray, ...]:
        """The index's columns, in the fields' order."""
        return (self.ids, self.batch, self.position, self.mzxid, self.gone, self.closed, self.checked)

    @classmethod
    def _newest_of(cls, columns: list[np.ndarray]) -> _OverlayIndex:
        """The index of ``columns`` (oldest row first): per id, its last row, sorted by id."""
        ids = columns[0]
        order = np.lexsort((np.arange(len(ids)), ids))  # by id, then arrival: the last of each id wins
        last = order[np.r_[ids[order][1:] != ids[order][:-1], True]] if len(ids) else order
        return cls(*(column[last] for column in columns))


def _index_columns(batch: int, rows: pa.Table) -> list[np.ndarray]:
    """``rows`` (of batch ``batch``) as :class:`_OverlayIndex` columns, in the rows' order."""
    n = rows.num_rows
    gone = pc.fill_null(rows.column("deleted"), False).to_numpy(zero_copy_only=False)
    closed = pc.fill_null(pc.equal(rows.column("state"), "CLOSED"), False).to_numpy(zero_copy_only=False)
    return [
        rows.column("ledger_id").to_numpy(),
        np.full(n, batch, np.int64),
        np.arange(n, dtype=np.int64),
        pc.fill_null(rows.column("mzxid"), _NO_VERSION).to_numpy(),
        gone,
        closed & ~gone,
        _checked_mask(rows) & ~gone,
    ]


def _fold_failed(err: Exception, what: str) -> None:
    """Log a failed fold step: one line when the object store did not answer (an outage, not a bug: the
    job's own line follows if it lasts), else with the traceback."""
    down = storage.unreachable(err)
    if down is not None:
        logger.warning("%s: %s", what, down.detail)
    elif isinstance(err, BkauditError):  # a lost lease, say: the job's own line says what to do
        logger.warning("%s: %s", what, err)
    else:
        logger.warning("%s", what, exc_info=True)
