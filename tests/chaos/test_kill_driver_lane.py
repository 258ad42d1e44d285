"""kill -9 of the job (its ledger lane runs in the driver) at random moments; restarts end in the reference's
tables and alert ids.

The crash history (:mod:`tests.integration.crash_history`: every rule, a lost bookie, deletions,
corrupt znodes, an under-replication mark whose grace timer fires in the timers query) is consumed once
without interruption (the reference) and once with SIGKILLs of the whole process group at seeded random
moments after the lane planned a new batch, restarted each time, then a final run to the end.

The lane numbers its batches itself and reads the relayed timer decisions when they arrive, so batch
boundaries are not the reference's: tables are compared without their ``batch_id`` columns, and the
``ledger_changes`` history by the versions it holds (a ledger changed twice in one batch is one row).
Everything else must be equal, and every alert id must carry the reference's transitions.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from connectors.delta.tables import TABLES, read_table
from connectors.kafka.topics import ensure_topic
from core.settings import KafkaSettings
from tests.integration.crash_history import (
    APP_ID,
    JOB_TIMEOUT_S,
    PARTITIONS,
    SEED,
    STREAM_SETTINGS,
    publish_history,
)
from tests.integration.job_process import (
    JobRun,
    alerts_by_id,
    assert_same_alert_transitions,
    kill_group,
    run_to_completion,
)

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

KILLS = 3
DRIVER_SETTINGS = {
    **STREAM_SETTINGS,
    "LEDGER_LANE_INTERVAL_S": "0.05",
    "TIMERS_TRIGGER_INTERVAL_S": "0.5",
}


def lane_batches(run: JobRun, folder: str) -> list[int]:
    """Batch ids in the lane's ``offsets`` (planned) or ``state`` (committed) folder."""
    path = run.checkpoint / "ledger-lane" / folder
    return sorted(int(p.stem) for p in path.glob("*.json") if p.stem.isdigit()) if path.is_dir() else []


def kill_in_a_lane_batch(run: JobRun, attempt: int, rng: random.Random) -> dict[str, Any]:
    """Start the job, wait until the lane plans a batch past the last one committed before, sleep a random
    fraction of a batch, SIGKILL the process group; where the kill landed."""
    committed_before = max(lane_batches(run, "state"), default=-1)
    target = committed_before + rng.randint(1, 3)
    process = run.start(attempt)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while max(lane_batches(run, "offsets"), default=-1) < target:
        assert process.poll() is None, f"attempt {attempt} ended before its kill:\n{run.log_tail(attempt)}"
        assert time.monotonic() < deadline, f"attempt {attempt}: no batch {target}:\n{run.log_tail(attempt)}"
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.3))
    kill_group(process)
    planned, committed = lane_batches(run, "offsets"), lane_batches(run, "state")
    queued = sorted(int(p.stem) for p in (run.checkpoint / "sink-queue").glob("*.arrow"))
    return {
        "planned": planned[-1],
        "committed": committed[-1] if committed else -1,
        "queued": queued,
        "mid_batch": planned[-1] > (committed[-1] if committed else -1) or bool(queued),
    }


def comparable(lakehouse: Path) -> dict[str, list[str]]:
    """Every table's rows without ``batch_id``, sorted; ``ledger_changes`` as the versions it holds."""
    tables: dict[str, list[str]] = {}
    for name in TABLES:
        rows = read_table(lakehouse, name).to_pylist()
        if name == "ledger_changes":
            tables[name] = sorted({json.dumps([r["ledger_id"], r["mzxid"]]) for r in rows})
            continue
        tables[name] = sorted(
            json.dumps({k: v for k, v in row.items() if k != "batch_id"}, sort_keys=True, default=str)
            for row in rows
        )
    return tables


def test_kill9_of_the_driver_lane_at_random_moments_ends_in_the_reference_tables_and_alert_ids(
    bk_services, kafka_settings, tmp_path
):
    kafka = kafka_settings.model_copy(update={"topic_partitions": PARTITIONS})
    ensure_topic(kafka, kafka.changes_topic, partitions=PARTITIONS)
    publish_history(kafka)

    def own_topics(name: str) -> KafkaSettings:
        return kafka.model_copy(
            update={
                topic: bk_services.unique_topic(f"bkaudit.{topic}.{name}")
                for topic in ("alerts_topic", "feedback_topic", "tracked_topic", "decisions_topic")
            }
        )

    reference = JobRun(tmp_path / "reference", own_topics("reference"), DRIVER_SETTINGS, APP_ID, PARTITIONS)
    reference_s = run_to_completion(reference, 0, JOB_TIMEOUT_S)
    expected_tables = comparable(reference.lakehouse)
    expected_alerts, reference_copies = alerts_by_id(reference.kafka)
    kinds = {json.loads(c)["kind"] for contents in expected_alerts.values() for c in contents}
    assert {"UNDER_REPLICATION_STUCK", "LEDGER_UNDER_REPLICATED", "PLACEMENT_NOT_ADHERING"} <= kinds, kinds
    assert max(reference_copies.values()) == 1

    crashed = JobRun(tmp_path / "crashed", own_topics("crashed"), DRIVER_SETTINGS, APP_ID, PARTITIONS)
    rng = random.Random(SEED)
    kills = [kill_in_a_lane_batch(crashed, attempt, rng) for attempt in range(1, KILLS + 1)]
    final_s = run_to_completion(crashed, KILLS + 1, JOB_TIMEOUT_S)
    print(f"\nreference {reference_s:.1f} s; final attempt {final_s:.1f} s; kills: {kills}")

    assert any(k["mid_batch"] for k in kills), kills
    actual_tables = comparable(crashed.lakehouse)
    for name in TABLES:
        assert actual_tables[name] == expected_tables[name], name
    assert_same_alert_transitions(expected_alerts, crashed.kafka)
