"""`bkaudit metadata show` and `bkaudit bookies list` against a cluster the simulator built in the real
embedded ZooKeeper: what they print is what the simulator wrote, the password never appears unless asked for,
and a missing ledger or undecodable metadata is one line and exit 2."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bkaudit.sim.cluster import SimulatedCluster
from bkaudit.testing.harness import ServiceHarness
from core.domain.layout import LedgerManagerType, ledger_path
from core.domain.metadata import metadata_to_json

pytestmark = pytest.mark.integration

Cli = Callable[..., Any]
SECRET = b"Zq7-admin-read-secret"
MANAGED_LEDGER = "public/default/persistent/orders"


@pytest.fixture
def hosts(bk_services: ServiceHarness, zk_chroot: str) -> str:
    return bk_services.zookeeper_hosts(zk_chroot)


def _cluster(hosts: str, **options: Any) -> SimulatedCluster:
    sim = SimulatedCluster(hosts, racks=2, seed=5, password=SECRET, bookie_session_timeout_s=2.0, **options)
    sim.init()
    for index in range(3):
        sim.add_bookie(legacy_id=index == 2)
    return sim


@pytest.fixture
def sim(hosts: str) -> Iterator[SimulatedCluster]:
    cluster = _cluster(hosts)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def flat_sim(hosts: str) -> Iterator[SimulatedCluster]:
    cluster = _cluster(hosts, root="/bk", manager=LedgerManagerType.FLAT)
    try:
        yield cluster
    finally:
        cluster.close()


def _show(cli: Cli, sim: SimulatedCluster, *args: str) -> Any:
    return cli("metadata", "show", *args, "--zookeeper", sim.zk_hosts, "--ledgers-root", sim.root)


def _ledger(sim: SimulatedCluster) -> int:
    return sim.create_ledger(managed_ledger=MANAGED_LEDGER, entries=4)


def _assert_no_secret(output: bytes) -> None:
    for form in (SECRET, base64.b64encode(SECRET), SECRET.hex().encode()):
        assert form not in output


@pytest.mark.parametrize("which", ["sim", "flat_sim"])
def test_show_json_is_the_metadata_the_simulator_wrote(cli: Cli, which: str, request: pytest.FixtureRequest):
    cluster: SimulatedCluster = request.getfixturevalue(which)
    ledger_id = _ledger(cluster)

    result = _show(cli, cluster, "--ledger-id", str(ledger_id), "--format", "json")

    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    written = metadata_to_json(cluster.ledger_metadata(ledger_id))
    assert {key: document[key] for key in written} == written
    assert document["state"] == "CLOSED" and document["last_entry_id"] == 3
    assert document["ledger_id"] == ledger_id
    assert document["ledger_manager"] == cluster.manager.value
    assert document["path"] == ledger_path(ledger_id, cluster.manager, cluster.root)
    assert document["pulsar_topic"] == "persistent://public/default/orders"
    assert document["has_password"] is True and "password_b64" not in document
    _assert_no_secret(result.stdout)


def test_show_table_names_ensemble_quorums_state_and_custom_metadata(cli: Cli, sim: SimulatedCluster):
    ledger_id = _ledger(sim)
    written = sim.ledger_metadata(ledger_id)

    result = _show(cli, sim, str(ledger_id))

    assert result.exit_code == 0, result.stderr
    text = result.stdout.decode()
    lines = text.splitlines()
    for expected in (
        f"ledger_id: {ledger_id}",
        "state: CLOSED",
        "last_entry_id: 3",
        f"write_quorum: {written.write_quorum}",
        f"ack_quorum: {written.ack_quorum}",
    ):
        assert expected in lines
    assert ["0", *written.segments[0].ensemble] in [line.split() for line in lines]
    assert any(line.startswith("pulsar/managed-ledger") and MANAGED_LEDGER in line for line in lines)
    _assert_no_secret(result.stdout)


def test_show_prints_the_password_only_when_asked(cli: Cli, sim: SimulatedCluster):
    ledger_id = _ledger(sim)

    result = _show(cli, sim, str(ledger_id), "--format", "json", "--include-password")

    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["password_b64"] == base64.b64encode(SECRET).decode()


def test_a_missing_ledger_is_one_line_and_exit_2(cli: Cli, sim: SimulatedCluster):
    _ledger(sim)

    result = _show(cli, sim, "987654")

    assert result.exit_code == 2 and result.stdout == b""
    assert result.stderr.count("\n") == 1
    assert "no ledger 987654" in result.stderr and ledger_path(987654) in result.stderr


def test_undecodable_metadata_is_one_line_and_exit_2(cli: Cli, sim: SimulatedCluster):
    ledger_id = _ledger(sim)
    sim.corrupt_ledger_znode(ledger_id, "truncated")

    result = _show(cli, sim, str(ledger_id))

    assert result.exit_code == 2 and result.stdout == b""
    assert result.stderr.count("\n") == 1
    assert f"ledger {ledger_id} at {ledger_path(ledger_id)}: undecodable metadata" in result.stderr


def _bookies(cli: Cli, sim: SimulatedCluster, *args: str) -> dict[str, Any]:
    result = cli("bookies", "list", *args, "--format", "json", "--zookeeper", sim.zk_hosts)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_bookies_list_follows_a_bookie_going_read_only(cli: Cli, sim: SimulatedCluster):
    first, second, third = sim.bookie_ids()
    assert _bookies(cli, sim, "--ro") == {"read_only": 0, "bookies": []}

    sim.set_readonly(second)

    listed = _bookies(cli, sim)
    assert listed["writable"] == 2 and listed["read_only"] == 1
    assert {row["bookie_id"]: row["state"] for row in listed["bookies"]} == {
        first: "writable",
        second: "read-only",
        third: "writable",
    }
    assert {row["bookie_id"]: row["address"] for row in listed["bookies"]} == {
        bookie: sim.bookie_address(bookie) for bookie in (first, second, third)
    }
    assert [row["bookie_id"] for row in _bookies(cli, sim, "--rw")["bookies"]] == sorted([first, third])
    assert [row["bookie_id"] for row in _bookies(cli, sim, "--ro")["bookies"]] == [second]

    table = cli("bookies", "list", "--ro", "--zookeeper", sim.zk_hosts).stdout.decode().splitlines()
    assert "read_only: 1" in table and any(line.split()[:2] == [second, "read-only"] for line in table)
