"""Whole-ledger probes against simulated bookies over real TCP (our client ↔ our server)."""

from __future__ import annotations

import time

import pytest

from connectors.bookie.client import BlockingBookieClient
from connectors.bookie.ledger_probe import LedgerProbeTarget, bound_by_lac, probe_ledgers
from connectors.bookie.server import BookieServer, InMemoryEntryStore
from core.domain.rules.replicas import ReplicasResult
from core.domain.striping import entries_striped_to_bookie

pytestmark = pytest.mark.integration

ENSEMBLE = ("b0", "b1", "b2")
TARGET = LedgerProbeTarget(
    ledger_id=42,
    ensemble_size=3,
    write_quorum=2,
    ack_quorum=2,
    state="CLOSED",
    last_entry_id=29,
    segments=((0, ENSEMBLE),),
)


@pytest.fixture
def bookies():
    servers = {}
    for index, bookie in enumerate(ENSEMBLE):
        store = InMemoryEntryStore()
        store.add_entries(42, list(entries_striped_to_bookie(index, 0, 29, 3, 2)))
        servers[bookie] = BookieServer(store)
        servers[bookie].start_background()
    yield servers
    for server in servers.values():
        server.stop_background()


@pytest.fixture
def client():
    with BlockingBookieClient(timeout=0.5) as blocking:
        yield blocking


def addresses(servers):
    return {bookie: server.address for bookie, server in servers.items()}


def test_a_healthy_ledger_is_ok(bookies, client):
    [outcome] = probe_ledgers(client, [TARGET], addresses(bookies), timeout=0.5)
    assert outcome.verdict.result is ReplicasResult.OK
    assert not outcome.failing
    assert outcome.answers == {"b0": "entry_list", "b1": "entry_list", "b2": "entry_list"}


def test_lost_entries_and_a_lost_ledger_are_classified(bookies, client):
    bookies["b1"].store.drop_entries(42, [0, 1])  # entries 0 and 1 now have one copy: fewer than AQ=2
    [outcome] = probe_ledgers(client, [TARGET], addresses(bookies))
    assert outcome.verdict.result is ReplicasResult.LESS_THAN_AQ
    assert outcome.verdict.worst_entries == (0, 1)
    for server in bookies.values():
        server.store.drop_ledger(42)
    [outcome] = probe_ledgers(client, [TARGET], addresses(bookies))
    assert outcome.verdict.result is ReplicasResult.NO_REPLICA


def test_a_silent_bookie_is_unresponsive_not_missing_data(bookies, client):
    bookies["b2"].set_faults(silent=True)
    [outcome] = probe_ledgers(client, [TARGET], addresses(bookies), timeout=0.3)
    assert outcome.unresponsive == ("b2",)
    assert outcome.verdict.result is ReplicasResult.OK  # unknown counts neither as holding nor as missing
    assert outcome.verdict.unknown_bookies == ("b2",)
    assert outcome.failing  # still worth a re-probe


def test_an_unregistered_bookie_is_unresolved_and_open_ledgers_are_skipped(bookies, client):
    known = {k: v for k, v in addresses(bookies).items() if k != "b0"}
    open_ledger = LedgerProbeTarget(7, 3, 2, 2, "OPEN", -1, ((0, ENSEMBLE),))
    closed, skipped = probe_ledgers(client, [TARGET, open_ledger], known)
    assert closed.unresolved == ("b0",)
    # Asked for its LAC, no bookie holds the open ledger: nothing was acknowledged, nothing to judge.
    assert skipped.verdict.result is ReplicasResult.SKIPPED and not skipped.failing
    assert skipped.answers == {"b1": "no_ledger", "b2": "no_ledger"}


@pytest.fixture
def db_bookie(bookies):
    """b2 as a DbLedgerStorage bookie: the same entries, no answer to the entry-list request."""
    old = bookies["b2"]
    old.stop_background(keep_port=False)
    bookies["b2"] = BookieServer(old.store, answers_entry_lists=False)
    bookies["b2"].start_background()
    return bookies


def test_a_db_ledger_storage_bookie_is_silent_to_the_entry_list_and_answers_entry_reads(db_bookie, client):
    [listed] = probe_ledgers(client, [TARGET], addresses(db_bookie), timeout=0.3)
    assert listed.unresponsive == ("b2",) and listed.answers["b2"] == "timeout"
    [read] = probe_ledgers(client, [TARGET], addresses(db_bookie), timeout=0.3, entry_reads_on={"b2"})
    assert read.verdict.result is ReplicasResult.OK and not read.failing
    assert read.answers == {"b0": "entry_list", "b1": "entry_list", "b2": "entry_reads"}


def test_entry_reads_find_a_fragment_that_lost_its_first_and_last_entries(db_bookie, client):
    # b2 (position 2, E=3, WQ=2) holds 1, 2, 4, 5, ..., 28, 29: its fragment's ends are 1 and 29.
    db_bookie["b2"].store.drop_entries(42, [1, 29])
    [outcome] = probe_ledgers(client, [TARGET], addresses(db_bookie), timeout=0.3, entry_reads_on={"b2"})
    assert outcome.verdict.result is ReplicasResult.LESS_THAN_AQ
    assert outcome.verdict.worst_entries == (1, 29) and outcome.unresponsive == ()
    db_bookie["b2"].store.drop_ledger(42)
    [gone] = probe_ledgers(client, [TARGET], addresses(db_bookie), timeout=0.3, entry_reads_on={"b2"})
    assert gone.verdict.result is ReplicasResult.LESS_THAN_AQ
    assert gone.verdict.worst_entry_count == 20  # every entry striped to b2


def test_entry_reads_of_a_silent_bookie_are_unknown_not_missing(db_bookie, client):
    db_bookie["b2"].set_faults(silent=True)
    [outcome] = probe_ledgers(client, [TARGET], addresses(db_bookie), timeout=0.3, entry_reads_on={"b2"})
    assert outcome.unresponsive == ("b2",) and outcome.answers["b2"] == "timeout"
    assert outcome.verdict.result is ReplicasResult.OK and outcome.verdict.unknown_bookies == ("b2",)


def test_a_wave_learns_which_bookies_answer_entry_lists_and_reads_the_others_at_once(db_bookie, client):
    from connectors.bookie.ledger_probe import probe_and_learn

    db_bookie["b2"].store.drop_entries(42, [1, 29])
    [outcome], learned = probe_and_learn(
        client, [TARGET], addresses(db_bookie), learn={"b0", "b1", "b2"}, timeout=0.3
    )
    assert learned == {"b0": True, "b1": True, "b2": False}
    assert outcome.answers["b2"] == "entry_reads" and outcome.unresponsive == ()
    assert outcome.verdict.worst_entries == (1, 29)


def test_a_bookie_silent_to_reads_too_is_not_taken_for_db_ledger_storage(bookies, client):
    from connectors.bookie.ledger_probe import probe_and_learn

    bookies["b2"].set_faults(silent=True)
    [outcome], learned = probe_and_learn(client, [TARGET], addresses(bookies), learn={"b2"}, timeout=0.3)
    assert learned == {} and outcome.unresponsive == ("b2",)


def test_entry_reads_to_one_bookie_are_paced(bookies):
    from connectors.bookie.client import ProbeRequest

    one = [ProbeRequest(bookies["b0"].address, 42, entry_id) for entry_id in range(10)]
    other = [ProbeRequest(bookies["b1"].address, 42, entry_id) for entry_id in range(10)]
    with BlockingBookieClient(timeout=2.0, max_reads_per_s_per_bookie=20.0) as paced:
        started = time.monotonic()
        results = paced.probe_many(one + other, concurrency=20)
        elapsed = time.monotonic() - started
    assert all(r.conclusive for r in results)
    assert elapsed >= 9 / 20.0  # ten reads to each bookie, 50 ms apart


OPEN_ID = 43


@pytest.fixture
def open_ledger(bookies):
    """Ledger 43, OPEN, entries 0..29 written to every write set: the bookies' last entries carry LAC 28."""
    for index, bookie in enumerate(ENSEMBLE):
        bookies[bookie].store.add_entries(OPEN_ID, list(entries_striped_to_bookie(index, 0, 29, 3, 2)))
    return LedgerProbeTarget(OPEN_ID, 3, 2, 2, "OPEN", -1, ((0, ENSEMBLE),))


def test_an_open_ledger_is_checked_up_to_the_highest_lac_its_bookies_answer(bookies, client, open_ledger):
    # Entries 0..29: entry 29 is on b2 and b0 (E=3, WQ=2), whose last entry 29 carries LAC 28; b1's last
    # entry is 28, carrying 27. The ledger's LAC is the highest answered.
    bounded, answered = bound_by_lac(client, [open_ledger], addresses(bookies), timeout=0.5)
    assert bounded[0].last_add_confirmed == 28
    assert {b: r.kind for b, r in answered[0].items()} == dict.fromkeys(ENSEMBLE, "last_confirmed")
    [outcome] = probe_ledgers(client, [open_ledger], addresses(bookies), timeout=0.5)
    assert outcome.verdict.result is ReplicasResult.OK and not outcome.failing


def test_an_open_ledger_that_lost_entries_below_its_lac_on_a_whole_write_set_has_no_replica(
    bookies, client, open_ledger
):
    # Entry 4's write set is positions 1 and 2 (b1, b2): both lose it. Entry 29 (above the LAC 28) is lost
    # by b0 too, and 28 (the LAC itself) is kept: only the entries up to the LAC are judged.
    bookies["b1"].store.drop_entries(OPEN_ID, [4])
    bookies["b2"].store.drop_entries(OPEN_ID, [4])
    bookies["b0"].store.drop_entries(OPEN_ID, [29])
    [outcome] = probe_ledgers(client, [open_ledger], addresses(bookies), timeout=0.5)
    assert outcome.verdict.result is ReplicasResult.NO_REPLICA
    assert outcome.verdict.worst_entries == (4,) and outcome.failing
    # Entries above the LAC are never reported, even when no bookie holds them.
    bookies["b2"].store.drop_entries(OPEN_ID, [29])
    bookies["b1"].store.add_entries(OPEN_ID, [4])
    [above] = probe_ledgers(client, [open_ledger], addresses(bookies), timeout=0.5)
    assert above.verdict.result is ReplicasResult.LESS_THAN_AQ and above.verdict.worst_entries == (4,)


def test_an_open_ledger_whose_lac_nobody_answers_is_unknown_not_missing(bookies, client, open_ledger):
    for server in bookies.values():
        server.set_faults(silent=True)
    [outcome] = probe_ledgers(client, [open_ledger], addresses(bookies), timeout=0.3)
    assert outcome.verdict.result is ReplicasResult.SKIPPED
    assert outcome.unresponsive == ENSEMBLE and outcome.failing
    assert set(outcome.answers.values()) == {"timeout"}


def test_an_open_ledger_in_recovery_is_not_asked(bookies, client, open_ledger):
    from dataclasses import replace

    before = sum(server.stats.requests_received for server in bookies.values())
    [outcome] = probe_ledgers(client, [replace(open_ledger, state="IN_RECOVERY")], addresses(bookies))
    assert outcome.verdict.result is ReplicasResult.SKIPPED and outcome.answers == {}
    assert sum(server.stats.requests_received for server in bookies.values()) == before


def test_an_open_ledger_on_a_db_ledger_storage_bookie_is_read_up_to_its_lac(db_bookie, client, open_ledger):
    from connectors.bookie.ledger_probe import probe_and_learn

    # b2 (position 2) holds 1, 2, 4, 5, ..., 28, 29: its fragment up to the LAC 28 ends at 28.
    db_bookie["b2"].store.drop_entries(OPEN_ID, [1, 28])
    [outcome], learned = probe_and_learn(
        client, [open_ledger], addresses(db_bookie), learn={"b0", "b1", "b2"}, timeout=0.3
    )
    assert learned["b2"] is False and outcome.answers["b2"] == "entry_reads"
    assert outcome.verdict.result is ReplicasResult.LESS_THAN_AQ and outcome.verdict.worst_entries == (1, 28)
