"""Benchmark: a real BookKeeper 4.17 cluster on loopback: start times, memory, ledger-writer throughput.

Starts its own ZooKeeper in a temporary directory, then a
:class:`~connectors.bookkeeper.RealBookKeeperCluster`
of ``--bookies`` bookies in ``--racks`` racks, writes ``--ledgers`` ledgers with BookKeeper's Java client and
prints one JSON document: ``zookeeper_start_s``, ``cluster_start_s`` (initnewcluster + all bookies
registered), ``bookie_restart_s``, ``bookie_rss_mb`` (VmRSS per bookie), ``writer`` (the writer's own
seconds, the process's seconds, ledgers/s) and the 1-minute load average before and after.

    python tests/benchmarks/bench_real_bookkeeper.py --bookies 6 --racks 3 --ledgers 2000
    pytest tests/benchmarks/bench_real_bookkeeper.py -m benchmark -s -o addopts=""

Example:
    >>> _parse_args(["--bookies", "3"]).bookies
    3
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from connectors.bookkeeper import RealBookKeeperCluster
from connectors.zookeeper.embedded import EmbeddedZooKeeper


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bookies", type=int, default=6)
    parser.add_argument("--racks", type=int, default=3)
    parser.add_argument("--ledgers", type=int, default=2000)
    return parser.parse_args(argv)


def _rss_mb(pid: int | None) -> int | None:
    if pid is None:
        return None
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return None


def run(bookies: int, racks: int, ledgers: int) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-real-bk-") as state:
        zookeeper = EmbeddedZooKeeper(Path(state) / "zk", heap="256m")
        started = time.monotonic()
        zookeeper.start()
        zookeeper_s = time.monotonic() - started
        cluster = RealBookKeeperCluster(Path(state) / "bk", zookeeper.address, bookies=bookies, racks=racks)
        try:
            started = time.monotonic()
            cluster.start()
            cluster_s = time.monotonic() - started
            started = time.monotonic()
            written = cluster.write_ledgers(ledgers, open_ledgers=min(10, ledgers // 10))
            writer_s = time.monotonic() - started
            rss = [_rss_mb(bookie.pid()) for bookie in cluster.all_bookies()]
            started = time.monotonic()
            cluster.restart_bookie(1)
            restart_s = time.monotonic() - started
        finally:
            cluster.stop()
            zookeeper.stop()
    return {
        "benchmark": "real_bookkeeper",
        "bookies": bookies,
        "racks": racks,
        "zookeeper_start_s": round(zookeeper_s, 2),
        "cluster_start_s": round(cluster_s, 2),
        "bookie_restart_s": round(restart_s, 2),
        "bookie_rss_mb": rss,
        "writer": {
            "ledgers": len(written["closed"]) + len(written["open"]),
            "writer_s": round(float(written["seconds"]), 2),
            "process_s": round(writer_s, 2),
            "ledgers_per_s": round(ledgers / float(written["seconds"]), 1),
        },
        "load_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


@pytest.mark.benchmark
def test_real_bookkeeper_figures() -> None:
    print(json.dumps(run(3, 2, 200)))


if __name__ == "__main__":
    arguments = _parse_args()
    print(json.dumps(run(arguments.bookies, arguments.racks, arguments.ledgers)))
