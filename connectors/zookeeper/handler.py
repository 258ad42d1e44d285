"""A kazoo threading handler that waits on sockets with one ``poll`` system call.

kazoo's threading handler waits with :func:`kazoo.handlers.utils.selector_select`, which builds a new epoll
selector for every wait (epoll_create, one epoll_ctl per socket, epoll_wait, close) and a few dicts around
it: about 14 µs of CPU. kazoo's connection thread waits before every loop turn, every read and every write,
so a watch notification, the read it triggers and that read's answer cost about eight such waits. ``poll``
gives the same answer in one system call, with no limit on descriptor numbers either.

Its connections read ahead (:class:`ReadAheadSocket`): kazoo reads a packet as a 4-byte length and then
the body, each read behind a wait of its own; one ``recv`` of up to 64 KiB takes the whole packet and
whatever follows it (a burst of watch notifications), the next reads are served from that buffer, and
:meth:`PollingHandler.select` reports a socket with buffered bytes readable without waiting.

A client can hold its connection's reads for a moment (:meth:`PollingHandler.hold_reads_until`): the change
watcher does while its worker lets a burst of notifications gather, so that kazoo's connection thread,
instead of waking for each notification (ZooKeeper sends each as a packet of its own), wakes once at the
end and reads them all; the worker would not take them earlier anyway. On a loaded machine a thread
wake-up costs more than the Python that handles a packet.

With ``inline_callbacks`` the handler also runs watch callbacks (and anything else dispatched to kazoo's
callback queue) at once, on the dispatching thread, instead of handing each to kazoo's callback thread: one
thread wake-up less per notification and per read answer. Only for clients whose callbacks merely hand
the item on without blocking (the change watcher's queue): they then run on kazoo's connection thread, in
the order the connection received them, which is the order kazoo's single callback thread kept as well.

Example:
    >>> import socket
    >>> a, b = socket.socketpair()
    >>> _ = b.send(b"x")
    >>> handler = PollingHandler()
    >>> handler.select([a, b], [], [], 1.0)[0] == [a], handler.select([], [b], [], 1.0)[1] == [b]
    (True, True)
    >>> a.close(); b.close()
"""

from __future__ import annotations

import logging
import math
import select
import time
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import fileobj_to_fd
from kazoo.protocol.states import Callback

from core.threadnames import named_target

logger = logging.getLogger(__name__)

_READ = select.POLLIN
_WRITE = select.POLLOUT


#: Bytes one ``recv`` of a :class:`ReadAheadSocket` asks for.
READ_AHEAD_BYTES = 65536


class ReadAheadSocket:
    """A socket (plain or TLS) whose ``recv`` reads up to :data:`READ_AHEAD_BYTES` and keeps the surplus.

    ``pending()`` counts the buffered bytes (and a TLS socket's own), as kazoo expects of TLS sockets: a
    read with bytes pending skips the wait. Everything else is the wrapped socket's.

    Example:
        >>> import socket
        >>> a, b = socket.socketpair()
        >>> _ = b.send(b"\\x00\\x00\\x00\\x02hi")
        >>> reader = ReadAheadSocket(a)
        >>> reader.recv(4), reader.pending(), reader.recv(4), reader.pending()
        (b'\\x00\\x00\\x00\\x02', 2, b'hi', 0)
        >>> a.close(); b.close()
    """

    __slots__ = ("_buffer", "_socket", "socket_reads")

    def __init__(self, sock: Any) -> None:
        self._socket = sock
        self._buffer = b""
        self.socket_reads = 0  # reads of the socket itself (a diagnostic: bytes per read)

    def recv(self, size: int) -> bytes:
        """Up to ``size`` bytes: from the buffer when it holds any, else one read of the socket."""
        buffered = self._buffer
        if not buffered:
            buffered = self._socket.recv(max(size, READ_AHEAD_BYTES))
            self.socket_reads += 1
            if len(buffered) <= size:
                return bytes(buffered)
        self._buffer = buffered[size:]
        return bytes(buffered[:size])

    def pending(self) -> int:
        """Bytes readable without touching the socket."""
        inner = getattr(self._socket, "pending", None)
        return len(self._buffer) + (inner() if inner is not None else 0)

    def fileno(self) -> int:
        return int(self._socket.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._socket, name)

    def __enter__(self) -> ReadAheadSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self._socket.close()


class PollingHandler(SequentialThreadingHandler):
    """kazoo's sequential threading handler with :meth:`select` on ``poll(2)`` (see the module doc).

    Example:
        >>> seen = []
        >>> PollingHandler(inline_callbacks=True).dispatch_callback(Callback("watch", seen.append, (1,)))
        >>> seen
        [1]
    """

    def __init__(self, *, inline_callbacks: bool = False) -> None:
        super().__init__()
        self.inline_callbacks = inline_callbacks
        self._reads_held_until = -math.inf  # monotonic time
        self.held_waits = 0  # read waits that slept out a hold first (the hold's own count, for tests)

    def hold_reads_until(self, deadline: float) -> None:
        """Until ``deadline`` (``time.monotonic()``), a wait for a socket to read sleeps first: what arrives
        meanwhile is read at once after it. Waits for writing and bytes already read ahead do not wait."""
        self._reads_held_until = deadline

    def dispatch_callback(self, callback: Callback) -> None:
        """Run ``callback`` now (``inline_callbacks``) or queue it for kazoo's callback thread.

        An inline callback that raises is logged, as kazoo's callback thread does: it must not break the
        connection loop it may run on.
        """
        if not self.inline_callbacks:
            super().dispatch_callback(callback)
            return
        try:
            callback.func(*callback.args)
        except Exception:
            logger.exception("a ZooKeeper %s callback failed", callback.type)

    def spawn(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        """kazoo's daemon thread for ``func``, named for the OS (``kazoo-zk_loop``: its connection)."""
        return super().spawn(named_target("kazoo-" + func.__name__.strip("_"), func), *args, **kwargs)

    def create_connection(self, *args: Any, **kwargs: Any) -> ReadAheadSocket:
        """kazoo's connection (TCP or TLS, same arguments), reading ahead (:class:`ReadAheadSocket`)."""
        return ReadAheadSocket(super().create_connection(*args, **kwargs))

    def select(
        self, rlist: list[Any], wlist: list[Any], xlist: list[Any], timeout: float | None = None
    ) -> tuple[list[Any], list[Any], list[Any]]:
        """``select.select``'s contract (as kazoo's ``selector_select``): the ready objects of each list.

        As with the selectors module, an error or hang-up on a socket counts as readable (or writable
        when only writing was asked for), so the caller's next ``recv``/``send`` reports it. A
        :class:`ReadAheadSocket` with buffered bytes is readable at once.
        """
        if timeout is not None:
            if not isinstance(timeout, int | float):
                raise TypeError("timeout must be a number")
            if timeout < 0:
                raise ValueError("timeout must be non-negative")
        buffered = [obj for obj in rlist if isinstance(obj, ReadAheadSocket) and obj.pending()]
        if buffered:
            return buffered, [], []
        if not wlist:
            timeout = self._sleep_while_held(timeout)
        wanted: dict[int, int] = {}
        objects: dict[int, list[Any]] = {}
        for mask, fileobjs in ((_READ, rlist), (_WRITE, wlist)):
            for fileobj in fileobjs:
                fd = fileobj_to_fd(fileobj)
                wanted[fd] = wanted.get(fd, 0) | mask
                objects.setdefault(fd, []).append(fileobj)
        poller = select.poll()
        for fd, mask in wanted.items():
            poller.register(fd, mask)
        ready = poller.poll(None if timeout is None else math.ceil(timeout * 1000))
        readable: list[Any] = []
        writable: list[Any] = []
        for fd, revents in ready:
            if revents & ~_WRITE and wanted[fd] & _READ:
                readable.extend(objects[fd])
            elif revents & ~_READ and wanted[fd] & _WRITE:
                writable.extend(objects[fd])
        return readable, writable, []

    def _sleep_while_held(self, timeout: float | None) -> float | None:
        """Sleep out the hold (never past ``timeout``); what is left of ``timeout``."""
        rest = self._reads_held_until - time.monotonic()
        if rest <= 0:
            return timeout
        if timeout is not None:
            rest = min(rest, timeout)
        self.held_waits += 1
        time.sleep(rest)
        return None if timeout is None else max(0.0, timeout - rest)


__all__ = ["PollingHandler", "ReadAheadSocket"]
