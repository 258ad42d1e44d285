"""`bkaudit demo` end to end (one run, shared through the ``demo_run`` fixture): its open alerts against the
simulator's ground truth, its services stopped, and no ledger password in any of its tables."""

from __future__ import annotations

import base64
from collections import defaultdict

import pytest
from deltalake import DeltaTable

from connectors.delta.tables import TABLES
from connectors.devcluster import DevCluster
from tests.integration.conftest import DEMO_PASSWORD, DemoRun

pytestmark = pytest.mark.integration


def test_the_demos_open_alerts_match_its_ground_truth(demo_run: DemoRun):
    summary = demo_run.summary
    assert summary["matches_ground_truth"], demo_run.narration
    assert summary["open_alerts"] == summary["ground_truth"], demo_run.narration
    # The story's own checks: a placement problem and a silent bookie are open at the end, nothing else.
    assert set(summary["ground_truth"]) == {"PLACEMENT_NOT_ADHERING", "BOOKIE_UNRESPONSIVE"}


def test_the_open_alerts_table_names_exactly_the_entities_of_the_ground_truth(demo_run: DemoRun):
    rows = DeltaTable(str(demo_run.lakehouse / "open_alerts")).to_pyarrow_table().to_pylist()
    found: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        found[row["kind"]].add(row["entity"].split("/", 1)[1])
    truth = demo_run.summary["ground_truth_ids"]
    for kind in set(found) | set(truth["alerts"]):
        required = {str(i) for i in truth["alerts"].get(kind, [])}
        allowed = required | {str(i) for i in truth["may_alert"].get(kind, [])}
        assert required <= found[kind] <= allowed, (kind, found[kind], required, allowed)
    assert found["BOOKIE_UNRESPONSIVE"] == {demo_run.summary["story"]["silent_bookie"]}


def test_the_demo_stopped_the_services_it_started(demo_run: DemoRun):
    status = DevCluster(demo_run.settings.dev).status()
    assert not status["zookeeper"]["running"] and not status["kafka"]["running"], status


def test_no_table_holds_the_ledger_password(demo_run: DemoRun):
    assert demo_run.clusters_with_known_password == 1  # the simulated cluster's ledgers had this password
    needles = [DEMO_PASSWORD, base64.b64encode(DEMO_PASSWORD), DEMO_PASSWORD.hex().encode()]
    for name in TABLES:
        table = DeltaTable(str(demo_run.lakehouse / name)).to_pyarrow_table()
        text = repr(table.to_pylist()).encode()
        assert not any(needle in text for needle in needles), name
    for path in demo_run.lakehouse.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not any(needle in data for needle in needles), path
    ledgers = DeltaTable(str(demo_run.lakehouse / "ledgers")).to_pyarrow_table()
    assert ledgers.num_rows >= 20 and all(ledgers.column("has_password").to_pylist())  # it had one
