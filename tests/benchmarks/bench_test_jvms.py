"""The CPU a short-lived Spark driver costs under each set of JVM options the suite could give it.

The suite is CPU-bound on two cores, and Spark drivers are its largest consumer (one per pytest worker,
one per ``bkaudit stream`` a test starts). Each run here is a child Python process that starts a local
Spark session the way the suite does (``build_spark_session(for_tests=True)``), runs one SQL aggregation
and one Arrow UDF, and stops. This process is a child subreaper, so the JVM (which the child does not
wait for) is reaped here and its CPU counted. Variants alternate, ``--repeats`` rounds.

Prints one JSON line: per variant, the CPU seconds (user + system, the child and its JVM and workers) and
the wall seconds of each run, their medians, and the load average before and after.

Example:
    python tests/benchmarks/bench_test_jvms.py --repeats 3
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bkaudit.testing.spark_archive import BASE_OPTIONS, DRIVER_RUN, build_archive, driver_options

PR_SET_CHILD_SUBREAPER = 36

VARIANTS: dict[str, str] = {
    "c1": "-XX:TieredStopAtLevel=1",
    "c1_serial_gc": " ".join(BASE_OPTIONS),
    "c1_serial_gc_cds": driver_options(Path("@ARCHIVE@")),  # the suite's drivers
}


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated, from: " + ", ".join(VARIANTS)
    )
    parser.add_argument("--archive", type=Path, default=Path("/tmp/bkaudit-bench-spark.jsa"))
    return parser.parse_args(argv)


def _reap_all() -> None:
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _run_once(options: str) -> tuple[float, float]:
    """One child run with ``SPARK_SUBMIT_OPTS=options``: (CPU seconds of it and its descendants, wall)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    env = {**os.environ, "SPARK_SUBMIT_OPTS": options}
    subprocess.run([sys.executable, "-c", DRIVER_RUN], env=env, check=True, capture_output=True)
    wall = time.monotonic() - started
    _reap_all()  # the run waits for its JVM; anything it left behind is ours to reap (we are its subreaper)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return round(cpu, 2), round(wall, 2)


def main(argv: list[str]) -> dict[str, object]:
    args = _parse_args(argv)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    options = {n: VARIANTS[n].replace("@ARCHIVE@", str(args.archive)) for n in names}
    figures: dict[str, object] = {"load_average_at_start": os.getloadavg()[0], "cpus": os.cpu_count()}
    if any("@ARCHIVE@" in VARIANTS[n] for n in names):
        args.archive.unlink(missing_ok=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        build_archive(args.archive)  # the suite's own build
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        figures["archive_build_cpu_s"] = round(
            after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2
        )
        figures["archive_mb"] = round(args.archive.stat().st_size / 2**20, 1)
    runs: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for _ in range(args.repeats):
        for name in names:
            runs[name].append(_run_once(options[name]))
    figures["variants"] = {
        name: {
            "options": options[name],
            "cpu_s": [c for c, _ in done],
            "wall_s": [w for _, w in done],
            "cpu_s_median": statistics.median(c for c, _ in done),
            "wall_s_median": statistics.median(w for _, w in done),
        }
        for name, done in runs.items()
    }
    figures["load_average_at_end"] = os.getloadavg()[0]
    return figures


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])), flush=True)
