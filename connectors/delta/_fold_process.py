"""A fold of ``ledger_changes`` into ``ledgers``, computed and written by a process of its own.

At 1 M ledgers a fold rewrites the whole table. Run in the job's process it took 6–12 s of the job's CPU
every fold interval at 10,000 changes/s, and delta-rs's write held the job's other Delta calls up meanwhile
(the sink's reads stalled 1.5–4.4 s): the lag's tail was the fold's (docs/journal.md, "The fold in a
process of its own"). Here the child reads what it needs from Delta itself (the folded state, the changes
after it), folds, commits, and leaves the new folded state as an Arrow file that the job memory-maps: the
job spends no CPU on a fold, and the child runs at a lower priority and dies with the job.

The fold is the same function wherever it runs (:func:`connectors.delta.tables.fold_rows`);
:class:`~connectors.delta.ledger_log.LedgerLog` folds small states in its own thread, where a process would
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
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

_PR_SET_PDEATHSIG = 1
#: The folds' scratch folder under the lakehouse root (not a table; no Delta reader lists it).
FOLD_SCRATCH = "_fold"
#: How much nicer than the job the fold runs: the job's lanes and sink come first on a busy machine.
NICENESS = 10


@dataclass(frozen=True)
class FoldRequest:
    """What the child folds: the state as of ``folded`` (the ``ledgers`` table at ``base_version``, or
    the Arrow file ``base_file`` a previous fold left) and the changes of batches ``folded`` < b <=
    ``through``; the new state goes to ``out_file``."""

    root: str
    app: str
    folded: int
    through: int
    out_file: str
    base_file: str | None = None
    base_version: int | None = None


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


def write_fold(root: str | Path, app: str, folded: pa.Table, latest: pa.Table, through: int) -> bool:
    """Commit the folded state as the new version of ``ledgers``: the partitions ``latest`` falls in,
    overwritten with their folded rows, with the app transaction ``(app, through)``. False when ``ledgers``
    already holds that fold (a replay after a crash). The base is the table as of its last fold, so this
    equals merging the changes without reading and joining the table (0.4 s against 2.0 s for 300 k changes
    into 1 M rows); a MERGE would rewrite the same files."""
    from deltalake import (
        ColumnProperties,
        CommitProperties,
        DeltaTable,
        Transaction,
        WriterProperties,
        write_deltalake,
    )

    from connectors.delta.tables import APP_METADATA_KEY, FOLD_METADATA_KEY, LEDGER_BUCKETS, table_path

    ledgers = DeltaTable(table_path(root, "ledgers"))
    done = ledgers.transaction_version(app)
    if done is not None and done >= through:
        return False
    changed_buckets = latest.column("ledger_bucket")
    buckets = pc.unique(changed_buckets).drop_null().to_pylist()
    predicate = None
    if changed_buckets.null_count == 0 and len(buckets) < LEDGER_BUCKETS:
        folded = folded.filter(pc.is_in(folded.column("ledger_bucket"), pa.array(buckets, pa.int32())))
        predicate = f"ledger_bucket IN ({', '.join(str(b) for b in sorted(buckets))})"
    commit = CommitProperties(
        custom_metadata={FOLD_METADATA_KEY: str(through), APP_METADATA_KEY: app},
        app_transactions=[Transaction(app, through)],
    )
    plain = ColumnProperties(dictionary_enabled=False)
    properties = WriterProperties(
        compression="SNAPPY",  # delta-rs's default, which a WriterProperties without it would drop
        column_properties={name: plain for name in PLAIN_COLUMNS if name in folded.column_names},
    )
    write_deltalake(
        ledgers,
        folded.to_reader(max_chunksize=WRITE_BATCH_ROWS),
        mode="overwrite",
        predicate=predicate,
        commit_properties=commit,
        writer_properties=properties,
    )
    return True


def fold_in_child(request: FoldRequest) -> tuple[int, bool]:
    """Run the fold ``request`` describes in a child process and wait for it; returns the ledger rows it
    merged and whether it committed (False: ``ledgers`` already held it). Raises ``RuntimeError`` with the
    child's last words when it fails."""
    request_file = Path(request.out_file).with_suffix(".request.json")
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


def write_arrow_file(path: str | Path, table: pa.Table) -> None:
    """Write ``table`` to the Arrow file ``path`` (uncompressed: it is mapped back without a copy)."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def read_arrow_file(path: str | Path) -> pa.Table:
    """The table in the Arrow file ``path``, memory-mapped (no copy: pages load as they are read)."""
    return pa.ipc.open_file(pa.memory_map(str(path))).read_all()


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


def _run(request: FoldRequest) -> dict[str, object]:
    from deltalake import DeltaTable

    from connectors.delta.scan import scan
    from connectors.delta.tables import LEDGERS, conform_to, fold_rows, table_path

    ledgers_path = table_path(request.root, "ledgers")
    if request.base_file is not None:
        base = read_arrow_file(request.base_file)
    else:
        base = conform_to(
            DeltaTable(ledgers_path, version=request.base_version).to_pyarrow_table(), LEDGERS.schema
        )
    where = [("batch_id", ">", request.folded), ("batch_id", "<=", request.through)]
    changes = scan(DeltaTable(table_path(request.root, "ledger_changes")), where)
    folded, latest = fold_rows(base, [changes], order_by="batch_id")
    write_arrow_file(request.out_file, folded)
    merged = write_fold(request.root, request.app, folded, latest, request.through)
    return {"rows": latest.num_rows, "merged": merged}


def main(argv: list[str]) -> None:
    _die_with_parent(int(argv[1]))
    os.nice(NICENESS)
    request = FoldRequest(**json.loads(Path(argv[0]).read_text()))
    print(json.dumps(_run(request)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
