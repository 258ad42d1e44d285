"""Benchmark: the lost-bookie rule per ledger against the vectorised rule, side by side in one run.

The ledgers are the bulk loader's (:func:`bkaudit.sim.bulk.plan_ledgers`: E=3, WQ=2, AQ=2, rack-aware
ensembles, 10 % with an ensemble change) over B bookies; the lost bookie's share of N ledgers is what a
loss reaches through the ``ledger_bookies`` index (~31,000 of 1 M on 100 bookies). For each lost set:

- ``per_ledger_s``: the rule as the sink applied it before, one ledger at a time (a password-less
  ``LedgerMetadata`` per row, ``is_recoverable``, the sample) over the index rows as Python dicts;
- ``vectorised_s``: :func:`core.domain.rules.lost_ledgers.lost_bookie_verdicts` over the same rows as an
  Arrow table; ``vectorised_conditions_s`` adds turning the verdicts into the sink's alert conditions
  (:func:`~core.domain.ledger_alerts.verdict_conditions_table`, columns);
- ``identical``: every verdict is the same.

Each form runs ``--repeats`` times; the median and the least are reported.

Run: ``python tests/benchmarks/bench_lost_rule.py [--ledgers 1000000] [--bookies 100] [--racks 10]``; it
ends by printing one JSON line. Through pytest (``-m benchmark``) at a small count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _index_rows(ledgers: int, bookies: int, racks: int, lost: list[str]) -> list[dict[str, Any]]:
    """The ``ledger_bookies`` rows a loss of ``lost`` reads (one per ledger naming any of them)."""
    from bkaudit.sim.bulk import BulkLoadSpec, plan_ledgers, synthetic_bookies

    spec = BulkLoadSpec(bookies=synthetic_bookies(bookies, racks=racks), count=ledgers, seed=0)
    wanted = set(lost)
    rows = []
    for ledger in plan_ledgers(spec):
        if wanted.isdisjoint(b for segment in ledger.segments for b in segment.ensemble):
            continue
        rows.append(
            {
                "ledger_id": ledger.ledger_id,
                "state": "CLOSED",
                "format_version": 3,
                "ensemble_size": spec.ensemble_size,
                "write_quorum": spec.write_quorum,
                "ack_quorum": spec.ack_quorum,
                "last_entry_id": ledger.last_entry_id,
                "length": ledger.length,
                "segments": [
                    {"first_entry_id": s.first_entry_id, "ensemble": list(s.ensemble)}
                    for s in ledger.segments
                ],
            }
        )
    return rows


def _timed(work: Any, repeats: int) -> tuple[Any, dict[str, float]]:
    """``work()``'s last result and the median and least seconds of ``repeats`` runs (the garbage collector
    stays on, as in the sink: a full collection lands in some runs and not others)."""
    seconds = []
    result = None
    for _ in range(repeats):
        started = time.perf_counter()
        result = work()
        seconds.append(time.perf_counter() - started)
    return result, {"p50": round(statistics.median(seconds), 4), "min": round(min(seconds), 4)}


def compare(rows: list[dict[str, Any]], lost: set[str], repeats: int) -> dict[str, Any]:
    """Both forms over the same rows: seconds each, and whether every verdict agrees."""
    import numpy as np
    import pyarrow as pa

    from core.domain.ledger_alerts import verdict_conditions_table
    from core.domain.rules.lost_ledgers import LOST_BOOKIE_INPUT_SCHEMA, lost_bookie_verdicts
    from tests.unit.test_lost_ledgers import per_ledger_condition

    table = pa.Table.from_pylist(rows, schema=LOST_BOOKIE_INPUT_SCHEMA)
    per_ledger, per_ledger_s = _timed(
        lambda: {row["ledger_id"]: per_ledger_condition(row, lost) for row in rows}, repeats
    )
    verdicts, vectorised_s = _timed(lambda: lost_bookie_verdicts(table, lost), repeats)
    at_ms, topics = np.zeros(len(rows), np.int64), pa.nulls(len(rows))
    conditions, conditions_s = _timed(
        lambda: verdict_conditions_table(lost_bookie_verdicts(table, lost), at_ms, topics), repeats
    )
    kinds = [kind for kind in conditions.column("kind").to_pylist() if kind]
    return {
        "lost": sorted(lost),
        "ledgers_reached": len(rows),
        "unrecoverable": kinds.count("LEDGER_UNRECOVERABLE"),
        "per_ledger_s": per_ledger_s,
        "vectorised_s": vectorised_s,
        "vectorised_conditions_s": conditions_s,
        "speedup_p50": round(per_ledger_s["p50"] / vectorised_s["p50"], 1),
        "speedup_with_conditions_p50": round(per_ledger_s["p50"] / conditions_s["p50"], 1),
        "identical": conditions == per_ledger and verdicts.num_rows == len(rows),
    }


def run(ledgers: int, bookies: int, racks: int, repeats: int = 5) -> dict[str, Any]:
    from bkaudit.sim.bulk import synthetic_bookies

    names = [b.bookie_id for b in synthetic_bookies(bookies, racks=racks)]
    one, two = [names[0]], [names[0], names[1]]  # two racks: ledgers with both in a write set lose data
    figures: dict[str, Any] = {
        "ledgers": ledgers,
        "bookies": bookies,
        "racks": racks,
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    rows = _index_rows(ledgers, bookies, racks, two)
    named = [r for r in rows if one[0] in {b for s in r["segments"] for b in s["ensemble"]}]
    figures["one_lost"] = compare(named, set(one), repeats)
    figures["two_lost"] = compare(rows, set(two), repeats)
    figures["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return figures


@pytest.mark.benchmark
def test_lost_rule_figures() -> None:
    figures = run(ledgers=20_000, bookies=100, racks=10, repeats=1)
    assert figures["one_lost"]["identical"] and figures["two_lost"]["identical"]
    print(json.dumps(figures))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledgers", type=int, default=1_000_000, help="ledgers in the cluster")
    parser.add_argument("--bookies", type=int, default=100)
    parser.add_argument("--racks", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5, help="runs of each form (the median is reported)")
    args = parser.parse_args()
    print(json.dumps(run(args.ledgers, args.bookies, args.racks, args.repeats)))
