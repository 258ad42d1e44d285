"""Benchmark: the ``ledgers`` table's bucket count (``stream.ledger_table_buckets``) against its cost.

A synthetic table of ``--rows`` ledger rows (three-bookie ensembles over 100 bookies, the columns the job
fills) is written as Delta, partitioned in each of ``--buckets``, the way the fold writes it (Arrow batches
of ``WRITE_BATCH_ROWS``, plain-encoded id columns); per count: the Parquet MB, the CPU and wall seconds of
the whole write and of reading it all back, and the CPU of a rotation tick's rewrite of an eighth of the
buckets. Ends with one JSON line (with the load average).

Run: ``python tests/benchmarks/bench_ledger_buckets.py --rows 1000000 --buckets 16,64,256,1024``.

Example:
    >>> synthetic_ledgers(3).column("ledger_id").to_pylist()
    [1000, 1003, 1006]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def synthetic_ledgers(n: int) -> pa.Table:
    """``n`` ledger rows with ``ledgers``' schema."""
    from connectors.delta.tables import LEDGERS, conform_to

    rng = np.random.default_rng(1)
    ids = np.arange(n, dtype=np.int64) * 3 + 1000
    names = [f"bookie-{i}.example:3181" for i in range(100)]
    ensembles = [[names[(i + j) % 100] for j in range(3)] for i in range(100)]
    table = pa.table(
        {
            "ledger_id": ids,
            "state": pa.array(np.where(rng.random(n) < 0.8, "CLOSED", "OPEN")),
            "cluster": ["c"] * n,
            "ensemble_size": np.full(n, 3, np.int32),
            "write_quorum": np.full(n, 2, np.int32),
            "ack_quorum": np.full(n, 2, np.int32),
            "last_entry_id": rng.integers(0, 1_000_000, n),
            "length": rng.integers(0, 1_000_000_000, n),
            "digest_type": ["CRC32C"] * n,
            "bookies": [ensembles[i % 100] for i in range(n)],
            "segments": [[{"first_entry_id": 0, "ensemble": ensembles[i % 100]}] for i in range(n)],
            "ctime_ms": rng.integers(1_600_000_000_000, 1_700_000_000_000, n),
            "mzxid": rng.integers(0, 1_000_000_000, n),
            "znode_version": np.ones(n, np.int32),
            "znode_ctime_ms": rng.integers(1_600_000_000_000, 1_700_000_000_000, n),
            "znode_mtime_ms": rng.integers(1_600_000_000_000, 1_700_000_000_000, n),
            "deleted": np.zeros(n, bool),
            "placement": ["MEETS_STRICT"] * n,
        }
    )
    return conform_to(table, LEDGERS.schema)


def measure(table: pa.Table, buckets: int, scratch: str) -> dict[str, Any]:
    """Write ``table`` in ``buckets`` partitions, read it back, rewrite an eighth of the buckets."""
    from deltalake import DeltaTable, write_deltalake

    from connectors.delta._fold_process import WRITE_BATCH_ROWS, with_buckets

    path = tempfile.mkdtemp(dir=scratch)
    try:
        rows = with_buckets(table, buckets)
        cpu, wall = time.process_time(), time.monotonic()
        write_deltalake(path, rows.to_reader(max_chunksize=WRITE_BATCH_ROWS), partition_by=["ledger_bucket"])
        write_cpu, write_wall = time.process_time() - cpu, time.monotonic() - wall
        size = sum(
            os.path.getsize(os.path.join(folder, name))
            for folder, _, names in os.walk(path)
            for name in names
            if name.endswith(".parquet")
        )
        cpu, wall = time.process_time(), time.monotonic()
        DeltaTable(path).to_pyarrow_table()
        read_cpu, read_wall = time.process_time() - cpu, time.monotonic() - wall
        chosen = list(range(0, buckets, 8)) or [0]
        eighth = rows.filter(pc.is_in(rows.column("ledger_bucket"), pa.array(chosen, pa.int32())))
        cpu = time.process_time()
        write_deltalake(
            path,
            eighth.to_reader(max_chunksize=WRITE_BATCH_ROWS),
            mode="overwrite",
            predicate=f"ledger_bucket IN ({', '.join(map(str, chosen))})",
        )
        return {
            "mb": round(size / 1e6, 1),
            "write_cpu_s": round(write_cpu, 2),
            "write_wall_s": round(write_wall, 2),
            "read_cpu_s": round(read_cpu, 2),
            "read_wall_s": round(read_wall, 2),
            "eighth_rewrite_cpu_s": round(time.process_time() - cpu, 2),
        }
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--buckets", default="16,64,256,1024")
    args = parser.parse_args()
    table = synthetic_ledgers(args.rows)
    scratch = tempfile.mkdtemp(prefix="bkaudit-bench-buckets-")
    try:
        start = Path("/proc/loadavg").read_text().split()[:3]
        figures = {int(b): measure(table, int(b), scratch) for b in args.buckets.split(",")}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    line = {"rows": args.rows, "by_buckets": figures}
    line["load_avg"] = {"start": start, "end": Path("/proc/loadavg").read_text().split()[:3]}
    print(json.dumps(line))


if __name__ == "__main__":
    main()
