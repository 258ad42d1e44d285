"""`bkaudit agent` against real RocksDB files in DbLedgerStorage's layout, over gRPC with TLS and a token."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from rocksdict import AccessType, Options, Rdict

from connectors.agent.client import AgentClient, AgentEntryList, AgentError, AgentNoLedger
from connectors.agent.index import DbStorageIndexReader, IndexedEntryStore, sim_master_key
from connectors.agent.server import RunningAgent, start_agent_server
from core.domain.dbstorage import STORAGE_FLAGS_ID, encode_ledger_data, ledger_key
from core.pb import bookie_agent_pb2 as pb
from tests.integration.agent_tls import TlsMaterial, make_tls

pytestmark = pytest.mark.integration

TOKEN = "agent-token-4f1c9e"
HUGE = 2**63 - 1
LEDGERS = {
    7: set(range(0, 50)) | set(range(60, 70)),
    HUGE - 1: {0, 1, 2**40},
    2**33: set(range(1000)),
}


@pytest.fixture(scope="module")
def tls() -> TlsMaterial:
    return make_tls()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[IndexedEntryStore]:
    store = IndexedEntryStore(tmp_path / "bookie" / "ledgers")
    for ledger_id, entries in LEDGERS.items():
        store.add_entries(ledger_id, entries)
    store.create_ledger(12)  # exists, no entries yet
    yield store
    store.close()


@pytest.fixture
def agent(store: IndexedEntryStore, tls: TlsMaterial, tmp_path: Path) -> Iterator[RunningAgent]:
    reader = DbStorageIndexReader([store.ledger_dir], refresh_s=0, view_root=tmp_path / "views")
    running = start_agent_server(reader, "127.0.0.1:0", token=TOKEN, tls=(tls.cert_pem, tls.key_pem))
    yield running
    running.stop()


def client_for(agent: RunningAgent, tls: TlsMaterial, token: str = TOKEN) -> AgentClient:
    return AgentClient(f"localhost:{agent.port}", token=token, ca_pem=tls.ca_pem, timeout_s=5)


def entry_set(result: object) -> set[int]:
    assert isinstance(result, AgentEntryList)
    return set(result.availability.iter_entries())


def test_the_simulators_index_is_bookkeepers_layout(store: IndexedEntryStore) -> None:
    """Read with RocksDB alone (no project code): 16-byte big-endian keys, non-zero 8-byte locations,
    LedgerData values, under current/ledgers and current/locations."""
    store.close()
    current = store.ledger_dir / "current"
    opened = Options(raw_mode=True)
    locations = Rdict(str(current / "locations"), options=opened, access_type=AccessType.read_only())
    keys = list(locations.keys())
    assert bytes.fromhex("00000000000000070000000000000031") in keys  # ledger 7, entry 49
    assert all(len(k) == 16 for k in keys) and all(len(v) == 8 and v != bytes(8) for v in locations.values())
    assert len(keys) == sum(len(e) for e in LEDGERS.values())
    locations.close()
    ledgers = Rdict(str(current / "ledgers"), options=opened, access_type=AccessType.read_only())
    assert ledgers[bytes.fromhex("0000000000000007")] == encode_ledger_data(master_key=sim_master_key(7))
    ledgers.close()


def test_exact_entry_lists_over_tls(agent: RunningAgent, tls: TlsMaterial) -> None:
    client = client_for(agent, tls)
    answers = client.list_entries([*LEDGERS, 12, 8, HUGE])
    for ledger_id, entries in LEDGERS.items():
        assert entry_set(answers[ledger_id]) == entries
    assert entry_set(answers[12]) == set()  # the ledger exists, nothing stored
    assert isinstance(answers[8], AgentNoLedger) and isinstance(answers[HUGE], AgentNoLedger)
    assert client.list_ledgers() == ([7, 12, 2**33, HUGE - 1], False)
    client.close()


def test_entry_lists_after_entries_and_ledgers_are_removed(
    store: IndexedEntryStore, agent: RunningAgent, tls: TlsMaterial
) -> None:
    client = client_for(agent, tls)
    store.drop_entries(7, [0, 25, 69])
    store.drop_entries(2**33, range(500, 1000))
    store.drop_ledger(HUGE - 1)  # LedgerData deleted, locations range-deleted, as the bookie does
    answers = client.list_entries([7, 2**33, HUGE - 1])
    assert entry_set(answers[7]) == LEDGERS[7] - {0, 25, 69}
    assert entry_set(answers[2**33]) == set(range(500))
    assert isinstance(answers[HUGE - 1], AgentNoLedger)
    store.add_entries(HUGE - 1, [5])  # written again: back, with only what was written since
    assert entry_set(client.list_entries([HUGE - 1])[HUGE - 1]) == {5}
    client.close()


def raw_call(agent: RunningAgent, tls: TlsMaterial, method: str, data: bytes, token: str | None = TOKEN):
    credentials = grpc.ssl_channel_credentials(root_certificates=tls.ca_pem)
    with grpc.secure_channel(f"localhost:{agent.port}", credentials) as channel:
        call = channel.unary_unary(f"/bkaudit.agent.BookieAgent/{method}")
        metadata = () if token is None else (("authorization", f"Bearer {token}"),)
        return call(data, timeout=5, metadata=metadata)


def status_of(agent: RunningAgent, tls: TlsMaterial, method: str, data: bytes, **kw) -> tuple[str, str]:
    with pytest.raises(grpc.RpcError) as caught:
        raw_call(agent, tls, method, data, **kw)
    return caught.value.code().name, caught.value.details()


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


@pytest.mark.parametrize(
    ("method", "data", "code", "message"),
    [
        ("ListEntries", pb.ListEntriesRequest(ledger_ids=[3, -1]).SerializeToString(), "INVALID_ARGUMENT",
         "ledger id -1 is outside"),
        # 2^64 - 1 on the wire (an unsigned id no ledger can have) decodes as -1: refused, not wrapped.
        ("ListEntries", b"\x08" + varint(2**64 - 1), "INVALID_ARGUMENT", "outside [0, 2^63 - 1]"),
        ("ListEntries", pb.ListEntriesRequest(ledger_ids=range(10_001)).SerializeToString(),
         "INVALID_ARGUMENT", "10001 ledger ids in one call; at most 10000"),
        ("ListEntries", b"\x0a\xff\xff\xff", "INVALID_ARGUMENT", "request is not a ListEntriesRequest"),
        ("ListEntries", bytes(300 * 1024), "RESOURCE_EXHAUSTED", ""),
        ("ListLedgers", pb.ListLedgersRequest(limit=-5).SerializeToString(), "INVALID_ARGUMENT",
         "limit must be >= 0"),
    ],
)  # fmt: skip
def test_hostile_requests_get_clear_errors(
    agent: RunningAgent, tls: TlsMaterial, method: str, data: bytes, code: str, message: str
) -> None:
    got_code, details = status_of(agent, tls, method, data)
    assert got_code == code and message in details


def test_the_largest_ledger_id_is_an_answer_not_an_error(agent: RunningAgent, tls: TlsMaterial) -> None:
    answer = pb.ListEntriesResponse.FromString(
        raw_call(agent, tls, "ListEntries", pb.ListEntriesRequest(ledger_ids=[HUGE]).SerializeToString())
    )
    assert [(e.ledger_id, e.holding) for e in answer.ledgers] == [(HUGE, pb.LedgerEntries.NO_LEDGER)]


def test_missing_or_bad_token_and_untrusted_tls_are_refused(agent: RunningAgent, tls: TlsMaterial) -> None:
    request = pb.ListEntriesRequest(ledger_ids=[7]).SerializeToString()
    assert status_of(agent, tls, "ListEntries", request, token=None) == (
        "UNAUTHENTICATED",
        "missing bearer token (authorization metadata)",
    )
    assert status_of(agent, tls, "ListLedgers", b"", token="wrong") == ("UNAUTHENTICATED", "bad bearer token")
    with pytest.raises(AgentError, match="UNAUTHENTICATED") as refused:
        client_for(agent, tls, token=TOKEN + "x").list_entries([7])
    assert TOKEN not in str(refused.value)
    stranger = AgentClient(
        f"localhost:{agent.port}", token=TOKEN, ca_pem=make_tls("other-ca").ca_pem, timeout_s=3
    )
    with pytest.raises(AgentError, match="UNAVAILABLE"):
        stranger.list_entries([7])
    plaintext = AgentClient(f"localhost:{agent.port}", token=TOKEN, insecure=True, timeout_s=3)
    with pytest.raises(AgentError, match="UNAVAILABLE"):
        plaintext.list_entries([7])


def test_no_master_key_or_token_crosses_or_is_logged(
    agent: RunningAgent, tls: TlsMaterial, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    answer = raw_call(
        agent, tls, "ListEntries", pb.ListEntriesRequest(ledger_ids=list(LEDGERS)).SerializeToString()
    )
    listing = raw_call(agent, tls, "ListLedgers", b"")
    assert answer and listing
    for ledger_id in LEDGERS:
        assert sim_master_key(ledger_id) not in answer + listing
    status_of(agent, tls, "ListEntries", b"", token="wrong-" + TOKEN)
    assert caplog.records  # the calls were logged ...
    for record in caplog.records:  # ... without a secret
        text = record.getMessage()
        assert TOKEN not in text and "SECRETMK" not in text


def test_limbo_ledgers_are_left_to_the_bookie_and_bad_values_are_data_loss(
    store: IndexedEntryStore, agent: RunningAgent, tls: TlsMaterial
) -> None:
    store.index.create_ledger(30, master_key=sim_master_key(30), limbo=True)
    store.index.add_entries(30, [0], master_key=sim_master_key(30))
    client = client_for(agent, tls)
    assert 30 not in client.list_entries([30, 7])  # in limbo: the agent cannot tell, no answer
    store.index.put_raw("ledgers", ledger_key(31), b"\xff\x00garbage")
    with pytest.raises(AgentError, match=r"DATA_LOSS.*ledgers value"):
        client.list_entries([31])
    client.close()


def test_ledger_pages_skip_the_storage_flags(
    store: IndexedEntryStore, agent: RunningAgent, tls: TlsMaterial
) -> None:
    store.index.put_raw("ledgers", ledger_key(STORAGE_FLAGS_ID), (1).to_bytes(8, "big"))
    client = client_for(agent, tls)
    first, more = client.list_ledgers(limit=2)
    rest, done = client.list_ledgers(after=first[-1], limit=2)
    assert (first, more, rest, done) == ([7, 12], True, [2**33, HUGE - 1], False)
    assert client.list_ledgers(after=HUGE) == ([], False)
    client.close()


def test_reading_leaves_the_bookies_directory_untouched(store: IndexedEntryStore, tmp_path: Path) -> None:
    store.close()  # the bookie is quiet: any change would be the reader's
    current = store.ledger_dir / "current"

    def snapshot() -> dict[str, tuple[int, int]]:
        return {
            str(p.relative_to(current)): (p.stat().st_size, p.stat().st_mtime_ns) for p in current.rglob("*")
        }

    before = snapshot()
    reader = DbStorageIndexReader([store.ledger_dir], refresh_s=0, view_root=tmp_path / "views")
    assert reader.entries_of(7).size == len(LEDGERS[7])
    reader.close()
    assert snapshot() == before


def test_the_cli_serves_until_sigterm(store: IndexedEntryStore, tls: TlsMaterial, tmp_path: Path) -> None:
    import json
    import os
    import signal
    import subprocess
    import sys

    for name, data in (
        ("agent.crt", tls.cert_pem),
        ("agent.key", tls.key_pem),
        ("token", f"{TOKEN}\n".encode()),
    ):
        (tmp_path / name).write_bytes(data)
    command = [sys.executable, "-m", "bkaudit.cli.main", "agent", "--ledger-dirs", str(store.ledger_dir)]
    command += ["--listen", "127.0.0.1:0", "--tls-cert", str(tmp_path / "agent.crt")]
    command += ["--tls-key", str(tmp_path / "agent.key"), "--token-file", str(tmp_path / "token")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ})
    try:
        ready = json.loads(process.stdout.readline())  # type: ignore[union-attr]
        assert ready["tls"] is True
        port = int(ready["agent"].rsplit(":", 1)[1])
        client = AgentClient(f"localhost:{port}", token=TOKEN, ca_pem=tls.ca_pem, timeout_s=5)
        assert entry_set(client.list_entries([7])[7]) == LEDGERS[7]
        client.close()
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert TOKEN not in stderr.decode()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ([], "--ledger-dirs is required"),
        (["--ledger-dirs", "/nonexistent"], "--token-file is required"),
        (["--ledger-dirs", "/nonexistent", "--token-file", "TOKEN_FILE"], "--tls-cert and --tls-key"),
        (["--ledger-dirs", "/nonexistent", "--token-file", "TOKEN_FILE", "--insecure"], "not a RocksDB"),
        (["--ledger-dirs", "/nonexistent", "--token-file", "/nonexistent/token", "--insecure"], "token file"),
    ],
)
def test_the_cli_refuses_bad_input_in_one_line(
    options: list[str], message: str, capsys, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from bkaudit.cli.main import run

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    assert run(["agent", *[str(token_file) if o == "TOKEN_FILE" else o for o in options]]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_probe_asks_the_agent_first_and_falls_back_when_it_cannot_answer(
    tmp_path: Path, tls: TlsMaterial
) -> None:
    """b0's agent answers (b0 gets no request, and its inner loss is seen); b1's agent is unreachable, so b1
    is checked by entry reads in the same wave; b2 has no agent and lists its entries."""
    from connectors.agent.client import AgentConfig, agent_answers
    from connectors.bookie.client import BlockingBookieClient
    from connectors.bookie.ledger_probe import LedgerProbeTarget, probe_and_learn
    from connectors.bookie.server import BookieServer

    target = LedgerProbeTarget(90, 3, 3, 2, "CLOSED", 9, ((0, ("b0", "b1", "b2")),))
    stores = {b: IndexedEntryStore(tmp_path / b) for b in ("b0", "b1")}
    servers = {b: BookieServer(store, answers_entry_lists=False) for b, store in stores.items()}
    servers["b2"] = BookieServer(IndexedEntryStore(tmp_path / "b2"))
    for server in servers.values():
        server.store.add_entries(90, range(10))
        server.start_background()
    stores["b0"].drop_entries(90, [4])  # inside b0's only fragment: reads of its ends cannot see it
    reader = DbStorageIndexReader([stores["b0"].ledger_dir], refresh_s=0, view_root=tmp_path / "views")
    agent = start_agent_server(reader, "127.0.0.1:0", token=TOKEN, tls=(tls.cert_pem, tls.key_pem))
    (tmp_path / "ca.pem").write_bytes(tls.ca_pem)
    unreachable = start_agent_server(
        DbStorageIndexReader([stores["b1"].ledger_dir], refresh_s=0), "127.0.0.1:0", token=TOKEN, tls=None
    )
    unreachable.stop()  # its port now refuses connections
    config = AgentConfig(
        addresses=(("b0", f"localhost:{agent.port}"), ("b1", f"localhost:{unreachable.port}")),
        token=TOKEN,
        ca_file=tmp_path / "ca.pem",
        timeout_s=2,
    )
    clients = config.clients()
    try:
        known = agent_answers(clients, {"b0": [90], "b1": [90]})
        assert set(known) == {(90, "b0")}
        with BlockingBookieClient(timeout=0.5) as client:
            [outcome], learned = probe_and_learn(
                client,
                [target],
                {b: s.address for b, s in servers.items()},
                known=known,
                learn={"b0", "b1", "b2"},
                timeout=0.5,
            )
        assert outcome.answers == {"b0": "agent_list", "b1": "entry_reads", "b2": "entry_list"}
        assert learned == {"b1": False, "b2": True}
        assert outcome.verdict.worst_entries == (4,)  # found through the agent's exact list
        assert servers["b0"].stats.requests_received == 0
    finally:
        for each in clients.values():
            each.close()
        agent.stop()
        for server in servers.values():
            server.stop_background()
            server.store.close()  # type: ignore[attr-defined]


def test_a_simulated_db_ledger_storage_cluster_keeps_its_indexes_exact(bk_services, tmp_path: Path) -> None:
    """`sim up --index-root` (a ClusterSpec's index_root): every DbLedgerStorage bookie's index holds
    exactly what the bookie holds, through creation, losses and a lost ledger; SortedLedgerStorage bookies
    keep none."""
    from bkaudit.sim.scenario import ClusterSpec, build_cluster

    spec = ClusterSpec(bookies=4, ledgers=4, entries=30, storage="mixed", index_root=str(tmp_path / "idx"))
    sim = build_cluster(spec, bk_services.zookeeper_hosts(bk_services.new_chroot()), reset=True)
    try:
        db_bookies = [b["bookie_id"] for b in sim.status()["bookies"] if b["ledger_dir"] is not None]
        assert db_bookies and all(
            b["storage"] == "DbLedgerStorage" for b in sim.status()["bookies"] if b["bookie_id"] in db_bookies
        )
        on_db = [(b, i) for b in db_bookies for i in sim.ledger_ids() if sim.bookie_store(b).entries_of(i)]
        (bookie, ledger), (other_bookie, other_ledger) = on_db[0], on_db[-1]
        held = sorted(sim.bookie_store(bookie).entries_of(ledger) or ())
        sim.lose_entries(bookie, ledger, held[1:3])
        sim.lose_ledger(other_bookie, other_ledger)
        assert (ledger, bookie) != (other_ledger, other_bookie) and len(held) > 3
        for db_bookie in db_bookies:
            reader = DbStorageIndexReader([sim.ledger_dir(db_bookie)], refresh_s=0, view_root=tmp_path / "v")
            store = sim.bookie_store(db_bookie)
            for ledger_id in sim.ledger_ids():
                entries = store.entries_of(ledger_id)
                assert (reader.flags_of(ledger_id) is None) == (entries is None)
                assert set(reader.entries_of(ledger_id).tolist()) == set(entries or ())
            reader.close()
    finally:
        sim.close()


def signal_a_thread_other_than_main(pid: int, signum: int) -> None:
    """Deliver ``signum`` to one of ``pid``'s threads that is not its main thread (Linux ``tgkill``), as the
    kernel may do with a signal sent to the process."""
    import ctypes
    import os

    def accepts(tid: int) -> bool:  # the thread does not block the signal (gRPC's own threads may)
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        blocked = int(next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1], 16)
        return not blocked & (1 << (signum - 1))

    threads = sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != pid)
    threads = [tid for tid in threads if accepts(tid)]
    assert threads, "the agent runs threads that accept the signal"
    tgkill = 234  # x86-64 syscall number
    assert ctypes.CDLL(None, use_errno=True).syscall(tgkill, pid, threads[0], signum) == 0


def test_a_sigterm_the_kernel_hands_to_a_grpc_thread_stops_the_agent(
    store: IndexedEntryStore, tls: TlsMaterial, tmp_path: Path
) -> None:
    """The handler runs on the main thread, which must wake up to run it: a wait without timeout never did
    (the agent served on, and a supervisor's stop timed out)."""
    import json
    import os
    import signal
    import subprocess
    import sys

    (tmp_path / "token").write_bytes(f"{TOKEN}\n".encode())
    command = [sys.executable, "-m", "bkaudit.cli.main", "agent", "--ledger-dirs", str(store.ledger_dir)]
    command += ["--listen", "127.0.0.1:0", "--insecure", "--token-file", str(tmp_path / "token")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ})
    try:
        json.loads(process.stdout.readline())  # type: ignore[union-attr]
        signal_a_thread_other_than_main(process.pid, signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 0, stderr.decode(errors="replace")[-2000:]
        assert b"signal 15: stopping" in stderr
    finally:
        process.kill()
        process.wait()
