"""Bursts of live changes under ``bkaudit watch``: read together, published in order, none lost.

The watcher lets a burst of notifications gather (``watcher.change_batch_ms``) and reads the changed
ledgers of a burst in one ``multiRead``. These tests write bursts with kazoo's asynchronous calls (many
requests in flight, so notifications reach the watcher back to back) against the real embedded ZooKeeper
and broker, and check what a consumer of the topic sees.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from connectors.zookeeper.handler import PollingHandler, ReadAheadSocket
from core.domain.metadata import LedgerState
from tests.integration.test_watcher import (
    ClusterTree,
    TopicReader,
    assert_replay_matches,
    ledger_metadata,
    quiesce,
    running_watcher,
    watcher_settings,
)


@pytest.fixture
def cluster(zk_client: KazooClient) -> ClusterTree:
    return ClusterTree(zk_client).init()


def _reads(watcher: Any, purpose: str) -> float:
    return float(watcher.metrics.zookeeper_reads.labels(purpose)._value.get())


def _live_versions(reader: TopicReader, ledger_id: int) -> list[int]:
    """Versions of a ledger's live upserts in the order a consumer reads its partition."""
    ordered = sorted(reader.records, key=lambda r: (r.partition, r.offset))
    return [
        r.event.ledger_upserted.znode.version
        for r in ordered
        if r.event.HasField("ledger_upserted")
        and not r.event.snapshot_id
        and r.event.ledger_upserted.ledger_id == ledger_id
    ]


@contextlib.contextmanager
def _watching(bk_services: Any, kafka_settings: Any, zk_chroot: str, **watcher: Any) -> Iterator[Any]:
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot, **watcher)
    with running_watcher(settings) as (running, reader):
        assert running.wait_for_snapshots(1, 30)
        quiesce(running, reader, seconds=0.3)
        yield running, reader


@pytest.mark.integration
def test_a_burst_of_changes_to_one_ledger_arrives_in_version_order(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, cluster: ClusterTree
) -> None:
    cluster.create_ledger(7)
    with _watching(bk_services, kafka_settings, zk_chroot, change_batch_ms=20) as (watcher, reader):
        path = cluster.path(7)
        for _burst in range(5):  # bursts of 20 writes in flight at once, with pauses between them
            pending = [
                cluster.zk.set_async(path, ledger_metadata(7, state=LedgerState.OPEN)) for _ in range(20)
            ]
            for result in pending:
                result.get(timeout=10)
        final = cluster.zk.exists(path)
        assert final is not None and final.version == 100
        quiesce(watcher, reader)
        versions = _live_versions(reader, 7)
        assert versions, "no live upsert of the ledger"
        assert versions == sorted(versions)  # never an older version after a newer one
        assert versions[-1] == 100  # and the newest is the last word
        assert_replay_matches(reader, cluster)


@pytest.mark.integration
def test_a_burst_across_many_ledgers_loses_none_and_is_read_with_multireads(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, cluster: ClusterTree
) -> None:
    ledgers = range(1, 401)
    for ledger_id in ledgers:
        cluster.create_ledger(ledger_id)
    with _watching(bk_services, kafka_settings, zk_chroot, change_batch_ms=20) as (watcher, reader):
        before = _reads(watcher, "ledger") + _reads(watcher, "multi_read")
        zk = cluster.zk
        pending = [
            zk.set_async(cluster.path(i), ledger_metadata(i, state=LedgerState.CLOSED, last_entry_id=i))
            for i in ledgers
        ]
        pending += [zk.delete_async(cluster.path(i)) for i in range(1, 401, 40)]  # some go away...
        pending += [  # ... and new ones appear, in the same burst
            zk.create_async(cluster.path(i), ledger_metadata(i)) for i in range(1000, 1020)
        ]
        for result in pending:
            result.get(timeout=10)
        quiesce(watcher, reader)
        state = assert_replay_matches(reader, cluster)  # every ledger at its final version, none lost
        assert len(state.ledger_versions()) == 400 - 10 + 20
        requests = _reads(watcher, "ledger") + _reads(watcher, "multi_read") - before
        names = {task.joinpath("comm").read_text().strip() for task in Path("/proc/self/task").iterdir()}
        assert {"watch-worker", "kazoo-zk_loop", "kafka-delivery"} <= names  # top -H tells them apart
        # 420 changed ledgers, read in far fewer requests (one multiRead per gathered burst).
        assert _reads(watcher, "multi_read") > 0
        assert requests < 100, requests


@pytest.mark.integration
def test_a_trickle_of_notifications_is_held_while_each_burst_gathers(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, cluster: ClusterTree, monkeypatch: Any
) -> None:
    """ZooKeeper sends every notification as a packet of its own: changes 3 ms apart would be read from the
    socket one by one, each read a wake-up of kazoo's connection thread. While the worker lets a burst
    gather, it tells the connection to hold its reads, and the connection's next read wait sleeps the hold
    out first (so what came meanwhile is read at once). The same trickle twice, with the hold and without:
    the worker gathers bursts both times, the connection sleeps out holds only with it, nothing is lost.

    The counts are the code's own decisions, not socket reads, whose number depends on how the machine
    schedules threads; how many reads the hold saves is measured by tests/benchmarks/bench_watcher.py."""
    from connectors.zookeeper import watcher as watcher_module

    for ledger_id in range(1, 121):
        cluster.create_ledger(ledger_id)

    def trickle(ledgers: range, watcher: Any, reader: TopicReader) -> tuple[int, int]:
        handler = watcher.zookeeper.handler
        gathered, held = watcher.bursts_gathered, handler.held_waits
        for ledger_id in ledgers:
            cluster.zk.set(cluster.path(ledger_id), ledger_metadata(ledger_id, state=LedgerState.CLOSED))
            time.sleep(0.003)
        # Every change published: each hold (shorter than the gathering sleep before the publish) is over.
        reader.wait_for(lambda _: all(_live_versions(reader, i)[-1:] == [1] for i in ledgers), timeout_s=60)
        return watcher.bursts_gathered - gathered, handler.held_waits - held

    with _watching(bk_services, kafka_settings, zk_chroot, change_batch_ms=100) as (watcher, reader):
        gathered_with_hold, held = trickle(range(1, 61), watcher, reader)
        monkeypatch.setattr(watcher_module, "READS_HELD_FRACTION", 0.0)
        gathered_without_hold, held_without = trickle(range(61, 121), watcher, reader)
        quiesce(watcher, reader)
        assert_replay_matches(reader, cluster)
    assert gathered_with_hold >= 1 and gathered_without_hold >= 1, (gathered_with_hold, gathered_without_hold)
    assert held >= 1, f"{gathered_with_hold} bursts gathered, the connection never held its reads"
    assert held_without == 0, f"{held_without} read waits held with READS_HELD_FRACTION 0"


@pytest.mark.integration
def test_without_gathering_every_change_is_still_published(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, cluster: ClusterTree
) -> None:
    for ledger_id in range(1, 51):
        cluster.create_ledger(ledger_id)
    with _watching(bk_services, kafka_settings, zk_chroot, change_batch_ms=0) as (watcher, reader):
        pending = [
            cluster.zk.set_async(cluster.path(i), ledger_metadata(i, state=LedgerState.CLOSED))
            for i in range(1, 51)
        ]
        for result in pending:
            result.get(timeout=10)
        quiesce(watcher, reader)
        assert_replay_matches(reader, cluster)


@pytest.mark.integration
def test_the_watcher_connection_reads_ahead_without_stalling(bk_services: Any, zk_chroot: str) -> None:
    # A 30 s session pings every ~10 s: an answer left in the read-ahead buffer unseen would wait that long.
    client = KazooClient(hosts=bk_services.zookeeper_hosts(zk_chroot), handler=PollingHandler(), timeout=30)
    client.start(timeout=15)
    try:
        assert isinstance(client._connection._socket, ReadAheadSocket)
        client.ensure_path("/read-ahead")
        for _ in range(5):
            started = time.monotonic()
            results = [client.exists_async("/read-ahead") for _ in range(200)]  # answers back to back
            assert all(result.get(timeout=20) is not None for result in results)
            assert time.monotonic() - started < 7.0  # an answer left unseen waits for the ~10 s ping
    finally:
        client.stop()
        client.close()
