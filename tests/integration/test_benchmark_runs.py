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


def test_the_sink_only_stream_benchmark_runs_and_ends_with_its_json_line(tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(BENCH),
        "--sink-only",
        "--ledgers", "2000",
        "--bookies", "6",
        "--racks", "3",
        "--losses", "1",
        "--alert-batch-sizes", "262144",
        "--state-dir", str(tmp_path / "state"),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["ledgers"] == 2000 and figures["bookies"] == 6
    assert len(figures["loss_to_last_alert_s"]) == 1 and figures["loss_to_last_alert_s"][0] is not None
    assert figures["alerts_per_loss"][0] > 0  # every ledger of the lost bookie was alerted and acked
