"""The ``placement_plans`` rows: targets that can take writes now, lost members replaced first, the bytes each
move copies; and the job's planner re-plans when a target stops answering."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake

from connectors.delta.ledger_log import LedgerLog
from connectors.delta.placement_plans import PlacementPlanner, plan_rows
from connectors.delta.queries import Lakehouse, write_example_lakehouse
from connectors.delta.tables import BOOKIES, OPEN_ALERTS, BatchWriter, read_table
from core.domain.rules.evaluate import PlacementPolicyConfig

AT = datetime(2026, 1, 1, tzinfo=UTC)
CONFIG = PlacementPolicyConfig()  # rack-aware


def ledger(ensembles: list[list[str]], *, wq: int = 2, state: str = "CLOSED", **extra: Any) -> dict[str, Any]:
    """A closed ledger of 10 entries and 1000 bytes whose segments start every 5 entries."""
    segments = [{"first_entry_id": 5 * i, "ensemble": e} for i, e in enumerate(ensembles)]
    row = {"ledger_id": 7, "cluster": "c", "write_quorum": wq, "pulsar_topic": None, "updated_at": AT}
    return {**row, "state": state, "last_entry_id": 9, "length": 1000, "segments": segments, **extra}


def bookie(bookie_id: str, rack: str, status: str = "WRITABLE", lost: bool = False) -> dict[str, Any]:
    return {"bookie_id": bookie_id, "rack": rack, "status": status, "lost": lost, "updated_at": None}


def unresponsive(*bookies: str, at: datetime | None = None) -> list[dict[str, Any]]:
    return [{"kind": "BOOKIE_UNRESPONSIVE", "bookies": [b], "detected_at": at} for b in bookies]


def moves(rows: pa.Table) -> list[tuple[int, str, str]]:
    return [(r["position"], r["from_bookie"], r["to_bookie"]) for r in rows.to_pylist()]


# b1, b2 share /r1: [b1, b2] fails; the lightest bookie of another rack is the target.
MEMBERS = [bookie("b1", "/r1"), bookie("b2", "/r1")]


def test_an_unresponsive_bookie_is_never_a_target():
    bookies = [*MEMBERS, bookie("b3", "/r2"), bookie("b4", "/r2")]
    counts = {"b3": 0, "b4": 9}  # b3 is the lighter: chosen while it answers
    assert moves(plan_rows([ledger([["b1", "b2"]])], bookies, counts, CONFIG))[0][2] == "b3"
    rows = plan_rows([ledger([["b1", "b2"]])], bookies, counts, CONFIG, unresponsive("b3"))
    assert [m[2] for m in moves(rows)] == ["b4"]
    # The only bookie of another rack is silent: no plan, and the row says why.
    only = plan_rows(
        [ledger([["b1", "b2"]])], [*MEMBERS, bookie("b3", "/r2")], {}, CONFIG, unresponsive("b3")
    )
    assert only.column("to_bookie").to_pylist() == [None]
    assert only.column("reason").to_pylist() == [
        "no writable bookie outside the ensemble to move a replica to"
    ]


def test_read_only_lost_and_gone_bookies_are_never_targets():
    unfit = [
        bookie("ro", "/r2", status="READ_ONLY"),
        bookie("lost", "/r3", lost=True),
        bookie("gone", "/r4", status="GONE", lost=True),
        bookie("missing", "/r5", status="GONE"),
        bookie("ok", "/r6"),
    ]
    counts = {"ro": 0, "lost": 0, "gone": 0, "missing": 0, "ok": 50}
    rows = plan_rows([ledger([["b1", "b2"]])], [*MEMBERS, *unfit], counts, CONFIG)
    assert [m[2] for m in moves(rows)] == ["ok"]


def test_a_lost_member_of_a_badly_placed_segment_is_moved_first():
    bookies = [bookie("b1", "/r1"), bookie("b2", "/r1", status="GONE", lost=True), bookie("b3", "/r2")]
    rows = plan_rows([ledger([["b1", "b2"]])], bookies, {}, CONFIG)
    assert moves(rows) == [
        (1, "b2", "b3")
    ]  # b2's replacement fixes the rack: one move, not b1's and then b2's
    assert rows.column("planned_ensemble").to_pylist() == [["b1", "b3"]]


def test_an_unregistered_member_is_moved_first():
    # E=4, WQ=2: [b1, b2] fails; b3 is in no bookies row (decommissioned long ago) and must go too.
    bookies = [
        bookie("b1", "/r1"),
        bookie("b2", "/r1"),
        bookie("b4", "/r3"),
        bookie("x", "/r2"),
        bookie("y", "/r4"),
    ]
    rows = plan_rows([ledger([["b1", "b2", "b3", "b4"]])], bookies, {}, CONFIG)
    assert moves(rows)[0][1] == "b3" and len(rows) == 2
    assert rows.column("move").to_pylist() == [0, 1]


def test_each_move_carries_the_bytes_it_copies():
    # 10 entries, 1000 bytes (100 per entry); segment 0 = entries 0..4 on [b1, b2, b3], segment 1 = 5..9 on
    # [b1, b2, b5]. E=3, WQ=2: entry e is on positions e%3 and (e+1)%3.
    bookies = [bookie("b1", "/r1"), bookie("b2", "/r1"), bookie("b3", "/r2"), bookie("b5", "/r2")]
    bookies += [bookie("x", "/r3")]
    rows = plan_rows([ledger([["b1", "b2", "b3"], ["b1", "b2", "b5"]])], bookies, {}, CONFIG).to_pylist()
    # Each segment moves position 0 (b1) to x: it stores entries 0, 2, 3 of segment 0 and 5, 6, 8, 9 of
    # segment 1.
    assert [(r["segment"], r["position"], r["to_bookie"], r["bytes_to_move"]) for r in rows] == [
        (0, 0, "x", 300),
        (1, 0, "x", 400),
    ]


def test_a_ledger_that_is_not_closed_has_no_byte_estimate():
    bookies = [*MEMBERS, bookie("b3", "/r2")]
    rows = plan_rows([ledger([["b1", "b2"]], state="OPEN", length=0, last_entry_id=-1)], bookies, {}, CONFIG)
    assert rows.column("bytes_to_move").to_pylist() == [None] and rows.column("to_bookie").to_pylist() == [
        "b3"
    ]


def test_an_unresponsive_alert_dates_the_plan():
    later = datetime(2026, 2, 1, tzinfo=UTC)
    bookies = [*MEMBERS, bookie("b3", "/r2"), bookie("b4", "/r2")]
    rows = plan_rows([ledger([["b1", "b2"]])], bookies, {}, CONFIG, unresponsive("b3", at=later))
    assert rows.column("as_of").to_pylist() == [later]


def _planner_lakehouse(root: Path) -> tuple[Path, PlacementPlanner]:
    """The example lakehouse (ledger 1 on bookie-1 lost, bookie-2 in /rack-0, bookie-3 in /rack-1) with two
    spare writable bookies in /rack-2, and the job's planner over it."""
    lakehouse = write_example_lakehouse(root)
    spares = [
        {"bookie_id": b, "status": "WRITABLE", "lost": False, "rack": "/rack-2"}
        for b in ("bookie-4", "bookie-5")
    ]
    BatchWriter(lakehouse, "test", 0).upsert("bookies", pa.Table.from_pylist(spares, schema=BOOKIES.schema))
    log = LedgerLog(lakehouse, "test")
    log.open(0)
    return lakehouse, PlacementPlanner(lakehouse, CONFIG, log)


def test_the_planner_re_plans_when_its_target_stops_answering(tmp_path):
    root, planner = _planner_lakehouse(tmp_path / "lh")
    assert planner.refresh()
    (first,) = read_table(root, "placement_plans").to_pylist()
    assert (first["position"], first["from_bookie"], first["to_bookie"]) == (0, "bookie-1", "bookie-4")
    assert first["bytes_to_move"] == 70  # 10 entries, 100 bytes; E=3, WQ=2: position 0 holds 7 entries
    silent = {
        "alert_id": "silent-4",
        "kind": "BOOKIE_UNRESPONSIVE",
        "entity": "bookie/bookie-4",
        "bookies": ["bookie-4"],
        "detected_at": datetime(2024, 5, 2, tzinfo=UTC),
    }
    BatchWriter(root, "test", 1).upsert(
        "open_alerts", pa.Table.from_pylist([silent], schema=OPEN_ALERTS.schema)
    )
    assert planner.refresh()  # the silent bookie changed the plan's inputs
    (second,) = read_table(root, "placement_plans").to_pylist()
    assert second["to_bookie"] == "bookie-5" and second["as_of"] == silent["detected_at"]
    assert not planner.refresh()
    with Lakehouse(root) as lakehouse:
        (target,) = lakehouse.placement_plans(CONFIG, by_target=True).to_pylist()
    assert target == {
        "to_bookie": "bookie-5",
        "to_rack": "/rack-2",
        "moves": 1,
        "ledgers": 1,
        "bytes_to_move": 70,
    }


def test_a_plans_table_written_before_bytes_to_move_still_reads(tmp_path):
    root, planner = _planner_lakehouse(tmp_path / "lh")
    planner.refresh()
    old = read_table(root, "placement_plans").drop_columns(["bytes_to_move"])
    write_deltalake(str(root / "placement_plans"), old, mode="overwrite", schema_mode="overwrite")
    with Lakehouse(root) as lakehouse:
        (row,) = lakehouse.placement_plans(CONFIG).to_pylist()
        (target,) = lakehouse.placement_plans(CONFIG, by_target=True).to_pylist()
    assert row["moves"] == "position 0: bookie-1 -> bookie-4" and row["bytes_to_move"] is None
    assert target["to_bookie"] == "bookie-4" and target["bytes_to_move"] is None
