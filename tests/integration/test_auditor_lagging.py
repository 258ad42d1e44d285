"""AUDITOR_LAGGING end to end: simulator → real ZooKeeper → watcher → broker → the job → Delta + alerts.

A bookie is lost and the simulated Auditor, elected from the start, never marks its ledgers (the simulator
marks nothing by itself). Once the oldest at-risk ledger has gone unmarked for the grace (3 s of event
time), the job fires one ``AUDITOR_LAGGING`` for the cluster, naming the unmarked ledgers, as the ground
truth and ``bkaudit query auditor-diff`` (the same test) say. When the simulator writes the marks, they
travel as the job's marks do (ledger lane, timers query, sink) and the alert resolves with the same id.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from bkaudit.sim.cluster import SimulatedCluster
from bkaudit.sim.truth import TruthParameters
from connectors.delta.queries import Lakehouse
from connectors.delta.tables import read_table
from connectors.kafka.topics import ensure_topic
from core.domain.rules.autorecovery import AutoRecoveryGraces
from core.settings import Settings
from tests.integration.event_fixtures import alerts_on
from tests.integration.test_end_to_end import Stack, start_stack, stop_stack

pytestmark = pytest.mark.integration

GRACE_S = 3.0
KIND = "AUDITOR_LAGGING"
AT_RISK = ("LEDGER_UNDER_REPLICATED", "LEDGER_UNRECOVERABLE")


@pytest.fixture
def stack(bk_services: Any, spark: Any, tmp_path: Path) -> Iterator[Stack]:
    chroot = bk_services.new_chroot()
    hosts = bk_services.zookeeper_hosts(chroot)
    cluster = SimulatedCluster(hosts, racks=3, bookie_session_timeout_s=2.0, lost_bookie_recovery_delay_s=0)
    cluster.init()
    for _ in range(4):
        cluster.add_bookie()
    for _ in range(6):
        cluster.create_ledger(entries=4)
    kafka = bk_services.kafka_settings(topic_partitions=2)
    ensure_topic(kafka, kafka.changes_topic, partitions=2)
    settings = Settings(
        zookeeper={"connect": hosts, "session_timeout_s": 10},
        kafka=kafka,
        lakehouse_root=tmp_path / "lakehouse",
        checkpoint_root=tmp_path / "checkpoints",
        watcher={"heartbeat_interval_s": 0.5, "rack_map_znode": "/bookies", "progress": "off"},
        stream={"watermark_delay_s": 1.0, "auditor_lagging_grace_s": GRACE_S, "scrutiny_ledgers_per_s": 0},
    )
    built = start_stack(cluster, settings, spark)
    try:
        wait_until(
            lambda: (
                {r["ledger_id"] for r in read_table(settings.lakehouse_root, "ledgers").to_pylist()}
                == set(cluster.ledger_ids())
            ),
            120,
            "the job to ingest the START snapshot",
            built,
        )
        yield built
    finally:
        stop_stack(built)


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str, stack: Stack) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert stack.query.exception() is None, stack.query.exception()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def lagging(stack: Stack) -> list[dict[str, Any]]:
    return [alert for _, alert in alerts_on(stack.settings.kafka, 5) if alert["kind"] == KIND]


def at_risk(stack: Stack) -> set[int]:
    rows = read_table(stack.settings.lakehouse_root, "open_alerts").to_pylist()
    return {row["ledger_id"] for row in rows if row["kind"] in AT_RISK}


def unmarked_listed(stack: Stack) -> set[int]:
    diff = Lakehouse(stack.settings.lakehouse_root).auditor_diff(grace_s=GRACE_S).to_pylist()
    return {row["ledger_id"] for row in diff if row["diff"] == "at_risk_unmarked"}


def assert_truth_agrees(stack: Stack, *, fired: bool) -> None:
    """What the ground truth requires fired, and what fired it requires or allows (near the deadline)."""
    params = TruthParameters(autorecovery=AutoRecoveryGraces(lagging_s=GRACE_S))
    truth = stack.cluster.ground_truth(params=params)
    required, allowed = set(truth["alerts"][KIND]), set(truth["may_alert"][KIND])
    found = {"auditor-lag"} if fired else set()
    assert required <= found <= required | allowed, truth


def ms(rfc3339: str) -> int:
    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)


def test_a_lost_bookies_ledgers_left_unmarked_fire_auditor_lagging_until_the_marks_are_written(
    stack: Stack,
) -> None:
    cluster = stack.cluster
    bookie = cluster.bookie_ids()[0]
    cluster.kill_bookie(bookie)
    wait_until(lambda: len(lagging(stack)) == 1, 90, "AUDITOR_LAGGING to fire", stack)
    (fired,) = lagging(stack)
    risky = at_risk(stack)
    assert risky, "the lost bookie holds some ledgers"
    assert fired["state"] == "firing" and fired["severity"] == "warning" and fired["ledger_id"] is None
    detail = fired["detail"]
    assert detail["unmarked_ledgers"] == len(risky) and set(detail["sample_ledger_ids"]) == risky
    assert ms(fired["detected_at"]) - detail["since_ms"] >= GRACE_S * 1000, fired
    assert unmarked_listed(stack) == risky  # the query's list, with the same grace
    assert_truth_agrees(stack, fired=True)

    for ledger_id in sorted(risky):
        cluster.mark_underreplicated(ledger_id, [bookie])
    wait_until(lambda: len(lagging(stack)) == 2, 90, "AUDITOR_LAGGING to resolve", stack)
    resolved = lagging(stack)[1]
    assert resolved["state"] == "resolved" and resolved["alert_id"] == fired["alert_id"]
    assert unmarked_listed(stack) == set()
    assert_truth_agrees(stack, fired=False)
    open_kinds = {row["kind"] for row in read_table(stack.settings.lakehouse_root, "open_alerts").to_pylist()}
    assert KIND not in open_kinds and "BOOKIE_LOST" in open_kinds
