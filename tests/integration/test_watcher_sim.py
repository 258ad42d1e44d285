"""``bkaudit watch`` against the cluster simulator: every fault kind the simulator has yields its events.

The simulator (:mod:`bkaudit.sim.cluster`) writes exactly the znodes BookKeeper and Pulsar write; the watcher
runs on its tree and the topic is read back. Each step names the fault and the events a correct watcher must
publish for it. Faults that only change how bookies answer on the wire (silent, slow, ENOLEDGER, error
status, lost entries) touch no znode: the watcher must publish nothing for them. At the end, replaying the
topic reproduces the simulator's ZooKeeper state, and no record carries the ledgers' password.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from bkaudit.cli.live import DEV_VARIABLES
from bkaudit.sim.cluster import CORRUPTIONS, SimulatedCluster
from bkaudit.sim.scenario import ClusterSpec, build_cluster
from bkaudit.sim.truth import ground_truth
from core.domain.registration import decode_bookie_service_info
from core.pb import change_events_pb2 as pb
from tests.integration.test_watcher import (
    ClusterTree,
    TopicReader,
    assert_replay_matches,
    evs_of,
    payloads,
    quiesce,
    running_watcher,
    watcher_settings,
)

pytestmark = pytest.mark.integration

SIM_PASSWORD = b"sim-pw-3b9e-DO-NOT-LEAK"


@pytest.fixture
def sim(bk_services: Any, zk_chroot: str) -> Iterator[SimulatedCluster]:
    cluster = SimulatedCluster(
        bk_services.zookeeper_hosts(zk_chroot),
        racks=3,
        password=SIM_PASSWORD,
        session_timeout_s=10.0,
        bookie_session_timeout_s=1.5,
        seed=11,
    ).init()
    try:
        yield cluster
    finally:
        cluster.close()


def statuses(reader: TopicReader, bookie_id: str) -> list[str]:
    return [
        pb.BookieStatus.Status.Name(s.status) for s in payloads(reader, "bookie_status", bookie_id=bookie_id)
    ]


def last_status(reader: TopicReader, bookie_id: str) -> str:
    found = statuses(reader, bookie_id)
    return found[-1] if found else ""


def ledger_states(reader: TopicReader, ledger_id: int) -> list[str]:
    return [
        pb.LedgerMetadata.State.Name(u.metadata.state)
        for u in payloads(reader, "ledger_upserted", ledger_id=ledger_id)
    ]


def rack_of(reader: TopicReader, bookie_id: str) -> str | None:
    maps = evs_of(reader.events(), "rack_map")
    if not maps:
        return None
    for entry in maps[-1].rack_map.entries:
        if entry.bookie_id == bookie_id:
            return entry.rack
    return None


def test_every_simulator_fault_yields_its_events(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, zk_client: Any, sim: SimulatedCluster
) -> None:
    bookies = [sim.add_bookie() for _ in range(4)]
    legacy = sim.add_bookie(legacy_id=True)
    bookies.append(legacy)
    closed = sim.create_ledger(entries=5)
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot, rack_map_znode=sim.rack_map_path)
    with running_watcher(settings, SIM_PASSWORD) as (watcher, reader):
        assert watcher.wait_for_snapshots(1, 30)
        reader.wait_for(lambda evs: len(evs_of(evs, "snapshot_end")) == len(reader.partitions))

        # START snapshot: the cluster as the simulator built it.
        for bookie in bookies:
            assert last_status(reader, bookie) == "WRITABLE"
            status = payloads(reader, "bookie_status", bookie_id=bookie)[-1]
            assert status.has_cookie and status.rpc_address == sim.bookie_address(bookie)
            expected = decode_bookie_service_info(bookie, zk_client.get(f"/ledgers/available/{bookie}")[0])
            assert [e.port for e in status.endpoints] == [e.port for e in expected.endpoints]
        assert ledger_states(reader, closed)[-1] == "CLOSED"
        upsert = payloads(reader, "ledger_upserted", ledger_id=closed)[-1]
        assert upsert.metadata.pulsar_topic.startswith("persistent://") and upsert.metadata.has_password
        assert {rack_of(reader, b) for b in bookies} <= set(sim.rack_names)
        assert payloads(reader, "recovery_delay")[-1].seconds == 0

        # add_bookie: a new writable bookie with a cookie, and Pulsar's rack map grows.
        added = sim.add_bookie()
        reader.wait_for(
            lambda evs: last_status(reader, added) == "WRITABLE" and rack_of(reader, added) is not None
        )

        # create_ledger (open, entries), add_entries, ensemble_change, close_ledger.
        open_ledger = sim.create_ledger(entries=3, close=False, name="open")
        # Wait for the open version: the watcher reads after each notification, so back-to-back writes
        # may coalesce into the latest one (the last version always arrives).
        reader.wait_for(lambda evs: "OPEN" in ledger_states(reader, open_ledger))
        sim.add_entries("open", 2)
        replaced = sim.ensemble_change("open", sim.ledger_metadata("open").segments[-1].ensemble[0])
        sim.close_ledger("open")
        reader.wait_for(lambda evs: "CLOSED" in ledger_states(reader, open_ledger))
        final = payloads(reader, "ledger_upserted", ledger_id=open_ledger)[-1]
        assert ledger_states(reader, open_ledger)[0] == "OPEN"
        assert len(final.metadata.segments) == 2 and replaced in final.metadata.segments[1].ensemble
        assert final.metadata.last_entry_id == 4

        # recover: IN_RECOVERY, then CLOSED. The two writes come back to back; the watcher reads after each
        # notification and may find the later one already there (versions coalesce, the last one always
        # arrives), so IN_RECOVERY is checked on a recovery that stops there.
        recovering = sim.create_ledger(entries=2, close=False)
        sim.recover(recovering)
        reader.wait_for(lambda evs: ledger_states(reader, recovering)[-1:] == ["CLOSED"])
        stuck = sim.create_ledger(entries=2, close=False)
        sim.recover(stuck, complete=False)
        reader.wait_for(lambda evs: ledger_states(reader, stuck)[-1:] == ["IN_RECOVERY"])

        # set_readonly and back: READ_ONLY is not missing (the simulator creates the new node first).
        sim.set_readonly(bookies[0])
        reader.wait_for(lambda evs: last_status(reader, bookies[0]) == "READ_ONLY")
        sim.set_readonly(bookies[0], False)
        reader.wait_for(lambda evs: last_status(reader, bookies[0]) == "WRITABLE")
        assert "GONE" not in statuses(reader, bookies[0])

        # kill_bookie (graceful) and restart_bookie.
        sim.kill_bookie(bookies[1])
        reader.wait_for(lambda evs: last_status(reader, bookies[1]) == "GONE")
        assert payloads(reader, "bookie_status", bookie_id=bookies[1])[-1].has_cookie  # known, not registered
        sim.restart_bookie(bookies[1])
        reader.wait_for(lambda evs: last_status(reader, bookies[1]) == "WRITABLE")

        # kill_bookie (hard): the registration lingers until the session expires, then GONE.
        sim.kill_bookie(bookies[2], hard=True)
        reader.wait_for(lambda evs: last_status(reader, bookies[2]) == "GONE", timeout_s=20)

        # flap_bookie: GONE, then WRITABLE again.
        sim.flap_bookie(legacy, 0.5)
        reader.wait_for(lambda evs: statuses(reader, legacy)[-2:] == ["GONE", "WRITABLE"], timeout_s=15)

        # move_bookie_rack: the rack map changes.
        target_rack = next(r for r in sim.rack_names if r != rack_of(reader, bookies[3]))
        sim.move_bookie_rack(bookies[3], target_rack)
        reader.wait_for(lambda evs: rack_of(reader, bookies[3]) == target_rack)

        # corrupt_ledger_znode, every kind: undecodable, with a reason and the size, never the bytes.
        corrupted = {}
        for how in CORRUPTIONS:
            ledger_id = sim.create_ledger(entries=1)
            sim.corrupt_ledger_znode(ledger_id, how)
            corrupted[ledger_id] = how
        reader.wait_for(
            lambda evs: {p.ledger_id for p in payloads(reader, "ledger_undecodable")} == set(corrupted)
        )
        for bad in payloads(reader, "ledger_undecodable"):
            assert bad.reason and bad.znode.data_length > 0, corrupted[bad.ledger_id]

        # mark_underreplicated (then extended) and clear_underreplicated.
        sim.mark_underreplicated(closed, [bookies[2]])
        sim.mark_underreplicated(closed, [bookies[1]])
        reader.wait_for(
            lambda evs: (
                [list(m.replicas) for m in payloads(reader, "under_replication_mark", ledger_id=closed)][-1:]
                == [[bookies[2], bookies[1]]]
            )
        )
        mark = payloads(reader, "under_replication_mark", ledger_id=closed)[-1]
        assert mark.state == pb.UnderReplicationMark.SET and mark.HasField("mark_ctime_ms")
        sim.clear_underreplicated(closed)
        reader.wait_for(
            lambda evs: (
                payloads(reader, "under_replication_mark", ledger_id=closed)[-1].state
                == pb.UnderReplicationMark.CLEARED
            )
        )

        # set_lost_bookie_recovery_delay.
        sim.set_lost_bookie_recovery_delay(45)
        reader.wait_for(lambda evs: payloads(reader, "recovery_delay")[-1].seconds == 45)

        # place_ledger_badly: a closed ledger whose ensemble sits in one rack (the job judges placement).
        bad_placement = sim.place_ledger_badly(entries=2)
        reader.wait_for(lambda evs: "CLOSED" in ledger_states(reader, bad_placement))

        # delete_ledger.
        sim.delete_ledger(recovering)
        reader.wait_for(lambda evs: bool(payloads(reader, "ledger_deleted", ledger_id=recovering)))

        # Wire-protocol faults touch no znode: nothing is published for them.
        quiesce(watcher, reader)
        published = len([r for r in reader.records if not r.event.HasField("heartbeat")])
        sim.make_silent(bookies[3])
        sim.make_slow(bookies[3], 0.01)
        sim.answer_enoledger(bookies[0], closed)
        sim.fail_with_status(bookies[4], 101)
        sim.lose_entries(bookies[0], open_ledger, [0])
        sim.lose_ledger(bookies[0], open_ledger)
        sim.heal_bookie(bookies[3])
        quiesce(watcher, reader)
        assert len([r for r in reader.records if not r.event.HasField("heartbeat")]) == published

        # The whole stream replays to the simulator's ZooKeeper state.
        assert_replay_matches(reader, ClusterTree(zk_client, sim.root, sim.manager), sim.instance_id or "")


def test_simulated_faults_in_fallback_mode(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, zk_client: Any, sim: SimulatedCluster
) -> None:
    bookies = [sim.add_bookie() for _ in range(5)]
    settings = watcher_settings(
        bk_services, kafka_settings, zk_chroot, rack_map_znode=sim.rack_map_path, watch_mode="fallback"
    )
    with running_watcher(settings, SIM_PASSWORD) as (watcher, reader):
        assert watcher.wait_for_snapshots(1, 30)
        ledger = sim.create_ledger(entries=3)
        doomed = sim.create_ledger(entries=1)
        sim.corrupt_ledger_znode(doomed, "garbage")
        sim.set_readonly(bookies[0])
        sim.kill_bookie(bookies[1])
        sim.move_bookie_rack(bookies[2], sim.rack_names[0])
        sim.mark_underreplicated(ledger, [bookies[1]])
        sim.set_lost_bookie_recovery_delay(5)
        reader.wait_for(lambda evs: bool(payloads(reader, "ledger_undecodable", ledger_id=doomed)))
        reader.wait_for(
            lambda evs: (
                payloads(reader, "recovery_delay")[-1:] != []
                and payloads(reader, "recovery_delay")[-1].seconds == 5
            )
        )
        reader.wait_for(lambda evs: last_status(reader, bookies[0]) == "READ_ONLY")
        reader.wait_for(lambda evs: last_status(reader, bookies[1]) == "GONE")
        reader.wait_for(lambda evs: rack_of(reader, bookies[2]) == sim.rack_names[0])
        reader.wait_for(lambda evs: "CLOSED" in ledger_states(reader, ledger))
        sim.delete_ledger(doomed)
        reader.wait_for(lambda evs: bool(payloads(reader, "ledger_deleted", ledger_id=doomed)))
        quiesce(watcher, reader, 1.0)
        assert_replay_matches(reader, ClusterTree(zk_client, sim.root, sim.manager), sim.instance_id or "")


def probe_answers(reader: TopicReader, bookie_id: str) -> list[bool]:
    return [p.answered for p in payloads(reader, "bookie_probe", bookie_id=bookie_id)]


def test_a_bookie_whose_registration_vanished_is_probed_and_its_answer_published(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, sim: SimulatedCluster
) -> None:
    """A session expiry (the bookie serves on) is published as an answering probe, a dead bookie as a silent
    one, a bookie that answers and is then killed as a change; a bookie that registered is not probed."""
    expired, killed, steady = (sim.add_bookie() for _ in range(3))
    settings = watcher_settings(bk_services, kafka_settings, zk_chroot, bookie_probe_interval_s=0.5)
    with running_watcher(settings, SIM_PASSWORD) as (watcher, reader):
        assert watcher.wait_for_snapshots(1, 30)
        # Missing long enough for its probe to land: a bookie back first is not probed (a busy host once
        # let the simulator register it again before the probe answered).
        sim.reregister_delay_s = 3.0
        sim.expire_bookie_session(expired)
        sim.kill_bookie(killed)
        reader.wait_for(lambda evs: probe_answers(reader, expired)[:1] == [True])
        reader.wait_for(lambda evs: probe_answers(reader, killed) == [False])
        probe = payloads(reader, "bookie_probe", bookie_id=killed)[0]
        assert probe.address == sim.bookie_address(killed) and probe.detail
        # The partition of the membership events: the lane sees the probe after the status it follows.
        events = [e for e in reader.events() if e.entity_key == f"bookie/{killed}"]
        assert [e.WhichOneof("payload") for e in events][-2:] == ["bookie_status", "bookie_probe"]

        reader.wait_for(lambda evs: last_status(reader, expired) == "WRITABLE")  # it registered again
        sim.kill_bookie(expired)
        reader.wait_for(lambda evs: probe_answers(reader, expired) == [True, False])
        assert probe_answers(reader, steady) == []


def test_watch_dev_after_sim_up_places_the_bookies_in_the_simulators_racks(
    bk_services: Any, kafka_settings: Any, zk_chroot: str, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented sequence: `bkaudit sim up --bookies 6 --racks 3 --ledgers 20` on the embedded cluster,
    then `bkaudit watch --dev`. The watcher must publish the simulator's rack map (Pulsar's `/bookies`):
    without it every bookie is in the default rack and all 20 ledgers fail placement."""
    sim = build_cluster(
        ClusterSpec(bookies=6, racks=3, ledgers=20, seed=5), bk_services.zookeeper_hosts(zk_chroot)
    )
    try:
        monkeypatch.setenv("BKAUDIT_DEV__STATE_DIR", str(bk_services.state_dir))  # `dev up`: the harness's
        for variable in DEV_VARIABLES.values():  # what --dev sets is undone after the test
            monkeypatch.setenv(variable, "")
            monkeypatch.delenv(variable)
        result = cli(
            "watch",
            "--dev",
            "--zookeeper",  # the test's chroot stands for the dev ZooKeeper's root
            bk_services.zookeeper_hosts(zk_chroot),
            "--topic",
            kafka_settings.changes_topic,
            "--partitions",
            "1",
            "--exit-after-snapshot",
        )
        assert result.exit_code == 0, result.stderr
        reader = TopicReader(kafka_settings, kafka_settings.changes_topic, SIM_PASSWORD)
        try:
            reader.drain()
            maps = evs_of(reader.events(), "rack_map")
        finally:
            reader.close()
        snapshot = sim.snapshot()
        published = {e.bookie_id: e.rack for e in maps[-1].rack_map.entries} if maps else {}
        # The job places each ledger with the published racks: as the simulator placed them, rack-aware.
        seen = dataclasses.replace(
            snapshot,
            bookies={b: dataclasses.replace(s, rack=published.get(b)) for b, s in snapshot.bookies.items()},
        )
        assert len(snapshot.ledgers) == 20
        assert ground_truth(seen)["alerts"]["PLACEMENT_NOT_ADHERING"] == []
        assert maps[-1].rack_map.source == "zookeeper:/bookies"
        assert published == {bookie_id: bookie.rack for bookie_id, bookie in snapshot.bookies.items()}
    finally:
        sim.close()
