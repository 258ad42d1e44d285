"""The cluster simulator against the real embedded ZooKeeper, probed with the real bookie client.

Every check reads back what a BookKeeper cluster would have written, through the domain library: znode
paths, bytes that decode (and re-encode identically), ephemeral owners and their lifetimes, and what the
simulated bookies answer on the wire for each fault.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from bkaudit.sim.cluster import SIM_AUDITOR_ID, SimulatedCluster
from bkaudit.sim.errors import SimulatorError
from bkaudit.testing.harness import ServiceHarness
from bkaudit.testing.tls import write_throwaway_ca
from connectors.bookie.client import BlockingBookieClient, EntryList, NoLedger, Timeout, availability_of
from connectors.bookie.tls import BookieTlsConfig, server_tls_context
from core.domain.cookie import parse_cookie
from core.domain.layout import (
    LedgerLayout,
    LedgerManagerType,
    format_layout,
    ledger_path,
    parse_layout,
)
from core.domain.metadata import (
    DigestType,
    LedgerState,
    decode_ledger_metadata,
    encode_ledger_metadata,
)
from core.domain.rackmap import parse_rack_map
from core.domain.registration import bookie_rpc_address, decode_bookie_service_info
from core.domain.underreplication import (
    UnderreplicationPaths,
    parse_auditor_vote,
    parse_lost_bookie_recovery_delay,
    parse_rereplication_layout,
    parse_underreplicated_ledger,
    vote_sequence,
)
from core.errors import FormatError

pytestmark = pytest.mark.integration

SESSION_TIMEOUT_S = 2.0  # the embedded ZooKeeper ticks every 500 ms, so 2 s is a legal session timeout
ROOT = "/ledgers"


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    return condition()


@pytest.fixture
def hosts(bk_services: ServiceHarness, zk_chroot: str) -> str:
    return bk_services.zookeeper_hosts(zk_chroot)


@pytest.fixture
def sim(hosts: str) -> Iterator[SimulatedCluster]:
    cluster = SimulatedCluster(
        hosts, racks=3, bookie_session_timeout_s=SESSION_TIMEOUT_S, seed=11, password=b"s3cret-pw"
    ).init()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def six(sim: SimulatedCluster) -> SimulatedCluster:
    """Six bookies over three racks, BP-41 and legacy ids alternating."""
    for index in range(6):
        sim.add_bookie(legacy_id=index % 2 == 1)
    return sim


@pytest.fixture
def probe() -> Iterator[BlockingBookieClient]:
    with BlockingBookieClient(timeout=2.0, connect_timeout=2.0) as client:
        yield client


def writable(zk: KazooClient) -> set[str]:
    return {child for child in zk.get_children(f"{ROOT}/available") if child != "readonly"}


def readonly(zk: KazooClient) -> set[str]:
    return set(zk.get_children(f"{ROOT}/available/readonly"))


# ------------------------------------------------------------------------------------------------- init


def test_init_writes_exactly_the_znodes_of_a_new_cluster(
    sim: SimulatedCluster, zk_client: KazooClient
) -> None:
    assert sorted(zk_client.get_children(ROOT)) == [
        "INSTANCEID",
        "LAYOUT",
        "available",
        "cookies",
        "underreplication",
    ]
    layout, _ = zk_client.get(f"{ROOT}/LAYOUT")
    assert layout == b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
    assert parse_layout(layout).manager is LedgerManagerType.HIERARCHICAL
    instance, _ = zk_client.get(f"{ROOT}/INSTANCEID")
    assert str(uuid.UUID(instance.decode())) == instance.decode() == sim.instance_id
    assert zk_client.get(f"{ROOT}/available")[0] == b""
    assert zk_client.get_children(f"{ROOT}/available") == ["readonly"]
    assert zk_client.get(f"{ROOT}/available/readonly")[0] == b""
    assert zk_client.get_children(f"{ROOT}/cookies") == []
    paths = UnderreplicationPaths(ROOT)
    assert sorted(zk_client.get_children(paths.base)) == [
        "LAYOUT",
        "auditorelection",
        "ledgers",
        "locks",
        "lostBookieRecoveryDelay",
    ]
    # The Auditor is elected: one ephemeral sequential vote naming it.
    (vote,) = zk_client.get_children(paths.auditor_election)
    vote_data, vote_stat = zk_client.get(f"{paths.auditor_election}/{vote}")
    assert vote_sequence(vote) >= 0 and vote_stat.ephemeralOwner != 0
    assert parse_auditor_vote(vote_data) == SIM_AUDITOR_ID
    assert zk_client.get(paths.layout)[0] == b'type: "BASIC"\nversion: 1\n'
    parse_rereplication_layout(zk_client.get(paths.layout)[0])
    assert parse_lost_bookie_recovery_delay(zk_client.get(paths.lost_bookie_recovery_delay)[0]) == 0
    with pytest.raises(SimulatorError, match="already has /ledgers"):
        SimulatedCluster(sim.zk_hosts).init()


@pytest.mark.parametrize(
    "manager",
    [LedgerManagerType.FLAT, LedgerManagerType.LONG_HIERARCHICAL, LedgerManagerType.LEGACY_HIERARCHICAL],
)
def test_other_ledger_managers_write_their_layout_and_paths(
    hosts: str, zk_client: KazooClient, manager: LedgerManagerType
) -> None:
    with SimulatedCluster(
        hosts, manager=manager, racks=1, bookie_session_timeout_s=SESSION_TIMEOUT_S
    ).init() as sim:
        for _ in range(2):
            sim.add_bookie()
        ledger_id = sim.create_ledger(ensemble_size=2, entries=3)
        assert zk_client.get(f"{ROOT}/LAYOUT")[0].decode() == format_layout(LedgerLayout.for_manager(manager))
        path = ledger_path(ledger_id, manager, ROOT)
        data, _ = zk_client.get(path)
        assert decode_ledger_metadata(data).state is LedgerState.CLOSED
        # The id generator's ephemeral-sequential node is deleted right after use.
        generator_parent = ROOT if manager is LedgerManagerType.FLAT else f"{ROOT}/idgen"
        assert not [c for c in zk_client.get_children(generator_parent) if c.startswith("ID-")]


# ---------------------------------------------------------------------------------------------- bookies


def test_bookies_register_with_their_own_sessions_cookies_and_rack_map(
    six: SimulatedCluster, zk_client: KazooClient
) -> None:
    ids = six.bookie_ids()
    assert ids[0] == "bookie-01" and ids[1] == six.bookie_address(1)  # BP-41 and legacy ids
    assert writable(zk_client) == set(ids)
    owners = set()
    for bookie_id in ids:
        data, stat = zk_client.get(f"{ROOT}/available/{bookie_id}")
        owners.add(stat.ephemeralOwner)
        info = decode_bookie_service_info(bookie_id, data)
        assert str(bookie_rpc_address(info)) == six.bookie_address(bookie_id)
        cookie = parse_cookie(zk_client.get(f"{ROOT}/cookies/{bookie_id}")[0])
        assert cookie.bookie_id == bookie_id and cookie.instance_id == six.instance_id
    assert 0 not in owners and len(owners) == 6
    assert six.admin.client_id[0] not in owners
    rack_map = parse_rack_map(zk_client.get("/bookies")[0])
    assert {bookie_id: rack_map.rack_of(bookie_id) for bookie_id in ids} == {
        bookie_id: f"/rack-{index % 3}" for index, bookie_id in enumerate(ids)
    }
    raw = json.loads(zk_client.get("/bookies")[0])
    assert set(raw) == {"default"} and set(raw["default"][ids[0]]) == {"rack", "hostname"}


def test_graceful_kill_removes_the_node_at_once_and_restart_brings_it_back(
    six: SimulatedCluster, zk_client: KazooClient, probe: BlockingBookieClient
) -> None:
    victim = six.bookie_ids()[2]
    address = six.bookie_address(victim)
    six.kill_bookie(victim)
    assert victim not in writable(zk_client)
    assert probe.list_entries(address, 0).kind == "connection_failed"
    six.restart_bookie(victim)
    assert victim in writable(zk_client)
    assert six.bookie_address(victim) == address  # same port, same data
    truth = six.ground_truth()
    assert truth["bookies"][victim]["flaps"] == 1 and truth["alerts"]["BOOKIE_LOST"] == []


def test_hard_kill_keeps_the_node_until_the_session_expires(
    six: SimulatedCluster, zk_client: KazooClient
) -> None:
    ledger = six.create_ledger(entries=10)
    victim = six.ledger_metadata(ledger).segments[0].ensemble[0]
    six.kill_bookie(victim, hard=True)
    killed_at = time.monotonic()
    assert victim in writable(zk_client)  # the process is dead, its session is not
    truth = six.ground_truth()
    assert truth["alerts"]["BOOKIE_LOST"] == []
    assert truth["may_alert"]["BOOKIE_UNRESPONSIVE"] == [victim]
    assert wait_until(lambda: victim not in writable(zk_client), timeout_s=SESSION_TIMEOUT_S * 4)
    assert time.monotonic() - killed_at >= SESSION_TIMEOUT_S * 0.5
    truth = six.ground_truth()
    assert truth["alerts"]["BOOKIE_LOST"] == [victim]
    assert ledger in truth["alerts"]["LEDGER_UNDER_REPLICATED"]
    six.restart_bookie(victim)
    assert victim in writable(zk_client)
    assert six.ground_truth()["alerts"]["BOOKIE_LOST"] == []


def test_a_running_bookie_whose_session_expires_registers_again(
    six: SimulatedCluster, zk_client: KazooClient
) -> None:
    victim = six.bookie_ids()[1]
    path = f"{ROOT}/available/{victim}"
    first_owner = zk_client.exists(path).ephemeralOwner
    six.reregister_delay_s = 2.0  # BookKeeper's bookie also takes a moment: the truth in between
    six.expire_bookie_session(victim)
    if zk_client.exists(path) is None:  # (on a loaded host the delay may have passed already)
        # The ground truth reads ZooKeeper: the bookie runs and believes itself writable, yet it is
        # registered nowhere until it registers again.
        assert six.ground_truth()["bookies"][victim]["registration"] == "none"
        bookie = next(b for b in six.status()["bookies"] if b["bookie_id"] == victim)
        assert (bookie["mode"], bookie["registered"]) == ("writable", "none")

    def registered_by_a_new_session() -> bool:
        stat = zk_client.exists(path)
        return stat is not None and stat.ephemeralOwner != first_owner

    assert wait_until(registered_by_a_new_session, timeout_s=30.0)
    truth = six.ground_truth()
    assert truth["bookies"][victim]["flaps"] == 1  # missing in between, as ZooKeeper saw it
    assert truth["bookies"][victim]["registration"] == "writable"
    assert truth["alerts"]["BOOKIE_LOST"] == []


def test_the_truth_reads_registrations_from_zookeeper_not_the_simulators_belief(
    six: SimulatedCluster, zk_client: KazooClient
) -> None:
    victim = six.bookie_ids()[2]
    zk_client.delete(f"{ROOT}/available/{victim}")  # gone behind the simulator's back (a hand, a bug)
    truth = six.ground_truth()
    assert truth["bookies"][victim]["registration"] == "none"
    assert truth["bookies"][victim]["missing_since_ms"] is not None


def test_flap_goes_and_comes_back(six: SimulatedCluster, zk_client: KazooClient) -> None:
    six.set_lost_bookie_recovery_delay(30)
    victim = six.bookie_ids()[0]
    six.flap_bookie(victim, 1.5)
    assert victim not in writable(zk_client)
    assert six.ground_truth()["alerts"]["BOOKIE_LOST"] == []  # one missing bookie, within the delay
    assert wait_until(lambda: victim in writable(zk_client), timeout_s=5.0)
    assert wait_until(lambda: six.ground_truth()["bookies"][victim]["flaps"] == 1, timeout_s=2.0)


def test_writing_the_delay_in_force_again_is_a_triggered_audit_in_the_truth(
    six: SimulatedCluster, zk_client: KazooClient
) -> None:
    path = UnderreplicationPaths(ROOT).lost_bookie_recovery_delay
    six.set_lost_bookie_recovery_delay(600)
    victim = six.bookie_ids()[0]
    six.kill_bookie(victim)
    assert six.ground_truth()["alerts"]["BOOKIE_LOST"] == []  # one missing bookie, within the delay
    before = zk_client.exists(path)
    six.set_lost_bookie_recovery_delay(600)  # `bookkeeper shell triggeraudit`: the same bytes again
    data, after = zk_client.get(path)
    assert data == b"600" and after.mzxid > before.mzxid and after.version == before.version + 1
    assert six.ground_truth()["alerts"]["BOOKIE_LOST"] == [victim]
    six.restart_bookie(victim)
    assert six.ground_truth()["alerts"]["BOOKIE_LOST"] == []


def test_read_only_moves_the_registration(six: SimulatedCluster, zk_client: KazooClient) -> None:
    victim = six.bookie_ids()[3]
    six.set_readonly(victim)
    assert victim not in writable(zk_client) and victim in readonly(zk_client)
    data, stat = zk_client.get(f"{ROOT}/available/readonly/{victim}")
    assert stat.ephemeralOwner != 0 and bookie_rpc_address(decode_bookie_service_info(victim, data))
    assert six.ground_truth()["bookies"][victim]["registration"] == "readonly"
    six.set_readonly(victim, readonly=False)
    assert victim in writable(zk_client) and victim not in readonly(zk_client)


def test_rack_move_rewrites_the_rack_map(six: SimulatedCluster, zk_client: KazooClient) -> None:
    victim = six.bookie_ids()[0]
    six.move_bookie_rack(victim, "/rack-9")
    assert parse_rack_map(zk_client.get("/bookies")[0]).rack_of(victim) == "/rack-9"


# ---------------------------------------------------------------------------------------------- ledgers


@pytest.mark.parametrize("format_version", [3, 2, 1])
def test_a_created_ledger_decodes_and_re_encodes_byte_for_byte(
    six: SimulatedCluster, zk_client: KazooClient, format_version: int
) -> None:
    write_quorum = ack_quorum = 2
    ledger_id = six.create_ledger(
        entries=7,
        close=False,
        format_version=format_version,
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        managed_ledger="public/default/persistent/orders",
    )
    path = ledger_path(ledger_id, LedgerManagerType.HIERARCHICAL, ROOT)
    data, stat = zk_client.get(path)
    assert data.startswith(f"BookieMetadataFormatVersion\t{format_version}\n".encode())
    md = decode_ledger_metadata(data, znode_ctime=stat.ctime)
    assert encode_ledger_metadata(md) == data
    assert md.state is LedgerState.OPEN and md.last_entry_id == -1
    assert md.creation_time == stat.ctime  # no stored ctime: the znode's stands in
    if format_version == 1:
        assert md.password is None and md.custom_metadata == ()
    else:
        assert md.digest_type is DigestType.CRC32C
        assert md.password is not None and md.password.reveal() == b"s3cret-pw"
        assert md.pulsar_topic == "persistent://public/default/orders"
        assert md.ctoken == (0 if format_version == 3 else None)
    # The rack-aware choice: every write set spans two racks.
    racks = {bookie_id: f"/rack-{index % 3}" for index, bookie_id in enumerate(six.bookie_ids())}
    ensemble = md.segments[0].ensemble
    for start in range(len(ensemble)):
        assert racks[ensemble[start]] != racks[ensemble[(start + 1) % len(ensemble)]]
    six.close_ledger(ledger_id)
    closed = decode_ledger_metadata(zk_client.get(path)[0])
    assert closed.state is LedgerState.CLOSED and closed.last_entry_id == 6 and closed.length == 7 * 1024
    assert "s3cret-pw" not in json.dumps(six.status()) and "s3cret-pw" not in json.dumps(six.ground_truth())


def test_ensemble_change_close_recovery_and_deletion(six: SimulatedCluster, zk_client: KazooClient) -> None:
    ledger_id = six.create_ledger(entries=5, close=False, name="writer")
    path = ledger_path(ledger_id, LedgerManagerType.HIERARCHICAL, ROOT)
    failed = six.ledger_metadata("writer").segments[0].ensemble[1]
    six.kill_bookie(failed)
    six.add_entries("writer", 4)  # the write to the dead bookie fails: new segment from entry 5
    md = decode_ledger_metadata(zk_client.get(path)[0])
    assert [segment.first_entry_id for segment in md.segments] == [0, 5]
    old, new = md.segments[0].ensemble, md.segments[1].ensemble
    assert new[1] != failed and new[0] == old[0] and new[2] == old[2]
    replacement = new[1]
    assert set(six.bookie_store(replacement).entries_of(ledger_id) or ()) == set(
        md.entries_on_bookie(replacement, up_to=8)
    )
    six.recover("writer", complete=False)
    assert decode_ledger_metadata(zk_client.get(path)[0]).state is LedgerState.IN_RECOVERY
    six.recover("writer")
    recovered = decode_ledger_metadata(zk_client.get(path)[0])
    assert recovered.state is LedgerState.CLOSED and recovered.last_entry_id == 8
    assert six.ground_truth()["alerts"]["LEDGER_UNDER_REPLICATED"] == [ledger_id]  # names the gone bookie
    six.delete_ledger("writer")
    assert zk_client.exists(path) is None
    assert ledger_id not in six.ground_truth()["alerts"]["LEDGER_UNDER_REPLICATED"]
    with pytest.raises(SimulatorError, match="no live ledger"):
        six.close_ledger(ledger_id)


def test_a_badly_placed_ledger_sits_in_one_rack(six: SimulatedCluster) -> None:
    good = six.create_ledger(entries=4)
    bad = six.place_ledger_badly(ensemble_size=2, write_quorum=2, ack_quorum=2, entries=4)
    racks = {bookie_id: f"/rack-{index % 3}" for index, bookie_id in enumerate(six.bookie_ids())}
    assert len({racks[b] for b in six.ledger_metadata(bad).segments[0].ensemble}) == 1
    truth = six.ground_truth()
    assert truth["alerts"]["PLACEMENT_NOT_ADHERING"] == [bad]
    assert good not in truth["alerts"]["PLACEMENT_NOT_ADHERING"]


def test_a_corrupt_metadata_znode_does_not_decode(six: SimulatedCluster, zk_client: KazooClient) -> None:
    for how in ("truncated", "garbage", "bad-version", "not-protobuf"):
        ledger_id = six.create_ledger(entries=2)
        six.corrupt_ledger_znode(ledger_id, how)
        with pytest.raises(FormatError):
            decode_ledger_metadata(zk_client.get(ledger_path(ledger_id, root=ROOT))[0])
        assert ledger_id in six.ground_truth()["alerts"]["METADATA_CORRUPT"]


def test_under_replication_mark_and_recovery_delay(six: SimulatedCluster, zk_client: KazooClient) -> None:
    ledger_id = six.create_ledger(entries=3)
    old = int(time.time() * 1000) - 3_600_000
    path = six.mark_underreplicated(ledger_id, [0], ctime_ms=old)
    assert path == UnderreplicationPaths(ROOT).urledger(ledger_id)
    text = zk_client.get(path)[0]
    assert text == f'replica: "bookie-01"\nctime: {old}\n'.encode()
    six.mark_underreplicated(ledger_id, ["bookie-01"])  # nothing new: ctime kept
    assert parse_underreplicated_ledger(zk_client.get(path)[0]).ctime == old
    six.mark_underreplicated(ledger_id, [1])  # a new replica: appended, ctime refreshed
    mark = parse_underreplicated_ledger(zk_client.get(path)[0])
    assert mark.replicas == ("bookie-01", six.bookie_ids()[1]) and mark.ctime is not None and mark.ctime > old
    six.mark_underreplicated(six.create_ledger(), ctime_ms=old)
    assert len(six.ground_truth()["alerts"]["UNDER_REPLICATION_STUCK"]) == 1
    six.set_lost_bookie_recovery_delay(45)
    delay = zk_client.get(UnderreplicationPaths(ROOT).lost_bookie_recovery_delay)[0]
    assert delay == b"45" and six.ground_truth()["lost_bookie_recovery_delay_s"] == 45


# ------------------------------------------------------------------------------------------------ probes


def test_probes_get_exact_stripes_and_typed_failures(
    six: SimulatedCluster, probe: BlockingBookieClient
) -> None:
    ledger_id = six.create_ledger(ensemble_size=5, write_quorum=2, ack_quorum=2, entries=23)
    md = six.ledger_metadata(ledger_id)
    b0, b1, b2, b3, b4 = md.segments[0].ensemble
    for bookie_id in (b0, b1, b2, b3, b4):
        result = probe.list_entries(six.bookie_address(bookie_id), ledger_id)
        assert isinstance(result, EntryList)
        assert list(result.availability.iter_entries()) == list(md.entries_on_bookie(bookie_id))
    six.lose_entries(b0, ledger_id, [0, 5])
    held = availability_of(probe.list_entries(six.bookie_address(b0), ledger_id))
    assert held is not None and 0 not in held and 5 not in held and 4 in held
    six.lose_ledger(b1, ledger_id)
    assert isinstance(probe.list_entries(six.bookie_address(b1), ledger_id), NoLedger)
    six.answer_enoledger(b2, ledger_id)
    assert isinstance(probe.list_entries(six.bookie_address(b2), ledger_id), NoLedger)
    six.make_silent(b3)
    silent = probe.list_entries(six.bookie_address(b3), ledger_id, timeout=0.3)
    assert isinstance(silent, Timeout)
    six.make_slow(b4, 0.4)
    assert isinstance(probe.list_entries(six.bookie_address(b4), ledger_id, timeout=0.1), Timeout)
    assert isinstance(probe.list_entries(six.bookie_address(b4), ledger_id, timeout=3.0), EntryList)
    truth = six.ground_truth()
    assert truth["alerts"]["BOOKIE_UNRESPONSIVE"] == [b3]
    # Entry 0 (write set b0, b1): b0 lost it and b1 lost the whole ledger, so no copy is left.
    assert truth["alerts"]["REPLICAS_NO_REPLICA"] == [ledger_id]
    six.heal_bookie(b3)
    assert isinstance(probe.list_entries(six.bookie_address(b3), ledger_id), EntryList)


# --------------------------------------------------------------------------------------------------- CLI


def test_cli_up_fault_truth_down_round_trip(hosts: str, tmp_path: Path, cli: Callable[..., Any]) -> None:
    state_dir = tmp_path / "state"
    command = [
        sys.executable,
        "-m",
        "bkaudit.cli.main",
        "sim",
        "up",
        "--zookeeper",
        hosts,
        "--bookies",
        "4",
        "--ledgers",
        "3",
        "--bookie-session-timeout",
        str(SESSION_TIMEOUT_S),
        "--state-dir",
        str(state_dir),
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ}
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, process.stderr.read() if process.stderr else ""
        summary = json.loads(line)
        assert summary["root"] == ROOT and len(summary["bookies"]) == 4 and len(summary["ledgers"]) == 3
        assert summary["control"].startswith("127.0.0.1:")
        state = ["--state-dir", str(state_dir)]
        second = cli("sim", "up", "--zookeeper", hosts, *state)
        assert second.exit_code == 2 and "already running" in second.stderr
        by_place = cli("sim", "kill-bookie", "1", *state)  # a number is not an id: refused, with the way
        assert by_place.exit_code == 2 and "use --index 1" in by_place.stderr, by_place.stderr
        killed = cli("sim", "kill-bookie", "--index", "1", *state)
        assert killed.exit_code == 0, killed.stderr
        truth = cli("sim", "truth", "--format", "json", *state)
        assert truth.exit_code == 0, truth.stderr
        lost = summary["bookies"][1]["bookie_id"]
        assert truth.json()["alerts"]["BOOKIE_LOST"] == [lost]
        bad = cli("sim", "kill-bookie", lost, *state)  # by its id
        assert bad.exit_code == 2 and bad.stderr == f"bkaudit: bookie {lost} is already down\n"
        table = cli("sim", "truth", *state)  # the human view
        assert table.exit_code == 0 and "BOOKIE_LOST" in table.text and lost in table.text, table.text
        for args in (("autorecovery", "off"), ("auditor", "off"), ("hold-lock", "#0", "--holder", "w9")):
            assert cli("sim", *args, *state).exit_code == 0, args
        autorecovery = cli("sim", "status", "--format", "json", *state).json()["autorecovery"]
        assert autorecovery == {
            "enabled": False,
            "auditor": None,
            "locks": [summary["ledgers"][0]],
            "checks": {},  # no periodic check has completed (the Auditor's check-time znodes)
        }
        assert cli("sim", "autorecovery", "maybe", *state).exit_code == 2
        assert cli("sim", "down", *state).exit_code == 0
        assert process.wait(timeout=20) == 0
        assert not (state_dir / "sim.json").exists()
        gone = cli("sim", "truth", *state)
        assert gone.exit_code == 2 and "no simulator is running" in gone.stderr
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=10)


def test_cli_runs_a_scenario_against_a_new_simulator(
    hosts: str, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(
        """
cluster: {bookies: 4, racks: 2, ledgers: 2, entries: 6, id_style: bp41, seed: 3}
truth: {under_replication_grace_s: 60}
steps:
  - {at: 0, action: create_ledger, name: t, entries: 6, ensemble: [0, 1, 2]}
  - {at: 0.1, action: kill_bookie, bookie: bookie-01}
  - {at: 0.2, action: mark_underreplicated, ledger: t, replicas: [bookie-01], age_s: 3600}
end_at: 0.4
""",
        encoding="utf-8",
    )
    result = cli("sim", "run", str(scenario), "--zookeeper", hosts)
    assert result.exit_code == 0, result.stderr
    truth = result.json()
    assert truth["alerts"]["BOOKIE_LOST"] == ["bookie-01"]
    ledger_id = truth["scenario"]["steps"][0]["result"]["result"]["ledger_ids"][0]
    assert ledger_id in truth["alerts"]["LEDGER_UNDER_REPLICATED"]
    assert truth["alerts"]["UNDER_REPLICATION_STUCK"] == [ledger_id]
    assert [step["action"] for step in truth["scenario"]["steps"]] == [
        "create_ledger",
        "kill_bookie",
        "mark_underreplicated",
    ]
    again = cli("sim", "run", str(scenario), "--zookeeper", hosts)
    assert again.exit_code == 2 and "already has /ledgers" in again.stderr


def test_simulated_bookies_speak_tls_and_require_client_certificates(hosts, tmp_path):
    tls = write_throwaway_ca(tmp_path)
    context = server_tls_context(tls.server_cert, tls.server_key, ca_file=tls.ca, require_client_cert=True)
    cluster = SimulatedCluster(hosts, racks=1, seed=5, bookie_tls=context).init()
    try:
        address = cluster.bookie_address(cluster.add_bookie())
        mutual = BookieTlsConfig(ca_file=tls.ca, cert_file=tls.client_cert, key_file=tls.client_key)
        with BlockingBookieClient(timeout=5.0, tls=mutual) as client:
            assert isinstance(client.list_entries(address, 1), NoLedger)
        with BlockingBookieClient(timeout=5.0, tls=BookieTlsConfig(ca_file=tls.ca)) as client:
            assert client.list_entries(address, 1).kind == "tls_refused"
    finally:
        cluster.close()
