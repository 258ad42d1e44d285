"""The loss path's right of way over the ledger lane's bulk work in the driver.

Both lanes run Python in one driver process, so they share one interpreter lock and, on a small machine, the
same cores. A loss must reach every alert in well under a second; a ledger-lane batch may take a little
longer. So while the membership lane runs a micro-batch (a read, the membership rules and, on a loss, the
loss owner's whole publish), the ledger lane's sink waits at its next stage boundary, and the ledger log's
fold waits before it starts. The wait is bounded (``max_wait_s``): a lane that stalls cannot stall the
other.

Example:
    >>> way = RightOfWay(max_wait_s=0.5)
    >>> with way.held():
    ...     way.holders
    1
    >>> way.give_way()  # nobody holds it: no wait
    0.0
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class RightOfWay:
    """Held by the urgent lane while it runs; the bulk work calls :meth:`give_way` between its steps."""

    def __init__(self, *, max_wait_s: float = 2.0, enabled: bool = True) -> None:
        self.max_wait_s = max_wait_s
        self.enabled = enabled
        self.holders = 0
        self.waited_s = 0.0  # all the time bulk work spent giving way (a metric)
        self._cond = threading.Condition()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the right of way for the ``with`` block (re-entrant, and across threads: a count)."""
        with self._cond:
            self.holders += 1
        try:
            yield
        finally:
            with self._cond:
                self.holders -= 1
                self._cond.notify_all()

    def give_way(self) -> float:
        """Wait while the urgent lane holds the right of way, at most ``max_wait_s``; the seconds waited."""
        if not self.enabled or not self.holders:
            return 0.0
        started = time.monotonic()
        deadline = started + self.max_wait_s
        with self._cond:
            while self.holders and (remaining := deadline - time.monotonic()) > 0:
                self._cond.wait(remaining)
        waited = time.monotonic() - started
        self.waited_s += waited
        return waited


__all__ = ["RightOfWay"]
