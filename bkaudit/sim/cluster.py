"""A simulated BookKeeper cluster in a real ZooKeeper: znodes, bookies, ledger lifecycle and faults.

:class:`SimulatedCluster` writes exactly the znodes a BookKeeper cluster (and Pulsar) writes, through the
domain library's formats (BookKeeper's znode layout and metadata formats):

- ``init()``: ``<root>``, ``LAYOUT`` (hierarchical by default; flat, long-hierarchical and legacy
  selectable), ``INSTANCEID``, ``available/``, ``available/readonly``, ``cookies/``, the
  ``underreplication/`` tree (``LAYOUT``, ``ledgers``, ``locks``, ``lostBookieRecoveryDelay``).
- bookies: each with its own ZooKeeper session, a cookie, an ephemeral ``available/<id>`` znode holding
  ``BookieServiceInfoFormat`` data (BP-41 ids like ``bookie-01`` or legacy ``127.0.0.1:<port>`` ids), a
  protocol server on 127.0.0.1 (:mod:`connectors.bookie.server`) whose store holds exactly the bookie's
  stripe of every ledger segment, and an entry in Pulsar's ``/bookies`` rack-map JSON.
- ledgers, like a real writer: ids from ``idgen`` (EPHEMERAL_SEQUENTIAL ``ID-``, deleted right away), the
  metadata znode created OPEN (v3 by default; v2 and v1 selectable) with a placement-aware ensemble, Pulsar's
  custom metadata and a password; entries striped RoundRobin over the write sets; an ensemble change (new
  segment, failed bookie replaced placement-aware) when a write finds a bookie of the current ensemble down
  or read-only; close with ``lastEntryId``/``length``; recovery (IN_RECOVERY, then CLOSED); deletion.
- faults: graceful and hard kills, flaps, read-only, lost entries/ledgers, ENOLEDGER, silent and slow
  bookies, rack moves, badly placed ledgers, corrupt metadata, ``urL`` marks with an old ctime, a changed
  ``lostBookieRecoveryDelay``.
- AutoRecovery: an elected Auditor (a vote under ``auditorelection``, from the cluster's session) from
  ``init()`` on; it can be switched off (``disable``), its Auditor dropped and restored, replication
  locks held and released (``locks/urL<id>``, ephemeral, as a ReplicationWorker holds them), and the
  Auditor's periodic checks marked completed at a given time (``checkallledgersctime``,
  ``placementpolicycheckctime``, ``replicascheckctime``; none exists until set, as before a first run).

It remembers what it did, so :meth:`SimulatedCluster.ground_truth` can say what a correct auditor must flag
(:mod:`bkaudit.sim.truth`). The password never appears in any output, log or truth.

Bookies are referred to by id, by add order (``0``, ``"#0"``), ledgers by id, by alias (``name=`` when
created) or by creation order (``"#0"``).

Example:
    >>> # with SimulatedCluster("127.0.0.1:2181/test", racks=3).init() as sim:
    >>> #     for _ in range(4):
    >>> #         sim.add_bookie()
    >>> #     ledger = sim.create_ledger(entries=10)
    >>> #     sim.kill_bookie(0, hard=True)
    >>> #     sim.ground_truth()["alerts"]["BOOKIE_LOST"]
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import secrets
import ssl
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.recipe.watchers import ChildrenWatch

from bkaudit.sim.bookie import (
    BookieMode,
    LoopThread,
    SimBookie,
    abandon_session,
    close_session,
    expire_session,
    open_session,
    service_info_for,
)
from bkaudit.sim.ensemble import choose_ensemble, choose_replacement, choose_single_rack_ensemble
from bkaudit.sim.errors import SimulatorError, UnknownEntityError
from bkaudit.sim.truth import (
    Absence,
    BookieSnapshot,
    ClusterSnapshot,
    Registration,
    TruthParameters,
    ground_truth,
    what_if_truth,
)
from connectors.agent.index import IndexedEntryStore
from connectors.bookie.server import BookieServer, InMemoryEntryStore
from core.domain.cookie import Cookie, format_cookie
from core.domain.isolation import (
    ISOLATION_METADATA_KEY,
    IsolationGroups,
    encode_isolation_config,
    isolation_config_of,
)
from core.domain.layout import (
    ID_GENERATOR_PREFIX,
    IDGEN_NODE,
    LedgerLayout,
    LedgerManagerType,
    available_path,
    cookies_path,
    format_layout,
    instance_id_path,
    layout_path,
    ledger_path,
    readonly_path,
    validate_root,
)
from core.domain.managed_ledger import (
    MANAGED_LEDGERS_ROOT,
    ManagedCursorInfo,
    ManagedLedgerInfo,
    TopicLedger,
    encode_managed_cursor_info,
    encode_managed_ledger_info,
    managed_ledger_path,
)
from core.domain.metadata import (
    DigestType,
    LedgerMetadata,
    LedgerPassword,
    LedgerState,
    Segment,
    decode_ledger_metadata,
    encode_ledger_metadata,
)
from core.domain.rackmap import PULSAR_RACK_MAP_ZNODE
from core.domain.registration import (
    cookie_path,
    encode_bookie_service_info,
    readonly_bookie_path,
    validate_bookie_id,
    writable_bookie_path,
)
from core.domain.rules.autorecovery import AutoRecoveryZnodes, ReplicationLock
from core.domain.rules.isolation import allowed_groups, primary_writable
from core.domain.striping import write_set
from core.domain.underreplication import (
    CtimeZnode,
    UnderreplicatedLedger,
    UnderreplicationPaths,
    format_auditor_vote,
    format_ctime,
    format_lock_data,
    format_lost_bookie_recovery_delay,
    format_rereplication_layout,
    format_underreplicated_ledger,
    parse_underreplicated_ledger,
)
from core.errors import FormatError

__all__ = ["CORRUPTIONS", "SIM_AUDITOR_ID", "SimLedger", "SimulatedCluster", "pulsar_custom_metadata"]

#: The bookie id in the simulated Auditor's vote.
SIM_AUDITOR_ID = "autorecovery-0"

logger = logging.getLogger(__name__)

#: Ledger storages a simulated bookie can have (BookKeeper's class names, short).
SORTED_STORAGE = "SortedLedgerStorage"
DB_STORAGE = "DbLedgerStorage"
STORAGES = (SORTED_STORAGE, DB_STORAGE)

DEFAULT_RACK_MAP_PATH = PULSAR_RACK_MAP_ZNODE
DEFAULT_RACK_MAP_GROUP = "default"
_JAVA_INT_MAX = 2**31 - 1

CORRUPTIONS = ("truncated", "garbage", "bad-version", "not-protobuf")
"""Ways :meth:`SimulatedCluster.corrupt_ledger_znode` can break a metadata znode."""

_CORRUPT_BYTES = {
    # A v3 header whose varint length prefix promises more bytes than follow.
    "truncated": b"BookieMetadataFormatVersion\t3\n\x7f\x08\x02\x10\x03",
    "garbage": b"\x00\xff\xfe bkaudit-sim: not ledger metadata \x00",
    "bad-version": b"BookieMetadataFormatVersion\t9\nquorumSize: 2\n",
    # Right framing, but the body is not a LedgerMetadataFormat (field 1 with a wire type it cannot have).
    "not-protobuf": b"BookieMetadataFormatVersion\t3\n\x04\x0d\x01\x02\x03",
}


def pulsar_custom_metadata(managed_ledger: str) -> tuple[tuple[str, bytes], ...]:
    """The custom metadata Pulsar's managed ledger puts on every ledger it creates, in Pulsar's order.

    Example:
        >>> [key for key, _ in pulsar_custom_metadata("public/default/persistent/t1")]
        ['application', 'component', 'pulsar/managed-ledger']
    """
    return (
        ("application", b"pulsar"),
        ("component", b"managed-ledger"),
        ("pulsar/managed-ledger", managed_ledger.encode("utf-8")),
    )


@dataclass
class SimLedger:
    """A ledger as its simulated writer knows it (``metadata`` is what the znode held before a corruption).

    Example:
        >>> md = LedgerMetadata(ensemble_size=1, write_quorum=1, ack_quorum=1,
        ...                     segments=(Segment(0, ("b1",)),))
        >>> SimLedger(5, "/ledgers/00/0000/L0005", md).next_entry_id
        0
    """

    ledger_id: int
    path: str
    metadata: LedgerMetadata
    znode_version: int = 0
    last_add_id: int = -1
    length: int = 0
    corrupt: str | None = None
    alias: str | None = None
    created_ms: int = 0  # the simulator's clock at creation (the znode's ctime, on one host)

    @property
    def next_entry_id(self) -> int:
        """Id the next added entry gets."""
        return self.last_add_id + 1

    def to_json(self) -> dict[str, Any]:
        """Summary without the password.

        Example:
            >>> md = LedgerMetadata(ensemble_size=1, write_quorum=1, ack_quorum=1,
            ...                     segments=(Segment(0, ("b1",)),))
            >>> SimLedger(5, "/p", md).to_json()["state"]
            'OPEN'
        """
        md = self.metadata
        return {
            "ledger_id": self.ledger_id,
            "alias": self.alias,
            "path": self.path,
            "state": md.state.value,
            "format_version": md.format_version,
            "ensemble_size": md.ensemble_size,
            "write_quorum": md.write_quorum,
            "ack_quorum": md.ack_quorum,
            "last_add_id": self.last_add_id,
            "segments": [
                {"first_entry_id": segment.first_entry_id, "ensemble": list(segment.ensemble)}
                for segment in md.segments
            ],
            "pulsar_topic": md.pulsar_topic,
            "corrupt": self.corrupt,
        }


def _now_ms() -> int:
    return int(time.time() * 1000)


class SimulatedCluster:
    """A BookKeeper cluster simulated in a real ZooKeeper (see the module docstring).

    ``zk_hosts`` is a kazoo hosts string (an optional chroot after the last host); ``root`` the ledgers root
    inside it; ``racks`` how many racks new bookies are spread over (round robin) unless given one;
    ``bookie_session_timeout_s`` the session timeout of each bookie (how long a hard-killed bookie stays
    registered; ZooKeeper clamps it to 2..20 ticks); ``bookie_tls`` a server ``ssl.SSLContext`` every bookie
    then upgrades connections with on ``START_TLS`` (one that requires client certificates makes bookies
    that do; :func:`connectors.bookie.tls.server_tls_context`), ``bookie_authorized_roles`` the client
    certificate roles they authorize (BookieAuthZFactory). All public methods are thread-safe.

    Example:
        >>> sim = SimulatedCluster("127.0.0.1:2181", root="/ledgers", racks=2, seed=7)
        >>> sim.root, sim.rack_names
        ('/ledgers', ['/rack-0', '/rack-1'])
    """

    def __init__(
        self,
        zk_hosts: str,
        *,
        root: str = "/ledgers",
        manager: LedgerManagerType | str = LedgerManagerType.HIERARCHICAL,
        racks: int = 3,
        session_timeout_s: float = 10.0,
        bookie_session_timeout_s: float | None = None,
        rack_map_path: str = DEFAULT_RACK_MAP_PATH,
        rack_map_group: str = DEFAULT_RACK_MAP_GROUP,
        lost_bookie_recovery_delay_s: int = 0,
        password: bytes | None = None,
        digest_type: DigestType = DigestType.CRC32C,
        store_ctime: bool = False,
        entry_size: int = 1024,
        host: str = "127.0.0.1",
        seed: int | None = None,
        truth_parameters: TruthParameters | None = None,
        index_root: Path | None = None,
        bookie_tls: ssl.SSLContext | None = None,
        zookeeper_tls: Mapping[str, Any] | None = None,
        bookie_authorized_roles: Iterable[str] | None = None,
    ) -> None:
        self.zk_hosts = zk_hosts
        self.bookie_tls = bookie_tls
        #: With ``bookie_tls``: the roles the bookies authorize, as BookieAuthZFactory (every request
        #: answered EUA until a TLS handshake whose client certificate carries one); None: no authorization.
        self.bookie_authorized_roles = (
            frozenset(bookie_authorized_roles) if bookie_authorized_roles is not None else None
        )
        #: KazooClient TLS arguments of every session (``kazoo_tls_options``); empty: plaintext.
        self.zookeeper_tls = dict(zookeeper_tls or {})
        self.root = validate_root(root)
        self.manager = LedgerManagerType.from_name(manager) if isinstance(manager, str) else manager
        if self.manager is LedgerManagerType.MS:
            raise SimulatorError("the ms ledger manager keeps metadata outside ZooKeeper; pick another")
        if racks < 1:
            raise SimulatorError("racks must be at least 1")
        self.rack_names = [f"/rack-{index}" for index in range(racks)]
        self.session_timeout_s = session_timeout_s
        self.bookie_session_timeout_s = bookie_session_timeout_s or session_timeout_s
        #: How long a bookie whose session expired waits before it registers again (0: at once, as
        #: BookKeeper's bookie does once ZooKeeper serves; more: a ZooKeeper that stays slow to serve it).
        self.reregister_delay_s = 0.0
        self.rack_map_path = validate_root(rack_map_path)
        self.rack_map_group = rack_map_group
        self.lost_bookie_recovery_delay_s = lost_bookie_recovery_delay_s
        # Pulsar's managedLedgerPassword; random per cluster so that a leak would be noticed.
        self._password = LedgerPassword(password if password is not None else secrets.token_hex(12).encode())
        self.digest_type = digest_type
        self.store_ctime = store_ctime
        self.entry_size = entry_size
        self.host = host
        self.truth_parameters = truth_parameters or TruthParameters()
        # Where DbLedgerStorage bookies write their RocksDB indexes in BookKeeper's layout (for `bkaudit
        # agent`): <index_root>/bookie-NN/ledgers/current/{ledgers,locations}. None: no index files.
        self.index_root = index_root
        self.instance_id: str | None = None
        self._rng = random.Random(seed)
        self._lock = threading.RLock()
        self._membership_lock = threading.Lock()
        self._admin: KazooClient | None = None
        self._loop: LoopThread | None = None
        self._bookies: dict[str, SimBookie] = {}
        self._bookie_order: list[str] = []
        self._ledgers: dict[int, SimLedger] = {}
        self._managed_znodes: dict[str, bytes] = {}  # Pulsar's /managed-ledgers, by path below it
        self._ledger_order: list[int] = []
        self._aliases: dict[str, int] = {}
        self._absences: list[Absence] = []
        self._audits_ms: list[int] = []  # when the recovery delay was written again (a triggered audit)
        self._marks: dict[int, int | None] = {}
        # AutoRecovery: the Auditor's vote path (None: dropped), since when it is elected (its vote's ctime)
        # or since when there is none, the disable znode's ctime, the held locks, the Auditor's check times,
        # and since when at least one bookie is registered.
        self._auditor_vote: str | None = None
        self._auditor_elected_since_ms: int | None = None
        self._auditor_gone_since_ms: int | None = None
        self._check_times: dict[CtimeZnode, int] = {}
        self._disabled_since_ms: int | None = None
        self._enabled_since_ms: int | None = None  # when disable was last deleted (None: never)
        self._locks: dict[int, ReplicationLock] = {}
        self._bookies_running_since_ms: int | None = None
        self._zk_registered: set[str] = set()
        self._watches: list[ChildrenWatch] = []
        self._closed = False
        self._ledger_counter = 0

    # ============================================================================================ lifecycle

    @property
    def admin(self) -> KazooClient:
        """The cluster's own session (the writer / admin): ledger metadata, cookies, marks, rack map."""
        if self._admin is None:
            self._require_open()
            raise SimulatorError("the simulated cluster is not initialised (call init())")
        return self._admin

    @property
    def underreplication(self) -> UnderreplicationPaths:
        """The under-replication tree's paths under this cluster's root."""
        return UnderreplicationPaths(self.root)

    def init(self, *, reset: bool = False) -> SimulatedCluster:
        """Connect and write a new cluster's znodes; ``reset`` first deletes an existing root and rack map.

        Refuses (``SimulatorError``) to reuse a root that already exists, like ``initnewcluster``.
        """
        with self._lock:
            if self._admin is not None:
                return self
            admin = open_session(
                self.zk_hosts,
                self.session_timeout_s,
                log=logging.getLogger("kazoo.client"),
                tls=self.zookeeper_tls,
            )
            try:
                self._write_new_cluster(admin, reset)
            except BaseException:
                close_session(admin)
                raise
            self._admin = admin
            self.set_auditor(True)
            self._loop = LoopThread("bkaudit-sim-bookies")
            self._watch_registrations()
            logger.info("simulated cluster %s at %s%s", self.instance_id, self.zk_hosts, self.root)
            return self

    def _write_new_cluster(self, admin: KazooClient, reset: bool) -> None:
        if admin.exists(self.root) is not None:
            if not reset:
                raise SimulatorError(
                    f"ZooKeeper already has {self.root} (another cluster or simulator); "
                    "use another root or reset it (sim up --reset)"
                )
            admin.delete(self.root, recursive=True)
        if reset and admin.exists(self.rack_map_path) is not None:
            admin.delete(self.rack_map_path, recursive=True)
        self.instance_id = str(uuid.uuid4())
        layout = format_layout(LedgerLayout.for_manager(self.manager)).encode("utf-8")
        paths = self.underreplication
        transaction = admin.transaction()
        # initNewCluster: root, available, available/readonly, INSTANCEID; the layout manager: LAYOUT.
        admin.ensure_path(self.root)
        transaction.create(available_path(self.root), b"")
        transaction.create(readonly_path(self.root), b"")
        transaction.create(instance_id_path(self.root), self.instance_id.encode("utf-8"))
        transaction.create(layout_path(self.root), layout)
        transaction.create(cookies_path(self.root), b"")
        # ZkLedgerUnderreplicationManager and the Auditor (which seeds lostBookieRecoveryDelay).
        transaction.create(paths.base, b"")
        transaction.create(paths.layout, format_rereplication_layout().encode("utf-8"))
        transaction.create(paths.urledgers, b"")
        transaction.create(paths.locks, b"")
        transaction.create(paths.auditor_election, b"")
        transaction.create(
            paths.lost_bookie_recovery_delay,
            format_lost_bookie_recovery_delay(self.lost_bookie_recovery_delay_s).encode("ascii"),
        )
        results = transaction.commit()
        failures = [result for result in results if isinstance(result, Exception)]
        if failures:
            raise SimulatorError(f"cannot initialise {self.root}: {failures[0]!r}")

    def close(self) -> None:
        """Stop every bookie gracefully (sessions closed, servers stopped) and disconnect; data stays."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for bookie in self._bookies.values():
                for timer in bookie.restart_timers:
                    timer.cancel()
                if bookie.session is not None:
                    with contextlib.suppress(Exception):
                        close_session(bookie.session)
                    bookie.session = None
                if self._loop is not None:
                    with contextlib.suppress(Exception):
                        self._loop.run(bookie.server.stop(keep_port=False))
                bookie.mode = BookieMode.DOWN
                if isinstance(bookie.store, IndexedEntryStore):
                    bookie.store.close()
            if self._admin is not None:
                with contextlib.suppress(Exception):
                    close_session(self._admin)
                self._admin = None
            if self._loop is not None:
                self._loop.stop()
                self._loop = None

    def __enter__(self) -> SimulatedCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ====================================================================================== registrations

    def _watch_registrations(self) -> None:
        """Follow available/ and available/readonly so a hard kill's real expiry time is known."""
        writable: set[str] = set()
        readonly: set[str] = set()

        def on_writable(children: list[str]) -> None:
            writable.clear()
            writable.update(child for child in children if child != "readonly")
            self._on_registrations(writable | readonly)

        def on_readonly(children: list[str]) -> None:
            readonly.clear()
            readonly.update(children)
            self._on_registrations(writable | readonly)

        self._watches = [
            ChildrenWatch(self.admin, available_path(self.root), on_writable),
            ChildrenWatch(self.admin, readonly_path(self.root), on_readonly),
        ]

    def _on_registrations(self, registered: set[str]) -> None:
        now = _now_ms()
        with self._membership_lock:
            self._zk_registered = set(registered)
            if not registered:
                self._bookies_running_since_ms = None
            elif self._bookies_running_since_ms is None:
                self._bookies_running_since_ms = now
            suspects = [b for b in self._bookies.values() if b.hard_killed and b.bookie_id not in registered]
        for bookie in suspects:
            # The two watches update separately (a read-only move touches both parents), so confirm directly.
            mode = bookie.hard_killed_registration or BookieMode.WRITABLE
            try:
                still_there = self.admin.exists(self._registration_path(bookie.bookie_id, mode)) is not None
            except Exception:  # closing, or ZooKeeper unreachable: the next snapshot checks again
                continue
            if not still_there:
                with self._membership_lock:
                    if bookie.hard_killed:
                        self._registration_gone(bookie, now)

    def _registration_gone(self, bookie: SimBookie, now: int) -> None:
        """A hard-killed bookie's session expired: it is missing from now on (membership lock held)."""
        bookie.hard_killed = False
        bookie.hard_killed_registration = None
        self._absences.append(Absence(bookie.bookie_id, now))
        logger.info("bookie %s: registration expired", bookie.bookie_id)

    def _open_absence(self, bookie_id: str, now: int, *, serving: bool = False) -> None:
        with self._membership_lock:
            self._absences.append(Absence(bookie_id, now, serving=serving))

    def _close_absence(self, bookie_id: str, now: int) -> None:
        with self._membership_lock:
            for index in range(len(self._absences) - 1, -1, -1):
                absence = self._absences[index]
                if absence.bookie_id == bookie_id and absence.is_open:
                    self._absences[index] = replace(absence, until_ms=now)

    def _registration_path(self, bookie_id: str, mode: BookieMode) -> str:
        if mode is BookieMode.READONLY:
            return readonly_bookie_path(bookie_id, self.root)
        return writable_bookie_path(bookie_id, self.root)

    def _register(self, bookie: SimBookie, mode: BookieMode) -> None:
        """Create the bookie's ephemeral registration with its own session (after a stale one expired)."""
        assert bookie.session is not None
        data = encode_bookie_service_info(service_info_for(self.host, bookie.server.port))
        path = self._registration_path(bookie.bookie_id, mode)
        deadline = time.monotonic() + self.bookie_session_timeout_s * 2 + 5.0
        while True:
            try:
                bookie.session.create(path, data, ephemeral=True)
                return
            except NodeExistsError:
                # BookKeeper's checkRegNodeAndWaitExpired: a previous incarnation's node must expire first.
                if time.monotonic() > deadline:
                    raise SimulatorError(
                        f"bookie {bookie.bookie_id}: {path} still held by an old session"
                    ) from None
                time.sleep(0.1)

    # ============================================================================================ bookies

    def add_bookie(
        self,
        bookie_id: str | None = None,
        *,
        rack: str | None = None,
        legacy_id: bool = False,
        port: int = 0,
        storage: str = SORTED_STORAGE,
        group: str | None = None,
    ) -> str:
        """Start a bookie: protocol server, own session, cookie, writable registration, rack-map entry.

        ``legacy_id`` names it ``<host>:<port>`` (its server's port); otherwise ``bookie_id`` or
        ``bookie-NN``. ``rack`` defaults to the next of :attr:`rack_names`, round robin. ``group`` is its
        affinity group in ``/bookies`` (default: :attr:`rack_map_group`). ``storage`` is the
        bookie's ledger storage: ``SortedLedgerStorage`` answers entry-list requests,
        ``DbLedgerStorage`` (Pulsar's default) never answers them but answers entry reads. Returns the id.
        """
        if storage not in STORAGES:
            raise SimulatorError(f"storage must be one of {', '.join(STORAGES)}, got {storage!r}")
        with self._lock:
            self._require_open()
            assert self._loop is not None
            ordinal = len(self._bookie_order)
            if rack is None:
                rack = self.rack_names[ordinal % len(self.rack_names)]
            store = self._new_store(storage, ordinal)
            server = BookieServer(
                store,
                host=self.host,
                port=port,
                answers_entry_lists=storage != DB_STORAGE,
                tls=self.bookie_tls,
                authorized_roles=self.bookie_authorized_roles,
            )
            self._loop.run(server.start())
            try:
                if legacy_id:
                    if bookie_id is not None:
                        raise SimulatorError("give either a bookie id or legacy_id, not both")
                    bookie_id = f"{self.host}:{server.port}"
                elif bookie_id is None:
                    bookie_id = self._next_bp41_id(ordinal)
                try:
                    validate_bookie_id(bookie_id)
                except FormatError as err:
                    raise SimulatorError(str(err)) from None
                if bookie_id in self._bookies:
                    raise SimulatorError(f"bookie {bookie_id} already exists")
                bookie = SimBookie(
                    bookie_id, rack, f"sim-{ordinal:02d}.bkaudit.local", legacy_id, server, store, group=group
                )
                self._start_session(bookie)
            except BaseException:
                self._loop.run(server.stop(keep_port=False))
                raise
            with self._membership_lock:  # the registration watch iterates the bookies on its own thread
                self._bookies[bookie_id] = bookie
            self._bookie_order.append(bookie_id)
            self._write_rack_map()
            logger.info("bookie %s up at %s in %s", bookie_id, bookie.address, rack)
            return bookie_id

    def _new_store(self, storage: str, ordinal: int) -> InMemoryEntryStore:
        """A DbLedgerStorage bookie's store also writes a RocksDB index when the cluster has an index root."""
        if storage != DB_STORAGE or self.index_root is None:
            return InMemoryEntryStore()
        return IndexedEntryStore(self.index_root / f"bookie-{ordinal:02d}" / "ledgers")

    def ledger_dir(self, ref: str | int) -> Path:
        """The ledger directory of a DbLedgerStorage bookie's RocksDB index (what `bkaudit agent` reads)."""
        with self._lock:
            store = self._bookie(ref).store
            if not isinstance(store, IndexedEntryStore):
                raise SimulatorError(f"bookie {ref} keeps no RocksDB index (DbLedgerStorage with index_root)")
            return store.ledger_dir

    def _next_bp41_id(self, ordinal: int) -> str:
        number = ordinal + 1
        while f"bookie-{number:02d}" in self._bookies:
            number += 1
        return f"bookie-{number:02d}"

    def _start_session(self, bookie: SimBookie, mode: BookieMode = BookieMode.WRITABLE) -> None:
        bookie.session = open_session(self.zk_hosts, self.bookie_session_timeout_s, tls=self.zookeeper_tls)
        try:
            path = cookie_path(bookie.bookie_id, self.root)
            if bookie.session.exists(path) is None:
                cookie = Cookie.create(
                    bookie.bookie_id,
                    [f"/data/{_dir_name(bookie.bookie_id)}/journal"],
                    [f"/data/{_dir_name(bookie.bookie_id)}/ledgers"],
                    instance_id=self.instance_id,
                )
                bookie.session.create(path, format_cookie(cookie).encode("utf-8"))
            self._register(bookie, mode)
        except BaseException:
            close_session(bookie.session)
            bookie.session = None
            raise
        bookie.mode = mode
        session = bookie.session
        session.add_listener(lambda state: self._on_bookie_session_state(bookie, session, state))

    def _on_bookie_session_state(self, bookie: SimBookie, session: KazooClient, state: str) -> None:
        """kazoo's listener, on its event thread (so nothing here blocks): a lost session is handled apart."""
        if state == KazooState.LOST:
            threading.Thread(
                target=self._register_again,
                args=(bookie, session, _now_ms()),
                name=f"{bookie.bookie_id}-register-again",
                daemon=True,
            ).start()

    def _register_again(self, bookie: SimBookie, session: KazooClient, lost_ms: int) -> None:
        """After its session expired, a running bookie registers again with the new one, as BookKeeper's
        bookies do; the ground truth records it missing from ``lost_ms`` until then. (kazoo also says LOST
        when a session is closed or abandoned on purpose: a bookie killed or a cluster closed is left be.)"""

        def still_running() -> bool:
            return not self._closed and bookie.session is session and bookie.mode is not BookieMode.DOWN

        with self._lock:
            if not still_running():
                return
            self._open_absence(bookie.bookie_id, lost_ms, serving=True)  # its protocol server still answers
            logger.info("bookie %s: ZooKeeper session expired; registering again", bookie.bookie_id)
        time.sleep(self.reregister_delay_s)
        while True:
            with self._lock:
                if not still_running():
                    return
                if session.connected:  # kazoo opens the new session by itself
                    try:
                        self._register(bookie, bookie.mode)
                    except (KazooException, SimulatorError) as err:  # disconnected again: retry
                        logger.info("bookie %s: registering again failed (%s)", bookie.bookie_id, err)
                    else:
                        self._close_absence(bookie.bookie_id, _now_ms())
                        logger.info("bookie %s: registered again after its session expired", bookie.bookie_id)
                        return
            time.sleep(0.1)

    def kill_bookie(self, bookie: str | int, *, hard: bool = False) -> None:
        """Stop a bookie. Graceful: session closed, its znode is gone at once. Hard: the process "dies",
        its znode stays until the session times out (see :mod:`bkaudit.sim.bookie`)."""
        with self._lock:
            target = self._bookie(bookie)
            if target.mode is BookieMode.DOWN:
                raise SimulatorError(f"bookie {target.bookie_id} is already down")
            assert self._loop is not None and target.session is not None
            self._loop.run(target.server.stop())
            if hard:
                with self._membership_lock:
                    target.hard_killed = True
                    target.hard_killed_registration = target.mode
                abandon_session(target.session)
            else:
                close_session(target.session)
                self._open_absence(target.bookie_id, _now_ms())
            target.session = None
            target.mode = BookieMode.DOWN
            logger.info("bookie %s killed (%s)", target.bookie_id, "hard" if hard else "graceful")

    def restart_bookie(self, bookie: str | int) -> None:
        """Start a down bookie again: same port, same store (its disk) and faults, writable registration.

        After a hard kill this waits, as BookKeeper does, for the old registration to expire first (without
        holding the cluster's lock, so other operations and ground truth go on meanwhile).
        """
        with self._lock:
            waiting = self._bookie(bookie)
        self._wait_for_expiry(waiting)
        with self._lock:
            target = self._bookie(bookie)
            if target.mode is not BookieMode.DOWN:
                raise SimulatorError(f"bookie {target.bookie_id} is already running")
            assert self._loop is not None
            self._loop.run(target.server.start())
            try:
                self._start_session(target)
            except BaseException:
                self._loop.run(target.server.stop())
                raise
            self._settle_hard_kill(target)
            self._close_absence(target.bookie_id, _now_ms())
            logger.info("bookie %s restarted", target.bookie_id)

    def _wait_for_expiry(self, bookie: SimBookie) -> None:
        deadline = time.monotonic() + self.bookie_session_timeout_s * 2 + 5.0
        while bookie.hard_killed and time.monotonic() < deadline:
            with self._lock:
                if self._closed:
                    return
                self._check_pending_expiries()
            time.sleep(0.05)

    def _settle_hard_kill(self, bookie: SimBookie) -> None:
        """After a restart the old session is certainly gone: record its absence if the watch has not."""
        with self._membership_lock:
            if bookie.hard_killed:
                self._registration_gone(bookie, _now_ms())

    def flap_bookie(self, bookie: str | int, down_s: float, *, hard: bool = False) -> None:
        """Kill a bookie now and restart it after ``down_s`` seconds (in the background)."""
        if down_s < 0:
            raise SimulatorError("down_s must not be negative")
        with self._lock:
            target = self._bookie(bookie)
            self.kill_bookie(target.bookie_id, hard=hard)

            def come_back() -> None:
                try:
                    self.restart_bookie(target.bookie_id)
                except Exception as err:  # a background timer has nobody to raise to
                    logger.warning("flap of %s: restart failed: %s", target.bookie_id, err)

            timer = threading.Timer(down_s, come_back)
            timer.daemon = True
            target.restart_timers = [t for t in target.restart_timers if t.is_alive()] + [timer]
            timer.start()

    def set_readonly(self, bookie: str | int, readonly: bool = True) -> None:
        """Move a running bookie's registration to ``available/readonly/`` (or back to ``available/``).

        Like BookKeeper, the new node is created before the old one is deleted, so it is never missing.
        """
        with self._lock:
            target = self._bookie(bookie)
            if target.mode is BookieMode.DOWN:
                raise SimulatorError(f"bookie {target.bookie_id} is down")
            new_mode = BookieMode.READONLY if readonly else BookieMode.WRITABLE
            if target.mode is new_mode:
                return
            self._register(target, new_mode)
            assert target.session is not None
            with contextlib.suppress(NoNodeError):
                target.session.delete(self._registration_path(target.bookie_id, target.mode))
            target.mode = new_mode

    def expire_bookie_session(self, bookie: str | int) -> None:
        """Make ZooKeeper expire a running bookie's session, as a partition or a stalled host longer than
        its session timeout would. Its registration vanishes; the bookie registers again with a new
        session, as BookKeeper's bookies do, and the ground truth has it missing in between.

        Example:
            >>> # sim.expire_bookie_session("bookie-02")  # available/bookie-02 is gone, then back
        """
        with self._lock:
            target = self._bookie(bookie)
            if target.mode is BookieMode.DOWN or target.session is None:
                raise SimulatorError(f"bookie {target.bookie_id} is down: it has no session to expire")
            session = target.session
        expire_session(session, self.zk_hosts, timeout_s=self.bookie_session_timeout_s * 2 + 20.0)

    def make_silent(self, bookie: str | int, silent: bool = True, *, requests: int | None = None) -> None:
        """Read requests but never answer (a DbLedgerStorage bookie asked for its entry list); with
        ``requests``, only the next that many, then answer again (a transient silence ended by count)."""
        with self._lock:
            server = self._bookie(bookie).server
            if requests is None:
                server.silent = silent
            elif requests < 0:
                raise SimulatorError("requests must not be negative")
            else:
                server.drop_next = requests if silent else 0

    def requests_dropped(self, bookie: str | int) -> int:
        """How many requests ``bookie`` dropped by count (``make_silent(..., requests=N)``) so far."""
        with self._lock:
            return self._bookie(bookie).server.stats.requests_dropped

    def make_slow(self, bookie: str | int, delay_s: float) -> None:
        """Answer every request after ``delay_s`` seconds (0 makes it fast again)."""
        if delay_s < 0:
            raise SimulatorError("delay_s must not be negative")
        with self._lock:
            self._bookie(bookie).server.delay_s = delay_s

    def answer_enoledger(self, bookie: str | int, ledger: str | int, enabled: bool = True) -> None:
        """Answer ENOLEDGER for ``ledger`` although the bookie holds it (or stop doing so)."""
        with self._lock:
            target = self._bookie(bookie)
            ledger_id = self._ledger(ledger).ledger_id
            current = set(target.server.enoledger_for)
            current = current | {ledger_id} if enabled else current - {ledger_id}
            target.server.enoledger_for = current

    def fail_with_status(self, bookie: str | int, status: int | None) -> None:
        """Answer every request with ``status`` (e.g. 501, EIO); ``None`` stops."""
        with self._lock:
            self._bookie(bookie).server.fail_status = status

    def heal_bookie(self, bookie: str | int) -> None:
        """Clear every protocol fault of a bookie (silent, slow, ENOLEDGER, error status)."""
        with self._lock:
            self._bookie(bookie).server.clear_faults()

    def lose_entries(self, bookie: str | int, ledger: str | int, entries: Iterable[int]) -> None:
        """Make a bookie forget some entries of a ledger (its store no longer holds them)."""
        with self._lock:
            self._bookie(bookie).store.drop_entries(self._ledger(ledger).ledger_id, list(entries))

    def lose_ledger(self, bookie: str | int, ledger: str | int) -> None:
        """Make a bookie forget a whole ledger (it then answers ENOLEDGER)."""
        with self._lock:
            self._bookie(bookie).store.drop_ledger(self._ledger(ledger).ledger_id)

    def reformat_bookie(self, bookie: str | int, *, instance_id: str | None = None) -> int:
        """Format a bookie again under the same id, as ``bookkeeper shell bookieformat -deleteCookie`` and a
        start do, quicker than its registration is seen to go: every ledger it held is gone (it answers
        ENOLEDGER) and its cookie is deleted and created again (a new czxid), with ``instance_id``
        (default: the cluster's, which BookKeeper writes). Returns the new cookie's czxid."""
        with self._lock:
            target = self._bookie(bookie)
            for ledger_id in target.store.ledger_ids():
                target.store.drop_ledger(ledger_id)
            name = _dir_name(target.bookie_id)
            cookie = Cookie.create(
                target.bookie_id,
                [f"/data/{name}/journal"],
                [f"/data/{name}/ledgers"],
                instance_id=instance_id or self.instance_id,
            )
            path = cookie_path(target.bookie_id, self.root)
            self.admin.delete(path)
            self.admin.create(path, format_cookie(cookie).encode("utf-8"))
            return int(self.admin.exists(path).czxid)

    def move_bookie_rack(self, bookie: str | int, rack: str) -> None:
        """Put a bookie in another rack and rewrite Pulsar's ``/bookies`` rack map."""
        with self._lock:
            target = self._bookie(bookie)
            target.rack = rack
            self._write_rack_map()

    def set_bookie_group(self, bookie: str | int, group: str | None) -> None:
        """Put a bookie in another affinity group (None: the default one) and rewrite ``/bookies``."""
        with self._lock:
            self._bookie(bookie).group = group
            self._write_rack_map()

    def group_of(self, bookie: SimBookie) -> str:
        """The bookie's affinity group in ``/bookies``."""
        return bookie.group if bookie.group is not None else self.rack_map_group

    def rack_map_json(self) -> dict[str, Any]:
        """Pulsar's ``BookiesRackConfiguration``: ``{group: {bookie id: {"rack", "hostname"}}}``.

        Keys are bookie ids: ``host:port`` for legacy bookies, the BP-41 id otherwise. Every bookie is in
        :attr:`rack_map_group` unless given another affinity group.
        """
        with self._lock:
            groups: dict[str, dict[str, Any]] = {}
            for bookie_id in self._bookie_order:
                b = self._bookies[bookie_id]
                groups.setdefault(self.group_of(b), {})[b.bookie_id] = {
                    "rack": b.rack,
                    "hostname": b.hostname,
                }
            return groups or {self.rack_map_group: {}}

    def _write_rack_map(self) -> None:
        # Jackson's compact output, fields in BookieInfo's declaration order (rack, hostname).
        data = json.dumps(self.rack_map_json(), separators=(",", ":")).encode("utf-8")
        try:
            self.admin.set(self.rack_map_path, data)
        except NoNodeError:
            self.admin.create(self.rack_map_path, data, makepath=True)

    # ============================================================================================ ledgers

    def _next_ledger_id(self) -> int:
        """An id from BookKeeper's generator: EPHEMERAL_SEQUENTIAL ``ID-`` node, deleted right after."""
        if self.manager is LedgerManagerType.FLAT:
            prefix = f"{self.root}/{ID_GENERATOR_PREFIX}"
        else:
            # Hierarchical and long-hierarchical use the short generator until it overflows.
            prefix = f"{self.root}/{IDGEN_NODE}/{ID_GENERATOR_PREFIX}"
        created = self.admin.create(prefix, b"", ephemeral=True, sequence=True, makepath=True)
        self.admin.delete(created)
        ledger_id = int(created.rsplit(ID_GENERATOR_PREFIX, 1)[1])
        if ledger_id >= _JAVA_INT_MAX:
            raise SimulatorError("ledger id generator overflow (the long generator is not simulated)")
        return ledger_id

    def _writable_candidates(
        self, exclude: Iterable[str] = (), *, isolation: IsolationGroups | None = None, ensemble_size: int = 0
    ) -> dict[str, str | None]:
        """Writable bookies → rack, outside ``exclude``; with ``isolation``, only those Pulsar's isolation
        policy lets an ensemble of ``ensemble_size`` use (the core rule's allowed groups)."""
        excluded = set(exclude)
        writable = {b: bookie for b, bookie in self._bookies.items() if bookie.mode is BookieMode.WRITABLE}
        if isolation is not None:
            group_of = {b: self.group_of(bookie) for b, bookie in self._bookies.items()}
            allowed = set(
                allowed_groups(isolation, ensemble_size, primary_writable(isolation, group_of, writable))
            )
            writable = {b: bookie for b, bookie in writable.items() if group_of[b] in allowed}
        return {bookie_id: bookie.rack for bookie_id, bookie in writable.items() if bookie_id not in excluded}

    def create_ledger(
        self,
        *,
        ensemble_size: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        managed_ledger: str | None = None,
        entries: int = 0,
        close: bool = True,
        format_version: int = 3,
        ensemble: Sequence[str | int] | None = None,
        name: str | None = None,
        entry_size: int | None = None,
        isolation: IsolationGroups | None = None,
    ) -> int:
        """Create a ledger like Pulsar's managed ledger does, write ``entries``, close it unless told not to.

        The ensemble is chosen rack-aware among writable bookies unless given. Format 3 (default) and 2
        carry the password, digest and Pulsar's custom metadata; format 1 carries none of them and needs
        ``ack_quorum == write_quorum``. ``name`` gives the ledger an alias for later references.
        ``isolation`` writes it as a namespace with a bookie-affinity isolation policy does (custom metadata
        ``EnsemblePlacementPolicyConfig``) and chooses its ensemble, and later replacements, among the
        groups the policy allows; a given ``ensemble`` is used as it is (outside the groups, a violation).
        Returns the ledger id.
        """
        with self._lock:
            self._require_open()
            if name is not None and name in self._aliases:
                raise SimulatorError(f"a ledger is already named {name!r}")
            if name is not None and (name.startswith("#") or name.isdigit()):
                raise SimulatorError(f"ledger alias {name!r} must not start with '#' or be a number")
            if format_version not in (1, 2, 3):
                raise SimulatorError("format_version must be 1, 2 or 3")
            if format_version == 1 and ack_quorum != write_quorum:
                raise SimulatorError("format 1 ledgers have no ack quorum: make it equal the write quorum")
            if not 1 <= ack_quorum <= write_quorum <= ensemble_size:
                raise SimulatorError(
                    f"quorums must satisfy 1 <= ack ({ack_quorum}) <= write ({write_quorum}) "
                    f"<= ensemble ({ensemble_size})"
                )
            if ensemble is not None:
                members = tuple(self._bookie(member).bookie_id for member in ensemble)
                if len(members) != ensemble_size or len(set(members)) != ensemble_size:
                    raise SimulatorError(f"the ensemble must name {ensemble_size} distinct bookies")
            else:
                candidates = self._writable_candidates(isolation=isolation, ensemble_size=ensemble_size)
                members = choose_ensemble(candidates, ensemble_size, write_quorum, ack_quorum, self._rng)
            ordinal = self._ledger_counter
            self._ledger_counter += 1
            if managed_ledger is None:
                managed_ledger = f"public/default/persistent/sim-topic-{ordinal % 16}"
            custom = () if format_version == 1 else pulsar_custom_metadata(managed_ledger)
            if isolation is not None:
                if format_version == 1:
                    raise SimulatorError("format 1 ledgers carry no custom metadata, so no isolation config")
                custom += ((ISOLATION_METADATA_KEY, encode_isolation_config(isolation)),)
            metadata = LedgerMetadata(
                format_version=format_version,
                ensemble_size=ensemble_size,
                write_quorum=write_quorum,
                ack_quorum=ack_quorum,
                state=LedgerState.OPEN,
                digest_type=None if format_version == 1 else self.digest_type,
                password=None if format_version == 1 else self._password,
                segments=(Segment(0, members),),
                ctime=_now_ms() if self.store_ctime and format_version > 1 else None,
                ctoken=0 if format_version == 3 else None,
                custom_metadata=custom,
            )
            ledger_id = self._next_ledger_id()
            path = ledger_path(ledger_id, self.manager, self.root)
            # Intermediate znodes are created empty and persistent, as createFullPathOptimistic does.
            self.admin.create(path, encode_ledger_metadata(metadata), makepath=True)
            ledger = SimLedger(ledger_id, path, metadata, alias=name, created_ms=_now_ms())
            self._ledgers[ledger_id] = ledger
            self._ledger_order.append(ledger_id)
            if name is not None:
                self._aliases[name] = ledger_id
            if entries:
                self._add_entries(ledger, entries, entry_size)
            if close:
                self._close(ledger)
            return ledger_id

    def place_ledger_badly(
        self,
        *,
        rack: str | None = None,
        ensemble_size: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        entries: int = 10,
        name: str | None = None,
        managed_ledger: str | None = None,
    ) -> int:
        """Create and close a ledger whose every write set sits in one rack (default: the fullest one).

        The BP-54 disaster-recovery story: losing that one rack loses the ledger.
        """
        with self._lock:
            members = choose_single_rack_ensemble(self._writable_candidates(), ensemble_size, self._rng, rack)
            return self.create_ledger(
                ensemble_size=ensemble_size,
                write_quorum=write_quorum,
                ack_quorum=ack_quorum,
                entries=entries,
                ensemble=members,
                name=name,
                managed_ledger=managed_ledger,
            )

    def add_entries(self, ledger: str | int, count: int, *, entry_size: int | None = None) -> int:
        """Append ``count`` entries to an open ledger; returns the last entry id.

        A bookie of the current ensemble that is down or read-only is replaced first (an ensemble change),
        as BookKeeper's writer does when a write to it fails.
        """
        with self._lock:
            target = self._ledger(ledger)
            self._require_writable_ledger(target)
            self._add_entries(target, count, entry_size)
            return target.last_add_id

    def _add_entries(self, ledger: SimLedger, count: int, entry_size: int | None) -> None:
        if count < 0:
            raise SimulatorError("count must not be negative")
        if count == 0:
            return
        md = ledger.metadata
        failed = [
            bookie_id
            for bookie_id in md.segments[-1].ensemble
            if bookie_id not in self._bookies or self._bookies[bookie_id].mode is not BookieMode.WRITABLE
        ]
        if failed:
            self._ensemble_change(ledger, failed, {})
            md = ledger.metadata
        ensemble = md.segments[-1].ensemble
        first = ledger.next_entry_id
        per_bookie: dict[str, list[int]] = {}
        for entry_id in range(first, first + count):
            for index in write_set(entry_id, md.ensemble_size, md.write_quorum):
                per_bookie.setdefault(ensemble[index], []).append(entry_id)
        for bookie_id, entry_ids in per_bookie.items():
            self._bookies[bookie_id].store.add_entries(ledger.ledger_id, entry_ids)
        ledger.last_add_id = first + count - 1
        ledger.length += count * (entry_size if entry_size is not None else self.entry_size)

    def ensemble_change(
        self, ledger: str | int, bookie: str | int, replacement: str | int | None = None
    ) -> str:
        """Replace ``bookie`` in an open ledger's ensemble from the next entry on; returns the replacement.

        The replacement is chosen placement-aware among writable bookies unless given.
        """
        with self._lock:
            target = self._ledger(ledger)
            self._require_writable_ledger(target)
            failed = self._bookie(bookie).bookie_id
            if failed not in target.metadata.segments[-1].ensemble:
                raise SimulatorError(f"bookie {failed} is not in ledger {target.ledger_id}'s last ensemble")
            chosen = {failed: self._bookie(replacement).bookie_id} if replacement is not None else {}
            return self._ensemble_change(target, [failed], chosen)[failed]

    def _ensemble_change(
        self, ledger: SimLedger, failed: Sequence[str], chosen: Mapping[str, str]
    ) -> dict[str, str]:
        md = ledger.metadata
        ensemble = list(md.segments[-1].ensemble)
        racks = {bookie_id: bookie.rack for bookie_id, bookie in self._bookies.items()}
        replaced: dict[str, str] = {}
        for failed_id in failed:
            index = ensemble.index(failed_id)
            new = chosen.get(failed_id)
            if new is None:
                isolation = isolation_config_of(md.custom_metadata).groups
                candidates = self._writable_candidates(
                    exclude=ensemble, isolation=isolation, ensemble_size=md.ensemble_size
                )
                new = choose_replacement(
                    ensemble, index, candidates, md.write_quorum, md.ack_quorum, self._rng, racks
                )
            elif new in ensemble:
                raise SimulatorError(f"bookie {new} is already in the ensemble")
            ensemble[index] = new
            replaced[failed_id] = new
        first = ledger.next_entry_id
        segments = list(md.segments)
        if segments[-1].first_entry_id == first:
            # No entry written since the last change: BookKeeper's TreeMap put replaces that ensemble.
            segments[-1] = Segment(first, tuple(ensemble))
        else:
            segments.append(Segment(first, tuple(ensemble)))
        self._write_metadata(ledger, replace_metadata(md, segments=tuple(segments)))
        logger.info("ledger %d: ensemble change at entry %d: %s", ledger.ledger_id, first, replaced)
        return replaced

    def close_ledger(self, ledger: str | int) -> None:
        """Close an open (or in-recovery) ledger with its last entry id and length."""
        with self._lock:
            target = self._ledger(ledger)
            self._require_decodable(target)
            if target.metadata.state is LedgerState.CLOSED:
                raise SimulatorError(f"ledger {target.ledger_id} is already closed")
            self._close(target)

    def _close(self, ledger: SimLedger) -> None:
        closed = replace_metadata(
            ledger.metadata, state=LedgerState.CLOSED, last_entry_id=ledger.last_add_id, length=ledger.length
        )
        self._write_metadata(ledger, closed)

    def recover(self, ledger: str | int, *, complete: bool = True) -> None:
        """Open with recovery: the metadata goes IN_RECOVERY, then (``complete``) CLOSED at the last entry.

        ``complete=False`` leaves it IN_RECOVERY (a reader that died mid-recovery).
        """
        with self._lock:
            target = self._ledger(ledger)
            self._require_decodable(target)
            state = target.metadata.state
            if state is LedgerState.CLOSED:
                raise SimulatorError(f"ledger {target.ledger_id} is closed; there is nothing to recover")
            if state is LedgerState.OPEN:
                self._write_metadata(target, replace_metadata(target.metadata, state=LedgerState.IN_RECOVERY))
            if complete:
                self._close(target)

    def write_managed_ledgers(self, *, cursor: str | None = "sub") -> dict[str, str]:
        """Write Pulsar's ``/managed-ledgers`` znodes for the ledgers as they are now: one per managed ledger
        its ledgers name (custom metadata ``pulsar/managed-ledger``), listing them in id order with their
        entries and bytes, and (``cursor``) one cursor that keeps its position in its znode. Returns each
        topic's znode by topic name. A ledger deleted afterwards stays listed: Pulsar's view of a ledger
        BookKeeper lost.

        Example:
            >>> # sim.write_managed_ledgers()["persistent://public/default/sim-topic-0"]
            >>> # '/managed-ledgers/public/default/persistent/sim-topic-0'
        """
        with self._lock:
            by_name: dict[str, list[SimLedger]] = {}
            for ledger_id in sorted(self._ledgers):
                ledger = self._ledgers[ledger_id]
                stored = dict(ledger.metadata.custom_metadata).get("pulsar/managed-ledger")
                if stored is not None:
                    by_name.setdefault(stored.decode("utf-8"), []).append(ledger)
            written = {}
            for name, ledgers in sorted(by_name.items()):
                info = ManagedLedgerInfo(
                    tuple(
                        TopicLedger(ledger.ledger_id, ledger.next_entry_id, ledger.length)
                        for ledger in ledgers
                    )
                )
                tenant, namespace, domain, local = name.split("/", 3)
                path = managed_ledger_path(f"{domain}://{tenant}/{namespace}/{local}")
                self.put_znode(path, encode_managed_ledger_info(info))
                if cursor is not None:
                    position = ManagedCursorInfo(None, mark_delete=(ledgers[0].ledger_id, -1))
                    self.put_znode(f"{path}/{cursor}", encode_managed_cursor_info(position))
                written[f"{domain}://{tenant}/{namespace}/{local}"] = path
            return written

    def put_znode(self, path: str, data: bytes) -> None:
        """Create or overwrite one znode (its parents created empty, as Pulsar's metadata store does): a way
        to write what the simulator does not model, e.g. a topic's managed ledger by hand.

        Example:
            >>> # sim.put_znode("/managed-ledgers/t/n/persistent/x", encode_managed_ledger_info(info))
        """
        try:
            self.admin.set(path, data)
        except NoNodeError:
            self.admin.create(path, data, makepath=True)
        if path.startswith(MANAGED_LEDGERS_ROOT + "/"):
            with self._lock:
                self._managed_znodes[path[len(MANAGED_LEDGERS_ROOT) + 1 :]] = data

    def delete_ledger(self, ledger: str | int, *, garbage_collect: bool = True) -> None:
        """Delete the metadata znode; ``garbage_collect`` also drops the entries from the bookies' stores."""
        with self._lock:
            target = self._ledger(ledger)
            with contextlib.suppress(NoNodeError):
                self.admin.delete(target.path)
            if garbage_collect:
                for bookie in self._bookies.values():
                    bookie.store.drop_ledger(target.ledger_id)
            del self._ledgers[target.ledger_id]
            if target.alias is not None:
                self._aliases.pop(target.alias, None)

    def corrupt_ledger_znode(self, ledger: str | int, how: str = "truncated") -> None:
        """Overwrite a ledger's metadata znode with bytes that do not decode (see :data:`CORRUPTIONS`)."""
        with self._lock:
            target = self._ledger(ledger)
            data = _CORRUPT_BYTES.get(how)
            if data is None:
                raise SimulatorError(f"unknown corruption {how!r} (one of {', '.join(CORRUPTIONS)})")
            try:
                decode_ledger_metadata(data)
            except FormatError:
                pass
            else:  # pragma: no cover - the table above is fixed
                raise SimulatorError(f"corruption {how!r} unexpectedly decodes")
            stat = self.admin.set(target.path, data)
            target.znode_version = stat.version
            target.corrupt = how

    def mark_underreplicated(
        self, ledger: str | int, replicas: Sequence[str | int] = (), *, ctime_ms: int | None = None
    ) -> str:
        """Write (or extend) the ledger's ``urL`` mark as BookKeeper's ``markLedgerUnderreplicated`` does.

        New replicas are appended; ctime (default: now) is written on creation and refreshed only when a
        new replica was added. Returns the mark's path.
        """
        with self._lock:
            target = self._ledger(ledger)
            names = tuple(self._bookie_name(replica) for replica in replicas)
            ctime = _now_ms() if ctime_ms is None else ctime_ms
            path = self.underreplication.urledger(target.ledger_id)
            try:
                data, stat = self.admin.get(path)
            except NoNodeError:
                mark = UnderreplicatedLedger(tuple(dict.fromkeys(names)), ctime)
                self.admin.create(path, format_underreplicated_ledger(mark).encode("utf-8"), makepath=True)
            else:
                existing = parse_underreplicated_ledger(data)
                added = tuple(name for name in dict.fromkeys(names) if name not in existing.replicas)
                if added:
                    mark = UnderreplicatedLedger(existing.replicas + added, ctime)
                    data = format_underreplicated_ledger(mark).encode("utf-8")
                    self.admin.set(path, data, version=stat.version)
                else:
                    mark = existing
            self._marks[target.ledger_id] = mark.ctime
            return path

    def clear_underreplicated(self, ledger: str | int) -> None:
        """Delete a ledger's ``urL`` mark (what a ReplicationWorker does once the ledger is repaired)."""
        with self._lock:
            target = self._ledger(ledger)
            with contextlib.suppress(NoNodeError):
                self.admin.delete(self.underreplication.urledger(target.ledger_id))
            self._marks.pop(target.ledger_id, None)

    def set_lost_bookie_recovery_delay(self, seconds: int) -> None:
        """Set ``underreplication/lostBookieRecoveryDelay`` (the value the Auditor obeys). Writing the value
        in force again (``bookkeeper shell triggeraudit``) or 0 triggers an audit: the ground truth records
        when, since it ends the delay of every bookie missing then."""
        with self._lock:
            try:
                data = format_lost_bookie_recovery_delay(seconds).encode("ascii")
            except FormatError as err:
                raise SimulatorError(str(err)) from None
            self.admin.set(self.underreplication.lost_bookie_recovery_delay, data)
            if seconds in (0, self.lost_bookie_recovery_delay_s):
                self._audits_ms.append(_now_ms())
            self.lost_bookie_recovery_delay_s = seconds

    # ====================================================================================== AutoRecovery

    def set_autorecovery(self, enabled: bool) -> None:
        """Switch AutoRecovery on or off as ``bookkeeper shell autorecovery -enable/-disable`` does: delete
        or create the empty ``underreplication/disable`` znode."""
        with self._lock:
            path = self.underreplication.disable
            if enabled:
                with contextlib.suppress(NoNodeError):
                    self.admin.delete(path)
                if self._disabled_since_ms is not None:
                    self._enabled_since_ms = _now_ms()
                self._disabled_since_ms = None
                return
            with contextlib.suppress(NodeExistsError):
                self.admin.create(path, b"")
            stat = self.admin.exists(path)
            self._disabled_since_ms = stat.ctime if stat is not None else _now_ms()

    def set_auditor(self, running: bool) -> None:
        """Run or stop the Auditor: an ephemeral sequential vote ``auditorelection/V_<seq>`` (bookie id
        :data:`SIM_AUDITOR_ID`), the lowest and only one, so the Auditor; stopping deletes it."""
        with self._lock:
            if running and self._auditor_vote is None:
                data = format_auditor_vote(SIM_AUDITOR_ID).encode("utf-8")
                self._auditor_vote = self.admin.create(
                    f"{self.underreplication.auditor_election}/V_", data, ephemeral=True, sequence=True
                )
                stat = self.admin.exists(self._auditor_vote)
                self._auditor_elected_since_ms = stat.ctime if stat is not None else _now_ms()
                self._auditor_gone_since_ms = None
            elif not running and self._auditor_vote is not None:
                with contextlib.suppress(NoNodeError):
                    self.admin.delete(self._auditor_vote)
                self._auditor_vote = None
                self._auditor_elected_since_ms = None
                self._auditor_gone_since_ms = _now_ms()

    def set_check_time(self, check: CtimeZnode | str, ctime_ms: int | None = None) -> int:
        """Record that the Auditor completed one of its periodic checks at ``ctime_ms`` (default now), as
        BookKeeper's Auditor does at the end of a run: the binary ``underreplication/<check>`` znode
        (``checkallledgersctime``, ``placementpolicycheckctime`` or ``replicascheckctime``), created or
        overwritten. Returns the time written."""
        with self._lock:
            try:
                kind = CtimeZnode(check)
                at_ms = _now_ms() if ctime_ms is None else ctime_ms
                data = format_ctime(kind, at_ms)
            except (ValueError, FormatError) as err:
                raise SimulatorError(str(err)) from None
            path = self.underreplication.ctime(kind)
            try:
                self.admin.set(path, data)
            except NoNodeError:
                self.admin.create(path, data)
            self._check_times[kind] = at_ms
            return at_ms

    def hold_lock(self, ledger: str | int, holder: str = "replication-worker-0") -> str:
        """Take a ledger's replication lock as a ReplicationWorker does (ephemeral ``locks/urL<id>`` with
        ``LockDataFormat``) and keep it; returns its path."""
        with self._lock:
            ledger_id = self._ledger(ledger).ledger_id
            path = self.underreplication.lock(ledger_id)
            try:
                data = format_lock_data(holder).encode("utf-8")
                self.admin.create(path, data, ephemeral=True)
            except FormatError as err:
                raise SimulatorError(str(err)) from None
            except NodeExistsError:
                raise SimulatorError(f"ledger {ledger_id}'s replication lock is already held") from None
            stat = self.admin.exists(path)
            self._locks[ledger_id] = ReplicationLock(holder, stat.ctime if stat is not None else _now_ms())
            return path

    def release_lock(self, ledger: str | int) -> None:
        """Release a ledger's replication lock (delete ``locks/urL<id>``)."""
        with self._lock:
            ledger_id = self._ledger(ledger).ledger_id
            with contextlib.suppress(NoNodeError):
                self.admin.delete(self.underreplication.lock(ledger_id))
            self._locks.pop(ledger_id, None)

    def _auditor_missing_since(self) -> int | None:
        """Since when no Auditor is elected while bookies run (None: an Auditor runs, or no bookie)."""
        running = self._bookies_running_since_ms
        if self._auditor_vote is not None or running is None or self._auditor_gone_since_ms is None:
            return None
        return max(self._auditor_gone_since_ms, running)

    def _write_metadata(self, ledger: SimLedger, metadata: LedgerMetadata) -> None:
        """Versioned setData, as BookKeeper's metadata updates are compare-and-set."""
        try:
            stat = self.admin.set(ledger.path, encode_ledger_metadata(metadata), version=ledger.znode_version)
        except KazooException as err:
            raise SimulatorError(f"ledger {ledger.ledger_id}: metadata update failed: {err!r}") from None
        ledger.metadata = metadata
        ledger.znode_version = stat.version

    # ====================================================================================== references

    def _require_open(self) -> None:
        if self._closed:
            raise SimulatorError("the simulated cluster is closed")
        if self._admin is None:
            raise SimulatorError("the simulated cluster is not initialised (call init())")

    def _require_decodable(self, ledger: SimLedger) -> None:
        if ledger.corrupt is not None:
            raise SimulatorError(f"ledger {ledger.ledger_id}'s metadata znode is corrupt; only delete works")

    def _require_writable_ledger(self, ledger: SimLedger) -> None:
        self._require_decodable(ledger)
        if ledger.metadata.state is not LedgerState.OPEN:
            raise SimulatorError(f"ledger {ledger.ledger_id} is {ledger.metadata.state.value}, not OPEN")

    def _bookie(self, ref: str | int) -> SimBookie:
        self._require_open()
        if isinstance(ref, str) and ref in self._bookies:
            return self._bookies[ref]
        index = _ordinal(ref)
        if index is not None and 0 <= index < len(self._bookie_order):
            return self._bookies[self._bookie_order[index]]
        raise UnknownEntityError(f"no bookie {ref!r}")

    def _bookie_name(self, ref: str | int) -> str:
        """A simulated bookie's id, or ``ref`` itself when it is a valid id the cluster does not know."""
        try:
            return self._bookie(ref).bookie_id
        except UnknownEntityError:
            if isinstance(ref, str) and not ref.startswith("#"):
                try:
                    return validate_bookie_id(ref)
                except FormatError as err:
                    raise SimulatorError(str(err)) from None
            raise

    def _ledger(self, ref: str | int) -> SimLedger:
        self._require_open()
        if isinstance(ref, str):
            if ref in self._aliases:
                return self._ledgers[self._aliases[ref]]
            if ref.startswith("#"):
                index = _ordinal(ref)
                if index is not None and 0 <= index < len(self._ledger_order):
                    ledger_id = self._ledger_order[index]
                    if ledger_id in self._ledgers:
                        return self._ledgers[ledger_id]
                raise UnknownEntityError(f"no live ledger {ref!r}")
            if ref.isdigit():
                ref = int(ref)
        if isinstance(ref, int) and not isinstance(ref, bool) and ref in self._ledgers:
            return self._ledgers[ref]
        raise UnknownEntityError(f"no live ledger {ref!r}")

    def bookie_id(self, ref: str | int) -> str:
        """The id of a bookie reference (id, add order ``0`` or ``"#0"``).

        Example:
            >>> SimulatedCluster("127.0.0.1:2181").bookie_id("bookie-01")
            Traceback (most recent call last):
            ...
            bkaudit.sim.errors.SimulatorError: the simulated cluster is not initialised (call init())
        """
        with self._lock:
            return self._bookie(ref).bookie_id

    def bookie_address(self, ref: str | int) -> str:
        """``host:port`` of a bookie's protocol server."""
        with self._lock:
            return self._bookie(ref).address

    def ledger_id(self, ref: str | int) -> int:
        """The id of a ledger reference (id, alias or creation order ``"#0"``)."""
        with self._lock:
            return self._ledger(ref).ledger_id

    def ledger_metadata(self, ref: str | int) -> LedgerMetadata:
        """The metadata the simulator last wrote for a ledger (before any corruption)."""
        with self._lock:
            return self._ledger(ref).metadata

    def bookie_ids(self) -> list[str]:
        """Every bookie id, in add order."""
        with self._lock:
            return list(self._bookie_order)

    def ledger_ids(self) -> list[int]:
        """Every live ledger id, in creation order."""
        with self._lock:
            return [ledger_id for ledger_id in self._ledger_order if ledger_id in self._ledgers]

    def bookie_requests(self, ref: str | int) -> int:
        """How many requests a bookie's server has received (any operation) since it started."""
        with self._lock:
            return self._bookie(ref).server.stats.requests_received

    def bookie_store(self, ref: str | int) -> InMemoryEntryStore:
        """The entry store of a bookie (what its server answers from)."""
        with self._lock:
            return self._bookie(ref).store

    # =============================================================================================== state

    def status(self) -> dict[str, Any]:
        """What runs where: ZooKeeper, root, bookies (address, rack, mode, where ZooKeeper has them
        registered, faults), ledgers. No password."""
        with self._lock:
            registered = self.registrations()
            return {
                "zookeeper": self.zk_hosts,
                "root": self.root,
                "manager": self.manager.value,
                "instance_id": self.instance_id,
                "rack_map_path": self.rack_map_path,
                "lost_bookie_recovery_delay_s": self.lost_bookie_recovery_delay_s,
                "bookies": [
                    {
                        "bookie_id": bookie.bookie_id,
                        "address": bookie.address,
                        "rack": bookie.rack,
                        "mode": bookie.mode.value,
                        "registered": registered.get(bookie.bookie_id, Registration.NONE).value,
                        "legacy_id": bookie.legacy_id,
                        "storage": SORTED_STORAGE if bookie.server.answers_entry_lists else DB_STORAGE,
                        "ledger_dir": str(bookie.store.ledger_dir)
                        if isinstance(bookie.store, IndexedEntryStore)
                        else None,
                        "faults": bookie.faults_json(),
                    }
                    for bookie in (self._bookies[b] for b in self._bookie_order)
                ],
                "ledgers": [self._ledgers[lid].to_json() for lid in self.ledger_ids()],
                "underreplicated": sorted(self._marks),
                "autorecovery": {
                    "enabled": self._disabled_since_ms is None,
                    "auditor": SIM_AUDITOR_ID if self._auditor_vote is not None else None,
                    "locks": sorted(self._locks),
                    "checks": dict(sorted((kind.value, ms) for kind, ms in self._check_times.items())),
                },
            }

    def snapshot(self, now_ms: int | None = None) -> ClusterSnapshot:
        """Freeze what ground truth needs (registrations as ZooKeeper has them, stores, faults, history)."""
        with self._lock:
            now = _now_ms() if now_ms is None else now_ms
            self._check_pending_expiries()
            registered = self.registrations()
            bookies: dict[str, BookieSnapshot] = {}
            with self._membership_lock:
                absences = tuple(self._absences)
                for bookie_id, bookie in self._bookies.items():
                    registration = registered.get(bookie_id, Registration.NONE)
                    faults = bookie.server.faults
                    store = bookie.store
                    holdings = {
                        ledger_id: held
                        for ledger_id in store.ledger_ids()
                        if (held := store.entries_of(ledger_id)) is not None
                    }
                    bookies[bookie_id] = BookieSnapshot(
                        bookie_id=bookie_id,
                        registration=registration,
                        rack=bookie.rack,
                        group=self.group_of(bookie),
                        serving=bookie.server.running,
                        silent=faults.silent,
                        delay_s=faults.delay_s,
                        fail_status=faults.fail_status,
                        enoledger_for=faults.enoledger_for,
                        holdings=holdings,
                        answers_entry_lists=bookie.server.answers_entry_lists,
                    )
            ledgers = {lid: led.metadata for lid, led in self._ledgers.items() if led.corrupt is None}
            corrupt = frozenset(lid for lid, ledger in self._ledgers.items() if ledger.corrupt is not None)
            return ClusterSnapshot(
                now_ms=now,
                bookies=bookies,
                ledgers=ledgers,
                absences=absences,
                corrupt_ledgers=corrupt,
                underreplicated=dict(self._marks),
                lost_bookie_recovery_delay_s=self.lost_bookie_recovery_delay_s,
                audits_ms=tuple(self._audits_ms),
                autorecovery=AutoRecoveryZnodes(
                    disabled_since_ms=self._disabled_since_ms,
                    auditor=SIM_AUDITOR_ID if self._auditor_vote is not None else None,
                    locks=dict(self._locks),
                    checks=dict(self._check_times),
                ),
                auditor_missing_since_ms=self._auditor_missing_since(),
                auditor_elected_since_ms=self._auditor_elected_since_ms,
                autorecovery_enabled_since_ms=self._enabled_since_ms,
                managed_znodes=dict(self._managed_znodes),
                ledger_created_ms={lid: led.created_ms for lid, led in self._ledgers.items()},
            )

    def registrations(self) -> dict[str, Registration]:
        """Where each bookie is registered as ZooKeeper holds it now (read, not what the simulator
        believes: a session ZooKeeper expired, a registration that failed or a znode deleted by hand show
        at once). When ZooKeeper cannot be read, what its watches said last.

        Example:
            >>> # sim.registrations()["bookie-01"] is Registration.WRITABLE
        """
        try:
            writable = set(self.admin.get_children(available_path(self.root))) - {"readonly"}
            readonly = set(self.admin.get_children(readonly_path(self.root)))
        except KazooException:
            with self._membership_lock:
                last = set(self._zk_registered)
            readonly = {
                b for b in last if self._bookies.get(b) and self._bookies[b].mode is BookieMode.READONLY
            }
            writable = last - readonly
        found = {bookie: Registration.WRITABLE for bookie in writable}
        found.update({bookie: Registration.READONLY for bookie in readonly})
        return found

    def _check_pending_expiries(self) -> None:
        """Ask ZooKeeper directly about hard-killed bookies, in case the watch has not fired yet."""
        pending = [bookie for bookie in self._bookies.values() if bookie.hard_killed]
        for bookie in pending:
            mode = bookie.hard_killed_registration or BookieMode.WRITABLE
            if self.admin.exists(self._registration_path(bookie.bookie_id, mode)) is None:
                with self._membership_lock:
                    if bookie.hard_killed:
                        self._registration_gone(bookie, _now_ms())

    def ground_truth(
        self, now_ms: int | None = None, params: TruthParameters | None = None
    ) -> dict[str, Any]:
        """What a correct auditor must flag now (see :mod:`bkaudit.sim.truth`), as JSON."""
        snapshot = self.snapshot(now_ms)
        return ground_truth(snapshot, params or self.truth_parameters)

    def what_if_truth(self, down: Iterable[str]) -> dict[str, list[int]]:
        """What ``bkaudit query what-if`` must answer now for the ``down`` bookies (see
        :func:`bkaudit.sim.truth.what_if_truth`)."""
        return what_if_truth(self.snapshot(), down)


def replace_metadata(md: LedgerMetadata, **changes: Any) -> LedgerMetadata:
    """A copy of ``md`` with ``changes`` (validated again by the model's constructor).

    Example:
        >>> md = LedgerMetadata(ensemble_size=1, write_quorum=1, ack_quorum=1, segments=(Segment(0, ("b",)),))
        >>> replace_metadata(md, state=LedgerState.CLOSED, last_entry_id=4, length=5).last_entry_id
        4
    """
    return replace(md, **changes)


def _dir_name(bookie_id: str) -> str:
    return bookie_id.replace(":", "_")


def _ordinal(ref: object) -> int | None:
    """``3`` or ``"#3"`` → 3; anything else → None."""
    if isinstance(ref, bool):
        return None
    if isinstance(ref, int):
        return ref
    if isinstance(ref, str) and ref.startswith("#") and ref[1:].isdigit():
        return int(ref[1:])
    return None
