"""The membership lane without services: its state files, the ledger lane's cluster group without
membership, and the lane's selection of raw Kafka records."""

from __future__ import annotations

import json
from collections import namedtuple
from datetime import UTC, datetime

import pyarrow as pa
import pytest

import connectors.storage as storage_module
from core import events as ev
from core.domain.rules.lost_bookie import BookieMembership
from streaming.membership import MembershipLaneConfig, MembershipStateStore, membership_rows
from streaming.processor import ClusterLogic, ProcessorConfig

Stat = namedtuple("Stat", "czxid mzxid ctime mtime version dataLength")

# --- MembershipStateStore ---------------------------------------------------------------------------------


def test_before_picks_the_newest_batch_strictly_before_the_given_id(tmp_path):
    store = MembershipStateStore(tmp_path / "state")
    assert store.before(0) is None  # no directory yet: the lane's first batch
    for batch_id in (7, 1, 3):  # saved out of order: the file names decide, not the write order
        store.save(batch_id, {"batch": batch_id})
    (store.directory / "notes.json").write_text("{}")  # not a batch file: ignored
    assert store.before(0) is None
    assert store.before(1) is None  # strictly before: a replay of batch 1 starts from nothing
    assert store.before(2) == {"batch": 1}
    assert store.before(3) == {"batch": 1}
    assert store.before(7) == {"batch": 3}
    assert store.before(100) == {"batch": 7}


def test_a_replayed_batch_starts_from_the_state_before_it_not_its_own_first_attempt(tmp_path):
    store = MembershipStateStore(tmp_path)
    store.save(4, {"bookies": {"b1": "WRITABLE"}})
    store.save(5, {"bookies": {"b1": "GONE"}})  # batch 5's first attempt saved, then the job crashed
    assert store.before(5) == {"bookies": {"b1": "WRITABLE"}}
    store.save(5, {"bookies": {"b1": "GONE"}})  # the replay saves again: still one file for batch 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["4.json", "5.json"]


def test_a_crash_while_saving_leaves_the_previous_state_readable(tmp_path, monkeypatch):
    store = MembershipStateStore(tmp_path)
    store.save(5, {"bookies": {"b1": {"status": "WRITABLE"}}})

    real_write = storage_module.Path.open

    def torn_open(path, mode="r", *args, **kwargs):
        handle = real_write(path, mode, *args, **kwargs)
        if "w" not in mode:
            return handle
        handle.write(b'{"bookies": {"b1"')  # half of the new state, then the process dies
        handle.flush()
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(storage_module.Path, "open", torn_open)
    with pytest.raises(KeyboardInterrupt):
        store.save(5, {"bookies": {}})  # a replay of batch 5 rewriting its own file
    with pytest.raises(KeyboardInterrupt):
        store.save(6, {"bookies": {}})  # the next batch
    monkeypatch.undo()
    # Neither torn write is visible under a batch's name: the last complete state is what a restart reads.
    assert store.before(6) == {"bookies": {"b1": {"status": "WRITABLE"}}}
    assert store.before(7) == {"bookies": {"b1": {"status": "WRITABLE"}}}
    assert not (tmp_path / "6.json").exists()
    assert json.loads((tmp_path / "5.json").read_text()) == {"bookies": {"b1": {"status": "WRITABLE"}}}


def test_save_prunes_to_the_newest_keep_files(tmp_path):
    store = MembershipStateStore(tmp_path, keep=3)
    for batch_id in range(8):
        store.save(batch_id, {"batch": batch_id})
        batch_files = sorted(int(p.stem) for p in tmp_path.glob("*.json"))
        assert batch_files == list(range(max(0, batch_id - 2), batch_id + 1))
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary file left behind by a completed save
    assert store.before(8) == {"batch": 7}
    assert store.before(5) is None  # pruned: what is older than the newest three is gone


# --- ClusterLogic without membership (the ledger lane's cluster group) -------------------------------------


def row(kind, t, bookie_id=None, snap=None, **payload):
    return {
        "kind": kind,
        "event_time_ms": t,
        "ledger_id": None,
        "bookie_id": bookie_id,
        "snapshot_id": snap,
        "cluster": "c1",
        "payload": payload,
    }


MEMBERSHIP_HISTORY = [
    row("recovery_delay", 1_000, seconds=5, present=True),
    row("bookie_status", 2_000, bookie_id="b1", status="WRITABLE"),
    row("bookie_status", 3_000, bookie_id="b1", status="GONE"),
    row("bookie_status", 3_500, bookie_id="b2", status="WRITABLE"),
    row("heartbeat", 60_000, partition=0),  # long after the delay: b1 would be lost
]


def test_with_membership_the_history_decides_a_loss():
    # The reference: the same rows in a group *with* membership decide b1 lost (else the test below is void).
    _, out, _ = ClusterLogic(ProcessorConfig(membership=True)).apply(None, MEMBERSHIP_HISTORY[:-1])
    assert {"recovery_delay", "bookie_state"} <= {d["kind"] for d in out}
    _, out, _ = ClusterLogic(ProcessorConfig(membership=True)).apply(None, MEMBERSHIP_HISTORY)
    assert ("bookie_lost", "b1") in [(d["kind"], d["bookie_id"]) for d in out]


def test_without_membership_registrations_delays_and_heartbeats_are_ignored():
    logic = ClusterLogic(ProcessorConfig(membership=False, default_recovery_delay_s=0))
    state, out, deadline = logic.apply(None, MEMBERSHIP_HISTORY[:-1])
    assert out == [] and deadline is None  # no bookie decisions, no recovery delay, no deadline to wait for
    state, out, deadline = logic.apply(json.loads(json.dumps(state)), [MEMBERSHIP_HISTORY[-1]])
    assert out == [] and deadline is None
    assert state["bookies"] == {}
    assert BookieMembership.from_json(state["membership"]).bookies == {}
    _, out, deadline = logic.on_timer(state, 120_000)
    assert out == [] and deadline is None


def test_without_membership_a_state_that_holds_a_missing_bookie_sets_no_deadline_and_decides_nothing():
    # A cluster group state written while the group still did membership (an older checkpoint): b1 missing,
    # its delay running. Without membership the group neither waits for the delay nor decides the loss.
    with_membership = ClusterLogic(ProcessorConfig(membership=True))
    old_state, _, old_deadline = with_membership.apply(None, MEMBERSHIP_HISTORY[:-1])
    assert old_deadline == 8_000  # the reference: b1 went missing at 3 s with a 5 s delay
    logic = ClusterLogic(ProcessorConfig(membership=False))
    state, out, deadline = logic.apply(json.loads(json.dumps(old_state)), [row("rack_map", 9_000, racks={})])
    assert [d["kind"] for d in out] == ["rack_map"] and deadline is None
    _, out, deadline = logic.on_timer(state, 60_000)
    assert out == [] and deadline is None
    _, out, deadline = logic.apply(state, [row("snapshot_begin", 70_000, snapshot_id="s", mode="FULL")])
    assert out == [] and deadline is None  # a snapshot marker does not advance membership either


def test_without_membership_rack_maps_and_snapshot_brackets_still_work():
    logic = ClusterLogic(ProcessorConfig(membership=False))
    full = {"mode": "FULL", "partition_count": 2}
    state, out, _ = logic.apply(
        None,
        [
            row("rack_map", 1_000, racks={"b1": "/r1", "b2": "/r2"}),
            row("snapshot_begin", 1_100, snapshot_id="s1", partition=0, **full),
            row("bookie_status", 1_200, bookie_id="b1", status="GONE"),
            row("rack_map", 1_300, racks={"b1": "/r1", "b2": "/r3"}, groups={"b2": "g"}),
            row("rack_map", 1_400, error="bad json"),
        ],
    )
    assert [(d["kind"], d["payload"]) for d in out] == [
        ("rack_map", {"racks": {"b1": "/r1", "b2": "/r2"}, "moved": ["b1", "b2"], "groups": {}}),
        ("rack_map", {"racks": {"b1": "/r1", "b2": "/r3"}, "moved": ["b2"], "groups": {"b2": "g"}}),
        ("rack_map", {"error": "bad json"}),
    ]
    state = json.loads(json.dumps(state))  # stored as JSON between batches
    _, out, _ = logic.apply(
        state,
        [
            row("rack_map", 2_000, racks={"b1": "/r9", "b2": "/r3"}),  # diffed against the last valid map
            row("snapshot_end", 2_100, snapshot_id="s1", partition=0, complete=True, **full),
        ],
    )
    assert out[0]["payload"]["moved"] == ["b1"]
    completed = [d["payload"] for d in out if d["kind"] == "snapshot_complete"]
    assert [(p["snapshot_id"], p["begin_ms"]) for p in completed] == [("s1", 1_100)]


# --- membership_rows ----------------------------------------------------------------------------------------

FEEDBACK_TOPIC = "bkaudit.feedback"
CHANGES_TOPIC = "bkaudit.changes"


def records(events_and_raw):
    """Raw Kafka records (the source's columns) from ``ChangeEvent``s or ``(key, value)`` byte pairs."""
    keys, values = [], []
    for item in events_and_raw:
        if isinstance(item, tuple):
            keys.append(item[0])
            values.append(item[1])
        else:
            keys.append(ev.kafka_key(item))
            values.append(ev.encode_event(item))
    count = len(keys)
    received = datetime.fromtimestamp(100_000, tz=UTC)
    return pa.table(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "topic": [CHANGES_TOPIC] * count,
            "partition": pa.array([0] * count, pa.int32()),
            "offset": pa.array(range(count), pa.int64()),
            "timestamp": pa.array([received] * count, pa.timestamp("us", tz="UTC")),
        }
    )


def lane_config():
    return MembershipLaneConfig(
        app_id="bkaudit", feedback_topic=FEEDBACK_TOPIC, processor=ProcessorConfig(membership=True)
    )


def test_membership_rows_keep_only_membership_changes_in_event_time_order():
    build = ev.EventBuilder("c1", "run-1").build
    writable = ev.BookieStatusValue.WRITABLE
    batch = records(
        [
            build(ev.bookie_status("b1:3181", writable, has_cookie=True), event_time_ms=3_000),
            build(ev.ledger_deleted(42, last_mzxid=7), event_time_ms=3_000),
            (b"bookie/b9:3181", b"\x00not a change event"),  # a dead letter: the ledger lane records it
            build(ev.heartbeat(4_000, partition=0, partition_count=1), event_time_ms=4_000),
            build(ev.rack_map_event("file:/racks.json", None, present=False), event_time_ms=4_000),
            build(ev.underreplication_cleared(42, last_mzxid=8), event_time_ms=4_500),
        ]
    )
    # An older watcher run's events arrive later on the topic (another partition, a slow producer).
    old = ev.EventBuilder("c1", "run-0").build
    late = records(
        [
            old(ev.recovery_delay(30, present=True), event_time_ms=1_000),
            old(ev.bookie_status("b2:3181", ev.BookieStatusValue.GONE), event_time_ms=2_000),
        ]
    )
    rows = membership_rows(pa.concat_tables([batch, late]), lane_config())
    assert [(r["kind"], r["event_time_ms"], r["bookie_id"]) for r in rows] == [
        ("recovery_delay", 1_000, None),
        ("bookie_status", 2_000, "b2:3181"),
        ("bookie_status", 3_000, "b1:3181"),
        ("heartbeat", 4_000, None),
    ]
    assert rows[0]["payload"]["seconds"] == 30
    assert [r["payload"]["status"] for r in rows[1:3]] == ["GONE", "WRITABLE"]
    assert {r["cluster"] for r in rows} == {"c1"}


def test_membership_rows_of_a_batch_without_membership_changes_are_empty():
    build = ev.EventBuilder("c1", "run-1").build
    only_ledgers = records(
        [build(ev.ledger_deleted(1, last_mzxid=3)), (b"ledger/2", b"garbage"), (None, b"\x08\x01")]
    )
    assert membership_rows(only_ledgers, lane_config()) == []
    assert membership_rows(only_ledgers.slice(0, 0), lane_config()) == []


def test_the_delay_written_again_with_its_value_ends_a_pending_delay_through_the_lane():
    """`bookkeeper shell triggeraudit` writes the delay in force again: the same bytes, a new mzxid. The
    watcher's snapshots publish the old write again (same mzxid): that is no audit."""

    def delay_event(builder, mzxid, at_ms):
        stat = Stat(czxid=5, mzxid=mzxid, ctime=0, mtime=at_ms, version=mzxid - 5, dataLength=3)
        return builder(ev.recovery_delay(600, present=True, stat=stat), event_time_ms=at_ms)

    build = ev.EventBuilder("c1", "run-1").build
    restarted = ev.EventBuilder("c1", "run-2").build  # a restarted watcher's START snapshot
    written = delay_event(build, 5, 1_000)  # built first: a builder's event time never goes back
    bookies = [
        build(ev.bookie_status(b, ev.BookieStatusValue.WRITABLE, has_cookie=True), event_time_ms=1_000)
        for b in ("b1:3181", "b2:3181", "b3:3181")
    ]
    gone = build(ev.bookie_status("b1:3181", ev.BookieStatusValue.GONE, has_cookie=True), event_time_ms=2_000)
    logic = ClusterLogic(ProcessorConfig(default_recovery_delay_s=0))
    first = records([written, *bookies, gone, delay_event(restarted, 5, 3_000)])
    state, out, deadline = logic.apply(None, membership_rows(first, lane_config()))
    assert not [d for d in out if d["kind"] == "bookie_lost"]
    assert deadline == 602_000
    _, out, deadline = logic.apply(
        state, membership_rows(records([delay_event(build, 8, 4_000)]), lane_config())
    )
    assert [(d["bookie_id"], d["event_time_ms"]) for d in out if d["kind"] == "bookie_lost"] == [
        ("b1:3181", 4_000)
    ]
    assert deadline is None


def test_a_bookie_formatted_again_is_flagged_once_and_a_first_sighting_or_a_republication_is_not():
    """Through the lane's decoding and ClusterLogic, with the state round-tripped through JSON as saved."""
    build = ev.EventBuilder("c1", "run-1").build
    writable, gone = ev.BookieStatusValue.WRITABLE, ev.BookieStatusValue.GONE
    first = (Stat(czxid=40, mzxid=40, ctime=0, mtime=0, version=0, dataLength=9), b"5\ncookie-1")
    rewritten = (Stat(czxid=40, mzxid=77, ctime=0, mtime=0, version=1, dataLength=9), b"5\ncookie-2")
    recreated = (Stat(czxid=90, mzxid=90, ctime=0, mtime=0, version=0, dataLength=9), b"5\ncookie-2")
    steps = [
        (ev.bookie_status("b1:3181", writable, has_cookie=True, cookie=first), False),  # first sighting
        (ev.bookie_status("b1:3181", writable, has_cookie=True, cookie=first), False),  # a watcher restart
        (ev.bookie_status("b1:3181", writable, has_cookie=True), False),  # an older watcher: no cookie read
        (ev.bookie_status("b1:3181", writable, has_cookie=True, cookie=rewritten), True),  # new content
        (ev.bookie_status("b1:3181", gone, has_cookie=False), False),  # the cookie deleted ...
        (ev.bookie_status("b1:3181", writable, has_cookie=True, cookie=recreated), True),  # ... and created
        (ev.bookie_status("b1:3181", writable, has_cookie=True, cookie=recreated), False),
    ]
    logic, state, flagged, changed = ClusterLogic(ProcessorConfig(membership=True)), None, [], []
    for at_ms, (event, _) in enumerate(steps, start=1):
        rows = membership_rows(records([build(event, event_time_ms=at_ms * 1_000)]), lane_config())
        state, out, _ = logic.apply(state, rows)
        state = json.loads(json.dumps(state))
        decided = [d["payload"] for d in out if d["kind"] == "bookie_state"]
        flagged.append(any(p.get("cookie_replaced") for p in decided))
        changed.append(decided[-1]["cookie_changed_ms"])
    assert flagged == [replaced for _, replaced in steps]
    assert changed == [None, None, None, 4_000, 4_000, 6_000, 6_000]


# --- AUDITOR_LAGGING's input, saved per batch ------------------------------------------------------------


class _ChangingAuditor:
    """The loss owner's answer to "which at-risk ledgers are unmarked", changing between calls (marks
    arriving while a crashed batch waits for its replay)."""

    def __init__(self, *answers):
        self.answers = list(answers)

    def unmarked_at_risk(self):
        return self.answers.pop(0)


def test_a_replayed_batch_judges_auditor_lagging_on_its_first_attempts_input(tmp_path):
    from core.domain.rules.auditor_lag import UnmarkedAtRisk
    from core.domain.rules.autorecovery import AutoRecoveryGraces
    from streaming.membership import MembershipLane

    first, later = UnmarkedAtRisk(2, 1_000, (7, 8)), UnmarkedAtRisk()
    config = MembershipLaneConfig(
        app_id="a",
        feedback_topic="f",
        processor=ProcessorConfig(membership=True, autorecovery=AutoRecoveryGraces(lagging_s=60)),
    )
    store = MembershipStateStore(tmp_path / "state")
    auditor = _ChangingAuditor(first, later, later)
    lane = MembershipLane(config, auditor, store)
    assert lane._lagging_input(5) == first  # batch 5's first attempt, then the job crashed
    restarted = MembershipLane(config, auditor, MembershipStateStore(tmp_path / "state"))
    assert restarted._lagging_input(5) == first  # its replay: the same input, not the marks since
    assert restarted._lagging_input(6) == later  # the next batch asks again
    assert auditor.answers == [later]
