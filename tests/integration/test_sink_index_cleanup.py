"""Per-batch costs bounded by time: the index cleanup runs at most every ``index_cleanup_interval_s``, and the
Delta handles the sink keeps open between batches still see every other writer's commits."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from connectors.delta.tables import BatchWriter, OpenTables, ensure_tables, read_table, table_path
from streaming.sink import AuditSink, SinkConfig
from tests.integration.event_fixtures import closed_ledger_payload
from tests.integration.event_fixtures import decision_table as decisions

pytestmark = pytest.mark.integration


def raw_index(root) -> list[tuple[str, int, int]]:
    rows = DeltaTable(table_path(root, "ledger_bookies")).to_pyarrow_table().to_pylist()
    return sorted((r["bookie"], r["ledger_id"], r["mzxid"]) for r in rows)


def current_index(root) -> list[tuple[str, int, int]]:
    return sorted(
        (r["bookie"], r["ledger_id"], r["mzxid"]) for r in read_table(root, "ledger_bookies").to_pylist()
    )


def new_version(at_ms: int, ledger_id: int, bookies: list[str], mzxid: int) -> pa.Table:
    return decisions(("ledger_state", at_ms, ledger_id, None, closed_ledger_payload(bookies, mzxid)))


def sink_on_a_clock(kafka_settings, tmp_path, **config) -> tuple[AuditSink, list[float], Any]:
    """A sink with ``config`` on ``tmp_path/lh``, whose clock reads ``now[0]`` (from 100 s; the test moves
    it): the sink, ``now`` and the lakehouse root."""
    from connectors.kafka.topics import ensure_topic

    ensure_topic(kafka_settings, kafka_settings.alerts_topic, 1)
    root, now = tmp_path / "lh", [100.0]
    sink = AuditSink(SinkConfig(lakehouse_root=root, kafka=kafka_settings, **config), clock=lambda: now[0])
    return sink, now, root


def test_batches_inside_the_cleanup_interval_leave_old_index_rows_and_the_first_after_it_cleans(
    kafka_settings, tmp_path
):
    sink, now, root = sink_on_a_clock(
        kafka_settings,
        tmp_path,
        app_id="cleanup-test",
        index_cleanup_bookies_per_batch=10,  # one run cleans every partition
        index_cleanup_interval_s=5.0,
    )
    sink.process(new_version(1_000, 1, ["b1", "b2", "b3"], 10), 0)  # the first batch's run: nothing old yet
    now[0] = 101.0
    sink.process(new_version(2_000, 1, ["b4", "b2", "b3"], 11), 1)
    now[0] = 104.9
    sink.process(new_version(3_000, 2, ["b1", "b2", "b3"], 12), 2)
    old = [("b1", 1, 10), ("b2", 1, 10), ("b3", 1, 10)]
    assert set(old) <= set(raw_index(root))  # inside the interval: no batch cleaned
    current = [("b1", 2, 12), ("b2", 1, 11), ("b2", 2, 12), ("b3", 1, 11), ("b3", 2, 12), ("b4", 1, 11)]
    assert current_index(root) == current  # readers skip the old rows meanwhile
    now[0] = 105.1
    sink.process(new_version(4_000, 3, ["b1", "b2", "b3"], 13), 3)  # the first batch after the interval
    current += [("b1", 3, 13), ("b2", 3, 13), ("b3", 3, 13)]
    assert raw_index(root) == sorted(current)
    assert current_index(root) == sorted(current)


def test_a_batch_after_several_cleanup_intervals_cleans_a_partition_per_interval(kafka_settings, tmp_path):
    # Behind a backlog a batch takes tens of seconds: one partition per batch would clean the index more
    # slowly than the churn fills it with old rows.
    sink, now, root = sink_on_a_clock(
        kafka_settings,
        tmp_path,
        app_id="cleanup-pace-test",
        index_cleanup_bookies_per_batch=1,
        index_cleanup_interval_s=5.0,
        index_append_interval_s=0.0,
    )
    first = [(1, ["b1", "b2", "b3"]), (2, ["b4", "b5", "b6"])]
    sink.process(pa.concat_tables([new_version(1_000, i, b, 10) for i, b in first]), 0)
    now[0] = 100.1
    sink.process(pa.concat_tables([new_version(2_000, i, b, 11) for i, b in first]), 1)
    assert len(raw_index(root)) == 12  # six old rows, one in each partition
    now[0] = 150.0  # ten intervals later
    sink.process(new_version(3_000, 3, ["b7", "b8", "b9"], 12), 2)
    assert raw_index(root) == current_index(root)  # every partition with an old row cleaned at once
    assert len(raw_index(root)) == 9


def test_a_kept_table_handle_sees_another_writers_commit_and_skips_a_batch_already_there(tmp_path):
    ensure_tables(tmp_path)
    tables = OpenTables(tmp_path)
    row = pa.table({"source": ["x"], "reason": ["r"]})
    assert BatchWriter(tmp_path, "app", 0, tables).append("dead_letters", row)
    assert BatchWriter(tmp_path, "app", 1).append("dead_letters", row)  # another writer, its own handle
    # The kept handle was opened before batch 1 was committed: it must see it, or batch 1 lands twice.
    assert not BatchWriter(tmp_path, "app", 1, tables).append("dead_letters", row)
    assert tables.get("dead_letters").version() == DeltaTable(table_path(tmp_path, "dead_letters")).version()
    assert read_table(tmp_path, "dead_letters").num_rows == 2


def test_batches_inside_the_append_interval_are_indexed_from_memory_then_appended_in_one_commit(
    kafka_settings, tmp_path
):
    sink, now, root = sink_on_a_clock(
        kafka_settings,
        tmp_path,
        app_id="append-test",
        index_append_interval_s=5.0,
        index_cleanup_interval_s=1000.0,  # no cleanup after the first batch's: only the appends commit
    )
    sink.process(new_version(1_000, 1, ["b1", "b2", "b3"], 10), 0)  # the first batch appends
    appended = DeltaTable(table_path(root, "ledger_bookies")).version()
    for batch_id, (at, ledger_id, bookies, mzxid) in enumerate(
        [
            (101.0, 2, ["b1", "b2", "b4"], 11),
            (102.0, 1, ["b4", "b2", "b3"], 12),
            (104.9, 3, ["b1", "b3", "b4"], 13),
        ],
        start=1,
    ):
        now[0] = at
        sink.process(new_version(int(at * 10), ledger_id, bookies, mzxid), batch_id)
    current = sorted(
        [(b, 1, 12) for b in ("b4", "b2", "b3")]
        + [(b, 2, 11) for b in ("b1", "b2", "b4")]
        + [(b, 3, 13) for b in ("b1", "b3", "b4")]
    )
    assert DeltaTable(table_path(root, "ledger_bookies")).version() == appended  # inside the interval
    assert raw_index(root) == [("b1", 1, 10), ("b2", 1, 10), ("b3", 1, 10)]
    assert current_index(root) == current  # readers index batches 1-3 from their rows meanwhile
    lost = sink.ledger_log.read_index(
        sink.tables.get("ledger_bookies"), ["b4"], ["bookie", "ledger_id", "mzxid"]
    )
    assert sorted(lost.column("ledger_id").to_pylist()) == [1, 2, 3]  # what a loss of b4 would read

    now[0] = 105.1
    sink.process(new_version(1_051, 4, ["b1", "b2", "b3"], 14), 4)  # the first batch after the interval
    table = DeltaTable(table_path(root, "ledger_bookies"))
    assert table.version() == appended + 1  # one append for batches 1-4
    assert table.transaction_version("append-test") == 4
    current = sorted(current + [(b, 4, 14) for b in ("b1", "b2", "b3")])
    assert raw_index(root) == sorted([*current, ("b1", 1, 10), ("b2", 1, 10), ("b3", 1, 10)])
    assert current_index(root) == current


def test_the_periodic_maintenance_compacts_every_table_but_ledgers_which_the_folds_rewrite(tmp_path):
    # The folds rewrite ``ledgers`` bucket by bucket: compacting and Z-ordering it again rewrote the whole
    # table in the sink's thread.
    import threading

    from deltalake import write_deltalake

    from connectors.delta.ledger_log import LedgerLog
    from connectors.delta.tables import TABLES
    from core.settings import KafkaSettings
    from streaming.upkeep import TableUpkeep

    ensure_tables(tmp_path)
    for name in ("ledgers", "ledger_bookies", "dead_letters"):
        schema = TABLES[name].schema
        for ledger_id in range(3):  # three appends: three files
            values = {
                "ledger_id": ledger_id,
                "ledger_bucket": 0,
                "bookie": "b1",
                "source": "x",
                "reason": "r",
            }
            row = {field.name: values.get(field.name) for field in schema}
            write_deltalake(
                table_path(tmp_path, name), pa.Table.from_pylist([row], schema=schema), mode="append"
            )
    config = SinkConfig(
        lakehouse_root=tmp_path,
        app_id="maintenance-test",
        kafka=KafkaSettings(),
        maintenance_every_batches=1,
        ledger_fold_interval_s=30.0,
        index_cleanup_bookies_per_batch=1,
    )
    upkeep = TableUpkeep(
        config, LedgerLog(tmp_path, "maintenance-test"), OpenTables(tmp_path), threading.RLock()
    )
    upkeep.after_batch(1)
    files = {name: len(DeltaTable(table_path(tmp_path, name)).file_uris()) for name in TABLES}
    assert (files["dead_letters"], files["ledger_bookies"]) == (1, 1)  # compacted
    assert files["ledgers"] == 3  # left to the folds
    assert read_table(tmp_path, "dead_letters").num_rows == 3
