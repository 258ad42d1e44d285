"""The invalid rack map through the whole job: watcher events → Spark's processor → sink → alerts topic."""

from __future__ import annotations

from typing import Any

import pytest

from connectors.delta.tables import read_table
from core import events as ev
from tests.integration.event_fixtures import alerts_on
from tests.integration.test_stream_job import BOOKIES, RACKS, job_with_watcher, run_once

pytestmark = pytest.mark.integration


def test_a_job_started_on_an_invalid_rack_map_alerts_once_and_checks_placement_when_it_is_fixed(
    spark: Any, kafka_settings: Any, tmp_path: Any
) -> None:
    settings, watcher, t0 = job_with_watcher(kafka_settings, tmp_path, clock_offset_ms=-60_000)
    kafka = settings.kafka
    watcher.send(ev.rack_map_event("file:/racks.json", None, present=True, error="rack map: not JSON"))
    for bookie in BOOKIES:
        watcher.bookie(bookie, "WRITABLE")
    watcher.ledger(1, [BOOKIES[0], BOOKIES[1]])  # /rack0, /rack1 once the map is known: adheres
    watcher.ledger(2, [BOOKIES[0], BOOKIES[3]])  # /rack0, /rack0: fails
    watcher.heartbeat(t0 + 50_000)
    watcher.flush()
    run_once(spark, settings)
    alerts = alerts_on(kafka)
    # Every bookie would sit in the default rack: without the fix, both ledgers fail placement.
    assert [(a["kind"], a["state"]) for _, a in alerts] == [("RACK_MAP_INVALID", "firing")]
    assert alerts[0][0] == f"{alerts[0][1]['cluster']}/rackmap"
    assert alerts[0][1]["detail"] == {"reason": "rack map: not JSON"}
    ledgers = {
        r["ledger_id"]: r["placement"] for r in read_table(settings.lakehouse_root, "ledgers").to_pylist()
    }
    assert ledgers == {1: None, 2: None}

    watcher.rack_map(RACKS)
    watcher.heartbeat(t0 + 55_000)
    watcher.flush()
    sink = run_once(spark, settings)
    seen = {(a["alert_id"], a["state"]) for _, a in alerts}
    later = [
        (a["kind"], a["state"], a["ledger_id"])
        for _, a in alerts_on(kafka)
        if (a["alert_id"], a["state"]) not in seen
    ]
    assert sorted(later) == [
        ("PLACEMENT_NOT_ADHERING", "firing", 2),
        ("RACK_MAP_INVALID", "resolved", None),
    ]
    ledgers = {
        r["ledger_id"]: r["placement"] for r in read_table(settings.lakehouse_root, "ledgers").to_pylist()
    }
    assert ledgers == {1: "MEETS_STRICT", 2: "FAIL"}
    assert sink.metrics.registry.get_sample_value("bkaudit_rack_map_invalid") == 0
