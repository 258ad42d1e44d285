"""RestartingQuery: which failures start the query again, how often in a row, and what its callers see."""

from __future__ import annotations

import time
from typing import Any

import pytest

from streaming.restarting_query import RESTARTS_IN_A_ROW, RestartingQuery

WORKER_TIMEOUT = "org.apache.spark.SparkException: Python worker failed to connect back.\n  at ..."


class FakeQuery:
    """A query that runs, or has failed with ``error`` after completing ``batches`` batches."""

    def __init__(self, error: str | None = None, batches: int = 0) -> None:
        self.error = error
        self.recentProgress = [{"batchId": i} for i in range(batches)]
        self.stopped = False
        self.processed = 0

    @property
    def isActive(self) -> bool:
        return self.error is None and not self.stopped

    def exception(self) -> str | None:
        return self.error

    def processAllAvailable(self) -> None:
        if self.error is not None:
            raise RuntimeError(self.error)
        self.processed += 1

    def awaitTermination(self, timeout: float | None = None) -> Any:
        if self.error is not None:
            raise RuntimeError(self.error)
        return timeout is None  # with a timeout: still running when it ends

    def stop(self) -> None:
        self.stopped = True


def starts(*queries: FakeQuery) -> tuple[list[FakeQuery], Any]:
    """A start function handing out ``queries`` in order, and the list of those it handed out."""
    handed: list[FakeQuery] = []
    pending = iter(queries)

    def start() -> FakeQuery:
        handed.append(next(pending))
        return handed[-1]

    return handed, start


def test_a_python_worker_timeout_starts_the_query_again_and_the_caller_sees_it_running() -> None:
    handed, start = starts(FakeQuery(WORKER_TIMEOUT), FakeQuery())
    query = RestartingQuery(start, name="timers")
    assert query.isActive and query.exception() is None
    assert query.restarts == 1 and len(handed) == 2


def test_the_restarts_in_a_row_are_bounded_and_then_the_failure_stands() -> None:
    failing = [FakeQuery(WORKER_TIMEOUT) for _ in range(RESTARTS_IN_A_ROW + 1)]
    handed, start = starts(*failing, FakeQuery())
    query = RestartingQuery(start, name="timers")
    assert not query.isActive
    assert query.exception() == WORKER_TIMEOUT
    assert query.restarts == RESTARTS_IN_A_ROW and len(handed) == RESTARTS_IN_A_ROW + 1


def test_a_query_that_completed_batches_before_failing_starts_a_new_count() -> None:
    # Three quick failures use up the bound; the fourth query ran batches before it failed, so the count
    # starts again: it and the two quick failures after it are restarted too.
    queue = [FakeQuery(WORKER_TIMEOUT) for _ in range(RESTARTS_IN_A_ROW)]
    queue += [FakeQuery(WORKER_TIMEOUT, batches=5)]
    queue += [FakeQuery(WORKER_TIMEOUT) for _ in range(RESTARTS_IN_A_ROW - 1)]
    _, start = starts(*queue, FakeQuery())
    query = RestartingQuery(start, name="timers")
    assert query.isActive and query.restarts == 2 * RESTARTS_IN_A_ROW


@pytest.mark.parametrize(
    "error",
    ["java.lang.OutOfMemoryError: Java heap space", "core.errors.ServiceError: bkaudit_kafka: Kafka at k:9"],
)
def test_any_other_failure_is_the_querys_failure_at_once(error: str) -> None:
    handed, start = starts(FakeQuery(error), FakeQuery())
    query = RestartingQuery(start, name="timers")
    assert not query.isActive and query.exception() == error
    assert query.restarts == 0 and len(handed) == 1


def test_process_all_available_goes_on_with_the_restarted_query() -> None:
    handed, start = starts(FakeQuery(WORKER_TIMEOUT), FakeQuery())
    query = RestartingQuery(start, name="timers")
    query.processAllAvailable()
    assert handed[1].processed == 1


def test_await_termination_raises_what_a_restart_does_not_get_past() -> None:
    _, start = starts(FakeQuery("java.lang.OutOfMemoryError"))
    with pytest.raises(RuntimeError, match="OutOfMemoryError"):
        RestartingQuery(start, name="timers").awaitTermination(1.0)
    _, start = starts(FakeQuery(WORKER_TIMEOUT), FakeQuery())
    assert RestartingQuery(start, name="timers").awaitTermination(1.0) is False  # still running


def test_other_attributes_and_stop_are_the_current_querys() -> None:
    handed, start = starts(FakeQuery(WORKER_TIMEOUT, batches=2), FakeQuery(batches=1))
    query = RestartingQuery(start, name="timers")
    assert query.isActive and query.recentProgress == [{"batchId": 0}]
    query.stop()
    assert handed[1].stopped and not query.isActive


def test_a_query_nobody_polls_is_restarted_by_its_watcher() -> None:
    # A caller that only reads progress (the demo) never asks isActive: the watcher thread restarts it.
    first = FakeQuery()
    handed, start = starts(first, FakeQuery())
    query = RestartingQuery(start, name="timers", watch_every_s=0.01)
    first.error = WORKER_TIMEOUT  # fails after its start
    deadline = time.monotonic() + 30
    while len(handed) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(handed) == 2 and query.restarts == 1


def test_a_stopped_query_is_never_started_again() -> None:
    first = FakeQuery()
    handed, start = starts(first, FakeQuery())
    query = RestartingQuery(start, name="timers", watch_every_s=0.01)
    query.stop()
    first.error = WORKER_TIMEOUT  # a failure while stopping
    time.sleep(0.1)
    assert not query.isActive and len(handed) == 1


class RestartedWhileLookedAt(FakeQuery):
    """A failed query whose restart by another thread (the watcher) lands right after a caller read it:
    the first read of its state starts the successor, as the watcher would in between."""

    def __init__(self) -> None:
        super().__init__(WORKER_TIMEOUT)
        self.owner: RestartingQuery | None = None
        self.interleaved = False

    def _interleave(self) -> None:
        if self.owner is not None and not self.interleaved:
            self.interleaved = True
            self.owner._renew()  # the watcher's restart, between the caller's read and its check

    def exception(self) -> str | None:
        self._interleave()
        return self.error

    @property
    def isActive(self) -> bool:
        self._interleave()
        return False


@pytest.mark.parametrize("ask", ["exception", "isActive"])
def test_a_failure_another_thread_already_restarted_is_not_reported(ask: str) -> None:
    failed = RestartedWhileLookedAt()
    handed, start = starts(failed, FakeQuery())
    query = RestartingQuery(start, name="timers", watch_every_s=None)
    failed.owner = query
    if ask == "exception":
        assert query.exception() is None
    else:
        assert query.isActive
    assert failed.interleaved and len(handed) == 2 and query.restarts == 1
