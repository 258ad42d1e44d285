"""Liveness probes of bookies whose registration vanished: does the bookie still answer on its port?

A ZooKeeper outage longer than the bookies' session timeout expires every session at once: every
registration vanishes while every bookie still serves. The watcher hands each bookie whose registration
vanished to :class:`LivenessProbes`, which asks it at once and then every ``interval_s`` while it stays
missing, and reports the first answer and every change (answering ↔ silent). The job's membership rule
(:class:`~core.domain.rules.lost_bookie.DisruptionRule`) turns those reports into "registration lost" or
"lost".

The probe is a plain ``READ_ENTRY`` of a ledger id no cluster allocates (no fencing, no master key): any
answer of the bookie protocol, whatever its status (``ENOLEDGER`` normally, ``EUA`` from a bookie that wants
authentication), or a refused ``START_TLS`` or TLS handshake, means the bookie process is alive and serving.
A timeout, a refused or reset connection or an undecodable answer means silent. ``READ_ENTRY`` rather than
the entry list, since DbLedgerStorage bookies (Pulsar's) never answer the list.

A bookie silent for ``give_up_s`` is no longer probed (it is lost by then under any rule).

Example:
    >>> from connectors.bookie.client import NoLedger
    >>> answered_from(NoLedger()), answered_from(ConnectionFailed("connection refused"))
    ((True, 'answered no_ledger'), (False, 'connection refused'))
    >>> # I/O, in a thread of its own:
    >>> # probes = LivenessProbes(lambda bookie, answered, address, detail: print(bookie, answered),
    >>> #                         interval_s=5.0, timeout_s=2.0)
    >>> # probes.start(); probes.watch("bookie-1:3181", "10.0.0.1:3181")
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from connectors.bookie.client import (
    BadResponse,
    BlockingBookieClient,
    ConnectionFailed,
    ProbeRequest,
    ProbeResult,
    Timeout,
    refusal_of_result,
)
from connectors.bookie.tls import BookieTlsConfig

logger = logging.getLogger(__name__)

#: The ledger a liveness probe reads: the largest ledger id, which BookKeeper's id generators never reach.
LIVENESS_LEDGER_ID = 2**63 - 1
#: How long a silent bookie is still probed (it is lost by then under any rule).
DEFAULT_GIVE_UP_S = 600.0

#: ``report(bookie_id, answered, address, detail)``, called on the prober's thread.
Report = Callable[[str, bool, str, str], None]


class _Prober(Protocol):
    def probe_many(
        self, requests: list[ProbeRequest], concurrency: int = 64, timeout: float | None = None
    ) -> list[ProbeResult]: ...

    def close(self) -> None: ...


def answered_from(result: ProbeResult) -> tuple[bool, str]:
    """Whether a probe result is an answer of a live bookie, and what to tell people about it.

    Example:
        >>> answered_from(Timeout(2.0))
        (False, 'no answer in 2.0 s')
        >>> from connectors.bookie.client import TlsRefused
        >>> answered_from(TlsRefused("the bookie requires a client certificate"))
        (True, 'answered tls_refused: the bookie requires a client certificate')
    """
    if isinstance(result, Timeout):
        return False, f"no answer in {result.timeout_s} s"
    if isinstance(result, ConnectionFailed | BadResponse):
        return False, result.reason
    refusal = refusal_of_result(result)  # alive, but refusing bkaudit: say what it wants
    return True, f"answered {result.kind}" + (f": {refusal}" if refusal else "")


@dataclass
class _Watched:
    address: str
    next_at: float
    answered: bool | None = None
    silent_since: float | None = None


class LivenessProbes:
    """Probes the bookies it is told to watch, on a thread of its own; see the module docstring."""

    def __init__(
        self,
        report: Report,
        *,
        interval_s: float,
        timeout_s: float,
        give_up_s: float = DEFAULT_GIVE_UP_S,
        client: _Prober | None = None,
        clock: Callable[[], float] = time.monotonic,
        tls: BookieTlsConfig | None = None,
    ) -> None:
        self.report = report
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.give_up_s = give_up_s
        self._client = client
        self._clock = clock
        self._tls = tls
        self._watched: dict[str, _Watched] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the probing thread."""
        self._thread = threading.Thread(target=self._loop, name="bkaudit-liveness", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop probing and close the connections (idempotent)."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._client is not None:
            self._client.close()

    def watch(self, bookie_id: str, address: str) -> None:
        """Probe ``bookie_id`` at ``address`` now and while it stays watched (thread-safe)."""
        with self._lock:
            self._watched[bookie_id] = _Watched(address, next_at=self._clock())
        self._wake.set()

    def forget(self, bookie_id: str) -> None:
        """Stop probing ``bookie_id`` (it registered again); a probe in flight is not reported."""
        with self._lock:
            self._watched.pop(bookie_id, None)

    def watched(self) -> list[str]:
        """The bookies being probed, sorted."""
        with self._lock:
            return sorted(self._watched)

    def probe_due(self) -> float | None:
        """Probe every bookie that is due, report what changed; returns the next due time (None: nothing)."""
        now = self._clock()
        with self._lock:
            due = {b: w.address for b, w in self._watched.items() if w.next_at <= now}
        if due:
            results = self._prober().probe_many(
                [ProbeRequest(address, LIVENESS_LEDGER_ID, 0) for address in due.values()],
                timeout=self.timeout_s,
            )
            for (bookie_id, address), result in zip(due.items(), results, strict=True):
                self._record(bookie_id, address, *answered_from(result))
        with self._lock:
            return min((w.next_at for w in self._watched.values()), default=None)

    def _record(self, bookie_id: str, address: str, answered: bool, detail: str) -> None:
        now = self._clock()
        with self._lock:
            watched = self._watched.get(bookie_id)
            if watched is None or watched.address != address:
                return  # forgotten (or watched again elsewhere) while the probe ran
            changed = watched.answered is not answered
            watched.answered = answered
            watched.next_at = now + self.interval_s
            if answered:
                watched.silent_since = None
            elif watched.silent_since is None:
                watched.silent_since = now
            if watched.silent_since is not None and now - watched.silent_since >= self.give_up_s:
                del self._watched[bookie_id]
        if changed:
            self.report(bookie_id, answered, address, detail)

    def _prober(self) -> _Prober:
        if self._client is None:
            self._client = BlockingBookieClient(
                timeout=self.timeout_s, connect_timeout=self.timeout_s, tls=self._tls
            )
        return self._client

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                next_at = self.probe_due()
            except Exception:
                logger.exception("liveness probes failed; trying again in %.1f s", self.interval_s)
                next_at = self._clock() + self.interval_s
            wait = None if next_at is None else max(0.0, next_at - self._clock())
            self._wake.wait(wait)
            self._wake.clear()


__all__ = ["LIVENESS_LEDGER_ID", "LivenessProbes", "answered_from"]
