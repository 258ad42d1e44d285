"""Crash tests of the streaming auditor: SIGKILL at random points, restart, same tables, no alert id lost.

One deterministic event history is published to a changes topic. A *reference* run of
``bkaudit stream --available-now`` (a subprocess: its own JVM, like production) consumes it to the end. A
*crash* run consumes the same topic with its own lakehouse, checkpoint, alerts and feedback topics, but its
process group (Python driver + JVM + Python workers) is killed with SIGKILL at seeded random moments and
restarted each time, until a final attempt completes. Then:

- every Delta table holds exactly the reference's rows (nothing excluded: event time, batch ids, all of it);
- the crash run's alert topic holds the same alert ids, each with the same set of transitions; a replayed
  batch may publish a transition again, but only with the same id and the same content.

The checkpoint's ``offsets/`` and ``commits/`` logs tell where each kill landed: a batch planned but not
committed means the kill interrupted a micro-batch, which the restart replays (see docs/design.md, "The
streaming auditor").
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from itertools import pairwise
from statistics import median
from typing import Any

import pytest

from connectors.delta.tables import TABLES, read_table
from connectors.kafka.topics import ensure_topic
from core.settings import KafkaSettings
from streaming.loss import LOSS_ALERT_KINDS
from tests.integration.event_fixtures import Watcher
from tests.integration.job_process import (
    JobRun,
    alerts_by_id,
    assert_same_alert_transitions,
    commit_times,
    data_batch_plans,
    kill_during_batch,
    run_to_completion,
    table_rows,
)

pytestmark = pytest.mark.integration
LOSS_KIND_NAMES = {kind.value for kind in LOSS_ALERT_KINDS}

SEED = 20240611
KILLS = 3
PARTITIONS = 2
MAX_OFFSETS_PER_TRIGGER = 5
APP_ID = "bkaudit-crash-test"
JOB_TIMEOUT_S = 400.0

T0 = 1_700_000_000_000  # fixed event times: both runs and every attempt see the very same history
BOOKIES = [f"10.0.1.{i}:3181" for i in range(1, 7)]
RACKS = {b: f"/rack{i % 3}" for i, b in enumerate(BOOKIES)}  # b1,b4 → rack0; b2,b5 → rack1; b3,b6 → rack2
STREAM_SETTINGS = {
    # Spark's ledger lane: its restarts plan the very same batches as the reference, so every table must
    # match to the batch ids (the driver-run lane's counterpart: tests/chaos/test_kill_driver_lane.py).
    "LEDGER_LANE": "spark",
    "MAX_OFFSETS_PER_TRIGGER": str(MAX_OFFSETS_PER_TRIGGER),
    # Longer than the 60 s of event time between waves: when one partition runs a wave ahead of the other
    # in a rate-limited batch, the other's events are not dropped as late (checked on the reference).
    "WATERMARK_DELAY_S": "70",
    "DEFAULT_RECOVERY_DELAY_S": "0",
    "UNDER_REPLICATION_GRACE_S": "5",  # an event-time timer fires UNDER_REPLICATION_STUCK
}


# ------------------------------------------------------------------------------------------ the history


class SteppingClock:
    """Event time for the builder: +10 ms per event, jumped forward between waves."""

    def __init__(self, start_ms: int) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        self.now_ms += 10
        return self.now_ms

    def jump(self, at_ms: int) -> None:
        self.now_ms = max(self.now_ms, at_ms)


def ring_ensemble(first: int, size: int = 3) -> list[str]:
    """``size`` consecutive bookies from ``first``: consecutive bookies sit on distinct racks."""
    return [BOOKIES[(first + k) % len(BOOKIES)] for k in range(size)]


@dataclass
class History:
    """What was published, and the final state it implies (to prove the job dropped no event as late)."""

    events: int = 0
    ledger_mzxid: dict[int, int] = field(default_factory=dict)  # last upsert / corrupt znode version
    deleted: set[int] = field(default_factory=set)
    bookie_status: dict[str, str] = field(default_factory=dict)


def publish_history(kafka: KafkaSettings) -> History:
    """Publish the cluster's story in four waves, 60 s of event time apart (heartbeats on both partitions)."""
    clock = SteppingClock(T0)
    watcher = Watcher(kafka, clock)
    history = History()
    b1, b2, b3, b4, b5, b6 = BOOKIES

    def ledger(ledger_id: int, ensemble: list[str], **kw: Any) -> None:
        watcher.ledger(ledger_id, ensemble, **kw)
        history.ledger_mzxid[ledger_id] = watcher.mzxid
        history.deleted.discard(ledger_id)

    def corrupt(ledger_id: int) -> None:
        watcher.corrupt(ledger_id)
        history.ledger_mzxid[ledger_id] = watcher.mzxid

    def delete(ledger_id: int) -> None:
        watcher.delete(ledger_id)
        history.deleted.add(ledger_id)

    def bookie(bookie_id: str, status: str) -> None:
        watcher.bookie(bookie_id, status)
        history.bookie_status[bookie_id] = status

    # Wave 1: a healthy cluster with some badly placed, fragile, open and corrupt ledgers, and a urL mark
    # whose grace timer fires once wave 2's heartbeat moves the watermark past it.
    watcher.rack_map(RACKS)
    for bookie_id in BOOKIES:
        bookie(bookie_id, "WRITABLE")
    for ledger_id in range(1, 31):
        if ledger_id % 7 == 0:
            ledger(ledger_id, [b1, b4])  # both on rack0: PLACEMENT_NOT_ADHERING
        elif ledger_id % 5 == 0:
            ledger(ledger_id, ring_ensemble(ledger_id), wq=1, aq=1)  # one copy: a loss is data loss
        else:
            ledger(ledger_id, ring_ensemble(ledger_id), closed=ledger_id % 9 != 0)
    corrupt(41)
    watcher.mark_under_replicated(4, [b5], ctime_ms=clock.now_ms)
    watcher.heartbeat(T0 + 60_000, PARTITIONS)

    # Wave 2: ensemble changes and deletions, then b1 goes away (delay 0: lost at once).
    clock.jump(T0 + 60_000)
    for ledger_id in (3, 8, 13, 16):
        ensemble = ring_ensemble(ledger_id)
        replaced = [BOOKIES[(ledger_id + 3) % 6] if b == ensemble[0] else b for b in ensemble]
        ledger(ledger_id, ensemble, later_ensembles=[(50, replaced)])
    for ledger_id in (10, 20, 30):
        delete(ledger_id)
    bookie(b1, "GONE")
    watcher.heartbeat(T0 + 120_000, PARTITIONS)

    # Wave 3: b1 returns, b5 and b6 vanish together, b2 moves racks, the corrupt ledger is rewritten and
    # another one goes corrupt.
    clock.jump(T0 + 120_000)
    bookie(b1, "WRITABLE")
    bookie(b5, "GONE")
    bookie(b6, "GONE")
    watcher.rack_map({**RACKS, b2: "/rack0"})
    ledger(41, ring_ensemble(41))
    corrupt(12)
    watcher.heartbeat(T0 + 180_000, PARTITIONS)

    # Wave 4: b5 returns (b6 stays lost), new ledgers land on the lost b6, the urL mark clears, one deletion.
    clock.jump(T0 + 180_000)
    bookie(b5, "WRITABLE")
    for ledger_id in range(42, 46):
        ledger(ledger_id, [b6, b2, b3])
    watcher.clear_under_replicated(4)
    delete(1)
    watcher.heartbeat(T0 + 240_000, PARTITIONS)
    watcher.heartbeat(T0 + 300_000, PARTITIONS)
    watcher.close()
    history.events = watcher.sent
    return history


# ------------------------------------------------------------------------------------------------ the test


def test_sigkill_at_random_points_then_restart_ends_in_the_reference_tables_and_alert_ids(
    bk_services, kafka_settings, tmp_path
):
    kafka = kafka_settings.model_copy(update={"topic_partitions": PARTITIONS})
    ensure_topic(kafka, kafka.changes_topic, partitions=PARTITIONS)
    history = publish_history(kafka)

    def own_topics(name: str) -> KafkaSettings:
        return kafka.model_copy(
            update={
                "alerts_topic": bk_services.unique_topic(f"bkaudit.alerts.{name}"),
                "feedback_topic": bk_services.unique_topic(f"bkaudit.feedback.{name}"),
            }
        )

    # Reference: one uninterrupted run.
    reference = JobRun(tmp_path / "reference", own_topics("reference"), STREAM_SETTINGS, APP_ID, PARTITIONS)
    reference_s = run_to_completion(reference, 0, JOB_TIMEOUT_S)
    reference_plans = data_batch_plans(reference)
    expected_tables = table_rows(reference.lakehouse)
    expected_alerts, reference_copies = alerts_by_id(reference.kafka)
    times = commit_times(reference)
    batch_s = median(b - a for a, b in pairwise(times))  # commit to commit: one batch (not batch 0's warm-up)

    # The history means something: every event applied (none dropped as late), many batches, several dozen
    # transitions, every kind of rule involved.
    ledgers = {r["ledger_id"]: r for r in read_table(reference.lakehouse, "ledgers").to_pylist()}
    assert {i: r["mzxid"] for i, r in ledgers.items()} == history.ledger_mzxid
    assert {i for i, r in ledgers.items() if r["deleted"]} == history.deleted
    bookies = read_table(reference.lakehouse, "bookies").to_pylist()
    assert {r["bookie_id"]: r["status"] for r in bookies} == history.bookie_status
    assert len(reference_plans) >= history.events // (2 * MAX_OFFSETS_PER_TRIGGER), reference_plans
    assert sum(reference_copies.values()) >= 40, reference_copies
    assert max(reference_copies.values()) == 1  # an uninterrupted run publishes each transition once
    kinds = {json.loads(c)["kind"] for contents in expected_alerts.values() for c in contents}
    assert kinds >= {
        "BOOKIE_LOST",
        "LEDGER_UNDER_REPLICATED",
        "LEDGER_UNRECOVERABLE",
        "PLACEMENT_NOT_ADHERING",
        "METADATA_CORRUPT",
        "UNDER_REPLICATION_STUCK",
    }, kinds

    # Crash run: SIGKILL in seeded random batches, then a final run to the end. One batch that publishes
    # alerts dies right after the sink's first Delta commit (alerts already on Kafka, tables half written);
    # the others at a random moment of the batch. Each restart resumes from the checkpoint.
    crashed = JobRun(tmp_path / "crashed", own_topics("crashed"), STREAM_SETTINGS, APP_ID, PARTITIONS)
    rng = random.Random(SEED)
    last_data_batch = max(reference_plans)
    # The ledger lane's own alerts: violations' batch ids of the loss kinds may be the membership lane's,
    # which numbers its batches apart (a kill of the ledger lane's batch N does not replay them).
    ledger_lane_alerts = [
        row
        for row in read_table(reference.lakehouse, "violations").to_pylist()
        if row["kind"] not in LOSS_KIND_NAMES
    ]
    alert_batches = {row["batch_id"] for row in ledger_lane_alerts}
    sink_victim = rng.choice(sorted(b for b in alert_batches if 2 <= b < last_data_batch))
    random_victims = rng.sample([b for b in range(2, last_data_batch) if b != sink_victim], KILLS - 1)
    plan = sorted([(sink_victim, "sink"), *((b, "random") for b in random_victims)])
    kills = []
    for attempt, (victim, mode) in enumerate(plan, start=1):
        after_commit = max(victim - 1, crashed.last("commits") + 1)  # every attempt commits something new
        phase_s = rng.uniform(0.1, 1.0) * batch_s
        kills.append(
            kill_during_batch(crashed, attempt, after_commit, mode, phase_s, timeout_s=JOB_TIMEOUT_S)
        )
    final_s = run_to_completion(crashed, KILLS + 1, JOB_TIMEOUT_S)
    print(
        f"\n{history.events} events; reference run {reference_s:.1f} s, {len(reference_plans)} data batches "
        f"(median {batch_s:.1f} s each); final attempt {final_s:.1f} s; kills:"
    )
    for kill in kills:
        print(f"  {kill}")

    assert all(k.mid_batch for k in kills if k.mode == "sink"), kills
    assert any(k.tables_already_written for k in kills), kills  # one batch was left half written to Delta
    assert sum(k.mid_batch for k in kills) >= 2, kills
    # The restarts planned the very same batches (a replay reads exactly the offsets first planned).
    assert data_batch_plans(crashed) == reference_plans
    actual_tables = table_rows(crashed.lakehouse)
    for name in TABLES:
        assert actual_tables[name] == expected_tables[name], name
    crashed_copies = assert_same_alert_transitions(expected_alerts, crashed.kafka)
    assert set(crashed_copies) == set(reference_copies)
    # The batch killed inside the sink had published its alerts already: its replay published them again.
    duplicates = sum(crashed_copies.values()) - len(crashed_copies)
    republished = sum(1 for row in ledger_lane_alerts if row["batch_id"] == sink_victim)
    print(f"  {duplicates} duplicates on the alert topic (at least {republished} from the sink kill)")
    assert duplicates >= republished > 0
