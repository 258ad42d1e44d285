"""`bkaudit status` against a running auditor: healthy, stream lagging, stream down, watcher down.

One stack for the module (simulator → ZooKeeper → watcher → broker → job, the job holding its checkpoint
lock as `bkaudit stream` does), taken down piece by piece in file order; each test first brings the stack
to the state it names, so a test run alone still sees that state. The command runs in-process through the
CLI's entry point with the global ``--config`` (a JSON file of the stack's settings).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bkaudit.cli.main import run
from bkaudit.sim.cluster import SIM_AUDITOR_ID, SimulatedCluster
from connectors.delta.tables import read_table
from connectors.kafka.topics import ensure_topic
from connectors.zookeeper.watcher import ChangeWatcher
from core.settings import Settings
from streaming import job

pytestmark = pytest.mark.integration

HEARTBEAT_TIMEOUT_S = 3.0
MAX_LAG_S = 3.0


@dataclass
class Stack:
    settings: Settings
    config: Path
    cluster: SimulatedCluster
    watcher: ChangeWatcher
    query: Any
    sink: Any
    lock: contextlib.ExitStack
    stopped: set[str] = field(default_factory=set)

    def status(self, *extra: str) -> tuple[int, str]:
        """Run ``bkaudit --config <stack> status ...`` in this process; (exit code, stdout)."""
        saved = dict(os.environ)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                code = run(["--config", str(self.config), "status", *extra])
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return code, out.getvalue()

    def report(self) -> dict[str, Any]:
        """The JSON report, with the command's exit code under ``exit_code``."""
        code, text = self.status(
            "--format", "json", "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S), "--max-lag", str(MAX_LAG_S)
        )
        assert code in (0, 1, 3), text
        return {**json.loads(text), "exit_code": code}

    def wait_for(self, what: str, check: Callable[[dict[str, Any]], bool], timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        report = self.report()
        while not check(report):
            assert time.monotonic() < deadline, f"status never showed {what}: {report}"
            time.sleep(0.5)
            report = self.report()
        return report

    def stop_stream_queries(self) -> None:
        if "queries" not in self.stopped:
            job.stop_gracefully(self.query, self.sink, timeout_s=30)
            self.sink.close()
            self.stopped.add("queries")

    def release_checkpoint(self) -> None:
        self.stop_stream_queries()
        if "lock" not in self.stopped:
            self.lock.close()
            self.stopped.add("lock")

    def stop_watcher(self) -> None:
        if "watcher" not in self.stopped:
            self.watcher.stop()
            self.stopped.add("watcher")


@pytest.fixture(scope="module")
def stack(bk_services: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    hosts = bk_services.zookeeper_hosts(bk_services.new_chroot())
    cluster = SimulatedCluster(hosts, racks=2, bookie_session_timeout_s=2.0, lost_bookie_recovery_delay_s=0)
    cluster.init()
    for _ in range(4):
        cluster.add_bookie()
    for _ in range(4):
        cluster.create_ledger(entries=5, ensemble_size=2, write_quorum=2, ack_quorum=2)
    root = tmp_path_factory.mktemp("status")
    kafka = bk_services.kafka_settings(topic_partitions=2)
    ensure_topic(kafka, kafka.changes_topic, partitions=2)
    settings = Settings(
        zookeeper={"connect": hosts},
        kafka=kafka,
        lakehouse_root=root / "lakehouse",
        checkpoint_root=root / "checkpoints",
        watcher={"heartbeat_interval_s": 0.5, "progress": "off"},
        stream={"app_id": "status-test", "ledger_state_buckets": 2},
    )
    config = root / "bkaudit.json"
    config.write_text(settings.model_dump_json(exclude={"spark"}))
    watcher = ChangeWatcher(settings)
    watcher.start()
    assert watcher.wait_for_snapshots(1, timeout_s=60)
    lock = contextlib.ExitStack()
    lock.enter_context(job.exclusive_checkpoint(settings))  # what `bkaudit stream` holds while it runs
    query, sink = job.start(spark, settings)
    built = Stack(settings, config, cluster, watcher, query, sink, lock)
    try:
        cluster.set_readonly(cluster.bookie_ids()[1])
        cluster.kill_bookie(cluster.bookie_ids()[0])
        yield built
    finally:
        built.release_checkpoint()
        built.stop_watcher()
        cluster.close()


def test_healthy_shows_both_up_with_the_open_alerts_and_bookies(stack: Stack):
    lost, readonly = stack.cluster.bookie_ids()[0], stack.cluster.bookie_ids()[1]

    def open_alerts_in_the_table() -> dict[str, int]:
        kinds = read_table(stack.settings.lakehouse_root, "open_alerts").column("kind").to_pylist()
        return {kind: kinds.count(kind) for kind in set(kinds)}

    # The sink commits its tables one after another, and the ledgers' alerts may follow the bookie's: wait
    # until the report and the table agree (read after it, so a commit in between means one more look).
    report = stack.wait_for(
        "the lost bookie and the table's open alerts",
        lambda r: (
            r["lost_bookies"] == [lost]
            and r["read_only_bookies"] == [readonly]
            and r["healthy"]
            and len(r["stream"]["lanes"]) == 2
            and "BOOKIE_LOST" in r["open_alerts"]
            and r["open_alerts"] == open_alerts_in_the_table()
        ),
    )
    assert report["watcher"]["state"] == "up" and report["watcher"]["lag_s"] <= HEARTBEAT_TIMEOUT_S
    assert report["stream"]["state"] == "up" and report["stream"]["lag_s"] <= MAX_LAG_S, report["stream"]
    assert {lane["lane"] for lane in report["stream"]["lanes"]} == {"ledgers", "membership"}
    assert report["stream"]["holder"]["pid"] == os.getpid()
    assert report["open_alerts"]["BOOKIE_LOST"] == 1
    assert report["watcher"]["last_seen"].endswith("Z")  # RFC 3339 UTC

    # bkaudit is up; the cluster is not (a lost bookie): exit 1. AutoRecovery is as the simulator set it.
    assert report["exit_code"] == 1
    assert report["autorecovery"] == {"auditor": SIM_AUDITOR_ID, "enabled": True, "recovery_delay_s": 0}
    code, table = stack.status()  # the human view
    assert code == 1
    assert f"autorecovery: on; Auditor {SIM_AUDITOR_ID}; lostBookieRecoveryDelay 0 s" in table.splitlines()
    lines = table.splitlines()
    assert lines[0].split() == ["component", "state", "last_seen", "lag_s", "detail"]
    assert lines[2].split()[:2] == ["watcher", "up"] and lines[3].split()[:2] == ["stream", "up"]
    assert f"lost bookies: {lost}" in lines and f"read-only bookies: {readonly}" in lines
    assert any(line.startswith("open alerts: ") and "BOOKIE_LOST 1" in line for line in lines), (
        table,
        report,
    )


def test_autorecovery_switched_off_and_no_auditor_are_shown(stack: Stack):
    stack.cluster.set_autorecovery(False)
    stack.cluster.set_auditor(False)
    try:
        report = stack.wait_for("AutoRecovery off", lambda r: r["autorecovery"]["enabled"] is False)
        assert report["autorecovery"]["auditor"] is None and report["exit_code"] == 1
        _, table = stack.status()
        assert "autorecovery: OFF (disable znode present); no Auditor elected" in table
    finally:
        stack.cluster.set_autorecovery(True)
        stack.cluster.set_auditor(True)


def test_a_stream_that_holds_its_checkpoint_but_reads_nothing_is_lagging(stack: Stack):
    stack.stop_stream_queries()  # the job's process lives on (the lock is held) but no batch runs
    report = stack.wait_for("the stream lagging", lambda r: r["stream"]["state"] == "lagging")
    assert report["stream"]["lag_s"] > MAX_LAG_S and report["stream"]["lag_records"] > 0
    assert report["watcher"]["state"] == "up" and not report["healthy"]
    assert report["exit_code"] == 3  # bkaudit cannot vouch for the cluster


def test_a_stream_without_a_job_on_its_checkpoint_is_down(stack: Stack):
    stack.release_checkpoint()
    report = stack.report()
    assert report["stream"]["state"] == "down", report["stream"]
    assert report["stream"]["holder"]["alive"] is False and "no job holds" in report["stream"]["detail"]
    assert report["watcher"]["state"] == "up" and report["exit_code"] == 3


def test_a_silent_watcher_is_down(stack: Stack):
    stack.stop_watcher()
    report = stack.wait_for("the watcher down", lambda r: r["watcher"]["state"] == "down", timeout=30)
    assert report["watcher"]["lag_s"] > HEARTBEAT_TIMEOUT_S and not report["healthy"]
    assert report["exit_code"] == 3
