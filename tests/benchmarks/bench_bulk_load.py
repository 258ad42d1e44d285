"""Benchmark: bulk-load closed ledgers into a fresh embedded ZooKeeper and report time and memory.

Starts its own ZooKeeper (``EmbeddedZooKeeper``, default heap 3g) in a temporary
directory, writes the ledgers with :func:`bkaudit.sim.bulk.bulk_load` (rack-aware ensembles over
``--bookies`` bookies in ``--racks`` racks, 2-4-4 hierarchical layout by default), then prints one JSON
document:

- ``load``: the loader's summary (created, seconds, ledgers/s, metadata bytes written, multi-ops, retries);
- ``zookeeper``: ``mntr``'s ``zk_znode_count`` and ``zk_approximate_data_size`` (ZooKeeper's sum of path
  and data lengths), the JVM's resident set (``VmRSS``, peak ``VmHWM``), the heap in use after a full GC
  (``jcmd``, when available) and the size of the data directory on disk;
- ``metadata``: total and average znode data bytes of the ledgers;
- ``index``: ledgers per bookie (min / mean / max, and N·E/B for comparison) and the time
  :func:`bkaudit.sim.bulk.bookie_ledger_index` takes to rebuild it;
- ``verified_sample``: ledgers read back, decoded and checked CLOSED.

Run as a script for the full figure, or through pytest (``-m benchmark``) for a smaller count::

    python tests/benchmarks/bench_bulk_load.py --ledgers 1000000 --bookies 100 --racks 10
    pytest tests/benchmarks/bench_bulk_load.py -m benchmark -s -o addopts=""

Example:
    >>> _parse_args(["--ledgers", "10"]).ledgers
    10
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

PYTEST_LEDGERS = 20_000
SAMPLE = 2_000


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ledgers", type=int, default=1_000_000)
    parser.add_argument("--bookies", type=int, default=100)
    parser.add_argument("--racks", type=int, default=10)
    parser.add_argument("--heap", default="3g", help="ZooKeeper JVM heap (-Xmx)")
    parser.add_argument("--batch-size", type=int, default=250, help="creates per multi-op")
    parser.add_argument("--in-flight", type=int, default=8, help="multi-ops outstanding at most")
    parser.add_argument("--manager", default="hierarchical")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mean-gap", type=int, default=1, help="1 = dense ids, k = sparse, mean gap k")
    parser.add_argument("--state-dir", type=Path, help="keep ZooKeeper's data here (default: a temp dir)")
    parser.add_argument("--no-index", action="store_true", help="skip the bookie index figures")
    return parser.parse_args(argv)


def _proc_status_kib(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _heap_used_after_gc_mib(pid: int) -> float | None:
    """Live heap after a full GC, from ``jcmd`` (None when jcmd is missing or its output is unexpected)."""
    jcmd = shutil.which("jcmd")
    if jcmd is None:
        return None
    try:
        subprocess.run([jcmd, str(pid), "GC.run"], capture_output=True, timeout=120, check=True)
        info = subprocess.run(
            [jcmd, str(pid), "GC.heap_info"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"used (\d+)K", info)
    return round(int(match.group(1)) / 1024, 1) if match else None


def _dir_bytes(path: Path) -> int:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


def _verify_sample(client: Any, spec: Any, manager: Any, root: str, count: int) -> int:
    from core.domain.layout import ledger_path
    from core.domain.metadata import LedgerState, decode_ledger_metadata

    ids = spec.ledger_ids()
    step = max(1, len(ids) // count)
    results = [(i, client.get_async(ledger_path(ids[i], manager, root))) for i in range(0, len(ids), step)]
    for _, result in results:
        data, _stat = result.get(timeout=60)
        if decode_ledger_metadata(data).state is not LedgerState.CLOSED:
            raise AssertionError("a loaded ledger is not CLOSED")
    return len(results)


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Start ZooKeeper, load, measure; returns the figures (see the module docstring)."""
    from kazoo.client import KazooClient

    from bkaudit.sim.bulk import BulkLoadSpec, bookie_ledger_index, bulk_load, synthetic_bookies
    from connectors.zookeeper.embedded import EmbeddedZooKeeper
    from core.domain.layout import DEFAULT_LEDGERS_ROOT, LedgerManagerType

    manager = LedgerManagerType.from_name(args.manager)
    root = DEFAULT_LEDGERS_ROOT
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="bkaudit-bench-bulk-"))
    zookeeper = EmbeddedZooKeeper(state_dir, heap=args.heap)
    zookeeper.start()
    client = KazooClient(hosts=zookeeper.address, timeout=30.0)
    try:
        client.start(timeout=30)
        before = zookeeper.stats()
        spec = BulkLoadSpec(
            bookies=synthetic_bookies(args.bookies, racks=args.racks),
            count=args.ledgers,
            seed=args.seed,
            mean_gap=args.mean_gap,
        )
        summary = bulk_load(
            client,
            spec,
            root=root,
            manager=manager,
            batch_size=args.batch_size,
            max_in_flight=args.in_flight,
            create_layout=True,
        )
        after = zookeeper.stats()
        pid = zookeeper.pid()
        rss = _proc_status_kib(pid, "VmRSS") if pid else None
        peak = _proc_status_kib(pid, "VmHWM") if pid else None
        verified = _verify_sample(client, spec, manager, root, SAMPLE)
        heap_after_gc = _heap_used_after_gc_mib(pid) if pid else None
        figures: dict[str, Any] = {
            "ledgers": args.ledgers,
            "bookies": args.bookies,
            "racks": args.racks,
            "manager": manager.value,
            "load": summary.to_dict(),
            "zookeeper": {
                "heap_max": args.heap,
                "znode_count": int(after["zk_znode_count"]),
                "znodes_added": int(after["zk_znode_count"]) - int(before["zk_znode_count"]),
                "approximate_data_size_bytes": int(after["zk_approximate_data_size"]),
                "approximate_data_size_mib": round(int(after["zk_approximate_data_size"]) / 2**20, 1),
                "rss_mib": round(rss / 1024, 1) if rss else None,
                "rss_peak_mib": round(peak / 1024, 1) if peak else None,
                "heap_used_after_full_gc_mib": heap_after_gc,
                "data_dir_mib": round(_dir_bytes(zookeeper.data_dir) / 2**20, 1),
            },
            "metadata": {
                "total_bytes": summary.bytes_written,
                "total_mib": round(summary.bytes_written / 2**20, 1),
                "average_bytes": round(summary.bytes_written / max(summary.created, 1), 1),
            },
            "verified_sample": verified,
        }
        if not args.no_index:
            started = time.monotonic()
            index = bookie_ledger_index(spec)
            sizes = [len(ids) for ids in index.values()]
            figures["index"] = {
                "seconds": round(time.monotonic() - started, 2),
                "ledgers_per_bookie_min": min(sizes),
                "ledgers_per_bookie_mean": round(statistics.mean(sizes), 1),
                "ledgers_per_bookie_max": max(sizes),
                "n_times_e_over_b": round(args.ledgers * spec.ensemble_size / args.bookies, 1),
            }
        return figures
    finally:
        client.stop()
        client.close()
        zookeeper.stop()
        if args.state_dir is None:
            shutil.rmtree(state_dir, ignore_errors=True)


@pytest.mark.benchmark
def test_bulk_load_figures() -> None:
    """Prints the figures for a smaller load; asserts counts only (no timing: machines differ)."""
    figures = run_benchmark(_parse_args(["--ledgers", str(PYTEST_LEDGERS), "--heap", "1g"]))
    print(json.dumps(figures, indent=2))
    assert figures["load"]["created"] == PYTEST_LEDGERS
    assert figures["zookeeper"]["znodes_added"] >= PYTEST_LEDGERS


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    figures = run_benchmark(_parse_args(sys.argv[1:]))
    print(json.dumps(figures, indent=2))
    # the last line: every figure on one line, with the load average it was measured at
    print(json.dumps({**figures, "load_average": [round(x, 2) for x in os.getloadavg()]}))
