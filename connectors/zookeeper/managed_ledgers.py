"""The watcher's recipe for Pulsar's ``/managed-ledgers`` tree: each managed ledger's znode and its cursors'
znodes as ``ManagedLedgerChanged`` / ``ManagedLedgerDeleted`` events, keyed by the managed ledger.

The watcher (:mod:`connectors.zookeeper.watcher`) owns the session, the one FIFO and the snapshots; this
recipe only says what its tree means, the way the ledger tree's code does for ledgers:

* **Watching.** One persistent recursive watch on the root (``pulsar.managed_ledgers_path``), added with the
  ledger root's and re-added with it after every reconnect (:class:`PersistentWatches` keeps both). A
  CREATED/CHANGED notification of a managed ledger or a cursor is read through the watcher's ordered reads
  and published when the answer is dequeued; a DELETED one is published at once.
* **Snapshots.** Each snapshot walks the tree too (:meth:`ManagedLedgerRecipe.scan`): a FULL one publishes
  every znode, a reconciliation only those whose mzxid changed. The index (name, cursor) → mzxid and scan
  epoch, stamped like the ledger index, gives the deletions a complete scan infers (:meth:`infer_deletions`).
* **What is a managed ledger.** A path ``<root>/<tenant>/<namespace>/persistent/<topic>`` (or the pre-2.0
  ``<property>/<cluster>/<namespace>/persistent/<topic>``); its children are its cursors. Everything else
  under the root is a directory to list or ignored. The bytes are published as stored: the job decodes them
  (:mod:`core.domain.managed_ledger`), so a znode that does not decode becomes a dead letter there.

Example:
    >>> recipe = ManagedLedgerRecipe("/managed-ledgers", read=lambda path, info: None, emit=print)
    >>> recipe.znode_of("/managed-ledgers/public/default/persistent/orders/sub")
    ('public/default/persistent/orders', 'sub')
    >>> recipe.znode_of("/managed-ledgers/public/default") is None
    True
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kazoo.protocol.states import EventType, WatchedEvent

from connectors.zookeeper.snapshot import NodeKind, Snapshot, StampedIndex, TreeWalker
from core import events
from core.domain.metadata import pulsar_topic_from_managed_ledger

logger = logging.getLogger(__name__)

Emit = Callable[[events.Payload, Snapshot | None], None]
#: Issue a read of ``path`` whose answer reaches :meth:`ManagedLedgerRecipe.on_read` with ``info``.
Read = Callable[[str, tuple[str, str]], None]


class ManagedLedgerRecipe:
    """Follows one managed-ledgers root for the watcher's worker (every method but :meth:`scan` runs on the
    worker thread; :meth:`scan` runs on the controller's, issuing reads only)."""

    def __init__(self, root: str, *, read: Read, emit: Emit) -> None:
        self.root = root.rstrip("/") or "/"
        self._prefix = self.root + "/" if self.root != "/" else "/"
        self._read = read
        self._emit = emit
        self._known = StampedIndex()  # (name, cursor) -> last mzxid and scan epoch
        self.epoch = 0

    # -- paths -----------------------------------------------------------------------------------------
    def owns(self, path: str) -> bool:
        """Whether ``path`` is in this recipe's tree."""
        return path == self.root or path.startswith(self._prefix)

    def znode_of(self, path: str) -> tuple[str, str] | None:
        """``(managed ledger name, cursor)`` of a managed ledger's znode (cursor ``""``) or a cursor's;
        ``None`` for anything else."""
        if not path.startswith(self._prefix):
            return None
        parts = path[len(self._prefix) :].split("/")
        if pulsar_topic_from_managed_ledger("/".join(parts)) is not None:
            return "/".join(parts), ""
        if len(parts) > 1 and parts[-1] and pulsar_topic_from_managed_ledger("/".join(parts[:-1])):
            return "/".join(parts[:-1]), parts[-1]
        return None

    def _classify(self, path: str, read: Read) -> tuple[int, Any]:
        """The walker's classifier: a managed ledger is read and listed (its cursors), a cursor read, a
        namespace level listed; anything deeper is skipped."""
        znode = self.znode_of(path)
        if znode is None:
            depth = path[len(self._prefix) :].count("/") + 1
            return (NodeKind.DIRECTORY, None) if depth <= 4 else (NodeKind.SKIP, None)
        if znode[1]:
            return NodeKind.LEAF, znode
        read(path, znode)
        return NodeKind.DIRECTORY, None

    # -- the snapshot scan (controller thread) ----------------------------------------------------------
    def scan(self, walker: TreeWalker, read: Read, watch: Callable[..., Any] | None = None) -> None:
        """Walk the tree, issuing a read (``read``: the scan's own, with its slots) per znode."""
        walker.walk(self.root, lambda p: self._classify(p, read), read, watch=watch)

    # -- the worker ------------------------------------------------------------------------------------
    def on_event(self, event: WatchedEvent) -> None:
        """A notification of the persistent watch."""
        znode = self.znode_of(event.path)
        if znode is None:
            return
        if event.type in (EventType.CREATED, EventType.CHANGED):
            self._known.touch(znode, self.epoch)  # seen since the current scan began: not gone
            self._read(event.path, znode)
        elif event.type == EventType.DELETED:
            self._known.pop(znode)
            self._emit(events.managed_ledger_deleted(*znode), None)

    def on_read(
        self, znode: tuple[str, str], data: bytes | None, stat: Any, snapshot: Snapshot | None
    ) -> None:
        """A read's answer: published unless a reconciliation finds the version already published."""
        full = snapshot is not None and snapshot.is_full
        if self._known.record(znode, mzxid=stat.mzxid, epoch=self.epoch, full=full):
            self._emit(events.managed_ledger_changed(znode[0], znode[1], data or b"", stat), snapshot)

    def infer_deletions(self, snapshot: Snapshot) -> int:
        """After a complete scan: every znode the scan (or a live change since its begin) did not stamp is
        gone; returns how many."""
        gone = [znode for znode, _ in self._known.stale(self.epoch)]
        for znode in sorted(gone, key=lambda z: (z[0], z[1] == "", z[1])):  # cursors before their ledger
            self._emit(events.managed_ledger_deleted(*znode, inferred=True), snapshot)
        if gone:
            logger.info("reconciliation: %d managed-ledger znodes vanished while unwatched", len(gone))
        return len(gone)

    @property
    def known(self) -> int:
        """Managed-ledger and cursor znodes published and not deleted."""
        return len(self._known)
