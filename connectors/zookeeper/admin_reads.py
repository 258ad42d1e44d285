"""Live admin reads from a running BookKeeper's ZooKeeper: a ledger's metadata znode, the registered bookies.

The ZooKeeper side of ``bkaudit metadata show`` and ``bkaudit bookies list`` (what ``bookkeeper shell
ledgermetadata`` and ``listbookies`` read). One short session, reads only, every wait bounded: the connect by
``timeout_s`` and each read by the same bound. Decoding stays with the caller (:mod:`core.domain`).

Errors are one line each: no answer from ZooKeeper or a refused read is a :class:`ServiceError`, an absent
ledger or an absent ledgers root a :class:`NotFoundError`, an undecodable LAYOUT a :class:`FormatError`.

Example:
    >>> from core.settings import ZooKeeperSettings
    >>> reader = AdminReader(ZooKeeperSettings(connect="127.0.0.1:2181/pulsar"), timeout_s=3)
    >>> reader.timeout_s, reader.root
    (3, '/ledgers')
    >>> # with reader: reader.read_ledger(7).data, reader.registered_bookies()
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError

from connectors.zookeeper.client import kazoo_client_options, start_client, unreadable_znode
from core.domain.layout import (
    READONLY_NODE,
    LedgerManagerType,
    available_path,
    layout_path,
    ledger_path,
    parse_layout,
    readonly_path,
    validate_root,
)
from core.domain.managed_ledger import (
    ManagedCursorInfo,
    ManagedLedgerInfo,
    decode_managed_cursor_info,
    decode_managed_ledger_info,
    managed_ledger_path,
)
from core.domain.underreplication import (
    UnderreplicationPaths,
    parse_auditor_vote,
    parse_lost_bookie_recovery_delay,
    vote_sequence,
)
from core.errors import FormatError, NotFoundError, ServiceError
from core.settings import ZooKeeperSettings

#: How long an admin read waits for ZooKeeper when ``zookeeper.connect_timeout_s`` is not set.
DEFAULT_TIMEOUT_S = 10.0

# kazoo warns on every failed connection attempt; a one-shot command reports the failure once, itself.
_KAZOO_LOGGER = logging.getLogger(f"{__name__}.kazoo")
_KAZOO_LOGGER.setLevel(logging.CRITICAL)


@dataclass(frozen=True)
class LedgerZnode:
    """A ledger's metadata znode as read: where it is, its bytes and its ``stat`` times (epoch ms).

    Example:
        >>> LedgerZnode(7, "/ledgers/00/0000/L0007", LedgerManagerType.HIERARCHICAL, b"", 1, 1, 0).path
        '/ledgers/00/0000/L0007'
    """

    ledger_id: int
    path: str
    manager: LedgerManagerType
    data: bytes
    ctime: int
    mtime: int
    version: int


@dataclass(frozen=True)
class RegisteredBookie:
    """One registration znode under ``available/`` (writable) or ``available/readonly/``, with its data.

    Example:
        >>> RegisteredBookie("bookie-01", read_only=True, data=b"").read_only
        True
    """

    bookie_id: str
    read_only: bool
    data: bytes


@dataclass(frozen=True)
class TopicZnodes:
    """A Pulsar topic's managed-ledger znode, decoded, with its cursors' (by cursor name).

    Example:
        >>> path = "/managed-ledgers/t/n/persistent/x"
        >>> TopicZnodes("persistent://t/n/x", path, ManagedLedgerInfo(), {}).info.ledgers
        ()
    """

    topic: str
    path: str
    info: ManagedLedgerInfo
    cursors: dict[str, ManagedCursorInfo]


@dataclass(frozen=True)
class AutoRecoveryView:
    """AutoRecovery as its znodes say now: the elected Auditor (the lowest vote's bookie id; ``""`` when the
    vote does not name one, None without a vote), whether re-replication is enabled (no ``disable`` znode),
    and ``lostBookieRecoveryDelay`` in seconds (None: the znode is absent, the Auditor's configured value
    applies).

    Example:
        >>> AutoRecoveryView(auditor="10.0.0.1:3181", enabled=True, recovery_delay_s=None).enabled
        True
    """

    auditor: str | None
    enabled: bool
    recovery_delay_s: int | None


class AdminReader:
    """A read-only ZooKeeper session for admin commands; use it as a context manager.

    ``manager`` (None: from the cluster's LAYOUT, hierarchical when there is none, as the watcher does) says
    where ledger znodes are. Credentials come from ``settings`` (``zookeeper.auth_*``) and are never printed.

    Example:
        >>> AdminReader(ZooKeeperSettings(ledgers_root="/bk")).root
        '/bk'
    """

    def __init__(
        self,
        settings: ZooKeeperSettings,
        *,
        timeout_s: float | None = None,
        manager: LedgerManagerType | None = None,
    ) -> None:
        self.settings = settings
        self.root = validate_root(settings.ledgers_root)
        self.timeout_s = timeout_s or settings.connect_timeout_s or DEFAULT_TIMEOUT_S
        self._manager = manager
        self._client: KazooClient | None = None

    def __enter__(self) -> AdminReader:
        options = kazoo_client_options(self.settings)
        options["logger"] = _KAZOO_LOGGER
        client = KazooClient(**options)
        start_client(client, self.settings, self.settings.connect, "zookeeper.connect", self.timeout_s)
        self._client = client
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._client is not None:
            self._client.stop()
            self._client.close()
            self._client = None

    # ------------------------------------------------------------------------------------------- reads

    def ledger_manager(self) -> LedgerManagerType:
        """The ledger manager: the one given, else the LAYOUT's (hierarchical without a LAYOUT).

        Example:
            >>> # with AdminReader(settings) as reader: reader.ledger_manager()  → LedgerManagerType.FLAT
        """
        if self._manager is None:
            path = layout_path(self.root)
            try:
                data, _ = self._get(path)
            except NoNodeError:
                self._manager = LedgerManagerType.HIERARCHICAL
            else:
                try:
                    self._manager = parse_layout(data).manager
                except FormatError as err:
                    raise FormatError(f"{path}: {err}") from None
        return self._manager

    def read_ledger(self, ledger_id: int) -> LedgerZnode:
        """The metadata znode of ``ledger_id``; :class:`NotFoundError` when the cluster has no such ledger.

        Example:
            >>> # with AdminReader(settings) as reader: reader.read_ledger(7).data[:27]
            >>> # b'BookieMetadataFormatVersion'
        """
        manager = self.ledger_manager()
        path = ledger_path(ledger_id, manager, self.root)
        try:
            data, stat = self._get(path)
        except NoNodeError:
            raise NotFoundError(
                f"no ledger {ledger_id} in ZooKeeper at {self.settings.connect} "
                f"({path} does not exist; {manager.value} ledger manager)"
            ) from None
        return LedgerZnode(ledger_id, path, manager, data or b"", stat.ctime, stat.mtime, stat.version)

    def registered_bookies(self) -> list[RegisteredBookie]:
        """Every bookie registered now, writable ones first, each group sorted by id.

        Example:
            >>> # with AdminReader(settings) as reader: [b.bookie_id for b in reader.registered_bookies()]
            >>> # ['bookie-01', 'bookie-02']
        """
        writable_root, readonly_root = available_path(self.root), readonly_path(self.root)
        try:
            writable = sorted(set(self._children(writable_root)) - {READONLY_NODE})
        except NoNodeError:
            raise NotFoundError(
                f"no {writable_root} in ZooKeeper at {self.settings.connect}: "
                f"is {self.root} a BookKeeper ledgers root (zookeeper.ledgers_root)?"
            ) from None
        try:
            readonly = sorted(self._children(readonly_root))
        except NoNodeError:  # created with the first read-only bookie
            readonly = []
        found = [(bookie, False, f"{writable_root}/{bookie}") for bookie in writable]
        found += [(bookie, True, f"{readonly_root}/{bookie}") for bookie in readonly]
        bookies = []
        for bookie_id, read_only, path in found:
            try:
                data, _ = self._get(path)
            except NoNodeError:  # unregistered between the listing and this read
                continue
            bookies.append(RegisteredBookie(bookie_id, read_only, data or b""))
        return bookies

    def managed_ledger(self, topic: str) -> TopicZnodes:
        """A Pulsar topic's managed ledger and its cursors, read from the metadata store's
        ``/managed-ledgers`` (the root of this session, where Pulsar keeps it beside ``/ledgers``).

        Raises :class:`NotFoundError` for a topic without a managed ledger, :class:`FormatError` naming the
        znode for one that does not decode.

        Example:
            >>> # with AdminReader(settings) as reader: reader.managed_ledger("persistent://t/n/x").info
        """
        path = managed_ledger_path(topic)
        try:
            data, _ = self._get(path)
        except NoNodeError:
            where = f"ZooKeeper at {self.settings.connect}"
            raise NotFoundError(f"no managed ledger for {topic} in {where} ({path} does not exist)") from None
        info = _decoded(path, decode_managed_ledger_info, data)
        cursors = {}
        try:
            names = sorted(self._children(path))
        except NoNodeError:  # deleted between the two reads
            names = []
        for name in names:
            try:
                cursor_data, _ = self._get(f"{path}/{name}")
            except NoNodeError:
                continue
            cursors[name] = _decoded(f"{path}/{name}", decode_managed_cursor_info, cursor_data)
        return TopicZnodes(topic, path, info, cursors)

    def ledger_exists(self, ledger_id: int) -> bool:
        """Whether BookKeeper has the ledger's metadata znode now.

        Example:
            >>> # with AdminReader(settings) as reader: reader.ledger_exists(7)  → True
        """
        try:
            self.read_ledger(ledger_id)
        except NotFoundError:
            return False
        return True

    def autorecovery(self) -> AutoRecoveryView:
        """Who the Auditor is, whether AutoRecovery may re-replicate, and the recovery delay in force.

        A vote or a delay that does not decode is a :class:`FormatError` naming its znode.

        Example:
            >>> # with AdminReader(settings) as reader: reader.autorecovery().auditor  → '10.0.0.1:3181'
        """
        paths = UnderreplicationPaths(self.root)
        try:
            names = self._children(paths.auditor_election)
            votes = sorted((n for n in names if n.startswith("V_")), key=vote_sequence)
        except NoNodeError:
            votes = []
        auditor = None
        for vote in votes:  # the lowest vote that still exists
            path = f"{paths.auditor_election}/{vote}"
            try:
                data, _ = self._get(path)
            except NoNodeError:
                continue
            auditor = _decoded(path, parse_auditor_vote, data) or ""
            break
        enabled = self._wait(self._session().exists_async(paths.disable), paths.disable) is None
        try:
            data, _ = self._get(paths.lost_bookie_recovery_delay)
        except NoNodeError:
            delay = None
        else:
            delay = _decoded(paths.lost_bookie_recovery_delay, parse_lost_bookie_recovery_delay, data)
        return AutoRecoveryView(auditor, enabled, delay)

    # -------------------------------------------------------------------------------------- plumbing

    def _get(self, path: str) -> tuple[bytes, Any]:
        return self._wait(self._session().get_async(path), path)

    def _children(self, path: str) -> list[str]:
        return self._wait(self._session().get_children_async(path), path)

    def _session(self) -> KazooClient:
        if self._client is None:
            raise ServiceError("AdminReader used outside its `with` block")
        return self._client

    def _wait(self, pending: Any, path: str) -> Any:
        client = self._session()
        try:
            return pending.get(timeout=self.timeout_s)
        except NoNodeError:
            raise
        except client.handler.timeout_exception:
            raise ServiceError(
                f"ZooKeeper at {self.settings.connect}: no answer for {path} within {self.timeout_s:g} s"
            ) from None
        except KazooException as err:
            raise unreadable_znode(self.settings, path, err) from None


__all__ = ["DEFAULT_TIMEOUT_S", "AdminReader", "LedgerZnode", "RegisteredBookie"]


_Decoded = TypeVar("_Decoded")


def _decoded(path: str, parse: Callable[[bytes], _Decoded], data: bytes | None) -> _Decoded:
    """``parse(data)``, with the znode named in a decode error."""
    try:
        return parse(data or b"")
    except FormatError as err:
        raise FormatError(f"{path}: {err}") from None
