"""Benchmark: the job's decoder per record against its columnar batch form, side by side in one run.

The records are what the replay benchmark sends: ledger upserts of the bulk loader's Pulsar-like ledgers
(:func:`bkaudit.sim.bulk.planned_metadata`, B bookies in R racks) as change events, in one Arrow batch with
the Kafka source's columns. For each form, ``--repeats`` rounds, alternating:

- ``per_record_us``: :func:`streaming.decode.decode_record` one record at a time (a row dictionary, the
  payload dictionary encoded by ``json``), rows to Arrow with ``from_pylist``: the decoder before its
  columnar form;
- ``columnar_us``: :func:`streaming.decode.decode_batches` (columns, the upsert's payload written as JSON
  text directly);
- ``identical``: both give the same table.

Figures are microseconds per record (median and least over the rounds), with the load average.

Run: ``python tests/benchmarks/bench_decode.py [--records 100000] [--repeats 5]``; it ends by printing one
JSON line. Through pytest (``-m benchmark``) at a small count.
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

FEEDBACK = "bkaudit.feedback"


def source_batch(records: int, bookies: int, racks: int) -> Any:
    """``records`` ledger upserts as the Kafka source hands them to the decoder (received now)."""
    import pyarrow as pa

    from bkaudit.sim.bulk import BulkLoadSpec, plan_ledgers, planned_metadata, synthetic_bookies
    from core import events as ev
    from core.domain.layout import ledger_path
    from tests.benchmarks.replay import _Stat

    spec = BulkLoadSpec(bookies=synthetic_bookies(bookies, racks=racks), count=records, seed=1)
    builder = ev.EventBuilder("bench", "bench-run")
    values = []
    for n, ledger in enumerate(plan_ledgers(spec)):
        stat = _Stat(1_000 + n, 1, builder.now_ms(), 200)
        upserted = ev.ledger_upserted(ledger.ledger_id, planned_metadata(ledger, spec), stat, ledger_path(n))
        values.append(ev.encode_event(builder.build(upserted)))
    now_us = time.time_ns() // 1_000 + 1_000_000
    return pa.record_batch(
        {
            "key": pa.array([b"ledger"] * records, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "topic": pa.array(["bkaudit.changes"] * records),
            "partition": pa.array([n % 8 for n in range(records)], pa.int32()),
            "offset": pa.array(range(records), pa.int64()),
            "timestamp": pa.array([now_us] * records, pa.timestamp("us", tz="UTC")),
        }
    )


def per_record(batch: Any) -> Any:
    """The decoder one record at a time, rows to Arrow at the end (its form before the columnar one)."""
    import pyarrow as pa

    from core.domain.rules.event_time import receiving_clock_ms
    from streaming.decode import ARROW_CHANGE_SCHEMA, decode_record

    rows = []
    columns = [batch.column(name).to_pylist() for name in ("key", "value", "topic", "partition", "offset")]
    kafka_ms = [us // 1000 for us in batch.column("timestamp").cast(pa.int64()).to_pylist()]
    for key, value, topic, partition, offset, received in zip(*columns, kafka_ms, strict=True):
        received_ms = receiving_clock_ms(received, None)
        row = decode_record(
            key,
            value,
            topic,
            partition,
            offset,
            feedback_topic=FEEDBACK,
            received_ms=received_ms,
            max_event_time_skew_s=300,
        )
        row["watermark_time"] = row["event_time"] if row["kind"] != "dead_letter" else None
        rows.append(row)
    return pa.RecordBatch.from_pylist(rows, schema=ARROW_CHANGE_SCHEMA)


def columnar(batch: Any) -> Any:
    from streaming.decode import decode_batches

    (decoded,) = decode_batches(iter([batch]), FEEDBACK, max_event_time_skew_s=300)
    return decoded


def run(records: int, bookies: int, racks: int, repeats: int) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "records": records,
        "bookies": bookies,
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    batch = source_batch(records, bookies, racks)
    figures["bytes_per_record"] = round(batch.column("value").nbytes / records)
    seconds: dict[str, list[float]] = {"per_record": [], "columnar": []}
    results = {}
    for _ in range(repeats):
        for name, form in (("per_record", per_record), ("columnar", columnar)):
            started = time.perf_counter()
            results[name] = form(batch)
            seconds[name].append(time.perf_counter() - started)
    for name, values in seconds.items():
        us = [s / records * 1e6 for s in values]
        figures[f"{name}_us"] = {"p50": round(statistics.median(us), 2), "min": round(min(us), 2)}
    figures["speedup_p50"] = round(figures["per_record_us"]["p50"] / figures["columnar_us"]["p50"], 2)
    decoded = results["columnar"]
    figures["upserts"] = decoded.column("kind").to_pylist().count("ledger_upserted")
    figures["identical"] = decoded.equals(results["per_record"])
    figures["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return figures


@pytest.mark.benchmark
def test_decode_figures() -> None:
    figures = run(records=5_000, bookies=100, racks=10, repeats=1)
    assert figures["identical"] and figures["upserts"] == 5_000
    print(json.dumps(figures))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--bookies", type=int, default=100)
    parser.add_argument("--racks", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(run(args.records, args.bookies, args.racks, args.repeats)))
