"""bkaudit against what a real DbLedgerStorage bookie (BookKeeper 4.17) keeps on disk.

One cluster per module: 3 bookie processes in 3 racks, DbLedgerStorage with ``flushInterval`` 1 s (the
SyncThread's checkpoint, which flushes the write cache into the entry log and the RocksDB indexes; the
default is 60 s) and ``journalSyncData`` on, bkaudit's watcher and job beside it (:mod:`tests.realstack`)
reading every entry of each closed ledger (``entry_read_sample_percent`` 100) in a fast background pass.
Ledgers come from BookKeeper's Java client: batch A (E3/W3/A2, two ledgers left open, one of them then
fenced by a recovery open) and, after bookie 1 was restarted so that its new entries go to another entry
log file, batch B (E3/W2/A2, striped: each bookie holds two entries of three). The tests compare

- the agent's index reader (and the agent over gRPC) with the bookie's own answers to ``READ_ENTRY`` and
  with the client's striping, per ledger and bookie, and the fenced flag with the recovery;
- after the entry log files holding batch A on bookie 1 are deleted (bookie stopped, files removed,
  bookie started: no cache survives): what the bookie answers (``EIO``), what the agent answers, and the
  alerts bkaudit's job raises;
- after bookie 2 is formatted again under its id (disks wiped, cookie deleted, started: BookKeeper writes a
  new cookie), the alerts for the copies it lost.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest
from rocksdict import ReadOptions

from bkaudit.testing.harness import ServiceHarness
from connectors.agent.client import AgentClient, AgentEntryList
from connectors.agent.index import DbStorageIndexReader, _ReadOnlyView
from connectors.agent.server import start_agent_server
from connectors.bookie.client import (
    BlockingBookieClient,
    BookieError,
    EntryPresent,
    LastConfirmed,
    NoEntry,
    ProbeRequest,
)
from connectors.bookie.frames import EIO, LAST_ADD_CONFIRMED
from connectors.bookie.ledger_probe import read_answered
from connectors.bookkeeper import RealBookie, RealBookKeeperCluster
from connectors.delta.tables import read_table
from core.domain.dbstorage import (
    LEDGERS_DB,
    LOCATIONS_DB,
    decode_location,
    decode_location_key,
    ledger_bounds,
    ledger_key,
    split_location,
)
from core.domain.metadata import LedgerMetadata
from core.domain.striping import has_entry
from core.pb.db_ledger_storage_pb2 import LedgerData
from tests.chaos.stack import wait_for
from tests.realstack import RealStack, read_ledgers, real_stack

pytestmark = pytest.mark.integration

REPLICAS_KINDS = ("REPLICAS_NO_REPLICA", "REPLICAS_LESS_THAN_AQ", "REPLICAS_LESS_THAN_WQ")
#: LedgerWriter's default ledger password (never printed: only its digest is compared).
_WRITER_PASSWORD = b"bkaudit-writer"
STREAM = {
    # Bookie restarts are part of the set-up: a short absence is not a loss here.
    "DEFAULT_RECOVERY_DELAY_S": "600",
    "SCRUTINY_LEDGERS_PER_S": "20",
    "ENTRY_READ_SAMPLE_PERCENT": "100",
    "PROBE_TIMEOUT_S": "2",
    "TIMERS_TRIGGER_INTERVAL_S": "1",
    # A failed read is confirmed after two re-probes 5 and 10 s later (the default, 30 s doubling over
    # three rounds, takes 3.5 minutes).
    "REPROBE_DELAY_S": "5",
    "REPROBE_ROUNDS": "2",
}


@dataclass
class Storage:
    cluster: RealBookKeeperCluster
    stack: RealStack
    batch_a: list[int]
    batch_b: list[int]
    fenced: int
    still_open: int
    root: Path

    def metadata(self) -> dict[int, LedgerMetadata]:
        return read_ledgers(self.stack.marks.client, [*self.batch_a, *self.batch_b])

    def reader(self, bookie: RealBookie, name: str) -> DbStorageIndexReader:
        return DbStorageIndexReader([bookie.state_dir / "ledgers"], refresh_s=0, view_root=self.root / name)


def _ledger_dir(bookie: RealBookie) -> Path:
    return bookie.state_dir / "ledgers"


def _written(md: LedgerMetadata, bookie_id: str, last_entry_id: int) -> list[int]:
    """The entries the client striped to ``bookie_id`` (every segment), through ``last_entry_id``."""
    segments = list(md.segments)
    held = []
    for number, segment in enumerate(segments):
        end = segments[number + 1].first_entry_id - 1 if number + 1 < len(segments) else last_entry_id
        if bookie_id not in segment.ensemble:
            continue
        position = list(segment.ensemble).index(bookie_id)
        held += [
            e
            for e in range(segment.first_entry_id, end + 1)
            if has_entry(e, position, md.ensemble_size, md.write_quorum)
        ]
    return held


def _locations(bookie: RealBookie, ledger_ids: list[int], view_root: Path) -> dict[tuple[int, int], int]:
    """(ledger, entry) → entry log id, read raw from the bookie's ``locations`` index (read-only view)."""
    view = _ReadOnlyView(_ledger_dir(bookie) / "current" / LOCATIONS_DB, view_root)
    found: dict[tuple[int, int], int] = {}
    try:
        db = view.open()
        for ledger_id in ledger_ids:
            lower, upper = ledger_bounds(ledger_id)
            bounds = ReadOptions()
            bounds.set_iterate_upper_bound(upper)
            for key, value in db.items(from_key=lower, read_opt=bounds):
                found[decode_location_key(cast(bytes, key))] = split_location(
                    decode_location(cast(bytes, value))
                )[0]
    finally:
        view.close()
    return found


def _reads(bookie: RealBookie, ledger_id: int, last_entry_id: int) -> dict[int, object]:
    """What the bookie answers to ``READ_ENTRY`` for entries 0 .. last + 1, over its wire protocol."""
    requests = [ProbeRequest(bookie.bookie_id, ledger_id, e) for e in range(last_entry_id + 2)]
    with BlockingBookieClient(timeout=5.0) as client:
        return dict(enumerate(client.probe_many(requests)))


def _last_add_confirmed(md: LedgerMetadata, ledger_id: int) -> int:
    """The highest LAC that the last entries of an open ledger's last-segment bookies carry (-1: none)."""
    ensemble = md.segments[-1].ensemble
    with BlockingBookieClient(timeout=5.0) as client:
        answers = client.probe_many([ProbeRequest(b, ledger_id, LAST_ADD_CONFIRMED) for b in ensemble])
    return max((a.last_add_confirmed for a in answers if isinstance(a, LastConfirmed)), default=-1)


def _serving(bookie: RealBookie, ledger_id: int) -> None:
    """Wait until ``bookie`` serves reads: it registers before its request processors run, and answers a
    read in between by closing the connection."""

    def answered() -> bool:
        with BlockingBookieClient(timeout=2.0) as client:
            result = client.read_entry_exists(bookie.bookie_id, ledger_id, 0)
        return read_answered(result)

    wait_for(f"{bookie.name} to serve reads", answered, 60)


@pytest.fixture(scope="module")
def storage(bk_services: ServiceHarness, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Storage]:
    # journalSyncData on (BookKeeper's default; the project's other clusters turn it off): the journal's last
    # mark then follows its force-writes, so a restart does not replay flushed entries into a new entry log.
    conf = {"flushInterval": 1000, "journalSyncData": True}
    cluster = bk_services.real_bookkeeper(bookies=3, racks=3, bookie_conf=conf)
    root = Path(tmp_path_factory.mktemp("real-storage"))
    try:
        # The watcher and job start in the background while the ledgers are written.
        with real_stack(bk_services, cluster, root / "stack", stream_settings=STREAM) as stack:
            batch_a = cluster.write_ledgers(
                5, ensemble=3, write_quorum=3, ack_quorum=2, entries=6, open_ledgers=2
            )
            fenced, still_open = batch_a["open"]
            # A recovery open (BookKeeper's shell) fences the ledger on its bookies and closes it.
            cluster.shell().run("readledger", "-l", str(fenced), "-fe", "0", "-le", "0", "-r")
            # Each start opens a new entry log: batch B, written after this one, never shares batch A's.
            cluster.restart_bookie(1)
            _serving(cluster.bookie(1), fenced)
            batch_b = cluster.write_ledgers(6, ensemble=3, write_quorum=2, ack_quorum=2, entries=7)
            storage = Storage(
                cluster,
                stack,
                sorted(batch_a["closed"] + batch_a["open"]),
                sorted(batch_b["closed"]),
                fenced,
                still_open,
                root,
            )
            stack.known_ledgers = set(storage.batch_a) | set(storage.batch_b)
            yield storage
    finally:
        cluster.stop()


def _expected(storage: Storage) -> dict[str, dict[int, list[int]]]:
    """bookie id → ledger → the entries the client striped to it (6 or 7 entries were written to each)."""
    metadata = storage.metadata()
    expected: dict[str, dict[int, list[int]]] = {}
    for bookie in storage.cluster.all_bookies():
        expected[bookie.bookie_id] = {
            ledger_id: _written(md, bookie.bookie_id, 5 if ledger_id in storage.batch_a else 6)
            for ledger_id, md in metadata.items()
        }
    return expected


def test_the_agent_over_a_bookkeeper_written_index_answers_what_the_bookie_holds(storage: Storage) -> None:
    expected = _expected(storage)
    bookies = storage.cluster.all_bookies()
    readers = {b.bookie_id: storage.reader(b, f"views-{b.index}") for b in bookies}
    try:

        def indexed() -> bool:
            return all(
                readers[b].entries_of(lid).tolist() == entries
                for b, ledgers in expected.items()
                for lid, entries in ledgers.items()
            )

        wait_for("every bookie's RocksDB index to hold the written entries", indexed, 60)
        for bookie in bookies:
            holds = expected[bookie.bookie_id]
            assert any(len(e) < 6 for e in holds.values()), "striping leaves gaps on each bookie"
            for ledger_id, entries in holds.items():
                reads = _reads(bookie, ledger_id, max(entries))
                present = sorted(e for e, r in reads.items() if isinstance(r, EntryPresent))
                assert present == entries, f"{bookie.name} ledger {ledger_id}: the bookie's own reads"
                assert all(isinstance(r, NoEntry) for e, r in reads.items() if e not in entries)
                assert readers[bookie.bookie_id].entries_of(ledger_id).tolist() == present

        # The same through `bkaudit agent`'s gRPC service.
        token = "real-storage-token"
        bookie = bookies[0]
        agent = start_agent_server(readers[bookie.bookie_id], "127.0.0.1:0", token=token, tls=None)
        client = AgentClient(f"127.0.0.1:{agent.port}", token=token, insecure=True, timeout_s=10)
        try:
            answers = client.list_entries(sorted(expected[bookie.bookie_id]))
        finally:
            client.close()
            agent.stop()
        for ledger_id, entries in expected[bookie.bookie_id].items():
            answer = answers[ledger_id]
            assert isinstance(answer, AgentEntryList)
            assert answer.availability.entry_list() == entries

        # Fencing: the recovery open fenced the ledger on every bookie of its ensemble and closed it.
        metadata = storage.metadata()
        assert metadata[storage.fenced].is_closed and not metadata[storage.still_open].is_closed
        # DbLedgerStorage writes a fence to its ledgers index with the next checkpoint that flushes entries
        # (SingleDirectoryDbLedgerStorage.checkpoint returns early on an empty write cache): batch B's.
        wait_for(
            "the fence to reach every bookie's ledgers index",
            lambda: all(readers[b.bookie_id].flags_of(storage.fenced).fenced for b in bookies),  # type: ignore[union-attr]
            30,
        )
        for b in bookies:
            flags = {lid: readers[b.bookie_id].flags_of(lid) for lid in (*storage.batch_a, *storage.batch_b)}
            assert all(f is not None and f.exists and not f.limbo for f in flags.values())
            assert [lid for lid, f in flags.items() if f.fenced] == [storage.fenced]  # type: ignore[union-attr]
    finally:
        for reader in readers.values():
            reader.close()


def test_the_master_key_the_bookie_stores_is_the_password_digest_and_never_leaves_the_reader(
    storage: Storage,
) -> None:
    """The ``ledgers`` value a real bookie writes carries BookKeeper's master key, SHA-1("ledger" ‖ password)
    (MacDigestManager.genDigest): the layout bkaudit decodes; the reader's flags have no field for it."""
    bookie = storage.cluster.bookie(2)
    ledger_id = storage.batch_b[0]
    view = _ReadOnlyView(_ledger_dir(bookie) / "current" / LEDGERS_DB, storage.root)
    try:
        raw = wait_for("the ledger in the ledgers index", lambda: view.open().get(ledger_key(ledger_id)), 30)
    finally:
        view.close()
    data = LedgerData.FromString(raw)
    digest = hashlib.sha1(b"ledger" + _WRITER_PASSWORD).digest()
    assert data.exists and len(data.masterKey) == 20
    assert data.masterKey == digest, "the master key is not BookKeeper's password digest"
    reader = storage.reader(bookie, "views-key")
    try:
        flags = reader.flags_of(ledger_id)
    finally:
        reader.close()
    assert flags is not None and digest not in repr(flags).encode()
    assert set(vars(flags)) == {"exists", "fenced", "limbo"}


def test_a_deleted_entry_log_reads_as_eio_and_bkaudit_alerts_the_lost_copies(storage: Storage) -> None:
    cluster, stack = storage.cluster, storage.stack
    victim = cluster.bookie(1)
    every = [*storage.batch_a, *storage.batch_b]
    stack.wait_ingested(every)
    healthy_since = time.time()
    assert not stack.alerts.open_now(REPLICAS_KINDS), "no replicas alert before the fault"

    victim.stop()
    before = _locations(victim, every, storage.root)
    logs_a = {log for (lid, _), log in before.items() if lid in storage.batch_a}
    logs_b = {log for (lid, _), log in before.items() if lid in storage.batch_b}
    doomed = logs_a - logs_b
    assert doomed, f"batch A shares every entry log with batch B on {victim.name}: {sorted(logs_a)}"
    for log_id in doomed:
        (_ledger_dir(victim) / "current" / f"{log_id:x}.log").unlink()
    deleted_at = time.time()
    cluster.start_bookie(1)
    _serving(victim, storage.batch_b[0])

    # The index after the restart is the truth the bookie reads by (a journal replay may move entries).
    after = _locations(victim, every, storage.root)
    unreadable = {key for key, log in after.items() if log in doomed}
    assert unreadable, "the index still lists entries in the deleted logs"
    metadata = storage.metadata()
    # A closed ledger is judged whole, an open one up to its last add confirmed (as the job reads it).
    lost_ledgers = {
        lid
        for lid, e in unreadable
        if metadata[lid].is_closed or e <= _last_add_confirmed(metadata[lid], lid)
    }
    reader = storage.reader(victim, "views-after")
    try:
        for ledger_id in every:
            stored = sorted(e for lid, e in after if lid == ledger_id)
            reads = _reads(victim, ledger_id, max(stored))
            for entry_id in stored:
                answer = reads[entry_id]
                if (ledger_id, entry_id) in unreadable:
                    assert answer == BookieError(EIO), f"ledger {ledger_id} entry {entry_id}: {answer!r}"
                else:
                    assert isinstance(answer, EntryPresent), (
                        f"ledger {ledger_id} entry {entry_id}: {answer!r}"
                    )
            readable = [e for e in stored if (ledger_id, e) not in unreadable]
            assert reader.entries_of(ledger_id).tolist() == readable, f"the agent on ledger {ledger_id}"
    finally:
        reader.close()

    # End to end: the job's entry reads find the unreadable copies; one copy of three is gone (W3/A2).
    def alerted() -> bool:
        stack.require_alive()
        return lost_ledgers <= {
            int(a.alert["ledger_id"]) for a in stack.alerts.open_now(REPLICAS_KINDS).values()
        }

    wait_for(f"REPLICAS_* alerts for ledgers {sorted(lost_ledgers)}", alerted, 120)
    open_alerts = stack.alerts.open_now(REPLICAS_KINDS).values()
    assert {int(a.alert["ledger_id"]) for a in open_alerts} == lost_ledgers
    assert {a.kind for a in open_alerts} == {"REPLICAS_LESS_THAN_WQ"}
    assert all(a.arrived_at >= deleted_at for a in open_alerts)
    assert not stack.alerts.firing(("BOOKIE_UNRESPONSIVE",), healthy_since), "the bookie answered every read"


def test_a_bookie_formatted_again_under_its_id_has_its_lost_copies_alerted(storage: Storage) -> None:
    """Bookie 2's disks wiped and its cookie deleted (``bookieformat -deleteCookie``), then started again:
    BookKeeper 4.17 writes its cookie again (byte for byte the same: host, directories, the cluster's
    instance id) and registers the bookie under the same id, so its Auditor, which only asks who is
    registered, sees nothing lost. bkaudit records the new cookie and alerts every closed
    ledger whose entries the bookie no longer holds."""
    cluster, stack = storage.cluster, storage.stack
    victim = cluster.bookie(2)
    metadata = storage.metadata()
    closed_on_victim = {
        ledger_id
        for ledger_id, md in metadata.items()
        if md.is_closed and any(victim.bookie_id in s.ensemble for s in md.segments)
    }
    assert closed_on_victim, "the victim holds closed ledgers"

    def alerted(since: float = 0.0) -> set[int]:
        stack.require_alive()
        open_now = stack.alerts.open_now(REPLICAS_KINDS).values()
        return {int(a.alert["ledger_id"]) for a in open_now if a.arrived_at >= since}

    # Batch A's ledgers are alerted already (the entry logs deleted above); batch B's are healthy.
    fresh = closed_on_victim - alerted()
    assert fresh, "the victim holds closed ledgers no alert names yet"
    cookie = f"/ledgers/cookies/{victim.bookie_id}"
    before = stack.marks.client.get(cookie)[1].czxid
    formatted_at = time.time()
    victim.stop()
    for folder in ("journal", "ledgers"):  # wiped disks: empty directories
        shutil.rmtree(victim.state_dir / folder)
        (victim.state_dir / folder).mkdir()
    stack.marks.client.delete(cookie)
    cluster.start_bookie(2)
    # The same bytes (host, directories, the cluster's instance id), in a new znode.
    assert stack.marks.client.get(cookie)[1].czxid != before, "the bookie wrote its cookie again"

    # New alerts for the ledgers that were healthy (the cookie's replacement queues the bookie's ledgers
    # for a check at once; in this module the background walk, at 20 ledgers/s, would find them too).
    wait_for(f"REPLICAS_* alerts for ledgers {sorted(fresh)}", lambda: fresh <= alerted(formatted_at), 180)
    assert closed_on_victim <= alerted() <= set(metadata), "every ledger the bookie was part of, only those"
    bookies = {row["bookie_id"]: row for row in read_table(stack.run.lakehouse, "bookies").to_pylist()}
    assert bookies[victim.bookie_id]["cookie_changed_at"] is not None
