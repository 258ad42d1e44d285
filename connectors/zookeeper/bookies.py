"""The watcher's recipe for the bookie registry: each bookie's registrations and cookie as one status event.

A bookie shows in three places of BookKeeper's tree: ``available/<id>`` (writable),
``available/readonly/<id>`` and ``cookies/<id>``. :class:`BookieRegistry` keeps what each of them last
said per bookie and publishes a ``BookieStatus`` (WRITABLE, READ_ONLY or GONE, with its registration data
and cookie) whenever that changes:

* **Reads in flight hold the status back.** A registration or cookie being read holds the bookie's status
  until its answer is dequeued, so that, say, a cookie seen before the registration's data does not publish a
  transient GONE. A delete applies at once (``after_delete``): reads issued after it cannot hide the gap of
  a quick re-registration.
* **Listings are diffed** at their place in the stream (:meth:`BookieRegistry.on_list`): a bookie missing
  from a listing lost that registration; every listed one is read again (its data may have changed while
  nobody watched).
* **A bookie registered nowhere** is probed (:class:`~connectors.bookie.liveness.LivenessProbes`): is it a
  dead bookie or a ZooKeeper outage? The answer is published unless it registered again meanwhile.
* **Snapshots.** A FULL snapshot restates every bookie inside its bracket
  (:meth:`BookieRegistry.publish_all`).

The watcher (:mod:`connectors.zookeeper.watcher`) owns the session, the FIFO and the snapshots; it routes the
registry's znodes' notifications and answers here. Everything runs on the watcher's worker thread.

Example:
    >>> issued = []
    >>> registry = BookieRegistry(read_registration=lambda path, extra: issued.append(path),
    ...                           read_cookie=lambda path, extra: issued.append(path), emit=print)
    >>> registry.on_list("/ledgers/available", RegistrationKind.WRITABLE, ["b1:3181", "readonly"], None)
    >>> issued
    ['/ledgers/available/b1:3181']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from connectors.zookeeper.snapshot import Snapshot
from core import events
from core.domain.registration import (
    BookieServiceInfo,
    RegistrationKind,
    bookie_rpc_address,
    decode_bookie_service_info,
    is_valid_bookie_id,
)
from core.errors import FormatError
from core.pb import change_events_pb2 as pb

Emit = Callable[[events.Payload, Snapshot | None], None]
#: Issue a read of ``path`` whose answer comes back to the registry with ``extra``.
Read = Callable[[str, tuple[Any, ...]], None]


@dataclasses.dataclass
class Registration:
    """One registration znode as read: its stat, its decoded data (None: undecodable) and why not."""

    stat: Any
    info: BookieServiceInfo | None
    error: str


@dataclasses.dataclass
class BookieState:
    """What the registry knows of one bookie, and what it last published."""

    writable: Registration | None = None
    readonly: Registration | None = None
    cookie: bool = False
    cookie_read: tuple[Any, bytes | None] | None = None  # the cookie's stat and bytes, once read
    published: tuple[Any, ...] | None = None
    published_in: str = ""  # snapshot id of the last status published inside a snapshot bracket
    address: str = ""  # the bookie-rpc address of its last registration (probed once it vanishes)
    pending_reads: int = 0  # registration and cookie reads in flight: the status waits for them

    @property
    def exists(self) -> bool:
        return self.writable is not None or self.readonly is not None or self.cookie

    def status(self) -> tuple[events.BookieStatusValue, Registration | None]:
        if self.writable is not None:
            return pb.BookieStatus.WRITABLE, self.writable
        if self.readonly is not None:
            return pb.BookieStatus.READ_ONLY, self.readonly
        return pb.BookieStatus.GONE, None

    def signature(self) -> tuple[Any, ...]:
        """What a published status depends on: a new status is published only when this changes."""
        status, registration = self.status()
        cookie = (self.cookie_read[0].czxid, self.cookie_read[0].mzxid) if self.cookie_read else None
        if registration is None:
            return (status, self.cookie, cookie)
        stat = registration.stat
        return (status, self.cookie, cookie, stat.czxid, stat.mzxid, registration.error)


class BookieRegistry:
    """Follows the bookie registry for the watcher's worker.

    ``read_registration`` and ``read_cookie`` issue the watcher's ordered reads (their answers come back
    through :meth:`registration_answered` and :meth:`cookie_answered`); ``liveness`` probes bookies that
    vanished (None: no probes); ``mark_listed`` is the fallback mode's note of a listed directory;
    ``undecodable`` counts a registration that does not decode.
    """

    def __init__(
        self,
        *,
        read_registration: Read,
        read_cookie: Read,
        emit: Emit,
        liveness: Any = None,
        mark_listed: Callable[[str], None] | None = None,
        undecodable: Callable[[], None] = lambda: None,
    ) -> None:
        self._read_registration = read_registration
        self._read_cookie = read_cookie
        self._emit = emit
        self._liveness = liveness
        self._mark_listed = mark_listed
        self._undecodable = undecodable
        self.bookies: dict[str, BookieState] = {}

    # -- reads and their answers ---------------------------------------------------------------------
    def read_registration(
        self, path: str, kind: RegistrationKind, bookie_id: str, snapshot: Snapshot | None
    ) -> None:
        """Read a registration; the bookie's status waits for the answer. Not slot-held (bookies are
        few); the snapshot rides along so the status lands in its bracket."""
        self._bookie(bookie_id).pending_reads += 1
        self._read_registration(path, (kind, bookie_id, snapshot))

    def registration_answered(
        self,
        kind: RegistrationKind,
        bookie_id: str,
        read: tuple[bytes | None, Any] | None,
        snapshot: Snapshot | None,
    ) -> None:
        """A registration's answer: its ``(data, stat)``, or None when the read failed (gone already, its
        delete notification came first, or a lost read): publish what is known."""
        bookie = self._bookie(bookie_id)
        bookie.pending_reads -= 1
        if read is None:
            self._publish(bookie_id, bookie, snapshot)
        else:
            self.set_registration(bookie_id, kind, read, snapshot)

    def read_cookie(self, path: str, bookie_id: str, snapshot: Snapshot | None) -> None:
        """Read a cookie (its czxid and bytes tell a bookie formatted again); its status waits for it."""
        self._bookie(bookie_id).pending_reads += 1
        self._read_cookie(path, (bookie_id, snapshot))

    def cookie_answered(
        self, bookie_id: str, read: tuple[Any, bytes | None] | None, snapshot: Snapshot | None
    ) -> None:
        """A cookie's answer: its ``(stat, data)``, or None when the read failed (deleted meanwhile: its
        delete notification applies that)."""
        bookie = self._bookie(bookie_id)
        bookie.pending_reads -= 1
        if read is None:
            self._publish(bookie_id, bookie, snapshot)
        else:
            self.set_cookie(bookie_id, True, snapshot, read=read)

    # -- state changes ---------------------------------------------------------------------------------
    def set_registration(
        self,
        bookie_id: str,
        kind: RegistrationKind,
        read: tuple[bytes | None, Any] | None,
        snapshot: Snapshot | None,
        *,
        after_delete: bool = False,
    ) -> None:
        """Set one registration of a bookie (None: deleted) and publish its status if that changed."""
        bookie = self._bookie(bookie_id)
        registration = self._registration(bookie_id, read) if read is not None else None
        if kind is RegistrationKind.WRITABLE:
            bookie.writable = registration
        else:
            bookie.readonly = registration
        if registration is not None and registration.info is not None:
            address = bookie_rpc_address(registration.info)
            bookie.address = str(address) if address is not None else bookie.address
        self._publish(bookie_id, bookie, snapshot, ignore_pending=after_delete)

    def _registration(self, bookie_id: str, read: tuple[bytes | None, Any]) -> Registration:
        data, stat = read
        try:
            return Registration(stat, decode_bookie_service_info(bookie_id, data), "")
        except FormatError as err:
            self._undecodable()
            return Registration(stat, None, events.redact_reason(str(err), data or b""))

    def set_cookie(
        self,
        bookie_id: str,
        present: bool,
        snapshot: Snapshot | None,
        read: tuple[Any, bytes | None] | None = None,
    ) -> None:
        """Set whether a bookie has a cookie (and its ``(stat, data)`` as read); publish if that changed."""
        bookie = self._bookie(bookie_id)
        if bookie.cookie == present and (read is None or read == bookie.cookie_read):
            return
        bookie.cookie, bookie.cookie_read = present, (read if present else None)
        self._publish(bookie_id, bookie, snapshot)

    def on_list(
        self, path: str, kind: RegistrationKind, children: list[str], snapshot: Snapshot | None
    ) -> None:
        """A listing of available/, available/readonly/ or cookies/, diffed at its place in the stream."""
        if self._mark_listed is not None:
            self._mark_listed(path)
        present = {c for c in children if is_valid_bookie_id(c)}  # drops "readonly" (any case) too
        for bookie_id in list(self.bookies):
            bookie = self.bookies.get(bookie_id)
            if bookie is None or bookie_id in present:
                continue
            registered = bookie.writable if kind is RegistrationKind.WRITABLE else bookie.readonly
            if kind is not RegistrationKind.COOKIE and registered is not None:
                self.set_registration(bookie_id, kind, None, snapshot)
            elif kind is RegistrationKind.COOKIE and bookie.cookie:
                self.set_cookie(bookie_id, False, snapshot)
        prefix = path + "/"
        for bookie_id in sorted(present):
            if kind is RegistrationKind.COOKIE:
                self.read_cookie(prefix + bookie_id, bookie_id, snapshot)
            else:
                # Registration data may have changed while nobody watched (re-registration): read it again.
                self.read_registration(prefix + bookie_id, kind, bookie_id, snapshot)

    # -- publishing ------------------------------------------------------------------------------------
    def publish_all(self, snapshot: Snapshot) -> None:
        """Restate every bookie inside a FULL snapshot's bracket."""
        for bookie_id, bookie in sorted(self.bookies.items()):
            self._publish(bookie_id, bookie, snapshot, force=True)

    def publish_probe(self, bookie_id: str, answered: bool, address: str, detail: str) -> None:
        """A liveness probe's answer, unless the bookie registered again while the probe ran."""
        bookie = self.bookies.get(bookie_id)
        if bookie is not None and bookie.status()[0] != pb.BookieStatus.GONE:
            return
        self._emit(events.bookie_probe(bookie_id, answered=answered, address=address, detail=detail), None)

    def _bookie(self, bookie_id: str) -> BookieState:
        bookie = self.bookies.get(bookie_id)
        if bookie is None:
            bookie = self.bookies[bookie_id] = BookieState()
        return bookie

    def _publish(
        self,
        bookie_id: str,
        bookie: BookieState,
        snapshot: Snapshot | None,
        *,
        force: bool = False,
        ignore_pending: bool = False,
    ) -> None:
        if bookie.pending_reads > 0 and not (force or ignore_pending):
            return
        signature = bookie.signature()
        in_bracket = snapshot is not None and bookie.published_in == snapshot.snapshot_id
        if signature != bookie.published or (force and not in_bracket):
            bookie.published = signature
            if snapshot is not None:
                bookie.published_in = snapshot.snapshot_id
            status, registration = bookie.status()
            if snapshot is not None:
                snapshot.counts.bookies_published += 1
            self._emit(_status_event(bookie_id, bookie, status, registration), snapshot)
            self._watch_liveness(bookie_id, bookie, status)
        if not bookie.exists and bookie.pending_reads <= 0:
            self.bookies.pop(bookie_id, None)

    def _watch_liveness(self, bookie_id: str, bookie: BookieState, status: events.BookieStatusValue) -> None:
        """Probe a bookie while it is registered nowhere (a ZooKeeper outage or a dead bookie?)."""
        if self._liveness is None:
            return
        if status == pb.BookieStatus.GONE:
            self._liveness.watch(bookie_id, bookie.address or bookie_id)
        else:
            self._liveness.forget(bookie_id)


def _status_event(
    bookie_id: str, bookie: BookieState, status: events.BookieStatusValue, registration: Registration | None
) -> events.Payload:
    return events.bookie_status(
        bookie_id,
        status,
        info=registration.info if registration is not None else None,
        registration=registration.stat if registration is not None else None,
        has_cookie=bookie.cookie,
        registration_error=registration.error if registration is not None else "",
        cookie=bookie.cookie_read,
    )
