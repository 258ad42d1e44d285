"""Integration fixtures shared by several modules: one real ``bkaudit demo`` run.

``demo_run`` (session) runs the ``bkaudit demo --tls --json`` command once, in a process of its own as a
user would (its own JVM, so its console is what a user sees), in a temporary directory with its own dev
state directory (so its own embedded ZooKeeper and real Kafka broker, TLS only with client certificates,
and simulated bookies behind START_TLS and a role, stopped at the end of the run), lakehouse, checkpoint and
log roots, all given with the global ``--set``. The summary holds the simulator's ground truth by id; the
Delta tables stay for the query and notebook tests. The simulated cluster's ledger password is fixed, and
every port of the embedded services is probed before they stop (:mod:`tests.integration.demo_process`).
The plaintext demo runs on real bookies in ``test_demo_real.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from core.settings import Settings

DEMO_PASSWORD = b"demo-ledger-password-9d2e"


@dataclass(frozen=True)
class DemoRun:
    settings: Settings  # the settings the demo ran with
    summary: dict[str, Any]  # its summary: open alerts, ground truth by id, who played which part
    lakehouse: Path  # the demo's Delta tables
    narration: str  # everything it printed on stdout before the summary
    console: str  # everything it printed, stdout then stderr
    log_file: Path  # where the logs of Spark, py4j and the clients went
    seconds: float
    clusters_with_known_password: int  # simulated clusters built with DEMO_PASSWORD (the demo builds one)
    # Every port of the embedded services, probed before the demo stopped them (demo_process.main).
    listeners: dict[str, Any]


def _as_set_options(settings: Settings, keys: list[str]) -> list[str]:
    """``--set key=value`` for each dotted key, the value as its environment variable would carry it."""
    options = []
    for key in keys:
        value: Any = settings
        for part in key.split("."):
            value = getattr(value, part)
        text = (
            json.dumps(value)
            if isinstance(value, dict)
            else str(value).lower()
            if isinstance(value, bool)
            else str(value)
        )
        options += ["--set", f"{key}={text}"]
    return options


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    from connectors.devcluster import DevCluster

    root = tmp_path_factory.mktemp("demo")
    settings = Settings(
        dev={"state_dir": root / "state", "tls": True, "broker": "kafka"},  # what --tls sets
        lakehouse_root=root / "lakehouse",
        checkpoint_root=root / "checkpoints",
        log_dir=root / "logs",
        # A consumer property on every client: each producer logs one CONFWARN line at start, so the
        # Kafka clients' logger has something to say (it goes to the log file, never to the console).
        kafka={"extra_config": {"fetch.wait.max.ms": "500"}},
        spark={
            "master": os.environ.get("BKAUDIT_TEST_SPARK_MASTER", "local[2]"),
            "shuffle_partitions": 2,
            "ui_enabled": False,
            "driver_memory": "1g",
            "extra_conf": {"spark.sql.adaptive.enabled": "false"},
        },
    )
    keys = [
        "dev.state_dir",
        "lakehouse_root",
        "checkpoint_root",
        "log_dir",
        "kafka.extra_config",
        "spark.master",
        "spark.shuffle_partitions",
        "spark.ui_enabled",
        "spark.driver_memory",
        "spark.extra_conf",
    ]
    report = root / "demo-process.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKAUDIT_")}
    command = [sys.executable, "-m", "tests.integration.demo_process", DEMO_PASSWORD.decode(), str(report)]
    started = time.monotonic()
    try:
        done = subprocess.run(
            [
                *command,
                *_as_set_options(settings, keys),
                "demo",
                "--bookkeeper",
                "simulator",
                "--tls",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        narration, _, summary_line = done.stdout.rstrip("\n").rpartition("\n")
        summary = json.loads(summary_line)
        probed = json.loads(report.read_text())
        yield DemoRun(
            settings=settings,
            summary=summary,
            lakehouse=Path(summary["lakehouse"]),
            narration=narration,
            console=done.stdout + done.stderr,
            log_file=settings.log_dir / "demo.log",
            seconds=round(time.monotonic() - started, 1),
            clusters_with_known_password=probed["clusters_with_known_password"],
            listeners=probed["listeners"],
        )
    finally:
        DevCluster(settings.dev).down()  # the demo stops them; this is for a run that failed half-way
