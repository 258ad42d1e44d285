"""Micro-batches run by a thread in the driver: the membership lane's engine, in place of a Spark query.

A Spark query's micro-batch needs task slots, and the ledger lane's stateful batches hold them: measured on
this machine (``tests/benchmarks/bench_stream.py``, 20 k ledgers, ``local[2]``), a membership query waited
4-6 s from its trigger to its ``foreachBatch`` (``latestOffset`` 0.9-1.0 s in the Python source's planner
process, ``addBatch`` 3.2-4.8 s, of which the lane itself used 0.4 s). Here the same planning and reading
code runs in the driver, and a loss reaches the lane after a few broker round trips.

It keeps a Spark query's guarantees with a checkpoint of its own:

- *the same planner*: :class:`~connectors.kafka.planner.KafkaPlanner` plans every batch (offsets,
  topic fingerprints, ``failOnDataLoss``, broker outages with back-off), so both lanes read a recreated or
  truncated topic the same way;
- *a write-ahead offset log*: ``offsets/<batch id>.json`` holds a batch's start, end and batch time before
  the batch runs; the caller's ``committed(batch id)`` (the lane's saved state) says it finished. On start,
  a logged batch that did not finish runs again with exactly its records and batch time, so it decides what
  its first attempt decided.

The handle answers like a ``StreamingQuery`` (``isActive``, ``exception()``, ``stop()``,
``awaitTermination()``, ``processAllAvailable()``, ``recentProgress``), so the job treats both lanes alike.

Example:
    >>> import tempfile
    >>> log = OffsetLog(Path(tempfile.mkdtemp()))
    >>> log.write(0, {"t": {"0": 0}}, {"t": {"0": 5}}, 1_700_000_000_000)
    >>> log.latest()
    (0, {'batch_time_ms': 1700000000000, 'end': {'t': {'0': 5}}, 'start': {'t': {'0': 0}}})
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

from connectors import storage
from connectors.kafka.planner import ARROW_RECORD_SCHEMA
from core.domain.alerts import rfc3339_ms
from core.errors import ConfigError

logger = logging.getLogger(__name__)

#: Progress entries kept (``recentProgress``), as Spark keeps 100 by default.
PROGRESS_KEPT = 100


class BatchFiles:
    """One small JSON document per micro-batch in a directory, written atomically and durably; the newest
    ``keep`` are kept. A crash leaves either the previous files or the new one, never a torn file."""

    def __init__(self, directory: str | Path, keep: int = 100) -> None:
        self.directory = directory
        self.keep = keep

    def batches(self) -> list[int]:
        names = (name.removesuffix(".json") for name in storage.list_files(self.directory))
        return sorted(int(stem) for stem in names if stem.isdigit())

    def read(self, batch_id: int) -> dict[str, Any]:
        """One batch's document; a file that is not one (written by hand, a damaged disk) is a ConfigError
        naming it: the checkpoint cannot be trusted, a person must reset it."""
        path = storage.join(self.directory, f"{batch_id}.json")
        try:
            document = json.loads(storage.read_bytes(path))
        except (ValueError, UnicodeDecodeError) as err:
            raise ConfigError(
                f"{path}: not a batch file ({err}); reset the checkpoint (docs/troubleshooting.md)"
            ) from None
        if not isinstance(document, dict):
            raise ConfigError(
                f"{path}: not a batch file (a JSON {type(document).__name__}); reset the checkpoint"
            )
        return document

    def before(self, batch_id: int) -> dict[str, Any] | None:
        """The document of the newest batch before ``batch_id`` (None: there is none)."""
        earlier = [b for b in self.batches() if b < batch_id]
        return self.read(earlier[-1]) if earlier else None

    def saved(self, batch_id: int) -> bool:
        return storage.exists(storage.join(self.directory, f"{batch_id}.json"))

    def save(self, batch_id: int, document: dict[str, Any]) -> None:
        text = json.dumps(document, separators=(",", ":"), sort_keys=True)
        storage.write_atomic(storage.join(self.directory, f"{batch_id}.json"), text.encode())
        for old in self.batches()[: -self.keep]:
            storage.delete(storage.join(self.directory, f"{old}.json"))


class LaneStates(BatchFiles):
    """A driver-run lane's state after each of its micro-batches, one small JSON file per batch: saving it
    is the batch's commit, and a replay starts from :meth:`BatchFiles.before` its batch.

    Example:
        >>> import tempfile
        >>> states = LaneStates(Path(tempfile.mkdtemp()))
        >>> states.save(3, {"tracked": [7]}); states.before(4), states.before(3)
        ({'tracked': [7]}, None)
    """

    def __init__(self, directory: str | Path, keep: int = 20) -> None:
        super().__init__(directory, keep)


class OffsetLog(BatchFiles):
    """One file per planned batch: its start and end offsets and batch time, written before it runs."""

    def latest(self) -> tuple[int, dict[str, Any]] | None:
        """The newest logged batch and its entry (None: nothing logged yet)."""
        batches = self.batches()
        return (batches[-1], self.read(batches[-1])) if batches else None

    def write(self, batch_id: int, start: dict[str, Any], end: dict[str, Any], batch_time_ms: int) -> None:
        """Log a batch (it runs only after this returns)."""
        self.save(batch_id, {"start": start, "end": end, "batch_time_ms": batch_time_ms})


class DriverMicroBatches:
    """Plans and runs micro-batches of a Kafka stream reader in a driver thread; see the module docstring.

    ``process(records, batch_id)`` gets the batch's records as one Arrow table (the source's columns plus
    ``batch_time``); ``committed(batch_id)`` says whether a batch's effects are durable.
    """

    def __init__(
        self,
        name: str,
        reader: Any,
        process: Callable[[pa.Table, int], Any],
        committed: Callable[[int], bool],
        log: OffsetLog,
        *,
        interval_s: float,
        available_now: bool = False,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        write_check: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        # Raises once the job's hold on its checkpoint is gone (a lost lease): run before a batch is logged,
        # so a job that lost its lease starts no batch and writes nothing more to the checkpoint.
        self._write_check = write_check
        self._running: tuple[int, float] | None = None  # (batch id, when it was planned)
        self._on_progress = on_progress
        self._reader = reader
        self._process = process
        self._committed = committed
        self._log = log
        self._interval_s = interval_s
        self._available_now = available_now
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._idle_plannings = 0  # plannings that found nothing new (processAllAvailable waits on it)
        self._changed = threading.Condition()
        self._trigger_active = False
        self.recentProgress: deque[dict[str, Any]] = deque(maxlen=PROGRESS_KEPT)
        self._readers = ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"{name}-read")
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> DriverMicroBatches:
        self._thread.start()
        return self

    # ------------------------------------------------------------------------------- the query's face

    @property
    def isActive(self) -> bool:
        return self._thread.is_alive()

    def exception(self) -> BaseException | None:
        return self._error

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        return self.recentProgress[-1] if self.recentProgress else None

    @property
    def status(self) -> dict[str, Any]:
        return {"isTriggerActive": self._trigger_active, "isDataAvailable": False, "message": self.name}

    def stop(self, timeout_s: float = 120.0) -> None:
        """Stop after the running batch (a batch is never interrupted half-way)."""
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def awaitTermination(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        if self._error is not None:
            raise RuntimeError(f"{self.name} failed: {self._error}") from self._error
        return not self._thread.is_alive()

    def processAllAvailable(self) -> None:
        """Return once a planning that started after this call found nothing new (or the lane ended)."""
        with self._changed:
            seen = self._idle_plannings
            while self._thread.is_alive() and self._idle_plannings < seen + 2:
                self._changed.wait(0.5)
        if self._error is not None:
            raise RuntimeError(f"{self.name} failed: {self._error}") from self._error

    # ------------------------------------------------------------------------------------------ the loop

    def _run(self) -> None:
        try:
            start, batch_id = self._recover()
            if self._available_now:
                self._reader.prepareForTriggerAvailableNow()
            while not self._stopping.is_set():
                planned_at = time.monotonic()
                end = self._plan(start)
                if end is None:
                    if self._available_now:
                        return
                    self._wait(planned_at)
                    continue
                batch_time_ms = int(time.time() * 1000)
                if self._write_check is not None:
                    self._write_check()
                self._log.write(batch_id, start, end, batch_time_ms)
                self._run_batch(batch_id, start, end, batch_time_ms, planned_at)
                start, batch_id = end, batch_id + 1
                if not getattr(self._reader, "waits_for_records", False):  # else its planning waits
                    self._wait(planned_at)
        except BaseException as error:  # the job stops with it (exit 2 for a source's ServiceError)
            self._error = error
            # Not logged as an error here: the job raises it and prints it as its one line (exit 2).
            logger.debug("%s stopped: %s", self.name, error, exc_info=True)
        finally:
            self._reader.stop()
            self._readers.shutdown(wait=False)
            with self._changed:
                self._changed.notify_all()

    def _recover(self) -> tuple[dict[str, Any], int]:
        """Where to go on: after the newest logged batch, run again first if it did not finish."""
        logged = self._log.latest()
        if logged is None:
            return self._reader.initialOffset(), 0
        batch_id, entry = logged
        if not self._committed(batch_id):
            logger.info(
                "%s: batch %d did not finish before the last stop; running it again", self.name, batch_id
            )
            self._run_batch(batch_id, entry["start"], entry["end"], entry["batch_time_ms"], time.monotonic())
        return entry["end"], batch_id + 1

    def _plan(self, start: dict[str, Any]) -> dict[str, Any] | None:
        """The next batch's end offset, or None when nothing new arrived."""
        end: dict[str, Any] = self._reader.latestOffset(start, self._reader.getDefaultReadLimit())
        if end == start:
            with self._changed:
                self._idle_plannings += 1
                self._changed.notify_all()
            return None
        return end

    def _wait(self, planned_at: float) -> None:
        remaining = self._interval_s - (time.monotonic() - planned_at)
        if remaining > 0:
            self._stopping.wait(remaining)

    def running(self) -> tuple[int, float] | None:
        """The batch running now and its seconds so far (None between batches): a batch that runs for long
        waits on something (a store or a broker retrying), which the job reports."""
        running = self._running
        return None if running is None else (running[0], time.monotonic() - running[1])

    def _run_batch(
        self, batch_id: int, start: dict[str, Any], end: dict[str, Any], batch_time_ms: int, planned_at: float
    ) -> None:
        self._trigger_active = True
        self._running = (batch_id, planned_at)
        try:
            read_started = time.monotonic()
            records = self._read(start, end, batch_time_ms)
            processed_started = time.monotonic()
            self._process(records, batch_id)
            self._reader.commit(end)
            finished = time.monotonic()
        finally:
            self._trigger_active = False
            self._running = None
        self._report(
            {
                "name": self.name,
                "batchId": batch_id,
                "timestamp": rfc3339_ms(int((time.time() - (finished - planned_at)) * 1000)),
                "numInputRows": records.num_rows,
                "durationMs": {
                    "latestOffset": round((read_started - planned_at) * 1000),
                    "getBatch": round((processed_started - read_started) * 1000),
                    "addBatch": round((finished - processed_started) * 1000),
                    "triggerExecution": round((finished - planned_at) * 1000),
                },
            }
        )

    def _report(self, progress: dict[str, Any]) -> None:
        self.recentProgress.append(progress)
        if self._on_progress is not None:
            self._on_progress(progress)

    def _read(self, start: dict[str, Any], end: dict[str, Any], batch_time_ms: int) -> pa.Table:
        """Every range of the batch, read concurrently (librdkafka waits outside the GIL)."""
        ranges = list(self._reader.partitions(start, end))
        parts = list(self._readers.map(lambda r: list(self._reader.read(r)), ranges))
        batches = [batch for part in parts for batch in part]
        table = pa.Table.from_batches(batches, schema=ARROW_RECORD_SCHEMA)
        batch_time = pa.repeat(pa.scalar(batch_time_ms * 1000, pa.timestamp("us", tz="UTC")), table.num_rows)
        return table.append_column("batch_time", batch_time)


__all__ = ["BatchFiles", "DriverMicroBatches", "LaneStates", "OffsetLog"]
