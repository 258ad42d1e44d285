"""The AddWatch kazoo extension against the real embedded ZooKeeper."""

from __future__ import annotations

import queue
import time

import pytest
from kazoo.protocol.states import EventType, KazooState

from connectors.zookeeper.persistent_watch import AddWatchMode, PersistentWatches

pytestmark = pytest.mark.integration


def _drain(events: queue.Queue, count: int, timeout: float = 10.0) -> list[tuple[str, str]]:
    got: list[tuple[str, str]] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        try:
            event = events.get(timeout=0.2)
        except queue.Empty:
            continue
        got.append((event.type, event.path))
    return got


def test_recursive_watch_reports_every_change_below_the_root_without_rearming(bk_services, zk_chroot):
    watcher = bk_services.kazoo_client(zk_chroot)
    writer = bk_services.kazoo_client(zk_chroot)
    try:
        writer.ensure_path("/ledgers")
        events: queue.Queue = queue.Queue()
        PersistentWatches(watcher).add("/ledgers", events.put)
        writer.create("/ledgers/00/0000/L0001", b"a", makepath=True)
        writer.set("/ledgers/00/0000/L0001", b"b")
        writer.set("/ledgers/00/0000/L0001", b"c")  # a second change: no re-arming needed
        writer.delete("/ledgers/00/0000/L0001")
        writer.create("/elsewhere", b"")  # outside the watched tree: not reported
        got = _drain(events, 6)
        assert got == [
            (EventType.CREATED, "/ledgers/00"),
            (EventType.CREATED, "/ledgers/00/0000"),
            (EventType.CREATED, "/ledgers/00/0000/L0001"),
            (EventType.CHANGED, "/ledgers/00/0000/L0001"),
            (EventType.CHANGED, "/ledgers/00/0000/L0001"),
            (EventType.DELETED, "/ledgers/00/0000/L0001"),
        ]
        assert events.empty()
    finally:
        for c in (watcher, writer):
            c.stop()
            c.close()


def test_plain_persistent_watch_sees_the_node_and_its_children_list(bk_services, zk_chroot):
    watcher = bk_services.kazoo_client(zk_chroot)
    try:
        watcher.ensure_path("/ledgers/available")
        events: queue.Queue = queue.Queue()
        PersistentWatches(watcher).add("/ledgers/available", events.put, AddWatchMode.PERSISTENT)
        watcher.create("/ledgers/available/b1", b"", ephemeral=True)
        watcher.create("/ledgers/available/b2", b"", ephemeral=True)
        got = _drain(events, 2)
        assert got == [(EventType.CHILD, "/ledgers/available")] * 2
    finally:
        watcher.stop()
        watcher.close()


def test_watch_is_gone_after_session_expiry_until_readded(bk_services, zk_chroot):
    watcher = bk_services.kazoo_client(zk_chroot)
    writer = bk_services.kazoo_client(zk_chroot)
    try:
        writer.ensure_path("/ledgers")
        events: queue.Queue = queue.Queue()
        watches = PersistentWatches(watcher)
        watches.add("/ledgers", events.put)
        bk_services.expire_session(watcher)
        assert watcher.state == KazooState.CONNECTED
        writer.create("/ledgers/lost-while-expired", b"")
        assert _drain(events, 1, timeout=1.5) == []  # the server forgot the watch with the session
        assert watches.readd_all() == 1
        writer.create("/ledgers/after-readd", b"")
        assert _drain(events, 1) == [(EventType.CREATED, "/ledgers/after-readd")]
    finally:
        for c in (watcher, writer):
            c.stop()
            c.close()


def test_server_support_is_detected(bk_services):
    client = bk_services.kazoo_client()
    try:
        assert PersistentWatches(client).supported()
    finally:
        client.stop()
        client.close()
