"""The job keeps ``placement_plans`` current: a ledger that fails the placement policy gets a verified BP-54
plan in the table after the next ledger fold, and loses it when its alert resolves. The sink and its fold
thread against real Delta tables and a real broker; ``bkaudit query placement --plan`` reads the table."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from connectors.delta.queries import Lakehouse
from connectors.delta.tables import read_table
from connectors.kafka.topics import ensure_topic
from core.domain.rules.placement import PlacementAdherence, check_placement
from streaming.sink import AuditSink, SinkConfig
from tests.integration.event_fixtures import closed_ledger_payload
from tests.integration.event_fixtures import decision_table as decisions

pytestmark = pytest.mark.integration

RACKS = {"b1": "/r1", "b2": "/r1", "b3": "/r2", "b4": "/r2", "b5": "/r3"}


def plans(root: Any) -> list[dict[str, Any]]:
    return sorted(read_table(root, "placement_plans").to_pylist(), key=lambda r: (r["ledger_id"], r["move"]))


def eventually(condition: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    """``condition()``'s first truthy value, polled while the fold thread runs."""
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        assert time.monotonic() < deadline, "the fold thread did not update placement_plans in time"
        time.sleep(0.1)
    return found


@pytest.fixture
def sink(kafka_settings: Any, tmp_path: Any) -> Any:
    ensure_topic(kafka_settings, kafka_settings.alerts_topic, 1)
    config = SinkConfig(
        lakehouse_root=tmp_path / "lh", app_id="plans", kafka=kafka_settings, ledger_fold_interval_s=0.2
    )
    sink = AuditSink(config)
    sink.start_folding()
    yield sink
    sink.close()


def test_a_badly_placed_ledger_gets_a_verified_plan_that_leaves_with_its_alert(
    sink: Any, tmp_path: Any
) -> None:
    root = tmp_path / "lh"
    writable = [("bookie_state", 1_000, None, b, {"status": "WRITABLE", "lost": False}) for b in RACKS]
    start = sink.process(
        decisions(
            *writable,
            ("rack_map", 1_000, None, None, {"racks": RACKS, "moved": sorted(RACKS)}),
            ("ledger_state", 1_100, 1, None, closed_ledger_payload(["b1", "b3"], 10)),  # r1, r2: adheres
            ("ledger_state", 1_100, 2, None, closed_ledger_payload(["b1", "b2"], 11)),  # r1, r1: fails
        ),
        0,
    )
    assert [(a["kind"], a["ledger_id"]) for a in start.alerts] == [("PLACEMENT_NOT_ADHERING", 2)]

    (move,) = eventually(lambda: plans(root))
    assert (move["ledger_id"], move["segment"], move["first_entry_id"]) == (2, 0, 0)
    assert move["ensemble"] == ["b1", "b2"] and move["from_bookie"] == move["ensemble"][move["position"]]
    assert move["to_bookie"] in ("b3", "b4", "b5") and move["to_rack"] == RACKS[move["to_bookie"]]
    assert move["reason"] is None and move["policy"] == "rackaware" and move["as_of"] is not None
    assert move["bytes_to_move"] == 10  # E = WQ = 2: the moved position holds all 10 entries, 10 bytes
    verdict = check_placement("rackaware", move["planned_ensemble"], 2, 2, RACKS)
    assert verdict.adherence is PlacementAdherence.MEETS_STRICT

    # The query reads the table: the same plan, as of the fold.
    with Lakehouse(root) as lakehouse:
        (shown,) = lakehouse.placement_plans(sink.config.placement).to_pylist()
    assert shown["moves"] == f"position {move['position']}: {move['from_bookie']} -> {move['to_bookie']}"
    assert shown["as_of"] == move["as_of"] and shown["bytes_to_move"] == 10

    # The operator carries the plan out: the new ensemble adheres, the alert resolves, the plan goes.
    fixed = sink.process(
        decisions(("ledger_state", 2_000, 2, None, closed_ledger_payload(move["planned_ensemble"], 20))), 1
    )
    assert [(a["kind"], a["state"]) for a in fixed.alerts] == [("PLACEMENT_NOT_ADHERING", "resolved")]
    eventually(lambda: plans(root) == [])
    with Lakehouse(root) as lakehouse:
        assert lakehouse.placement_plans(sink.config.placement).num_rows == 0


def test_a_segment_without_a_valid_target_keeps_a_row_that_says_why(sink: Any, tmp_path: Any) -> None:
    root = tmp_path / "lh"
    only_r1 = {"b1": "/r1", "b2": "/r1"}
    sink.process(
        decisions(
            *[("bookie_state", 1_000, None, b, {"status": "WRITABLE", "lost": False}) for b in only_r1],
            ("rack_map", 1_000, None, None, {"racks": only_r1, "moved": sorted(only_r1)}),
            ("ledger_state", 1_100, 7, None, closed_ledger_payload(["b1", "b2"], 10)),
        ),
        0,
    )
    (row,) = eventually(lambda: plans(root))
    assert row["ledger_id"] == 7 and row["move"] is None and row["planned_ensemble"] is None
    assert row["reason"] == "no writable bookie outside the ensemble to move a replica to"
