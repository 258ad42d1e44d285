"""Benchmark: a fold tick's process, its peak memory and CPU, reading its buckets' changes or all of them.

A tick rewrites a few buckets of ``ledgers`` from their rows and the changes since the watermark. Its
process (:mod:`connectors.delta._fold_process`) read every change since the watermark and kept those of
its buckets; it now keeps only its buckets' changes as it reads (``changes_in_buckets``). This writes
``--changes`` synthetic changes (:func:`tests.benchmarks.bench_ledger_buckets.synthetic_ledgers`, in
``--batches`` appends to ``ledger_changes``, as a snapshot's ingest leaves them), then runs a tick of
``ceil(buckets / --ticks)`` buckets in a process of its own on a fresh copy of that lakehouse, ``--rounds``
times per way, alternately: ``buckets_only`` (the module as it is) and ``all_changes`` (the same process
reading every change first, as before). Per way: the process's peak resident memory (MB) and CPU seconds,
medians. Ends with one JSON line (with the load average).

Run: ``python tests/benchmarks/bench_fold_memory.py --changes 1000000``.

Example:
    >>> tick_buckets(256, 10)
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parents[2]

#: The child for ``all_changes``: the fold process with its changes read whole, as before.
_ALL_CHANGES = """
import sys
from connectors.delta import _fold_process as fold
from connectors.delta.scan import scan

def read_all(table, folded, through, chosen, buckets):
    return scan(table, [("batch_id", ">", folded), ("batch_id", "<=", through)])

fold.changes_in_buckets = read_all
fold.main(sys.argv[1:])
"""


def tick_buckets(buckets: int, ticks: int) -> list[int]:
    return list(range(-(-buckets // ticks)))


def _lakehouse(root: Path | str, changes: int, batches: int, buckets: int) -> None:
    from deltalake import write_deltalake

    from connectors.delta.tables import LEDGER_CHANGES, conform_to, ensure_tables, table_path
    from tests.benchmarks.bench_ledger_buckets import synthetic_ledgers

    ensure_tables(root)
    rows = synthetic_ledgers(changes)
    rows = rows.set_column(
        rows.schema.get_field_index("ledger_bucket"),
        "ledger_bucket",
        pa.array((rows.column("ledger_id").to_numpy() % buckets).astype(np.int32)),
    )
    size = -(-changes // batches)
    for batch in range(batches):
        part = rows.slice(batch * size, size)
        part = part.append_column("batch_id", pa.array(np.full(part.num_rows, batch, np.int64)))
        write_deltalake(
            table_path(root, "ledger_changes"), conform_to(part, LEDGER_CHANGES.schema), mode="append"
        )


def _tick(prepared: Path, way: str, request: Any) -> dict[str, float]:
    from connectors.delta._fold_process import FoldRequest

    root = Path(tempfile.mkdtemp(prefix="bkaudit-bench-fold-"))
    try:
        shutil.copytree(prepared, root, dirs_exist_ok=True)
        request_file = root / "request.json"
        request_file.write_text(json.dumps(asdict(FoldRequest(**{**asdict(request), "root": str(root)}))))
        module = ["-m", "connectors.delta._fold_process"] if way == "buckets_only" else ["-c", _ALL_CHANGES]
        child = subprocess.Popen([sys.executable, *module, str(request_file), str(os.getpid())], cwd=REPO)
        _, status, usage = os.wait4(child.pid, 0)
        if status != 0:
            raise RuntimeError(f"the {way} fold failed ({status})")
        return {"peak_rss_mb": usage.ru_maxrss / 1024, "cpu_s": usage.ru_utime + usage.ru_stime}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from connectors.delta._fold_process import FoldRequest

    prepared = Path(tempfile.mkdtemp(prefix="bkaudit-bench-fold-prepared-"))
    try:
        # Built by a process of its own: a child's peak counts the pages it shared with this process when
        # it was started, which would then hold every change.
        shape = f"{str(prepared)!r}, {args.changes}, {args.batches}, {args.buckets}"
        build = f"from tests.benchmarks.bench_fold_memory import _lakehouse as b; b({shape})"
        subprocess.run([sys.executable, "-c", build], cwd=REPO, check=True)
        chosen = tick_buckets(args.buckets, args.ticks)
        request = FoldRequest(
            root=str(prepared),
            app="bench",
            folded=-1,
            through=args.batches - 1,
            buckets=args.buckets,
            complete=-1,
            reached=args.batches - 1,
            chosen=chosen,
        )
        samples: dict[str, list[dict[str, float]]] = {"buckets_only": [], "all_changes": []}
        for _ in range(args.rounds):
            for way in samples:
                samples[way].append(_tick(prepared, way, request))
        return {
            "changes": args.changes,
            "buckets": args.buckets,
            "tick_buckets": len(chosen),
            "by_way": {
                way: {
                    name: round(statistics.median(s[name] for s in runs), 2)
                    for name in ("peak_rss_mb", "cpu_s")
                }
                for way, runs in samples.items()
            },
            "load_avg": [round(x, 2) for x in os.getloadavg()],
        }
    finally:
        shutil.rmtree(prepared, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--buckets", type=int, default=256)
    parser.add_argument("--ticks", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    print(json.dumps(run(parser.parse_args())))


if __name__ == "__main__":
    main()
