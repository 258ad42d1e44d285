"""The single-active lease in ZooKeeper (``stream.lease = zookeeper``): one job per checkpoint across hosts.

Against the suite's real ZooKeeper: a second holder is refused with the first one named, or waits for it;
a session ZooKeeper expired loses the lease for good, and a sink whose lease is lost publishes and writes
nothing more; ``bkaudit stream`` on a lease another job holds exits 2 with one line before Spark starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from kazoo.client import KazooState

from bkaudit.testing import ServiceHarness
from connectors.delta.tables import table_path
from connectors.zookeeper.lease import LeaseLost, LeaseSuspended, ZooKeeperLease
from core.errors import ConfigError
from streaming.sink import AuditSink
from tests.integration.event_fixtures import decision_table as decisions
from tests.integration.test_loss_lanes import ledger, writable

pytestmark = pytest.mark.integration

LEASES = "/bkaudit/leases"


def test_a_second_holder_is_refused_naming_the_first_and_takes_the_lease_once_it_is_free(
    bk_services: ServiceHarness, zk_chroot: str, zk_client: Any
) -> None:
    first = ZooKeeperLease(zk_client, LEASES, "job")
    first.acquire()
    other = bk_services.kazoo_client(zk_chroot)
    try:
        second = ZooKeeperLease(other, LEASES, "job")
        with pytest.raises(ConfigError, match=rf"held by pid {os.getpid()} on "):
            second.acquire()
        first.release()
        second.acquire()
        second.check()
        assert second.holder() is not None and zk_client.exists(f"{LEASES}/job") is not None
    finally:
        other.stop()
        other.close()


def test_a_waiting_job_takes_the_lease_when_its_holder_stops(
    bk_services: ServiceHarness, zk_chroot: str, zk_client: Any
) -> None:
    first = ZooKeeperLease(zk_client, LEASES, "job")
    first.acquire()
    other = bk_services.kazoo_client(zk_chroot)
    try:
        threading.Timer(1.0, first.release).start()
        started = time.monotonic()
        ZooKeeperLease(other, LEASES, "job", wait_s=60).acquire()
        assert time.monotonic() - started >= 0.9
    finally:
        other.stop()
        other.close()


def test_an_expired_session_loses_the_lease_for_good_and_another_job_can_take_it(
    bk_services: ServiceHarness, zk_chroot: str
) -> None:
    holder_client = bk_services.kazoo_client(zk_chroot)
    other = bk_services.kazoo_client(zk_chroot)
    try:
        lease = ZooKeeperLease(holder_client, LEASES, "job")
        lease.acquire()
        bk_services.expire_session(holder_client)  # returns once the client has a new session
        with pytest.raises(LeaseLost, match="session expired"):
            lease.check()
        ZooKeeperLease(other, LEASES, "job").acquire()  # the ephemeral znode went with the session
        with pytest.raises(LeaseLost):
            lease.wait_usable(1.0)  # a new session does not bring the lease back
    finally:
        for client in (holder_client, other):
            client.stop()
            client.close()


def test_a_check_long_after_the_last_asks_zookeeper_whatever_kazoo_believes(
    bk_services: ServiceHarness, zk_chroot: str
) -> None:
    # A process frozen past its session runs again believing it is connected: kazoo learns of the expiry
    # only from the server. Here kazoo's word never reaches the lease (its listener is removed) while the
    # session expires and another job takes the lease; a check past confirm_after_s must still fail.
    holder_client = bk_services.kazoo_client(zk_chroot)
    other = bk_services.kazoo_client(zk_chroot)
    now = [0.0]
    try:
        lease = ZooKeeperLease(holder_client, LEASES, "job", confirm_after_s=3.0, clock=lambda: now[0])
        lease.acquire()
        holder_client.remove_listener(lease._on_state)
        bk_services.expire_session(holder_client)
        ZooKeeperLease(other, LEASES, "job").acquire()
        lease.check()  # within confirm_after_s of the last confirmation: kazoo's state decides
        now[0] = 10.0
        with pytest.raises(LeaseLost, match="gone or another session's"):
            lease.check()
    finally:
        for client in (holder_client, other):
            client.stop()
            client.close()


def test_a_lease_a_killed_job_of_this_host_left_is_waited_for_until_its_session_expires(
    bk_services: ServiceHarness, zk_chroot: str, zk_client: Any
) -> None:
    # kill -9 and restart at once (systemd, a supervisor): the dead job's session holds the lease until it
    # expires; the new job waits for that instead of refusing (a lease held by a live job still refuses).
    hosts = bk_services.zookeeper_hosts(zk_chroot)
    code = (
        "import sys, time; from kazoo.client import KazooClient; "
        "from connectors.zookeeper.lease import ZooKeeperLease; "
        f"c = KazooClient(hosts={hosts!r}, timeout=4); c.start(30); "
        f"ZooKeeperLease(c, {LEASES!r}, 'job').acquire(); print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match="held by pid"):
            ZooKeeperLease(zk_client, LEASES, "job", stale_wait_s=60).acquire()  # alive: refused
    finally:
        holder.kill()
        holder.wait()
    started = time.monotonic()
    lease = ZooKeeperLease(zk_client, LEASES, "job", stale_wait_s=60)
    lease.acquire()
    lease.check()
    assert time.monotonic() - started < 60
    lease.release()


def test_a_dropped_connection_suspends_writes_until_the_session_is_back(zk_client: Any) -> None:
    lease = ZooKeeperLease(zk_client, LEASES, "job")
    lease.acquire()
    lease._on_state(KazooState.SUSPENDED)  # kazoo's call when the connection drops
    with pytest.raises(LeaseSuspended):
        lease.check()
    threading.Timer(0.5, lambda: lease._on_state(KazooState.CONNECTED)).start()
    lease.wait_usable(30)  # the same session again: the lease is still held
    lease.release()


def test_a_sink_that_lost_its_lease_publishes_and_writes_nothing_more(
    bk_services: ServiceHarness, zk_chroot: str, kafka_settings: Any, tmp_path: Path
) -> None:
    from connectors.kafka.topics import ensure_topic
    from streaming.sink import SinkConfig

    ensure_topic(kafka_settings, kafka_settings.alerts_topic, 1)
    client = bk_services.kazoo_client(zk_chroot)
    try:
        lease = ZooKeeperLease(client, LEASES, "job")
        lease.acquire()
        sink = AuditSink(
            SinkConfig(lakehouse_root=tmp_path / "lh", app_id="lease-test", kafka=kafka_settings)
        )
        sink.set_write_check(lambda: lease.wait_usable(5))
        sink.process(decisions(*writable("b1", "b2", "b3"), ledger(1, ["b1", "b2", "b3"], 1_000, 10)), 0)
        versions = {name: _version(tmp_path / "lh", name) for name in ("ledger_changes", "violations")}
        bk_services.expire_session(client)
        with pytest.raises(LeaseLost):
            sink.process(decisions(ledger(2, ["b1", "b2", "zz:1"], 2_000, 11)), 1)
        with pytest.raises(LeaseLost):
            sink.ledger_log.fold()
        with pytest.raises(LeaseLost):
            sink.close()  # its last fold too; the clients are closed all the same
        assert {name: _version(tmp_path / "lh", name) for name in versions} == versions
    finally:
        client.stop()
        client.close()


def _version(root: Path, name: str) -> int:
    return DeltaTable(table_path(root, name)).version()


def test_bkaudit_stream_on_a_lease_another_job_holds_exits_2_with_one_line(
    bk_services: ServiceHarness, zk_chroot: str, zk_client: Any, tmp_path: Path
) -> None:
    ZooKeeperLease(zk_client, LEASES, "bkaudit-stream").acquire()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKAUDIT_")}
    env.update(
        {
            "BKAUDIT_LAKEHOUSE_ROOT": str(tmp_path / "lakehouse"),
            "BKAUDIT_CHECKPOINT_ROOT": str(tmp_path / "another-host-checkpoints"),
            "BKAUDIT_ZOOKEEPER__CONNECT": bk_services.zookeeper_hosts(zk_chroot),
            "BKAUDIT_STREAM__LEASE": "zookeeper",
            "BKAUDIT_STREAM__APP_ID": "bkaudit-stream",
            "BKAUDIT_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:9",  # never reached: refused before
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "bkaudit.cli.main", "stream"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("bkaudit: ")]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 and f"{LEASES}/bkaudit-stream" in lines[0], done.stderr
    holder = json.loads(zk_client.get(f"{LEASES}/bkaudit-stream")[0])
    assert f"pid {holder['pid']} on {holder['host']}" in lines[0]


def test_a_lease_path_inside_bookkeepers_tree_is_refused_before_connecting(tmp_path: Path) -> None:
    from core.settings import Settings
    from streaming.job import exclusive_checkpoint

    settings = Settings(
        lakehouse_root=tmp_path / "lh",
        checkpoint_root=tmp_path / "cp",
        zookeeper={"connect": "127.0.0.1:9", "ledgers_root": "/ledgers"},
        stream={"lease": "zookeeper", "lease_path": "/ledgers/bkaudit"},
    )
    with pytest.raises(ConfigError, match="inside BookKeeper's tree"), exclusive_checkpoint(settings):
        pass
