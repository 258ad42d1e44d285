"""The pipelined sink's queue: order, back-pressure, durability, failures and recovery (no services)."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from core.errors import ConfigError
from streaming.sink import SinkStopping
from streaming.sink_queue import SinkQueue


class RecordingSink:
    """Stands in for AuditSink: records what it applied; ``fail_on`` raises for that batch id."""

    def __init__(self, *, delay_s: float = 0.0, fail_on: int | None = None) -> None:
        self.busy = threading.Lock()
        self.stopping = threading.Event()
        self.applied: list[tuple[int, int]] = []
        self.delay_s = delay_s
        self.fail_on = fail_on

    def process(self, table: pa.Table, batch_id: int) -> None:
        time.sleep(self.delay_s)
        if batch_id == self.fail_on:
            raise ValueError(f"batch {batch_id} is bad")
        self.applied.append((batch_id, table.num_rows))


def decisions(rows: int) -> pa.Table:
    return pa.table({"kind": ["ledger_state"] * rows})


def test_batches_are_applied_in_order_and_their_files_removed(tmp_path):
    sink = RecordingSink(delay_s=0.01)
    queue = SinkQueue(sink, tmp_path)
    for batch_id in range(5):
        queue.put(decisions(batch_id + 1), batch_id)
    assert queue.drain(10)
    assert sink.applied == [(i, i + 1) for i in range(5)]
    assert queue.leftovers() == [] and list(tmp_path.iterdir()) == []


class GatedSink(RecordingSink):
    """A sink whose batches each wait for the test to open their gate (no timing: the test decides)."""

    def __init__(self) -> None:
        super().__init__()
        self.started = {batch_id: threading.Event() for batch_id in range(2)}
        self.gates = {batch_id: threading.Event() for batch_id in range(2)}

    def process(self, table: pa.Table, batch_id: int) -> None:
        self.started[batch_id].set()
        assert self.gates[batch_id].wait(30), f"batch {batch_id}'s gate never opened"
        super().process(table, batch_id)


def _put_in_thread(queue: SinkQueue, batch_id: int) -> threading.Thread:
    thread = threading.Thread(target=queue.put, args=(decisions(1), batch_id), daemon=True)
    thread.start()
    return thread


def test_put_returns_while_the_sink_works_and_waits_when_the_queue_is_full(tmp_path):
    sink = GatedSink()
    queue = SinkQueue(sink, tmp_path, depth=1)
    first = _put_in_thread(queue, 0)
    first.join(30)
    assert not first.is_alive(), "put waited for the sink"  # Spark goes on with the next batch meanwhile
    assert sink.started[0].wait(30)
    second = _put_in_thread(queue, 1)  # waits for batch 0: one batch queued at most
    second.join(0.2)
    assert second.is_alive(), "put did not wait while the queue was full"
    sink.gates[0].set()
    second.join(30)
    assert not second.is_alive()
    assert queue.leftovers() == [1]  # on disk until applied
    sink.gates[1].set()
    queue.drain(10)
    assert [b for b, _ in sink.applied] == [0, 1]


def test_a_failed_batch_fails_the_next_put_and_stays_for_the_restart(tmp_path):
    queue = SinkQueue(RecordingSink(fail_on=1), tmp_path)
    queue.put(decisions(1), 0)
    queue.put(decisions(2), 1)
    with pytest.raises(RuntimeError, match="batch 1 is bad"):
        queue.drain(10)
    with pytest.raises(RuntimeError, match="batch 1 is bad"):
        queue.put(decisions(3), 2)
    assert isinstance(queue.failure, ValueError)
    assert queue.leftovers() == [1]

    restarted = RecordingSink()
    assert SinkQueue(restarted, tmp_path).recover() == 1
    assert restarted.applied == [(1, 2)]  # the queued decisions, read back from disk
    assert list(tmp_path.iterdir()) == []


def test_recover_ignores_a_file_the_crash_left_half_written(tmp_path):
    (tmp_path / "00000000000000000007.partial").write_bytes(b"half")
    sink = RecordingSink()
    assert SinkQueue(sink, tmp_path).recover() == 0
    assert sink.applied == [] and list(tmp_path.iterdir()) == []


def test_a_stopping_sink_takes_no_new_batch_and_applies_the_queued_ones(tmp_path):
    sink = RecordingSink(delay_s=0.2)
    queue = SinkQueue(sink, tmp_path)
    queue.put(decisions(1), 0)
    sink.stopping.set()
    with pytest.raises(SinkStopping):
        queue.put(decisions(1), 1)
    assert queue.drain(10)
    assert sink.applied == [(0, 1)] and queue.leftovers() == []


def test_a_damaged_queue_file_is_one_line_naming_it(tmp_path):
    (tmp_path / "00000000000000000003.arrow").write_bytes(b"not arrow")
    with pytest.raises(
        ConfigError, match=r"00000000000000000003.arrow: not a queued batch .*reset the checkpoint"
    ):
        SinkQueue(RecordingSink(), tmp_path).recover()
