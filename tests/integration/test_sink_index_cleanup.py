"""Per-batch costs bounded by time: the index cleanup runs at most every ``index_cleanup_interval_s``, and the
Delta handles the sink keeps open between batches still see every other writer's commits."""

from __future__ import annotations

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


def test_batches_inside_the_cleanup_interval_leave_old_index_rows_and_the_first_after_it_cleans(
    kafka_settings, tmp_path
):
    from connectors.kafka.topics import ensure_topic

    ensure_topic(kafka_settings, kafka_settings.alerts_topic, 1)
    root = tmp_path / "lh"
    config = SinkConfig(
        lakehouse_root=root,
        app_id="cleanup-test",
        kafka=kafka_settings,
        index_cleanup_bookies_per_batch=10,  # one run cleans every partition
        index_cleanup_interval_s=5.0,
    )
    now = [100.0]
    sink = AuditSink(config, clock=lambda: now[0])
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
