"""`bkaudit status` when Kafka and ZooKeeper do not answer: it still reports what the lock and the tables say,
at once, and exits 3 (bkaudit cannot vouch for the cluster).

No broker and no ZooKeeper run here on purpose (an unreachable address is the case under test); the
checkpoint lock is a real ``flock`` seen through the kernel's lock table, as with a running job.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from streaming.checkpoint_lock import CheckpointLock

# --config and --set act through the environment of the process: each test gets it back as it was.
pytestmark = pytest.mark.usefixtures("restored_environment")


def status(cli: Any, root: Path, *extra: str) -> Any:
    settings = {
        "kafka.bootstrap_servers": "127.0.0.1:1",
        "kafka.request_timeout_ms": "1000",
        "zookeeper.connect": "127.0.0.1:1",
        "zookeeper.connect_timeout_s": "1",
        "lakehouse_root": str(root / "lakehouse"),
        "checkpoint_root": str(root / "checkpoints"),
        "stream.app_id": "offline",
    }
    options = [part for key, value in settings.items() for part in ("--set", f"{key}={value}")]
    return cli(*options, "status", *extra)


def test_without_kafka_the_watcher_is_unknown_and_a_stream_without_a_lock_is_down(cli: Any, tmp_path: Path):
    started = time.monotonic()
    result = status(cli, tmp_path, "--format", "json")
    assert result.exit_code == 3, result.stderr
    assert time.monotonic() - started < 10  # Kafka's and ZooKeeper's 1 s waits run side by side
    report = result.json()
    assert "127.0.0.1:1" in report["autorecovery"]["error"] and report["autorecovery"]["auditor"] is None
    assert report["watcher"]["state"] == "unknown" and "did not answer" in report["watcher"]["detail"]
    assert report["stream"]["state"] == "down" and report["stream"]["lag_s"] is None
    assert not report["healthy"] and "no lakehouse at" in report["error"]


def test_a_job_holding_its_checkpoint_is_up_with_an_unknown_lag(cli: Any, tmp_path: Path):
    checkpoint = tmp_path / "checkpoints" / "offline"
    checkpoint.mkdir(parents=True)
    with CheckpointLock(checkpoint):
        report = status(cli, tmp_path, "--format", "json").json()
        table = status(cli, tmp_path).text.splitlines()
    assert report["stream"]["state"] == "up" and report["stream"]["holder"]["pid"] == os.getpid()
    assert "lag unknown (Kafka did not answer)" in report["stream"]["detail"]
    assert table[2].split()[:2] == ["watcher", "unknown"] and table[3].split()[:2] == ["stream", "up"]
    assert status(cli, tmp_path, "--format", "json").json()["stream"]["state"] == "down"  # released


def test_as_a_process_it_prints_the_report_and_nothing_else(tmp_path: Path):
    """The Kafka client's retry lines would only repeat what the report says."""
    options = ["--set", "kafka.bootstrap_servers=127.0.0.1:1", "--set", "kafka.request_timeout_ms=1000"]
    options += ["--set", "zookeeper.connect=127.0.0.1:1", "--set", "zookeeper.connect_timeout_s=1"]
    options += ["--set", f"lakehouse_root={tmp_path}", "--set", f"checkpoint_root={tmp_path}"]
    done = subprocess.run(
        [sys.executable, "-m", "bkaudit.cli.main", *options, "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3 and done.stderr == "", done.stderr
    assert done.stdout.splitlines()[2].split()[:2] == ["watcher", "unknown"]
