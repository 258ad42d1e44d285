"""A Structured Streaming query that is started again from its checkpoint after a failure that passes.

Spark runs a driver-side Python worker for ``transformWithStateInPandas`` (the timers query's operator) and
waits a fixed 10 s for it to connect back (``PythonWorkerFactory.createSimpleWorker``); on a busy host,
Python's start-up takes longer and the query fails with "Python worker failed to connect back", although
nothing is wrong with the query or its data. :class:`RestartingQuery` starts such a query again, from its
checkpoint (so nothing is lost or applied twice), a bounded number of times in a row: a query that failed
before completing a batch counts against the bound, one that completed a batch resets it. Any other failure,
or one more than the bound, is the query's failure as before.

Example:
    >>> is_transient_failure("org.apache.spark.SparkException: Python worker failed to connect back.")
    True
    >>> is_transient_failure("java.lang.OutOfMemoryError: Java heap space")
    False
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

#: Failures that say nothing about the query: Spark's Python worker did not start in time.
TRANSIENT_FAILURES = ("Python worker failed to connect back",)
#: Restarts in a row (no batch completed in between) before the failure stands.
RESTARTS_IN_A_ROW = 5
#: How often a watcher thread looks, so that a query nobody polls is restarted too.
WATCH_EVERY_S = 1.0


def is_transient_failure(error: Any) -> bool:
    """Whether a query's failure (its exception, or its text) is one a restart gets past."""
    text = str(error)
    return any(marker in text for marker in TRANSIENT_FAILURES)


class RestartingQuery:
    """A query handle (``isActive``, ``exception()``, ``processAllAvailable()``, ``awaitTermination()``,
    ``stop()``; anything else is the current query's) that restarts the query after a transient failure.

    Example:
        >>> class Failed:
        ...     isActive, recentProgress = False, []
        ...     def exception(self): return "Python worker failed to connect back."
        >>> class Running:
        ...     isActive, recentProgress = True, []
        ...     def exception(self): return None
        >>> started = iter([Failed(), Running()])
        >>> query = RestartingQuery(lambda: next(started), name="timers", watch_every_s=None)
        >>> query.isActive, query.restarts
        (True, 1)
    """

    def __init__(
        self,
        start: Callable[[], Any],
        *,
        name: str,
        restarts_in_a_row: int = RESTARTS_IN_A_ROW,
        watch_every_s: float | None = WATCH_EVERY_S,
    ):
        self._start = start
        self.name = name
        self.limit = restarts_in_a_row
        self.restarts = 0  # all restarts so far
        self._in_a_row = 0
        self._lock = threading.RLock()
        self._stopped = threading.Event()
        self.query = start()
        if watch_every_s is not None:  # also when nobody asks (a caller that only reads progress)
            threading.Thread(
                target=self._watch, args=(watch_every_s,), name=f"{name}-restarts", daemon=True
            ).start()

    def _watch(self, every_s: float) -> None:
        while not self._stopped.wait(every_s):
            with self._lock:
                if self._stopped.is_set():
                    return
                self._renew()
                if not self.query.isActive:
                    return  # stopped, or a failure that stands: the callers see it

    def _renew(self) -> bool:
        """Start the query again while it failed transiently and the bound allows; True when it did."""
        with self._lock:
            renewed = False
            while not self._stopped.is_set() and self._restartable():
                self.query = self._start()
                renewed = True
            return renewed

    def _restartable(self) -> bool:
        """Whether the current query failed transiently and may start again (counted and logged if so)."""
        query = self.query
        error = query.exception()  # set once it failed, and then it has terminated
        if error is None or not is_transient_failure(error):
            return False
        if query.recentProgress:
            self._in_a_row = 0  # it completed batches since its start: this failure is a new one
        if self._in_a_row >= self.limit:
            return False
        self._in_a_row += 1
        self.restarts += 1
        logger.warning(
            "the %s query failed (%s); starting it again from its checkpoint (%d of %d in a row)",
            self.name,
            str(error).strip().splitlines()[0][:200],
            self._in_a_row,
            self.limit,
        )
        return True

    def _replaced(self, failed: Any) -> bool:
        """Whether the query that failed as ``failed`` runs again: restarted by another thread (the
        watcher) since the caller looked, or now. Without the first check a caller could report a failure
        that another thread had already got past."""
        with self._lock:
            return self.query is not failed or self._renew()

    @property
    def isActive(self) -> bool:
        while True:
            query = self.query
            if query.isActive:
                return True
            if not self._replaced(query):
                return False

    def exception(self) -> Any:
        while True:  # a failure seen here, after a check found none, is still restarted first
            query = self.query
            error = query.exception()
            if error is None or not self._replaced(query):
                return error

    def processAllAvailable(self) -> None:
        while True:
            query = self.query
            try:
                query.processAllAvailable()
                return
            except Exception:
                if not self._replaced(query):
                    raise

    def awaitTermination(self, timeout: float | None = None) -> Any:
        while True:
            query = self.query
            try:
                if timeout is None:
                    return query.awaitTermination()
                return query.awaitTermination(timeout)
            except Exception:
                if not self._replaced(query):
                    raise

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()
            self.query.stop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.query, name)
