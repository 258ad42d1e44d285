"""AutoRecovery health end to end: simulator → ``bkaudit watch`` → changes topic → the membership lane.

The simulator switches AutoRecovery off (``underreplication/disable``), drops its Auditor's election vote and
holds a replication lock, in a real ZooKeeper; the real watcher publishes AutoRecovery's state and the real
membership lane (the job's driver thread, no Spark needed) decides the alerts, publishes them and records
them in Delta. Each alert must fire only once its grace period has passed in event time, agree with the
simulator's ground truth, be listed by ``bkaudit query alerts``, and resolve (same alert id) when the
simulator clears the condition.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bkaudit.cli.main import run as run_cli
from bkaudit.sim.cluster import SIM_AUDITOR_ID, SimulatedCluster
from bkaudit.sim.truth import TruthParameters
from connectors.kafka.topics import ensure_topic
from connectors.zookeeper.watcher import ChangeWatcher
from core.domain.alerts import AlertKind
from core.domain.rules.autorecovery import AutoRecoveryGraces
from core.domain.underreplication import format_lock_data
from core.pb import change_events_pb2 as pb
from core.settings import Settings
from streaming.job import start_membership_lane
from streaming.sink import AuditSink, SinkConfig
from tests.integration.event_fixtures import alerts_on
from tests.integration.test_watcher import TopicReader, running_watcher, watcher_settings
from tests.integration.test_watcher_sim import SIM_PASSWORD, sim

__all__ = ["sim"]  # the simulator fixture, shared with the watcher's simulator tests

pytestmark = pytest.mark.integration

GRACES = AutoRecoveryGraces(disabled_s=1.5, auditor_missing_s=2.0, lock_held_s=2.5)
KINDS = ("AUTORECOVERY_DISABLED", "AUDITOR_MISSING", "REPLICATION_STALLED")


@pytest.fixture
def settings(bk_services: Any, kafka_settings: Any, zk_chroot: str, tmp_path: Path) -> Settings:
    ensure_topic(kafka_settings, kafka_settings.alerts_topic, 1)
    return Settings(
        zookeeper={"connect": bk_services.zookeeper_hosts(zk_chroot), "session_timeout_s": 4.0},
        kafka=kafka_settings.model_dump(),
        watcher={"heartbeat_interval_s": 0.2, "reconciliation_interval_s": 0},
        stream={
            "app_id": "autorecovery-test",
            "autorecovery_disabled_grace_s": GRACES.disabled_s,
            "auditor_missing_grace_s": GRACES.auditor_missing_s,
            "replication_lock_grace_s": GRACES.lock_held_s,
        },
        lakehouse_root=tmp_path / "lakehouse",
        checkpoint_root=tmp_path / "checkpoints",
    )


@pytest.fixture
def running(settings: Settings) -> Iterator[None]:
    """The watcher and the membership lane, running until the test ends."""
    sink = AuditSink(
        SinkConfig(
            lakehouse_root=Path(settings.lakehouse_root), app_id=settings.stream.app_id, kafka=settings.kafka
        )
    )
    watcher = ChangeWatcher(settings)
    watcher.start()
    lane = start_membership_lane(settings, sink, available_now=False)
    try:
        yield
    finally:
        lane.stop()
        watcher.stop(timeout_s=15)


def health_alerts(settings: Settings) -> list[dict[str, Any]]:
    return [alert for _, alert in alerts_on(settings.kafka) if alert["kind"] in KINDS]


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def ms(rfc3339: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)


def query_alerts(settings: Settings, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    code = run_cli(["query", "alerts", "--lakehouse", str(settings.lakehouse_root), "--format", "json"])
    assert code == 0
    return [row for row in json.loads(capsys.readouterr().out) if row["kind"] in KINDS]


def test_disable_no_auditor_and_a_stuck_lock_fire_after_their_grace_and_resolve_when_cleared(
    sim: SimulatedCluster, settings: Settings, running: None, capsys: pytest.CaptureFixture[str]
) -> None:
    for _ in range(3):
        sim.add_bookie()
    ledger = sim.create_ledger(entries=4)
    time.sleep(1.0)  # the start snapshot: a healthy AutoRecovery raises nothing
    assert health_alerts(settings) == []

    sim.set_autorecovery(False)
    sim.set_auditor(False)
    sim.hold_lock(ledger, holder="worker-7")
    # None fires before its grace: checked in event time below (detected_at - since_ms), not wall time.

    wait_until(lambda: len(health_alerts(settings)) == 3, 20, "the three alerts to fire")
    fired = {alert["kind"]: alert for alert in health_alerts(settings)}
    assert all(alert["state"] == "firing" for alert in fired.values())
    for kind, alert in fired.items():
        grace_ms = GRACES.grace_ms(AlertKind(kind))
        assert ms(alert["detected_at"]) - alert["detail"]["since_ms"] >= grace_ms, alert
    stalled = fired["REPLICATION_STALLED"]
    assert stalled["ledger_id"] == ledger and stalled["detail"]["holder"] == "worker-7"
    assert fired["AUTORECOVERY_DISABLED"]["ledger_id"] is None

    # The ground truth agrees: what it requires fired, and what fired it requires or allows (near a deadline).
    truth = sim.ground_truth(params=TruthParameters(autorecovery=GRACES))
    found = {
        "AUTORECOVERY_DISABLED": ["autorecovery"],
        "AUDITOR_MISSING": ["auditor"],
        "REPLICATION_STALLED": [ledger],
    }
    for kind in KINDS:
        required, allowed = set(truth["alerts"][kind]), set(truth["may_alert"][kind])
        assert required <= set(found[kind]) <= required | allowed, kind

    listed = query_alerts(settings, capsys)
    assert sorted(row["kind"] for row in listed) == sorted(KINDS)
    assert {row["alert_id"] for row in listed} == {alert["alert_id"] for alert in fired.values()}

    sim.set_autorecovery(True)
    sim.set_auditor(True)
    sim.release_lock(ledger)
    wait_until(lambda: len(health_alerts(settings)) == 6, 20, "the three alerts to resolve")
    resolved = {a["kind"]: a for a in health_alerts(settings) if a["state"] == "resolved"}
    assert {kind: a["alert_id"] for kind, a in resolved.items()} == {
        kind: a["alert_id"] for kind, a in fired.items()
    }
    assert query_alerts(settings, capsys) == []
    truth = sim.ground_truth(params=TruthParameters(autorecovery=GRACES))
    assert all(truth["alerts"][kind] == [] for kind in KINDS)


# ---------------------------------------------------------------------------------------- the watcher


def last_state(reader: TopicReader) -> pb.AutoRecoveryState | None:
    found = reader.events("auto_recovery_state")
    return found[-1].auto_recovery_state if found else None


def wait_for_state(
    reader: TopicReader, check: Callable[[pb.AutoRecoveryState], bool]
) -> pb.AutoRecoveryState:
    reader.wait_for(lambda _: (state := last_state(reader)) is not None and check(state))
    state = last_state(reader)
    assert state is not None
    return state


@pytest.mark.parametrize("watch_mode", ["persistent", "fallback"])
def test_the_watcher_publishes_autorecovery_state_as_it_changes(
    bk_services: Any,
    kafka_settings: Any,
    zk_chroot: str,
    zk_client: Any,
    sim: SimulatedCluster,
    watch_mode: str,
) -> None:
    ledger = sim.create_ledger(entries=0) if sim.add_bookie() and sim.add_bookie() and sim.add_bookie() else 0
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot, watch_mode=watch_mode)
    with running_watcher(settings, SIM_PASSWORD) as (watcher, reader):
        assert watcher.wait_for_snapshots(1, 30)
        start = wait_for_state(reader, lambda s: len(s.votes) == 1)
        assert not start.disabled and start.votes[0].bookie_id == SIM_AUDITOR_ID and not start.locks

        sim.set_autorecovery(False)
        disabled = wait_for_state(reader, lambda s: s.disabled)
        assert disabled.disabled_ctime_ms == zk_client.exists(sim.underreplication.disable).ctime
        sim.set_auditor(False)
        wait_for_state(reader, lambda s: not s.votes)
        sim.hold_lock(ledger, holder="worker-3")
        locked = wait_for_state(reader, lambda s: len(s.locks) == 1)
        lock_stat = zk_client.exists(sim.underreplication.lock(ledger))
        assert (locked.locks[0].ledger_id, locked.locks[0].holder) == (ledger, "worker-3")
        assert locked.locks[0].ctime_ms == lock_stat.ctime and locked.disabled and not locked.votes

        # A lock whose data does not decode: reported without a holder, the reason without the bytes.
        zk_client.create(sim.underreplication.lock(ledger + 1), b"\xffsecret-ish", ephemeral=True)
        odd = wait_for_state(reader, lambda s: len(s.locks) == 2)
        assert odd.locks[1].holder == "" and odd.error and "secret-ish" not in odd.error

        zk_client.delete(sim.underreplication.lock(ledger + 1))
        sim.release_lock(ledger)
        sim.set_auditor(True)
        sim.set_autorecovery(True)
        healthy = wait_for_state(reader, lambda s: not s.disabled and len(s.votes) == 1 and not s.locks)
        assert healthy.votes[0].bookie_id == SIM_AUDITOR_ID and not healthy.error


def test_a_burst_of_replication_locks_is_read_once_per_chunk_not_once_per_lock(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, zk_client: Any, sim: SimulatedCluster
) -> None:
    """ReplicationWorkers take and drop a lock per ledger: reading every lock on each notification would
    cost the square of the locks. 300 locks created in one transaction reach the watcher as 300
    notifications back to back, all on its socket before the answer to its first read: at most a few
    reads of AutoRecovery's znodes follow (300 without the coalescing)."""
    locks = 300
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot, watch_mode="persistent")
    with running_watcher(settings, SIM_PASSWORD) as (watcher, reader):
        assert watcher.wait_for_snapshots(1, 30)
        wait_for_state(reader, lambda s: not s.locks)
        reads = watcher.metrics.zookeeper_reads.labels("autorecovery")
        before = reads._value.get()
        zk_client.ensure_path(sim.underreplication.locks)
        transaction = zk_client.transaction()
        for ledger_id in range(1, locks + 1):
            data = format_lock_data(f"worker-{ledger_id % 7}").encode()
            transaction.create(sim.underreplication.lock(ledger_id), data, ephemeral=True)
        assert all(result is True or isinstance(result, str) for result in transaction.commit())
        held = wait_for_state(reader, lambda s: len(s.locks) == locks)
        assert [lock.ledger_id for lock in held.locks] == list(range(1, locks + 1))
        print(f"\n{locks} locks: {reads._value.get() - before:.0f} reads of AutoRecovery's znodes")
        assert reads._value.get() - before <= 5, reads._value.get() - before
