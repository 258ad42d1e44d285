"""The event-time state machine: pure logic, then the Spark adapter through PySpark's TwsTester."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from streaming.processor import ClusterLogic, LedgerLogic, ProcessorConfig, make_processor
from streaming.state_keys import ledger_state_key


def row(kind, t, ledger_id=None, bookie_id=None, snap=None, **payload):
    return {
        "kind": kind,
        "event_time_ms": t,
        "ledger_id": ledger_id,
        "bookie_id": bookie_id,
        "snapshot_id": snap,
        "cluster": "c1",
        "payload": payload,
    }


def kinds(decisions):
    return [(d["kind"], d.get("bookie_id") or d.get("ledger_id"), d["event_time_ms"]) for d in decisions]


# --- cluster group --------------------------------------------------------------------------------------


def test_a_flap_shorter_than_the_delay_raises_nothing_and_a_long_absence_is_lost_by_timer():
    logic = ClusterLogic(ProcessorConfig(default_recovery_delay_s=10))
    state, out, deadline = logic.apply(
        None,
        [
            row("bookie_status", 0, bookie_id="b1", status="WRITABLE"),
            row("bookie_status", 1_000, bookie_id="b1", status="GONE"),
        ],
    )
    assert deadline == 11_000
    state, out, deadline = logic.apply(
        state, [row("bookie_status", 5_000, bookie_id="b1", status="WRITABLE")]
    )
    assert [k for k, *_ in kinds(out)] == ["bookie_state", "bookie_flapped", "bookie_state"]
    assert deadline is None
    state, _, _ = logic.apply(state, [row("bookie_status", 6_000, bookie_id="b1", status="GONE")])
    state, out, deadline = logic.on_timer(state, 16_000)
    assert ("bookie_lost", "b1", 16_000) in kinds(out)
    bookie_state = [d for d in out if d["kind"] == "bookie_state"][-1]
    assert bookie_state["payload"]["lost"] is True and bookie_state["payload"]["flaps"] == 1


def test_recovery_delay_znode_and_rack_moves():
    logic = ClusterLogic(ProcessorConfig(default_recovery_delay_s=0))
    _, out, _ = logic.apply(
        None,
        [
            row("recovery_delay", 0, seconds=30, present=True),
            row("bookie_status", 1, bookie_id="b1", status="WRITABLE"),
            row("bookie_status", 2, bookie_id="b1", status="GONE"),
            row("rack_map", 3, racks={"b1": "/r1", "b2": "/r2"}),
            row("rack_map", 4, racks={"b1": "/r1", "b2": "/r3"}),
            row("rack_map", 5, racks={}, error="bad json"),
            row("rack_map", 6, racks={"b1": "/r1", "b2": "/r4"}),
        ],
    )
    assert ("recovery_delay", None, 0) in kinds(out)
    assert not any(k == "bookie_lost" for k, *_ in kinds(out))  # the znode's 30 s applies, not the default 0
    maps = [d["payload"] for d in out if d["kind"] == "rack_map"]
    # The bad map is passed on as an error (placement unknown) and otherwise ignored: the next valid map
    # is diffed against the last valid one.
    assert maps[2] == {"error": "bad json"}
    assert [m.get("moved") for m in maps] == [["b1", "b2"], ["b2"], None, ["b2"]]


def test_only_complete_full_snapshots_are_passed_on():
    logic = ClusterLogic(ProcessorConfig())
    _, out, _ = logic.apply(
        None,
        [
            row(
                "snapshot_end",
                1,
                snapshot_id="s1",
                complete=True,
                mode="FULL",
                partition=0,
                partition_count=1,
            ),
            row(
                "snapshot_end",
                2,
                snapshot_id="s2",
                complete=False,
                mode="FULL",
                partition=0,
                partition_count=1,
            ),
            row(
                "snapshot_end",
                3,
                snapshot_id="s3",
                complete=True,
                mode="DELTA",
                partition=0,
                partition_count=1,
            ),
        ],
    )
    assert [d["payload"]["snapshot_id"] for d in out if d["kind"] == "snapshot_complete"] == ["s1"]


def marker(kind, t, snapshot_id, partition=0, **extra):
    return row(kind, t, snapshot_id=snapshot_id, mode="FULL", partition=partition, partition_count=2, **extra)


def test_a_complete_snapshot_carries_its_begin_time_even_across_batches():
    # The sink keeps a ledger that had any event at or after the snapshot began: it needs the begin's time.
    logic = ClusterLogic(ProcessorConfig())
    state, _, _ = logic.apply(
        None, [marker("snapshot_begin", 1_000, "s1", 0), marker("snapshot_begin", 1_001, "s1", 1)]
    )
    state = json.loads(json.dumps(state))  # the Spark adapter stores it as JSON between batches
    _, out, _ = logic.apply(
        state,
        [
            marker("snapshot_end", 5_000, "s1", 1, complete=True),
            marker("snapshot_end", 5_001, "s1", 0, complete=True),
            marker("snapshot_end", 5_002, "s0", 1, complete=True),  # its begin was never read
        ],
    )
    completed = [d["payload"] for d in out if d["kind"] == "snapshot_complete"]
    assert [(p["snapshot_id"], p["partition"], p["begin_ms"]) for p in completed] == [
        ("s1", 1, 1_001),
        ("s1", 0, 1_000),
        ("s0", 1, None),
    ]


# --- ledger groups --------------------------------------------------------------------------------------


def upsert(t, mzxid, snapshot_id=None):
    return row("ledger_upserted", t, ledger_id=7, snap=snapshot_id, mzxid=mzxid, state="CLOSED")


def test_stale_and_duplicate_upserts_are_not_applied_but_still_show_the_ledger_exists():
    logic = LedgerLogic(ProcessorConfig())
    state, out, _ = logic.apply(None, [upsert(1, 10), upsert(2, 10), upsert(3, 9), upsert(4, 12)])
    # Live duplicates too: the vanished-ledger reconciliation counts every event after a snapshot began.
    assert [(d["kind"], d["event_time_ms"]) for d in out] == [
        ("ledger_state", 1),
        ("ledger_seen", 2),
        ("ledger_seen", 3),
        ("ledger_state", 4),
    ]
    _, out, _ = logic.apply(state, [upsert(5, 12, snapshot_id="s1")])
    assert [(d["kind"], d["payload"]) for d in out] == [("ledger_seen", {"snapshot_id": "s1"})]


def test_suspect_is_reprobed_for_the_configured_rounds_then_confirmed_then_cleared():
    config = ProcessorConfig(reprobe_delay_s=10, reprobe_rounds=2, confirmed_recheck_s=100)
    logic = LedgerLogic(config)
    state, _, _ = logic.apply(None, [upsert(0, 5)])
    failing = {"failing": True, "mzxid": 5, "outcome": {"result": "LESS_THAN_WQ"}}
    state, out, timers = logic.apply(state, [row("probe_result", 1_000, ledger_id=7, round=0, **failing)])
    assert out == [] and timers == {11_000}
    state, out, timers = logic.on_timer(state, 11_000, 7)
    assert [(d["kind"], d["payload"]["round"]) for d in out] == [("probe_request", 1)]
    state, out, timers = logic.apply(state, [row("probe_result", 11_500, ledger_id=7, round=1, **failing)])
    assert out == [] and timers == {31_500}  # the delay doubles
    state, out, _ = logic.apply(state, [row("probe_result", 32_000, ledger_id=7, round=1, **failing)])
    assert out == []  # a duplicate round (replayed feedback) is ignored
    state, _, _ = logic.on_timer(state, 31_500, 7)
    state, out, timers = logic.apply(state, [row("probe_result", 32_000, ledger_id=7, round=2, **failing)])
    assert [d["kind"] for d in out] == ["replicas_confirmed"]
    assert timers == {132_000}  # confirmed: re-checked slowly to notice a repair
    state, _, _ = logic.on_timer(state, 132_000, 7)
    state, out, timers = logic.apply(
        state, [row("probe_result", 132_500, ledger_id=7, round=3, failing=False, mzxid=5)]
    )
    assert [d["kind"] for d in out] == ["replicas_cleared"] and timers == set()


def probe(t, probe_round, result=None, unresolved=(), mzxid=5):
    failing = result not in (None, "OK") or bool(unresolved)
    outcome = {"result": result or "OK", "unresponsive": [], "unresolved": list(unresolved)}
    return row(
        "probe_result", t, ledger_id=7, round=probe_round, failing=failing, mzxid=mzxid, outcome=outcome
    )


def run_rounds(logic, state, results, start_ms=1_000):
    """Feed probe results round after round (each at its due time); returns the state and all decisions."""
    decisions, t = [], start_ms
    for probe_round, (result, unresolved) in enumerate(results):
        if probe_round:
            t = min(logic.timers(state))
            state, out, _ = logic.on_timer(state, t, 7)
            assert [d["kind"] for d in out] == ["probe_request"]
        state, out, _ = logic.apply(state, [probe(t + 1, probe_round, result, unresolved)])
        decisions.extend(out)
    return state, decisions


def test_a_transient_fault_after_rounds_of_another_failure_is_not_alerted():
    # The incident: rounds of "b1 unknown" during a bookie loss, b1 returns, a ~4 s ENOLEDGER fault makes the
    # next round LESS_THAN_AQ. Its count starts at one: no alert; the next healthy round ends the suspicion.
    logic = LedgerLogic(ProcessorConfig(reprobe_delay_s=10, reprobe_rounds=3))
    state, _, _ = logic.apply(None, [upsert(0, 5)])
    state, out = run_rounds(
        logic,
        state,
        [(None, ["b1"]), (None, ["b1"]), (None, ["b1"]), ("LESS_THAN_AQ", []), ("OK", [])],
    )
    assert out == []
    assert state["suspect"] is None


def test_the_same_failure_over_the_configured_rounds_alerts_once_and_a_new_kind_counts_anew():
    logic = LedgerLogic(ProcessorConfig(reprobe_delay_s=10, reprobe_rounds=2, confirmed_recheck_s=100))
    state, _, _ = logic.apply(None, [upsert(0, 5)])
    # Found, then two re-probes, all LESS_THAN_WQ: confirmed at the third failing round.
    state, out = run_rounds(logic, state, [("LESS_THAN_WQ", [])] * 3)
    assert [(d["kind"], d["payload"]["failing_rounds"]) for d in out] == [("replicas_confirmed", 3)]
    assert logic.timers(state) == {31_003 + 100_000}  # re-checked slowly once confirmed
    # The re-check finds NO_REPLICA: a new count (re-probed quickly), the open alert stays until it confirms.
    t = min(logic.timers(state))
    state, _, _ = logic.on_timer(state, t, 7)
    state, out, timers = logic.apply(state, [probe(t + 1, 3, "NO_REPLICA")])
    assert out == [] and timers == {t + 1 + 10_000}
    assert (state["suspect"]["failure"], state["suspect"]["count"]) == ("NO_REPLICA", 1)
    # A healthy round resolves the alert that is open.
    state, _, _ = logic.on_timer(state, t + 10_001, 7)
    state, out, timers = logic.apply(state, [probe(t + 10_002, 4)])
    assert [d["kind"] for d in out] == ["replicas_cleared"] and timers == set()


def test_a_metadata_change_of_an_alerted_ledger_restarts_the_count_and_keeps_the_alert_to_resolve():
    logic = LedgerLogic(ProcessorConfig(reprobe_delay_s=10, reprobe_rounds=1, confirmed_recheck_s=100))
    state, _, _ = logic.apply(None, [upsert(0, 5)])
    state, out = run_rounds(logic, state, [("NO_REPLICA", [])] * 2)
    assert [d["kind"] for d in out] == ["replicas_confirmed"]
    state, out, timers = logic.apply(state, [upsert(50_000, 6)])
    assert [d["kind"] for d in out] == ["ledger_state"] and timers == {60_000}
    state, out, _ = logic.on_timer(state, 60_000, 7)
    request = out[0]["payload"]
    assert (request["round"], request["mzxid"]) == (state["suspect"]["round"], 6)
    state, out, timers = logic.apply(state, [probe(60_001, request["round"], mzxid=6)])
    assert [d["kind"] for d in out] == ["replicas_cleared"] and timers == set()


def test_a_suspect_stored_before_failure_kinds_counts_anew_and_still_resolves():
    logic = LedgerLogic(ProcessorConfig(reprobe_delay_s=10, reprobe_rounds=3))
    stored = {**LedgerLogic.new_state(), "mzxid": 5}
    stored["suspect"] = {"round": 5, "due_ms": 1_000, "confirmed": True, "reason": "scrutiny"}
    state, out, _ = logic.apply(stored, [probe(1_001, 5, "LESS_THAN_AQ")])
    assert out == [] and (state["suspect"]["failure"], state["suspect"]["count"]) == ("LESS_THAN_AQ", 1)
    state, out, _ = logic.apply(state, [probe(12_000, 6)])
    assert [d["kind"] for d in out] == ["replicas_cleared"]


def test_a_metadata_change_ends_the_suspicion_instead_of_alerting():
    logic = LedgerLogic(ProcessorConfig(reprobe_delay_s=10, reprobe_rounds=1))
    state, _, _ = logic.apply(None, [upsert(0, 5)])
    state, _, timers = logic.apply(
        state, [row("probe_result", 1, ledger_id=7, round=0, failing=True, mzxid=5)]
    )
    assert timers
    state, out, timers = logic.apply(state, [upsert(2, 6)])
    assert [d["kind"] for d in out] == ["ledger_state"] and timers == set()


def test_under_replication_mark_older_than_the_grace_fires_once_and_clears():
    logic = LedgerLogic(ProcessorConfig(under_replication_grace_s=60))
    state, out, timers = logic.apply(
        None,
        [row("under_replication_mark", 1_000, ledger_id=7, state="SET", replicas=["b1"], mark_ctime_ms=0)],
    )
    assert [d["kind"] for d in out] == ["under_replication"] and timers == {60_000}
    state, out, timers = logic.on_timer(state, 60_000, 7)
    assert [d["kind"] for d in out] == ["under_replication_stuck"] and timers == set()
    # An old mark seen for the first time fires at once.
    _, out, _ = logic.apply(
        None, [row("under_replication_mark", 120_000, ledger_id=8, state="SET", replicas=[], mark_ctime_ms=0)]
    )
    assert [d["kind"] for d in out] == ["under_replication", "under_replication_stuck"]
    state, out, timers = logic.apply(
        state, [row("under_replication_mark", 70_000, ledger_id=7, state="CLEARED", replicas=[])]
    )
    assert [d["kind"] for d in out] == ["under_replication"] and timers == set()


def test_a_mark_cleared_after_its_grace_fires_at_the_grace_end_in_whatever_batch_the_clear_comes():
    """The grace period ended before the clear: the alert fires (at the grace's end, as its timer would
    have), then the clear. It used to depend on the batches: with the mark, the heartbeats past the grace
    and the clear in one batch, input rows ran before the timer and the clear cancelled it unfired."""
    logic = LedgerLogic(ProcessorConfig(under_replication_grace_s=5))
    mark = row("under_replication_mark", 1_000, ledger_id=7, state="SET", replicas=["b1"], mark_ctime_ms=0)
    clear = row("under_replication_mark", 180_000, ledger_id=7, state="CLEARED", replicas=[])
    one_batch, out, timers = logic.apply(None, [mark, clear])
    assert [(d["kind"], d["event_time_ms"]) for d in out] == [
        ("under_replication", 1_000),
        ("under_replication_stuck", 5_000),
        ("under_replication", 180_000),
    ]
    assert timers == set() and one_batch["mark"] is None
    state, _, _ = logic.apply(None, [mark])
    state, fired, _ = logic.on_timer(state, 5_000, 7)
    _, after, _ = logic.apply(state, [clear])
    assert fired + after == out[1:]  # the same decisions as when the timer fired between the batches


def test_deleted_and_corrupt_ledgers():
    logic = LedgerLogic(ProcessorConfig())
    _, out, _ = logic.apply(
        None,
        [
            upsert(0, 5),
            row("ledger_undecodable", 1, ledger_id=7, mzxid=6, reason="bad header"),
            row("ledger_deleted", 2, ledger_id=7, last_mzxid=6, inferred=False),
            row("ledger_deleted", 3, ledger_id=7, last_mzxid=6, inferred=True),
            upsert(4, 6),
        ],
    )
    assert [d["kind"] for d in out] == ["ledger_state", "ledger_corrupt", "ledger_deleted"]


def test_a_tracked_corrupt_ledger_read_again_by_a_snapshot_is_seen_not_dropped():
    # Tracked (it has an under-replication mark): its duplicate undecodable read must still reach the sink as
    # "the znode exists", or the snapshot's reconciliation marks it deleted and resolves METADATA_CORRUPT.
    logic = LedgerLogic(ProcessorConfig())
    mark = row("under_replication_mark", 0, ledger_id=7, state="SET", replicas=["b1"], mark_ctime_ms=0)
    bad = {"mzxid": 6, "reason": "bad header"}
    state, out, _ = logic.apply(None, [mark, row("ledger_undecodable", 1, ledger_id=7, **bad)])
    assert LedgerLogic.needs_state(state) and [d["kind"] for d in out] == [
        "under_replication",
        "ledger_corrupt",
    ]
    _, out, _ = logic.apply(state, [row("ledger_undecodable", 2, ledger_id=7, snap="s2", **bad)])
    assert [(d["kind"], d["payload"]) for d in out] == [("ledger_seen", {"snapshot_id": "s2"})]


def test_an_older_undecodable_read_does_not_override_a_newer_version():
    logic = LedgerLogic(ProcessorConfig())
    _, out, _ = logic.apply(
        None, [upsert(0, 8), row("ledger_undecodable", 1, ledger_id=7, mzxid=6, reason="bad header")]
    )
    assert [d["kind"] for d in out] == ["ledger_state", "ledger_seen"]


# --- the Spark adapter, through PySpark's TwsTester ------------------------------------------------------


def frame(rows):
    return pd.DataFrame(
        {
            "state_key": [r[0] for r in rows],
            "kind": [r[1] for r in rows],
            "event_time": pd.to_datetime([r[2] for r in rows], unit="ms", utc=True),
            "cluster": ["c1"] * len(rows),
            "run_id": ["run"] * len(rows),
            "sequence": list(range(len(rows))),
            "snapshot_id": [None] * len(rows),
            "ledger_id": pd.array([r[3] for r in rows], dtype="Int64"),
            "bookie_id": [r[4] for r in rows],
            "payload": [json.dumps(r[5]) for r in rows],
            "topic": ["t"] * len(rows),
            "partition": [0] * len(rows),
            "offset": list(range(len(rows))),
        }
    )


@pytest.fixture
def tester():
    from pyspark.sql.streaming.tws_tester import TwsTester

    return TwsTester(
        make_processor(ProcessorConfig(default_recovery_delay_s=5)),
        timeMode="EventTime",
        eventTimeExtractor=lambda r: int(r["event_time"].timestamp() * 1000),
    )


def test_spark_adapter_keeps_state_and_fires_event_time_timers(tester):
    out = tester.testInPandas(
        "cluster",
        frame(
            [
                ("cluster", "bookie_status", 1_000, None, "b1", {"status": "WRITABLE"}),
                ("cluster", "bookie_status", 2_000, None, "b1", {"status": "GONE"}),
            ]
        ),
    )
    assert list(out["kind"]) == ["bookie_state", "bookie_state"]
    assert len(tester.setWatermark(6_999)) == 0  # missing since 2 s, delay 5 s: not yet
    fired = tester.setWatermark(7_001)
    assert "bookie_lost" in list(fired["kind"])
    stored = json.loads(tester.peekValueState("state", "cluster")[0])
    assert json.loads(stored["membership"])["bookies"]["b1"][2] is True  # lost


def test_spark_adapter_passes_healthy_ledgers_through_without_keeping_state(tester):
    # An upsert of a healthy ledger costs no state: version dedupe is the sink's (it reads the row).
    payload = {"mzxid": 5, "state": "CLOSED"}
    key = ledger_state_key(7, 64)
    out = tester.testInPandas(
        key,
        frame(
            [
                (key, "ledger_upserted", 1_001, 7, None, payload),
                (key, "ledger_upserted", 1_000, 71, None, {"mzxid": 9, "state": "OPEN"}),
            ]
        ),
    )
    assert [(k, int(i)) for k, i in zip(out["kind"], out["ledger_id"], strict=True)] == [
        ("ledger_state", 71),  # event-time order across the bucket's ledgers
        ("ledger_state", 7),
    ]
    assert tester.peekMapState("ledgers", key) == {}
    assert json.loads(tester.peekValueState("state", key)[0]) == {"agenda": {}, "tracked": []}


def test_a_suspect_ledger_is_tracked_until_its_probe_passes(tester):
    # Ledgers 3 and 67 share bucket 3 of 64; only the suspect one is kept in the map state.
    key = ledger_state_key(3, 64)
    assert key == ledger_state_key(67, 64)
    tester.testInPandas(
        key,
        frame(
            [
                (key, "ledger_upserted", 1_000, 3, None, {"mzxid": 9, "state": "CLOSED"}),
                (key, "ledger_upserted", 1_001, 67, None, {"mzxid": 5, "state": "CLOSED"}),
                (key, "probe_result", 1_002, 67, None, {"round": 0, "failing": True, "mzxid": 5}),
            ]
        ),
    )
    stored = tester.peekMapState("ledgers", key)
    assert list(stored) == [(67,)]
    assert json.loads(stored[(67,)][0])["mzxid"] == 5  # the probed version: a newer one ends the suspicion
    assert json.loads(tester.peekValueState("state", key)[0])["tracked"] == [67]
    # While tracked, its own duplicates are only "seen" here; a newer version clears the suspicion.
    out = tester.testInPandas(
        key,
        frame(
            [
                (key, "ledger_upserted", 2_000, 67, None, {"mzxid": 5, "state": "CLOSED"}),
                (key, "ledger_upserted", 2_001, 67, None, {"mzxid": 6, "state": "CLOSED"}),
            ]
        ),
    )
    assert list(out["kind"]) == ["ledger_seen", "ledger_state"]
    assert tester.peekMapState("ledgers", key) == {}
    assert json.loads(tester.peekValueState("state", key)[0]) == {"agenda": {}, "tracked": []}


def test_a_bucket_fires_each_ledgers_timer_at_its_own_time():
    from pyspark.sql.streaming.tws_tester import TwsTester

    tester = TwsTester(
        make_processor(ProcessorConfig(reprobe_delay_s=10, reprobe_rounds=3)),
        timeMode="EventTime",
        eventTimeExtractor=lambda r: int(r["event_time"].timestamp() * 1000),
    )
    key = ledger_state_key(1, 4)
    failing = {"round": 0, "failing": True, "mzxid": 5}
    tester.testInPandas(
        key,
        frame(
            [
                (key, "ledger_upserted", 1_000, 1, None, {"mzxid": 5, "state": "CLOSED"}),
                (key, "ledger_upserted", 1_000, 5, None, {"mzxid": 5, "state": "CLOSED"}),
                (key, "probe_result", 1_000, 1, None, failing),  # due 11 000
                (key, "probe_result", 4_000, 5, None, failing),  # due 14 000
            ]
        ),
    )
    assert json.loads(tester.peekValueState("state", key)[0])["agenda"] == {"1": 11_000, "5": 14_000}
    fired = tester.setWatermark(11_500)
    assert [
        (k, int(i), t.value // 1_000_000)
        for k, i, t in zip(fired["kind"], fired["ledger_id"], fired["event_time"], strict=True)
    ] == [("probe_request", 1, 11_000)]
    fired = tester.setWatermark(14_500)
    assert [(k, int(i)) for k, i in zip(fired["kind"], fired["ledger_id"], strict=True)] == [
        ("probe_request", 5)
    ]
    # A passing probe of ledger 1 takes it off the agenda; ledger 5 stays due at its next round.
    tester.testInPandas(
        key, frame([(key, "probe_result", 15_000, 1, None, {"round": 1, "failing": False, "mzxid": 5})])
    )
    agenda = json.loads(tester.peekValueState("state", key)[0])["agenda"]
    assert set(agenda) == {"5"} and agenda["5"] > 14_500


def test_decode_puts_every_ledger_row_in_its_bucket():
    from core import events as ev
    from streaming.decode import decode_record

    builder = ev.EventBuilder(cluster="c1", run_id="r")
    event = builder.build(ev.ledger_deleted(130, last_mzxid=1), snapshot_id="")
    row = decode_record(
        None, event.SerializeToString(), "changes", 0, 1, feedback_topic="fb", ledger_buckets=64
    )
    assert row["state_key"] == "ledgers/2" and row["ledger_id"] == 130
    feedback = json.dumps({"kind": "probe_result", "ledger_id": 130, "event_time_ms": 1, "cluster": "c1"})
    row = decode_record(None, feedback.encode(), "fb", 0, 2, feedback_topic="fb", ledger_buckets=64)
    assert row["state_key"] == "ledgers/2"


def test_upserts_of_untracked_ledgers_passed_on_keep_the_buckets_tracked_ledgers(tester):
    key = ledger_state_key(3, 64)
    tester.testInPandas(
        key,
        frame(
            [
                (key, "ledger_upserted", 1_000, 67, None, {"mzxid": 5, "state": "CLOSED"}),
                (key, "probe_result", 1_001, 67, None, {"round": 0, "failing": True, "mzxid": 5}),
            ]
        ),
    )
    assert json.loads(tester.peekValueState("state", key)[0])["tracked"] == [67]
    upserts = frame([(key, "ledger_upserted", 2_000, 3, None, {"mzxid": 9, "state": "CLOSED"})])
    upserts["cluster"] = ["c2"]  # the bucket's state is saved again with the new cluster name
    out = tester.testInPandas(key, upserts)
    assert list(out["kind"]) == ["ledger_state"]
    stored = json.loads(tester.peekValueState("state", key)[0])
    assert stored["tracked"] == [67] and "67" in stored["agenda"]
