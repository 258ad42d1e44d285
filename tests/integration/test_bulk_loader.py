"""The bulk loader on the real embedded ZooKeeper: paths, metadata, rack-awareness, idempotence, index."""

from __future__ import annotations

import io
import os
import signal
import threading
from collections import defaultdict

import pytest

from bkaudit.sim import bulk
from bkaudit.sim.bulk import (
    BulkLoadSpec,
    bookie_ledger_index,
    bulk_load,
    plan_ledgers,
    planned_metadata,
    synthetic_bookies,
)
from core.domain.layout import LedgerManagerType, layout_path, ledger_path
from core.domain.metadata import LedgerState, decode_ledger_metadata, encode_ledger_metadata
from core.errors import ConfigError

pytestmark = pytest.mark.integration

ROOT = "/ledgers"
COUNT = 5_000


@pytest.fixture
def client(bk_services, zk_chroot):
    kazoo = bk_services.kazoo_client(zk_chroot)
    try:
        yield kazoo
    finally:
        kazoo.stop()
        kazoo.close()


def _read_all(client, ids, manager=LedgerManagerType.HIERARCHICAL, root=ROOT):
    """Ledger id → (data, stat), fetched pipelined (500 requests outstanding at most)."""
    found = {}
    pending = []
    for ledger_id in ids:
        pending.append((ledger_id, client.get_async(ledger_path(ledger_id, manager, root))))
        if len(pending) >= 500:
            found.update((i, result.get(timeout=30)) for i, result in pending)
            pending.clear()
    found.update((i, result.get(timeout=30)) for i, result in pending)
    return found


def _write_sets_span_two_racks(md, racks) -> bool:
    for segment in md.segments:
        ensemble = segment.ensemble
        for start in range(md.ensemble_size):
            window = {racks[ensemble[(start + j) % md.ensemble_size]] for j in range(md.write_quorum)}
            if len(window) < min(md.write_quorum, 2):
                return False
    return True


def test_loads_closed_rack_aware_ledgers_idempotently_and_the_index_matches(client):
    spec = BulkLoadSpec(bookies=synthetic_bookies(100, racks=10), count=COUNT, seed=42)
    stream = io.StringIO()
    summary = bulk_load(
        client, spec, root=ROOT, create_layout=True, batch_size=200, progress=True, progress_stream=stream
    )
    assert (summary.requested, summary.created, summary.skipped_existing) == (COUNT, COUNT, 0)
    assert (summary.first_id, summary.last_id) == (1, COUNT)
    assert summary.ledgers_per_second > 0 and summary.retries == 0
    assert "bulk load [" in stream.getvalue() and stream.getvalue().endswith("\n")
    assert (
        client.get(layout_path(ROOT))[0]
        == b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
    )
    # 1..5000 in 2-4-4: /ledgers/00 and its children 0000 (ids 1..9999): one directory of 5,000 ledgers.
    assert client.get_children(f"{ROOT}/00") == ["0000"]
    assert len(client.get_children(f"{ROOT}/00/0000")) == COUNT

    stored = _read_all(client, spec.ledger_ids())
    racks = spec.racks_by_bookie()
    index_from_zk: dict[str, set[int]] = defaultdict(set)
    total_bytes = 0
    planned = {ledger.ledger_id: ledger for ledger in plan_ledgers(spec)}
    for ledger_id, (data, stat) in stored.items():
        md = decode_ledger_metadata(data, znode_ctime=stat.ctime, ledger_id=ledger_id)
        assert md.state is LedgerState.CLOSED and md.format_version == 3
        assert data == encode_ledger_metadata(planned_metadata(planned[ledger_id], spec))
        assert _write_sets_span_two_racks(md, racks), ledger_id
        assert md.pulsar_topic is not None
        for bookie in md.all_bookies:
            index_from_zk[bookie].add(ledger_id)
        total_bytes += len(data)
    assert total_bytes == summary.bytes_written
    # Realism: some two-segment and some empty ledgers, and a bookie's share close to N*E/100.
    segment_counts = [len(ledger.segments) for ledger in planned.values()]
    assert 0 < segment_counts.count(2) < COUNT // 4
    assert any(ledger.last_entry_id == -1 for ledger in planned.values())

    index = bookie_ledger_index(spec)
    assert set(index) == {placement.bookie_id for placement in spec.bookies}
    for bookie in list(index)[::7]:  # a sample of bookies, compared in full
        assert list(index[bookie]) == sorted(index_from_zk[bookie])
    sizes = [len(ids) for ids in index.values()]
    assert COUNT * 3 / 100 * 0.7 < sum(sizes) / len(sizes) < COUNT * 3.2 / 100 * 1.1

    # A re-run writes nothing, fails no request and leaves every znode as it was.
    before = {ledger_id: stat.mzxid for ledger_id, (_, stat) in list(stored.items())[::50]}
    again = bulk_load(client, spec, root=ROOT, create_layout=True, batch_size=200, progress=False)
    assert (again.created, again.skipped_existing, again.batches, again.retries) == (0, COUNT, 0, 0)
    assert len(client.get_children(f"{ROOT}/00/0000")) == COUNT
    for ledger_id, mzxid in before.items():
        assert client.exists(ledger_path(ledger_id, root=ROOT)).mzxid == mzxid


def test_sparse_ids_span_directories_and_a_partial_tree_is_completed(client):
    spec = BulkLoadSpec(bookies=synthetic_bookies(12, racks=4), count=400, mean_gap=2_000, seed=5)
    ids = list(spec.ledger_ids())
    assert ids == sorted(set(ids)) and ids[-1] > 400 * 1_000
    # Someone wrote two of the ledgers already (one with other content): both are kept as they are.
    client.create(ledger_path(ids[10], root=ROOT), b"foreign", makepath=True)
    kept = encode_ledger_metadata(planned_metadata(list(plan_ledgers(spec))[11], spec))
    client.create(ledger_path(ids[11], root=ROOT), kept, makepath=True)
    summary = bulk_load(client, spec, root=ROOT, progress=False)
    assert (summary.created, summary.skipped_existing) == (398, 2)
    assert summary.directories_created > 10
    stored = _read_all(client, ids)
    assert stored[ids[10]][0] == b"foreign"
    for ledger_id in ids[:10] + ids[11:]:
        assert decode_ledger_metadata(stored[ledger_id][0]).state is LedgerState.CLOSED


def test_flat_manager_and_a_ledger_written_concurrently(client, bk_services, zk_chroot, monkeypatch):
    spec = BulkLoadSpec(bookies=synthetic_bookies(9, racks=3), count=300, first_id=1_000, seed=8)
    other = bk_services.kazoo_client(zk_chroot)
    prepare = bulk._Loader.prepare_directories

    def prepare_then_race(self, ids):
        prepare(self, ids)
        # Written after the directories were listed: only the failed multi-op can reveal it.
        other.create(ledger_path(1_150, LedgerManagerType.FLAT, ROOT), b"raced")

    monkeypatch.setattr(bulk._Loader, "prepare_directories", prepare_then_race)
    try:
        summary = bulk_load(
            client, spec, root=ROOT, manager=LedgerManagerType.FLAT, create_layout=True, batch_size=50
        )
    finally:
        other.stop()
        other.close()
    assert (summary.created, summary.skipped_existing, summary.retries) == (299, 1, 1)
    names = [name for name in client.get_children(ROOT) if name.startswith("L0")]  # not LAYOUT
    assert len(names) == 300 and "L0000001150" in names
    assert client.get(f"{ROOT}/L0000001150")[0] == b"raced"
    assert b"FlatLedgerManagerFactory" in client.get(layout_path(ROOT))[0]


def test_a_layout_for_another_manager_is_refused(client):
    spec = BulkLoadSpec(bookies=synthetic_bookies(3, racks=3), count=10)
    bulk_load(client, spec, root=ROOT, manager=LedgerManagerType.FLAT, create_layout=True, progress=False)
    with pytest.raises(ConfigError, match="flat ledger manager, not hierarchical"):
        bulk_load(client, spec, root=ROOT, progress=False)


def test_a_batch_lost_with_the_connection_is_retried_without_loss_or_duplicates(
    bk_services, zk_chroot, monkeypatch
):
    # A short session (2 s: kazoo gives up on a silent server after ~1.3 s) and a ZooKeeper frozen with
    # SIGSTOP *before* a multi-op goes out: that multi-op is certainly unanswered when the connection drops.
    client = bk_services.kazoo_client(zk_chroot, timeout=2.0)
    pid = bk_services.cluster.zookeeper.pid()
    assert pid is not None
    spec = BulkLoadSpec(bookies=synthetic_bookies(30, racks=5), count=3_000, seed=3)
    send = bulk._Loader._send
    sent = []

    def freeze_then_send(self, batch):
        sent.append(len(batch.ops))
        if len(sent) == 4:
            os.kill(pid, signal.SIGSTOP)
            threading.Timer(3.0, os.kill, (pid, signal.SIGCONT)).start()
        send(self, batch)

    monkeypatch.setattr(bulk._Loader, "_send", freeze_then_send)
    try:
        summary = bulk_load(client, spec, root=ROOT, batch_size=100, max_in_flight=4, progress=False)
        assert summary.retries >= 1
        # A multi-op that committed just before the connection went counts as "already there" on its retry.
        assert summary.created + summary.skipped_existing == 3_000
        # Verify through a client with an ordinary session: the 2 s one may expire again on a busy machine.
        verifier = bk_services.kazoo_client(zk_chroot)
        try:
            assert len(verifier.get_children(f"{ROOT}/00/0000")) == 3_000
            stored = _read_all(verifier, spec.ledger_ids())
        finally:
            verifier.stop()
            verifier.close()
        planned = {ledger.ledger_id: ledger for ledger in plan_ledgers(spec)}
        for ledger_id, (data, _) in stored.items():
            assert data == encode_ledger_metadata(planned_metadata(planned[ledger_id], spec))
    finally:
        os.kill(pid, signal.SIGCONT)
        client.stop()
        client.close()
