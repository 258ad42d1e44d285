"""An invalid rack map makes placement unknown: one cluster-level alert, no placement verdicts until a valid
map arrives, then a re-check of what the invalid spell left unknown. The sink against real Delta tables."""

from __future__ import annotations

from typing import Any

import pytest

from connectors.delta.tables import read_table
from connectors.kafka.topics import ensure_topic
from streaming.sink import AuditSink, SinkConfig
from tests.integration.event_fixtures import closed_ledger_payload
from tests.integration.event_fixtures import decision_table as decisions

pytestmark = pytest.mark.integration

BOOKIES = ("b1", "b2", "b3", "b4")
MAP_A = {"b1": "/r1", "b2": "/r1", "b3": "/r2", "b4": "/r2"}


def writable(t: int) -> list[tuple[str, int, None, str, dict[str, Any]]]:
    return [("bookie_state", t, None, b, {"status": "WRITABLE", "lost": False}) for b in BOOKIES]


def transitions(report: Any) -> list[tuple[str, str, int | None]]:
    return sorted((a["kind"], a["state"], a["ledger_id"]) for a in report.alerts)


def placements(root: Any) -> dict[int, str | None]:
    return {r["ledger_id"]: r["placement"] for r in read_table(root, "ledgers").to_pylist()}


@pytest.fixture
def sink(kafka_settings: Any, tmp_path: Any) -> AuditSink:
    ensure_topic(kafka_settings, kafka_settings.alerts_topic, 1)
    return AuditSink(SinkConfig(lakehouse_root=tmp_path / "lh", app_id="rackmap", kafka=kafka_settings))


def test_a_job_started_while_the_rack_map_is_invalid_raises_one_alert_about_the_map(
    sink: AuditSink, tmp_path: Any
) -> None:
    root = tmp_path / "lh"
    start = sink.process(
        decisions(
            *writable(1_000),
            ("rack_map", 1_000, None, None, {"error": "rack map: not JSON (line 1 column 2)"}),
            ("ledger_state", 1_100, 1, None, closed_ledger_payload(["b1", "b3"], 10)),
            ("ledger_state", 1_100, 2, None, closed_ledger_payload(["b1", "b2"], 11)),
        ),
        0,
    )
    # Without a valid map placement is unknown, not failing: one alert, about the map.
    assert transitions(start) == [("RACK_MAP_INVALID", "firing", None)]
    alert = start.alerts[0]
    assert alert["severity"] == "warning" and alert["bookies"] == []
    assert alert["detail"] == {"reason": "rack map: not JSON (line 1 column 2)"}
    assert placements(root) == {1: None, 2: None}
    open_rows = read_table(root, "open_alerts").to_pylist()
    assert [(r["kind"], r["entity"]) for r in open_rows] == [("RACK_MAP_INVALID", "rackmap")]

    # Still invalid (the state survives the batch: it is the open alert), another error changes nothing.
    later = sink.process(
        decisions(
            ("ledger_state", 2_000, 3, None, closed_ledger_payload(["b3", "b4"], 12)),
            ("rack_map", 2_100, None, None, {"error": "rack map: not JSON"}),
        ),
        1,
    )
    assert transitions(later) == []

    # A valid map: the map alert resolves and every ledger left unknown is checked against it.
    fixed = sink.process(
        decisions(("rack_map", 3_000, None, None, {"racks": MAP_A, "moved": sorted(MAP_A)})), 2
    )
    assert transitions(fixed) == [
        ("PLACEMENT_NOT_ADHERING", "firing", 2),
        ("PLACEMENT_NOT_ADHERING", "firing", 3),
        ("RACK_MAP_INVALID", "resolved", None),
    ]
    assert next(a for a in fixed.alerts if a["kind"] == "RACK_MAP_INVALID")["alert_id"] == alert["alert_id"]
    assert placements(root) == {1: "MEETS_STRICT", 2: "FAIL", 3: "FAIL"}


def test_an_invalid_map_keeps_placement_alerts_as_they_are_and_recovery_rechecks_only_what_it_must(
    sink: AuditSink, tmp_path: Any
) -> None:
    root = tmp_path / "lh"
    setup = sink.process(
        decisions(
            *writable(1_000),
            ("rack_map", 1_000, None, None, {"racks": MAP_A, "moved": sorted(MAP_A)}),
            ("ledger_state", 1_100, 1, None, closed_ledger_payload(["b1", "b3"], 10)),  # r1, r2: adheres
            ("ledger_state", 1_100, 2, None, closed_ledger_payload(["b1", "b2"], 11)),  # r1, r1: fails
        ),
        0,
    )
    assert transitions(setup) == [("PLACEMENT_NOT_ADHERING", "firing", 2)]

    invalid = sink.process(
        decisions(
            ("rack_map", 2_000, None, None, {"error": "rack map: bookie id 'x y' is not valid"}),
            # While the map is invalid: ledger 2 gets an ensemble that would adhere, ledger 4 one that would
            # not. Neither verdict is known, so nothing fires and nothing resolves.
            ("ledger_state", 2_100, 2, None, closed_ledger_payload(["b2", "b3"], 20)),
            ("ledger_state", 2_100, 4, None, closed_ledger_payload(["b1", "b2"], 21)),
        ),
        1,
    )
    assert transitions(invalid) == [("RACK_MAP_INVALID", "firing", None)]
    open_kinds = sorted((r["kind"], r["ledger_id"]) for r in read_table(root, "open_alerts").to_pylist())
    assert open_kinds == [("PLACEMENT_NOT_ADHERING", 2), ("RACK_MAP_INVALID", None)]
    assert placements(root) == {1: "MEETS_STRICT", 2: None, 4: None}

    # A valid map in which only b4 moved (relative to the last valid map): ledgers 2 and 4 are re-checked
    # because their placement was left unknown, not because of a move; ledger 1 is untouched.
    map_b = {**MAP_A, "b4": "/r3"}
    fixed = sink.process(decisions(("rack_map", 3_000, None, None, {"racks": map_b, "moved": ["b4"]})), 2)
    assert transitions(fixed) == [
        ("PLACEMENT_NOT_ADHERING", "firing", 4),
        ("PLACEMENT_NOT_ADHERING", "resolved", 2),
        ("RACK_MAP_INVALID", "resolved", None),
    ]
    assert placements(root) == {1: "MEETS_STRICT", 2: "MEETS_STRICT", 4: "FAIL"}
