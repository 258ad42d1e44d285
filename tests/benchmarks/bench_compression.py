"""Benchmark: the Parquet codec of the tables that grow with churn, side by side.

Under steady churn the lakehouse grows by ``ledger_changes`` (one whole ledger row per change) and
``ledger_bookies`` (one row per bookie of each new version, with the ledger's rule columns copied), and
``ledgers`` is rewritten bucket by bucket. This writes the same synthetic rows
(:func:`tests.benchmarks.bench_ledger_buckets.synthetic_ledgers`) into fresh Delta tables with each codec
in ``--codecs``, the way the job writes them: ``--appends`` appends of ``--rows``/``--appends`` changes to
``ledger_changes``, the same changes' index rows appended to ``ledger_bookies`` (partitioned by bookie),
and all rows written once to ``ledgers`` (partitioned in 256 buckets). Per codec and table: MB on disk, and
the CPU seconds of the writes and of reading everything back; codecs alternate, ``--rounds`` times, and
the medians are kept. Ends with one JSON line (with the load average).

Run: ``python tests/benchmarks/bench_compression.py --rows 200000 --codecs SNAPPY,ZSTD``.

Example:
    >>> parse_codec("ZSTD:3"), parse_codec("SNAPPY")
    (('ZSTD', 3), ('SNAPPY', None))
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa


def parse_codec(text: str) -> tuple[str, int | None]:
    name, _, level = text.partition(":")
    return name.upper(), int(level) if level else None


def _mb(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*.parquet")) / 1e6, 2)


def _write_all(root: Path, codec: tuple[str, int | None], rows: pa.Table, appends: int) -> dict[str, float]:
    from deltalake import WriterProperties, write_deltalake

    from connectors.delta.tables import (
        LEDGER_CHANGES,
        LEDGERS,
        conform_to,
        index_rows_of_versions,
    )

    name, level = codec
    properties = WriterProperties(compression=name, compression_level=level)  # type: ignore[arg-type]
    cpu: dict[str, float] = {}

    def timed(table: str, write: Any) -> None:
        began = time.process_time()
        write()
        cpu[table] = cpu.get(table, 0.0) + time.process_time() - began

    size = -(-rows.num_rows // appends)
    for n in range(appends):
        part = rows.slice(n * size, size)
        changes = conform_to(part, LEDGERS.schema).append_column(
            "batch_id", pa.array(np.full(part.num_rows, n, np.int64))
        )
        timed(
            "ledger_changes",
            lambda c=changes: write_deltalake(
                root / "ledger_changes",
                conform_to(c, LEDGER_CHANGES.schema),
                mode="append",
                writer_properties=properties,
            ),
        )
        index = index_rows_of_versions(conform_to(part, LEDGERS.schema))
        timed(
            "ledger_bookies",
            lambda i=index: write_deltalake(
                root / "ledger_bookies",
                i,
                mode="append",
                partition_by=["bookie"],
                writer_properties=properties,
            ),
        )
    whole = conform_to(rows, LEDGERS.schema)
    whole = whole.set_column(
        whole.schema.get_field_index("ledger_bucket"),
        "ledger_bucket",
        pa.array((whole.column("ledger_id").to_numpy() % 256).astype(np.int32)),
    )
    timed(
        "ledgers",
        lambda: write_deltalake(
            root / "ledgers",
            whole,
            mode="append",
            partition_by=["ledger_bucket"],
            writer_properties=properties,
        ),
    )
    return cpu


def _read_cpu(root: Path) -> dict[str, float]:
    from deltalake import DeltaTable

    cpu = {}
    for table in ("ledger_changes", "ledger_bookies", "ledgers"):
        began = time.process_time()
        DeltaTable(str(root / table)).to_pyarrow_table()
        cpu[table] = time.process_time() - began
    return cpu


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.benchmarks.bench_ledger_buckets import synthetic_ledgers

    rows = synthetic_ledgers(args.rows)
    codecs = [parse_codec(c) for c in args.codecs.split(",") if c]
    samples: dict[str, dict[str, list[Any]]] = {}
    for _ in range(args.rounds):
        for codec in codecs:
            label = codec[0] + (f":{codec[1]}" if codec[1] is not None else "")
            root = Path(tempfile.mkdtemp(prefix="bkaudit-bench-codec-"))
            try:
                write = _write_all(root, codec, rows, args.appends)
                read = _read_cpu(root)
                mine = samples.setdefault(label, {})
                for table in write:
                    mine.setdefault(f"{table}_mb", []).append(_mb(root / table))
                    mine.setdefault(f"{table}_write_cpu_s", []).append(write[table])
                    mine.setdefault(f"{table}_read_cpu_s", []).append(read[table])
            finally:
                shutil.rmtree(root, ignore_errors=True)
    return {
        "rows": args.rows,
        "appends": args.appends,
        "rounds": args.rounds,
        "by_codec": {
            label: {name: round(statistics.median(values), 3) for name, values in figures.items()}
            for label, figures in samples.items()
        },
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--appends", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--codecs", default="SNAPPY,ZSTD:1,ZSTD:3")
    print(json.dumps(run(parser.parse_args())))


if __name__ == "__main__":
    main()
