"""Persistent recursive watches for kazoo (ZooKeeper ``AddWatch``, opcode 106, server ≥ 3.6).

kazoo only knows one-shot watches. One persistent recursive watch on BookKeeper's ledgers root reports every
create, delete and data change below it for as long as the session lives, with no re-arming and no missed
window between a notification and the next ``get``. This module sends the ``AddWatch`` request through
kazoo's own connection and routes the resulting notifications (which kazoo would otherwise drop, having no
one-shot watcher registered for those paths) to our callbacks.

What kazoo does not do, the caller must: the server forgets the watch when the session expires, and kazoo
does not restore persistent watches after a reconnect. Call :meth:`PersistentWatches.readd_all` on every
``CONNECTED`` transition and then reconcile (rescan), because events may have been missed in between.

Example:
    >>> AddWatch("/ledgers", AddWatchMode.PERSISTENT_RECURSIVE).serialize().hex()
    '000000082f6c65646765727300000001'
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.protocol.serialization import Watch, int_struct, write_string
from kazoo.protocol.states import EVENT_TYPE_MAP, Callback, EventType, WatchedEvent

logger = logging.getLogger(__name__)

ADD_WATCH_OPCODE = 106


class AddWatchMode(enum.IntEnum):
    """``org.apache.zookeeper.AddWatchMode``: plain persistent or persistent recursive."""

    PERSISTENT = 0
    PERSISTENT_RECURSIVE = 1


class AddWatch(namedtuple("AddWatch", "path mode")):
    """The AddWatch request body: the path (jute string) and the mode (int)."""

    type = ADD_WATCH_OPCODE

    def serialize(self) -> bytearray:
        return bytearray(write_string(self.path) + int_struct.pack(int(self.mode)))

    @classmethod
    def deserialize(cls, buffer: bytes, offset: int) -> bool:
        # The reply carries only the header's error code, which kazoo has already checked.
        return True


WatchCallback = Callable[[WatchedEvent], Any]


@dataclass(frozen=True)
class _Registration:
    path: str  # as the caller sees it (inside the chroot)
    mode: AddWatchMode
    callback: WatchCallback


def _covers(registration: _Registration, path: str) -> bool:
    if path == registration.path:
        return True
    if registration.mode is AddWatchMode.PERSISTENT_RECURSIVE:
        prefix = registration.path if registration.path.endswith("/") else registration.path + "/"
        return path.startswith(prefix)
    return False


class PersistentWatches:
    """Adds persistent (recursive) watches to one :class:`KazooClient` and dispatches their events.

    Example:
        >>> # watches = PersistentWatches(client)
        >>> # watches.add("/ledgers", on_event)          # every change below /ledgers
        >>> # client.add_listener(lambda s: ...)         # on CONNECTED: watches.readd_all(), then rescan
    """

    def __init__(self, client: KazooClient) -> None:
        self._client = client
        self._registrations: list[_Registration] = []
        self._lock = threading.Lock()
        connection = client._connection
        original = connection._read_watch_event

        def read_watch_event(buffer: bytes, offset: int) -> None:
            # Let kazoo serve its one-shot watchers first (if it has any for the path), then ours.
            watch, _ = Watch.deserialize(buffer, offset)
            if (
                watch.path in client._data_watchers
                or watch.path in client._child_watchers
                or watch.type not in EVENT_TYPE_MAP
            ):
                original(buffer, offset)
            self._dispatch(watch)

        connection._read_watch_event = read_watch_event

    def _dispatch(self, watch: Watch) -> None:
        event_type = EVENT_TYPE_MAP.get(watch.type)
        if event_type is None or self._client._stopped.is_set():
            return
        path = self._client.unchroot(watch.path)
        with self._lock:
            targets = [r for r in self._registrations if _covers(r, path)]
        if not targets:
            return
        event = WatchedEvent(event_type, self._client._state, path)
        for registration in targets:
            self._client.handler.dispatch_callback(_callback(registration.callback, event))

    def add(
        self,
        path: str,
        callback: WatchCallback,
        mode: AddWatchMode = AddWatchMode.PERSISTENT_RECURSIVE,
        timeout: float = 10.0,
    ) -> None:
        """Register ``callback`` and send AddWatch; raises kazoo's error when the server refuses."""
        self._send(path, mode, timeout)
        with self._lock:
            self._registrations.append(_Registration(path, mode, callback))

    def readd_all(self, timeout: float = 10.0) -> int:
        """Send AddWatch again for every registration (after a reconnect or a new session)."""
        with self._lock:
            pending = {(r.path, r.mode) for r in self._registrations}
        for path, mode in sorted(pending):
            self._send(path, mode, timeout)
        return len(pending)

    def _send(self, path: str, mode: AddWatchMode, timeout: float) -> None:
        client = self._client
        # kazoo prefixes the chroot inside its public calls; _call needs the full server-side path.
        full_path = (client.chroot + path).rstrip("/") or "/" if client.chroot else path
        result = client.handler.async_result()
        client._call(AddWatch(full_path, mode), result)
        result.get(timeout=timeout)

    def supported(self, timeout: float = 10.0) -> bool:
        """True when the server accepts AddWatch (ZooKeeper ≥ 3.6); tries it on a path that need not exist."""
        from kazoo.exceptions import KazooException

        try:
            self._send("/", AddWatchMode.PERSISTENT, timeout)
        except KazooException:
            return False
        return True


def _callback(function: WatchCallback, event: WatchedEvent) -> Any:
    return Callback("watch", function, (event,))


__all__ = ["AddWatch", "AddWatchMode", "EventType", "PersistentWatches"]
