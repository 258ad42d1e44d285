"""A single-active lease in ZooKeeper: one job per checkpoint across hosts.

The local lock (:mod:`streaming.checkpoint_lock`) is a ``flock``: it stops a second job on the same host
only. A driver that restarts on another host (a Kubernetes pod rescheduled, a Spark cluster driver) needs a
lock both hosts see. The lease is an *ephemeral* znode ``<path>/<name>`` holding who took it (pid, host,
start time): ZooKeeper deletes it when the holder's session ends, however the holder ends.

Losing it: the client's session goes ``SUSPENDED`` when its connection drops (the session may still be
alive) and ``LOST`` when ZooKeeper expired it, after which another job can take the lease. The lease is lost
too when its znode is deleted while the session lives (by hand, by a tool). The job's write check
(:meth:`ZooKeeperLease.wait_usable`), run before every batch and every table write, waits while the session
is suspended and fails for good once the lease is lost; the job then stops with one line. A write already
past its check when the connection drops may still land: the window is one commit, and the holder's session
outlives its connection by ``zookeeper.session_timeout_s``.

The session's state is kazoo's view, and kazoo learns of an expiry only from the server: a process that was
frozen (SIGSTOP, a VM paused, a stop-the-world pause) past its session timeout still sees ``CONNECTED`` for
a moment after it runs again, while another job may already hold the lease. So a check that comes more than
``confirm_after_s`` after the last confirmed one asks ZooKeeper first (one ``exists`` of the znode, its
owner compared): a freeze long enough to lose the session is always longer than that, and the check fails
instead of letting the write through. Between such checks the cost is nothing.

The lease lives under bkaudit's own path, never in BookKeeper's tree.

Example:
    >>> # lease = ZooKeeperLease(client, "/bkaudit/leases", "bkaudit-stream", wait_s=0)
    >>> # lease.acquire(); lease.check(); lease.release()
    >>> holder_text({"pid": 7, "host": "h1", "started": "2026-11-29T10:00:00Z"})
    'pid 7 on h1 since 2026-11-29T10:00:00Z'
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NodeExistsError, NoNodeError

from core.errors import ConfigError, ServiceError

logger = logging.getLogger(__name__)


class LeaseLost(ServiceError):
    """The job's lease is gone (its ZooKeeper session expired): another job may hold the checkpoint now."""


class LeaseSuspended(ServiceError):
    """The connection to ZooKeeper dropped: the lease may still be held, but nothing is written until the
    session is known to be alive again."""


def holder_text(holder: dict[str, Any]) -> str:
    """Who holds a lease, in words (the znode's JSON)."""
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since {holder.get('started', '?')}"


def left_by_a_dead_process(holder: dict[str, Any] | None) -> bool:
    """Whether the lease's holder was another process of this host that no longer runs.

    Example:
        >>> left_by_a_dead_process({"pid": os.getpid(), "host": socket.gethostname()})
        False
        >>> left_by_a_dead_process({"pid": 2**22 + 1, "host": socket.gethostname()})  # above pid_max
        True
        >>> left_by_a_dead_process({"pid": 2**22 + 1, "host": "another-host"})
        False
    """
    if not holder or holder.get("host") != socket.gethostname():
        return False
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class ZooKeeperLease:
    """The lease ``<path>/<name>`` taken with ``client`` (a started :class:`KazooClient`).

    ``wait_s`` is how long :meth:`acquire` waits for a lease another job holds (0: refuse at once), and
    ``stale_wait_s`` how long for one a dead process of this host left (its session expiring);
    ``confirm_after_s`` how old the last confirmation may be before a check asks ZooKeeper again (less than
    the session timeout; None: never asks, kazoo's state alone decides).
    """

    def __init__(
        self,
        client: KazooClient,
        path: str,
        name: str,
        *,
        wait_s: float = 0.0,
        stale_wait_s: float = 0.0,
        confirm_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.znode = f"{path.rstrip('/')}/{name}"
        self.wait_s = wait_s
        self.stale_wait_s = stale_wait_s
        self.confirm_after_s = confirm_after_s
        self._clock = clock
        self._confirmed_at = clock()
        self._state = KazooState.CONNECTED
        self._held = False
        self._lost = threading.Event()
        self._why = ""
        self._lock = threading.Lock()

    # -- taking and giving back ---------------------------------------------------------------------------
    def acquire(self) -> None:
        """Create the ephemeral znode, waiting up to ``wait_s`` while another job holds it; raises
        :class:`~core.errors.ConfigError` naming the holder when it is still held.

        A holder that was a process of this host and is gone (a job killed with ``kill -9`` and restarted
        at once) left its session to expire: that is waited for, up to ``stale_wait_s``, whatever
        ``wait_s`` says."""
        deadline = time.monotonic() + self.wait_s
        extended = False
        while True:
            if self._try_create():
                break
            holder = self.holder()
            if time.monotonic() >= deadline and not extended and left_by_a_dead_process(holder):
                extended = True
                deadline = time.monotonic() + self.stale_wait_s
                logger.info(
                    "the lease %s is held by %s, which has exited: waiting up to %.0f s for its ZooKeeper "
                    "session to expire",
                    self.znode,
                    holder_text(holder or {}),
                    self.stale_wait_s,
                )
            if time.monotonic() >= deadline:
                raise ConfigError(
                    f"the lease {self.znode} in ZooKeeper is held by {holder_text(holder or {})}: another "
                    "job runs on this checkpoint (stop it, or raise stream.lease_wait_s to wait for it)"
                )
            self._wait_for_release(deadline)
        self.client.add_listener(self._on_state)
        self._watch_znode()
        logger.info("lease %s taken", self.znode)

    def _try_create(self) -> bool:
        value = json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            }
        ).encode()
        try:
            self.client.create(self.znode, value, ephemeral=True, makepath=True)
        except NodeExistsError:
            return False
        with self._lock:
            self._held = True
            self._confirmed_at = self._clock()
        return True

    def _wait_for_release(self, deadline: float) -> None:
        released = threading.Event()
        if self.client.exists(self.znode, watch=lambda _event: released.set()) is None:
            return
        released.wait(max(0.0, min(deadline - time.monotonic(), 1.0)))

    def holder(self) -> dict[str, Any] | None:
        """The holder's JSON, or None when nobody holds the lease."""
        try:
            data, _ = self.client.get(self.znode)
        except NoNodeError:
            return None
        try:
            found = json.loads(data or b"{}")
        except ValueError:
            return {}
        return found if isinstance(found, dict) else {}

    def release(self) -> None:
        """Delete the znode if this session still holds it (a clean stop; ``kill -9`` leaves it to the
        session's expiry)."""
        self.client.remove_listener(self._on_state)
        with self._lock:
            held, self._held = self._held, False
        if held and not self._lost.is_set() and self.client.connected:
            with contextlib.suppress(NoNodeError):
                self.client.delete(self.znode)

    # -- holding ------------------------------------------------------------------------------------------
    def _watch_znode(self, _event: Any = None) -> None:
        """Lost as well when the znode goes while the session lives (deleted by hand or by a tool): another
        job could take it then. A watch fires once; it is set again after any other event."""
        with self._lock:
            if self._lost.is_set() or not self._held:
                return  # lost already, or given back (release deletes the znode)
        try:
            found = self.client.exists(self.znode, watch=self._watch_znode)
        except Exception:  # no connection now: the session's state listener decides
            return
        session = self.client.client_id
        if found is None or session is None or found.ephemeralOwner != session[0]:
            self._lose("the lease znode was deleted")

    def _lose(self, why: str) -> None:
        with self._lock:
            self._why = why
        self._lost.set()
        logger.error("lease %s lost: %s", self.znode, why)

    def _on_state(self, state: str) -> None:
        with self._lock:
            self._state = state
        if state == KazooState.LOST:
            self._lose("the ZooKeeper session expired")
        elif state == KazooState.SUSPENDED:
            logger.warning("lease %s: connection to ZooKeeper lost; writes wait for it", self.znode)

    def lost(self) -> LeaseLost | None:
        """The error to stop with once the lease is lost, else None (never waits)."""
        try:
            self.check()
        except LeaseLost as err:
            return err
        except LeaseSuspended:
            return None
        return None

    def check(self) -> None:
        """Raise unless the lease is held by a live session: :class:`LeaseLost` for good, or
        :class:`LeaseSuspended` while the connection is down."""
        if self._lost.is_set():
            raise LeaseLost(
                f"the lease {self.znode} was lost ({self._why}): stopping before writing again; another job "
                "may hold the checkpoint now"
            )
        with self._lock:
            state, held = self._state, self._held
        if not held:
            raise LeaseLost(f"the lease {self.znode} is not held")
        if state != KazooState.CONNECTED:
            raise LeaseSuspended(f"the lease {self.znode}: no connection to ZooKeeper; not writing")
        if self.confirm_after_s is not None and self._clock() - self._confirmed_at > self.confirm_after_s:
            self._confirm()

    def _confirm(self) -> None:
        """Ask ZooKeeper whether this session still owns the znode (after a pause kazoo may not know yet)."""
        started = self._clock()
        try:
            found = self.client.exists(self.znode)
        except Exception as err:  # no answer on this connection: wait for the session's state to tell
            raise LeaseSuspended(f"the lease {self.znode}: ZooKeeper did not confirm it ({err!r})") from None
        session = self.client.client_id
        if found is None or session is None or found.ephemeralOwner != session[0]:
            self._lose("the lease znode is gone or another session's")
            self.check()  # raises LeaseLost
        with self._lock:
            self._confirmed_at = started

    def wait_usable(self, timeout_s: float) -> None:
        """:meth:`check`, waiting up to ``timeout_s`` for a suspended session to come back."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.check()
                return
            except LeaseSuspended:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)


__all__ = ["LeaseLost", "LeaseSuspended", "ZooKeeperLease", "holder_text", "left_by_a_dead_process"]
