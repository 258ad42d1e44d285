"""Two `bkaudit stream` on one checkpoint: the second is refused at start; a killed holder blocks nothing.

Real processes against the real broker, as in production: a first job runs (its own JVM); a second one
started on the same checkpoint exits 2 at once with one line naming the first (pid, host, start time) and
the checkpoint, before it builds a Spark session. Then the first is killed with SIGKILL, the lock is free at
once (the kernel drops it with the process, whatever the lock file still says), and a new job starts and
runs on the same checkpoint.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

APP_ID = "bkaudit-lock-test"
RUNNING = "bkaudit running: "
START_TIMEOUT_S = 400.0


def job_env(root: Path, kafka: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKAUDIT_")}
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    env.update(
        {
            "TMPDIR": str(root / "tmp"),
            "BKAUDIT_LAKEHOUSE_ROOT": str(root / "lakehouse"),
            "BKAUDIT_CHECKPOINT_ROOT": str(root / "checkpoints"),
            "BKAUDIT_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
            "BKAUDIT_KAFKA__CHANGES_TOPIC": kafka.changes_topic,
            "BKAUDIT_KAFKA__ALERTS_TOPIC": kafka.alerts_topic,
            "BKAUDIT_KAFKA__FEEDBACK_TOPIC": kafka.feedback_topic,
            "BKAUDIT_KAFKA__TOPIC_PARTITIONS": "1",
            "BKAUDIT_SPARK__MASTER": "local[1]",
            "BKAUDIT_SPARK__SHUFFLE_PARTITIONS": "1",
            "BKAUDIT_SPARK__UI_ENABLED": "false",
            "BKAUDIT_SPARK__DRIVER_MEMORY": "1g",
            "BKAUDIT_SPARK__EXTRA_CONF": json.dumps({"spark.local.dir": str(root / "tmp")}),
            "BKAUDIT_STREAM__APP_ID": APP_ID,
            "BKAUDIT_STREAM__LEDGER_STATE_BUCKETS": "2",
        }
    )
    return env


def start_job(root: Path, env: dict[str, str], name: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = root / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "bkaudit.cli.main", "stream"],
            env=env,
            cwd=root,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the driver, its JVM and workers in one group, cleaned up together
        )
    return process, log


def wait_running(process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if RUNNING in log.read_text(errors="replace"):
            return
        assert process.poll() is None, log.read_text(errors="replace")[-3000:]
        time.sleep(0.5)
    pytest.fail(f"the job did not start within {START_TIMEOUT_S:.0f} s: {log.read_text()[-3000:]}")


def kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=30)


def test_a_second_job_on_one_checkpoint_is_refused_and_a_killed_one_blocks_nothing(
    tmp_path: Path, kafka_settings: Any
) -> None:
    env = job_env(tmp_path, kafka_settings)
    checkpoint = tmp_path / "checkpoints" / APP_ID
    first, first_log = start_job(tmp_path, env, "first")
    third: subprocess.Popen[bytes] | None = None
    try:
        wait_running(first, first_log)
        story = first_log.read_text(errors="replace")
        waits = ["starting Spark (", "the Kafka topics", "opening the Delta tables", "timers query..."]
        said = [story.find(what) for what in waits]  # each wait said what it waits for, in order...
        assert -1 not in said and said == sorted(said) and said[-1] < story.find(RUNNING), story[-3000:]
        assert story.count(": done in ") >= len(waits), story[-3000:]  # ...and how long it took

        started = time.monotonic()
        second = subprocess.run(
            [sys.executable, "-m", "bkaudit.cli.main", "stream"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 2, second.stderr
        assert second.stderr.count("\n") == 1 and "Traceback" not in second.stderr, second.stderr
        assert second.stderr.startswith(f"bkaudit: checkpoint {checkpoint} is in use by pid {first.pid} ")
        assert f" on {socket.gethostname()} since 20" in second.stderr
        assert time.monotonic() - started < 60  # refused before any Spark session (seconds, not a minute)
        assert first.poll() is None  # the first one runs on, untouched

        os.kill(first.pid, signal.SIGKILL)  # the driver only: its JVM may outlive it for a moment
        first.wait(timeout=30)
        with (checkpoint / "bkaudit.lock").open("r+b") as lock_file:  # free at once, file left behind
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            assert json.loads(lock_file.read())["pid"] == first.pid
            fcntl.flock(lock_file, fcntl.LOCK_UN)
        kill_group(first)

        third, third_log = start_job(tmp_path, env, "third")
        wait_running(third, third_log)
        assert json.loads((checkpoint / "bkaudit.lock").read_text())["pid"] == third.pid
        third.send_signal(signal.SIGTERM)
        assert third.wait(timeout=120) == 0, third_log.read_text(errors="replace")[-3000:]
    finally:
        kill_group(first)
        if third is not None:
            kill_group(third)


def test_a_job_that_loses_its_zookeeper_lease_stops_with_one_line(
    tmp_path: Path, kafka_settings: Any, bk_services: Any, zk_chroot: str, zk_client: Any
) -> None:
    """``stream.lease = zookeeper``: the running job holds ``<lease_path>/<app_id>``; once the lease is gone
    (here its znode deleted by hand, which another job could then take) it stops, exit 2, with one line."""
    env = job_env(tmp_path, kafka_settings)
    env.update(
        {
            "BKAUDIT_STREAM__LEASE": "zookeeper",
            "BKAUDIT_ZOOKEEPER__CONNECT": bk_services.zookeeper_hosts(zk_chroot),
        }
    )
    lease = f"/bkaudit/leases/{APP_ID}"
    job, log = start_job(tmp_path, env, "leased")
    try:
        wait_running(job, log)
        holder = json.loads(zk_client.get(lease)[0])
        assert holder["pid"] == job.pid and holder["host"] == socket.gethostname()
        zk_client.delete(lease)
        assert job.wait(timeout=180) == 2, log.read_text(errors="replace")[-3000:]
        errors = [line for line in log.read_text().splitlines() if line.startswith("bkaudit: ")]
        assert errors == [
            f"bkaudit: the lease {lease} was lost (the lease znode was deleted): stopping before writing "
            "again; another job may hold the checkpoint now"
        ], log.read_text(errors="replace")[-3000:]
    finally:
        kill_group(job)
