"""The watcher's managed-ledger recipe (connectors/zookeeper/managed_ledgers.py) without ZooKeeper: which
paths are managed ledgers and cursors, what a notification, a read and a complete scan publish."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

from kazoo.protocol.states import EventType, WatchedEvent

from connectors.zookeeper.managed_ledgers import ManagedLedgerRecipe
from connectors.zookeeper.snapshot import NodeKind, Snapshot
from core.pb import change_events_pb2 as pb

Stat = namedtuple("Stat", "czxid mzxid ctime mtime version dataLength")
ROOT = "/managed-ledgers"
NAME = "public/default/persistent/orders"


class Recorder:
    def __init__(self) -> None:
        self.reads: list[tuple[str, tuple[str, str]]] = []
        self.events: list[tuple[Any, Any]] = []
        self.recipe = ManagedLedgerRecipe(
            ROOT, read=lambda path, znode: self.reads.append((path, znode)), emit=self.emit
        )

    def emit(self, payload: Any, snapshot: Any) -> None:
        self.events.append((payload, snapshot))


def test_paths_managed_ledgers_cursors_and_the_rest():
    recipe = Recorder().recipe
    assert recipe.znode_of(f"{ROOT}/{NAME}") == (NAME, "")
    assert recipe.znode_of(f"{ROOT}/{NAME}/sub") == (NAME, "sub")
    assert recipe.znode_of(f"{ROOT}/sample/us-west/ns1/persistent/t1") == (
        "sample/us-west/ns1/persistent/t1",
        "",
    )
    assert recipe.znode_of(f"{ROOT}/public/default") is None
    assert recipe.znode_of(f"{ROOT}/public/default/persistent") is None
    assert recipe.znode_of("/ledgers/L0001") is None
    assert recipe.owns(ROOT) and recipe.owns(f"{ROOT}/x") and not recipe.owns("/managed-ledgersX")


def test_the_scan_reads_managed_ledgers_and_lists_them_for_their_cursors():
    recorder = Recorder()
    reads: list[Any] = []

    def classify(path: str) -> Any:
        return recorder.recipe._classify(path, lambda p, z: reads.append(z))

    assert classify(f"{ROOT}/public") == (NodeKind.DIRECTORY, None)
    assert classify(f"{ROOT}/{NAME}") == (NodeKind.DIRECTORY, None) and reads == [(NAME, "")]
    assert classify(f"{ROOT}/{NAME}/sub") == (NodeKind.LEAF, (NAME, "sub"))
    assert classify(f"{ROOT}/a/b/c/d/e/f") == (NodeKind.SKIP, None)


def test_notifications_reads_and_deletions():
    recorder = Recorder()
    recipe = recorder.recipe
    recipe.on_event(WatchedEvent(EventType.CREATED, "CONNECTED", f"{ROOT}/{NAME}"))
    assert recorder.reads == [(f"{ROOT}/{NAME}", (NAME, ""))]
    recipe.on_read((NAME, ""), b"data", Stat(1, 5, 0, 0, 0, 4), None)
    recipe.on_read((NAME, ""), b"data", Stat(1, 5, 0, 0, 0, 4), None)  # the same version: not again
    ((changed, _),) = recorder.events
    assert (changed.name, changed.cursor, changed.data, changed.znode.mzxid) == (NAME, "", b"data", 5)
    recipe.on_event(WatchedEvent(EventType.DELETED, "CONNECTED", f"{ROOT}/{NAME}"))
    deleted = recorder.events[-1][0]
    assert isinstance(deleted, pb.ManagedLedgerDeleted) and not deleted.inferred and recipe.known == 0


def test_a_complete_scan_infers_what_vanished_cursors_first():
    recorder = Recorder()
    recipe = recorder.recipe
    recipe.epoch = 1
    recipe.on_read((NAME, ""), b"", Stat(1, 5, 0, 0, 0, 0), None)
    recipe.on_read((NAME, "sub"), b"", Stat(1, 6, 0, 0, 0, 0), None)
    recipe.on_read(("t/n/persistent/kept", ""), b"", Stat(1, 7, 0, 0, 0, 0), None)
    snapshot = Snapshot.new(pb.SnapshotBegin.RECONNECT, pb.SnapshotBegin.DELTA, epoch=2)
    recipe.epoch = 2
    recipe.on_read(("t/n/persistent/kept", ""), b"", Stat(1, 7, 0, 0, 0, 0), snapshot)  # unchanged: not again
    before = len(recorder.events)
    assert recipe.infer_deletions(snapshot) == 2
    gone = [(p.name, p.cursor, p.inferred) for p, _ in recorder.events[before:]]
    assert gone == [(NAME, "sub", True), (NAME, "", True)]
    assert recipe.known == 1
