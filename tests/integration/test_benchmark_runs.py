"""The stream benchmark still runs end to end (small, sink-only): a refactor that breaks the benchmark's
hooks into the job fails here, not in the next measurement session. No figure is asserted: speed lives in
the benchmark's own JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_stream.py"


def run_bench(tmp_path: Path, *arguments: str, timeout_s: float) -> tuple[dict, str]:
    """Run bench_stream.py with ``arguments``; its last line's figures and its whole output."""
    command = [sys.executable, str(BENCH), *arguments, "--state-dir", str(tmp_path / "state")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stdout


def test_the_sink_only_stream_benchmark_runs_and_ends_with_its_json_line(tmp_path: Path) -> None:
    figures, _ = run_bench(
        tmp_path,
        *("--sink-only", "--ledgers", "2000", "--bookies", "6", "--racks", "3", "--losses", "1"),
        *("--alert-batch-sizes", "262144"),
        timeout_s=300,
    )
    assert figures["ledgers"] == 2000 and figures["bookies"] == 6
    assert len(figures["loss_to_last_alert_s"]) == 1 and figures["loss_to_last_alert_s"][0] is not None
    assert figures["alerts_per_loss"][0] > 0  # every ledger of the lost bookie was alerted and acked


def test_the_replay_benchmark_runs_and_ends_with_its_json_line(tmp_path: Path) -> None:
    """``--replay``: the job alone under a recorded change stream; every offered change applied."""
    figures, output = run_bench(
        tmp_path,
        *("--replay", "--ledgers", "2000", "--bookies", "6", "--racks", "3", "--rate", "200"),
        *("--duration", "3", "--driver-memory", "1g", "--drain-timeout", "120"),
        # Short folds and a short baseline: the run's steps, not its figures, are what this test needs.
        *("--fold-interval-s", "2", "--baseline-settle-s", "3"),
        timeout_s=600,
    )
    assert figures["mode"] == "replay" and figures["ledgers"] == 2000
    assert figures["offered_per_s"] > 0 and figures["applied_per_s"] > 0
    assert figures["lag_p99_s"] is not None and figures["snapshot_ingest_s"] is not None
    assert '"applied": 600' in output  # all 3 s × 200/s changes applied (the document before the line)
