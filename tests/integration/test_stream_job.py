"""The streaming job end to end on hand-built watcher events: real broker, Spark, Delta (no watcher)."""

from __future__ import annotations

import time

import pytest

from connectors.delta.tables import read_table
from connectors.kafka.topics import ensure_topic
from core import events as ev
from core.domain.rackmap import RackMap
from core.settings import Settings
from streaming import job
from tests.integration.event_fixtures import Stat, Watcher, alerts_on

pytestmark = pytest.mark.integration

BOOKIES = [f"10.0.0.{i}:3181" for i in range(1, 7)]
RACKS = {b: f"/rack{i % 3}" for i, b in enumerate(BOOKIES)}


def job_with_watcher(kafka_settings, tmp_path, *, clock_offset_ms, **stream):
    """Settings for one job on a 2-partition changes topic, and a fake watcher whose clock starts at
    now + ``clock_offset_ms`` (10 ms per event)."""
    kafka = kafka_settings.model_copy(update={"topic_partitions": 2})
    settings = Settings(
        kafka=kafka,
        lakehouse_root=tmp_path / "lh",
        checkpoint_root=tmp_path / "cp",
        stream={
            "watermark_delay_s": 0.5,
            "default_recovery_delay_s": 0,
            "timers_trigger_interval_s": 0.5,
            **stream,
        },
    )
    ensure_topic(kafka, kafka.changes_topic, partitions=2)
    t0 = int(time.time() * 1000) + clock_offset_ms
    clock = iter(range(t0, t0 + 10**9, 10))
    return settings, Watcher(kafka, lambda: next(clock)), t0


def run_once(spark, settings):
    query, sink = job.start(spark, settings, available_now=True)
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    sink.close()
    return sink


def counted(sink, name):
    """The nonzero samples of one of the sink's counters in the job's registry: label values → count."""
    family = next(f for f in sink.metrics.registry.collect() if f.name == name)
    return {
        tuple(sample.labels.values()): sample.value
        for sample in family.samples
        if sample.name == f"{name}_total" and sample.value
    }


def test_lost_bookie_fans_out_to_exactly_its_ledgers_and_resolves_when_it_returns(
    spark, kafka_settings, tmp_path
):
    settings, watcher, t0 = job_with_watcher(kafka_settings, tmp_path, clock_offset_ms=-60_000)
    kafka = settings.kafka
    watcher.send(ev.rack_map_event("file:/racks.json", RackMap.from_racks(RACKS), present=True))
    for bookie in BOOKIES:
        watcher.bookie(bookie, "WRITABLE")
    watcher.ledger(1, BOOKIES[0:3])  # names b1
    watcher.ledger(2, BOOKIES[1:4])
    watcher.ledger(3, [BOOKIES[0], BOOKIES[3], BOOKIES[4]], wq=1, aq=1)  # WQ=1: losing b1 loses data
    watcher.ledger(4, [BOOKIES[0], BOOKIES[3]], closed=False)  # open ledgers count too
    watcher.send(ev.ledger_undecodable(5, "/ledgers/L5", Stat(1, 1, 0, 0, 0, 3), "bad header"))
    watcher.heartbeat(t0 + 50_000)
    watcher.flush()
    sink = run_once(spark, settings)
    # Healthy, well-placed cluster: only the corrupt znode is flagged.
    assert [(a["kind"], a["ledger_id"], a["state"]) for _, a in alerts_on(kafka)] == [
        ("METADATA_CORRUPT", 5, "firing")
    ]
    # The job's metrics count what its sink did (each start has a fresh registry).
    assert counted(sink, "bkaudit_stream_alert_transitions") == {("METADATA_CORRUPT", "firing"): 1}
    assert counted(sink, "bkaudit_stream_dead_letters") == {("znode",): 1}
    assert counted(sink, "bkaudit_stream_ledgers_written") == {(): 5}
    assert counted(sink, "bkaudit_stream_probes") == {}  # no scrutiny, no suspect
    assert sink.metrics.registry.get_sample_value("bkaudit_stream_sink_duration_seconds_count") >= 1

    watcher.bookie(BOOKIES[0], "GONE")
    watcher.heartbeat(t0 + 55_000)
    watcher.flush()
    sink = run_once(spark, settings)
    firing = {(a["kind"], a["ledger_id"]) for _, a in alerts_on(kafka) if a["state"] == "firing"}
    assert firing == {
        ("METADATA_CORRUPT", 5),
        ("BOOKIE_LOST", None),
        ("LEDGER_UNDER_REPLICATED", 1),
        ("LEDGER_UNRECOVERABLE", 3),
        ("LEDGER_UNDER_REPLICATED", 4),
    }
    ledgers = {r["ledger_id"]: r for r in read_table(settings.lakehouse_root, "ledgers").to_pylist()}
    assert ledgers[1]["pulsar_topic"] == "persistent://public/default/t1"
    assert ledgers[1]["placement"] == "MEETS_STRICT"
    bookies = {r["bookie_id"]: r for r in read_table(settings.lakehouse_root, "bookies").to_pylist()}
    assert bookies[BOOKIES[0]]["lost"] is True and bookies[BOOKIES[1]]["status"] == "WRITABLE"
    open_kinds = sorted(read_table(settings.lakehouse_root, "open_alerts").column("kind").to_pylist())
    assert len(open_kinds) == 5
    fired = {
        ("BOOKIE_LOST", "firing"): 1,
        ("LEDGER_UNDER_REPLICATED", "firing"): 2,
        ("LEDGER_UNRECOVERABLE", "firing"): 1,
    }
    assert counted(sink, "bkaudit_stream_alert_transitions") == fired
    assert sink.metrics.registry.get_sample_value("bkaudit_num_under_replicated_ledgers") == 2

    watcher.bookie(BOOKIES[0], "WRITABLE")
    watcher.heartbeat(t0 + 58_000)
    watcher.flush()
    sink = run_once(spark, settings)
    alerts = [a for _, a in alerts_on(kafka)]
    resolved = {(a["kind"], a["ledger_id"]) for a in alerts if a["state"] == "resolved"}
    assert resolved == firing - {("METADATA_CORRUPT", 5)}
    assert counted(sink, "bkaudit_stream_alert_transitions") == {
        (kind, "resolved"): count for (kind, _), count in fired.items()
    }
    by_id = {}
    for alert in alerts:
        by_id.setdefault(alert["alert_id"], []).append(alert["state"])
    assert all(states in (["firing"], ["firing", "resolved"]) for states in by_id.values())
    violations = read_table(settings.lakehouse_root, "violations").num_rows
    assert violations == len(alerts)
    dead = read_table(settings.lakehouse_root, "dead_letters").to_pylist()
    assert [(d["source"], d["ledger_id"]) for d in dead] == [("znode", 5)]


def test_undecodable_records_reach_dead_letters_even_behind_the_watermark(spark, kafka_settings, tmp_path):
    # The watcher's clock runs an hour ahead of the broker's: every garbage record's Kafka timestamp is far
    # behind the watermark, which must not drop it (dead letters carry no watermark time).
    from bkaudit.testing.kafka_io import produce

    settings, watcher, t0 = job_with_watcher(kafka_settings, tmp_path, clock_offset_ms=3_600_000)
    # Allowed: this watcher's clock is known to run ahead (without it, its events would be dead letters).
    stream = settings.stream.model_copy(update={"max_event_time_skew_s": 7200})
    settings = settings.model_copy(update={"stream": stream})
    kafka = settings.kafka
    watcher.bookie(BOOKIES[0], "WRITABLE")
    watcher.ledger(1, BOOKIES[0:3])
    watcher.heartbeat(t0 + 60_000)
    watcher.flush()
    run_once(spark, settings)  # the watermark is now ~t0 + 60 s
    garbage = [b"\xff\x00not a change event", b""]
    produce(kafka, kafka.changes_topic, [(b"ledger/9", value, 1) for value in garbage])  # exact ends
    watcher.ledger(2, BOOKIES[1:4])  # and processing goes on around them
    watcher.heartbeat(t0 + 61_000)
    watcher.flush()
    sink = run_once(spark, settings)
    dead = read_table(settings.lakehouse_root, "dead_letters").to_pylist()
    assert sorted((d["source"], d["topic"], d["partition"]) for d in dead) == [
        ("kafka", kafka.changes_topic, 1),
        ("kafka", kafka.changes_topic, 1),
    ]
    assert all(d["reason"] for d in dead)
    assert counted(sink, "bkaudit_stream_dead_letters") == {("kafka",): 2}
    ledgers = {r["ledger_id"] for r in read_table(settings.lakehouse_root, "ledgers").to_pylist()}
    assert ledgers == {1, 2}


def test_driver_lane_sends_a_marked_ledger_through_the_timers_query_to_its_stuck_alert(
    spark, kafka_settings, tmp_path
):
    """With the driver-run ledger lane, the grace timer of an under-replication mark still fires: the lane
    forwards the mark and the heartbeats to the timers query, whose decision comes back through the
    decisions topic. The ledger's later versions reach the timers query too (it is tracked), while an
    untracked ledger's changes never leave the lane."""
    from bkaudit.testing.kafka_io import read_topic

    settings, watcher, t0 = job_with_watcher(
        kafka_settings, tmp_path, clock_offset_ms=-60_000, under_replication_grace_s=2
    )
    kafka = settings.kafka
    watcher.send(ev.rack_map_event("file:/racks.json", RackMap.from_racks(RACKS), present=True))
    for bookie in BOOKIES:
        watcher.bookie(bookie, "WRITABLE")
    watcher.ledger(1, BOOKIES[0:3])
    watcher.ledger(2, BOOKIES[1:4])
    watcher.mark_under_replicated(1, [BOOKIES[0]], ctime_ms=t0 + 1_000)
    watcher.heartbeat(t0 + 2_000)
    watcher.flush()
    run_once(spark, settings)  # the lane applies both ledgers and forwards the mark
    assert not [a for _, a in alerts_on(kafka) if a["kind"] == "UNDER_REPLICATION_STUCK"]  # grace not over
    watcher.ledger(1, BOOKIES[0:3])  # a new version of the tracked ledger
    watcher.ledger(2, BOOKIES[1:4])
    watcher.heartbeat(t0 + 10_000)  # past the grace: the timer fires in the timers query
    watcher.flush()
    run_once(spark, settings)  # an available-now run settles the loop: lane → timers → decisions → lane
    stuck = [a for _, a in alerts_on(kafka) if a["kind"] == "UNDER_REPLICATION_STUCK"]
    assert [(a["ledger_id"], a["state"]) for a in stuck] == [(1, "firing")]
    forwarded = [r.key for r in read_topic(kafka, kafka.tracked_topic, 10)]
    assert b"ledger/1" in forwarded and b"ledger/2" not in forwarded
    ledgers = {r["ledger_id"] for r in read_table(settings.lakehouse_root, "ledgers").to_pylist()}
    assert ledgers == {1, 2}


def test_a_running_driver_lane_tails_its_topics_and_its_timers_fire(spark, kafka_settings, tmp_path):
    """The long-running job with the driver-run ledger lane: changes published while it runs are planned from
    its tailing consumer and applied, and a mark's grace timer fires through the timers query."""
    settings, watcher, t0 = job_with_watcher(
        kafka_settings, tmp_path, clock_offset_ms=-60_000, under_replication_grace_s=2
    )
    kafka = settings.kafka
    query, sink = job.start(spark, settings)
    try:
        watcher.send(ev.rack_map_event("file:/racks.json", RackMap.from_racks(RACKS), present=True))
        for bookie in BOOKIES:
            watcher.bookie(bookie, "WRITABLE")
        for ledger_id in range(1, 21):
            watcher.ledger(ledger_id, BOOKIES[ledger_id % 4 : ledger_id % 4 + 3])
        watcher.mark_under_replicated(3, [BOOKIES[3]], ctime_ms=t0 + 1_000)
        watcher.heartbeat(t0 + 2_000)
        watcher.flush()
        deadline = time.monotonic() + 120
        stuck: list = []
        while time.monotonic() < deadline and not stuck:
            watcher.heartbeat(t0 + 10_000)  # the watermark passes the grace
            watcher.flush()
            time.sleep(1.0)
            assert query.exception() is None, query.exception()
            stuck = [a for _, a in alerts_on(kafka, 5) if a["kind"] == "UNDER_REPLICATION_STUCK"]
        assert [(a["ledger_id"], a["state"]) for a in stuck] == [(3, "firing")]
        query.processAllAvailable()
        ledgers = {r["ledger_id"] for r in read_table(settings.lakehouse_root, "ledgers").to_pylist()}
        assert ledgers == set(range(1, 21))
        assert query.ledgers.recentProgress, "the lane ran batches"
    finally:
        job.stop_gracefully(query, sink)
        sink.close()


def test_a_kill_while_spark_planned_its_first_batch_does_not_block_the_restart(
    spark, kafka_settings, tmp_path
):
    """A kill before Spark renamed batch 0's offsets into place leaves its temporary file; Spark then refuses
    the query as a new one with a non-empty checkpoint, at every restart. The job starts and applies."""
    settings, watcher, _ = job_with_watcher(kafka_settings, tmp_path, clock_offset_ms=0)
    app = settings.checkpoint_root / settings.stream.app_id
    job.check_state_layout(app, settings.stream)  # the killed first start had recorded its layout
    query_checkpoint = app / "timers"  # the timers query: the application's Spark query
    offsets = query_checkpoint / "offsets"
    offsets.mkdir(parents=True)
    (offsets / ".0.be34dc68-a11c-46fd-a5ec-3d2134fb9a14.tmp").touch()  # what the kill left (the test's run)
    (offsets / "..0.be34dc68-a11c-46fd-a5ec-3d2134fb9a14.tmp.crc").write_bytes(b"crc\x00\x00\x00\x02")
    watcher.ledger(1, BOOKIES[0:3])
    watcher.flush()
    run_once(spark, settings)
    assert [r["ledger_id"] for r in read_table(settings.lakehouse_root, "ledgers").to_pylist()] == [1]
    assert any(p.name.isdigit() for p in offsets.iterdir())  # the query planned its own batch 0 there


def test_a_ledger_is_probed_when_it_closes_not_when_first_seen_closed(spark, kafka_settings, tmp_path):
    # No background walk: only a ledger's close starts a probe. Nothing listens on these ports, so each
    # probe is refused at once (a failing check, which is enough to see it ran).
    settings, watcher, t0 = job_with_watcher(
        kafka_settings, tmp_path, clock_offset_ms=-60_000, scrutiny_ledgers_per_s=0, probe_timeout_s=0.5
    )
    bookies = [f"127.0.0.1:{port}" for port in (1, 2, 3)]
    for bookie in bookies:
        watcher.bookie(bookie, "WRITABLE")
    watcher.ledger(1, bookies)  # first seen closed (a snapshot at start-up): the walk's, not a close
    watcher.ledger(2, bookies, closed=False)
    watcher.heartbeat(t0 + 50_000)
    watcher.flush()
    assert counted(run_once(spark, settings), "bkaudit_stream_probes") == {}

    watcher.ledger(2, bookies)  # the writer closes it
    watcher.heartbeat(t0 + 51_000)
    watcher.flush()
    sink = run_once(spark, settings)
    probed = counted(sink, "bkaudit_stream_probes")
    assert set(probed) == {("scrutiny", "failing")} and probed[("scrutiny", "failing")] == 1, probed
    walk = (settings.checkpoint_root / settings.stream.app_id / "sink" / "scrutiny.json").read_text()
    assert '"cursor": -1' in walk  # the walk's position is kept beside the lanes' (it never moved)


def test_a_bookie_ledgers_name_that_never_registered_is_lost_through_the_lanes(
    spark, kafka_settings, tmp_path
):
    settings, watcher, t0 = job_with_watcher(
        kafka_settings, tmp_path, clock_offset_ms=-60_000, scrutiny_ledgers_per_s=0, scrutiny_on_close=False
    )
    for bookie in BOOKIES[:3]:
        watcher.bookie(bookie, "WRITABLE")
    watcher.ledger(1, [BOOKIES[0], "10.0.0.99:3181", BOOKIES[1]])  # no registration, no cookie
    watcher.ledger(2, BOOKIES[:3])
    watcher.heartbeat(t0 + 50_000)  # the membership lane has read every registration up to here
    watcher.flush()
    run_once(spark, settings)
    firing = {
        (a["kind"], a["ledger_id"], a["bookies"][0] if a["bookies"] else None)
        for _, a in alerts_on(settings.kafka)
        if a["state"] == "firing"
    }
    assert ("BOOKIE_LOST", None, "10.0.0.99:3181") in firing
    at_risk = {(kind, ledger) for kind, ledger, _ in firing if kind.startswith("LEDGER_")}
    assert at_risk == {("LEDGER_UNDER_REPLICATED", 1)}  # (no rack map here: placement alerts aside)
