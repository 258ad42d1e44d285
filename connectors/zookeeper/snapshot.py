"""Snapshot scans for the change watcher: walk a ZooKeeper subtree without flooding the server.

A snapshot (on start) or reconciliation (after a reconnect, a session expiry, periodically) reads every
entity the auditor needs. This module holds the pieces the watcher's controller composes:

* :class:`Snapshot` — one scan's identity (id, reason, mode, epoch), its counters and completeness.
* :class:`TreeWalker` — lists directories breadth-first with a few listings in flight and hands every leaf
  to a callback; the callback issues the leaf's read. Leaf reads are bounded by a :class:`ReadSlots`
  semaphore that the watcher's worker releases when it has *processed* a read (so a slow Kafka slows the scan
  instead of piling reads up in memory), optionally paced by a :class:`RatePacer` (periodic scans).
* :class:`ScanReads` — a scan's reads through the ordered reads: slot-held, paced, leaves gathered into
  ``multiRead`` requests.
* :class:`StampedIndex` — what a scan compares against: key → last mzxid and the scan epoch that last saw
  it, so a reconciliation publishes only differences and infers what vanished while nobody watched.
* :class:`ProgressLine` — one self-overwriting progress line on a terminal, nothing otherwise.

Example:
    >>> pacer = RatePacer(0)          # 0 = unpaced
    >>> pacer.wait(lambda: False)
    True
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from connectors.zookeeper.ordered_reads import OrderedReads
from core.events import SnapshotCounts, SnapshotMode, SnapshotReason
from core.pb import change_events_pb2 as pb

logger = logging.getLogger(__name__)

#: Directory listings in flight during a walk (listings are few and can be large; leaves are bounded apart).
LISTINGS_IN_FLIGHT = 8
#: The op of a ``multiRead`` token: ``(OP_BATCH, "", snapshot or None, (leaf op, paths, infos))``.
OP_BATCH = "multi_read"

# The index packs mzxid << 16 | scan epoch. Epochs wrap at 65536; a stale stamp could only match again after
# 65536 consecutive *incomplete* scans, since every complete scan re-stamps or removes every entry.
EPOCH_BITS = 16
EPOCH_MASK = (1 << EPOCH_BITS) - 1


class ScanAborted(Exception):
    """The scan stopped early (disconnect, shutdown, a failed read): its results are incomplete."""


@dataclass
class Snapshot:
    """One snapshot or reconciliation scan, shared by the controller (scanning) and the worker (publishing).

    Example:
        >>> s = Snapshot.new(pb.SnapshotBegin.START, pb.SnapshotBegin.FULL, epoch=1)
        >>> s.is_full, s.complete, s.reason_name
        (True, True, 'START')
    """

    snapshot_id: str
    reason: SnapshotReason
    mode: SnapshotMode
    epoch: int
    started_monotonic: float = field(default_factory=time.monotonic)
    counts: SnapshotCounts = field(default_factory=SnapshotCounts)
    partition_events: collections.Counter[int] = field(default_factory=collections.Counter)
    complete: bool = True
    failure: str = ""
    done: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def new(cls, reason: SnapshotReason, mode: SnapshotMode, *, epoch: int) -> Snapshot:
        """A snapshot with a fresh random id.

        Example:
            >>> len(Snapshot.new(pb.SnapshotBegin.PERIODIC, pb.SnapshotBegin.DELTA, epoch=2).snapshot_id)
            32
        """
        return cls(uuid.uuid4().hex, reason, mode, epoch)

    @property
    def is_full(self) -> bool:
        """True for a FULL snapshot (every entity is published, not only differences)."""
        return self.mode == pb.SnapshotBegin.FULL

    @property
    def reason_name(self) -> str:
        """The reason as text (``START``, ``RECONNECT``, ...)."""
        return pb.SnapshotBegin.Reason.Name(self.reason)

    def fail(self, why: str) -> None:
        """Mark the scan incomplete (the first reason is kept)."""
        if self.complete:
            self.complete = False
            self.failure = why

    def elapsed_s(self) -> float:
        """Seconds since the scan started."""
        return time.monotonic() - self.started_monotonic


class ReadSlots:
    """A counting semaphore for reads in flight, with an abortable acquire and a "wait until drained".

    Example:
        >>> slots = ReadSlots(2)
        >>> slots.acquire(lambda: False), slots.in_flight
        (True, 1)
        >>> slots.release(); slots.drained(lambda: False, timeout_s=1)
        True
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        self.peak = 0  # highest in_flight seen (tests and benchmarks check the bound)
        self._condition = threading.Condition()

    def acquire(self, aborted: Callable[[], bool]) -> bool:
        """Take a slot; False (no slot taken) when ``aborted()`` turns true while waiting."""
        with self._condition:
            while self.in_flight >= self.limit:
                if aborted():
                    return False
                self._condition.wait(0.2)
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            return True

    def release(self, count: int = 1) -> None:
        """Give slots back (called by the worker once reads are processed)."""
        with self._condition:
            self.in_flight -= count
            self._condition.notify_all()

    def drained(self, aborted: Callable[[], bool], timeout_s: float | None = None) -> bool:
        """Wait until no read is in flight; False when aborted or timed out first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._condition:
            while self.in_flight > 0:
                if aborted() or (deadline is not None and time.monotonic() >= deadline):
                    return False
                self._condition.wait(0.2)
            return True


class RatePacer:
    """Paces reads to ``per_second`` (0 = unpaced); used by periodic reconciliation scans.

    Example:
        >>> RatePacer(1000).wait(lambda: True)  # aborted while pacing
        True
    """

    def __init__(self, per_second: float) -> None:
        self.interval = 1.0 / per_second if per_second > 0 else 0.0
        self._next = time.monotonic()

    def wait(self, aborted: Callable[[], bool]) -> bool:
        """Sleep until the next read may go; returns early (still True) when aborted: the caller checks."""
        if self.interval == 0.0:
            return True
        now = time.monotonic()
        if self._next > now:
            delay = self._next - now
            while delay > 0 and not aborted():
                time.sleep(min(delay, 0.2))
                delay = self._next - time.monotonic()
        self._next = max(self._next, time.monotonic() - 1.0) + self.interval  # allow a 1 s burst at most
        return True


class NodeKind:
    """What :class:`TreeWalker`'s classifier says about a child path."""

    SKIP = 0
    DIRECTORY = 1
    LEAF = 2


Classifier = Callable[[str], tuple[int, Any]]


class TreeWalker:
    """Breadth-first walk of a subtree: directories listed here, leaves handed to ``on_leaf``.

    ``classify(path) -> (NodeKind, info)`` decides per child; ``on_leaf(path, info)`` must issue the leaf's
    read (after taking a read slot). ``watch`` (fallback mode) is left on every listed directory.

    Example:
        >>> # TreeWalker(client, aborted).walk("/ledgers", classify, on_leaf)
    """

    def __init__(
        self,
        client: KazooClient,
        aborted: Callable[[], bool],
        *,
        listings_in_flight: int = LISTINGS_IN_FLIGHT,
        on_listed: Callable[[str], None] | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self._client = client
        self._aborted = aborted
        self._listings_in_flight = listings_in_flight
        self._on_listed = on_listed
        self._timeout_s = timeout_s

    def walk(
        self,
        root: str,
        classify: Classifier,
        on_leaf: Callable[[str, Any], None],
        *,
        watch: Callable[..., Any] | None = None,
    ) -> None:
        """Walk ``root``; a missing root is an empty tree. Raises :class:`ScanAborted`."""
        pending: collections.deque[str] = collections.deque([root])
        in_flight: collections.deque[tuple[str, Any]] = collections.deque()
        while pending or in_flight:
            while pending and len(in_flight) < self._listings_in_flight:
                path = pending.popleft()
                in_flight.append((path, self._client.get_children_async(path, watch=watch)))
            path, result = in_flight.popleft()
            children = self._wait(path, result)
            if children is None:
                continue
            if self._on_listed is not None:
                self._on_listed(path)
            prefix = path if path.endswith("/") else path + "/"
            for name in children:
                child = prefix + name
                kind, info = classify(child)
                if kind == NodeKind.LEAF:
                    on_leaf(child, info)
                elif kind == NodeKind.DIRECTORY:
                    pending.append(child)
            if self._aborted():
                raise ScanAborted("aborted")

    def _wait(self, path: str, result: Any) -> list[str] | None:
        deadline = time.monotonic() + self._timeout_s
        while not result.wait(0.2):
            if self._aborted():
                raise ScanAborted("aborted while listing")
            if time.monotonic() > deadline:
                raise ScanAborted(f"listing {path} timed out")
        try:
            children: list[str] = result.get_nowait()
        except NoNodeError:
            return None  # deleted since its parent was listed
        except Exception as err:  # ConnectionLoss, SessionExpired...: the scan cannot be trusted
            raise ScanAborted(f"listing {path} failed: {type(err).__name__}") from None
        return children


class StampedIndex:
    """Key → the last mzxid published and the epoch of the scan that last saw it (one int per key, ~110 B
    with the dict's entry: a million ledgers fit in ~110 MB).

    A scan stamps what it reads with its epoch; a live change stamps a key it already knows (seen since the
    scan began: not gone). After a complete scan, every key with an older stamp vanished while nobody
    watched (:meth:`stale`).

    Example:
        >>> index = StampedIndex()
        >>> index.record(7, mzxid=40, epoch=1, full=False), index.record(7, mzxid=40, epoch=2, full=False)
        (True, False)
        >>> index.record(8, mzxid=41, epoch=1, full=False); index.stale(epoch=2)
        True
        [(8, 41)]
    """

    def __init__(self) -> None:
        self._entries: dict[Any, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Any) -> bool:
        return key in self._entries

    def touch(self, key: Any, epoch: int) -> None:
        """A live change of ``key``: if known, it is not gone (no inferred delete at this scan's end)."""
        packed = self._entries.get(key)
        if packed is not None:
            self._entries[key] = (packed & ~EPOCH_MASK) | epoch

    def record(self, key: Any, *, mzxid: int, epoch: int, full: bool) -> bool:
        """``key`` read at ``mzxid``; True when it is to be published (a new version, or ``full``)."""
        packed = self._entries.get(key)
        self._entries[key] = (mzxid << EPOCH_BITS) | epoch
        return full or packed is None or packed >> EPOCH_BITS != mzxid

    def pop(self, key: Any) -> int:
        """Forget ``key`` (deleted); its last mzxid, 0 when unknown."""
        packed = self._entries.pop(key, None)
        return packed >> EPOCH_BITS if packed is not None else 0

    def stale(self, epoch: int) -> list[tuple[Any, int]]:
        """Remove and return ``(key, last mzxid)`` of every key not stamped with ``epoch``."""
        entries = self._entries
        gone = [key for key, packed in entries.items() if packed & EPOCH_MASK != epoch]
        return [(key, entries.pop(key) >> EPOCH_BITS) for key in gone]


@dataclass(eq=False)
class ScanReads:
    """One scan's reads through the watcher's :class:`OrderedReads`, answered on its FIFO.

    Every read takes a slot of ``slots`` (released by the worker once it has published the answer), waits
    for ``pacer`` and carries ``(op, path, snapshot, extra)`` as its token. Leaves (:meth:`leaf`) are gathered
    into ``multiRead`` requests of ``batch_size`` (1: single reads). ``count(op)`` counts each request;
    ``child_watch`` and ``data_watch`` are the fallback mode's one-shot watches (None otherwise).

    Example:
        >>> # reads = ScanReads(ordered, snapshot, slots, RatePacer(0), aborted, batch_size=100, count=...)
        >>> # reads.leaf("ledger", "/ledgers/00/0000/L0001", 1); reads.flush()
    """

    reads: OrderedReads
    snapshot: Snapshot
    slots: ReadSlots
    pacer: RatePacer
    aborted: Callable[[], bool]
    _: dataclasses.KW_ONLY
    batch_size: int
    count: Callable[[str], None]
    child_watch: Callable[..., Any] | None = None
    data_watch: Callable[..., Any] | None = None
    _batch: tuple[list[str], list[Any]] = field(default_factory=lambda: ([], []), init=False)
    _batch_op: str = field(default="", init=False)

    def __post_init__(self) -> None:
        # A batch holds read slots while it fills: keep it well below the slot limit.
        self.batch_size = max(1, min(self.batch_size, self.slots.limit // 2))

    def _take_slot(self) -> None:
        if not self.slots.acquire(self.aborted):
            raise ScanAborted("aborted while waiting for a read slot")
        self.pacer.wait(self.aborted)

    def read(self, op: str, path: str, extra: Any = None, *, watch: Callable[..., Any] | None = None) -> None:
        """Read ``path`` (with ``watch``, else the fallback's data watch)."""
        self._take_slot()
        self.count(op)
        self.reads.get(path, (op, path, self.snapshot, extra), watch=watch or self.data_watch)

    def listing(self, op: str, path: str, extra: Any = None) -> None:
        """List ``path``'s children (with the fallback's child watch)."""
        self._take_slot()
        self.count(op)
        self.reads.get_children(path, (op, path, self.snapshot, extra), watch=self.child_watch)

    def leaf(self, op: str, path: str, info: Any) -> None:
        """Read a leaf, gathered with the next ones of the same ``op`` into one ``multiRead``."""
        if self.batch_size == 1:
            self.read(op, path, info)
            return
        paths, infos = self._batch
        if paths and op != self._batch_op:
            self.flush()
        self._take_slot()
        self._batch_op = op
        paths.append(path)
        infos.append(info)
        if len(paths) >= self.batch_size:
            self.flush()

    def flush(self) -> None:
        """Send the gathered leaves."""
        paths, infos = self._batch
        if not paths:
            return
        self.count(OP_BATCH)
        token = (OP_BATCH, "", self.snapshot, (self._batch_op, list(paths), list(infos)))
        self.reads.get_many(list(paths), token)
        paths.clear()
        infos.clear()

    def release_unsent(self) -> None:
        """Give back the slots of leaves gathered and never sent (an aborted scan)."""
        self.slots.release(len(self._batch[0]))
        self._batch[0].clear()
        self._batch[1].clear()


class ProgressLine:
    """A progress line on ``stream`` (stderr), overwritten in place at most every 0.5 s; silent if disabled.

    Example:
        >>> import io
        >>> line = ProgressLine(io.StringIO(), enabled=False)
        >>> line.update("snapshot: 10 ledgers"); line.finish("done")
    """

    def __init__(self, stream: TextIO | None = None, *, enabled: bool | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = bool(getattr(self._stream, "isatty", lambda: False)())
        self.enabled = enabled
        self._last = 0.0
        self._width = 0

    def update(self, text: str, *, force: bool = False) -> None:
        """Show ``text`` (rate-limited unless ``force``)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.5:
            return
        self._last = now
        padded = text.ljust(self._width)
        self._width = len(text)
        self._stream.write("\r" + padded)
        self._stream.flush()

    def finish(self, text: str) -> None:
        """Show ``text`` and end the line."""
        if not self.enabled:
            return
        self.update(text, force=True)
        self._stream.write("\n")
        self._stream.flush()
        self._width = 0
