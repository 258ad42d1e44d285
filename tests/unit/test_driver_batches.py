"""The driver-run micro-batch engine: offsets logged before a batch runs, an unfinished batch replayed with
exactly its range and batch time, errors surfaced, ``availableNow`` and ``processAllAvailable``.

The planner here is a list of offsets in memory (the engine's contract with the Kafka source's reader:
``initialOffset``, ``latestOffset`` returning its ``start`` when nothing is new, ``partitions``, ``read``);
the real reader against a real broker runs in the integration and chaos tests of the job.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.kafka.planner import ARROW_RECORD_SCHEMA
from core.errors import ConfigError
from streaming.driver_batches import BatchFiles, DriverMicroBatches, OffsetLog


class ListReader:
    """Offsets are record counts of one partition; ``available`` grows as a test "produces"."""

    def __init__(self, available: int = 0) -> None:
        self.available = available
        self.stopped = False
        self.available_now_target: int | None = None

    def initialOffset(self) -> dict[str, Any]:
        return {"t": {"0": 0}}

    def getDefaultReadLimit(self) -> None:
        return None

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now_target = self.available

    def latestOffset(self, start: dict[str, Any], _limit: Any) -> dict[str, Any]:
        newest = self.available if self.available_now_target is None else self.available_now_target
        if newest == start["t"]["0"]:
            return start
        return {"t": {"0": newest}}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[tuple[int, int]]:
        return [(start["t"]["0"], end["t"]["0"])]

    def read(self, offsets: tuple[int, int]) -> list[pa.RecordBatch]:
        first, stop = offsets
        rows = [
            {"key": b"bookie/x", "value": b"v", "topic": "t", "partition": 0, "offset": o}
            for o in range(first, stop)
        ]
        return pa.Table.from_pylist(rows, schema=ARROW_RECORD_SCHEMA).to_batches()

    def commit(self, _end: dict[str, Any]) -> None:
        pass

    def stop(self) -> None:
        self.stopped = True


class Recorder:
    """The lane: records what each batch saw; ``committed`` is its saved state, as the membership lane's."""

    def __init__(self, log: OffsetLog, fail_on: int | None = None) -> None:
        self.log = log
        self.fail_on = fail_on
        self.seen: list[tuple[int, list[int], int, bool]] = []
        self.saved: set[int] = set()
        self.lock = threading.Lock()

    def process(self, records: pa.Table, batch_id: int) -> None:
        logged = self.log.latest()
        with self.lock:
            batch_time = records.column("batch_time").to_pylist()
            self.seen.append(
                (
                    batch_id,
                    records.column("offset").to_pylist(),
                    int(batch_time[0].timestamp() * 1000) if batch_time else -1,
                    logged is not None and logged[0] == batch_id,
                )
            )
        if batch_id == self.fail_on:
            raise RuntimeError("the lane failed")
        self.saved.add(batch_id)

    def committed(self, batch_id: int) -> bool:
        return batch_id in self.saved


def engine(reader: ListReader, lane: Recorder, log: OffsetLog, **options: Any) -> DriverMicroBatches:
    return DriverMicroBatches(
        "test-lane", reader, lane.process, lane.committed, log, interval_s=0.01, **options
    )


def test_batches_follow_each_other_and_each_is_logged_before_it_runs(tmp_path: Path) -> None:
    log = OffsetLog(tmp_path / "offsets")
    reader, lane = ListReader(available=3), Recorder(log)
    lanes = engine(reader, lane, log).start()
    lanes.processAllAvailable()
    reader.available = 5
    lanes.processAllAvailable()
    lanes.stop()
    assert [(batch, offsets) for batch, offsets, _, _ in lane.seen] == [(0, [0, 1, 2]), (1, [3, 4])]
    assert all(logged_first for *_, logged_first in lane.seen)
    assert log.latest() is not None and log.latest()[1]["end"] == {"t": {"0": 5}}  # type: ignore[index]
    assert not lanes.isActive and reader.stopped


def test_an_unfinished_batch_runs_again_with_its_records_and_batch_time(tmp_path: Path) -> None:
    log = OffsetLog(tmp_path / "offsets")
    reader, lane = ListReader(available=2), Recorder(log, fail_on=0)
    first = engine(reader, lane, log).start()
    with pytest.raises(RuntimeError):
        first.awaitTermination(10)
    ((_, offsets, batch_time, _),) = lane.seen

    reader.available = 4  # more arrived meanwhile: the replay still reads batch 0's range only
    lane.fail_on = None
    again = engine(reader, lane, log).start()
    again.processAllAvailable()
    again.stop()
    assert lane.seen[1] == (0, offsets, batch_time, True)
    assert [(batch, offs) for batch, offs, _, _ in lane.seen[2:]] == [(1, [2, 3])]


def test_a_finished_batch_is_not_run_again(tmp_path: Path) -> None:
    log = OffsetLog(tmp_path / "offsets")
    reader, lane = ListReader(available=2), Recorder(log)
    first = engine(reader, lane, log).start()
    first.processAllAvailable()
    first.stop()
    second = engine(reader, lane, log).start()
    second.processAllAvailable()
    second.stop()
    assert [batch for batch, *_ in lane.seen] == [0]


def test_a_failing_batch_stops_the_lane_with_its_error(tmp_path: Path) -> None:
    log = OffsetLog(tmp_path / "offsets")
    reader, lane = ListReader(available=1), Recorder(log, fail_on=0)
    lanes = engine(reader, lane, log).start()
    with pytest.raises(RuntimeError, match="the lane failed"):
        lanes.awaitTermination(10)
    assert not lanes.isActive
    assert str(lanes.exception()) == "the lane failed"
    assert not lane.committed(0)


def test_available_now_reads_what_was_there_at_start_then_ends(tmp_path: Path) -> None:
    log = OffsetLog(tmp_path / "offsets")
    reader, lane = ListReader(available=3), Recorder(log)
    lanes = engine(reader, lane, log, available_now=True).start()
    assert lanes.awaitTermination(10)
    assert [offsets for _, offsets, _, _ in lane.seen] == [[0, 1, 2]]


def test_progress_names_each_batch_with_its_rows_and_durations(tmp_path: Path) -> None:
    log = OffsetLog(tmp_path / "offsets")
    reader, lane = ListReader(available=3), Recorder(log)
    lanes = engine(reader, lane, log).start()
    lanes.processAllAvailable()
    lanes.stop()
    progress = lanes.lastProgress
    assert progress is not None and progress["batchId"] == 0 and progress["numInputRows"] == 3
    assert set(progress["durationMs"]) == {"latestOffset", "getBatch", "addBatch", "triggerExecution"}
    assert progress["timestamp"].endswith("Z")


def test_the_offset_log_keeps_the_newest_entries(tmp_path: Path) -> None:
    log = OffsetLog(tmp_path, keep=3)
    for batch in range(6):
        log.write(batch, {"t": {"0": batch}}, {"t": {"0": batch + 1}}, 1000 + batch)
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["3.json", "4.json", "5.json"]
    assert log.latest() == (5, {"start": {"t": {"0": 5}}, "end": {"t": {"0": 6}}, "batch_time_ms": 1005})


@pytest.mark.parametrize(
    "content",
    [b'{"start": {"t": {"0": 0}}, "end": {"t"', b"\xff\xfe\x00garbage", b"[1, 2, 3]", b""],
    ids=["truncated", "not text", "not an object", "empty"],
)
def test_a_damaged_offset_log_stops_the_lane_with_one_error_naming_the_file(
    tmp_path: Path, content: bytes
) -> None:
    log = OffsetLog(tmp_path / "offsets")
    log.write(0, {"t": {"0": 0}}, {"t": {"0": 1}}, 1000)
    (tmp_path / "offsets" / "0.json").write_bytes(content)
    reader, lane = ListReader(available=3), Recorder(log)
    lanes = engine(reader, lane, log).start()
    with pytest.raises(RuntimeError):
        lanes.awaitTermination(10)
    error = lanes.exception()
    assert isinstance(error, ConfigError)
    assert str(tmp_path / "offsets" / "0.json") in str(error) and "reset the checkpoint" in str(error)
    assert "\n" not in str(error)
    assert lane.seen == []  # nothing was processed from a log it could not read


@given(st.binary(max_size=200))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_bytes_in_a_batch_file_read_as_a_document_or_a_config_error(
    tmp_path: Path, content: bytes
) -> None:
    files = BatchFiles(tmp_path / "random")
    files.directory.mkdir(exist_ok=True)
    (files.directory / "7.json").write_bytes(content)
    try:
        document = files.read(7)
    except ConfigError as err:
        assert "7.json" in str(err)
    else:
        assert isinstance(document, dict)


def test_a_reader_that_waits_for_records_is_asked_again_at_once_after_a_batch(tmp_path: Path) -> None:
    log = OffsetLog(tmp_path / "offsets")
    reader = ListReader(available=1)
    reader.waits_for_records = True  # type: ignore[attr-defined]
    seen: list[int] = []

    def process(records: pa.Table, batch_id: int) -> None:
        seen.append(batch_id)
        reader.available = 2  # a record arrived while the batch ran

    lanes = DriverMicroBatches("test-lane", reader, process, lambda _b: True, log, interval_s=30.0).start()
    deadline = time.monotonic() + 10
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    lanes.stop(timeout_s=0)
    assert seen == [0, 1]  # the second batch did not wait out the 30 s interval
