"""``bkaudit demo --bookkeeper real`` end to end, as a user runs it (one run, shared by the module): six real
BookKeeper 4.17 bookies, the story's four faults, and the closing comparison against the ground truth the
demo read from the real cluster's ZooKeeper.

The tests check the comparison itself (counts and ids), the parts of the story the closing table does not
show (the loss while it lasted, the flap), that nothing is left running, and that the ledger password of
BookKeeper's Java client is in none of the tables.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from bkaudit.demo_real import FLAP_DELAY_S, demo_services
from connectors.delta.tables import TABLES, read_table
from connectors.devcluster import DevCluster
from core.settings import Settings
from tests.integration.conftest import _as_set_options

pytestmark = pytest.mark.integration

#: LedgerWriter.java's ledger password (its --password default).
WRITER_PASSWORD = b"bkaudit-writer"
RUN = "import sys; from bkaudit.cli.main import run; sys.exit(run(sys.argv[1:]))"


@dataclass(frozen=True)
class RealDemoRun:
    settings: Settings
    summary: dict[str, Any]
    lakehouse: Path
    console: str
    seconds: float


@pytest.fixture(scope="module")
def real_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealDemoRun]:
    root = tmp_path_factory.mktemp("demo-real")
    settings = Settings(
        dev={"state_dir": root / "state"},
        lakehouse_root=root / "lakehouse",
        checkpoint_root=root / "checkpoints",
        log_dir=root / "logs",
        spark={
            "master": os.environ.get("BKAUDIT_TEST_SPARK_MASTER", "local[2]"),
            "shuffle_partitions": 2,
            "ui_enabled": False,
            "driver_memory": "1g",
        },
    )
    keys = ["dev.state_dir", "lakehouse_root", "checkpoint_root", "log_dir"]
    keys += ["spark.master", "spark.shuffle_partitions", "spark.ui_enabled", "spark.driver_memory"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKAUDIT_")}
    command = [sys.executable, "-c", RUN, *_as_set_options(settings, keys), "demo", "--bookkeeper", "real"]
    started = time.monotonic()
    try:
        done = subprocess.run(
            [*command, "--json"],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        console, _, last = done.stdout.rstrip("\n").rpartition("\n")
        summary = json.loads(last)
        yield RealDemoRun(settings, summary, Path(summary["lakehouse"]), console, time.monotonic() - started)
    finally:
        DevCluster(demo_services(settings.dev)).down()


def test_the_open_alerts_match_the_ground_truth_read_from_the_real_cluster(real_demo: RealDemoRun) -> None:
    summary = real_demo.summary
    assert summary["bookkeeper"] == "real" and summary["broker"] == "kafka"  # a real Apache Kafka broker
    assert summary["matches_ground_truth"], real_demo.console[-4000:]
    assert summary["open_alert_ids"] == summary["ground_truth_ids"], real_demo.console[-4000:]
    # At the end: the broken rack diversity and the stopped bookie, nothing else.
    assert set(summary["ground_truth"]) == {"PLACEMENT_NOT_ADHERING", "BOOKIE_UNRESPONSIVE"}
    assert summary["ground_truth_ids"]["BOOKIE_UNRESPONSIVE"] == [summary["story"]["silent_bookie"]]
    assert "auditor matches the ground truth: yes" in real_demo.console


def test_the_killed_bookie_put_exactly_its_ledgers_under_replicated(real_demo: RealDemoRun) -> None:
    loss = real_demo.summary["checks"]["while_dead_bookie_was_lost"]
    dead = real_demo.summary["story"]["dead_bookie"]
    assert loss["truth"]["BOOKIE_LOST"] == [dead]
    assert loss["truth"]["LEDGER_UNDER_REPLICATED"], "the killed bookie held ledgers"
    assert loss["auditor"] == loss["truth"] and loss["matches"]
    # ... and each of those alerts resolved once the bookie was back.
    history = read_table(real_demo.lakehouse, "violations").to_pylist()
    resolved = {
        str(r["ledger_id"]) for r in history if r["state"] == "resolved" and r["ledger_id"] is not None
    }
    assert set(loss["truth"]["LEDGER_UNDER_REPLICATED"]) <= resolved


def test_the_flap_under_the_recovery_delay_raised_nothing_and_was_counted(real_demo: RealDemoRun) -> None:
    flap = real_demo.summary["checks"]["flap"]
    assert flap["bookie"] == real_demo.summary["story"]["flapping_bookie"]
    assert 0 < flap["missing_s"] < FLAP_DELAY_S and flap["flaps"] >= 1
    history = read_table(real_demo.lakehouse, "violations").to_pylist()
    assert not [r for r in history if r["kind"] == "BOOKIE_LOST" and flap["bookie"] in (r["bookies"] or [])]


def test_the_demo_stopped_its_bookies_and_services(real_demo: RealDemoRun) -> None:
    status = DevCluster(demo_services(real_demo.settings.dev)).status()
    assert not status["zookeeper"]["running"] and not status["kafka"]["running"], status
    bookkeeper_dirs = real_demo.settings.dev.state_dir / "demo-bookkeeper"
    assert not any(bookkeeper_dirs.glob("*/bookie-*")), "the bookies' data was removed"
    java = subprocess.run(["pgrep", "-f", str(bookkeeper_dirs)], capture_output=True, text=True)
    assert java.stdout.strip() == "", "no bookie process of this run is left"


def test_no_table_holds_the_ledger_password(real_demo: RealDemoRun) -> None:
    needles = [WRITER_PASSWORD, base64.b64encode(WRITER_PASSWORD), WRITER_PASSWORD.hex().encode()]
    for name in TABLES:
        text = repr(DeltaTable(str(real_demo.lakehouse / name)).to_pyarrow_table().to_pylist()).encode()
        assert not any(needle in text for needle in needles), name
    ledgers = DeltaTable(str(real_demo.lakehouse / "ledgers")).to_pyarrow_table()
    assert ledgers.num_rows == 20 and all(ledgers.column("has_password").to_pylist())  # they had one
