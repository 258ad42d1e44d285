"""Benchmark: the SRE queries (``bkaudit query ...``) over a synthetic 1 M-ledger lakehouse (target: < 1 s).

Writes the auditor's tables with their real schemas through ``connectors.delta.tables``
(deltalake, no Spark) in a temporary directory, shaped like a cluster in the middle of an incident:

- ``ledgers``: ``--ledgers`` Pulsar ledgers over ``--bookies`` bookies in ``--racks`` racks (rack-aware
  ensembles, mostly E=3/WQ=2/AQ=2, 1 % E=2/WQ=1, 15 % with a second segment, 10 % open), then
  ``--update-batches`` merges through :class:`~connectors.delta.tables.BatchWriter` (ledgers closed or
  re-replicated; one traced ledger changes in every batch), so the table has versions to travel through;
- ``ledger_bookies``: the bookie → ledger index; ``bookies``: membership, one bookie lost, one moved rack;
- ``open_alerts``: ``BOOKIE_LOST``, every ledger of the lost bookie under-replicated (or unrecoverable),
  every ledger the rack move broke ``PLACEMENT_NOT_ADHERING``;
- ``violations``: 30 days of history (earlier bookie losses fired and resolved) plus today's transitions.

Then it times each query of :class:`connectors.delta.queries.Lakehouse` from a fresh object (as a CLI
process would: the Delta logs are opened inside the timing), best of ``--repeat``, and one CLI call per
command in a subprocess (wall time including Python start-up and imports). Prints one JSON document.

Run as a script for the full figure, or through pytest (``-m benchmark``) for a smaller count::

    python tests/benchmarks/bench_query.py                       # 1,000,000 ledgers
    python tests/benchmarks/bench_query.py --ledgers 200000 --keep /tmp/lake
    pytest tests/benchmarks/bench_query.py -m benchmark -s -o addopts=""

Example:
    >>> _parse_args(["--ledgers", "10"]).ledgers
    10
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from connectors.delta.tables import (
    BOOKIES,
    INDEX_LEDGER_COLUMNS,
    LEDGER_BOOKIES,
    LEDGER_BUCKETS,
    LEDGERS,
    OPEN_ALERTS,
    VIOLATIONS,
    BatchWriter,
    ensure_tables,
)

PYTEST_LEDGERS = 50_000
APP_ID = "bench-query"
CLUSTER = "bench-cluster"
TRACED_LEDGER = 42  # changes in every update batch: the ledger whose history is queried


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--ledgers", type=int, default=1_000_000)
    parser.add_argument("--bookies", type=int, default=100)
    parser.add_argument("--racks", type=int, default=10)
    parser.add_argument("--update-batches", type=int, default=10, help="merges into ledgers after the load")
    parser.add_argument("--repeat", type=int, default=3, help="timings per query (best is reported)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="write the lakehouse here and keep it (default: temp dir)")
    parser.add_argument(
        "--existing", type=Path, help="time the queries over a lakehouse this script wrote before"
    )
    parser.add_argument("--no-cli", action="store_true", help="skip the subprocess timings of the CLI")
    return parser.parse_args(argv)


def _bookie_name(index: int, per_rack: int) -> str:
    return f"10.0.{index // per_rack}.{10 + index % per_rack}:3181"


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


class _Cluster:
    """The synthetic cluster: ensembles as numpy arrays, names and racks per bookie index."""

    def __init__(self, ledgers: int, bookies: int, racks: int, seed: int, now: datetime) -> None:
        if bookies % racks or bookies // racks < 2 or racks < 3:
            raise SystemExit("need at least 3 racks and an equal number (>= 2) of bookies per rack")
        self.rng = np.random.default_rng(seed)
        self.now = now
        self.count = ledgers
        self.per_rack = bookies // racks
        self.names = [_bookie_name(i, self.per_rack) for i in range(bookies)]
        self.racks = [f"/rack-{i // self.per_rack}" for i in range(bookies)]
        rng = self.rng
        # Rack-aware ensembles of 3: three distinct racks, one host in each.
        rack0 = rng.integers(0, racks, ledgers)
        rack1 = (rack0 + rng.integers(1, racks // 2 + 1, ledgers)) % racks
        rack2 = (rack0 + rng.integers(racks // 2 + 1, racks, ledgers)) % racks
        hosts = rng.integers(0, self.per_rack, (3, ledgers))
        self.ensembles = np.stack([rack0, rack1, rack2]) * self.per_rack + hosts  # (3, ledgers)
        self.wq1 = rng.random(ledgers) < 0.01  # E=2, WQ=1, AQ=1: unrecoverable when a member is lost
        self.second_segment = rng.random(ledgers) < 0.15
        self.open = rng.random(ledgers) < 0.10
        # The second segment replaced member 0 by its rack neighbour (an ensemble change).
        replaced = self.ensembles[0] // self.per_rack * self.per_rack + (hosts[0] + 1) % self.per_rack
        self.replacement = replaced
        self.lost_bookie = 0
        self.moved_bookie = self.per_rack + 1  # moved from /rack-1 into /rack-2

    def members(self, i: int) -> tuple[list[list[int]], list[int]]:
        first = (
            [int(b) for b in self.ensembles[:2, i]] if self.wq1[i] else [int(b) for b in self.ensembles[:, i]]
        )
        segments = [first]
        if self.second_segment[i]:
            segments.append([int(self.replacement[i]), *first[1:]])
        return segments, sorted({b for segment in segments for b in segment})


def _ledger_rows(cluster: _Cluster) -> pa.Table:
    names = cluster.names
    created = _ms(cluster.now - timedelta(days=60))
    segments_col: list[list[dict[str, Any]]] = []
    bookies_col: list[list[str]] = []
    e_col, wq_col, aq_col, last_col, len_col, state_col, topic_col, custom_col = ([] for _ in range(8))
    for i in range(cluster.count):
        segments, members = cluster.members(i)
        segments_col.append(
            [
                {"first_entry_id": index * 5000, "ensemble": [names[b] for b in s]}
                for index, s in enumerate(segments)
            ]
        )
        bookies_col.append([names[b] for b in members])
        closed = not cluster.open[i]
        last = 5000 * len(segments) - 1 if closed else -1
        e_col.append(len(segments[0]))
        wq_col.append(1 if cluster.wq1[i] else 2)
        aq_col.append(1 if cluster.wq1[i] else 2)
        last_col.append(last)
        len_col.append((last + 1) * 1024 if closed else 0)
        state_col.append("CLOSED" if closed else "OPEN")
        tenant, namespace = f"tenant-{i % 7}", f"ns-{i % 3}"
        local = f"topic-{i // 160}-partition-{i % 16}"
        topic_col.append(f"persistent://{tenant}/{namespace}/{local}")
        custom_col.append(
            [
                {"key": "application", "value": b"pulsar"},
                {"key": "component", "value": b"managed-ledger"},
                {
                    "key": "pulsar/managed-ledger",
                    "value": f"{tenant}/{namespace}/persistent/{local}".encode(),
                },
            ]
        )
    ids = np.arange(cluster.count, dtype=np.int64)
    at = cluster.now - timedelta(days=1)
    columns: dict[str, Any] = {
        "ledger_id": ids,
        "ledger_bucket": (ids % LEDGER_BUCKETS).astype(np.int32),
        "cluster": [CLUSTER] * cluster.count,
        "state": state_col,
        "format_version": np.full(cluster.count, 3, dtype=np.int32),
        "ensemble_size": e_col,
        "write_quorum": wq_col,
        "ack_quorum": aq_col,
        "last_entry_id": last_col,
        "length": len_col,
        "digest_type": ["CRC32C"] * cluster.count,
        "segments": segments_col,
        "bookies": bookies_col,
        "ctime_ms": created + ids,
        "pulsar_topic": topic_col,
        "custom_metadata": custom_col,
        "has_password": np.ones(cluster.count, dtype=bool),
        "znode_version": np.where(cluster.open, 0, 1).astype(np.int32),
        "mzxid": 1_000_000 + ids,
        "znode_ctime_ms": created + ids,
        "znode_mtime_ms": created + ids,
        "placement": [None if o else "MEETS_STRICT" for o in cluster.open],
        "under_replication_marked": np.zeros(cluster.count, dtype=bool),
        "deleted": np.zeros(cluster.count, dtype=bool),
        "updated_at": pa.array([at] * cluster.count, pa.timestamp("us", tz="UTC")),
    }
    arrays = [
        pa.array(columns[f.name], f.type) if f.name in columns else pa.nulls(cluster.count, f.type)
        for f in LEDGERS.schema
    ]
    return pa.Table.from_arrays(arrays, schema=LEDGERS.schema)


def _alert_id(kind: str, entity: str, started: int) -> str:
    from core.domain.alerts import AlertKind, make_alert_id

    return make_alert_id(CLUSTER, AlertKind(kind), entity, started)


def _alert_rows(
    cluster: _Cluster, ledgers: pa.Table, *, lost: int, at: datetime, state: str, batch_id: int
) -> list[dict[str, Any]]:
    """Transitions of one bookie loss: the bookie and every ledger that names it."""
    name = cluster.names[lost]
    started = _ms(at)
    parents = pc.list_parent_indices(ledgers.column("bookies")).to_numpy()
    hit = pc.equal(pc.list_flatten(ledgers.column("bookies")), name).to_numpy(zero_copy_only=False)
    rows_idx = np.unique(parents[hit])
    picked = (
        ledgers.take(pa.array(rows_idx)).select(["ledger_id", "write_quorum", "pulsar_topic"]).to_pylist()
    )
    rows: list[dict[str, Any]] = [
        {
            "alert_id": _alert_id("BOOKIE_LOST", f"bookie/{name}", started),
            "kind": "BOOKIE_LOST",
            "entity": f"bookie/{name}",
            "severity": "warning",
            "ledger_id": None,
            "bookies": [name],
            "pulsar_topic": None,
            "detail": json.dumps({"missing_since": started - 60_000}),
        }
    ]
    for row in picked:
        kind = "LEDGER_UNRECOVERABLE" if row["write_quorum"] == 1 else "LEDGER_UNDER_REPLICATED"
        entity = f"ledger/{row['ledger_id']}"
        rows.append(
            {
                "alert_id": _alert_id(kind, entity, started),
                "kind": kind,
                "entity": entity,
                "severity": "critical" if kind == "LEDGER_UNRECOVERABLE" else "warning",
                "ledger_id": row["ledger_id"],
                "bookies": [name],
                "pulsar_topic": row["pulsar_topic"],
                "detail": json.dumps({"lost_bookies": [name]}),
            }
        )
    for row in rows:
        row.update(
            cluster=CLUSTER,
            state=state,
            started_at=at,
            detected_at=at,
            detected_date=at.date(),
            batch_id=batch_id,
        )
    return rows


def _placement_rows(cluster: _Cluster, ledgers: pa.Table, at: datetime) -> list[dict[str, Any]]:
    """``PLACEMENT_NOT_ADHERING`` for each closed ledger the rack move left with too few racks."""
    racks = np.array([int(r.rsplit("-", 1)[1]) for r in cluster.racks])
    racks[cluster.moved_bookie] = cluster.moved_bookie // cluster.per_rack + 1
    rows = []
    started = _ms(at)
    for i in range(cluster.count):
        segments, members = cluster.members(i)
        if cluster.open[i] or cluster.moved_bookie not in members:
            continue
        # E=3 / WQ=2 striping: every pair is a write set, so any two members in one rack fail.
        if any(len({racks[b] for b in s}) < len(s) for s in segments):
            names = [cluster.names[b] for b in members]
            entity = f"ledger/{i}"
            rows.append(
                {
                    "alert_id": _alert_id("PLACEMENT_NOT_ADHERING", entity, started),
                    "cluster": CLUSTER,
                    "kind": "PLACEMENT_NOT_ADHERING",
                    "state": "firing",
                    "entity": entity,
                    "severity": "warning",
                    "ledger_id": i,
                    "bookies": names,
                    "pulsar_topic": ledgers.column("pulsar_topic")[i].as_py(),
                    "started_at": at,
                    "detected_at": at,
                    "detected_date": at.date(),
                    "detail": json.dumps({"policy": "rackaware"}),
                    "batch_id": 2,
                }
            )
    return rows


def write_synthetic_lakehouse(
    root: Path, *, ledgers: int, bookies: int, racks: int, update_batches: int, seed: int = 0
) -> dict[str, Any]:
    """Write every table under ``root``; returns what was written (row counts, the lost bookie...).

    Example:
        >>> import tempfile
        >>> facts = write_synthetic_lakehouse(Path(tempfile.mkdtemp()), ledgers=200, bookies=9, racks=3,
        ...                                   update_batches=1)
        >>> facts["rows"]["ledgers"], facts["rows"]["bookies"]
        (200, 9)
    """
    now = datetime.now(tz=UTC).replace(microsecond=0)
    cluster = _Cluster(ledgers, bookies, racks, seed, now)
    ensure_tables(root)
    started = time.perf_counter()
    ledger_table = _ledger_rows(cluster)
    BatchWriter(root, APP_ID, 0).append("ledgers", ledger_table)
    parents = pc.list_parent_indices(ledger_table.column("bookies"))
    index = pa.table(
        {
            "bookie": pc.list_flatten(ledger_table.column("bookies")),
            **{
                name: pc.take(ledger_table.column(name), parents)
                for name in ("ledger_id", "mzxid", *INDEX_LEDGER_COLUMNS)
            },
        }
    )
    BatchWriter(root, APP_ID, 0).append("ledger_bookies", index.cast(LEDGER_BOOKIES.schema))
    load_s = time.perf_counter() - started

    lost_name = cluster.names[cluster.lost_bookie]
    incident = now - timedelta(hours=2)
    bookie_rows = []
    for index_, name in enumerate(cluster.names):
        rack = cluster.racks[index_]
        if index_ == cluster.moved_bookie:
            rack = f"/rack-{index_ // cluster.per_rack + 1}"
        host, port = name.rsplit(":", 1)
        bookie_rows.append(
            {
                "bookie_id": name,
                "cluster": CLUSTER,
                "status": "GONE" if index_ == cluster.lost_bookie else "WRITABLE",
                "lost": index_ == cluster.lost_bookie,
                "missing_since": incident - timedelta(minutes=1) if index_ == cluster.lost_bookie else None,
                "flaps": int(cluster.rng.integers(0, 3)),
                "rack": rack,
                "host": host,
                "port": int(port),
                "rpc_address": name,
                "has_cookie": True,
                "updated_at": incident,
            }
        )
    BatchWriter(root, APP_ID, 1).upsert("bookies", pa.Table.from_pylist(bookie_rows, schema=BOOKIES.schema))

    # 30 days of history: a bookie lost and back every five days, then today's incident and rack move.
    history: list[dict[str, Any]] = []
    for day in range(30, 0, -5):
        lost = int(cluster.rng.integers(1, bookies))
        fired = now - timedelta(days=day)
        history += _alert_rows(cluster, ledger_table, lost=lost, at=fired, state="firing", batch_id=day)
        history += _alert_rows(
            cluster,
            ledger_table,
            lost=lost,
            at=fired + timedelta(minutes=40),
            state="resolved",
            batch_id=day + 1,
        )
    current = _alert_rows(
        cluster, ledger_table, lost=cluster.lost_bookie, at=incident, state="firing", batch_id=100
    )
    placement = _placement_rows(cluster, ledger_table, now - timedelta(hours=1))
    BatchWriter(root, APP_ID, 1).append(
        "violations", pa.Table.from_pylist(history + current + placement, schema=VIOLATIONS.schema)
    )
    BatchWriter(root, APP_ID, 1).append(
        "open_alerts", pa.Table.from_pylist(current + placement, schema=OPEN_ALERTS.schema)
    )

    # Merges into ledgers: open ledgers close; the traced ledger changes every time.
    merge_s = []
    open_ids = np.flatnonzero(cluster.open)
    per_batch = max(1, min(2_000, len(open_ids) // max(1, update_batches)))
    for batch in range(update_batches):
        chosen = [int(i) for i in open_ids[batch * per_batch : (batch + 1) * per_batch] if i != TRACED_LEDGER]
        rows = ledger_table.take(pa.array([TRACED_LEDGER, *chosen], pa.int64())).to_pylist()
        at = now - timedelta(hours=10) + timedelta(minutes=30 * batch)
        for row in rows:
            row["updated_at"] = at
            row["mzxid"] += 10_000_000 * (batch + 1)
            if row["ledger_id"] == TRACED_LEDGER:
                row["znode_version"] = batch + 1
                row["under_replication_marked"] = batch % 2 == 1
                if batch == update_batches - 1:
                    row["state"], row["placement"] = "CLOSED", "MEETS_STRICT"
            else:
                row["state"], row["placement"], row["last_entry_id"] = "CLOSED", "MEETS_STRICT", 4999
        step = time.perf_counter()
        BatchWriter(root, APP_ID, 10 + batch).upsert(
            "ledgers", pa.Table.from_pylist(rows, schema=LEDGERS.schema)
        )
        merge_s.append(time.perf_counter() - step)
    return {
        "rows": {
            "ledgers": ledger_table.num_rows,
            "ledger_bookies": index.num_rows,
            "bookies": len(bookie_rows),
            "open_alerts": len(current) + len(placement),
            "violations": len(history) + len(current) + len(placement),
        },
        "lost_bookie": lost_name,
        "moved_bookie": cluster.names[cluster.moved_bookie],
        "traced_ledger": TRACED_LEDGER,
        "load_s": round(load_s, 1),
        "merge_s_mean": round(sum(merge_s) / len(merge_s), 2) if merge_s else None,
    }


def _best(function: Callable[[], pa.Table], repeat: int) -> tuple[float, int]:
    best, rows = float("inf"), 0
    for _ in range(repeat):
        started = time.perf_counter()
        rows = function().num_rows
        best = min(best, time.perf_counter() - started)
    return best, rows


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    from connectors.delta.queries import Lakehouse

    root = args.existing or args.keep or Path(tempfile.mkdtemp(prefix="bkaudit-bench-query-"))
    try:
        if args.existing is not None:
            per_rack = args.bookies // args.racks
            facts: dict[str, Any] = {"lost_bookie": _bookie_name(0, per_rack), "traced_ledger": TRACED_LEDGER}
        else:
            started = time.perf_counter()
            facts = write_synthetic_lakehouse(
                root,
                ledgers=args.ledgers,
                bookies=args.bookies,
                racks=args.racks,
                update_batches=args.update_batches,
                seed=args.seed,
            )
            facts["write_s"] = round(time.perf_counter() - started, 1)
        lost, traced = facts["lost_bookie"], facts["traced_ledger"]
        per_rack = args.bookies // args.racks
        healthy = [_bookie_name(1, per_rack), _bookie_name(per_rack + 1, per_rack)]
        sample_topic = Lakehouse(root).under_replicated(limit=1).column("pulsar_topic")[0].as_py()
        page = 1001  # what the CLI asks for by default (--limit 1000, plus one to know it was cut)
        queries: dict[str, Callable[[], pa.Table]] = {
            "alerts_first_page": lambda: Lakehouse(root).open_alerts(limit=page),
            "alerts_all": lambda: Lakehouse(root).open_alerts(),
            "alerts_by_kind": lambda: Lakehouse(root).open_alerts(group_by="kind"),
            "under_replicated_first_page": lambda: Lakehouse(root).under_replicated(limit=page),
            "under_replicated_all": lambda: Lakehouse(root).under_replicated(),
            "under_replicated_by_rack": lambda: Lakehouse(root).under_replicated(group_by="rack"),
            "under_replicated_by_namespace": lambda: Lakehouse(root).under_replicated(group_by="namespace"),
            "under_replicated_of_topic": lambda: Lakehouse(root).under_replicated(topic=sample_topic),
            "placement_by_rack": lambda: Lakehouse(root).placement(),
            "ledgers_of_lost_bookie_first_page": lambda: Lakehouse(root).ledgers(bookie=lost, limit=page),
            "ledgers_of_lost_bookie_all": lambda: Lakehouse(root).ledgers(bookie=lost),
            "ledgers_of_rack_first_page": lambda: Lakehouse(root).ledgers(rack="/rack-3", limit=page),
            "ledger_history": lambda: Lakehouse(root).ledger_history(traced),
            "bookies": lambda: Lakehouse(root).bookies(),
            "alert_timeline": lambda: Lakehouse(root).violations(kinds=["BOOKIE_LOST"]),
            "violations_by_rack_and_kind": lambda: Lakehouse(root).violations(group_by=["rack", "kind"]),
            "under_replicated_over_time": lambda: Lakehouse(root).open_alerts_over_time(),
            # Before maintenance: one healthy bookie, then two of different racks, beside the lost one.
            "what_if_one_bookie": lambda: Lakehouse(root).what_if([healthy[0]]).ledgers,
            "what_if_two_bookies": lambda: Lakehouse(root).what_if(healthy).ledgers,
            "drain_of_a_bookie": lambda: Lakehouse(root).drain(healthy[0]),
            "auditor_diff": lambda: Lakehouse(root).auditor_diff(grace_s=0),
        }
        timings: dict[str, dict[str, float | int]] = {}
        for name, query in queries.items():
            seconds, rows = _best(query, args.repeat)
            timings[name] = {"seconds": round(seconds, 3), "rows": rows}
        cli: dict[str, float] = {}
        if not args.no_cli:
            commands = {
                "query alerts --group-by kind": ["alerts", "--group-by", "kind"],
                "query alerts": ["alerts"],
                "query under-replicated": ["under-replicated"],
                "query under-replicated --group-by rack": ["under-replicated", "--group-by", "rack"],
                "query ledgers --bookie <lost> --limit 0 --format csv": [
                    *("ledgers", "--bookie", lost, "--limit", "0", "--format", "csv")
                ],
                "query history --ledger-id <traced>": ["history", "--ledger-id", str(traced)],
                "query bookies": ["bookies"],
                "query what-if --down <two bookies> --format json": [
                    *("what-if", "--down", healthy[0], "--down", healthy[1], "--format", "json")
                ],
            }
            for label, argv in commands.items():
                started = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, "-m", "bkaudit.cli.main", "query", *argv, "--lakehouse", str(root)],
                    capture_output=True,
                )
                assert done.returncode in (0, 1), done.stderr  # what-if exits 1 when not safe
                cli[label] = round(time.perf_counter() - started, 3)
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "bkaudit.cli.main", "--help"], check=True, capture_output=True
            )
            cli["bkaudit --help (start-up only)"] = round(time.perf_counter() - started, 3)
        return {"lakehouse": facts, "query_seconds": timings, "cli_wall_seconds": cli}
    finally:
        if args.keep is None and args.existing is None:
            shutil.rmtree(root, ignore_errors=True)


@pytest.mark.benchmark
def test_query_figures() -> None:
    """Prints the figures at a small scale; asserts the queries found what was written (no timing)."""
    figures = run_benchmark(_parse_args(["--ledgers", str(PYTEST_LEDGERS), "--repeat", "1"]))
    print(json.dumps(figures, indent=2))
    timings = figures["query_seconds"]
    assert timings["ledger_history"]["rows"] >= 1
    assert timings["bookies"]["rows"] == figures["lakehouse"]["rows"]["bookies"]
    assert timings["under_replicated_all"]["rows"] > 0
    assert timings["under_replicated_first_page"]["rows"] == min(
        1001, timings["under_replicated_all"]["rows"]
    )


if __name__ == "__main__":
    figures = run_benchmark(_parse_args(sys.argv[1:]))
    print(json.dumps(figures, indent=2))
    # the last line: every figure on one line, with the load average it was measured at
    print(json.dumps({**figures, "load_average": [round(x, 2) for x in os.getloadavg()]}))
