"""End to end: simulator → real ZooKeeper → watcher → broker → Structured Streaming job → Delta + alerts.

One stack per module (one Spark query); each test injects a fault with the simulator and waits until the
auditor's open alerts match the simulator's ground truth: everything the truth requires, nothing outside
``alerts ∪ may_alert``. Kinds that need probes are compared in the probe tests only.

The cluster is Pulsar-like: every bookie is a DbLedgerStorage one, which never answers the entry-list
request, so the job must learn that and check replicas with entry reads.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bkaudit.sim.cluster import DB_STORAGE, SimulatedCluster
from bkaudit.sim.truth import TruthParameters
from bkaudit.testing.kafka_io import read_topic
from connectors.delta.tables import read_table
from connectors.kafka.topics import ensure_topic
from connectors.zookeeper.watcher import ChangeWatcher
from core.domain.rules.entry_reads import entries_to_read
from core.domain.striping import write_set
from core.settings import Settings
from streaming import job

pytestmark = pytest.mark.integration

ALWAYS = (
    "BOOKIE_LOST",
    "LEDGER_UNDER_REPLICATED",
    "LEDGER_UNRECOVERABLE",
    "PLACEMENT_NOT_ADHERING",
    "PLACEMENT_SOFT",
    "METADATA_CORRUPT",
    "UNDER_REPLICATION_STUCK",
)
PROBED = ("REPLICAS_NO_REPLICA", "REPLICAS_LESS_THAN_AQ", "REPLICAS_LESS_THAN_WQ", "BOOKIE_UNRESPONSIVE")
GRACE_S = 30
PASSWORD = b"e2e-ledger-secret-7f3a"


@dataclass
class Stack:
    cluster: SimulatedCluster
    settings: Settings
    watcher: ChangeWatcher
    query: Any
    sink: Any

    def open_alerts(self) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for row in read_table(self.settings.lakehouse_root, "open_alerts").to_pylist():
            entity = row["entity"].split("/", 1)[1]
            found.setdefault(row["kind"], set()).add(entity)
        return found

    def truth(self) -> dict[str, Any]:
        return self.cluster.ground_truth(
            params=TruthParameters(
                probe_timeout_s=self.settings.stream.probe_timeout_s, under_replication_grace_s=GRACE_S
            )
        )

    def mismatch(self, kinds: tuple[str, ...]) -> dict[str, Any]:
        truth, found = self.truth(), self.open_alerts()
        problems = {}
        for kind in kinds:
            required = {str(i) for i in truth["alerts"].get(kind, [])}
            allowed = required | {str(i) for i in truth.get("may_alert", {}).get(kind, [])}
            have = found.get(kind, set())
            if not required <= have or not have <= allowed:
                problems[kind] = {"missing": sorted(required - have), "extra": sorted(have - allowed)}
        return problems

    def wait_until_matches(self, kinds: tuple[str, ...] = ALWAYS, timeout: float = 90.0) -> float:
        started = time.monotonic()
        problems: dict[str, Any] = {}
        while time.monotonic() - started < timeout:
            assert self.query.exception() is None, self.query.exception()
            problems = self.mismatch(kinds)
            if not problems:
                return time.monotonic() - started
            time.sleep(0.5)
        recent = [
            (r.batch_id, r.decisions, r.probes, r.feedback, [(a["kind"], a["state"]) for a in r.alerts])
            for r in self.sink.reports[-15:]
        ]
        raise AssertionError(
            f"auditor and ground truth still differ after {timeout:.0f} s: {problems}; recent batches "
            f"(id, decisions, probes, feedback, alerts): {recent}"
        )


def e2e_settings(hosts: str, kafka: Any, root: Path, **sections: Any) -> Settings:
    """The stack's settings: short intervals, two re-probe rounds, a background replicas check."""
    return Settings(
        zookeeper={"connect": hosts, "session_timeout_s": 10},
        kafka=kafka,
        lakehouse_root=root / "lakehouse",
        checkpoint_root=root / "checkpoints",
        watcher={"heartbeat_interval_s": 0.5, "rack_map_znode": "/bookies", "progress": "off"},
        stream={
            "watermark_delay_s": 1.0,
            "probe_timeout_s": 0.5,
            "reprobe_delay_s": 1.0,
            "reprobe_rounds": 2,
            "confirmed_recheck_s": 5.0,
            "under_replication_grace_s": GRACE_S,
            "scrutiny_ledgers_per_s": 5.0,  # the 12 ledgers walked every 2.4 s: found as soon, fewer probes
        },
        **sections,
    )


def start_stack(cluster: SimulatedCluster, settings: Settings, spark: Any) -> Stack:
    """The watcher (after its first snapshot) and the job, on ``cluster``."""
    watcher = ChangeWatcher(settings)
    watcher.start()
    assert watcher.wait_for_snapshots(1, timeout_s=60)
    query, sink = job.start(spark, settings)
    return Stack(cluster, settings, watcher, query, sink)


def stop_stack(stack: Stack) -> None:
    job.stop_gracefully(stack.query, stack.sink, timeout_s=30)
    stack.sink.close()
    stack.watcher.stop()
    stack.cluster.close()


@pytest.fixture(scope="module")
def stack(bk_services, spark, tmp_path_factory):
    chroot = bk_services.new_chroot()
    hosts = bk_services.zookeeper_hosts(chroot)
    cluster = SimulatedCluster(
        hosts,
        racks=3,
        bookie_session_timeout_s=2.0,
        lost_bookie_recovery_delay_s=0,
        seed=7,
        password=PASSWORD,
    )
    cluster.init()
    for _ in range(6):
        cluster.add_bookie(storage=DB_STORAGE)
    for index in range(10):
        cluster.create_ledger(entries=20, managed_ledger=f"public/default/persistent/topic-{index}")
    cluster.create_ledger(entries=5, close=False)
    cluster.create_ledger(ensemble_size=2, write_quorum=1, ack_quorum=1, entries=10)  # WQ=1
    root = tmp_path_factory.mktemp("e2e")
    kafka = bk_services.kafka_settings(topic_partitions=2)
    ensure_topic(kafka, kafka.changes_topic, partitions=2)
    settings = e2e_settings(hosts, kafka, root)
    built = start_stack(cluster, settings, spark)
    query = built.query
    # The job must have ingested the watcher's START snapshot before any comparison means anything.
    expected = set(cluster.ledger_ids())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert query.exception() is None, query.exception()
        if {r["ledger_id"] for r in read_table(settings.lakehouse_root, "ledgers").to_pylist()} == expected:
            break
        time.sleep(0.5)
    else:
        raise AssertionError("the job did not ingest the START snapshot within 120 s")
    try:
        yield built
    finally:
        stop_stack(built)


def test_a_healthy_cluster_raises_nothing(stack):
    stack.wait_until_matches(ALWAYS + PROBED)
    assert stack.open_alerts() == {}
    ledgers = read_table(stack.settings.lakehouse_root, "ledgers").to_pylist()
    assert {r["ledger_id"] for r in ledgers} == set(stack.cluster.ledger_ids())
    assert all(r["placement"] == "MEETS_STRICT" for r in ledgers if r["state"] == "CLOSED")


def test_a_flap_shorter_than_the_delay_raises_nothing(stack):
    stack.cluster.set_lost_bookie_recovery_delay(30)
    bookie = stack.cluster.bookie_ids()[0]
    stack.cluster.flap_bookie(bookie, down_s=1.0)
    time.sleep(4)
    stack.wait_until_matches()
    assert "BOOKIE_LOST" not in stack.open_alerts()
    rows = {r["bookie_id"]: r for r in read_table(stack.settings.lakehouse_root, "bookies").to_pylist()}
    deadline = time.monotonic() + 30
    while rows[bookie]["flaps"] < 1 and time.monotonic() < deadline:
        time.sleep(0.5)
        rows = {r["bookie_id"]: r for r in read_table(stack.settings.lakehouse_root, "bookies").to_pylist()}
    assert rows[bookie]["flaps"] >= 1 and rows[bookie]["status"] == "WRITABLE"


def test_a_read_only_bookie_is_not_missing_and_raises_no_placement_alarm(stack):
    bookie = stack.cluster.bookie_ids()[1]
    stack.cluster.set_readonly(bookie)
    time.sleep(3)
    stack.wait_until_matches(ALWAYS)
    assert stack.open_alerts() == {}
    stack.cluster.set_readonly(bookie, readonly=False)


def test_a_lost_bookie_flags_exactly_its_ledgers_and_resolves_when_it_returns(stack):
    stack.cluster.set_lost_bookie_recovery_delay(0)
    bookie = stack.cluster.bookie_ids()[2]
    stack.cluster.kill_bookie(bookie)
    stack.wait_until_matches()
    open_alerts = stack.open_alerts()
    assert open_alerts["BOOKIE_LOST"] == {bookie}
    assert open_alerts.get("LEDGER_UNDER_REPLICATED") or open_alerts.get("LEDGER_UNRECOVERABLE")
    stack.cluster.restart_bookie(bookie)
    stack.wait_until_matches()
    assert not {"BOOKIE_LOST", "LEDGER_UNDER_REPLICATED", "LEDGER_UNRECOVERABLE"} & set(stack.open_alerts())


def test_a_rack_move_rechecks_exactly_the_moved_bookies_ledgers(stack):
    bookies = stack.cluster.bookie_ids()
    stack.cluster.move_bookie_rack(bookies[3], "/rack-0")
    stack.cluster.move_bookie_rack(bookies[4], "/rack-0")
    stack.wait_until_matches()
    assert stack.truth()["alerts"]["PLACEMENT_NOT_ADHERING"], "the move should break some write sets"


def test_a_corrupt_znode_is_quarantined_and_processing_continues(stack):
    victim = stack.cluster.ledger_ids()[0]
    stack.cluster.corrupt_ledger_znode(victim)
    new_ledger = stack.cluster.create_ledger(entries=3)
    stack.wait_until_matches()
    assert str(victim) in stack.open_alerts()["METADATA_CORRUPT"]

    def quarantined() -> bool:
        dead = read_table(stack.settings.lakehouse_root, "dead_letters").to_pylist()
        return any(d["source"] == "znode" and d["ledger_id"] == victim for d in dead)

    # One batch commits its tables one after another: the dead letter may land just after open_alerts.
    deadline = time.monotonic() + 30
    while not quarantined() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert quarantined()
    # Processing continues: a ledger created after the corrupt znode still arrives (maybe a batch later).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ledgers = {r["ledger_id"] for r in read_table(stack.settings.lakehouse_root, "ledgers").to_pylist()}
        if new_ledger in ledgers:
            break
        time.sleep(0.5)
    assert new_ledger in ledgers


def test_an_old_under_replication_mark_is_stuck(stack):
    ledger = stack.cluster.ledger_ids()[2]
    stack.cluster.mark_underreplicated(ledger, [], ctime_ms=int(time.time() * 1000) - 3_600_000)
    stack.wait_until_matches()
    assert str(ledger) in stack.open_alerts()["UNDER_REPLICATION_STUCK"]


def bookie_rows(stack) -> dict[str, dict[str, Any]]:
    return {r["bookie_id"]: r for r in read_table(stack.settings.lakehouse_root, "bookies").to_pylist()}


def test_db_ledger_storage_bookies_are_learned_and_checked_with_entry_reads(stack):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        learned = {b: r.get("answers_entry_lists") for b, r in bookie_rows(stack).items()}
        if set(learned.values()) == {False}:
            break
        time.sleep(0.5)
    assert learned == dict.fromkeys(stack.cluster.bookie_ids(), False)
    stack.wait_until_matches(ALWAYS + PROBED)
    assert "BOOKIE_UNRESPONSIVE" not in stack.open_alerts()


def fragment_ends(stack, ledger: int, bookie: str) -> list[int]:
    md = stack.cluster.ledger_metadata(ledger)
    segments = [(s.first_entry_id, s.ensemble) for s in md.segments]
    planned = entries_to_read(
        segments, ensemble_size=md.ensemble_size, write_quorum=md.write_quorum, last_entry_id=md.last_entry_id
    )
    return planned[bookie]


def test_entries_lost_on_a_db_ledger_storage_bookie_raise_the_replicas_alert_after_the_rounds(stack):
    ledger = stack.cluster.ledger_ids()[4]
    bookie = stack.cluster.ledger_metadata(ledger).segments[0].ensemble[0]
    lost = fragment_ends(stack, ledger, bookie)
    stack.cluster.lose_entries(bookie, ledger, lost)
    required = {
        k for k, ids in stack.truth()["alerts"].items() if ledger in ids and k.startswith("REPLICAS_")
    }
    assert required, "losing a fragment's ends must leave the ledger short of replicas"
    stack.wait_until_matches(ALWAYS + PROBED, timeout=120)
    assert all(str(ledger) in stack.open_alerts()[kind] for kind in required)
    stack.cluster.bookie_store(bookie).add_entries(ledger, lost)  # repaired: the alert resolves
    stack.wait_until_matches(ALWAYS + PROBED, timeout=120)
    assert not any(str(ledger) in ids for k, ids in stack.open_alerts().items() if k.startswith("REPLICAS_"))


def replicas_alerts_of(stack, ledger: int) -> set[str]:
    return {k for k, ids in stack.open_alerts().items() if k.startswith("REPLICAS_") and str(ledger) in ids}


def test_an_open_ledger_short_below_its_lac_is_alerted_and_resolves_once_repaired_and_closed(stack):
    # Entries 0..11 written: the bookies' last entries carry LAC 10. Entry 0 (the first of its bookies'
    # fragments, which entry reads always read) is lost by its whole write set: below the LAC, NO_REPLICA.
    # Another open ledger loses its last entry 11 on one bookie, above the LAC its bookies carry: it is
    # never judged, so it must raise nothing.
    short, above = (stack.cluster.create_ledger(entries=12, close=False) for _ in range(2))
    md = stack.cluster.ledger_metadata(short)
    holders = [md.segments[0].ensemble[i] for i in write_set(0, md.ensemble_size, md.write_quorum)]
    for bookie in holders:
        stack.cluster.lose_entries(bookie, short, [0])
    last_holder = (
        stack.cluster.ledger_metadata(above)
        .segments[0]
        .ensemble[write_set(11, md.ensemble_size, md.write_quorum)[0]]
    )
    stack.cluster.lose_entries(last_holder, above, [11])
    truth = stack.truth()["alerts"]
    assert short in truth["REPLICAS_NO_REPLICA"]
    assert not any(above in ids for k, ids in truth.items() if k.startswith("REPLICAS_"))
    stack.wait_until_matches(ALWAYS + PROBED, timeout=120)
    assert replicas_alerts_of(stack, short) == {"REPLICAS_NO_REPLICA"}
    assert replicas_alerts_of(stack, above) == set()
    for bookie in holders:
        stack.cluster.bookie_store(bookie).add_entries(short, [0])
    stack.cluster.close_ledger(short)  # a metadata change: the alert is re-probed, healthy, resolved
    stack.wait_until_matches(ALWAYS + PROBED, timeout=120)
    assert replicas_alerts_of(stack, short) == set()


def test_a_transient_silence_of_a_db_ledger_storage_bookie_raises_nothing(stack):
    bookie = stack.cluster.bookie_ids()[0]
    started_ms = int(time.time() * 1000)
    # One request dropped, then answers again: the re-probe rounds find it healthy, however slow the
    # machine (a silence timed by the test's clock could outlast the rounds on a busy one).
    reports_before = len(stack.sink.reports)
    stack.cluster.make_silent(bookie, requests=1)
    deadline = time.monotonic() + 120
    while stack.cluster.requests_dropped(bookie) < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert stack.cluster.requests_dropped(bookie) == 1, "the background check never asked the bookie"
    after_drop = len(stack.sink.reports)

    # Until the dropped request's batch has reported, and a ledger it left failing has been re-probed
    # (healthy), an alert could still come. The batch that sent it is reported at `after_drop` or later
    # (its probe waits out the timeout), or already was: a failing outcome is looked for since before.
    def settled() -> bool:
        since_silence = [r.probe_outcomes for r in stack.sink.reports[reports_before:]]
        if any(outcomes.get(("reprobe", "healthy")) for outcomes in since_silence):
            return True
        if any(outcome == "failing" for outcomes in since_silence for _, outcome in outcomes):
            return False  # its re-probe rounds are still to come
        return sum(1 for r in stack.sink.reports[after_drop:] if r.probe_outcomes) >= 2

    deadline = time.monotonic() + 120
    while not settled():
        assert time.monotonic() < deadline, "a failing ledger was never re-probed healthy"
        time.sleep(0.2)
    stack.wait_until_matches(ALWAYS + PROBED)
    fired = [
        r
        for r in read_table(stack.settings.lakehouse_root, "violations").to_pylist()
        if r["kind"] in PROBED and r["detected_at"].timestamp() * 1000 >= started_ms
    ]
    assert fired == []


def test_a_silent_bookie_is_unresponsive_not_a_data_alert(stack):
    bookie = stack.cluster.bookie_ids()[5]
    stack.cluster.make_silent(bookie)
    stack.wait_until_matches(ALWAYS + PROBED, timeout=120)
    open_alerts = stack.open_alerts()
    assert open_alerts.get("BOOKIE_UNRESPONSIVE") == {bookie}
    assert not {"REPLICAS_NO_REPLICA", "REPLICAS_LESS_THAN_AQ", "REPLICAS_LESS_THAN_WQ"} & set(open_alerts)


def test_every_alert_transition_is_on_the_topic_with_stable_ids_and_no_password(stack):
    kafka = stack.settings.kafka
    records = read_topic(kafka, kafka.alerts_topic, timeout_s=30)
    alerts = [json.loads(r.value) for r in records]
    violations = read_table(stack.settings.lakehouse_root, "violations").to_pylist()
    assert {(a["alert_id"], a["state"]) for a in alerts} == {(v["alert_id"], v["state"]) for v in violations}
    for record, alert in zip(records, alerts, strict=True):
        assert (
            record.key.decode()
            == f"{alert['cluster']}/{(alert['kind'].startswith('BOOKIE') and 'bookie') or 'ledger'}/"
            + (str(alert["ledger_id"]) if alert["ledger_id"] is not None else alert["bookies"][0])
        )
        assert set(alert) == {
            "alert_id",
            "cluster",
            "kind",
            "state",
            "severity",
            "ledger_id",
            "bookies",
            "pulsar_topic",
            "detected_at",
            "detail",
        }
    assert all(PASSWORD not in r.value for r in records)
    for table in stack.settings.lakehouse_root.rglob("*.parquet"):
        assert PASSWORD not in table.read_bytes(), table


def test_a_bookie_formatted_again_has_its_ledgers_probed_at_once_without_the_walk(stack):
    """Last in the module (the bookie stays wiped). The background walk is stopped, so only the cookie's
    replacement can send the ledger to the probes; its entries had their only copies there."""
    walk = stack.sink.probes.scrutiny
    pace, walk.ledgers_per_s = walk.ledgers_per_s, 0.0
    try:
        ledger = next(
            i for i in stack.cluster.ledger_ids() if stack.cluster.ledger_metadata(i).write_quorum == 1
        )
        silent = stack.cluster.bookie_ids()[5]  # left silent by the test before
        bookie = next(b for b in stack.cluster.ledger_metadata(ledger).segments[0].ensemble if b != silent)
        assert not any(
            str(ledger) in ids for k, ids in stack.open_alerts().items() if k.startswith("REPLICAS_")
        )
        stack.cluster.reformat_bookie(bookie)
        required = {k for k, ids in stack.truth()["alerts"].items() if ledger in ids and k in PROBED}
        assert required, "a wiped bookie that held a WQ=1 ledger's only copies must leave it short"
        deadline = time.monotonic() + 120
        while not all(str(ledger) in stack.open_alerts().get(k, set()) for k in required):
            assert stack.query.exception() is None, stack.query.exception()
            assert time.monotonic() < deadline, f"no {required} for ledger {ledger} within 120 s"
            time.sleep(0.5)
        rows = read_table(stack.settings.lakehouse_root, "bookies").to_pylist()
        assert next(r for r in rows if r["bookie_id"] == bookie)["cookie_changed_at"] is not None
        assert sum(r.ledgers_rechecked for r in stack.sink.loss.reports) >= 1
    finally:
        walk.ledgers_per_s = pace
