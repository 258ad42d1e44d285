"""One simulated bookie: its protocol server, its entry store, and its own ZooKeeper session.

Each bookie holds a private kazoo session, as a real bookie process does, so its ephemeral registration
znode lives and dies with that session:

- **graceful stop** (:func:`close_session`): kazoo sends ``closeSession``; ZooKeeper deletes the ephemeral
  node at once.
- **hard kill** (:func:`abandon_session`): the TCP connection is shut down *without* ``closeSession`` and
  kazoo is told not to reconnect, exactly what the kernel does when a bookie process is SIGKILLed. ZooKeeper
  keeps the session, and the ephemeral node, until the session timeout passes. Chosen over a child process
  per bookie because it needs no extra processes on a 2-core machine and the server-side effect is the
  same; it relies on two kazoo internals (``_stopped`` and the connection's ``_socket``), checked by
  :func:`abandon_session` and by the integration tests.

The protocol servers of all bookies run on one shared asyncio loop (:class:`LoopThread`), so a cluster of
many bookies costs one thread, not one per bookie.

Example:
    >>> BookieMode("readonly") is BookieMode.READONLY
    True
    >>> service_info_for("127.0.0.1", 3181).endpoints[0].protocol
    'bookie-rpc'
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from kazoo.client import KazooClient, KazooState

from connectors.bookie.server import BookieServer, InMemoryEntryStore
from core.domain.registration import BOOKIE_RPC_PROTOCOL, BookieServiceInfo, Endpoint
from core.errors import ServiceError

__all__ = [
    "BookieMode",
    "LoopThread",
    "SimBookie",
    "abandon_session",
    "close_session",
    "open_session",
    "service_info_for",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

session_logger = logging.getLogger("bkaudit.sim.sessions")
"""Logger of the simulator's kazoo sessions. Quiet below ERROR by default: a hard kill makes kazoo warn
about the connection it has just been told to drop."""
session_logger.setLevel(logging.ERROR)


class BookieMode(StrEnum):
    """What a simulated bookie is doing: registered writable, registered read-only, or down.

    Example:
        >>> [mode.value for mode in BookieMode]
        ['writable', 'readonly', 'down']
    """

    WRITABLE = "writable"
    READONLY = "readonly"
    DOWN = "down"


def service_info_for(host: str, port: int) -> BookieServiceInfo:
    """The registration data a real bookie publishes: one ``bookie-rpc`` endpoint, no properties.

    Example:
        >>> info = service_info_for("127.0.0.1", 4000)
        >>> info.endpoints[0].id, info.endpoints[0].port
        ('bookie', 4000)
    """
    return BookieServiceInfo((Endpoint("bookie", port, host, BOOKIE_RPC_PROTOCOL),))


class LoopThread:
    """An asyncio event loop in a daemon thread, for coroutines called from synchronous code.

    Example:
        >>> async def answer() -> int:
        ...     return 42
        >>> loop = LoopThread("doc-loop")
        >>> loop.run(answer())
        42
        >>> loop.stop()
    """

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 15.0) -> T:
        """Run ``coroutine`` on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def stop(self) -> None:
        """Stop the loop and its thread (idempotent)."""
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5.0)
        if not self._thread.is_alive():
            self._loop.close()


def open_session(
    hosts: str,
    session_timeout_s: float,
    connect_timeout_s: float = 15.0,
    log: logging.Logger | None = None,
    tls: Mapping[str, Any] | None = None,
) -> KazooClient:
    """A started kazoo client with its own ZooKeeper session (``ServiceError`` when unreachable).

    ``log`` is kazoo's logger for it (default: the quiet :data:`session_logger`).

    Example:
        >>> # client = open_session("127.0.0.1:2181/chroot", 2.0)
    """
    client = KazooClient(hosts=hosts, timeout=session_timeout_s, logger=log or session_logger, **(tls or {}))
    try:
        client.start(timeout=connect_timeout_s)
    except Exception as err:  # kazoo raises its own timeout types
        with contextlib.suppress(Exception):
            client.stop()
            client.close()
        raise ServiceError(f"cannot connect to ZooKeeper at {hosts}: {err or type(err).__name__}") from None
    return client


def close_session(client: KazooClient) -> None:
    """Graceful stop: ``closeSession``, so ZooKeeper deletes the session's ephemeral nodes at once.

    Example:
        >>> # close_session(client)   # the bookie's available/<id> znode is gone when this returns
    """
    try:
        client.stop()
    finally:
        client.close()


def tls_options_of(client: KazooClient) -> dict[str, Any]:
    """The TLS keyword arguments ``client`` was built with (empty for a plaintext client), for a twin.

    Example:
        >>> tls_options_of(KazooClient(hosts="127.0.0.1:1"))
        {}
    """
    if not client.use_ssl:
        return {}
    names = ("use_ssl", "verify_certs", "check_hostname", "ca", "certfile", "keyfile", "keyfile_password")
    return {name: getattr(client, name) for name in names}


def expire_session(client: KazooClient, hosts: str, timeout_s: float = 30.0) -> None:
    """Make ZooKeeper expire ``client``'s session, the way a long network partition or a stalled host would.

    A second connection joins the same session (same id and password) and closes it; the server then
    expires the session and ``client`` sees ``KazooState.LOST`` before kazoo reconnects with a new one.
    Returns once ``client`` has seen the loss and is connected again (``ServiceError`` if not in time).

    Example:
        >>> # expire_session(bookie_session, "127.0.0.1:2181")  # its ephemeral znodes are gone now
    """
    lost = threading.Event()
    reconnected = threading.Event()

    def listener(state: str) -> bool:
        if state == KazooState.LOST:
            lost.set()
        elif state == KazooState.CONNECTED and lost.is_set():
            reconnected.set()
            return True  # remove the listener
        return False

    session_id, password = client.client_id
    client.add_listener(listener)
    twin = KazooClient(
        hosts=hosts, client_id=(session_id, password), timeout=timeout_s, **tls_options_of(client)
    )
    try:
        twin.start(timeout=timeout_s)
    finally:
        twin.stop()
        twin.close()
    # The original client learns of the expiry on its next request or ping.
    deadline = time.monotonic() + timeout_s
    while not lost.is_set() and time.monotonic() < deadline:
        # SessionExpiredError / ConnectionLoss are exactly what we are causing.
        with contextlib.suppress(Exception):
            client.exists("/")
        lost.wait(0.1)
    if not lost.is_set():
        client.remove_listener(listener)
        raise ServiceError(f"session 0x{session_id:x} was not expired within {timeout_s:.0f} s")
    if not reconnected.wait(timeout_s) and not client.connected:
        raise ServiceError("client did not reconnect after its session expired")


def abandon_session(client: KazooClient, timeout_s: float = 10.0) -> None:
    """Hard kill: drop the connection without ``closeSession`` and never reconnect (see the module doc).

    ZooKeeper then expires the session after its timeout and only then deletes its ephemeral nodes.

    Example:
        >>> # abandon_session(client)  # available/<id> stays until the session timeout passes
    """
    stopped = getattr(client, "_stopped", None)
    connection = getattr(client, "_connection", None)
    if not isinstance(stopped, threading.Event) or connection is None:
        raise ServiceError("this kazoo version lacks what a hard kill needs (_stopped, _connection)")
    # Setting _stopped first: kazoo's connection loop reconnects only while it is clear, and stop() becomes a
    # no-op, so no closeSession can be queued afterwards.
    stopped.set()
    sock = getattr(connection, "_socket", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # FIN to the server, like the kernel on SIGKILL
    if not connection.connection_stopped.wait(timeout_s):
        logger.warning("kazoo connection did not stop within %.1f s after a hard kill", timeout_s)
    with contextlib.suppress(Exception):
        client.handler.stop()
    with contextlib.suppress(Exception):
        connection.stop(timeout_s)
        client.close()


@dataclass
class SimBookie:
    """A simulated bookie's parts and state (owned and locked by the cluster).

    ``hard_killed`` is set by a hard kill and cleared once its registration has really gone from
    ZooKeeper (session expired).

    Example:
        >>> store = InMemoryEntryStore()
        >>> bookie = SimBookie("bookie-01", "/rack-0", "sim-01.bkaudit.local", False,
        ...                    BookieServer(store), store)
        >>> bookie.mode, bookie.faults_json()["silent"]
        (<BookieMode.DOWN: 'down'>, False)
    """

    bookie_id: str
    rack: str | None
    hostname: str
    legacy_id: bool
    server: BookieServer
    store: InMemoryEntryStore
    session: KazooClient | None = None
    mode: BookieMode = BookieMode.DOWN
    hard_killed: bool = False
    hard_killed_registration: BookieMode | None = None
    restart_timers: list[threading.Timer] = field(default_factory=list)
    group: str | None = None  # its affinity group in /bookies; None: the cluster's default group

    @property
    def address(self) -> str:
        """``host:port`` of its protocol server (the ``bookie-rpc`` endpoint)."""
        return self.server.address

    def faults_json(self) -> dict[str, Any]:
        """The server's fault switches as JSON.

        Example:
            >>> store = InMemoryEntryStore()
            >>> SimBookie("b", None, "h", True, BookieServer(store), store).faults_json()["delay_s"]
            0.0
        """
        faults = self.server.faults
        return {
            "silent": faults.silent,
            "delay_s": faults.delay_s,
            "enoledger_for": sorted(faults.enoledger_for),
            "fail_status": faults.fail_status,
            "refuse": faults.refuse,
        }
