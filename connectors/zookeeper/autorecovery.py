"""The watcher's recipes for AutoRecovery's znodes: is anything repairing the cluster, and how soon?

BookKeeper's AutoRecovery keeps its state beside the under-replication marks: ``disable`` (AutoRecovery
switched off), the Auditor's election votes, the ReplicationWorkers' locks (one per ledger being
replicated) and the Auditor's check times. The recipe reads them all at once, synchronously (a handful of
znodes, changed rarely), and publishes one ``AutoRecoveryState`` event when anything in it changed, or on
every FULL snapshot. A notification under those znodes only marks the state changed
(:meth:`AutoRecoveryRecipe.note_change`); the worker reads once per chunk of notifications
(:meth:`AutoRecoveryRecipe.flush`), since workers create and delete a lock per ledger they replicate and
reading on each notification would cost the square of the locks.

The Auditor's ``lostBookieRecoveryDelay`` (how long it waits before replicating a lost bookie's ledgers) is
a recipe of its own, :class:`RecoveryDelay`: its znode is read in ZooKeeper's order like a ledger's, and
every write is published, even of the same value.

The watcher (:mod:`connectors.zookeeper.watcher`) owns the session, the FIFO and the snapshots; in its
fallback mode (no persistent watch) the recipe sets the one-shot watches it is given.

Example:
    >>> from core.domain.underreplication import UnderreplicationPaths
    >>> recipe = AutoRecoveryRecipe(None, UnderreplicationPaths("/ledgers"), emit=print)
    >>> recipe.note_change(); recipe.changed
    True
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import KazooException, NoNodeError

from connectors.zookeeper.snapshot import Snapshot
from core import events
from core.domain.underreplication import (
    CtimeZnode,
    UnderreplicationPaths,
    ledger_id_from_urledger_path,
    parse_auditor_vote,
    parse_check_times,
    parse_lock_data,
    parse_lost_bookie_recovery_delay,
    vote_sequence,
)
from core.errors import FormatError

logger = logging.getLogger(__name__)

Emit = Callable[[events.Payload, Snapshot | None], None]
Votes = list[tuple[int, str | None]]
Locks = list[tuple[int, str | None, int]]

OP_DELAY = "recovery_delay"  # a read of ``lostBookieRecoveryDelay``


class AutoRecoveryRecipe:
    """Reads and publishes AutoRecovery's state for the watcher's worker thread.

    ``undecodable`` counts a znode that does not decode, by what it is (the watcher's metric);
    ``data_watch`` and ``child_watch`` are the fallback mode's one-shot watches (None with a persistent
    watch); ``on_read`` counts each read of the state.
    """

    def __init__(
        self,
        client: Any,
        paths: UnderreplicationPaths,
        *,
        emit: Emit,
        undecodable: Callable[[str, int], None] = lambda what, count: None,
        data_watch: Callable[..., Any] | None = None,
        child_watch: Callable[..., Any] | None = None,
        on_read: Callable[[], None] = lambda: None,
    ) -> None:
        self.client = client
        self.paths = paths
        self._emit = emit
        self._undecodable = undecodable
        self._data_watch = data_watch
        self._child_watch = child_watch
        self._on_read = on_read
        self._published: bytes | None = None  # the AutoRecoveryState last published (serialized)
        self.changed = False  # a notification under AutoRecovery's znodes awaits its read

    def note_change(self) -> None:
        """A notification under AutoRecovery's znodes: read them at the end of the chunk."""
        self.changed = True

    def flush(self) -> None:
        """Read the state once for every notification noted since the last flush."""
        if self.changed:
            self.changed = False
            self.read(None)

    def read(self, snapshot: Snapshot | None) -> None:
        """Read the znodes and publish their state when it changed (always in a FULL ``snapshot``)."""
        self._on_read()
        try:
            disabled, votes, locks, checks, errors = self._znodes()
        except KazooException as err:
            # ConnectionLoss / SessionExpired: the reconciliation after the reconnect reads them again.
            if snapshot is not None:
                snapshot.fail(f"read of AutoRecovery's znodes failed: {type(err).__name__}")
            logger.debug("reading AutoRecovery's znodes failed: %s", type(err).__name__)
            return
        payload = events.auto_recovery_state(
            disabled_ctime_ms=disabled, votes=votes, locks=locks, checks=checks, error="; ".join(errors)
        )
        serialized = payload.SerializeToString(deterministic=True)
        if serialized == self._published and (snapshot is None or not snapshot.is_full):
            return
        self._published = serialized
        self._emit(payload, snapshot)

    def _znodes(self) -> tuple[int | None, Votes, Locks, dict[CtimeZnode, int], list[str]]:
        paths = self.paths
        stat = self.client.exists(paths.disable, watch=self._data_watch)
        disabled = int(stat.ctime) if stat is not None else None
        contents = {check: self._data_or_none(paths.ctime(check)) for check in CtimeZnode}
        checks, errors = parse_check_times(contents)
        if errors:
            self._undecodable("auditor_check_time", len(errors))
        votes = self._votes(errors)
        locks = self._locks(errors)
        return disabled, votes, locks, checks, errors

    def _votes(self, errors: list[str]) -> Votes:
        votes: Votes = []
        for name, data, _ in self._children_data(self.paths.auditor_election):
            try:
                votes.append((vote_sequence(name), parse_auditor_vote(data)))
            except FormatError as err:
                self._undecodable("auditor_vote", 1)
                errors.append(events.redact_reason(str(err), data))
        return votes

    def _locks(self, errors: list[str]) -> Locks:
        locks: Locks = []
        for name, data, lock_stat in self._children_data(self.paths.locks):
            try:
                ledger_id = ledger_id_from_urledger_path(name)
            except FormatError as err:
                errors.append(str(err))
                continue
            try:
                holder = parse_lock_data(data)
            except FormatError as err:
                self._undecodable("replication_lock", 1)
                errors.append(events.redact_reason(str(err), data))
                holder = None
            locks.append((ledger_id, holder, int(lock_stat.ctime)))
        return locks

    def _data_or_none(self, path: str) -> bytes | None:
        """The data of ``path`` (None: it does not exist); in fallback mode with a watch on its change, or
        on its creation."""
        watch = self._data_watch
        with contextlib.suppress(NoNodeError):
            return bytes(self.client.get(path, watch=watch)[0])
        if watch is None or self.client.exists(path, watch=watch) is None:
            return None
        with contextlib.suppress(NoNodeError):  # created between the two calls
            return bytes(self.client.get(path, watch=watch)[0])
        return None  # and deleted again: the watch just set fired for it

    def _children_data(self, path: str) -> list[tuple[str, bytes, Any]]:
        """``(name, data, stat)`` of each child of ``path`` (none when it does not exist); in fallback mode
        with a child watch on it, or a watch for its creation."""
        try:
            names = self.client.get_children(path, watch=self._child_watch)
        except NoNodeError:
            if self._data_watch is not None:
                self.client.exists(path, watch=self._data_watch)
            return []
        found = []
        for name in sorted(names):
            try:
                data, stat = self.client.get(f"{path}/{name}")
            except NoNodeError:
                continue  # gone between the listing and the read (its notification follows)
            found.append((name, data, stat))
        return found


class RecoveryDelay:
    """Publishes ``lostBookieRecoveryDelay`` as read by the watcher's ordered reads (op :data:`OP_DELAY`).

    Example:
        >>> from kazoo.protocol.states import ZnodeStat
        >>> delay = RecoveryDelay(emit=lambda payload, snapshot: print(payload.seconds))
        >>> delay.apply(b"30", ZnodeStat(8, 9, 0, 0, 1, 0, 0, 0, 2, 0, 8), None); delay.present
        30
        True
    """

    def __init__(self, *, emit: Emit, undecodable: Callable[[], None] = lambda: None) -> None:
        self._emit = emit
        self._undecodable = undecodable
        self._state: tuple[int, bool] | None = None  # (mzxid, present) last published

    @property
    def present(self) -> bool:
        """Whether the znode existed at the last answer."""
        return self._state is not None and self._state[1]

    def apply(self, data: bytes | None, stat: Any, snapshot: Snapshot | None) -> None:
        """The znode's ``(data, stat)``, or ``(None, None)`` when it is absent or deleted; published when it
        changed (always inside a FULL ``snapshot``)."""
        present = stat is not None
        state = (stat.mzxid if present else 0, present)
        if state == self._state and (snapshot is None or not snapshot.is_full):
            return
        self._state = state
        seconds: int | None = None
        error = ""
        if present:
            try:
                seconds = parse_lost_bookie_recovery_delay(data or b"")
            except FormatError as err:
                self._undecodable()
                error = events.redact_reason(str(err), data or b"")
        self._emit(events.recovery_delay(seconds, present=present, stat=stat, error=error), snapshot)
