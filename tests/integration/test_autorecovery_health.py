"""AutoRecovery health end to end: simulator → ``bkaudit watch`` → changes topic → the membership lane.

The simulator switches AutoRecovery off (``underreplication/disable``), drops its Auditor's election vote,
holds a replication lock and lets its Auditor's periodic checks fall overdue (``checkallledgersctime``), in a
real ZooKeeper; the real watcher publishes AutoRecovery's state and the real membership lane (the job's driver
thread, no Spark needed) decides the alerts, publishes them and records them in Delta. Each alert must fire
only once its grace period has passed in event time, agree with the simulator's ground truth, be listed by
``bkaudit query alerts``, and resolve (same alert id) when the simulator clears the condition.
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
from core.domain.underreplication import CtimeZnode, format_ctime, format_lock_data
from core.pb import change_events_pb2 as pb
from core.settings import Settings
from streaming.job import start_membership_lane
from streaming.sink import AuditSink, SinkConfig
from tests.integration.event_fixtures import alerts_on
from tests.integration.test_watcher import TopicReader, running_watcher, watcher_settings
from tests.integration.test_watcher_sim import SIM_PASSWORD, sim

__all__ = ["sim"]  # the simulator fixture, shared with the watcher's simulator tests

pytestmark = pytest.mark.integration

# The Auditor checks all ledgers every 3 s here, and its checks are overdue 2 s past that.
GRACES = AutoRecoveryGraces(
    disabled_s=1.5,
    auditor_missing_s=2.0,
    lock_held_s=2.5,
    checks_overdue_s=2.0,
    check_all_ledgers_interval_s=3.0,
)
KINDS = ("AUTORECOVERY_DISABLED", "AUDITOR_MISSING", "REPLICATION_STALLED")
CHECKS_OVERDUE = "AUDITOR_CHECKS_OVERDUE"


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
            "auditor_checks_overdue_grace_s": GRACES.checks_overdue_s,
            "auditor_periodic_check_interval_s": GRACES.check_all_ledgers_interval_s,
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


def overdue_alerts(settings: Settings) -> list[dict[str, Any]]:
    return [alert for _, alert in alerts_on(settings.kafka) if alert["kind"] == CHECKS_OVERDUE]


def assert_truth_agrees(sim: SimulatedCluster, *, fired: bool) -> None:
    """What the ground truth requires fired, and what fired it requires or allows (near a deadline). The
    truth counts the Auditor elected from its vote's creation, the job from its first sight of it: earlier,
    so the truth never requires what the job has not fired yet once it has."""
    truth = sim.ground_truth(params=TruthParameters(autorecovery=GRACES))
    required, allowed = set(truth["alerts"][CHECKS_OVERDUE]), set(truth["may_alert"][CHECKS_OVERDUE])
    found = {"auditor-checks"} if fired else set()
    assert required <= found <= required | allowed, truth


def test_an_overdue_auditor_check_fires_after_its_interval_and_grace_and_resolves_when_it_completes(
    sim: SimulatedCluster, settings: Settings, running: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Auditor (elected from ``init()``) never checked all ledgers: due when the job first saw it, the
    alert fires 2 s of event time later and resolves when the check completes; 3 s (the interval) after that
    completion plus the grace, with no new one, it fires again with a new id, and resolves on the next."""
    graces_ms = GRACES.grace_ms(AlertKind.AUDITOR_CHECKS_OVERDUE)
    wait_until(lambda: len(overdue_alerts(settings)) == 1, 20, "the never-run check to be overdue")
    (never,) = overdue_alerts(settings)
    assert never["state"] == "firing" and never["ledger_id"] is None and never["bookies"] == []
    assert never["detail"]["overdue"] == ["checkallledgersctime"]
    assert never["detail"]["checks"] == {
        "checkallledgersctime": {
            "last_completed_ms": None,
            "interval_s": 3.0,
            "due_ms": never["detail"]["since_ms"],
        }
    }
    assert ms(never["detected_at"]) - never["detail"]["since_ms"] >= graces_ms, never
    assert_truth_agrees(sim, fired=True)

    completed = sim.set_check_time(CtimeZnode.CHECK_ALL_LEDGERS)
    wait_until(lambda: len(overdue_alerts(settings)) == 2, 20, "the completed check to resolve the alert")
    resolved = overdue_alerts(settings)[1]
    assert (resolved["state"], resolved["alert_id"]) == ("resolved", never["alert_id"])

    wait_until(lambda: len(overdue_alerts(settings)) == 3, 20, "the check to be overdue again")
    late = overdue_alerts(settings)[2]
    assert late["state"] == "firing" and late["alert_id"] != never["alert_id"]
    assert late["detail"]["since_ms"] == completed + 3_000
    assert late["detail"]["checks"]["checkallledgersctime"]["last_completed_ms"] == completed
    assert ms(late["detected_at"]) - late["detail"]["since_ms"] >= graces_ms, late
    assert_truth_agrees(sim, fired=True)
    capsys.readouterr()
    assert run_cli(["query", "alerts", "--lakehouse", str(settings.lakehouse_root), "--format", "json"]) == 0
    listed = [row for row in json.loads(capsys.readouterr().out) if row["kind"] == CHECKS_OVERDUE]
    assert [row["alert_id"] for row in listed] == [late["alert_id"]]

    sim.set_check_time(CtimeZnode.CHECK_ALL_LEDGERS)
    wait_until(lambda: len(overdue_alerts(settings)) == 4, 20, "the second alert to resolve")
    assert overdue_alerts(settings)[3]["state"] == "resolved"
    assert overdue_alerts(settings)[3]["alert_id"] == late["alert_id"]
    assert_truth_agrees(sim, fired=False)


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


@pytest.mark.parametrize("watch_mode", ["persistent", "fallback"])
def test_the_watcher_publishes_the_auditors_check_times_as_they_are_written(
    bk_services: Any,
    kafka_settings: Any,
    zk_chroot: str,
    zk_client: Any,
    sim: SimulatedCluster,
    watch_mode: str,
) -> None:
    """Each of the three binary znodes directly under ``underreplication/``, written after the start
    snapshot (no reconciliation runs), is read on its own notification and its time published."""
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot, watch_mode=watch_mode)
    with running_watcher(settings, SIM_PASSWORD) as (watcher, reader):
        assert watcher.wait_for_snapshots(1, 30)
        start = wait_for_state(reader, lambda s: len(s.votes) == 1)
        assert not start.HasField("check_all_ledgers_ctime_ms")  # the Auditor never ran a check

        written = sim.set_check_time(CtimeZnode.CHECK_ALL_LEDGERS, 1_795_000_000_123)
        checked = wait_for_state(reader, lambda s: s.HasField("check_all_ledgers_ctime_ms"))
        assert checked.check_all_ledgers_ctime_ms == written == 1_795_000_000_123
        sim.set_check_time(CtimeZnode.CHECK_ALL_LEDGERS, 1_795_000_600_000)  # the next run, overwritten
        wait_for_state(reader, lambda s: s.check_all_ledgers_ctime_ms == 1_795_000_600_000)
        sim.set_check_time(CtimeZnode.PLACEMENT_POLICY_CHECK, 1_795_000_000_456)
        sim.set_check_time(CtimeZnode.REPLICAS_CHECK, 1_795_000_000_789)
        both = wait_for_state(reader, lambda s: s.HasField("replicas_check_ctime_ms"))
        assert both.placement_policy_check_ctime_ms == 1_795_000_000_456
        assert both.replicas_check_ctime_ms == 1_795_000_000_789

        # A znode that does not decode: its time is absent, the others stay, the reason says which.
        path = sim.underreplication.ctime(CtimeZnode.REPLICAS_CHECK)
        zk_client.set(path, b"\xff\xff")
        odd = wait_for_state(reader, lambda s: not s.HasField("replicas_check_ctime_ms"))
        assert "replicascheckctime" in odd.error
        assert odd.check_all_ledgers_ctime_ms == 1_795_000_600_000
        zk_client.set(path, format_ctime(CtimeZnode.REPLICAS_CHECK, 1_795_000_900_000))
        wait_for_state(reader, lambda s: s.replicas_check_ctime_ms == 1_795_000_900_000 and not s.error)
        zk_client.delete(sim.underreplication.ctime(CtimeZnode.CHECK_ALL_LEDGERS))
        gone = wait_for_state(reader, lambda s: not s.HasField("check_all_ledgers_ctime_ms"))
        assert gone.placement_policy_check_ctime_ms == 1_795_000_000_456


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
