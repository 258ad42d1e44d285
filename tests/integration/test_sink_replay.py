"""The sink is replay-safe: re-running a batch id (after a crash) changes no table and keeps alert ids."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from connectors.delta.tables import TABLES, read_table, table_path
from streaming.decode import ledger_payload  # noqa: F401  (the payload shape the sink consumes)
from streaming.sink import AuditSink, SinkConfig
from tests.integration.event_fixtures import closed_ledger_payload
from tests.integration.event_fixtures import decision_table as decisions

pytestmark = pytest.mark.integration


def versions(root):
    return {name: DeltaTable(table_path(root, name)).version() for name in TABLES}


def test_replaying_a_batch_is_a_no_op_on_tables_and_republishes_the_same_alert_ids(kafka_settings, tmp_path):
    config = SinkConfig(lakehouse_root=tmp_path / "lh", app_id="replay-test", kafka=kafka_settings)
    from connectors.kafka.topics import ensure_topic

    ensure_topic(kafka_settings, kafka_settings.alerts_topic, 1)
    sink = AuditSink(config)
    setup = decisions(
        ("bookie_state", 1_000, None, "b1", {"status": "WRITABLE", "lost": False}),
        ("bookie_state", 1_000, None, "b2", {"status": "WRITABLE", "lost": False}),
        ("bookie_state", 1_000, None, "b3", {"status": "WRITABLE", "lost": False}),
        ("ledger_state", 1_000, 1, None, closed_ledger_payload(["b1", "b2", "b3"], 10)),
        ("ledger_state", 1_000, 2, None, closed_ledger_payload(["b2", "b3", "b1"], 11)),
    )
    sink.process(setup, 0)
    loss = decisions(
        ("bookie_state", 2_000, None, "b1", {"status": "GONE", "lost": True, "missing_since_ms": 1_500}),
        ("bookie_lost", 2_000, None, "b1", {"missing_since_ms": 1_500}),
    )
    first = sink.process(loss, 1)
    state_after_first = {name: read_table(tmp_path / "lh", name).to_pylist() for name in TABLES}
    tables_after_first = versions(tmp_path / "lh")

    # The job crashed after the batch committed; Spark runs batch 1 again with the same input.
    replayed = AuditSink(config).process(loss, 1)
    assert versions(tmp_path / "lh") == tables_after_first
    assert {name: read_table(tmp_path / "lh", name).to_pylist() for name in TABLES} == state_after_first
    # It decided from the state before batch 1, so it publishes the very same transitions (same ids).
    assert [(a["alert_id"], a["state"]) for a in replayed.alerts] == [
        (a["alert_id"], a["state"]) for a in first.alerts
    ]
    assert {a["kind"] for a in first.alerts} == {"BOOKIE_LOST", "LEDGER_UNDER_REPLICATED"}
    assert sorted(a["ledger_id"] for a in first.alerts if a["ledger_id"] is not None) == [1, 2]
    assert replayed.skipped_replay_tables > 0


def test_a_crash_between_table_commits_ends_in_the_same_tables_after_replay(
    kafka_settings, tmp_path, monkeypatch
):
    from connectors.delta import tables as delta_tables
    from connectors.kafka.topics import ensure_topic

    ensure_topic(kafka_settings, kafka_settings.alerts_topic, 1)
    rows = [
        ("bookie_state", 1_000, None, b, {"status": "WRITABLE", "lost": False}) for b in ("b1", "b2", "b3")
    ] + [
        ("ledger_state", 1_000, i, None, closed_ledger_payload(["b1", "b2", "b3"], 10 + i))
        for i in range(1, 6)
    ]
    loss = decisions(
        ("bookie_state", 2_000, None, "b1", {"status": "GONE", "lost": True, "missing_since_ms": 1_500}),
        ("bookie_lost", 2_000, None, "b1", {"missing_since_ms": 1_500}),
        (
            "ledger_state",
            2_000,
            3,
            None,
            closed_ledger_payload(["b4", "b2", "b3"], 20),
        ),  # re-replicated in the same batch
    )

    def run(root, crash_on=None):
        config = SinkConfig(lakehouse_root=root, app_id="crash-test", kafka=kafka_settings)
        AuditSink(config).process(decisions(*rows), 0)
        if crash_on is not None:
            original = delta_tables.BatchWriter.replace_keys

            def crash(self, name, *args, **kwargs):
                if name == crash_on:
                    raise RuntimeError("SIGKILL")
                return original(self, name, *args, **kwargs)

            with monkeypatch.context() as patch:
                patch.setattr(delta_tables.BatchWriter, "replace_keys", crash)
                with pytest.raises(RuntimeError):
                    AuditSink(config).process(loss, 1)
        return AuditSink(config).process(loss, 1)

    clean = run(tmp_path / "clean")
    crashed = run(tmp_path / "crashed", crash_on="open_alerts")  # ledgers and the index were already written
    for name in TABLES:
        assert sorted(map(str, read_table(tmp_path / "crashed", name).to_pylist())) == sorted(
            map(str, read_table(tmp_path / "clean", name).to_pylist())
        ), name
    assert [(a["alert_id"], a["state"]) for a in crashed.alerts] == [
        (a["alert_id"], a["state"]) for a in clean.alerts
    ]
    assert sorted(a["ledger_id"] for a in clean.alerts if a["ledger_id"]) == [
        1,
        2,
        4,
        5,
    ]  # not 3: it moved off b1


def test_the_sink_drops_duplicate_and_older_ledger_versions_but_snapshots_still_see_them(
    kafka_settings, tmp_path
):
    # The processor keeps state only for suspect ledgers, so version dedupe is the sink's, from the rows.
    from connectors.kafka.topics import ensure_topic

    ensure_topic(kafka_settings, kafka_settings.alerts_topic, 1)
    root = tmp_path / "lh"
    sink = AuditSink(SinkConfig(lakehouse_root=root, app_id="dedupe-test", kafka=kafka_settings))
    bookies = [("bookie_state", 1_000, None, b, {"status": "WRITABLE", "lost": False}) for b in ("b1", "b2")]
    sink.process(
        decisions(*bookies, ("ledger_state", 1_000, 1, None, closed_ledger_payload(["b1", "b2"], 10))), 0
    )
    older = {**closed_ledger_payload(["b2", "b1"], 9), "snapshot_id": "snap-1"}
    duplicate = {**closed_ledger_payload(["b2", "b1"], 10), "snapshot_id": "snap-1"}
    report = sink.process(
        decisions(("ledger_state", 2_000, 1, None, older), ("ledger_state", 2_001, 1, None, duplicate)), 1
    )
    row = read_table(root, "ledgers").to_pylist()[0]
    assert (row["mzxid"], [s["ensemble"] for s in row["segments"]]) == (10, [["b1", "b2"]])
    assert report.ledgers_written == 0
    seen = read_table(root, "snapshot_seen").to_pylist()
    assert {(r["snapshot_id"], r["ledger_id"]) for r in seen} == {("snap-1", 1)}
    # After a delete the last version is stale (a late copy), a newer one re-creates the ledger.
    sink.process(decisions(("ledger_deleted", 3_000, 1, None, {"last_mzxid": 10, "inferred": False})), 2)
    sink.process(decisions(("ledger_deleted", 3_001, 1, None, {"last_mzxid": 10, "inferred": False})), 3)
    sink.process(decisions(("ledger_state", 3_002, 1, None, closed_ledger_payload(["b1", "b2"], 10))), 4)
    row = read_table(root, "ledgers").to_pylist()[0]
    assert (row["deleted"], row["mzxid"]) == (True, 10)
    sink.process(decisions(("ledger_state", 4_000, 1, None, closed_ledger_payload(["b1", "b2"], 13))), 5)
    row = read_table(root, "ledgers").to_pylist()[0]
    assert (row["deleted"], row["mzxid"]) == (False, 13)


def test_open_alerts_are_reread_only_when_the_table_moved_on(kafka_settings, tmp_path, monkeypatch):
    # After its own batch the sink keeps the open alerts in memory with the table version they match; a
    # table changed behind its back (compaction, another writer, a replayed batch) is read again. Commits of
    # the loss owner (streaming.loss, whose kinds the sink leaves out) do not count as changes; the loss
    # owner reads the table once, at its first call, and keeps its kinds in memory from then on.
    from connectors.kafka.topics import ensure_topic
    from core.domain import alert_book

    ensure_topic(kafka_settings, kafka_settings.alerts_topic, 1)
    reads = []
    original = alert_book.AlertBook.from_rows.__func__
    monkeypatch.setattr(
        alert_book.AlertBook,
        "from_rows",
        classmethod(lambda cls, cluster, rows: reads.append(1) or original(cls, cluster, rows)),
    )
    root = tmp_path / "lh"
    sink = AuditSink(SinkConfig(lakehouse_root=root, app_id="cache-test", kafka=kafka_settings))
    bookies = [("bookie_state", 1_000, None, b, {"status": "WRITABLE", "lost": False}) for b in ("b1", "b2")]
    sink.process(
        decisions(*bookies, ("ledger_state", 1_000, 1, None, closed_ledger_payload(["b1", "b2"], 10))), 0
    )
    lost = decisions(
        ("bookie_state", 2_000, None, "b1", {"status": "GONE", "lost": True, "missing_since_ms": 1_500}),
        ("bookie_lost", 2_000, None, "b1", {"missing_since_ms": 1_500}),
    )
    assert len(reads) == 2  # the sink's read and the loss owner's
    first = sink.process(lost, 1)
    assert {a["kind"] for a in first.alerts} == {"BOOKIE_LOST", "LEDGER_UNDER_REPLICATED"}
    assert len(reads) == 2  # only the first batch read the table; the second reused what the first left
    back = decisions(
        ("bookie_state", 3_000, None, "b1", {"status": "WRITABLE", "lost": False}),
        ("bookie_returned", 3_000, None, "b1", {"missing_since_ms": 1_500}),
    )
    resolved = sink.process(back, 2)
    assert len(reads) == 2  # from memory again, after the second batch's own write
    assert {(a["kind"], a["state"]) for a in resolved.alerts} == {
        ("BOOKIE_LOST", "resolved"),
        ("LEDGER_UNDER_REPLICATED", "resolved"),
    }
    # The table moves on behind the sink's back: the next batch reads it again.
    DeltaTable(table_path(root, "open_alerts")).optimize.compact()
    DeltaTable(table_path(root, "open_alerts")).delete("true")
    sink.process(decisions(("bookie_state", 4_000, None, "b2", {"status": "WRITABLE", "lost": False})), 3)
    assert len(reads) == 3
    assert read_table(root, "open_alerts").num_rows == 0


def test_a_loss_checks_only_the_lost_bookie_rule_and_a_rack_move_rechecks_placement(kafka_settings, tmp_path):
    # The ledgers a loss reaches through the index keep their placement (metadata and racks did not change):
    # their rows are not rewritten and their placement alerts stay as they were. A rack move in a later
    # batch re-checks the placement of exactly the ledgers on the moved bookie.
    from connectors.kafka.topics import ensure_topic

    ensure_topic(kafka_settings, kafka_settings.alerts_topic, 1)
    root = tmp_path / "lh"
    sink = AuditSink(SinkConfig(lakehouse_root=root, app_id="loss-only-test", kafka=kafka_settings))
    racks = {"b1": "/r1", "b2": "/r1", "b3": "/r2", "b4": "/r2"}
    setup = decisions(
        ("rack_map", 1_000, None, None, {"racks": racks, "moved": []}),
        *[("bookie_state", 1_000, None, b, {"status": "WRITABLE", "lost": False}) for b in racks],
        ("ledger_state", 1_000, 1, None, closed_ledger_payload(["b1", "b2"], 10)),  # one rack: not adhering
        ("ledger_state", 1_000, 2, None, closed_ledger_payload(["b1", "b3"], 11)),
        ("ledger_state", 1_000, 3, None, closed_ledger_payload(["b3", "b4"], 12)),  # one rack, not on b1
    )
    placed = sink.process(setup, 0)
    assert {(a["ledger_id"], a["kind"]) for a in placed.alerts} == {
        (1, "PLACEMENT_NOT_ADHERING"),
        (3, "PLACEMENT_NOT_ADHERING"),
    }
    ledgers_version = DeltaTable(table_path(root, "ledgers")).version()

    loss = sink.process(
        decisions(
            ("bookie_state", 2_000, None, "b1", {"status": "GONE", "lost": True, "missing_since_ms": 1_500}),
            ("bookie_lost", 2_000, None, "b1", {"missing_since_ms": 1_500}),
        ),
        1,
    )
    assert {(a["ledger_id"], a["kind"], a["state"]) for a in loss.alerts} == {
        (None, "BOOKIE_LOST", "firing"),
        (1, "LEDGER_UNDER_REPLICATED", "firing"),
        (2, "LEDGER_UNDER_REPLICATED", "firing"),
    }
    assert DeltaTable(table_path(root, "ledgers")).version() == ledgers_version  # no ledger row rewritten
    open_now = {(r["ledger_id"], r["kind"]) for r in read_table(root, "open_alerts").to_pylist()}
    assert {(1, "PLACEMENT_NOT_ADHERING"), (3, "PLACEMENT_NOT_ADHERING")} <= open_now

    moved = sink.process(
        decisions(
            ("rack_map", 3_000, None, None, {"racks": {**racks, "b2": "/r2"}, "moved": ["b2"]}),
            ("bookie_state", 3_000, None, "b1", {"status": "WRITABLE", "lost": False}),
            ("bookie_returned", 3_000, None, "b1", {"missing_since_ms": 1_500}),
        ),
        2,
    )
    assert {(a["ledger_id"], a["kind"], a["state"]) for a in moved.alerts} == {
        (None, "BOOKIE_LOST", "resolved"),
        (1, "LEDGER_UNDER_REPLICATED", "resolved"),
        (2, "LEDGER_UNDER_REPLICATED", "resolved"),
        (1, "PLACEMENT_NOT_ADHERING", "resolved"),  # b2 moved: ledger 1 now spans two racks
    }
    rows = {r["ledger_id"]: r for r in read_table(root, "ledgers").to_pylist()}
    assert rows[1]["placement"] == "MEETS_STRICT" and rows[3]["placement"] == "FAIL"
    assert rows[1]["segments"] and rows[1]["custom_metadata"] == []  # the whole row, not the loss's columns


def test_index_rows_without_the_copied_columns_fall_back_to_the_ledgers_table(kafka_settings, tmp_path):
    # Index rows written before ledger_bookies carried the ledger columns have nulls there; a loss reads those
    # ledgers from the ledgers table instead, with the same verdicts.
    from connectors.delta.tables import LEDGER_BOOKIES, BatchWriter
    from connectors.kafka.topics import ensure_topic

    ensure_topic(kafka_settings, kafka_settings.alerts_topic, 1)
    root = tmp_path / "lh"
    sink = AuditSink(SinkConfig(lakehouse_root=root, app_id="fallback-test", kafka=kafka_settings))
    bookies = [("bookie_state", 1_000, None, b, {"status": "WRITABLE", "lost": False}) for b in ("b1", "b2")]
    one_copy = {**closed_ledger_payload(["b1"], 11), "ensemble_size": 1, "write_quorum": 1, "ack_quorum": 1}
    sink.process(
        decisions(
            *bookies,
            ("ledger_state", 1_000, 1, None, closed_ledger_payload(["b1", "b2"], 10)),
            ("ledger_state", 1_000, 2, None, one_copy),
        ),
        0,
    )
    copied = read_table(root, "ledger_bookies").to_pylist()
    assert {r["state"] for r in copied} == {"CLOSED"} and all(r["segments"] for r in copied)
    old_style = [{"bookie": r["bookie"], "ledger_id": r["ledger_id"], "mzxid": r["mzxid"]} for r in copied]
    BatchWriter(root, "an older bkaudit", 0).replace_keys(
        "ledger_bookies", "ledger_id", [1, 2], pa.Table.from_pylist(old_style, schema=LEDGER_BOOKIES.schema)
    )
    loss = sink.process(
        decisions(
            ("bookie_state", 2_000, None, "b1", {"status": "GONE", "lost": True, "missing_since_ms": 1_500}),
            ("bookie_lost", 2_000, None, "b1", {"missing_since_ms": 1_500}),
        ),
        1,
    )
    assert {(a["ledger_id"], a["kind"]) for a in loss.alerts} == {
        (None, "BOOKIE_LOST"),
        (1, "LEDGER_UNDER_REPLICATED"),
        (2, "LEDGER_UNRECOVERABLE"),  # WQ=1 on the lost bookie: read from the ledgers table, judged the same
    }
