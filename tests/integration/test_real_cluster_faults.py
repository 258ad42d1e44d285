"""Faults on a real BookKeeper 4.17 cluster: bkaudit's alerts against the marks of BookKeeper's own Auditor.

One cluster per module (4 bookie processes in 2 racks, ``zkTimeout`` 4 s, ~40 ledgers written by
BookKeeper's Java client, some left open), BookKeeper's ``AutoRecoveryMain`` (``lostBookieRecoveryDelay=0``,
every ledger's replication lock held by the test so its ReplicationWorker repairs nothing and the marks
stay) and bkaudit's ``watch`` and ``stream`` as subprocesses beside it (:mod:`tests.realstack`). Each test
breaks bookies, compares the ledgers bkaudit alerts with the ledgers the Auditor marks and with the
metadata, then brings the bookies back and waits until bkaudit resolved its alerts.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkaudit.testing.harness import ServiceHarness
from connectors.delta.queries import Lakehouse
from core.domain.isolation import ISOLATION_METADATA_KEY, IsolationGroups, encode_isolation_config
from core.domain.managed_ledger import ManagedLedgerInfo, TopicLedger, encode_managed_ledger_info
from core.domain.metadata import LedgerMetadata
from tests.chaos.stack import wait_for
from tests.realstack import (
    LEDGER_KINDS,
    Loss,
    RealStack,
    read_ledgers,
    real_stack,
    registered,
    registration_session,
)

pytestmark = pytest.mark.integration

#: AUDITOR_LAGGING after this long unmarked. The real Auditor (recovery delay 0) marks within a second or
#: two, but a mark reaches the loss owner through the timers query (a 5 s trigger and three Kafka hops):
#: seconds to tens of seconds on a loaded machine.
LAGGING_GRACE_S = 30.0


@pytest.fixture(scope="module")
def stack(bk_services: ServiceHarness, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealStack]:
    cluster = bk_services.real_bookkeeper(bookies=4, racks=2, bookie_conf={"zkTimeout": 4000})
    try:
        written = cluster.write_ledgers(40, open_ledgers=4)
        ledger_ids = set(written["closed"]) | set(written["open"])
        root = Path(tmp_path_factory.mktemp("real-faults"))
        # The ReplicationWorker skips locked marks: they stay to be compared.
        # Pulsar's graces short: the managed-ledger test below lists and unlists in seconds.
        pulsar = {"BKAUDIT_PULSAR__MISSING_GRACE_S": "1", "BKAUDIT_PULSAR__ORPHAN_GRACE_S": "0"}
        lagging = {"AUDITOR_LAGGING_GRACE_S": str(LAGGING_GRACE_S)}
        with real_stack(
            bk_services, cluster, root, lock_ledgers=ledger_ids, job_env=pulsar, stream_settings=lagging
        ) as running:
            cluster.start_auditor(check_interval_s=3600)
            wait_for("the Auditor's start-up checks", running.auditor_idle, 120)
            running.wait_ingested(ledger_ids)
            running.marks.clear()
            yield running
    finally:
        cluster.stop()


def _lost_entries(md: LedgerMetadata, lost: set[str]) -> bool:
    """Whether some entry has its whole write set on ``lost`` bookies (for a ledger that is not closed,
    some write-set window of its last segment), computed here from the ensembles alone."""
    segments = list(md.segments)
    for number, segment in enumerate(segments):
        ensemble, size, quorum = segment.ensemble, md.ensemble_size, md.write_quorum
        if number + 1 < len(segments):
            entries = range(segment.first_entry_id, segments[number + 1].first_entry_id)
        elif md.state.value == "CLOSED":
            entries = range(segment.first_entry_id, md.last_entry_id + 1)
        else:
            entries = range(segment.first_entry_id, segment.first_entry_id + size)  # every window
        for entry in entries:
            if all(ensemble[(entry + k) % size] in lost for k in range(quorum)):
                return True
    return False


def _auditor_diff(stack: RealStack) -> list[tuple[str, int]]:
    with Lakehouse(stack.run.lakehouse) as tables:
        return [(r["diff"], r["ledger_id"]) for r in tables.auditor_diff(grace_s=0).to_pylist()]


def _assert_agree(stack: RealStack, loss: Loss) -> None:
    where = f"Auditor log {stack.cluster.auditor_log_file}; watcher log {stack.watcher.log}"
    assert loss.expected, "the victims hold ledgers"
    assert loss.marked == loss.expected, f"the Auditor's marks differ from the metadata; {where}"
    assert loss.alerted == loss.marked, (
        f"missed by bkaudit {sorted(loss.marked - loss.alerted)}, "
        f"not marked by the Auditor {sorted(loss.alerted - loss.marked)}; {where}"
    )
    # One open ledger alert per ledger (two bookies' sessions may expire apart: a ledger first
    # LEDGER_UNDER_REPLICATED can then become LEDGER_UNRECOVERABLE, a new alert, the first one resolved).
    open_now = Counter(int(a.alert["ledger_id"]) for a in stack.alerts.open_now(LEDGER_KINDS).values())
    assert set(open_now) == loss.marked and set(open_now.values()) == {1}
    lost = Counter(a.key.rsplit("/", 1)[1] for a in stack.alerts.firing(("BOOKIE_LOST",), loss.at))
    assert lost == Counter(loss.victims), "one BOOKIE_LOST per lost bookie"


def test_kill_9_of_a_bookie_alerts_exactly_the_ledgers_the_auditor_marks(stack: RealStack) -> None:
    loss = stack.lose([2])
    try:
        _assert_agree(stack, loss)
        # One bookie of a write quorum of 2: every entry keeps a copy.
        assert {a.kind for a in loss.alerts.values()} == {"LEDGER_UNDER_REPLICATED"}
        open_ids = {
            i for i, md in read_ledgers(stack.marks.client, loss.expected).items() if not md.is_closed
        }
        assert open_ids, "open ledgers on the victim are marked and alerted too"
        # `bkaudit query auditor-diff` agrees: once the marks reached the tables, no ledger at risk is
        # unmarked and no mark is on a ledger bkaudit finds healthy.
        wait_for("auditor-diff to find the Auditor's marks", lambda: _auditor_diff(stack) == [], 60)
        # The Auditor marked what bkaudit alerts: AUDITOR_LAGGING is not open once the marks reached
        # bkaudit. (It may have fired before: a mark reaches the loss owner through the timers loop, which
        # took more than 30 s in a CI run; see docs/design.md.)
        wait_for("no AUDITOR_LAGGING open", lambda: not stack.alerts.open_now(("AUDITOR_LAGGING",)), 60)
    finally:
        stack.restore([2], loss)
    assert not stack.alerts.open_ledgers()


def test_kill_9_of_two_bookies_of_a_rack_alerts_unrecoverable_where_no_copy_survives(
    stack: RealStack,
) -> None:
    victims = [2, 4]  # the whole of rack 2
    loss = stack.lose(victims)
    try:
        _assert_agree(stack, loss)
        ledgers = read_ledgers(stack.marks.client, loss.expected)
        gone = {i for i, md in ledgers.items() if _lost_entries(md, set(loss.victims))}
        assert gone, "some write sets were all on rack 2"
        open_kinds = stack.alerts.open_ledgers()
        unrecoverable = {i for i, kind in open_kinds.items() if kind == "LEDGER_UNRECOVERABLE"}
        assert unrecoverable == gone
    finally:
        stack.restore(victims, loss)


def test_a_stopped_bookie_is_lost_once_its_session_expires_and_returns_on_sigcont(
    stack: RealStack,
) -> None:
    bookie = stack.cluster.bookie(3)
    pid = bookie.pid()
    # SIGSTOP: the JVM sends no ZooKeeper pings, its session expires after zkTimeout and its registration
    # goes, exactly as after a crash: both sides see a lost bookie.
    loss = stack.lose([3], pause=True)
    try:
        assert loss.unregistered_at is not None
        _assert_agree(stack, loss)
    finally:
        # SIGCONT: the bookie learns its session expired and registers again, in the same process.
        stack.restore([3], loss, resume=True)
    assert bookie.pid() == pid
    assert registered(stack.marks.client, bookie.bookie_id)


def test_a_pause_shorter_than_the_session_timeout_raises_nothing(stack: RealStack) -> None:
    bookie = stack.cluster.bookie(1)
    session = registration_session(stack.marks.client, bookie.bookie_id)
    assert session is not None
    started = time.time()
    bookie.pause()
    try:
        # Well inside zkTimeout (4 s): the client pings every third of it, so the server may already have
        # waited 1.3 s when the pause begins; 1.5 s left a busy host (load 8, a whole suite beside it) too
        # little to resume the JVM and ping, and the session expired after the resume.
        time.sleep(0.5)
    finally:
        bookie.resume()
    # What the test is about: the session, and the registration, lived through the pause.
    assert registration_session(stack.marks.client, bookie.bookie_id) == session
    stack.wait_read_to_end()
    time.sleep(2)
    # About this bookie only: the stopped bookie of the test before may still be settling.
    about_it = [
        a
        for a in stack.alerts.firing((*LEDGER_KINDS, "BOOKIE_LOST"), started)
        if bookie.bookie_id in (a.alert["bookies"] or [])
    ]
    assert not about_it, [a.alert for a in about_it]
    marked = {m.ledger_id: m.replicas for m in stack.marks.since(started).values()}
    assert not {i for i, replicas in marked.items() if bookie.bookie_id in replicas}, marked


def test_ledgers_outside_their_isolation_group_are_flagged_and_resolve_when_the_group_allows_them(
    stack: RealStack,
) -> None:
    """BookKeeper's Java client writes ledgers carrying Pulsar's isolation config (primary group
    ``isolated``) but places them rack-aware over every bookie. With bookies 3 and 4 in another affinity
    group of ``/bookies``, each ledger with one of them in its ensemble is PLACEMENT_ISOLATION_VIOLATED;
    once they join ``isolated``, each alert resolves under the id it fired with."""
    value = encode_isolation_config(IsolationGroups(("isolated",), ()))
    written = stack.cluster.write_ledgers(6, ensemble=3, custom=(ISOLATION_METADATA_KEY, value))
    ids = set(written["closed"])
    stack.known_ledgers |= ids  # the managed-ledger test below lists every known ledger
    stack.wait_ingested(ids)
    others = {stack.cluster.bookie(i).bookie_id for i in (3, 4)}
    placed = read_ledgers(stack.marks.client, ids)
    outside = {i for i, md in placed.items() if any(set(s.ensemble) & others for s in md.segments)}
    assert outside, "rack-aware placement over four bookies puts some ledger on bookie 3 or 4"
    started = time.time()
    try:
        stack.cluster.set_groups({1: "isolated", 2: "isolated", 3: "other", 4: "other"})

        def flagged() -> set[int]:
            kinds = ("PLACEMENT_ISOLATION_VIOLATED",)
            return {int(a.alert["ledger_id"]) for a in stack.alerts.open_now(kinds).values()}

        wait_for("the ledgers outside their group", lambda: flagged() == outside, 180)
        fired = {a.alert["alert_id"] for a in stack.alerts.firing(("PLACEMENT_ISOLATION_VIOLATED",), started)}
        stack.cluster.set_groups({i: "isolated" for i in (1, 2, 3, 4)})
        wait_for("every isolation alert to resolve", lambda: not flagged(), 180)
        resolved = {
            a.alert["alert_id"]
            for a in stack.alerts.alerts()
            if a.kind == "PLACEMENT_ISOLATION_VIOLATED" and not a.firing
        }
        assert fired <= resolved, "each alert resolves under the id it fired with"
    finally:
        stack.cluster.set_groups(None)


def _managed_ledger_of(md: LedgerMetadata) -> str:
    """The managed ledger BookKeeper's Java client named in the ledger's custom metadata (as Pulsar does)."""
    return dict(md.custom_metadata)["pulsar/managed-ledger"].decode()


def test_pulsar_managed_ledgers_beside_the_real_metadata_find_the_missing_and_the_orphaned(
    stack: RealStack,
) -> None:
    """Managed-ledger znodes (Pulsar's binary format) next to ledgers BookKeeper's Java client wrote with
    Pulsar's custom metadata: a listed ledger BookKeeper never had is TOPIC_LEDGER_MISSING, and every
    ledger its managed ledger does not list is LEDGER_ORPHANED; listing them as Pulsar would resolves
    each alert under the id it fired with. Last in the module: its znodes stay."""
    client = stack.marks.client
    ledgers = {i: md for i, md in read_ledgers(client, stack.known_ledgers).items()}
    owners = {i: _managed_ledger_of(md) for i, md in ledgers.items()}
    first = min(owners)
    never_in_bookkeeper = max(owners) + 1_000_000
    topic_root = "/managed-ledgers"

    def write(name: str, ids: list[int]) -> None:
        data = encode_managed_ledger_info(ManagedLedgerInfo(tuple(TopicLedger(i) for i in ids)))
        path = f"{topic_root}/{name}"
        if client.exists(path):
            client.set(path, data)
        else:
            client.create(path, data, makepath=True)

    started = time.time()
    write(owners[first], [first, never_in_bookkeeper])
    orphans = set(owners) - {first}

    def fired() -> tuple[set[int], set[int]] | None:
        missing = {int(a.alert["ledger_id"]) for a in stack.alerts.firing(("TOPIC_LEDGER_MISSING",), started)}
        orphaned = {int(a.alert["ledger_id"]) for a in stack.alerts.firing(("LEDGER_ORPHANED",), started)}
        return (missing, orphaned) if missing and orphaned == orphans else None

    missing, _ = wait_for("the missing and the orphaned ledgers", fired, 180)
    assert missing == {never_in_bookkeeper}
    open_before = stack.alerts.open_now(("TOPIC_LEDGER_MISSING", "LEDGER_ORPHANED"))

    write(owners[first], [first])
    for ledger_id in sorted(orphans):
        write(owners[ledger_id], [i for i, owner in owners.items() if owner == owners[ledger_id]])

    def all_resolved() -> bool:
        return not stack.alerts.open_now(("TOPIC_LEDGER_MISSING", "LEDGER_ORPHANED"))

    wait_for("every managed-ledger alert to resolve", all_resolved, 180)
    resolved = {
        a.alert["alert_id"]
        for a in stack.alerts.alerts()
        if a.kind in ("TOPIC_LEDGER_MISSING", "LEDGER_ORPHANED") and not a.firing
    }
    assert set(open_before) <= resolved, "each alert resolves under the id it fired with"
