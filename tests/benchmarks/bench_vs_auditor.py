"""Benchmark: bkaudit against BookKeeper's own Auditor on a real BookKeeper 4.17 cluster, bookie by bookie.

Starts its own ZooKeeper and broker (:class:`~bkaudit.testing.ServiceHarness`) in a temporary directory,
a real cluster of ``--bookies`` bookies in ``--racks`` racks
(:class:`~connectors.bookkeeper.RealBookKeeperCluster`, DbLedgerStorage, ``zkTimeout`` ``--zk-timeout-ms``),
writes ``--ledgers`` ledgers with BookKeeper's Java client (ensemble 3, write quorum 2, ack quorum 2,
5 entries, ``--open`` of them left open; rack-aware placement), then runs side by side
(:mod:`tests.realstack`):

- BookKeeper's ``AutoRecoveryMain`` (Auditor + ReplicationWorker, ``lostBookieRecoveryDelay=0``). Every
  written ledger's replication lock (``underreplication/locks/urL<id>``) is held first, so the
  ReplicationWorker skips every mark (``ZkLedgerUnderreplicationManager.getLedgerToRereplicate``) and the
  marks stay to be counted; BookKeeper has no setting that stops the worker alone (the ``disable`` znode
  also stops the Auditor's bookie audit: ``AuditorBookieCheckTask.auditBookies`` waits while it exists);
- bkaudit's ``bkaudit watch`` and ``bkaudit stream`` as subprocesses, with the chaos suite's short
  event-time delays.

Once both are idle (bkaudit has every ledger in its ``ledgers`` table, the Auditor logged the end of its
start-up checks), each of ``--losses`` losses kills one bookie with ``kill -9`` (bookie 1, 2, ...) and
records: the ledgers the Auditor marked under-replicated and when its last mark was created (znode ctime, s
since the kill), the ledgers bkaudit alerted (``LEDGER_UNDER_REPLICATED`` / ``LEDGER_UNRECOVERABLE``) and
when the last alert was read back from the alerts topic, and when the bookie's registration vanished (its
ZooKeeper session expired: neither side can know before). The bookie is then restarted, bkaudit's alerts
resolve, the marks are deleted (as a finished ReplicationWorker would), and the next loss starts clean.

Ends with one JSON line: ``bookkeeper_version``, ``bookies``, ``ledgers``, ``losses``, ``auditor_marked``,
``bkaudit_alerted``, ``missed_by_bkaudit``, ``missed_by_auditor`` (summed), ``auditor_last_mark_s``,
``bkaudit_last_alert_s``, ``speedup_p50`` (the Auditor's time over bkaudit's, from the kill, median of the
losses), ``speedup_after_expiry_p50`` (the same from the session's expiry), the load average and the
machine probe.

    python tests/benchmarks/bench_vs_auditor.py --bookies 6 --racks 3 --ledgers 2000 --losses 2
    pytest tests/benchmarks/bench_vs_auditor.py -m benchmark -s -o addopts=""

Example:
    >>> _parse_args(["--ledgers", "100"]).ledgers
    100
    >>> _ratio_p50([2.0, 4.0], [1.0, 1.0])
    3.0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

if __name__ == "__main__":  # run as a script from anywhere: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bkaudit.testing.harness import ServiceHarness
from tests.benchmarks.machine_probe import machine_probe_ms
from tests.chaos.stack import wait_for
from tests.realstack import Loss, RealStack, real_stack

BOOKKEEPER_VERSION = "4.17.2"


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add = parser.add_argument
    add("--bookies", type=int, default=6)
    add("--racks", type=int, default=3)
    add("--ledgers", type=int, default=2000)
    add("--open", type=int, default=10, help="ledgers left open by the writer")
    add("--losses", type=int, default=2)
    add("--zk-timeout-ms", type=int, default=10000, help="the bookies' ZooKeeper session timeout")
    add("--timeout-s", type=float, default=120.0, help="how long one loss may take to be complete")
    return parser.parse_args(argv)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _ratio_p50(slow: list[float | None], fast: list[float | None]) -> float | None:
    """Median over the losses of ``slow / fast`` (losses missing either are left out)."""
    ratios = [s / f for s, f in zip(slow, fast, strict=True) if s is not None and f]
    return round(statistics.median(ratios), 2) if ratios else None


def _spread(stack: RealStack) -> dict[str, int]:
    """Ledgers per bookie (any segment), from bkaudit's ``ledgers`` table."""
    counts: dict[str, int] = {}
    for row in stack.ledger_rows().values():
        for bookie in row["bookies"]:
            counts[bookie] = counts.get(bookie, 0) + 1
    return dict(sorted(counts.items()))


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    load_at_start = _load()
    probe = machine_probe_ms(scale=0.5)
    phases: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-vs-auditor-") as state:
        root = Path(state)
        started = time.monotonic()
        services = ServiceHarness(root / "services", zookeeper_heap="512m")
        services.start()
        cluster = services.real_bookkeeper(
            bookies=arguments.bookies,
            racks=arguments.racks,
            bookie_conf={"zkTimeout": arguments.zk_timeout_ms},
        )
        phases["services_and_cluster_s"] = time.monotonic() - started
        try:
            started = time.monotonic()
            written = cluster.write_ledgers(arguments.ledgers, open_ledgers=arguments.open)
            ledger_ids = set(written["closed"]) | set(written["open"])
            phases["write_ledgers_s"] = time.monotonic() - started
            with real_stack(services, cluster, root / "stack", lock_ledgers=ledger_ids) as stack:
                started = time.monotonic()
                cluster.start_auditor(check_interval_s=3600)
                wait_for("the Auditor's start-up checks", stack.auditor_idle, 300)
                stack.wait_ingested(ledger_ids, timeout_s=300)
                phases["both_idle_s"] = time.monotonic() - started
                marked_at_start = len(stack.marks.snapshot())
                stack.marks.clear()
                spread = _spread(stack)
                losses: list[Loss] = []
                for number in range(arguments.losses):
                    index = number % arguments.bookies + 1
                    loss = stack.lose([index], timeout_s=arguments.timeout_s)
                    losses.append(loss)
                    phases[f"restore_{number + 1}_s"] = stack.restore([index], loss)
        finally:
            cluster.stop()
            services.stop()
    return _figures(arguments, written, losses, spread, marked_at_start, phases, load_at_start, probe)


def _figures(
    arguments: argparse.Namespace,
    written: dict[str, Any],
    losses: list[Loss],
    spread: dict[str, int],
    marked_at_start: int,
    phases: dict[str, float],
    load_at_start: list[float],
    probe: dict[str, float],
) -> dict[str, Any]:
    summaries = [loss.summary() for loss in losses]
    auditor = [s["auditor_last_mark_s"] for s in summaries]
    ours = [s["bkaudit_last_alert_s"] for s in summaries]
    expiry = [s["unregistered_s"] or 0.0 for s in summaries]
    return {
        "benchmark": "vs_auditor",
        "bookkeeper_version": BOOKKEEPER_VERSION,
        "bookies": arguments.bookies,
        "racks": arguments.racks,
        "ledgers": len(written["closed"]) + len(written["open"]),
        "open_ledgers": len(written["open"]),
        "ledgers_per_bookie": spread,
        "zk_timeout_ms": arguments.zk_timeout_ms,
        "losses": len(losses),
        "marked_before_losses": marked_at_start,
        "expected": [s["expected"] for s in summaries],
        "auditor_marked": [s["auditor_marked"] for s in summaries],
        "bkaudit_alerted": [s["bkaudit_alerted"] for s in summaries],
        "missed_by_bkaudit": sum(len(s["missed_by_bkaudit"]) for s in summaries),
        "missed_by_auditor": sum(len(s["missed_by_auditor"]) for s in summaries),
        "differences": [
            {
                "missed_by_bkaudit": s["missed_by_bkaudit"][:20],
                "missed_by_auditor": s["missed_by_auditor"][:20],
            }
            for s in summaries
        ],
        "unregistered_s": [s["unregistered_s"] for s in summaries],
        "auditor_first_mark_s": [s["auditor_first_mark_s"] for s in summaries],
        "auditor_last_mark_s": auditor,
        "bkaudit_bookie_lost_s": [s["bkaudit_bookie_lost_s"] for s in summaries],
        "bkaudit_first_alert_s": [s["bkaudit_first_alert_s"] for s in summaries],
        "bkaudit_last_alert_s": ours,
        "bkaudit_kinds": [s["bkaudit_kinds"] for s in summaries],
        "complete": [s["complete"] for s in summaries],
        "speedup_p50": _ratio_p50(auditor, ours),
        "speedup_after_expiry_p50": _ratio_p50(
            [None if a is None else a - e for a, e in zip(auditor, expiry, strict=True)],
            [None if b is None else b - e for b, e in zip(ours, expiry, strict=True)],
        ),
        "phases_s": {k: round(v, 1) for k, v in phases.items()},
        "load_average": {"start": load_at_start, "end": _load()},
        "machine_probe_ms": probe,
    }


@pytest.mark.benchmark
def test_bkaudit_against_the_auditor_figures() -> None:
    figures = run(_parse_args(["--bookies", "4", "--racks", "2", "--ledgers", "100", "--losses", "1"]))
    print(json.dumps(figures))


if __name__ == "__main__":
    import signal

    # SIGTERM (kill <pid>) unwinds like an exception: the bookies, services and temporary directory go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(json.dumps(run(_parse_args())))
