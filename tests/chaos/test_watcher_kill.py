"""kill -9 of the watcher mid-stream and mid-snapshot, then a restart; the job must end at the truth.

Mid-stream: the simulator churns, the watcher dies at a seeded random moment, more changes (deletions, a
bookie loss) happen while no watcher runs, then it restarts and its START snapshot must reconcile them.
Mid-snapshot: the watcher dies right after its snapshot began (the topic holds a snapshot's begin marker
and no end marker for it), the cluster changes again, and the next watcher's snapshot must repair it all.
Snapshot reads are made one at a time here, so that a snapshot of a few hundred ledgers lasts long enough
to be interrupted. The restart is :func:`tests.chaos.recovery.after_watcher_kill`.
"""

from __future__ import annotations

import random
import time

import pytest
from kafka import KafkaConsumer, TopicPartition

from bkaudit import events as ev
from connectors.kafka.client_config import consumer_config
from tests.chaos.recovery import after_watcher_kill
from tests.chaos.stack import chaos_stack, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

SLOW_SNAPSHOT = {"SNAPSHOT_BATCH_SIZE": "1", "SNAPSHOT_CONCURRENCY": "1"}


def snapshot_markers(kafka) -> dict[str, set[str]]:
    """snapshot id → the marker kinds seen for it on the changes topic (``begin``, ``end``)."""
    consumer = KafkaConsumer(**consumer_config(kafka, None))
    try:
        partitions = [
            TopicPartition(kafka.changes_topic, p) for p in consumer.partitions_for_topic(kafka.changes_topic)
        ]
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(partitions)
        markers: dict[str, set[str]] = {}
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            assert time.monotonic() < deadline, f"could not read {kafka.changes_topic} to {ends} in 60 s"
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    event = ev.decode_event(record.value)
                    kind = ev.payload_type(event)
                    if kind in ("snapshot_begin", "snapshot_end"):
                        marker = getattr(event, kind)
                        markers.setdefault(marker.snapshot_id, set()).add(kind.removeprefix("snapshot_"))
        return markers
    finally:
        consumer.close()


def test_kill9_of_the_watcher_mid_stream_and_mid_snapshot_then_restart(
    chaos_services, chaos_seed, tmp_path_factory
):
    rng = random.Random(chaos_seed + 2)
    root = tmp_path_factory.mktemp("watcher-kill")
    with chaos_stack(chaos_services, root, chaos_seed + 2, watcher_settings=SLOW_SNAPSHOT) as stack:
        # Mid-stream.
        with stack.churning(random.Random(rng.random())):
            time.sleep(rng.uniform(0.5, 2.5))
            stack.watcher.kill9()
            for ledger_id in rng.sample(stack.cluster.ledger_ids(), 5):
                stack.delete_ledger(ledger_id)
            lost = stack.lose_bookie(rng)
            time.sleep(1.0)
            after_watcher_kill(stack)
            time.sleep(2.0)
        stream_s = stack.settle(f"watcher killed mid-stream, {lost} lost while it was down")

        # Mid-snapshot.
        stack.watcher.kill9()
        for ledger_id in rng.sample(stack.cluster.ledger_ids(), 5):
            stack.delete_ledger(ledger_id)
        for _ in range(5):
            stack.cluster.create_ledger(entries=2)
        before = set(snapshot_markers(stack.kafka))
        stack.watcher.start()
        wait_for(
            "the restarted watcher's snapshot to begin", stack.watcher.snapshots_started, 60, every_s=0.01
        )
        time.sleep(rng.uniform(0.0, 0.05))
        stack.watcher.kill9()
        markers = {k: v for k, v in snapshot_markers(stack.kafka).items() if k not in before}
        interrupted = [k for k, kinds in markers.items() if "end" not in kinds]
        assert interrupted, f"the kill did not land inside a snapshot: {markers}"
        for ledger_id in rng.sample(stack.cluster.ledger_ids(), 3):
            stack.delete_ledger(ledger_id)
        stack.cluster.create_ledger(entries=2)
        after_watcher_kill(stack)
        snapshot_s = stack.settle("watcher killed mid-snapshot, then restarted")
        stack.wait_read_to_end()
        stack.assert_no_alert_lost()
        assert stack.kafka_dead_letters() == [], "the watcher published nothing a job should reject"
        print(
            f"\nseed {chaos_seed + 2}: settled {stream_s:.0f} s after the mid-stream kill, "
            f"{snapshot_s:.0f} s after the mid-snapshot kill (snapshot {interrupted[0][:8]} interrupted)"
        )
