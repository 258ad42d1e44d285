"""``bkaudit watch`` against the real embedded ZooKeeper and broker, with hand-written BookKeeper znodes.

Every test builds its cluster in a fresh chroot with the domain library's encoders, runs a
:class:`~connectors.zookeeper.watcher.ChangeWatcher` on its own topic, reads the topic back and checks the
events — and, after storms of random changes, session expiry and a ZooKeeper restart, that replaying the
topic reproduces exactly what ZooKeeper holds. Every message of every topic is checked for the ledgers'
password bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import random
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError
from kazoo.protocol.states import EventType
from pydantic import SecretStr

from bkaudit.testing.kafka_io import TopicTail
from connectors.zookeeper.ordered_reads import OrderedReads
from connectors.zookeeper.persistent_watch import PersistentWatches
from connectors.zookeeper.watcher import (
    R_AUTORECOVERY,
    R_BOOKIE_DIR,
    R_COOKIE,
    R_DELAY,
    R_IGNORED,
    R_LEDGER,
    R_LEDGER_DIR,
    R_MARK,
    R_MARK_DIR,
    R_OTHER,
    R_READONLY,
    R_WRITABLE,
    ChangeWatcher,
    _Router,
)
from core import events
from core.domain.layout import (
    LedgerLayout,
    LedgerManagerType,
    ZnodeKind,
    available_path,
    classify_path,
    cookies_path,
    format_layout,
    instance_id_path,
    layout_path,
    ledger_path,
    readonly_path,
)
from core.domain.metadata import (
    DigestType,
    LedgerMetadata,
    LedgerPassword,
    LedgerState,
    Segment,
    encode_ledger_metadata,
)
from core.domain.registration import (
    BookieServiceInfo,
    Endpoint,
    cookie_path,
    encode_bookie_service_info,
    readonly_bookie_path,
    writable_bookie_path,
)
from core.domain.underreplication import (
    CtimeZnode,
    UnderreplicatedLedger,
    UnderreplicationPaths,
    format_underreplicated_ledger,
    parse_urledger_path,
)
from core.events import ReplayedState
from core.pb import change_events_pb2 as pb
from core.settings import Settings
from streaming.membership import membership_rows
from streaming.processor import ClusterLogic, ProcessorConfig
from tests.unit.test_membership_lane import lane_config, records

PASSWORD = b"pw-7f3a-SECRET-91c2"
INSTANCE_ID = "6b1c0e5e-0000-4000-8000-00000000beef"
BOOKIES = ("10.0.0.1:3181", "10.0.0.2:3181", "bookie-3")


# ============================================================================================ helpers


def ledger_metadata(
    ledger_id: int,
    *,
    state: LedgerState = LedgerState.OPEN,
    ensemble: tuple[str, ...] = BOOKIES,
    last_entry_id: int = -1,
    pulsar_topic: str | None = None,
    format_version: int = 3,
) -> bytes:
    closed = state is LedgerState.CLOSED
    custom: tuple[tuple[str, bytes], ...] = ()
    if pulsar_topic is not None:
        custom = (("pulsar/managed-ledger", pulsar_topic.encode()),)
    md = LedgerMetadata(
        format_version=format_version,
        ensemble_size=len(ensemble),
        write_quorum=2,
        ack_quorum=2,
        state=state,
        last_entry_id=last_entry_id if closed else -1,
        length=(last_entry_id + 1) * 100 if closed else 0,
        digest_type=DigestType.CRC32C,
        password=LedgerPassword(PASSWORD),
        segments=(Segment(0, ensemble),),
        ctoken=0 if format_version == 3 else None,
        custom_metadata=custom,
        ledger_id=ledger_id,
    )
    return encode_ledger_metadata(md)


def registration_data(bookie_id: str, port: int = 3181) -> bytes:
    host = bookie_id.split(":")[0]
    info = BookieServiceInfo((Endpoint("bookie", port, host, "bookie-rpc"),), (("zone", "a"),))
    return encode_bookie_service_info(info)


@dataclass
class ClusterTree:
    """BookKeeper's znodes written by hand into a test chroot."""

    zk: KazooClient
    root: str = "/ledgers"
    manager: LedgerManagerType = LedgerManagerType.HIERARCHICAL

    def init(self) -> ClusterTree:
        self.zk.ensure_path(self.root)
        self.zk.create(layout_path(self.root), format_layout(LedgerLayout.for_manager(self.manager)).encode())
        self.zk.create(instance_id_path(self.root), INSTANCE_ID.encode())
        for path in (
            readonly_path(self.root),
            cookies_path(self.root),
            UnderreplicationPaths(self.root).urledgers,
        ):
            self.zk.ensure_path(path)
        return self

    def path(self, ledger_id: int) -> str:
        return ledger_path(ledger_id, self.manager, self.root)

    def create_ledger(self, ledger_id: int, **kwargs: Any) -> None:
        self.zk.create(self.path(ledger_id), ledger_metadata(ledger_id, **kwargs), makepath=True)

    def set_ledger(self, ledger_id: int, **kwargs: Any) -> None:
        self.zk.set(self.path(ledger_id), ledger_metadata(ledger_id, **kwargs))

    def delete_ledger(self, ledger_id: int) -> None:
        self.zk.delete(self.path(ledger_id))

    def register(self, client: KazooClient, bookie_id: str, *, readonly: bool = False) -> None:
        path = (
            readonly_bookie_path(bookie_id, self.root)
            if readonly
            else writable_bookie_path(bookie_id, self.root)
        )
        client.create(path, registration_data(bookie_id), ephemeral=True)

    def unregister(self, client: KazooClient, bookie_id: str, *, readonly: bool = False) -> None:
        path = (
            readonly_bookie_path(bookie_id, self.root)
            if readonly
            else writable_bookie_path(bookie_id, self.root)
        )
        client.delete(path)

    def add_cookie(self, bookie_id: str) -> None:
        self.zk.create(cookie_path(bookie_id, self.root), b'5\nbookieHost: "x"\n')

    def mark(self, ledger_id: int, replicas: tuple[str, ...], ctime: int | None = 1718000000000) -> None:
        path = UnderreplicationPaths(self.root).urledger(ledger_id)
        data = format_underreplicated_ledger(UnderreplicatedLedger(replicas, ctime)).encode()
        try:
            self.zk.create(path, data, makepath=True)
        except NodeExistsError:
            self.zk.set(path, data)

    def unmark(self, ledger_id: int) -> None:
        self.zk.delete(UnderreplicationPaths(self.root).urledger(ledger_id))

    def set_delay(self, value: bytes) -> None:
        path = UnderreplicationPaths(self.root).lost_bookie_recovery_delay
        try:
            self.zk.create(path, value, makepath=True)
        except NodeExistsError:
            self.zk.set(path, value)

    # ------------------------------------------------------------------ the truth, read back from ZooKeeper

    def ledger_versions(self) -> dict[int, tuple[int, int]]:
        found: dict[int, tuple[int, int]] = {}

        def walk(path: str) -> None:
            for child in self.zk.get_children(path):
                full = f"{path}/{child}"
                node = classify_path(full, self.manager, self.root)
                if node.kind is ZnodeKind.LEDGER:
                    stat = self.zk.exists(full)
                    if stat is not None:
                        found[node.ledger_id] = (stat.mzxid, stat.version)  # type: ignore[index]
                elif node.kind is ZnodeKind.INTERMEDIATE:
                    walk(full)

        walk(self.root)
        return found

    def bookie_statuses(self) -> dict[str, str]:
        writable = {c for c in self.zk.get_children(available_path(self.root)) if c != "readonly"}
        readonly = set(self.zk.get_children(readonly_path(self.root)))
        statuses = {b: "READ_ONLY" for b in readonly}
        statuses.update({b: "WRITABLE" for b in writable})
        return statuses

    def marks(self) -> dict[int, tuple[str, ...]]:
        from core.domain.underreplication import parse_underreplicated_ledger

        found: dict[int, tuple[str, ...]] = {}
        base = UnderreplicationPaths(self.root).urledgers

        def walk(path: str, depth: int) -> None:
            for child in self.zk.get_children(path):
                full = f"{path}/{child}"
                if depth == 4:
                    ledger_id = parse_urledger_path(full, self.root)
                    if ledger_id is not None:
                        found[ledger_id] = parse_underreplicated_ledger(self.zk.get(full)[0]).replicas
                else:
                    walk(full, depth + 1)

        walk(base, 0)
        return found


@dataclass
class Record:
    partition: int
    offset: int
    key: bytes
    value: bytes
    event: pb.ChangeEvent


@dataclass
class TopicReader:
    """Reads the whole change topic (every partition, from the beginning) and decodes every record."""

    settings: Any
    topic: str
    forbidden: bytes = PASSWORD  # bytes no record may contain (the ledgers' password)
    records: list[Record] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tail = TopicTail(self.settings, self.topic)
        self.partitions = list(range(self.tail.partitions))

    def poll(self, timeout_ms: int = 300) -> list[Record]:
        new: list[Record] = []
        for r in self.tail.poll(timeout_ms / 1000):
            assert self.forbidden not in r.value, "the ledger password was published"
            new.append(Record(r.partition, r.offset, r.key or b"", r.value, events.decode_event(r.value)))
        self.records.extend(new)
        return new

    def wait_for(self, predicate: Callable[[list[pb.ChangeEvent]], bool], timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate(self.events()):
            assert time.monotonic() < deadline, (
                f"timed out; events: {[_brief(e) for e in self.events()][-40:]}"
            )
            self.poll()

    def drain(self, timeout_s: float = 20.0) -> None:
        """Read until every partition's end offset (as of now) is reached."""
        end = self.tail.end_offsets()
        deadline = time.monotonic() + timeout_s
        while any(self.tail.positions[p] < end[p] for p in end):
            assert time.monotonic() < deadline, "timed out draining the topic"
            self.poll()

    def events(self, kind: str | None = None, *, live: bool | None = None) -> list[pb.ChangeEvent]:
        found = [r.event for r in sorted(self.records, key=lambda r: r.event.sequence)]
        if kind is not None:
            found = [e for e in found if e.WhichOneof("payload") == kind]
        if live is not None:
            found = [e for e in found if (e.snapshot_id == "") == live]
        return found

    def replay(self) -> ReplayedState:
        ordered = sorted(self.records, key=lambda r: (r.partition, r.offset))
        return events.ReplayedState().apply_all((r.event, r.partition) for r in ordered)

    def close(self) -> None:
        self.tail.close()


def _brief(event: pb.ChangeEvent) -> str:
    kind = event.WhichOneof("payload") or "?"
    return f"{event.sequence}:{kind}:{event.entity_key}"


def payloads(reader: TopicReader, kind: str, **where: Any) -> list[Any]:
    found = []
    for event in reader.events(kind):
        payload = getattr(event, kind)
        if all(getattr(payload, k) == v for k, v in where.items()):
            found.append(payload)
    return found


@pytest.fixture
def tree(zk_client: KazooClient) -> ClusterTree:
    return ClusterTree(zk_client).init()


@pytest.fixture
def bookie_client(bk_services: Any, zk_chroot: str) -> Iterator[KazooClient]:
    client = bk_services.kazoo_client(zk_chroot)
    yield client
    with contextlib.suppress(Exception):
        client.stop()
        client.close()


def watcher_settings(bk_services: Any, kafka_settings: Any, zk_chroot: str, **watcher: Any) -> Settings:
    values: dict[str, Any] = {"heartbeat_interval_s": 0.3, "reconciliation_interval_s": 0}
    values.update(watcher)
    return Settings(
        zookeeper={"connect": bk_services.zookeeper_hosts(zk_chroot), "session_timeout_s": 4.0},
        kafka=kafka_settings.model_dump(),
        watcher=values,
    )


@contextlib.contextmanager
def running_watcher(
    settings: Settings, forbidden: bytes = PASSWORD
) -> Iterator[tuple[ChangeWatcher, TopicReader]]:
    watcher = ChangeWatcher(settings)
    watcher.start()
    reader = None
    try:
        reader = TopicReader(settings.kafka, settings.kafka.changes_topic, forbidden)
        yield watcher, reader
    finally:
        watcher.stop(timeout_s=15)
        if reader is not None:
            reader.close()


def assert_replay_matches(
    reader: TopicReader, tree: ClusterTree, cluster: str = INSTANCE_ID, timeout_s: float = 30.0
) -> events.ReplayedState:
    """The topic replays to the tree's state: waits (up to ``timeout_s``) for the watcher to publish it,
    however slow the machine, then compares every part (a wrong state fails after the wait)."""
    reader.drain()
    state = reader.replay()
    deadline = time.monotonic() + timeout_s
    while _replay_differs(state, tree, cluster) and time.monotonic() < deadline:
        reader.poll()
        state = reader.replay()
    assert state.ledger_versions() == tree.ledger_versions()
    assert state.live_bookie_statuses() == tree.bookie_statuses()
    assert state.mark_replicas() == tree.marks()
    assert state.clusters == {cluster}
    return state


def _replay_differs(state: events.ReplayedState, tree: ClusterTree, cluster: str) -> bool:
    return (
        state.ledger_versions() != tree.ledger_versions()
        or state.live_bookie_statuses() != tree.bookie_statuses()
        or state.mark_replicas() != tree.marks()
        or state.clusters != {cluster}
    )


def quiesce(watcher: ChangeWatcher, reader: TopicReader, seconds: float = 0.8) -> None:
    """Let the watcher catch up: wait for a heartbeat emitted after every earlier change was processed."""
    time.sleep(seconds)
    watcher.publisher.flush(10)
    reader.drain()


# ============================================================================================ pure routing


def test_router_tells_every_kind_of_znode_apart() -> None:
    router = _Router("/ledgers", LedgerManagerType.HIERARCHICAL, "/bookies")
    ur = UnderreplicationPaths("/ledgers")
    cases = {
        "/ledgers/00/0000/L0059": (R_LEDGER, 59),
        "/ledgers/00/0000": (R_LEDGER_DIR, None),
        "/ledgers": (R_LEDGER_DIR, None),
        "/ledgers/available/10.0.0.1:3181": (R_WRITABLE, "10.0.0.1:3181"),
        "/ledgers/available/readonly/bk-2": (R_READONLY, "bk-2"),
        "/ledgers/cookies/bk-2": (R_COOKIE, "bk-2"),
        ur.urledger(59): (R_MARK, 59),
        ur.urledgers + "/0000/0000": (R_MARK_DIR, None),
        ur.lost_bookie_recovery_delay: (R_DELAY, None),
        ur.lock(59): (R_AUTORECOVERY, None),
        ur.locks: (R_AUTORECOVERY, None),
        ur.disable: (R_AUTORECOVERY, None),
        ur.auditor_election: (R_AUTORECOVERY, None),
        ur.auditor_election + "/V_0000000003": (R_AUTORECOVERY, None),
        ur.ctime(CtimeZnode.CHECK_ALL_LEDGERS): (R_AUTORECOVERY, None),
        ur.ctime(CtimeZnode.PLACEMENT_POLICY_CHECK): (R_AUTORECOVERY, None),
        ur.ctime(CtimeZnode.REPLICAS_CHECK): (R_AUTORECOVERY, None),
        ur.base + "/checkallledgersctime2": (R_OTHER, None),
        ur.layout: (R_OTHER, None),
        "/ledgers/idgen/ID-0000000001": (R_OTHER, None),
        "/ledgers/L0000000059": (R_IGNORED, None),  # a flat path: no ledger of the hierarchical manager
        "/ledgers/backup": (R_IGNORED, None),
        "/ledgers/00/0000/L0059.bak": (R_IGNORED, None),
        "/ledgers/LAYOUT": (R_OTHER, None),  # special znodes are not ignored ledger-tree znodes
        "/elsewhere": (R_OTHER, None),
    }
    for path, expected in cases.items():
        assert router.route(path) == expected, path
    assert router.route("/ledgers/available")[0] == R_BOOKIE_DIR


# ============================================================================================ ordered reads


@pytest.mark.integration
def test_ordered_reads_complete_in_notification_order(bk_services: Any, zk_chroot: str) -> None:
    watcher = bk_services.kazoo_client(zk_chroot)
    writer = bk_services.kazoo_client(zk_chroot)
    try:
        writer.ensure_path("/t")
        seen: list[tuple[str, Any]] = []
        lock = threading.Lock()

        def on_event(event: Any) -> None:
            with lock:
                seen.append(("event", (event.type, event.path)))
                if event.type in (EventType.CREATED, EventType.CHANGED):
                    reads.get(event.path, event.path)

        def deliver(token: Any, value: Any, error: Any) -> None:
            with lock:
                seen.append(("read", (token, value[0] if value else type(error).__name__)))

        reads = OrderedReads(watcher, deliver)
        PersistentWatches(watcher).add("/t", on_event)
        for i in range(30):
            writer.create(f"/t/n{i}", b"v0")
            writer.set(f"/t/n{i}", b"v1")
            writer.delete(f"/t/n{i}")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(seen) < 30 * 5:
            time.sleep(0.05)
        notifications = [value for kind, value in seen if kind == "event"]
        expected = [(t, f"/t/n{i}") for i in range(30) for t in ("CREATED", "CHANGED", "DELETED")]
        assert notifications == expected
        # A read never answers with data older than a notification delivered before it.
        newest: dict[str, str] = {}
        for kind, value in seen:
            if kind == "event":
                event_type, path = value
                newest[path] = {"CREATED": "v0", "CHANGED": "v1", "DELETED": "gone"}[event_type]
            else:
                path, answer = value
                allowed = {
                    "v0": (b"v0", b"v1", "NoNodeError"),
                    "v1": (b"v1", "NoNodeError"),
                    "gone": ("NoNodeError",),
                }
                assert answer in allowed[newest[path]], (path, newest[path], answer)
        assert len([1 for kind, _ in seen if kind == "read"]) == 60
    finally:
        for client in (watcher, writer):
            client.stop()
            client.close()


# ============================================================================================ the watcher


@pytest.mark.integration
def test_start_snapshot_then_every_live_change(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree, bookie_client: KazooClient
) -> None:
    tree.create_ledger(
        1, state=LedgerState.CLOSED, last_entry_id=9, pulsar_topic="public/default/persistent/t1"
    )
    tree.create_ledger(2)
    tree.create_ledger(3, format_version=2)
    tree.zk.create(tree.path(4), b"BookieMetadataFormatVersion\t3\n\xff\xff" + PASSWORD, makepath=True)
    tree.register(bookie_client, BOOKIES[0])
    tree.register(bookie_client, BOOKIES[1], readonly=True)
    for bookie in BOOKIES:
        tree.add_cookie(bookie)
    tree.mark(1, (BOOKIES[2],))
    tree.set_delay(b"30")
    tree.zk.create("/bookies", json.dumps({"default": {BOOKIES[0]: {"rack": "/r1"}}}).encode())
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot, rack_map_znode="/bookies")
    with running_watcher(settings) as (watcher, reader):
        assert watcher.wait_for_snapshots(1, 30)
        assert watcher.status.mode == "persistent"
        reader.wait_for(
            lambda evs: len([e for e in evs if e.HasField("snapshot_end")]) == reader_partitions(reader)
        )

        # --- the START snapshot: a FULL bracket on every partition, with every entity inside it
        begins = reader.events("snapshot_begin")
        partitions = {e.snapshot_begin.partition for e in begins}
        assert partitions == set(range(len(reader.partitions)))
        snapshot_id = begins[0].snapshot_begin.snapshot_id
        assert {e.snapshot_begin.reason for e in begins} == {pb.SnapshotBegin.START}
        assert {e.snapshot_begin.mode for e in begins} == {pb.SnapshotBegin.FULL}
        in_bracket = [e for e in reader.events() if e.snapshot_id == snapshot_id]
        upserts = {
            e.ledger_upserted.ledger_id: e.ledger_upserted
            for e in in_bracket
            if e.HasField("ledger_upserted")
        }
        assert set(upserts) == {1, 2, 3}
        closed = upserts[1]
        assert closed.metadata.state == pb.LedgerMetadata.CLOSED
        assert closed.metadata.last_entry_id == 9
        assert closed.metadata.pulsar_topic == "persistent://public/default/t1"
        assert closed.metadata.has_password and closed.metadata.digest_type == pb.LedgerMetadata.CRC32C
        assert list(closed.metadata.segments[0].ensemble) == list(BOOKIES)
        assert closed.path == tree.path(1)
        assert closed.znode.mzxid == tree.zk.exists(tree.path(1)).mzxid
        assert closed.metadata.creation_time_ms == tree.zk.exists(tree.path(1)).ctime  # znode ctime stands in
        assert upserts[3].metadata.format_version == 2
        undecodable = [e.ledger_undecodable for e in in_bracket if e.HasField("ledger_undecodable")]
        assert [u.ledger_id for u in undecodable] == [4]
        assert undecodable[0].znode.data_length > 0 and undecodable[0].reason
        statuses = {
            e.bookie_status.bookie_id: e.bookie_status for e in in_bracket if e.HasField("bookie_status")
        }
        assert statuses[BOOKIES[0]].status == pb.BookieStatus.WRITABLE
        assert statuses[BOOKIES[0]].rpc_address == "10.0.0.1:3181"
        assert statuses[BOOKIES[0]].has_cookie
        assert list(statuses[BOOKIES[0]].properties) == [pb.BookieStatus.Property(key="zone", value="a")]
        assert statuses[BOOKIES[1]].status == pb.BookieStatus.READ_ONLY
        assert statuses[BOOKIES[2]].status == pb.BookieStatus.GONE and statuses[BOOKIES[2]].has_cookie
        marks = [e.under_replication_mark for e in in_bracket if e.HasField("under_replication_mark")]
        assert [(m.ledger_id, list(m.replicas), m.mark_ctime_ms) for m in marks] == [
            (1, [BOOKIES[2]], 1718000000000)
        ]
        delays = [e.recovery_delay for e in in_bracket if e.HasField("recovery_delay")]
        assert [(d.present, d.seconds) for d in delays] == [(True, 30)]
        racks = [e.rack_map for e in reader.events("rack_map")]
        assert racks and racks[-1].entries[0].rack == "/r1" and racks[-1].source == "zookeeper:/bookies"
        ends = reader.events("snapshot_end")
        assert all(e.snapshot_end.complete for e in ends)
        # Each partition's END counts exactly the bracket events that partition received.
        for end in ends:
            received = [
                r
                for r in reader.records
                if r.partition == end.snapshot_end.partition
                and r.event.snapshot_id == snapshot_id
                and r.event.WhichOneof("payload") not in ("snapshot_begin", "snapshot_end")
            ]
            assert end.snapshot_end.partition_events == len(received)
        assert ends[0].snapshot_end.ledgers_scanned == 4 and ends[0].snapshot_end.ledgers_undecodable == 1

        # --- keys, partitions and per-entity order
        for record in reader.records:
            assert record.key == record.event.entity_key.encode()
            if not record.event.HasField("heartbeat") and record.event.entity_key != events.CLUSTER_KEY:
                assert record.partition == watcher.publisher.partition_for(record.event)

        # --- live changes
        tree.create_ledger(10)
        tree.set_ledger(10, state=LedgerState.CLOSED, last_entry_id=4)
        tree.delete_ledger(2)
        tree.register(bookie_client, BOOKIES[2])
        tree.unregister(bookie_client, BOOKIES[0])
        tree.mark(10, (BOOKIES[0], BOOKIES[1]))
        tree.unmark(1)
        tree.set_delay(b"0")
        tree.zk.set("/bookies", json.dumps({"default": {BOOKIES[0]: {"rack": "/r2"}}}).encode())
        reader.wait_for(
            lambda evs: any(e.HasField("rack_map") and e.rack_map.entries[0].rack == "/r2" for e in evs)
        )
        quiesce(watcher, reader)
        live = reader.events(live=True)
        states = [u.metadata.state for u in payloads(reader, "ledger_upserted", ledger_id=10)]
        assert states[-1] == pb.LedgerMetadata.CLOSED
        assert [(d.ledger_id, d.inferred) for d in payloads(reader, "ledger_deleted")] == [(2, False)]
        assert payloads(reader, "bookie_status", bookie_id=BOOKIES[2])[-1].status == pb.BookieStatus.WRITABLE
        assert payloads(reader, "bookie_status", bookie_id=BOOKIES[0])[-1].status == pb.BookieStatus.GONE
        assert payloads(reader, "bookie_status", bookie_id=BOOKIES[0])[-1].has_cookie
        assert list(payloads(reader, "under_replication_mark", ledger_id=10)[-1].replicas) == [
            BOOKIES[0],
            BOOKIES[1],
        ]
        assert (
            payloads(reader, "under_replication_mark", ledger_id=1)[-1].state
            == pb.UnderReplicationMark.CLEARED
        )
        assert payloads(reader, "recovery_delay")[-1].seconds == 0
        # Event time never goes back, sequence strictly increases, heartbeats reach every partition.
        ordered = reader.events()
        assert all(a.event_time_ms <= b.event_time_ms for a, b in itertools.pairwise(ordered))
        assert len({e.sequence for e in ordered}) == len(ordered)
        assert {e.heartbeat.partition for e in reader.events("heartbeat")} == set(
            range(len(reader.partitions))
        )
        assert live and all(e.watcher_run_id == watcher.run_id for e in live)
        assert_replay_matches(reader, tree)


def reader_partitions(reader: TopicReader) -> int:
    return len(reader.partitions)


@pytest.mark.integration
def test_the_recovery_delay_written_again_with_the_same_bytes_reaches_the_rule_and_ends_the_delay(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree, bookie_client: KazooClient
) -> None:
    """`bookkeeper shell triggeraudit` writes the delay in force again: ZooKeeper bumps the znode's version
    and fires NodeDataChanged, the watcher publishes the same value with the new mzxid, and the job's
    decoding and membership rule take it as an audit: the bookie missing within its delay is lost then."""
    path = UnderreplicationPaths(tree.root).lost_bookie_recovery_delay
    for bookie in BOOKIES:
        tree.add_cookie(bookie)
        tree.register(bookie_client, bookie)
    tree.set_delay(b"600")
    written = tree.zk.exists(path).mzxid
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot)
    with running_watcher(settings) as (watcher, reader):
        assert watcher.wait_for_snapshots(1, 30)
        tree.unregister(bookie_client, BOOKIES[0])
        reader.wait_for(lambda evs: any(s.status == pb.BookieStatus.GONE for s in _statuses(evs, BOOKIES[0])))
        tree.set_delay(b"600")
        rewritten = tree.zk.exists(path).mzxid
        assert rewritten > written and tree.zk.get(path)[0] == b"600"
        reader.wait_for(lambda evs: any(d.znode.mzxid == rewritten for d in _delays(evs)))
    delays = _delays(reader.events())
    assert [(d.seconds, d.znode.mzxid) for d in delays] == [(600, written), (600, rewritten)]
    audit_ms = next(
        e.event_time_ms for e in reader.events("recovery_delay") if e.recovery_delay.znode.mzxid == rewritten
    )
    _, decisions, _ = ClusterLogic(ProcessorConfig()).apply(
        None, membership_rows(records(reader.events()), lane_config())
    )
    lost = [(d["bookie_id"], d["event_time_ms"]) for d in decisions if d["kind"] == "bookie_lost"]
    assert lost == [(BOOKIES[0], audit_ms)]


@pytest.mark.integration
def test_a_cookie_created_again_or_rewritten_is_a_replacement_and_a_watcher_restart_is_not(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree, bookie_client: KazooClient
) -> None:
    """A bookie formatted again: its cookie deleted and created again (a new czxid), then rewritten with
    another instanceId (new bytes). The watcher publishes each cookie's stat and digest; a second watcher
    run publishes the last cookie again, which the job's rule does not take for a third replacement."""
    bookie, path = BOOKIES[0], cookie_path(BOOKIES[0], tree.root)
    tree.add_cookie(bookie)
    tree.register(bookie_client, bookie)
    first = tree.zk.exists(path).czxid
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot)

    def published(evs: list[pb.ChangeEvent], czxid: int, mzxid: int) -> bool:
        return any((s.cookie.czxid, s.cookie.mzxid) == (czxid, mzxid) for s in _statuses(evs, bookie))

    with running_watcher(settings) as (watcher, reader):
        assert watcher.wait_for_snapshots(1, 30)
        reader.wait_for(lambda evs: published(evs, first, first))
        tree.zk.delete(path)
        tree.add_cookie(bookie)
        second = tree.zk.exists(path).czxid
        reader.wait_for(lambda evs: published(evs, second, second))
        tree.zk.set(path, b'5\nbookieHost: "x"\ninstanceId: "formatted-again"\n')
        rewritten = tree.zk.exists(path).mzxid
        reader.wait_for(lambda evs: published(evs, second, rewritten))
    with running_watcher(settings) as (watcher, again):
        assert watcher.wait_for_snapshots(1, 30)
        quiesce(watcher, again)
    assert second > first and rewritten > second
    digests = {s.cookie_sha256 for s in _statuses(again.events(), bookie) if s.cookie.czxid}
    assert len(digests) == 2  # the first cookie's bytes, then the rewritten ones (recreated: same bytes)
    _, decisions, _ = ClusterLogic(ProcessorConfig()).apply(
        None, membership_rows(records(again.events()), lane_config())
    )
    replaced = [d["event_time_ms"] for d in decisions if d["payload"].get("cookie_replaced")]
    assert len(replaced) == 2, replaced


def _statuses(evs: list[pb.ChangeEvent], bookie_id: str) -> list[pb.BookieStatus]:
    return [
        e.bookie_status for e in evs if e.HasField("bookie_status") and e.bookie_status.bookie_id == bookie_id
    ]


def _delays(evs: list[pb.ChangeEvent]) -> list[pb.RecoveryDelay]:
    return [e.recovery_delay for e in evs if e.HasField("recovery_delay")]


@pytest.mark.integration
def test_cluster_level_changes_are_published_in_zookeeper_order(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree, bookie_client: KazooClient
) -> None:
    """An SRE raises the delay and restarts a bookie at once: the job must see the delay first.

    The delay change is a notification plus a read; a deleted registration needs no read. Applied as it
    arrives, the delete would overtake the delay's read and the job would judge the restart by the old
    delay (a false BOOKIE_LOST with delay 0). Deletes of cluster-level znodes wait behind earlier reads.
    """
    tree.register(bookie_client, BOOKIES[0])
    tree.set_delay(b"0")
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot)
    with running_watcher(settings) as (watcher, reader):
        assert watcher.wait_for_snapshots(1, 30)
        for round_number in range(5):
            tree.set_delay(str(30 + round_number).encode())
            tree.unregister(bookie_client, BOOKIES[0])
            tree.register(bookie_client, BOOKIES[0])
        quiesce(watcher, reader)
        live = [
            e
            for e in reader.events(live=True)
            if e.HasField("recovery_delay")
            or (e.HasField("bookie_status") and e.bookie_status.bookie_id == BOOKIES[0])
        ]
        seen = [
            f"delay={e.recovery_delay.seconds}"
            if e.HasField("recovery_delay")
            else pb.BookieStatus.Status.Name(e.bookie_status.status)
            for e in live
        ]
        # Each event applied to the state before it gives the states the job went through. Their
        # registrations must be ZooKeeper's, in its order, each judged by a delay at least as new as the one
        # ZooKeeper had then (never an older one: the point of this test). Not every state: a read that comes
        # late returns a later value (a busy machine does that), so a restart may be judged by the next
        # round's delay, and the watcher skips what it read over.
        went_through = [(0, "WRITABLE")]
        for round_number in range(5):
            delay = 30 + round_number
            went_through += [(delay, "WRITABLE"), (delay, "GONE"), (delay, "WRITABLE")]
        delay, status, published = 0, "WRITABLE", []
        for item in seen:
            if item.startswith("delay="):
                delay = int(item.split("=")[1])
            else:
                status = item
            if not published or published[-1] != (delay, status):  # a repeat changes nothing
                published.append((delay, status))
        assert published[-1] == (34, "WRITABLE"), seen
        delays = [int(item.split("=")[1]) for item in seen if item.startswith("delay=")]
        assert delays == sorted(delays), seen  # ZooKeeper's values only grew
        position = 0
        for published_delay, published_status in published:
            position = next(
                (
                    index
                    for index in range(position, len(went_through))
                    if went_through[index][1] == published_status
                    and went_through[index][0] <= published_delay
                ),
                -1,
            )
            assert position >= 0, (seen, published_delay, published_status)


def test_replaying_the_topic_after_a_storm_reproduces_zookeeper(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree, bookie_client: KazooClient
) -> None:
    rng = random.Random(20260101)
    for ledger_id in range(40):
        tree.create_ledger(ledger_id)
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot, snapshot_concurrency=16)
    with running_watcher(settings) as (watcher, reader):
        storm(tree, bookie_client, rng, operations=300)
        assert watcher.wait_for_snapshots(1, 30)
        quiesce(watcher, reader)
        assert_replay_matches(reader, tree)
        assert reader.records and all(PASSWORD not in r.value for r in reader.records)
        assert 0 < watcher._slots.peak <= 16  # snapshot reads never exceeded snapshot_concurrency


def storm(tree: ClusterTree, bookie_client: KazooClient, rng: random.Random, operations: int) -> None:
    """Random creates, updates, deletes of ledgers, marks and bookie registrations."""
    for _ in range(operations):
        ledger_id = rng.randrange(0, 120) * rng.choice((1, 1, 1, 1000))  # a few in other directories
        action = rng.random()
        try:
            if action < 0.35:
                tree.create_ledger(ledger_id)
            elif action < 0.6:
                tree.set_ledger(ledger_id, state=LedgerState.CLOSED, last_entry_id=rng.randrange(100))
            elif action < 0.8:
                tree.delete_ledger(ledger_id)
            elif action < 0.87:
                tree.mark(ledger_id, (rng.choice(BOOKIES),))
            elif action < 0.92:
                tree.unmark(ledger_id)
            else:
                bookie = rng.choice(BOOKIES)
                readonly = rng.random() < 0.5
                try:
                    tree.register(bookie_client, bookie, readonly=readonly)
                except NodeExistsError:
                    tree.unregister(bookie_client, bookie, readonly=readonly)
        except (NoNodeError, NodeExistsError):
            pass


class ReaddGate:
    """Holds the watcher's persistent-watch re-add until released: changes made meanwhile are unwatched."""

    def __init__(self, watcher: ChangeWatcher) -> None:
        self.blocked = threading.Event()
        self.release = threading.Event()
        original = watcher._readd_watches

        def gated() -> bool:
            self.blocked.set()
            self.release.wait(30)
            return original()

        watcher._readd_watches = gated  # type: ignore[method-assign]


@pytest.mark.integration
def test_session_expiry_loses_no_change(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree, bookie_client: KazooClient
) -> None:
    for ledger_id in range(10):
        tree.create_ledger(ledger_id)
    tree.mark(3, (BOOKIES[0],))
    tree.register(bookie_client, BOOKIES[0])
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot)
    with running_watcher(settings) as (watcher, reader):
        assert watcher.wait_for_snapshots(1, 30)
        gate = ReaddGate(watcher)
        old_session = watcher.zookeeper.client_id[0]
        bk_services.expire_session(watcher.zookeeper)
        assert watcher.zookeeper.client_id[0] != old_session
        assert gate.blocked.wait(10)
        unwatched_from_ms = time.time() * 1000
        # The server forgot the persistent watch with the session: nothing below is seen live.
        tree.create_ledger(100)
        tree.set_ledger(1, state=LedgerState.CLOSED, last_entry_id=3)
        tree.delete_ledger(2)
        tree.unmark(3)
        tree.mark(5, (BOOKIES[1],))
        tree.unregister(bookie_client, BOOKIES[0])
        tree.register(bookie_client, BOOKIES[1], readonly=True)
        time.sleep(0.5)
        unwatched_until_ms = time.time() * 1000
        gate.release.set()
        assert watcher.wait_for_snapshots(2, 30)
        quiesce(watcher, reader)
        reconciliation = [
            e
            for e in reader.events("snapshot_begin")
            if e.snapshot_begin.reason == pb.SnapshotBegin.SESSION_EXPIRED
        ]
        assert reconciliation and reconciliation[0].snapshot_begin.mode == pb.SnapshotBegin.DELTA
        snapshot_id = reconciliation[0].snapshot_begin.snapshot_id
        bracket = [
            e for e in reader.events() if e.snapshot_id == snapshot_id and e.entity_key != events.CLUSTER_KEY
        ]
        kinds = {(e.WhichOneof("payload"), e.entity_key) for e in bracket}
        # Only the differences are published, each inside the reconciliation bracket.
        assert ("ledger_upserted", "ledger/100") in kinds
        assert ("ledger_upserted", "ledger/1") in kinds
        assert ("ledger_deleted", "ledger/2") in kinds
        assert ("under_replication_mark", "ledger/3") in kinds and (
            "under_replication_mark",
            "ledger/5",
        ) in kinds
        assert ("bookie_status", f"bookie/{BOOKIES[0]}") in kinds and (
            "bookie_status",
            f"bookie/{BOOKIES[1]}",
        ) in kinds
        assert ("ledger_upserted", "ledger/7") not in kinds  # unchanged: not republished
        deleted = [e.ledger_deleted for e in bracket if e.HasField("ledger_deleted")]
        assert deleted[0].inferred and deleted[0].last_mzxid > 0
        # Heartbeats (event-time progress) paused from the session loss until the reconciliation was out.
        end = [e for e in reader.events("snapshot_end") if e.snapshot_id == snapshot_id][-1]
        paused = [
            e for e in reader.events("heartbeat") if unwatched_from_ms < e.event_time_ms < end.event_time_ms
        ]
        assert not paused and end.event_time_ms > unwatched_until_ms
        # And the live watch is back.
        tree.create_ledger(101)
        reader.wait_for(lambda evs: any(e.entity_key == "ledger/101" for e in evs))
        quiesce(watcher, reader)
        assert_replay_matches(reader, tree)


@pytest.mark.integration
def test_changes_during_a_zookeeper_restart_appear_after_reconnect(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree
) -> None:
    for ledger_id in range(10):
        tree.create_ledger(ledger_id)
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot)
    with running_watcher(settings) as (watcher, reader):
        assert watcher.wait_for_snapshots(1, 30)
        gate = ReaddGate(watcher)
        bk_services.restart_zookeeper(downtime=0.5)
        assert gate.blocked.wait(20)
        writer = bk_services.kazoo_client(zk_chroot)
        try:
            moved = ClusterTree(writer, tree.root, tree.manager)
            moved.create_ledger(200)
            moved.set_ledger(3, state=LedgerState.CLOSED, last_entry_id=1)
            moved.delete_ledger(4)
            gate.release.set()
            assert watcher.wait_for_snapshots(2, 30)
            quiesce(watcher, reader)
            reasons = [e.snapshot_begin.reason for e in reader.events("snapshot_begin")]
            assert pb.SnapshotBegin.RECONNECT in reasons or pb.SnapshotBegin.SESSION_EXPIRED in reasons
            assert payloads(reader, "ledger_upserted", ledger_id=200)
            assert payloads(reader, "ledger_deleted", ledger_id=4)
            assert (
                payloads(reader, "ledger_upserted", ledger_id=3)[-1].metadata.state
                == pb.LedgerMetadata.CLOSED
            )
            assert_replay_matches(reader, ClusterTree(writer, tree.root, tree.manager))
        finally:
            writer.stop()
            writer.close()


@pytest.mark.integration
def test_a_storm_across_a_session_expiry_is_replayed_exactly(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree, bookie_client: KazooClient
) -> None:
    for ledger_id in range(30):
        tree.create_ledger(ledger_id)
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot)
    with running_watcher(settings) as (watcher, reader):
        assert watcher.wait_for_snapshots(1, 30)
        stop = threading.Event()

        def keep_writing() -> None:
            rng = random.Random(7)
            while not stop.is_set():
                storm(tree, bookie_client, rng, operations=5)
                time.sleep(0.01)

        writer = threading.Thread(target=keep_writing)
        writer.start()
        try:
            time.sleep(0.3)
            bk_services.expire_session(watcher.zookeeper)
            time.sleep(0.5)
        finally:
            stop.set()
            writer.join()
        assert watcher.wait_for_snapshots(2, 30)
        quiesce(watcher, reader)
        assert_replay_matches(reader, tree)


@pytest.mark.integration
def test_fallback_mode_without_addwatch(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree, bookie_client: KazooClient
) -> None:
    for ledger_id in range(20):
        tree.create_ledger(ledger_id)
    tree.mark(4, (BOOKIES[0],))
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot, watch_mode="fallback")
    with running_watcher(settings) as (watcher, reader):
        assert watcher.wait_for_snapshots(1, 30)
        assert watcher.status.mode == "fallback"
        tree.create_ledger(5_000_000)  # a new directory
        tree.set_ledger(1, state=LedgerState.CLOSED, last_entry_id=2)
        tree.delete_ledger(2)
        tree.register(bookie_client, BOOKIES[0])
        tree.add_cookie(BOOKIES[0])
        tree.mark(6, (BOOKIES[1],))
        tree.unmark(4)
        tree.set_delay(b"15")
        reader.wait_for(
            lambda evs: any(e.HasField("recovery_delay") and e.recovery_delay.seconds == 15 for e in evs)
        )
        reader.wait_for(lambda evs: any(e.entity_key == "ledger/5000000" for e in evs))
        storm(tree, bookie_client, random.Random(3), operations=150)
        quiesce(watcher, reader, 1.5)
        assert payloads(reader, "ledger_upserted", ledger_id=1)[-1].metadata.state == pb.LedgerMetadata.CLOSED
        assert payloads(reader, "ledger_deleted", ledger_id=2)
        assert payloads(reader, "bookie_status", bookie_id=BOOKIES[0])
        assert_replay_matches(reader, tree)
        # Session expiry in fallback mode: every one-shot watch is re-armed by the reconciliation.
        bk_services.expire_session(watcher.zookeeper)
        assert watcher.wait_for_snapshots(2, 30)
        tree.create_ledger(77)
        tree.set_ledger(3, state=LedgerState.CLOSED, last_entry_id=5)
        reader.wait_for(lambda evs: any(e.entity_key == "ledger/77" for e in evs))
        quiesce(watcher, reader)
        assert_replay_matches(reader, tree)


@pytest.mark.integration
def test_a_server_without_addwatch_gets_the_fallback_automatically(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(PersistentWatches, "supported", lambda self, timeout=10.0: False)  # a 3.5 server
    tree.create_ledger(1)
    with running_watcher(watcher_settings(bk_services, kafka_settings, zk_chroot)) as (watcher, reader):
        assert watcher.status.mode == "fallback" and watcher.fallback_mode and not watcher._multi_read
        assert watcher.wait_for_snapshots(1, 30)
        tree.create_ledger(2)
        reader.wait_for(lambda evs: any(e.entity_key == "ledger/2" for e in evs))


@pytest.mark.integration
@pytest.mark.parametrize(
    "manager",
    [LedgerManagerType.FLAT, LedgerManagerType.LONG_HIERARCHICAL, LedgerManagerType.LEGACY_HIERARCHICAL],
)
def test_every_ledger_manager_under_a_custom_root(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, zk_client: KazooClient, manager: LedgerManagerType
) -> None:
    tree = ClusterTree(zk_client, "/pulsar/bk/ledgers", manager).init()
    ids = [0, 59, 12345, 2**31 - 2]
    if manager is LedgerManagerType.LONG_HIERARCHICAL:
        ids.append(2**40)
    for ledger_id in ids:
        tree.create_ledger(ledger_id)
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot)
    settings.zookeeper.ledgers_root = tree.root
    with running_watcher(settings) as (watcher, reader):
        assert watcher.manager is manager
        assert watcher.wait_for_snapshots(1, 30)
        tree.create_ledger(7)
        tree.delete_ledger(59)
        reader.wait_for(
            lambda evs: any(e.entity_key == "ledger/59" and e.HasField("ledger_deleted") for e in evs)
        )
        quiesce(watcher, reader)
        assert_replay_matches(reader, tree)


@pytest.mark.integration
def test_a_ledger_znode_with_garbage_after_valid_metadata_is_undecodable(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree
) -> None:
    tree.create_ledger(1)
    garbage = bytes(range(256)) * (3 * 1024 * 1024 // 256)  # 3 MiB after a complete v3 record
    tree.zk.create(tree.path(2), ledger_metadata(2) + garbage, makepath=True)
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot)
    with running_watcher(settings) as (watcher, reader):
        assert watcher.wait_for_snapshots(1, 30)
        reader.wait_for(lambda evs: any(e.HasField("ledger_undecodable") for e in evs))
        quiesce(watcher, reader)
        assert {u.ledger_id for u in payloads(reader, "ledger_upserted")} == {1}
        [bad] = payloads(reader, "ledger_undecodable")
        assert bad.ledger_id == 2 and bad.znode.data_length > len(garbage)
        assert bad.reason == f"ledger metadata v3: {len(garbage)} trailing bytes after the metadata"


def with_new_field(znode: bytes) -> bytes:
    """A v3 ledger znode plus field 100, which a newer BookKeeper might write and this schema lacks."""
    header = znode[: znode.index(b"\n") + 1]
    after = znode[len(header) :]
    prefix_length = next(index + 1 for index, byte in enumerate(after) if byte < 0x80)
    body = after[prefix_length:] + b"\xa0\x06\x05"  # field 100, varint 5
    assert len(body) < 0x80  # a one-byte length prefix
    return header + bytes([len(body)]) + body


@pytest.mark.integration
def test_a_ledger_znode_with_a_field_a_newer_bookkeeper_added_is_published_not_undecodable(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree
) -> None:
    znode = with_new_field(ledger_metadata(3, state=LedgerState.CLOSED, last_entry_id=9))
    tree.zk.create(tree.path(3), znode, makepath=True)
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot)
    with running_watcher(settings) as (watcher, reader):
        assert watcher.wait_for_snapshots(1, 30)
        reader.wait_for(lambda evs: any(e.HasField("ledger_upserted") for e in evs))
        quiesce(watcher, reader)
        assert payloads(reader, "ledger_undecodable") == []
        [upserted] = payloads(reader, "ledger_upserted")
        md = upserted.metadata
        assert upserted.ledger_id == 3 and md.last_entry_id == 9 and md.length == 1000
        assert [tuple(segment.ensemble) for segment in md.segments] == [BOOKIES]


def ignored_count(watcher: ChangeWatcher, reason: str) -> float:
    value = watcher.metrics.registry.get_sample_value(
        "bkaudit_watcher_ignored_znodes_total", {"reason": reason}
    )
    return value or 0.0


@pytest.mark.integration
def test_znodes_in_the_ledger_tree_that_are_not_ledgers_are_counted_and_logged_once(
    bk_services: Any,
    kafka_settings: Any,
    zk_chroot: str,
    tree: ClusterTree,
    caplog: pytest.LogCaptureFixture,
) -> None:
    tree.create_ledger(1)
    tree.zk.create("/ledgers/backup", PASSWORD, makepath=True)  # foreign data: its bytes are never logged
    tree.zk.create("/ledgers/00/0000/L0001.bak", PASSWORD)
    tree.zk.create("/ledgers/L0000000002", ledger_metadata(2))  # a flat manager's ledger path
    caplog.set_level(logging.INFO, logger="connectors.zookeeper.ledger_tree")
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot, reconciliation_interval_s=1.0)
    with running_watcher(settings) as (watcher, reader):
        assert watcher.wait_for_snapshots(2, 30)  # START, then a periodic scan sees them again
        assert ignored_count(watcher, "not_a_ledger_path") >= 4
        assert ignored_count(watcher, "other_ledger_manager") >= 2
        before = ignored_count(watcher, "not_a_ledger_path")
        tree.zk.create("/ledgers/notes", b"")  # a live notification
        deadline = time.monotonic() + 20
        while ignored_count(watcher, "not_a_ledger_path") == before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ignored_count(watcher, "not_a_ledger_path") > before
        quiesce(watcher, reader)
        assert {e.ledger_upserted.ledger_id for e in reader.events("ledger_upserted")} == {1}
    lines = [r.getMessage() for r in caplog.records if r.name == "connectors.zookeeper.ledger_tree"]
    ignored = [line for line in lines if line.startswith("ignoring znode ")]
    assert sorted(ignored) == sorted(
        [
            "ignoring znode /ledgers/00/0000/L0001.bak: "
            "not a ledger znode of the hierarchical ledger manager (not_a_ledger_path)",
            "ignoring znode /ledgers/L0000000002: "
            "not a ledger znode of the hierarchical ledger manager (other_ledger_manager)",
            "ignoring znode /ledgers/backup: "
            "not a ledger znode of the hierarchical ledger manager (not_a_ledger_path)",
            "ignoring znode /ledgers/notes: "
            "not a ledger znode of the hierarchical ledger manager (not_a_ledger_path)",
        ]
    )
    assert all(r.levelno == logging.INFO for r in caplog.records if r.getMessage() in ignored)
    assert not [line for line in lines if PASSWORD.decode() in line]


@pytest.mark.integration
def test_rack_map_from_a_file_and_from_another_zookeeper(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree, tmp_path: Path
) -> None:
    rack_file = tmp_path / "racks.json"
    rack_file.write_text(json.dumps({BOOKIES[0]: "/a"}))
    settings = watcher_settings(
        bk_services, kafka_settings, zk_chroot, rack_map_file=str(rack_file), rack_map_poll_s=0.1
    )
    with running_watcher(settings) as (_, reader):
        reader.wait_for(lambda evs: any(e.HasField("rack_map") for e in evs))
        rack_file.write_text(json.dumps({BOOKIES[0]: "/b", BOOKIES[1]: "/c"}))
        reader.wait_for(lambda evs: any(e.HasField("rack_map") and len(e.rack_map.entries) == 2 for e in evs))
        rack_file.write_text("{not json")
        reader.wait_for(lambda evs: any(e.HasField("rack_map") and e.rack_map.error for e in evs))
        assert reader.events("rack_map")[0].rack_map.source == f"file:{rack_file}"

    other = bk_services.new_chroot()  # stands for Pulsar's own ZooKeeper
    pulsar_zk = bk_services.kazoo_client(other)
    try:
        settings = watcher_settings(
            bk_services,
            bk_services.kafka_settings(),
            zk_chroot,
            rack_map_znode="/bookies",
            rack_map_zookeeper=bk_services.zookeeper_hosts(other),
        )
        with running_watcher(settings) as (_, reader):
            reader.wait_for(lambda evs: any(e.HasField("rack_map") and not e.rack_map.present for e in evs))
            pulsar_zk.create(
                "/bookies", json.dumps({"g": {BOOKIES[2]: {"rack": "r9", "hostname": "h"}}}).encode()
            )
            reader.wait_for(lambda evs: any(e.HasField("rack_map") and e.rack_map.present for e in evs))
            entry = reader.events("rack_map")[-1].rack_map.entries[0]
            assert (entry.bookie_id, entry.rack, entry.hostname, entry.group) == (BOOKIES[2], "/r9", "h", "g")
            pulsar_zk.delete("/bookies")
            reader.wait_for(lambda evs: not evs_of(evs, "rack_map")[-1].rack_map.present)
    finally:
        pulsar_zk.stop()
        pulsar_zk.close()


@pytest.mark.integration
def test_delivery_failure_republishes_a_full_snapshot_and_metrics_are_served(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree
) -> None:
    for ledger_id in range(5):
        tree.create_ledger(ledger_id)
    port = _free_port()
    settings = watcher_settings(
        bk_services, kafka_settings, zk_chroot, metrics_port=port, metrics_host="127.0.0.1"
    )
    with running_watcher(settings) as (watcher, reader):
        assert watcher.wait_for_snapshots(1, 30)
        watcher.publisher._unacked.acquire()  # a record in flight...
        watcher.publisher._failed_delivery("ledger_upserted", TimeoutError())  # ...fails, as reported
        assert watcher.wait_for_snapshots(2, 30)
        reader.wait_for(lambda evs: len(evs_of(evs, "snapshot_end")) == 2 * len(reader.partitions))
        second = reader.events("snapshot_begin")[-1].snapshot_begin
        assert (second.reason, second.mode) == (pb.SnapshotBegin.PUBLISH_FAILED, pb.SnapshotBegin.FULL)
        bracket = [e for e in reader.events("ledger_upserted") if e.snapshot_id == second.snapshot_id]
        assert len(bracket) == 5  # everything again, not only differences
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        for name in (
            'bkaudit_watcher_events_published_total{type="ledger_upserted"}',
            "bkaudit_watcher_snapshot_duration_seconds",
            "bkaudit_watcher_watch_registrations_total",
            'bkaudit_watcher_zookeeper_session_state{state="CONNECTED"} 1.0',
            "bkaudit_watcher_publish_lag_seconds_bucket",
            "bkaudit_watcher_last_heartbeat_timestamp_seconds",
            "bkaudit_watcher_change_to_kafka_seconds_bucket",
            "bkaudit_watcher_unacked_events",
        ):
            assert name in body, name


def evs_of(evs: list[pb.ChangeEvent], kind: str) -> list[pb.ChangeEvent]:
    return [e for e in evs if e.WhichOneof("payload") == kind]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.integration
def test_clean_shutdown_flushes_everything_and_a_restart_resumes_with_a_full_snapshot(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree
) -> None:
    for ledger_id in range(30):
        tree.create_ledger(ledger_id)
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot)
    first = ChangeWatcher(settings)
    first.start()
    assert first.wait_for_snapshots(1, 30)
    for ledger_id in range(30, 60):
        tree.create_ledger(ledger_id)
    time.sleep(0.3)
    first.stop()
    assert first.publisher.sent == first.publisher.delivered and first.publisher.delivery_failures == 0
    tree.delete_ledger(5)  # while no watcher runs
    with running_watcher(settings) as (second, reader):
        assert second.wait_for_snapshots(1, 30)
        quiesce(second, reader)
        assert len(reader.records) == first.publisher.sent + second.publisher.sent - _unsent(second, reader)
        runs = {e.watcher_run_id for e in reader.events()}
        assert runs == {first.run_id, second.run_id}
        begins = [
            e.snapshot_begin for e in reader.events("snapshot_begin") if e.watcher_run_id == second.run_id
        ]
        assert begins[0].reason == pb.SnapshotBegin.START and begins[0].mode == pb.SnapshotBegin.FULL
        state = assert_replay_matches(reader, tree)  # ledger 5 vanished: inferred from the FULL bracket
        assert 5 not in state.ledgers and 5 in state.tombstones


def _unsent(watcher: ChangeWatcher, reader: TopicReader) -> int:
    # Records the running watcher handed to the producer but not yet read back (heartbeats since the drain).
    return watcher.publisher.sent - len(
        [r for r in reader.records if r.event.watcher_run_id == watcher.run_id]
    )


@pytest.mark.integration
def test_the_watch_command_publishes_a_snapshot_and_exits(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree, cli: Any
) -> None:
    for ledger_id in range(3):
        tree.create_ledger(ledger_id)
    result = cli(
        "watch",
        "--zookeeper",
        bk_services.zookeeper_hosts(zk_chroot),
        "--bootstrap",
        kafka_settings.bootstrap_servers,
        "--topic",
        kafka_settings.changes_topic,
        "--partitions",
        "2",
        "--exit-after-snapshot",
    )
    assert result.exit_code == 0, result.stderr
    reader = TopicReader(kafka_settings, kafka_settings.changes_topic)
    try:
        reader.drain()
        assert len(reader.partitions) == 2
        assert {p.ledger_id for p in payloads(reader, "ledger_upserted")} == {0, 1, 2}
        assert len(reader.events("snapshot_end")) == 2
    finally:
        reader.close()


@pytest.mark.integration
def test_periodic_reconciliation_catches_a_lost_notification(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree
) -> None:
    for ledger_id in range(5):
        tree.create_ledger(ledger_id)
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot, reconciliation_interval_s=1.0)
    with running_watcher(settings) as (watcher, reader):
        assert watcher.wait_for_snapshots(2, 30)  # START, then a PERIODIC one with nothing to publish
        delta = pb.SnapshotBegin.DELTA
        reader.wait_for(
            lambda evs: any(e.HasField("snapshot_end") and e.snapshot_end.mode == delta for e in evs)
        )
        periodic = [e.snapshot_end for e in reader.events("snapshot_end") if e.snapshot_end.mode == delta]
        assert periodic[0].complete and periodic[0].partition_events == 0 and periodic[0].ledgers_scanned == 5
        # Lose every notification about ledger 3 (as a bug or a dropped packet would): the next periodic
        # reconciliation still publishes its change and its deletion.
        original = watcher._on_persistent_event
        watcher._on_persistent_event = lambda event: None if event.path.endswith("L0003") else original(event)  # type: ignore[method-assign]
        watcher._persistent._registrations[0] = dataclasses.replace(  # type: ignore[union-attr]
            watcher._persistent._registrations[0],  # type: ignore[union-attr]
            callback=watcher._on_persistent_event,
        )
        tree.set_ledger(3, state=LedgerState.CLOSED, last_entry_id=1)
        reader.wait_for(
            lambda evs: any(
                e.HasField("ledger_upserted") and e.ledger_upserted.ledger_id == 3 and e.snapshot_id
                for e in evs[5:]
            ),
            timeout_s=10,
        )
        tree.delete_ledger(3)
        reader.wait_for(
            lambda evs: any(e.HasField("ledger_deleted") and e.ledger_deleted.inferred for e in evs), 10
        )
        quiesce(watcher, reader)
        assert_replay_matches(reader, tree)


@pytest.mark.integration
def test_digest_auth_is_used_and_credentials_are_never_logged(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, caplog: pytest.LogCaptureFixture
) -> None:
    from kazoo.security import make_digest_acl

    secret = "zk-Secret-4242"
    acl = [make_digest_acl("auditor", secret, all=True)]
    owner = bk_services.kazoo_client(
        zk_chroot,
        auth_data=[("digest", f"auditor:{secret}")],
        default_acl=acl,
        logger=logging.getLogger("test.owner"),  # the test's own client may log what it likes
    )
    try:
        tree = ClusterTree(owner).init()
        tree.create_ledger(1)
        anonymous = bk_services.kazoo_client(zk_chroot)
        try:
            with pytest.raises(NoAuthError):
                anonymous.get(tree.path(1))
        finally:
            anonymous.stop()
            anonymous.close()
        settings = watcher_settings(bk_services, kafka_settings, zk_chroot)
        settings.zookeeper.auth_scheme = "digest"
        settings.zookeeper.auth_username = "auditor"
        settings.zookeeper.auth_password = SecretStr(secret)
        caplog.set_level(logging.DEBUG)
        with running_watcher(settings) as (watcher, reader):
            assert watcher.wait_for_snapshots(1, 30)
            reader.wait_for(lambda evs: any(e.HasField("ledger_upserted") for e in evs))
        watcher_logs = [r.getMessage() for r in caplog.records if r.name != "test.owner"]
        assert any("Auth(" in m for m in watcher_logs)  # kazoo did log the auth request...
        assert not [m for m in watcher_logs if secret in m]  # ...without the secret
        assert secret not in repr(settings)
    finally:
        owner.stop()
        owner.close()


@pytest.mark.integration
def test_changes_during_a_broker_outage_are_delivered_when_it_returns(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree
) -> None:
    from connectors.kafka.topics import ensure_topic

    tree.create_ledger(1)
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot)
    watcher = ChangeWatcher(settings)
    watcher.start()
    try:
        assert watcher.wait_for_snapshots(1, 30)
        bk_services.stop_broker(lose_data=True)
        # Published into the producer's buffer and retried until the broker is back.
        for ledger_id in range(100, 110):
            tree.create_ledger(ledger_id)
        time.sleep(1.5)
        bk_services.start_broker()
        # The broker lost its topics: recreate ours, as an operator would after losing it.
        ensure_topic(settings.kafka, settings.kafka.changes_topic, watcher.publisher.partition_count)
        reader = TopicReader(settings.kafka, settings.kafka.changes_topic)
        try:
            reader.wait_for(
                lambda evs: (
                    {p.ledger_id for p in (e.ledger_upserted for e in evs_of(evs, "ledger_upserted"))}
                    >= set(range(100, 110))
                ),
                # A real broker's re-created topic can stall the producer: it is replaced after
                # PRODUCER_STALL_S without an acknowledgement, and a FULL snapshot republishes.
                timeout_s=120,
            )
            if watcher.publisher.delivery_failures:
                # Records the broker refused while it came back (e.g. before the topic was recreated) are
                # not lost: a FULL snapshot republishes everything.
                reader.wait_for(lambda evs: _republished(evs), timeout_s=60)
        finally:
            reader.close()
    finally:
        watcher.stop(timeout_s=15)


@pytest.mark.integration
def test_a_broker_that_lost_the_topic_gets_a_full_snapshot_in_the_new_topic(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, tree: ClusterTree
) -> None:
    """The broker restarts empty: the watcher notices the acknowledged offsets going backwards (whether or
    not some record also failed on the way), learns the recreated topic's partitions and republishes
    everything there, bracketed on every partition."""
    for ledger_id in range(5):
        tree.create_ledger(ledger_id)
    kafka = kafka_settings.model_copy(update={"topic_partitions": 2})
    settings = watcher_settings(bk_services, kafka, zk_chroot)
    watcher = ChangeWatcher(settings)
    watcher.start()
    try:
        assert watcher.wait_for_snapshots(1, 30)
        watcher.publisher.flush(10)
        bk_services.stop_broker(lose_data=True)
        bk_services.start_broker()  # the topic is gone; the next client's metadata request recreates it
        assert watcher.wait_for_snapshots(2, 60)
        reader = TopicReader(settings.kafka, settings.kafka.changes_topic)
        try:
            reader.wait_for(_republished, timeout_s=60)
            again = reader.events("snapshot_begin")[-1]
            bracket = [e for e in reader.events("ledger_upserted") if e.snapshot_id == again.snapshot_id]
            assert sorted(e.ledger_upserted.ledger_id for e in bracket) == list(range(5))
            # Whoever recreates the topic first decides its partitions (the broker's default of 4 when a
            # client's metadata request auto-creates it, the configured 2 when the watcher's own creation
            # wins): the watcher publishes to every partition the topic has now, bracketed on each.
            assert watcher.publisher.partition_count == len(reader.partitions)
            ends = [e for e in reader.events("snapshot_end") if e.snapshot_id == again.snapshot_id]
            assert len(ends) == len(reader.partitions)
            assert watcher.metrics.topic_losses._value.get() >= 1
        finally:
            reader.close()
    finally:
        watcher.stop(timeout_s=15)


def _republished(evs: list[pb.ChangeEvent]) -> bool:
    """A complete FULL snapshot with reason PUBLISH_FAILED is on the topic: its end on every partition (the
    reader reads the partitions one after the other, so one end alone says nothing of the others)."""
    failed = {
        e.snapshot_id
        for e in evs_of(evs, "snapshot_begin")
        if e.snapshot_begin.reason == pb.SnapshotBegin.PUBLISH_FAILED
    }
    ended: dict[str, set[int]] = {}
    counts: dict[str, int] = {}
    for e in evs_of(evs, "snapshot_end"):
        if e.snapshot_id in failed and e.snapshot_end.complete:
            ended.setdefault(e.snapshot_id, set()).add(e.snapshot_end.partition)
            counts[e.snapshot_id] = e.snapshot_end.partition_count
    return any(parts == set(range(counts[sid])) for sid, parts in ended.items())


# ============================================================================================ no services


class _FullQueueProducer:
    """A producer whose queue is full for the first ``refusals`` produces (librdkafka's BufferError)."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.sent: list[tuple[str, bytes, bytes, int]] = []
        self.reports: list[Any] = []

    def produce(self, topic: str, *, value: bytes, key: bytes, partition: int, on_delivery: Any) -> None:
        if self.refusals > 0:
            self.refusals -= 1
            raise BufferError("Local: Queue full")
        self.sent.append((topic, key, value, partition))
        self.reports.append(on_delivery)

    def poll(self, timeout: float = -1) -> int:
        return 0


class _Delivered:
    """What librdkafka hands a delivery report: the message with its partition and offset."""

    def __init__(self, partition: int, offset: int) -> None:
        self._partition, self._offset = partition, offset

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


def test_publisher_blocks_on_a_full_buffer_instead_of_dropping_and_flags_failed_deliveries() -> None:
    from confluent_kafka import KafkaError

    from connectors.kafka.publisher import ChangePublisher, partition_for_key
    from connectors.kafka.tail_sender import TailSender
    from core.settings import KafkaSettings

    delivered: list[tuple[str, int]] = []
    publisher = ChangePublisher(
        KafkaSettings(), "t", on_delivered=lambda kind, t, _change: delivered.append((kind, t))
    )
    producer = _FullQueueProducer(refusals=3)
    # Straight sends (no held tails) so each publish reaches the producer at once; no blocking window, so
    # each refusal comes back to the publisher, which keeps trying.
    publisher._producer, publisher.partition_count = producer, 8
    publisher._sender = TailSender(producer, hold_tails=False, max_block_s=0.0)
    event = events.EventBuilder("c", "r", clock_ms=lambda: 5).build(events.ledger_deleted(42))
    partition = publisher.publish(event)
    assert partition == partition_for_key(b"ledger/42", 8)
    assert producer.sent == [
        ("t", b"ledger/42", events.encode_event(event), partition)
    ]  # sent once, not lost
    assert publisher.publish(event, partition=3) == 3
    producer.reports[0](None, _Delivered(partition, 0))
    assert delivered == [("ledger_deleted", 5)] and publisher.delivered == 1
    producer.reports[1](KafkaError(KafkaError._MSG_TIMED_OUT), None)
    assert publisher.failed and publisher.delivery_failures == 1
    publisher.clear_failed()
    assert not publisher.failed
    # Shutting down: a send that cannot get queue space gives up instead of blocking forever.
    producer.refusals = 1
    publisher.abort()
    with pytest.raises(Exception, match="queue stayed full"):
        publisher.publish(event)


def test_progress_line_draws_only_on_a_terminal() -> None:
    import io

    from connectors.zookeeper.snapshot import ProgressLine

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal, pipe = Terminal(), io.StringIO()
    for stream in (terminal, pipe):
        line = ProgressLine(stream)
        line.update("snapshot start running: 10 ledgers read", force=True)
        line.update("snapshot start running: 20 ledgers read")  # rate-limited: not drawn
        line.finish("snapshot start done: 30 ledgers read")
    # The shorter final text is padded so that it overwrites the longer one completely.
    assert terminal.getvalue() == (
        "\rsnapshot start running: 10 ledgers read\rsnapshot start done: 30 ledgers read   \n"
    )
    assert pipe.getvalue() == ""
