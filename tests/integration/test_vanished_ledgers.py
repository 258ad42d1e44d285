"""Vanished-ledger reconciliation: a complete FULL snapshot marks deleted only ledgers that really vanished.

The sink is driven with decision tables (what the processor hands it) against real Delta tables and the
real broker, as in test_sink_replay. One Kafka partition, so every ledger is on partition 0. Event times
are the watcher's clock: a snapshot that began at ``BEGIN`` cannot have seen a ledger vanish when an event
about that ledger (a live create during or after the scan) happened at or after ``BEGIN``.
"""

from __future__ import annotations

import pytest

from connectors.delta.tables import read_table
from streaming.sink import AuditSink, SinkConfig
from tests.integration.event_fixtures import closed_ledger_payload
from tests.integration.event_fixtures import decision_table as decisions

pytestmark = pytest.mark.integration

BEGIN = 2_000  # the snapshot's begin (event time, ms)


def complete(at_ms, snapshot_id="s2", begin_ms=BEGIN):
    payload = {
        "snapshot_id": snapshot_id,
        "mode": "FULL",
        "complete": True,
        "partition": 0,
        "partition_count": 1,
        "begin_ms": begin_ms,
    }
    return ("snapshot_complete", at_ms, None, None, payload)


def writable(*bookies, at_ms=1_000):
    return [("bookie_state", at_ms, None, b, {"status": "WRITABLE", "lost": False}) for b in bookies]


def lose(bookie, at_ms):
    return decisions(
        (
            "bookie_state",
            at_ms,
            None,
            bookie,
            {"status": "GONE", "lost": True, "missing_since_ms": at_ms - 1},
        ),
        ("bookie_lost", at_ms, None, bookie, {"missing_since_ms": at_ms - 1}),
    )


@pytest.fixture
def sink(kafka_settings, tmp_path):
    from connectors.kafka.topics import ensure_topic

    ensure_topic(kafka_settings, kafka_settings.alerts_topic, 1)
    ensure_topic(kafka_settings, kafka_settings.feedback_topic, 1)
    audit = AuditSink(SinkConfig(lakehouse_root=tmp_path / "lh", app_id="vanish-test", kafka=kafka_settings))
    yield audit
    audit.close()


def rows_by_id(sink, table="ledgers"):
    return {r["ledger_id"]: r for r in read_table(sink.config.lakehouse_root, table).to_pylist()}


def index_of(sink):
    index: dict[int, set[str]] = {}
    for row in read_table(sink.config.lakehouse_root, "ledger_bookies").to_pylist():
        index.setdefault(row["ledger_id"], set()).add(row["bookie"])
    return index


def test_ledgers_created_live_after_a_snapshot_began_stay_live_and_are_alerted_when_their_bookie_is_lost(
    sink,
):
    # Batch 0: what the job knew before the watcher restarted.
    sink.process(
        decisions(
            *writable("b1", "b2", "b3"),
            ("ledger_state", 1_000, 1, None, closed_ledger_payload(["b1", "b2"], 10)),
            ("ledger_state", 1_000, 2, None, closed_ledger_payload(["b2", "b3"], 11)),
        ),
        0,
    )
    # Batch 1 holds the restarted watcher's whole FULL snapshot and the live events after it (the job was
    # behind): ledger 5 was created during the scan after the walk passed its directory (only seen live,
    # inside the bracket); 3 and 4 were created after the snapshot ended.
    report = sink.process(
        decisions(
            ("ledger_seen", 2_010, 1, None, {"snapshot_id": "s2"}),
            ("ledger_state", 2_020, 2, None, closed_ledger_payload(["b2", "b3"], 11, snapshot_id="s2")),
            ("ledger_state", 2_030, 5, None, closed_ledger_payload(["b1", "b3"], 15)),
            complete(2_040),
            ("ledger_state", 2_050, 3, None, closed_ledger_payload(["b1", "b2"], 13)),
            ("ledger_state", 2_060, 4, None, closed_ledger_payload(["b1", "b3"], 14)),
        ),
        1,
    )
    rows = rows_by_id(sink)
    assert {i: r["deleted"] for i, r in rows.items()} == {1: False, 2: False, 3: False, 4: False, 5: False}
    assert not [a for a in report.alerts if a["state"] == "resolved"]
    index = index_of(sink)
    assert {i for i, names in index.items() if "b1" in names} == {1, 3, 4, 5}

    # A later loss of b1 reaches every live ledger on it through the index.
    loss = sink.process(lose("b1", 3_000), 2)
    assert {(a["ledger_id"], a["state"]) for a in loss.alerts if a["kind"] == "LEDGER_UNDER_REPLICATED"} == {
        (1, "firing"),
        (3, "firing"),
        (4, "firing"),
        (5, "firing"),
    }


def test_a_live_create_in_an_earlier_batch_than_the_snapshot_end_is_not_marked_deleted(sink):
    # The bracket spans batches: the live create (after the begin) is in batch 1, the END in batch 2.
    sink.process(
        decisions(
            *writable("b1", "b2"), ("ledger_state", 1_000, 1, None, closed_ledger_payload(["b1", "b2"], 10))
        ),
        0,
    )
    sink.process(
        decisions(
            ("ledger_seen", 2_010, 1, None, {"snapshot_id": "s2"}),
            ("ledger_state", 2_020, 6, None, closed_ledger_payload(["b1", "b2"], 16)),
        ),
        1,
    )
    sink.process(decisions(complete(2_500)), 2)
    assert {i: r["deleted"] for i, r in rows_by_id(sink).items()} == {1: False, 6: False}


def test_a_corrupt_ledger_reported_again_by_a_snapshot_keeps_its_metadata_corrupt_alert(sink):
    corrupt = {"reason": "bad header", "path": "/ledgers/00/0000/L0008", "mzxid": 20, "version": 0}
    first = sink.process(decisions(("ledger_corrupt", 1_000, 8, None, corrupt)), 0)
    assert [(a["kind"], a["state"]) for a in first.alerts] == [("METADATA_CORRUPT", "firing")]
    # The watcher restarts: its snapshot reads the same undecodable version again.
    again = sink.process(
        decisions(("ledger_corrupt", 2_010, 8, None, {**corrupt, "snapshot_id": "s2"}), complete(2_040)), 1
    )
    assert again.alerts == []
    row = rows_by_id(sink)[8]
    assert (row["deleted"], row["undecodable_reason"]) == (False, "bad header")
    open_now = {
        (r["ledger_id"], r["kind"]) for r in read_table(sink.config.lakehouse_root, "open_alerts").to_pylist()
    }
    assert open_now == {(8, "METADATA_CORRUPT")}


def test_a_ledger_deleted_while_the_watcher_was_down_is_marked_deleted_by_the_next_snapshot(sink):
    sink.process(
        decisions(
            *writable("b1", "b2"),
            ("ledger_state", 1_000, 1, None, closed_ledger_payload(["b1", "b2"], 10)),
            ("ledger_state", 1_000, 9, None, closed_ledger_payload(["b1", "b2"], 19)),
        ),
        0,
    )
    lost = sink.process(lose("b1", 1_500), 1)
    assert {a["ledger_id"] for a in lost.alerts if a["kind"] == "LEDGER_UNDER_REPLICATED"} == {1, 9}
    # Ledger 9 was deleted while no watcher ran: the next snapshot does not report it, nothing else does.
    report = sink.process(
        decisions(("ledger_seen", 2_010, 1, None, {"snapshot_id": "s2"}), complete(2_040)),
        2,
    )
    rows = rows_by_id(sink)
    assert (rows[1]["deleted"], rows[9]["deleted"]) == (False, True)
    assert 9 not in index_of(sink)
    # Everything open on it resolves (its lost-bookie alert and, with no rack map, its placement alert).
    assert {(a["ledger_id"], a["state"]) for a in report.alerts} == {(9, "resolved")}
    assert "LEDGER_UNDER_REPLICATED" in {a["kind"] for a in report.alerts}


def test_a_snapshot_whose_begin_the_job_did_not_read_marks_nothing_deleted(sink):
    # Without its begin the job cannot tell the bracket's events from older ones: no reconciliation.
    sink.process(
        decisions(
            *writable("b1", "b2"), ("ledger_state", 1_000, 1, None, closed_ledger_payload(["b1", "b2"], 10))
        ),
        0,
    )
    sink.process(decisions(complete(2_040, begin_ms=None)), 1)
    assert rows_by_id(sink)[1]["deleted"] is False
