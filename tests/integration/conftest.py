"""Integration fixtures shared by several modules: one real ``bkaudit demo`` run.

``demo_run`` (session) runs :func:`bkaudit.demo.run_demo` once in a temporary directory, with its own dev
state directory (so its own embedded ZooKeeper and broker, stopped at the end of the run), lakehouse and
checkpoint roots, on the suite's Spark session. The summary holds the simulator's ground truth by id; the
Delta tables stay for the query and notebook tests. The simulated cluster's ledger password is fixed so
tests can look for it in the tables.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bkaudit.settings import Settings

DEMO_PASSWORD = b"demo-ledger-password-9d2e"


@dataclass(frozen=True)
class DemoRun:
    settings: Settings  # what run_demo was given
    summary: dict[str, Any]  # its summary: open alerts, ground truth by id, who played which part
    lakehouse: Path  # the demo's Delta tables
    narration: str  # everything it printed
    seconds: float
    clusters_with_known_password: int  # simulated clusters built with DEMO_PASSWORD (the demo builds one)


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory, _spark_session: Any) -> Iterator[DemoRun]:
    import bkaudit.sim.cluster
    from bkaudit.demo import run_demo
    from connectors.devcluster import DevCluster

    root = tmp_path_factory.mktemp("demo")
    settings = Settings(
        dev={"state_dir": root / "state"},
        lakehouse_root=root / "lakehouse",
        checkpoint_root=root / "checkpoints",
        # The suite's session (requested above) is reused; these keep its configuration as it was.
        spark={
            "master": os.environ.get("BKAUDIT_TEST_SPARK_MASTER", "local[2]"),
            "shuffle_partitions": 2,
            "ui_enabled": False,
            "extra_conf": {"spark.sql.adaptive.enabled": "false"},
        },
    )

    built: list[bytes | None] = []

    class KnownPasswordCluster(bkaudit.sim.cluster.SimulatedCluster):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("password", DEMO_PASSWORD)
            built.append(kwargs["password"])
            super().__init__(*args, **kwargs)

    narration = io.StringIO()
    started = time.monotonic()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(bkaudit.sim.cluster, "SimulatedCluster", KnownPasswordCluster)
            summary = run_demo(settings, out=narration)
        yield DemoRun(
            settings=settings,
            summary=summary,
            lakehouse=Path(summary["lakehouse"]),
            narration=narration.getvalue(),
            seconds=round(time.monotonic() - started, 1),
            clusters_with_known_password=built.count(DEMO_PASSWORD),
        )
    finally:
        DevCluster(settings.dev).down()  # run_demo stops them; this is for a run that failed half-way
