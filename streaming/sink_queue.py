"""The ledger lane's sink, pipelined: the lane decides its next batch while the sink applies this one.

Run one after the other, the lane's work and the sink's work add up. :class:`SinkQueue` takes a batch's
decisions from the lane (:meth:`SinkQueue.put`), writes them durably to
``<checkpoint>/sink-queue/<batch id>.arrow`` and returns, while a worker thread runs
:meth:`~streaming.sink.AuditSink.process` on the queued batches in order. At most ``depth`` batches wait
(then ``put`` blocks: back-pressure, memory bounded).

No batch is lost: the lane saves its state (the batch's commit) only after ``put`` returned, i.e. after the
decisions are on disk; a file is removed only after the sink processed it. A job that starts again first
processes the files left over (:meth:`SinkQueue.recover`), in batch order, before its lanes start. The sink
is replay-safe per batch (see :meth:`~streaming.sink.AuditSink.process`), so a batch processed from its file
and then again by the lane's own replay (a crash between the file and the lane's commit) changes nothing the
second time. A sink failure stops the job: the next ``put`` (or :meth:`SinkQueue.drain`) raises it, and its
file stays for the restart.

Example:
    >>> class Sink:  # stands in for AuditSink in this doctest
    ...     busy = __import__("threading").Lock(); stopping = __import__("threading").Event(); seen = []
    ...     def process(self, table, batch_id): self.seen.append((batch_id, table.num_rows))
    >>> import tempfile, pyarrow as pa
    >>> queue = SinkQueue(Sink(), Path(tempfile.mkdtemp()))
    >>> queue.put(pa.table({"kind": ["x", "y"]}), 0)
    >>> queue.drain(), Sink.seen, queue.leftovers()
    (True, [(0, 2)], [])
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from pathlib import Path
from typing import Any

import pyarrow as pa

from connectors import storage
from core.errors import ConfigError

logger = logging.getLogger(__name__)

_SUFFIX = ".arrow"


class SinkQueue:
    """Queues a batch's decisions durably and applies them in a worker thread, in batch order."""

    def __init__(self, sink: Any, directory: str | Path, *, depth: int = 1) -> None:
        self.sink = sink
        self.directory = directory
        self.depth = max(1, depth)
        self._pending: deque[tuple[int, pa.Table]] = deque()
        self._cond = threading.Condition()
        self._failure: BaseException | None = None
        self._running = False  # a batch is in the sink right now
        self._putting = 0  # put calls between their checks and their queueing
        self._worker: threading.Thread | None = None
        storage.make_dirs(directory)

    # -- the lane's side -------------------------------------------------------------------------------
    def put(self, decisions: pa.Table, batch_id: int) -> None:
        """Queue a batch (durably) once there is room; raises the sink's failure, if any."""
        with self._cond:
            while len(self._pending) >= self.depth and self._failure is None:
                self._cond.wait(1.0)
            self._raise_failure()
            if self.sink.stopping.is_set():
                from streaming.sink import SinkStopping

                raise SinkStopping(f"batch {batch_id} arrived while the job is stopping; it will be replayed")
            self._putting += 1
        written = False
        try:
            self._write(decisions, batch_id)
            written = True
        finally:
            with self._cond:
                self._putting -= 1
                if written:  # not written: Spark's batch fails and is run again
                    self._pending.append((batch_id, decisions))
                    self._ensure_worker()
                self._cond.notify_all()

    def _write(self, decisions: pa.Table, batch_id: int) -> None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, decisions.schema) as writer:
            writer.write_table(decisions)
        storage.write_atomic(self._path(batch_id), sink.getvalue())

    def _path(self, batch_id: int) -> str:
        return storage.join(self.directory, f"{batch_id:020d}{_SUFFIX}")

    # -- the worker ---------------------------------------------------------------------------------------
    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="bkaudit-sink", daemon=True)
            self._worker.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    if not self._cond.wait(5.0) and not self._pending:
                        self._worker = None
                        return
                batch_id, decisions = self._pending[0]
                self._running = True
            try:
                self._apply(decisions, batch_id)
            except BaseException as err:  # handed to Spark's thread, which fails the query
                logger.error("the sink failed on batch %d: %s", batch_id, err)
                with self._cond:
                    self._failure, self._running = err, False
                    self._worker = None
                    self._cond.notify_all()
                return
            with self._cond:
                self._pending.popleft()
                self._running = False
                self._cond.notify_all()

    def _apply(self, decisions: pa.Table, batch_id: int) -> None:
        with self.sink.busy:
            self.sink.process(decisions, batch_id)
        storage.delete(self._path(batch_id))

    @property
    def failure(self) -> BaseException | None:
        """The sink's error that stopped the worker (the job must stop), or None."""
        return self._failure

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"the sink failed: {self._failure}") from self._failure

    # -- lifecycle ----------------------------------------------------------------------------------------
    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued batch is applied; False on timeout. Raises the sink's failure."""
        with self._cond:
            ok = self._cond.wait_for(
                lambda: (
                    (not self._pending and not self._running and not self._putting)
                    or self._failure is not None
                ),
                timeout_s,
            )
            self._raise_failure()
            return bool(ok)

    def leftovers(self) -> list[int]:
        """Batch ids whose decisions were queued but not applied (a stop or crash before the worker)."""
        names = storage.list_files(self.directory)
        return sorted(int(name.removesuffix(_SUFFIX)) for name in names if name.endswith(_SUFFIX))

    def recover(self) -> int:
        """Apply the batches a previous run queued and did not apply, in order; returns how many."""
        done = 0
        for name in storage.list_files(self.directory):
            if name.endswith(".partial"):  # an earlier version's: its batch was not committed, it runs again
                storage.delete(storage.join(self.directory, name))
        for batch_id in self.leftovers():
            path = self._path(batch_id)
            try:
                decisions = pa.ipc.open_file(pa.py_buffer(storage.read_bytes(path))).read_all()
            except (
                OSError,
                pa.ArrowInvalid,
            ) as err:  # written atomically: only a damaged disk or a hand edit
                raise ConfigError(
                    f"{path}: not a queued batch ({err}); reset the checkpoint (docs/troubleshooting.md)"
                ) from None
            logger.info("applying batch %d queued by the previous run", batch_id)
            self._apply(decisions, batch_id)
            done += 1
        return done
