"""Benchmark: one bookie loss through the loss owner at full scale, without ZooKeeper, Kafka or Spark.

Builds what the job holds after a START snapshot in a temporary lakehouse: N closed ledgers over B bookies
in R racks (:func:`bkaudit.sim.bulk.plan_ledgers`), recorded through the job's own
:class:`~connectors.delta.ledger_log.LedgerLog` in ``--batches`` micro-batches with the ``ledger_bookies``
index appended every ``--index-every`` batches (as the sink does every ``index_append_interval_s``), then
folded (``--no-fold``: the changes stay in the overlay, as right after the ingest). Then it loses
``--losses`` bookies one after another through :meth:`streaming.loss.LossAuditor.apply` (the membership
lane's ``bookie_lost`` decision), each followed by its return, with Kafka replaced by a function that keeps
the encoded records (publishing is timed by ``bench_stream.py``). Reports per loss the loss owner's
per-phase timeline (``phase_s``: lock, membership, evaluate, transitions, publish, record), the
``evaluate`` phase split further (index read, rule, conditions), and the membership lane's
``unmarked_at_risk`` call after the loss; with ``--profile`` the top functions of one loss by cumulative
time.

Run: ``python tests/benchmarks/bench_loss_owner.py [--ledgers 1000000] [--bookies 100] [--racks 10]``; it
ends by printing one JSON line (with the load average). Through pytest (``-m benchmark``) at a small count.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

APP = "bench"
CLUSTER = "bench-cluster"


def _ledger_rows(ledgers: int, bookies: int, racks: int) -> tuple[Any, list[str]]:
    """The ``ledgers`` rows of a bulk-loaded cluster (columns built once, no dict per ledger) and the
    bookie ids."""
    import numpy as np
    import pyarrow as pa

    from bkaudit.sim.bulk import BulkLoadSpec, plan_ledgers, synthetic_bookies
    from connectors.delta.tables import LEDGERS

    spec = BulkLoadSpec(bookies=synthetic_bookies(bookies, racks=racks), count=ledgers, seed=0)
    ids, last, length, topic, seg_offsets, seg_first, ens_values, bookie_lists = (
        [],
        [],
        [],
        [],
        [0],
        [],
        [],
        [],
    )
    bookie_offsets = [0]
    for ledger in plan_ledgers(spec):
        ids.append(ledger.ledger_id)
        last.append(ledger.last_entry_id)
        length.append(ledger.length)
        topic.append(ledger.managed_ledger)
        for segment in ledger.segments:
            seg_first.append(segment.first_entry_id)
            ens_values.append(list(segment.ensemble))
        seg_offsets.append(len(seg_first))
        named = sorted(ledger.bookies)
        bookie_lists.extend(named)
        bookie_offsets.append(len(bookie_lists))
    n = len(ids)
    segment_type = LEDGERS.schema.field("segments").type.value_type
    segments = pa.ListArray.from_arrays(
        pa.array(seg_offsets, pa.int32()),
        pa.StructArray.from_arrays(
            [pa.array(seg_first, pa.int64()), pa.array(ens_values, pa.list_(pa.string()))],
            fields=list(segment_type),
        ),
    )
    columns = {
        "ledger_id": pa.array(ids, pa.int64()),
        "ledger_bucket": pa.array(np.asarray(ids) % 16, pa.int32()),
        "cluster": pa.array([CLUSTER] * n),
        "state": pa.array(["CLOSED"] * n),
        "format_version": pa.array(np.full(n, 3), pa.int32()),
        "ensemble_size": pa.array(np.full(n, spec.ensemble_size), pa.int32()),
        "write_quorum": pa.array(np.full(n, spec.write_quorum), pa.int32()),
        "ack_quorum": pa.array(np.full(n, spec.ack_quorum), pa.int32()),
        "last_entry_id": pa.array(last, pa.int64()),
        "length": pa.array(length, pa.int64()),
        "segments": segments,
        "bookies": pa.ListArray.from_arrays(pa.array(bookie_offsets, pa.int32()), pa.array(bookie_lists)),
        "pulsar_topic": pa.array(topic),
        "mzxid": pa.array(np.arange(1, n + 1), pa.int64()),
        "deleted": pa.array(np.zeros(n, bool)),
        "under_replication_marked": pa.array(np.zeros(n, bool)),
    }
    table = pa.table({f.name: columns.get(f.name, pa.nulls(n, f.type)) for f in LEDGERS.schema})
    return table.cast(LEDGERS.schema), [b.bookie_id for b in spec.bookies]


def build(
    root: str, ledgers: int, bookies: int, racks: int, batches: int, index_every: int, fold: bool
) -> Any:
    """The lakehouse and the ledger log of a job that ingested a snapshot; returns (log, bookie ids, s)."""
    from connectors.delta.ledger_log import LedgerLog
    from connectors.delta.tables import BatchWriter, OpenTables, ensure_tables

    started = time.monotonic()
    ensure_tables(root)
    rows, bookie_ids = _ledger_rows(ledgers, bookies, racks)
    generated = time.monotonic() - started
    log = LedgerLog(root, APP)
    log.open(0)
    tables = OpenTables(root)
    per_batch = -(-rows.num_rows // batches)
    for batch in range(batches):
        chunk = rows.slice(batch * per_batch, per_batch)
        log.record(BatchWriter(root, APP, batch, tables), [], chunk)
        log.batch_started(batch + 1)
        if (batch + 1) % index_every == 0 or batch == batches - 1:
            log.flush_index(tables)
    recorded = time.monotonic() - started - generated
    if fold:
        log.fold()
    seconds = {
        "generate_s": round(generated, 1),
        "record_and_index_s": round(recorded, 1),
        "fold_s": round(time.monotonic() - started - generated - recorded, 1),
    }
    return log, bookie_ids, seconds


def _built(
    where: str,
    reuse: str | None,
    ledgers: int,
    bookies: int,
    racks: int,
    batches: int,
    index_every: int,
    fold: bool,
) -> Any:
    """:func:`build` into ``where``, or a copy of ``reuse`` (a lakehouse an earlier run built with the same
    arguments, kept there) opened as a restarted job would."""
    from bkaudit.sim.bulk import synthetic_bookies
    from connectors.delta.ledger_log import LedgerLog

    key = Path(reuse) / f"{ledgers}-{bookies}-{racks}-{batches}-{index_every}-{int(fold)}" if reuse else None
    if key is not None and key.exists():
        shutil.copytree(key, where, dirs_exist_ok=True)
        log = LedgerLog(where, APP)
        log.ensure_open()
        return log, [b.bookie_id for b in synthetic_bookies(bookies, racks=racks)], {"reused": str(key)}
    built = build(where, ledgers, bookies, racks, batches, index_every, fold)
    if key is not None:
        shutil.copytree(where, key)
    return built


@contextmanager
def _no_kafka() -> Any:
    """Publishing replaced by keeping the encoded records' values (the encoding stays in the timing)."""
    import streaming.loss as loss_module

    original = loss_module.publish_records
    loss_module.publish_records = lambda producer, kafka, records, **_: [v for _, v in records]
    try:
        yield
    finally:
        loss_module.publish_records = original


class _Splits:
    """Seconds of named inner calls of one ``apply`` (wrapped methods, restored on exit)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._restore: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] = round(self.seconds.get(label, 0.0) + time.perf_counter() - started, 4)

        setattr(owner, name, timed)
        self._restore.append((owner, name, original))

    def restore(self) -> None:
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)


def _decisions(kind: str, bookie_id: str, at_ms: int) -> list[dict[str, Any]]:
    """The membership lane's decisions for a bookie lost or returned: its state row and the transition."""
    lost = kind == "bookie_lost"
    state = {
        "status": "GONE" if lost else "WRITABLE",
        "lost": lost,
        "missing_since_ms": at_ms if lost else None,
    }
    return [
        {"kind": "bookie_state", "at_ms": at_ms, "bookie_id": bookie_id, "ledger_id": None, "payload": state},
        {"kind": kind, "at_ms": at_ms, "bookie_id": bookie_id, "ledger_id": None, "payload": {}},
    ]


def _lose(auditor: Any, bookie_id: str, batch_id: int, profile: bool) -> dict[str, Any]:
    """One loss then its return through the loss owner; the figures of both calls."""
    import core.domain.ledger_alerts as ledger_alerts
    import streaming.loss as loss_module

    splits = _Splits()
    splits.wrap(auditor.ledger_log, "read_index", "evaluate.read_index")
    splits.wrap(loss_module, "lost_bookie_verdicts", "evaluate.rule")
    splits.wrap(loss_module, "verdict_conditions_table", "evaluate.conditions")
    splits.wrap(ledger_alerts, "ledger_transitions", "transitions")
    app = f"{APP}.membership"
    now_ms = int(time.time() * 1000)
    record, at_record = auditor._record, []

    def timed_record(*args: Any, **kwargs: Any) -> Any:
        at_record.append(time.process_time())
        return record(*args, **kwargs)

    auditor._record = timed_record
    profiler = cProfile.Profile() if profile else None
    started, cpu = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.enable()
    report = auditor.apply(
        app_id=app,
        batch_id=batch_id,
        cluster=CLUSTER,
        membership=_decisions("bookie_lost", bookie_id, now_ms),
    )
    if profiler is not None:
        profiler.disable()
    loss_s, loss_cpu_s = time.perf_counter() - started, time.process_time() - cpu
    del auditor._record
    splits.restore()
    started = time.perf_counter()
    unmarked = auditor.unmarked_at_risk()
    unmarked_s = time.perf_counter() - started
    started = time.perf_counter()
    back = auditor.apply(
        app_id=app,
        batch_id=batch_id + 1,
        cluster=CLUSTER,
        membership=_decisions("bookie_returned", bookie_id, now_ms + 1),
    )
    figures: dict[str, Any] = {
        "bookie": bookie_id,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "ledgers_evaluated": report.ledgers_evaluated,
        "alerts": len(report.values),
        "apply_s": round(loss_s, 4),
        "apply_cpu_s": round(loss_cpu_s, 4),
        "to_published_cpu_s": round(at_record[0] - cpu, 4) if at_record else None,
        "to_published_s": round(sum(v for k, v in report.phase_s.items() if k != "record"), 4),
        "phase_s": dict(report.phase_s),
        "evaluate_split_s": splits.seconds,
        "unmarked_at_risk_s": round(unmarked_s, 4),
        "unmarked_at_risk_ledgers": unmarked.count,
        "return_apply_s": round(time.perf_counter() - started, 4),
        "return_phase_s": dict(back.phase_s),
    }
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(25)
        figures["profile"] = out.getvalue()
    return figures


def run(
    ledgers: int,
    bookies: int,
    racks: int,
    *,
    losses: int = 3,
    batches: int = 80,
    index_every: int = 1,
    fold: bool = True,
    profile: bool = False,
    root: str | None = None,
    reuse: str | None = None,
) -> dict[str, Any]:
    from core.settings import KafkaSettings
    from streaming.loss import LossAuditor

    figures: dict[str, Any] = {
        "ledgers": ledgers,
        "bookies": bookies,
        "racks": racks,
        "batches": batches,
        "index_every": index_every,
        "folded": fold,
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    with tempfile.TemporaryDirectory(prefix="bench-loss-owner-", dir=root) as where:
        log, bookie_ids, build_s = _built(where, reuse, ledgers, bookies, racks, batches, index_every, fold)
        figures["build"] = build_s
        auditor = LossAuditor(Path(where), KafkaSettings(), lambda: None, log)
        chosen = [bookie_ids[(i * 37 + 11) % len(bookie_ids)] for i in range(losses)]
        runs = []
        with _no_kafka():
            for number, bookie_id in enumerate(chosen):
                runs.append(_lose(auditor, bookie_id, 2 * number, profile and number == len(chosen) - 1))
        log.stop_folding(fold_all=False)
    figures["runs"] = runs
    applies = [r["apply_s"] for r in runs]
    evaluates = [r["phase_s"].get("evaluate", 0.0) for r in runs]
    figures["apply_p50_s"] = round(statistics.median(applies), 4)
    figures["to_published_p50_s"] = round(statistics.median(r["to_published_s"] for r in runs), 4)
    figures["evaluate_p50_s"] = round(statistics.median(evaluates), 4)
    figures["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return figures


def summary_line(figures: dict[str, Any]) -> dict[str, Any]:
    """The one JSON line the script ends with."""
    return {
        "ledgers": figures["ledgers"],
        "bookies": figures["bookies"],
        "folded": figures["folded"],
        "to_published_p50_s": figures["to_published_p50_s"],
        "evaluate_p50_s": figures["evaluate_p50_s"],
        "apply_p50_s": figures["apply_p50_s"],
        "to_published_cpu_s": [r["to_published_cpu_s"] for r in figures["runs"]],
        "apply_s": [r["apply_s"] for r in figures["runs"]],
        "phase_s": [r["phase_s"] for r in figures["runs"]],
        "evaluate_split_s": [r["evaluate_split_s"] for r in figures["runs"]],
        "unmarked_at_risk_s": [r["unmarked_at_risk_s"] for r in figures["runs"]],
        "alerts": [r["alerts"] for r in figures["runs"]],
        "load_avg": {"start": figures["load_average_at_start"], "end": figures["load_average_at_end"]},
    }


@pytest.mark.benchmark
def test_loss_owner_figures() -> None:
    """Prints the figures at a small scale; asserts only that every loss alerted (no timing)."""
    figures = run(ledgers=20_000, bookies=100, racks=10, losses=1, batches=4)
    print(json.dumps(summary_line(figures)))
    assert all(r["alerts"] > 1 for r in figures["runs"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledgers", type=int, default=1_000_000)
    parser.add_argument("--bookies", type=int, default=100)
    parser.add_argument("--racks", type=int, default=10)
    parser.add_argument("--losses", type=int, default=3)
    parser.add_argument("--batches", type=int, default=80, help="micro-batches of the snapshot's ingest")
    parser.add_argument("--index-every", type=int, default=1, help="batches between two index appends")
    parser.add_argument("--no-fold", action="store_true", help="leave the ingest in the overlay")
    parser.add_argument("--profile", action="store_true", help="cProfile the last loss (printed to stderr)")
    parser.add_argument("--dir", help="where the temporary lakehouse goes")
    parser.add_argument("--reuse", help="keep the built lakehouse here and start from a copy of it next time")
    args = parser.parse_args()
    result = run(
        args.ledgers,
        args.bookies,
        args.racks,
        losses=args.losses,
        batches=args.batches,
        index_every=args.index_every,
        fold=not args.no_fold,
        profile=args.profile,
        root=args.dir,
        reuse=args.reuse,
    )
    for loss in result["runs"]:
        if "profile" in loss:
            print(loss.pop("profile"), file=sys.stderr)
    print(json.dumps(result, indent=2))
    print(json.dumps(summary_line(result)))
