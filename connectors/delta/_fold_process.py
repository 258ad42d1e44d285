"""A fold of ``ledger_changes`` into ``ledgers``, computed and written by a process of its own.

A fold that rewrote the whole 1 M-row table in the job's process took 6–12 s of the job's CPU every fold
interval at 10,000 changes/s, and delta-rs's write held the job's other Delta calls up meanwhile (the
sink's reads stalled 1.5–4.4 s): the lag's tail was the fold's (docs/journal.md, "The fold in a process of
its own"). A large tick runs here instead: the child reads what it needs from Delta itself (the rows of
the buckets it rewrites, the changes since the watermark), folds, and commits; it runs at a lower priority
and dies with the job.

A fold is a tick of the rotation (:func:`fold_tick`): it rewrites a few buckets of ``ledgers`` from their
rows in the table and the changes since the watermark (a bucket folded ahead of the watermark holds some
of them already; applying them again gives the same rows). It is the same function wherever it runs;
:class:`~connectors.delta.ledger_log.LedgerLog` folds small ticks in its own thread, where a process would
cost more than the fold.

Usage (by :func:`fold_in_child`): ``python -m connectors.delta._fold_process REQUEST.json JOB_PID``.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

_PR_SET_PDEATHSIG = 1
#: The folds' scratch folder under the lakehouse root (not a table; no Delta reader lists it).
FOLD_SCRATCH = "_fold"
#: How much nicer than the job the fold runs: the job's lanes and sink come first on a busy machine.
NICENESS = 10


@dataclass(frozen=True)
class FoldRequest:
    """What the child folds: the rows of the ``chosen`` buckets (None: all) of ``buckets`` in ``ledgers``
    at ``base_version`` (None: the newest; with ``whole``, every row of it at once, as after a change of
    the bucket count) and the changes of batches ``folded`` < b <= ``through``; the commit records
    ``complete`` and ``reached`` (:class:`FoldCommit`)."""

    root: str
    app: str
    folded: int
    through: int
    buckets: int
    complete: int
    reached: int
    chosen: list[int] | None = None
    base_version: int | None = None
    whole: bool = False


#: Rows per Arrow batch handed to delta-rs: given the whole table at once it converts all of it first
#: (a second copy of 1 M rows, ~1.2 GB of freshly touched pages); batch by batch it reuses its memory.
WRITE_BATCH_ROWS = 65_536
#: Columns whose values are nearly all distinct: a dictionary page is built for them only to be dropped.
#: Writing them plainly took a quarter off the write's CPU, and the files came out no larger.
PLAIN_COLUMNS = (
    "ledger_id",
    "last_entry_id",
    "length",
    "ctime_ms",
    "mzxid",
    "znode_ctime_ms",
    "znode_mtime_ms",
    "under_replication_ctime_ms",
    "updated_at",
)


def with_buckets(rows: pa.Table, buckets: int) -> pa.Table:
    """``rows`` with ``ledger_bucket`` set to ``ledger_id % buckets`` (the partition a row belongs in).

    Example:
        >>> rows = pa.table({"ledger_id": [5, 18], "ledger_bucket": pa.array([5, 2], pa.int32())})
        >>> with_buckets(rows, 16).column("ledger_bucket").to_pylist()
        [5, 2]
    """
    at = rows.schema.get_field_index("ledger_bucket")
    ids = rows.column("ledger_id").to_numpy() if rows.num_rows else np.empty(0, np.int64)
    bucket = pa.array((ids % buckets).astype(np.int32), pa.int32())
    return rows.set_column(at, rows.schema.field(at), bucket)


def in_buckets(rows: pa.Table, chosen: np.ndarray, buckets: int) -> pa.Table:
    """The rows of ``rows`` whose ledger falls in one of the ``chosen`` buckets (of ``buckets``).

    Example:
        >>> in_buckets(pa.table({"ledger_id": [1, 2, 5]}), np.array([1]), 4).column("ledger_id").to_pylist()
        [1, 5]
    """
    if not rows.num_rows:
        return rows
    ids = rows.column("ledger_id").to_numpy()
    return rows.filter(pa.array(np.isin(ids % buckets, chosen)))


@dataclass(frozen=True)
class FoldTick:
    """What one fold tick writes: the folded rows of the ``chosen`` buckets (through the tick's last
    batch), and how many ledger rows the changes merged."""

    slice_rows: pa.Table
    merged_rows: int


def fold_tick(base: pa.Table, changes: pa.Table, *, chosen: np.ndarray, buckets: int) -> FoldTick:
    """One tick of the rotation: the rows of ``base`` (``ledgers``' rows of the ``chosen`` buckets at
    least, each folded through the watermark or later) and ``changes`` (with ``batch_id``, every batch
    after the watermark up to the tick's last) folded for the ``chosen`` buckets only. Folding a bucket
    again with changes it already holds gives the same rows (the newest change per ledger wins), so a
    bucket folded ahead of the watermark is read as it is.

    Example:
        >>> from connectors.delta.tables import LEDGERS
        >>> base = LEDGERS.schema.empty_table()
        >>> changes = pa.Table.from_pylist([{"ledger_id": i, "mzxid": 1} for i in (1, 2, 3)],
        ...     schema=LEDGERS.schema).append_column("batch_id", pa.array([0, 0, 1], pa.int64()))
        >>> tick = fold_tick(base, changes, chosen=np.array([1]), buckets=2)
        >>> tick.slice_rows.column("ledger_id").to_pylist(), tick.merged_rows
        ([1, 3], 2)
    """
    from connectors.delta.tables import fold_rows

    mine = in_buckets(changes, chosen, buckets)
    slice_rows, latest = fold_rows(in_buckets(base, chosen, buckets), [mine], order_by="batch_id")
    return FoldTick(with_buckets(slice_rows, buckets), latest.num_rows)


#: Buckets folded at once within a tick: a tick's memory is their rows, however many buckets it rewrites.
GROUP_BUCKETS = 8


def folded_groups(
    table: Any,
    changes_of: Callable[[np.ndarray], pa.Table],
    chosen: np.ndarray,
    buckets: int,
    *,
    read_all: bool = False,
) -> tuple[pa.RecordBatchReader, list[int]]:
    """The folded rows of the ``chosen`` buckets of ``table`` (``ledgers``) as a reader that folds
    ``GROUP_BUCKETS`` buckets at a time when read (their rows read by partition, ``changes_of(group)`` their
    changes with ``batch_id``), and a list that gets each group's merged rows as it is folded. With
    ``read_all``, every row of the table at once (a table of another bucket count).

    Example:
        >>> import tempfile
        >>> from deltalake import DeltaTable
        >>> from connectors.delta.tables import LEDGERS, ensure_tables
        >>> root = tempfile.mkdtemp(); _ = ensure_tables(root)
        >>> changes = pa.Table.from_pylist([{"ledger_id": i, "mzxid": 1} for i in (1, 2, 3)],
        ...     schema=LEDGERS.schema).append_column("batch_id", pa.array([0, 0, 1], pa.int64()))
        >>> reader, merged = folded_groups(DeltaTable(root + "/ledgers"), lambda g: changes, np.arange(2), 2)
        >>> sorted(reader.read_all().column("ledger_id").to_pylist()), merged
        ([1, 2, 3], [3])
    """
    from connectors.delta.scan import BucketReader
    from connectors.delta.tables import LEDGERS, conform_to

    merged: list[int] = []
    if read_all:  # every row at once, read through delta-rs: folded before the write starts
        tick = fold_tick(read_fold_base(table, None), changes_of(chosen), chosen=chosen, buckets=buckets)
        merged.append(tick.merged_rows)
        return tick.slice_rows.to_reader(max_chunksize=WRITE_BATCH_ROWS), merged
    # The files are listed now: delta-rs cannot be called back from inside its own write, where the
    # groups are read.
    reader = BucketReader(table, "ledger_bucket")
    names = [name for name in LEDGERS.schema.names if name != "ledger_bucket"]
    groups = [chosen[i : i + GROUP_BUCKETS] for i in range(0, len(chosen), GROUP_BUCKETS)]

    def batches() -> Iterator[pa.RecordBatch]:
        for group in groups:
            base = conform_to(reader.read(group.tolist(), names), LEDGERS.schema)
            tick = fold_tick(base, changes_of(group), chosen=group, buckets=buckets)
            merged.append(tick.merged_rows)
            yield from tick.slice_rows.to_batches(max_chunksize=WRITE_BATCH_ROWS)

    if not reader.local:  # its reads go through delta-rs too: all groups folded before the write
        return pa.RecordBatchReader.from_batches(LEDGERS.schema, iter(list(batches()))), merged
    return pa.RecordBatchReader.from_batches(LEDGERS.schema, batches()), merged


def read_fold_base(table: Any, chosen: np.ndarray | None) -> pa.Table:
    """The rows a tick folds into: those of the ``chosen`` buckets of ``table`` (``ledgers``), read by
    partition (None: every row, whatever its partition: a table of another bucket count).

    Example:
        >>> import tempfile
        >>> from deltalake import DeltaTable
        >>> from connectors.delta.tables import ensure_tables
        >>> root = tempfile.mkdtemp(); _ = ensure_tables(root)
        >>> read_fold_base(DeltaTable(root + "/ledgers"), np.array([3])).num_rows
        0
    """
    from connectors.delta.scan import BucketReader, scan
    from connectors.delta.tables import LEDGERS, conform_to

    names = [name for name in LEDGERS.schema.names if name != "ledger_bucket"]
    if chosen is None:
        rows = scan(table, [], names)
    else:
        rows = BucketReader(table, "ledger_bucket").read(chosen.tolist(), names)
    return conform_to(rows, LEDGERS.schema)


@dataclass(frozen=True)
class FoldCommit:
    """What a fold commit records: the batches every bucket holds (``complete``, the app transaction; -1:
    not all of batch 0 yet), the newest batch any bucket holds (``reached``), the bucket count, and the
    buckets overwritten (None: the whole table, as after a change of the bucket count)."""

    complete: int
    reached: int
    buckets: int
    chosen: tuple[int, ...] | None


def write_fold(root: str | Path, app: str, rows: pa.Table | pa.RecordBatchReader, commit: FoldCommit) -> bool:
    """Commit ``rows`` (the folded rows of the ``commit.chosen`` buckets, or of every ledger; a table, or a
    reader that folds them a few buckets at a time while delta-rs writes) as the new
    version of ``ledgers``: those partitions overwritten, with the app transaction ``(app,
    commit.complete)``. False when ``ledgers`` already holds every batch through ``commit.reached`` (a
    replay after a crash). The rows come from the table as of a fold plus the changes since, so this equals
    merging the changes without reading and joining the table (0.4 s against 2.0 s for 300 k changes into
    1 M rows); a MERGE would rewrite the same files."""
    from deltalake import (
        ColumnProperties,
        CommitProperties,
        DeltaTable,
        Transaction,
        WriterProperties,
        write_deltalake,
    )

    from connectors.delta.tables import (
        APP_METADATA_KEY,
        FOLD_BUCKETS_KEY,
        FOLD_METADATA_KEY,
        FOLD_REACHED_KEY,
        table_path,
    )

    ledgers = DeltaTable(table_path(root, "ledgers"))
    done = ledgers.transaction_version(app)
    if done is not None and done >= commit.reached:
        return False
    predicate = None
    if commit.chosen is not None:
        predicate = f"ledger_bucket IN ({', '.join(str(b) for b in sorted(commit.chosen))})"
    metadata = {
        FOLD_METADATA_KEY: str(commit.complete),
        FOLD_REACHED_KEY: str(commit.reached),
        FOLD_BUCKETS_KEY: str(commit.buckets),
        APP_METADATA_KEY: app,
    }
    transactions = [Transaction(app, commit.complete)] if commit.complete >= 0 else None
    plain = ColumnProperties(dictionary_enabled=False)
    properties = WriterProperties(
        compression="SNAPPY",  # delta-rs's default, which a WriterProperties without it would drop
        column_properties={name: plain for name in PLAIN_COLUMNS if name in rows.schema.names},
    )
    write_deltalake(
        ledgers,
        rows.to_reader(max_chunksize=WRITE_BATCH_ROWS) if isinstance(rows, pa.Table) else rows,
        mode="overwrite",
        predicate=predicate,
        commit_properties=CommitProperties(custom_metadata=metadata, app_transactions=transactions),
        writer_properties=properties,
    )
    return True


def fold_in_child(request: FoldRequest) -> tuple[int, bool]:
    """Run the fold ``request`` describes in a child process and wait for it; returns the ledger rows it
    merged and whether it committed (False: ``ledgers`` already held it). Raises ``RuntimeError`` with the
    child's last words when it fails."""
    from connectors import storage

    scratch = storage.local_scratch(request.root, FOLD_SCRATCH)  # on this host's disk, also for a remote root
    request_file = scratch / f"{request.app}-{request.through}.request.json"
    request_file.write_text(json.dumps(asdict(request)))
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, str(request_file), str(os.getpid())],
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        request_file.unlink(missing_ok=True)
    if done.returncode != 0:
        last_words = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        raise RuntimeError(
            f"the fold through batch {request.through} failed (exit {done.returncode}): {last_words}"
        )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return int(report["rows"]), bool(report["merged"])


def _die_with_parent(job_pid: int) -> None:
    """Ask Linux to SIGKILL this process when the job ``job_pid`` that started it dies: a fold must not
    commit after its job was killed (the restarted job folds again from its own state and would conflict
    with this one's commit). The job's pid comes from the job: a parent read here, after the imports, may
    already be the one an orphan was handed to."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the job waits for the child anyway
        return
    if os.getppid() != job_pid:  # the job died before the request took effect
        os._exit(1)


def changes_in_buckets(
    table: Any, folded: int, through: int, chosen: np.ndarray | None, buckets: int
) -> pa.Table:
    """The rows of ``table`` (``ledger_changes``) of batches ``folded`` < b <= ``through`` whose ledger
    falls in one of the ``chosen`` buckets (all when None), kept batch by batch as they are read: a tick
    holds its own buckets' changes, not every change since the watermark (at a snapshot's first folds,
    every ledger).

    Example:
        >>> import tempfile
        >>> from deltalake import DeltaTable, write_deltalake
        >>> path = tempfile.mkdtemp()
        >>> write_deltalake(path, pa.table({"ledger_id": [1, 2, 3, 4], "batch_id": [0, 1, 1, 2]}))
        >>> changes_in_buckets(DeltaTable(path), 0, 2, np.array([0]), 2).column("ledger_id").to_pylist()
        [2, 4]
    """
    from connectors.delta.scan import filter_expression

    dataset = table.to_pyarrow_dataset()
    where = filter_expression([("batch_id", ">", folded), ("batch_id", "<=", through)], dataset.schema)
    kept = []
    # One file and one batch decoded ahead: the read's memory is the kept rows plus about a file's.
    batches = dataset.to_batches(
        filter=where, batch_size=WRITE_BATCH_ROWS, batch_readahead=1, fragment_readahead=1
    )
    for batch in batches:
        rows = pa.Table.from_batches([batch])
        kept.append(rows if chosen is None else in_buckets(rows, chosen, buckets))
    return pa.concat_tables(kept) if kept else dataset.schema.empty_table()


def _run(request: FoldRequest) -> dict[str, object]:
    from deltalake import DeltaTable

    from connectors.delta.tables import table_path

    ledgers_path = table_path(request.root, "ledgers")
    ledgers = DeltaTable(ledgers_path, version=request.base_version)
    buckets = np.arange(request.buckets) if request.chosen is None else np.array(request.chosen, np.int64)
    changes = changes_in_buckets(
        DeltaTable(table_path(request.root, "ledger_changes")),
        request.folded,
        request.through,
        None if request.chosen is None else buckets,
        request.buckets,
    )
    pa.default_memory_pool().release_unused()  # the read's decoding buffers, before the fold and its write
    rows, merged_rows = folded_groups(
        ledgers,
        lambda group: in_buckets(changes, group, request.buckets),
        buckets,
        request.buckets,
        read_all=request.whole,
    )
    chosen = None if request.chosen is None else tuple(request.chosen)
    commit = FoldCommit(request.complete, request.reached, request.buckets, chosen)
    merged = write_fold(request.root, request.app, rows, commit)
    return {"rows": sum(merged_rows), "merged": merged}


def main(argv: list[str]) -> None:
    _die_with_parent(int(argv[1]))
    os.nice(NICENESS)
    request = FoldRequest(**json.loads(Path(argv[0]).read_text()))
    print(json.dumps(_run(request)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
