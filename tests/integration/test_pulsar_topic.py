"""`bkaudit pulsar topic`: a topic's managed ledger read live from the metadata store, each ledger it needs
asked of BookKeeper (the simulator writes Pulsar's znodes; the embedded ZooKeeper serves them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bkaudit.sim.cluster import SimulatedCluster
from core.domain.managed_ledger import ManagedLedgerInfo, TopicLedger, encode_managed_ledger_info
from tests.conftest import CliResult

pytestmark = pytest.mark.integration

TOPIC = "persistent://public/default/orders"


@pytest.fixture(scope="module")
def cluster(bk_services: Any) -> Iterator[tuple[SimulatedCluster, str]]:
    hosts = bk_services.zookeeper_hosts(bk_services.new_chroot())
    sim = SimulatedCluster(hosts, racks=2)
    sim.init()
    for _ in range(3):
        sim.add_bookie()
    for _ in range(3):
        sim.create_ledger(entries=4, managed_ledger="public/default/persistent/orders")
    sim.create_ledger(entries=2, managed_ledger="public/default/persistent/other")
    try:
        yield sim, hosts
    finally:
        sim.close()


def topic(cli: Callable[..., CliResult], hosts: str, name: str = TOPIC) -> tuple[int, dict[str, Any]]:
    result = cli("pulsar", "topic", name, "--zookeeper", hosts, "--format", "json")
    assert result.exit_code in (0, 1), result.stderr
    answer = result.json()
    assert isinstance(answer, dict)
    return result.exit_code, answer


def test_a_ledger_bookkeeper_lost_is_missing_for_its_topic(
    cli: Any, cluster: tuple[SimulatedCluster, str]
) -> None:
    sim, hosts = cluster
    paths = sim.write_managed_ledgers()
    assert paths[TOPIC] == "/managed-ledgers/public/default/persistent/orders"
    ledgers = sim.ledger_ids()[:3]
    code, answer = topic(cli, hosts)
    assert code == 0 and answer["missing"] == []
    assert [(r["ledger_id"], r["owner"], r["state"]) for r in answer["ledgers"]] == [
        (ledger_id, "topic", "ok") for ledger_id in ledgers
    ]
    assert all(r["entries"] == 4 for r in answer["ledgers"])

    sim.delete_ledger(ledgers[1])  # gone from BookKeeper, still listed by the topic: it cannot load
    code, answer = topic(cli, hosts)
    assert code == 1 and answer["missing"] == [ledgers[1]]
    assert {r["ledger_id"]: r["state"] for r in answer["ledgers"]}[ledgers[1]] == "MISSING"


def test_an_offloaded_ledger_deleted_from_bookkeeper_is_expected(
    cli: Any, cluster: tuple[SimulatedCluster, str]
) -> None:
    sim, hosts = cluster
    offloaded = TopicLedger(999_999, entries=10, size=100, offloaded=True, bookkeeper_deleted=True)
    kept = TopicLedger(sim.ledger_ids()[-1])
    sim.put_znode(
        "/managed-ledgers/t/n/persistent/tiered",
        encode_managed_ledger_info(ManagedLedgerInfo((offloaded, kept)), compression="ZLIB"),
    )
    code, answer = topic(cli, hosts, "persistent://t/n/tiered")
    assert code == 0 and [r["state"] for r in answer["ledgers"]] == ["offloaded", "ok"]


def test_an_undecodable_managed_ledger_or_an_unknown_topic_is_one_line(
    cli: Any, cluster: tuple[SimulatedCluster, str]
) -> None:
    sim, hosts = cluster
    sim.put_znode("/managed-ledgers/t/n/persistent/broken", b"\xff\xfe not a managed ledger")
    for name, message in (
        (
            "persistent://t/n/broken",
            "/managed-ledgers/t/n/persistent/broken: ManagedLedgerInfo does not decode",
        ),
        ("persistent://t/n/absent", "no managed ledger for persistent://t/n/absent"),
    ):
        result = cli("pulsar", "topic", name, "--zookeeper", hosts)
        assert result.exit_code == 2 and result.stderr.count("\n") == 1 and message in result.stderr, (
            result.stderr
        )
