"""Fallback watching for ZooKeeper servers without ``AddWatch`` (< 3.6): one-shot child and data watches.

Without a persistent recursive watch, the watcher keeps one kazoo one-shot watch per znode it cares about:

* a **child watch** on every directory of interest (ledgers root, ledger tree directories, the bookie
  directories, ``underreplication`` and its mark tree): a fired watch makes the watcher list the directory
  again *with a new watch* and read the children it does not know yet (new ledgers, new marks, new
  subdirectories) — creations are never missed, only coalesced;
* a **data watch** on every ledger znode, mark and ``lostBookieRecoveryDelay`` (every read passes the watch,
  so a read re-arms it): changes and deletions arrive as CHANGED / DELETED notifications, exactly like the
  persistent watch's, and go through the same handler.

Watches fire once; re-arming happens with the read that follows, and that read returns the latest data, so
the final state of every znode is always seen. kazoo drops every one-shot watch on a disconnect (it fires
them with a NONE event, which is ignored here); the watcher then re-arms everything with a reconciliation
scan. The cost is memory: kazoo keeps one entry per watched znode (≈ 300 B per ledger), and the server holds
one watch per ledger — acceptable for a fallback, and why AddWatch is preferred whenever the server has it.

This module holds the watch callbacks and the set of directories currently under a child watch; the
routing and reads live in :mod:`connectors.zookeeper.watcher`, shared with the persistent mode.

Example:
    >>> items = []
    >>> fallback = FallbackWatches(items.append)
    >>> fallback.claim_directory("/ledgers/00"), fallback.claim_directory("/ledgers/00")
    (True, False)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kazoo.protocol.states import EventType, WatchedEvent

#: Token the fallback watches put in front of a notification (the worker routes it like a persistent one).
FALLBACK_EVENT = "fallback-event"


class FallbackWatches:
    """Callbacks for kazoo one-shot watches plus the set of directories under a child watch.

    ``put(item)`` receives ``(FALLBACK_EVENT, event, None)`` for every real notification, on kazoo's callback
    thread (in ZooKeeper order with the watcher's ordered reads).

    Example:
        >>> from kazoo.protocol.states import WatchedEvent
        >>> items = []
        >>> fallback = FallbackWatches(items.append)
        >>> fallback.data_watch(WatchedEvent(EventType.NONE, "CONNECTING", None))   # kazoo's reset: ignored
        >>> fallback.child_watch(WatchedEvent(EventType.CHILD, "CONNECTED", "/ledgers/00"))
        >>> [(e.type, e.path) for _, e, _ in items]
        [('CHILD', '/ledgers/00')]
    """

    def __init__(self, put: Callable[[tuple[str, WatchedEvent, Any]], Any]) -> None:
        self._put = put
        self._directories: set[str] = set()
        self._lock = threading.Lock()

    def child_watch(self, event: WatchedEvent) -> None:
        """kazoo child-watch callback (a directory's children changed, or the directory was deleted)."""
        if event.type == EventType.NONE:
            return
        if event.type == EventType.DELETED:
            self.forget_directory(event.path)
        self._put((FALLBACK_EVENT, event, None))

    def data_watch(self, event: WatchedEvent) -> None:
        """kazoo data-watch callback (a znode changed, was created or was deleted)."""
        if event.type == EventType.NONE:
            return
        self._put((FALLBACK_EVENT, event, None))

    def claim_directory(self, path: str) -> bool:
        """Record that ``path`` is (about to be) listed with a child watch; False if it already is."""
        with self._lock:
            if path in self._directories:
                return False
            self._directories.add(path)
            return True

    def mark_listed(self, path: str) -> None:
        """Record a directory listed with a child watch by a scan."""
        with self._lock:
            self._directories.add(path)

    def forget_directory(self, path: str) -> None:
        """The directory is gone (or its listing failed): it carries no child watch any more."""
        with self._lock:
            self._directories.discard(path)

    def reset(self) -> None:
        """Every one-shot watch is gone (disconnect): forget all directories."""
        with self._lock:
            self._directories.clear()

    @property
    def directories(self) -> int:
        """How many directories carry a child watch."""
        return len(self._directories)
