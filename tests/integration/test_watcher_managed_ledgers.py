"""The watcher follows Pulsar's ``/managed-ledgers`` as a change stream: the START snapshot publishes every
managed ledger and cursor, live changes are published as they happen, and what changed while the session
was lost (the persistent watch with it) is published by the reconciliation, deletions inferred."""

from __future__ import annotations

from typing import Any

import pytest
from kazoo.client import KazooClient

from core.domain.managed_ledger import (
    ManagedCursorInfo,
    ManagedLedgerInfo,
    TopicLedger,
    encode_managed_cursor_info,
    encode_managed_ledger_info,
)
from core.pb import change_events_pb2 as pb
from tests.integration.test_watcher import (
    ClusterTree,
    ReaddGate,
    quiesce,
    running_watcher,
    tree,  # noqa: F401 (a fixture)
    watcher_settings,
)

pytestmark = pytest.mark.integration

ROOT = "/managed-ledgers"
ORDERS = "public/default/persistent/orders"
PAYMENTS = "public/default/persistent/payments"


def listing(*ids: int) -> bytes:
    return encode_managed_ledger_info(ManagedLedgerInfo(tuple(TopicLedger(i) for i in ids)))


def put(zk: KazooClient, path: str, data: bytes) -> None:
    if zk.exists(path):
        zk.set(path, data)
    else:
        zk.create(path, data, makepath=True)


def managed(reader: Any, snapshot_id: str | None = None) -> list[tuple[str, str, str]]:
    """(kind, name, cursor) of the managed-ledger events read (in a snapshot, or live with "")."""
    found = []
    for event in reader.events():
        kind = event.WhichOneof("payload")
        mine = kind in ("managed_ledger_changed", "managed_ledger_deleted")
        if mine and (snapshot_id is None or event.snapshot_id == snapshot_id):
            payload = getattr(event, kind)
            found.append((kind, payload.name, payload.cursor))
    return found


def test_managed_ledgers_are_a_change_stream_that_survives_a_lost_session(
    bk_services: Any,
    kafka_settings: Any,
    zk_chroot: str,
    tree: ClusterTree,  # noqa: F811
) -> None:
    zk = tree.zk
    put(zk, f"{ROOT}/{ORDERS}", listing(1, 2))
    put(zk, f"{ROOT}/{ORDERS}/sub", encode_managed_cursor_info(ManagedCursorInfo(9)))
    zk.ensure_path(f"{ROOT}/public/default/persistent")  # a namespace level: listed, never published
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot)
    with running_watcher(settings) as (watcher, reader):
        assert watcher.wait_for_snapshots(1, 30)
        reader.wait_for(lambda found: any(e.HasField("snapshot_begin") for e in found))
        start = reader.events("snapshot_begin")[0].snapshot_begin.snapshot_id
        reader.wait_for(lambda _: len(managed(reader, start)) == 2)
        assert sorted(managed(reader, start)) == [
            ("managed_ledger_changed", ORDERS, ""),
            ("managed_ledger_changed", ORDERS, "sub"),
        ]
        first = next(
            e for e in reader.events("managed_ledger_changed") if not e.managed_ledger_changed.cursor
        )
        assert (
            first.entity_key == f"managed-ledger/{ORDERS}"
            and first.managed_ledger_changed.data == listing(1, 2)
        )

        put(zk, f"{ROOT}/{ORDERS}", listing(2, 3))  # live: trimmed and rolled over
        reader.wait_for(
            lambda _: any(
                e.managed_ledger_changed.data == listing(2, 3)
                for e in reader.events("managed_ledger_changed")
            )
        )

        gate = ReaddGate(watcher)
        bk_services.expire_session(watcher.zookeeper)
        assert gate.blocked.wait(10)
        zk.delete(f"{ROOT}/{ORDERS}/sub")  # unwatched: the watch went with the session
        put(zk, f"{ROOT}/{PAYMENTS}", listing(5))
        gate.release.set()
        assert watcher.wait_for_snapshots(2, 30)
        quiesce(watcher, reader)
        reconciliation = next(
            e.snapshot_begin.snapshot_id
            for e in reader.events("snapshot_begin")
            if e.snapshot_begin.reason == pb.SnapshotBegin.SESSION_EXPIRED
        )
        found = managed(reader, reconciliation)
        assert sorted(found) == [
            ("managed_ledger_changed", PAYMENTS, ""),
            ("managed_ledger_deleted", ORDERS, "sub"),
        ]  # the unchanged managed ledger is not published again
        deleted = next(e for e in reader.events("managed_ledger_deleted") if e.snapshot_id == reconciliation)
        assert deleted.managed_ledger_deleted.inferred

        zk.delete(f"{ROOT}/{PAYMENTS}")  # live again, after the re-added watch
        reader.wait_for(lambda _: ("managed_ledger_deleted", PAYMENTS, "") in managed(reader))
