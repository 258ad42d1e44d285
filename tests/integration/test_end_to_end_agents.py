"""End to end with bookie-side agents: the job's replicas verdicts on an all-DbLedgerStorage cluster come from
`bkaudit agent` servers reading each simulated bookie's RocksDB index (TLS, bearer token), not the bookies.

The simulator writes every DbLedgerStorage bookie's index in BookKeeper's layout; one agent per bookie
serves it. Evidence that the verdicts are the agents': no request ever reaches a bookie's server, and a
loss inside a fragment, which the entry reads of fragment ends cannot see (the ground truth lists it as
``may_alert`` only), is alerted because an agent's answer is the bookie's whole entry list.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from bkaudit.sim.cluster import DB_STORAGE, SimulatedCluster
from connectors.agent.index import DbStorageIndexReader
from connectors.agent.server import RunningAgent, start_agent_server
from connectors.delta.tables import read_table
from connectors.kafka.topics import ensure_topic
from tests.integration.agent_tls import make_tls
from tests.integration.test_end_to_end import (
    ALWAYS,
    PROBED,
    Stack,
    e2e_settings,
    fragment_ends,
    start_stack,
    stop_stack,
)

pytestmark = pytest.mark.integration

TOKEN = "e2e-agent-token-51b7"
REPLICAS = ("REPLICAS_NO_REPLICA", "REPLICAS_LESS_THAN_AQ", "REPLICAS_LESS_THAN_WQ")


@pytest.fixture(scope="module")
def stack(bk_services, spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e-agents")
    hosts = bk_services.zookeeper_hosts(bk_services.new_chroot())
    cluster = SimulatedCluster(
        hosts, racks=3, bookie_session_timeout_s=2.0, seed=11, index_root=root / "bookies"
    )
    cluster.init()
    for _ in range(4):
        cluster.add_bookie(storage=DB_STORAGE)
    for _ in range(5):
        cluster.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, entries=20)
    tls = make_tls()
    (root / "ca.pem").write_bytes(tls.ca_pem)

    def serve(bookie: str, port: int = 0) -> RunningAgent:
        reader = DbStorageIndexReader([cluster.ledger_dir(bookie)], refresh_s=0, view_root=root / "views")
        return start_agent_server(reader, f"127.0.0.1:{port}", token=TOKEN, tls=(tls.cert_pem, tls.key_pem))

    agents = {bookie: serve(bookie) for bookie in cluster.bookie_ids()}
    kafka = bk_services.kafka_settings(topic_partitions=1)
    ensure_topic(kafka, kafka.changes_topic, partitions=1)
    agent_settings = {
        "addresses": {bookie: f"localhost:{agent.port}" for bookie, agent in agents.items()},
        "token": TOKEN,
        "tls_ca_file": root / "ca.pem",
    }
    built = start_stack(cluster, e2e_settings(hosts, kafka, root, agent=agent_settings), spark)
    built.agents, built.serve_agent = agents, serve  # type: ignore[attr-defined]
    try:
        yield built
    finally:
        stop_stack(built)
        for agent in agents.values():
            agent.stop()  # a second stop of a stopped one is harmless


def bookie_requests(stack: Stack) -> dict[str, int]:
    return {bookie: stack.cluster.bookie_requests(bookie) for bookie in stack.cluster.bookie_ids()}


def probed_ledgers(stack: Stack) -> int:
    return sum(report.probes for report in stack.sink.reports)


def test_a_healthy_cluster_is_checked_by_the_agents_alone(stack: Stack) -> None:
    deadline = time.monotonic() + 90
    while probed_ledgers(stack) < len(stack.cluster.ledger_ids()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert probed_ledgers(stack) >= len(stack.cluster.ledger_ids())  # the scrutiny pass ran
    stack.wait_until_matches(ALWAYS + PROBED)
    assert stack.open_alerts() == {}
    assert bookie_requests(stack) == dict.fromkeys(stack.cluster.bookie_ids(), 0)
    learned = {
        r["bookie_id"]: r.get("answers_entry_lists")
        for r in read_table(stack.settings.lakehouse_root, "bookies").to_pylist()
    }
    assert set(learned.values()) == {None}  # never asked, so nothing to learn


def test_a_loss_inside_a_fragment_is_alerted_from_the_agents_answers(stack: Stack) -> None:
    ledger = stack.cluster.ledger_ids()[2]
    bookie = stack.cluster.ledger_metadata(ledger).segments[0].ensemble[0]
    held = sorted(stack.cluster.bookie_store(bookie).entries_of(ledger) or ())
    inner = [e for e in held if e not in fragment_ends(stack, ledger, bookie)][:2]
    assert inner, "the bookie must hold entries between its fragment's ends"
    stack.cluster.lose_entries(bookie, ledger, inner)
    truth: dict[str, Any] = stack.truth()
    expected = {k for k, ids in truth["may_alert"].items() if ledger in ids and k in REPLICAS}
    assert expected and not any(ledger in truth["alerts"].get(k, []) for k in REPLICAS)  # reads cannot see it
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = {k for k, ids in stack.open_alerts().items() if str(ledger) in ids and k in REPLICAS}
        if found == expected:
            break
        assert stack.query.exception() is None, stack.query.exception()
        time.sleep(0.5)
    assert found == expected
    stack.wait_until_matches(ALWAYS + PROBED)
    stack.cluster.bookie_store(bookie).add_entries(ledger, inner)  # repaired: the alert resolves
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and any(
        str(ledger) in stack.open_alerts().get(k, set()) for k in REPLICAS
    ):
        time.sleep(0.5)
    assert not any(str(ledger) in stack.open_alerts().get(k, set()) for k in REPLICAS)
    assert bookie_requests(stack) == dict.fromkeys(stack.cluster.bookie_ids(), 0)


def test_a_transient_agent_outage_falls_back_to_the_bookie_and_raises_nothing(stack: Stack) -> None:
    bookie = stack.cluster.bookie_ids()[1]
    agents: dict[str, RunningAgent] = stack.agents  # type: ignore[attr-defined]
    started_ms, before, port = (
        int(time.time() * 1000),
        stack.cluster.bookie_requests(bookie),
        agents[bookie].port,
    )
    agents[bookie].stop()
    deadline = time.monotonic() + 60
    while stack.cluster.bookie_requests(bookie) == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert stack.cluster.bookie_requests(bookie) > before  # checked directly while its agent is gone
    agents[bookie] = stack.serve_agent(bookie, port)  # type: ignore[attr-defined]
    time.sleep(3.0)
    stack.wait_until_matches(ALWAYS + PROBED)
    fired = [
        (r["kind"], r["entity"])
        for r in read_table(stack.settings.lakehouse_root, "violations").to_pylist()
        if r["kind"] in PROBED and r["detected_at"].timestamp() * 1000 >= started_ms
    ]
    assert fired == []
