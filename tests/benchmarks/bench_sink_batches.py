"""Benchmark: the sink's cost per *small* batch of new ledger versions at full scale (what a batch costs
whatever its size), for the ledger lane run by the driver with many batches a second.

Two steps, so that two versions of the code can be measured on the same state side by side:

- ``--prepare DIR``: bulk-plan N ledgers (:mod:`bkaudit.sim.bulk`, as ``bench_stream.py --sink-only``),
  run the watcher's START snapshot of them through the processor's logic and the sink in batches of 100 k,
  fold, and keep the lakehouse and the ``ledger_state`` payloads of up to 200 k of the ledgers under ``DIR``;
- ``--measure DIR``: copy the lakehouse, then send the sink ``--batches`` batches of each size in
  ``--sizes`` (new versions of random ledgers, one ``mzxid`` higher each time), back to back, and report the
  seconds per batch (p50, mean, max; wall and CPU of the whole process, which a shared machine disturbs
  less) with the time in the sink's stages and the process's resident memory after them; ``--profile``
  adds the top of a cProfile of the batches of each size. ``--code-root`` imports bkaudit from another
  checkout (the "before" of a change), so one driver script can alternate the two on one machine state.

Run::

    python tests/benchmarks/bench_sink_batches.py --prepare /tmp/sinkbench --ledgers 300000
    python tests/benchmarks/bench_sink_batches.py --measure /tmp/sinkbench --sizes 1000,8000 --batches 30

Example:
    >>> _summary([3.0, 1.0, 2.0])
    {'n': 3, 'p50': 2.0, 'mean': 2.0, 'max': 3.0}
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PREPARE_CHUNK = 100_000
PAYLOADS_KEPT = 200_000  # ledgers whose payloads the changes reuse (every ledger's would need GBs at 1 M)
PAYLOADS = "payloads.arrow"


def _summary(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 4),
        "mean": round(statistics.fmean(ordered), 4),
        "max": round(ordered[-1], 4),
    }


def _settings(state_dir: Path, bootstrap: str) -> Any:
    from core.settings import Settings
    from tests.benchmarks.bench_stream import INSTANCE_ID

    suffix = f"{os.getpid()}-{int(time.time())}"
    kafka = {
        "bootstrap_servers": bootstrap,
        "changes_topic": f"bench.changes.{suffix}",
        "alerts_topic": f"bench.alerts.{suffix}",
        "feedback_topic": f"bench.feedback.{suffix}",
    }
    return Settings(
        cluster=INSTANCE_ID,
        kafka=kafka,
        lakehouse_root=state_dir / "lakehouse",
        checkpoint_root=state_dir / "checkpoints",
        stream={"ledger_fold_interval_s": 0},
    )


def _sink(settings: Any) -> Any:
    from connectors.kafka.topics import ensure_topic
    from streaming.job import sink_config
    from streaming.sink import AuditSink

    for topic in (settings.kafka.changes_topic, settings.kafka.feedback_topic, settings.kafka.alerts_topic):
        ensure_topic(settings.kafka, topic, partitions=1)
    return AuditSink(sink_config(settings, 1))


def prepare(state_dir: Path, ledgers: int, bookies: int, racks: int) -> dict[str, Any]:
    """The lakehouse of ``ledgers`` ingested and folded, and their ``ledger_state`` payloads."""
    import pyarrow as pa
    import pyarrow.feather as feather

    from bkaudit.sim.bulk import BulkLoadSpec, synthetic_bookies
    from connectors.kafka.embedded import EmbeddedBroker
    from tests.benchmarks.bench_stream import INSTANCE_ID, _decision_table, _Processor, _snapshot_decisions

    state_dir.mkdir(parents=True, exist_ok=True)
    broker = EmbeddedBroker(state_dir / "broker")
    broker.start()
    try:
        settings = _settings(state_dir, broker.bootstrap)
        sink = _sink(settings)
        spec = BulkLoadSpec(bookies=synthetic_bookies(bookies, racks=racks), count=ledgers, seed=1)
        processor = _Processor(INSTANCE_ID)
        pending: list[dict[str, Any]] = []
        payloads: dict[int, str] = {}
        batch_id = 0
        started = time.monotonic()
        for decisions in [*_snapshot_decisions(spec, processor, 1, "/ledgers"), []]:
            pending.extend(decisions)
            for d in decisions:
                if d["kind"] == "ledger_state" and d["ledger_id"] % max(1, ledgers // PAYLOADS_KEPT) == 0:
                    payloads[d["ledger_id"]] = json.dumps(d["payload"], separators=(",", ":"), sort_keys=True)
            if len(pending) >= PREPARE_CHUNK or (not decisions and pending):
                sink.process(_decision_table(pending, INSTANCE_ID), batch_id)
                batch_id += 1
                pending = []
        sink.ledger_log.fold(through=batch_id - 1)
        sink.close()
        ids = sorted(payloads)
        feather.write_feather(
            pa.table({"ledger_id": ids, "payload": [payloads[i] for i in ids]}), str(state_dir / PAYLOADS)
        )
        (state_dir / "next_batch").write_text(str(batch_id))
        seconds = round(time.monotonic() - started, 1)
        return {"ledgers": ledgers, "payloads_kept": len(ids), "batches": batch_id, "seconds": seconds}
    finally:
        broker.stop()


def _changes(payloads: Any, size: int, mzxid: int, rng: Any) -> tuple[Any, int]:
    """A decision table of ``size`` new versions of distinct random ledgers; the next free mzxid."""
    from tests.benchmarks.bench_stream import INSTANCE_ID, _decision_table

    picked = rng.choice(payloads.num_rows, size, replace=False)
    ids = payloads.column("ledger_id").take(picked).to_pylist()
    texts = payloads.column("payload").take(picked).to_pylist()
    now_ms = int(time.time() * 1000)
    decisions = []
    for ledger_id, text in zip(ids, texts, strict=True):
        payload = json.loads(text)
        payload["mzxid"] = mzxid
        payload.pop("snapshot_id", None)  # a live change, not a snapshot's sighting
        mzxid += 1
        decisions.append(
            {"kind": "ledger_state", "event_time_ms": now_ms, "ledger_id": ledger_id, "payload": payload}
        )
    return _decision_table(decisions, INSTANCE_ID), mzxid


def _time_appends_per_table(timers: Any) -> None:
    """A timer per table around ``BatchWriter.append`` (on top of ``_instrument``'s total)."""
    from connectors.delta import tables

    original = tables.BatchWriter.append

    def append(writer: Any, name: str, rows: Any) -> bool:
        started = time.perf_counter()
        try:
            return original(writer, name, rows)
        finally:
            timers.seconds[f"delta.append.{name}"] += time.perf_counter() - started
            timers.calls[f"delta.append.{name}"] += 1

    tables.BatchWriter.append = append  # type: ignore[method-assign]


def _set_properties(lakehouse: Path, properties: list[str]) -> None:
    """``table:key=value`` Delta table properties set on the copied lakehouse (options compared)."""
    from deltalake import DeltaTable

    for item in properties:
        name, setting = item.split(":", 1)
        key, value = setting.split("=", 1)
        DeltaTable(str(lakehouse / name)).alter.set_table_properties({key: value})


def measure(
    state_dir: Path, sizes: list[int], batches: int, profile: bool, seed: int, properties: list[str]
) -> dict[str, Any]:
    """Seconds per batch of each size, the sink's stages and (``profile``) a cProfile's top lines."""
    import numpy as np
    import pyarrow.feather as feather

    from connectors.kafka.embedded import EmbeddedBroker
    from tests.benchmarks.bench_stream import Timers, _instrument, _load, _profile_lines
    from tests.benchmarks.replay import rss_kb

    work = Path(tempfile.mkdtemp(prefix="bkaudit-sinkbatches-"))
    shutil.copytree(state_dir / "lakehouse", work / "lakehouse")
    _set_properties(work / "lakehouse", properties)
    broker = EmbeddedBroker(work / "broker")
    broker.start()
    figures: dict[str, Any] = {
        "load_average_at_start": _load(),
        "code": str(Path(_sink.__code__.co_filename)),
    }
    try:
        import streaming.sink

        figures["code"] = streaming.sink.__file__
        sink = _sink(_settings(work, broker.bootstrap))
        payloads = feather.read_table(str(state_dir / PAYLOADS))
        rng = np.random.default_rng(seed)
        batch_id = int((state_dir / "next_batch").read_text())
        mzxid = 10**12
        opened = time.monotonic()
        sink.ledger_log.ensure_open()
        figures["open_s"] = round(time.monotonic() - opened, 2)
        timers = Timers()
        _instrument(timers)
        _time_appends_per_table(timers)
        for size in sizes:
            seconds, cpu_seconds = [], []
            before = timers.snapshot()
            profiler = cProfile.Profile() if profile else None
            for _ in range(batches):
                table, mzxid = _changes(payloads, size, mzxid, rng)
                if profiler is not None:
                    profiler.enable()
                started, cpu_started = time.perf_counter(), time.process_time()
                sink.process(table, batch_id)
                seconds.append(time.perf_counter() - started)
                cpu_seconds.append(time.process_time() - cpu_started)  # every thread of the process
                if profiler is not None:
                    profiler.disable()
                batch_id += 1
            figures[f"batches_of_{size}"] = {
                "seconds": _summary(seconds),
                "cpu_seconds": _summary(cpu_seconds),
                "stages": Timers.delta(timers.snapshot(), before),
                "rss_mb_after": round(rss_kb(os.getpid()) / 1024, 1),
                **({"profile": _profile_lines(profiler, 45)} if profiler is not None else {}),
            }
        timers.restore()
        sink.close()
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    figures["load_average_at_end"] = _load()
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepare", type=Path)
    parser.add_argument("--measure", type=Path)
    parser.add_argument("--code-root", type=Path, help="import bkaudit from this checkout")
    parser.add_argument("--ledgers", type=int, default=300_000)
    parser.add_argument("--bookies", type=int, default=100)
    parser.add_argument("--racks", type=int, default=10)
    parser.add_argument("--sizes", default="1000,8000")
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--table-property", action="append", default=[], help="table:key=value, repeatable")
    args = parser.parse_args(argv)
    if args.prepare:
        print(json.dumps(prepare(args.prepare, args.ledgers, args.bookies, args.racks)))
    if args.measure:
        sizes = [int(s) for s in args.sizes.split(",") if s]
        print(
            json.dumps(
                measure(args.measure, sizes, args.batches, args.profile, args.seed, args.table_property)
            )
        )


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if "--code-root" in arguments:
        sys.path.insert(0, arguments[arguments.index("--code-root") + 1])
    sys.path.insert(0 if "--code-root" not in arguments else 1, str(Path(__file__).resolve().parents[2]))
    main()
