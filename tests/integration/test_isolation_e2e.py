"""Bookie isolation end to end: simulator (affinity groups in ``/bookies``, ledgers written under Pulsar's
isolation policy) → real ZooKeeper → watcher → broker → the job → ``PLACEMENT_ISOLATION_VIOLATED``, fired
and resolved with the same id as the rack map's groups change, always equal to the simulator's truth."""

from __future__ import annotations

import time
from typing import Any

import pytest

from bkaudit.sim.cluster import SimulatedCluster
from connectors.delta.tables import read_table
from connectors.kafka.topics import ensure_topic
from core.domain.isolation import IsolationGroups
from tests.integration.test_end_to_end import ALWAYS, Stack, e2e_settings, start_stack, stop_stack

pytestmark = pytest.mark.integration

KIND = "PLACEMENT_ISOLATION_VIOLATED"
KINDS = (*ALWAYS, KIND)
ISOLATED = IsolationGroups(("orders",), ("shared",))


@pytest.fixture(scope="module")
def stack(bk_services: Any, spark: Any, tmp_path_factory: Any) -> Any:
    chroot = bk_services.new_chroot()
    hosts = bk_services.zookeeper_hosts(chroot)
    cluster = SimulatedCluster(
        hosts, racks=3, bookie_session_timeout_s=2.0, lost_bookie_recovery_delay_s=30, seed=11
    )
    cluster.init()
    for index in range(6):  # bookies 0-2 in "orders" (one per rack), 3-5 in the default group
        cluster.add_bookie(group="orders" if index < 3 else None)
    bookies = cluster.bookie_ids()
    for index in range(4):
        cluster.create_ledger(
            entries=5, isolation=ISOLATED, managed_ledger=f"acme/orders/persistent/t{index}"
        )
    cluster.create_ledger(entries=5)  # not isolated: anywhere is fine
    # Written outside its group (a client without the policy): bookie 3 is in the default group.
    cluster.create_ledger(
        entries=5, isolation=ISOLATED, ensemble=[bookies[0], bookies[1], bookies[3]], name="bad"
    )
    root = tmp_path_factory.mktemp("isolation")
    kafka = bk_services.kafka_settings(topic_partitions=2)
    ensure_topic(kafka, kafka.changes_topic, partitions=2)
    built = start_stack(cluster, e2e_settings(hosts, kafka, root), spark)
    try:
        yield built
    finally:
        stop_stack(built)


def transitions(stack: Stack, count: int, timeout_s: float = 60.0) -> list[tuple[str, str, int]]:
    """The kind's transitions in ``violations`` once there are ``count`` (the table is written just after
    ``open_alerts``, which the waits read)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = read_table(stack.settings.lakehouse_root, "violations").to_pylist()
        found = [(r["alert_id"], r["state"], r["ledger_id"]) for r in rows if r["kind"] == KIND]
        if len(found) >= count or time.monotonic() > deadline:
            return sorted(found, key=lambda t: t[1])
        time.sleep(0.5)


def test_the_alert_fires_on_the_ledger_outside_its_group_and_resolves_with_its_id(stack: Stack) -> None:
    bad = stack.cluster.ledger_id("bad")
    assert stack.truth()["alerts"][KIND] == [bad]
    stack.wait_until_matches(KINDS, timeout=180)
    assert stack.open_alerts()[KIND] == {str(bad)}
    [(alert_id, state, ledger_id)] = transitions(stack, 1)
    assert (state, ledger_id) == ("firing", bad)

    # The default group's bookie joins "orders": nothing is outside any more.
    joining = stack.cluster.bookie_ids()[3]
    stack.cluster.set_bookie_group(joining, "orders")
    assert stack.truth()["alerts"][KIND] == []
    stack.wait_until_matches(KINDS, timeout=180)
    assert KIND not in stack.open_alerts()
    assert transitions(stack, 2) == [
        (alert_id, "firing", bad),
        (alert_id, "resolved", bad),
    ]
    groups = {
        r["bookie_id"]: r["rack_group"]
        for r in read_table(stack.settings.lakehouse_root, "bookies").to_pylist()
    }
    assert groups[joining] == "orders" and groups[stack.cluster.bookie_ids()[5]] == "default"


def test_a_bookie_moved_out_of_the_group_flags_exactly_the_isolated_ledgers_on_it(stack: Stack) -> None:
    moved = stack.cluster.bookie_ids()[0]
    stack.cluster.set_bookie_group(moved, "elsewhere")
    expected = stack.truth()["alerts"][KIND]
    assert expected, "the isolated ledgers on the moved bookie should be outside their group now"
    stack.wait_until_matches(KINDS, timeout=180)
    assert stack.open_alerts()[KIND] == {str(i) for i in expected}
