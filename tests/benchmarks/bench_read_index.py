"""Benchmark: a lost bookie's index read while the ledger state's overlay still holds a whole snapshot.

Right after the job ingests a snapshot, every ledger is in the ledger log's overlay until the folds catch
up (minutes at 1 M ledgers), though the index's append already wrote their ``ledger_bookies`` rows. A loss
then reads the lost bookie's ledgers through :meth:`~connectors.delta.ledger_log.LedgerLog.read_index`.
This builds that state (``--ledgers`` synthetic rows recorded in batches of ``--batch`` as the sink records
them, the index appended after each, nothing folded) and times, alternately, ``--rounds`` reads of one
bookie's partition:

- ``all_overlay``: every overlay ledger made into index rows from its current row (the read before
  ``read_index`` took only the changes past the index's append);
- ``past_append``: ``read_index`` as it is;
- ``*_one_batch``: the same two with one more batch recorded and not appended (its ledgers from memory).

Ends with one JSON line of the seconds (median, min) and the load average.

Run: ``python tests/benchmarks/bench_read_index.py --ledgers 1000000``.

Example:
    >>> median_min([3.0, 1.0, 2.0])
    {'median_s': 2.0, 'min_s': 1.0}
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def median_min(seconds: list[float]) -> dict[str, float]:
    return {"median_s": round(statistics.median(seconds), 4), "min_s": round(min(seconds), 4)}


def _all_overlay(log: Any, table: Any, bookies: list[str], columns: list[str]) -> Any:
    """The read as it was: every overlay ledger indexed by its current row."""
    import pyarrow as pa

    from connectors.delta.ledger_log import _latest_rows
    from connectors.delta.scan import scan_partitions
    from connectors.delta.tables import conform_to, index_rows_on

    with log._lock:
        overlay, latest = dict(log._overlay), log._latest
    pending = index_rows_on(_latest_rows(overlay, latest), bookies).select(columns)
    stored = scan_partitions(table, "bookie", bookies, columns)
    stored = stored.filter(pa.array(~np.isin(stored.column("ledger_id").to_numpy(), latest.ids)))
    return pa.concat_tables([log.current_index(stored), conform_to(pending, stored.schema)])


def _record(log: Any, root: Path, batch_id: int, rows: Any, *, append: bool) -> None:
    import pyarrow as pa

    from connectors.delta.tables import BatchWriter

    log.open(batch_id)
    log.batch_started(batch_id)
    log.record(
        BatchWriter(root, "bench", batch_id),
        [],
        rows.set_column(
            rows.schema.get_field_index("mzxid"),
            "mzxid",
            pa.array(np.full(rows.num_rows, batch_id + 1, np.int64)),
        ),
    )
    if append:
        log.flush_index()


def run(args: argparse.Namespace) -> dict[str, Any]:
    from deltalake import DeltaTable

    from connectors.delta.ledger_log import LedgerLog
    from connectors.delta.tables import ensure_tables, table_path
    from tests.benchmarks.bench_ledger_buckets import synthetic_ledgers

    root = Path(tempfile.mkdtemp(prefix="bkaudit-bench-read-index-"))
    try:
        ensure_tables(root)
        log = LedgerLog(root, "bench")
        ledgers = synthetic_ledgers(args.ledgers)
        batches = list(range(0, args.ledgers, args.batch))
        started = time.monotonic()
        for batch_id, first in enumerate(batches[:-1]):
            _record(log, root, batch_id, ledgers.slice(first, args.batch), append=True)
        last = len(batches) - 1
        build_s = time.monotonic() - started
        bookie = ledgers.column("bookies")[0].as_py()[0]
        columns = ["bookie", "ledger_id", "mzxid", "state"]
        times: dict[str, list[float]] = {"all_overlay": [], "past_append": []}
        counts: dict[str, int] = {}

        def timed(name: str, read: Any) -> None:
            table = DeltaTable(table_path(root, "ledger_bookies"))
            began = time.process_time()
            rows = read(table)
            times.setdefault(name, []).append(time.process_time() - began)
            counts[name] = rows.num_rows

        for _ in range(args.rounds):
            timed("all_overlay", lambda t: _all_overlay(log, t, [bookie], columns))
            timed("past_append", lambda t: log.read_index(t, [bookie], columns))
        _record(log, root, last, ledgers.slice(batches[last], args.batch), append=False)
        for _ in range(args.rounds):
            timed("all_overlay_one_batch", lambda t: _all_overlay(log, t, [bookie], columns))
            timed("past_append_one_batch", lambda t: log.read_index(t, [bookie], columns))
        return {
            "ledgers": args.ledgers,
            "overlay_mb": round(log.held_bytes().get("overlay_rows", 0) / 2**20),
            "build_s": round(build_s, 1),
            "rows_read": counts,
            "cpu_s": {name: median_min(seconds) for name, seconds in times.items()},
            "load_avg": [round(x, 2) for x in os.getloadavg()],
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ledgers", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    print(json.dumps(run(parser.parse_args())))


if __name__ == "__main__":
    main()
