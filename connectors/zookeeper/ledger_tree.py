"""The watcher's recipe for the ledger tree: ledgers and their under-replication marks as events.

Every ledger's metadata znode (``<root>/<ledger manager's path>``) becomes a ``LedgerUpserted`` (or
``LedgerUndecodable``) and every ``urL`` mark an ``UnderReplicationMark``; their deletions become
``LedgerDeleted`` and a cleared mark.

* **Live changes.** A CREATED/CHANGED notification triggers a read; the answer is published when the worker
  dequeues it, so it is never older than the notification. The ledgers changed in one chunk of
  notifications are read with one ``multiRead`` (:meth:`LedgerTree.flush_reads`; a path changed twice is
  read once, its answer holds the newest version). A DELETED one is published at its place.
* **The compact index.** Per ledger and per mark, the last mzxid published and the scan epoch that last saw
  it (:class:`~connectors.zookeeper.snapshot.StampedIndex`): a reconciliation publishes only new versions,
  and a complete scan infers what vanished while nobody watched (:meth:`LedgerTree.infer_deletions`).
* **The scan.** :meth:`LedgerTree.scan` walks the mark tree, then the ledger tree, breadth first; leaves are
  read in ``multiRead`` batches holding the scan's read slots.
* **Ignored znodes.** A znode in the ledger tree that is neither a ledger nor a directory of this ledger
  manager is counted and logged once (:class:`IgnoredZnodes`), never descended into.

The watcher (:mod:`connectors.zookeeper.watcher`) owns the session, the FIFO and the snapshot brackets; it
routes notifications and answers here, on its worker thread (the scan runs on its controller's).

Example:
    >>> node_of_mark("/ledgers/underreplication/ledgers/0000/0000/0000/0007/urL0000000007", "/ledgers")
    (2, 7)
    >>> node_of_mark("/ledgers/underreplication/ledgers/0000", "/ledgers")
    (1, None)
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import NoNodeError
from prometheus_client import Counter

from connectors.zookeeper.emitter import Emit
from connectors.zookeeper.snapshot import NodeKind, ScanReads, Snapshot, StampedIndex, TreeWalker
from core import events
from core.domain.layout import LedgerManagerType, ZnodeKind, classify_path, managers_holding_path
from core.domain.metadata import decode_ledger_metadata
from core.domain.underreplication import (
    UnderreplicationPaths,
    parse_underreplicated_ledger,
    parse_urledger_path,
)
from core.errors import FormatError

logger = logging.getLogger(__name__)

OP_LEDGER = "ledger"
OP_MARK = "mark"

#: Why a znode in the ledger tree is ignored: a path another ledger manager would read as its own (the
#: manager setting or LAYOUT looks wrong), or a path no manager reads (foreign data, a non-canonical name).
IGNORED_OTHER_LEDGER_MANAGER = "other_ledger_manager"
IGNORED_NOT_A_LEDGER_PATH = "not_a_ledger_path"
IGNORED_ZNODE_REASONS = (IGNORED_OTHER_LEDGER_MANAGER, IGNORED_NOT_A_LEDGER_PATH)
#: Paths remembered so that each is logged once; past this many, further ones are counted but not logged.
MAX_LOGGED_IGNORED_ZNODES = 10_000

_HEX4 = re.compile(r"[0-9a-f]{4}")

#: ``read(op, path, ledger id, watch)`` and ``read_many(op, paths, ledger ids)``: the session's live reads.
Read = Callable[[str, str, int, Callable[..., Any] | None], None]
ReadMany = Callable[[str, list[str], list[int]], None]


def node_of_mark(path: str, root: str) -> tuple[int, int | None]:
    """What a path below ``underreplication/ledgers`` is: ``(NodeKind.LEAF, ledger id)`` for a mark,
    ``(NodeKind.DIRECTORY, None)`` for one of its four hex levels, ``(NodeKind.SKIP, None)`` otherwise."""
    prefix = UnderreplicationPaths(root).urledgers + "/"
    if not path.startswith(prefix):
        return NodeKind.SKIP, None
    parts = path[len(prefix) :].split("/")
    if len(parts) <= 4 and all(_HEX4.fullmatch(p) for p in parts):
        return NodeKind.DIRECTORY, None
    ledger_id = parse_urledger_path(path, root)
    return (NodeKind.LEAF, ledger_id) if ledger_id is not None else (NodeKind.SKIP, None)


class IgnoredZnodes:
    """Counts sightings of ignored znodes in the ledger tree and logs each path once at INFO (never data).

    Thread-safe: snapshot walks and the worker's notifications both report here.
    """

    def __init__(self, counter: Counter, root: str, manager: LedgerManagerType) -> None:
        self._counter = counter
        self._root = root
        self._manager = manager
        self._logged: set[str] = set()
        self._lock = threading.Lock()

    def note(self, path: str) -> None:
        """Count one sighting of ``path``; log it if it is new."""
        held = managers_holding_path(path, self._root)
        reason = IGNORED_OTHER_LEDGER_MANAGER if held else IGNORED_NOT_A_LEDGER_PATH
        self._counter.labels(reason).inc()
        with self._lock:
            if path in self._logged or len(self._logged) > MAX_LOGGED_IGNORED_ZNODES:
                return
            self._logged.add(path)
            full = len(self._logged) > MAX_LOGGED_IGNORED_ZNODES
        if full:
            logger.info(
                "more than %d ignored znodes under %s: further ones are counted, not logged",
                MAX_LOGGED_IGNORED_ZNODES,
                self._root,
            )
            return
        logger.info(
            "ignoring znode %s: not a ledger znode of the %s ledger manager (%s)",
            path,
            self._manager.value,
            reason,
        )


@dataclasses.dataclass(eq=False)
class LedgerTree:
    """Follows the ledger tree and the mark tree for the watcher's worker.

    ``read``/``read_many`` issue the session's ordered live reads; ``multi_read``: the server has
    ``multiRead`` and no fallback watch is wanted per read; ``undecodable(kind)`` counts a znode that does
    not decode; ``ignored`` counts the ledger tree's foreign znodes.
    """

    root: str
    manager: LedgerManagerType
    _: dataclasses.KW_ONLY
    read: Read
    read_many: ReadMany
    emit: Emit
    undecodable: Callable[[str], None]
    ignored: IgnoredZnodes
    multi_read: bool
    live_batch_size: int
    ledgers: StampedIndex = dataclasses.field(default_factory=StampedIndex, init=False)
    marks: StampedIndex = dataclasses.field(default_factory=StampedIndex, init=False)
    epoch: int = dataclasses.field(default=0, init=False)
    #: Live ledger reads of one chunk of notifications (path -> ledger id), sent as one multiRead.
    pending_reads: dict[str, int] = dataclasses.field(default_factory=dict, init=False)

    # -- live notifications ----------------------------------------------------------------------------
    def ledger_changed(self, path: str, ledger_id: int, watch: Callable[..., Any] | None) -> None:
        """A ledger znode created or changed: read it at once (fallback mode, no multiRead), or with the
        other ledgers of this chunk of notifications (:meth:`flush_reads`)."""
        self.ledgers.touch(ledger_id, self.epoch)
        if watch is not None or not self.multi_read:
            self.read(OP_LEDGER, path, ledger_id, watch)
            return
        self.pending_reads[path] = ledger_id
        if len(self.pending_reads) >= self.live_batch_size:
            self.flush_reads()

    def flush_reads(self) -> None:
        """Send the ledger reads gathered by :meth:`ledger_changed` (one getData, or one multiRead)."""
        pending = self.pending_reads
        if len(pending) == 1:
            path, ledger_id = pending.popitem()
            self.read(OP_LEDGER, path, ledger_id, None)
        elif pending:
            paths, ids = list(pending), list(pending.values())
            pending.clear()
            self.read_many(OP_LEDGER, paths, ids)

    def mark_changed(self, path: str, ledger_id: int, watch: Callable[..., Any] | None) -> None:
        """A mark created or extended: read it."""
        self.marks.touch(ledger_id, self.epoch)
        self.read(OP_MARK, path, ledger_id, watch)

    def ledger_deleted(self, ledger_id: int) -> None:
        """A ledger's delete notification, published at its place."""
        self.emit(events.ledger_deleted(ledger_id, last_mzxid=self.ledgers.pop(ledger_id)), None)

    def mark_deleted(self, ledger_id: int) -> None:
        """A mark's delete notification: the ledger is no longer under-replicated."""
        self.emit(events.underreplication_cleared(ledger_id, last_mzxid=self.marks.pop(ledger_id)), None)

    # -- read answers ----------------------------------------------------------------------------------
    def ledger_read(
        self, path: str, ledger_id: int, data: bytes | None, stat: Any, snapshot: Snapshot | None
    ) -> None:
        """A ledger's ``(data, stat)``: published unless a reconciliation already published this version."""
        if snapshot is not None:
            snapshot.counts.ledgers_scanned += 1
        full = snapshot is not None and snapshot.is_full
        if not self.ledgers.record(ledger_id, mzxid=stat.mzxid, epoch=self.epoch, full=full):
            return
        payload: Any
        try:
            metadata = decode_ledger_metadata(data, znode_ctime=stat.ctime, ledger_id=ledger_id)  # type: ignore[arg-type]
            payload = events.ledger_upserted(ledger_id, metadata, stat, path)
        except FormatError as err:
            payload = events.ledger_undecodable(
                ledger_id, path, stat, events.redact_reason(str(err), data or b"")
            )
            self.undecodable("ledger")
            if snapshot is not None:
                snapshot.counts.ledgers_undecodable += 1
        if snapshot is not None:
            snapshot.counts.ledgers_published += 1
        self.emit(payload, snapshot)

    def mark_read(
        self, _path: str, ledger_id: int, data: bytes | None, stat: Any, snapshot: Snapshot | None
    ) -> None:
        """A mark's ``(data, stat)``: published unless a reconciliation already published this version."""
        full = snapshot is not None and snapshot.is_full
        if not self.marks.record(ledger_id, mzxid=stat.mzxid, epoch=self.epoch, full=full):
            return
        try:
            payload = events.underreplication_set(ledger_id, parse_underreplicated_ledger(data or b""), stat)
        except FormatError as err:
            self.undecodable("underreplication_mark")
            reason = events.redact_reason(str(err), data or b"")
            payload = events.underreplication_set(ledger_id, None, stat, error=reason)
        if snapshot is not None:
            snapshot.counts.marks_published += 1
        self.emit(payload, snapshot)

    def batch_read(
        self, batch: tuple[str, list[str], list[int]], results: list[Any], snapshot: Snapshot | None
    ) -> None:
        """A ``multiRead``'s answers, one per path: ``(data, stat)`` or that znode's error."""
        op, paths, ids = batch
        handle = self.ledger_read if op == OP_LEDGER else self.mark_read
        for path, ledger_id, result in zip(paths, ids, results, strict=True):
            if isinstance(result, tuple):
                handle(path, ledger_id, result[0], result[1], snapshot)
            elif not isinstance(result, NoNodeError) and snapshot is not None:
                snapshot.fail(f"read of {path} failed: {type(result).__name__}")

    # -- snapshots -------------------------------------------------------------------------------------
    def scan(self, walker: TreeWalker, reads: ScanReads, tick: Callable[[], None]) -> None:
        """Walk the mark tree, then the ledger tree, reading every leaf (``tick`` after each ledger)."""
        urledgers = UnderreplicationPaths(self.root).urledgers
        walker.walk(
            urledgers,
            lambda path: node_of_mark(path, self.root),
            lambda path, ledger_id: reads.leaf(OP_MARK, path, ledger_id),
            watch=reads.child_watch,
        )
        reads.flush()

        def on_ledger(path: str, ledger_id: Any) -> None:
            reads.leaf(OP_LEDGER, path, ledger_id)
            tick()

        walker.walk(self.root, self._classify_ledger, on_ledger, watch=reads.child_watch)
        reads.flush()

    def _classify_ledger(self, path: str) -> tuple[int, Any]:
        node = classify_path(path, self.manager, self.root)
        if node.kind is ZnodeKind.LEDGER:
            return NodeKind.LEAF, node.ledger_id
        if node.kind is ZnodeKind.INTERMEDIATE:
            return NodeKind.DIRECTORY, None
        if node.kind is ZnodeKind.OTHER:
            self.ignored.note(path)
        return NodeKind.SKIP, None

    def infer_deletions(self, snapshot: Snapshot) -> None:
        """After a complete scan: every ledger and mark it (or a live change since) did not stamp is gone."""
        gone = self.ledgers.stale(self.epoch)
        for ledger_id, last_mzxid in gone:
            snapshot.counts.ledgers_deleted += 1
            self.emit(events.ledger_deleted(ledger_id, last_mzxid=last_mzxid, inferred=True), snapshot)
        cleared = self.marks.stale(self.epoch)
        for ledger_id, last_mzxid in cleared:
            self.emit(
                events.underreplication_cleared(ledger_id, last_mzxid=last_mzxid, inferred=True), snapshot
            )
        if gone or cleared:
            logger.info(
                "reconciliation: %d ledgers and %d under-replication marks vanished while unwatched",
                len(gone),
                len(cleared),
            )
