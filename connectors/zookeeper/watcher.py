"""``bkaudit watch``: BookKeeper's ZooKeeper metadata as a complete, ordered change stream on Kafka.

How it works (details in ``docs/watcher.md``):

* **One ordered stream.** Every watch notification, every read completion (:class:`OrderedReads`) and every
  marker is handed, as kazoo's connection thread receives it, to one FIFO (kazoo's callbacks run inline:
  :class:`~connectors.zookeeper.handler.PollingHandler`), in ZooKeeper's order for the session; one worker
  thread turns items into events in that order. A CREATED/CHANGED notification triggers
  a read; the event is emitted when the read's completion is dequeued (a NoNode result is skipped: the delete
  notification comes on its own). Upserts carry mzxid and version so consumers drop stale and duplicate ones.
* **Watching.** One persistent recursive watch (AddWatch) on the ledgers root, added *before* the snapshot
  scan and re-added after every reconnect. Servers without AddWatch get the fallback
  (:mod:`connectors.zookeeper.fallback_watch`), chosen automatically or forced by ``watch_mode``.
* **Snapshots.** On start a FULL snapshot; after a reconnect, a session expiry, a delivery failure or
  periodically a reconciliation. Leaves are read 100 per ``multiRead`` request (ZooKeeper ≥ 3.6), at most
  ``snapshot_concurrency`` in flight, each slot released only when the worker has published the result.
  A compact index (ledger id → mzxid and scan epoch, one dict of ints) lets reconciliations publish only
  differences and infer deletions that happened while nobody watched.
* **Delivery.** :class:`~connectors.kafka.publisher.ChangePublisher`: keyed by entity, back-pressure instead
  of drops, full snapshot after a delivery failure, flush on shutdown.

Example:
    >>> from core.settings import Settings
    >>> options = kazoo_client_options(Settings(zookeeper={"auth_scheme": "digest", "auth_username": "bk",
    ...                                                    "auth_password": "pw"}).zookeeper)
    >>> options["auth_data"], options["logger"].name
    ([('digest', 'bk:pw')], 'connectors.zookeeper.watcher.kazoo')
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.protocol.states import EventType, KazooState, WatchedEvent
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from connectors.bookie.liveness import LivenessProbes
from connectors.bookie.tls import bookie_tls_config
from connectors.kafka.client_config import KafkaTimeout
from connectors.kafka.publisher import (
    PRODUCER_STALL_S,
    TAIL_RELEASE_IDLE_S,
    TAIL_RELEASE_MAX_INTERVAL_S,
    TAIL_RELEASE_MIN_INTERVAL_S,
    ChangePublisher,
)
from connectors.tls import client_context, explain_refusal, first_refusal
from connectors.zookeeper.autorecovery import AutoRecoveryRecipe
from connectors.zookeeper.bookies import BookieRegistry
from connectors.zookeeper.fallback_watch import FALLBACK_EVENT, FallbackWatches
from connectors.zookeeper.handler import PollingHandler
from connectors.zookeeper.managed_ledgers import ManagedLedgerRecipe
from connectors.zookeeper.ordered_reads import OrderedReads
from connectors.zookeeper.persistent_watch import PersistentWatches
from connectors.zookeeper.snapshot import (
    NodeKind,
    ProgressLine,
    RatePacer,
    ReadSlots,
    ScanAborted,
    Snapshot,
    TreeWalker,
)
from core import events
from core.domain.addresses import parse_zookeeper_connect
from core.domain.layout import (
    AVAILABLE_NODE,
    COOKIES_NODE,
    UNDERREPLICATION_NODE,
    LedgerManagerType,
    ZnodeKind,
    available_path,
    classify_path,
    cookies_path,
    instance_id_path,
    layout_path,
    managers_holding_path,
    parse_layout,
    readonly_path,
    validate_root,
)
from core.domain.metadata import decode_ledger_metadata
from core.domain.rackmap import parse_rack_map
from core.domain.registration import (
    RegistrationKind,
    parse_registration_path,
)
from core.domain.underreplication import (
    CtimeZnode,
    UnderreplicationPaths,
    parse_lost_bookie_recovery_delay,
    parse_underreplicated_ledger,
    parse_urledger_path,
)
from core.errors import ConfigError, FormatError, ServiceError
from core.logsetup import SECRET_FILTER
from core.metrics_http import serve_metrics
from core.pb import change_events_pb2 as pb
from core.settings import Settings, ZooKeeperSettings
from core.threadnames import named_target

logger = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------------------ ZooKeeper


def _kazoo_logger(secret: str | None) -> logging.Logger:
    # kazoo's clients log through this logger; the shared secret filter applies to every record they emit
    # (znode payloads and Auth credentials included), whatever handlers the process has.
    kazoo_logger = logging.getLogger(f"{__name__}.kazoo")
    if SECRET_FILTER not in kazoo_logger.filters:
        kazoo_logger.addFilter(SECRET_FILTER)
    SECRET_FILTER.add_secret(secret)
    return kazoo_logger


def kazoo_client_options(
    settings: ZooKeeperSettings, hosts: str | None = None, *, inline_callbacks: bool = False
) -> dict[str, Any]:
    """KazooClient keyword arguments for ``settings`` (auth unwrapped here only; never log the result).

    Reconnection retries forever with a short back-off, so a restarted ZooKeeper is rejoined quickly. The
    client logs through a logger that redacts credentials (kazoo itself would print Auth requests), and
    waits on its sockets with one ``poll`` call (:class:`~connectors.zookeeper.handler.PollingHandler`;
    ``inline_callbacks``: watch callbacks run on kazoo's connection thread, for callbacks that never block).

    Example:
        >>> kazoo_client_options(ZooKeeperSettings(connect="zk1:2181/bk"))["hosts"]
        'zk1:2181/bk'
        >>> kazoo_client_options(ZooKeeperSettings(auth_scheme="sasl"))["sasl_options"]
        {'mechanism': 'GSSAPI'}
    """
    options: dict[str, Any] = {
        "hosts": hosts or settings.connect,
        "timeout": settings.session_timeout_s,
        "connection_retry": {"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 2.0},
        "handler": PollingHandler(inline_callbacks=inline_callbacks),
    }
    password = settings.auth_password.get_secret_value() if settings.auth_password is not None else None
    if settings.auth_scheme == "digest":
        if not settings.auth_username or password is None:
            raise ConfigError("zookeeper.auth_scheme=digest needs auth_username and auth_password")
        options["auth_data"] = [("digest", f"{settings.auth_username}:{password}")]
    elif settings.auth_scheme == "sasl":
        if settings.auth_username and password is not None:
            options["sasl_options"] = {
                "mechanism": "DIGEST-MD5",
                "username": settings.auth_username,
                "password": password,
            }
        else:  # Kerberos from the process' ticket cache
            options["sasl_options"] = {"mechanism": "GSSAPI"}
    options.update(kazoo_tls_options(settings))
    options["logger"] = _kazoo_logger(password)
    return options


def kazoo_tls_options(settings: ZooKeeperSettings) -> dict[str, Any]:
    """The KazooClient TLS keyword arguments of ``settings`` (empty without ``use_tls``), for clients built
    elsewhere (the simulator's sessions); the key password is registered with the secret filter.

    Example:
        >>> kazoo_tls_options(ZooKeeperSettings())
        {}
        >>> kazoo_tls_options(ZooKeeperSettings(use_tls=True))["verify_certs"]
        True
    """
    if not settings.use_tls:
        return {}
    key_password = settings.tls_keyfile_password
    secret = key_password.get_secret_value() if key_password is not None else None
    SECRET_FILTER.add_secret(secret)
    return {
        "use_ssl": True,
        "verify_certs": True,
        "check_hostname": settings.tls_check_hostname,
        "ca": str(settings.tls_cafile) if settings.tls_cafile is not None else None,
        "certfile": str(settings.tls_certfile) if settings.tls_certfile is not None else None,
        "keyfile": str(settings.tls_keyfile) if settings.tls_keyfile is not None else None,
        "keyfile_password": secret,
    }


def check_tls(settings: ZooKeeperSettings, hosts: str, timeout_s: float) -> None:
    """With ``use_tls``: load the TLS files and make one handshake with the first host that answers; a
    problem is one :class:`ConfigError` (files, key password, expired client certificate) or
    :class:`ServiceError` (the server refused: wrong CA, missing or refused client certificate) line.

    kazoo itself would retry a refused handshake until the connect timeout, saying only "no connection".

    Example:
        >>> check_tls(ZooKeeperSettings(), "127.0.0.1:2181", 1.0)  # use_tls off: nothing to check
    """
    if not settings.use_tls:
        return
    key_password = settings.tls_keyfile_password
    context = client_context(
        "zookeeper.tls_",
        settings.tls_cafile,
        settings.tls_certfile,
        settings.tls_keyfile,
        key_password.get_secret_value() if key_password is not None else None,
        check_hostname=settings.tls_check_hostname,
    )
    # "srvr" is the four-letter word ZooKeeper answers by default: with TLS 1.3 a refused client
    # certificate shows only at the first read.
    servers = parse_zookeeper_connect(hosts)[0]
    refused = first_refusal(context, servers, min(timeout_s, 10.0), hello=b"srvr")
    if refused is not None:
        host, port, reason = refused
        sent = settings.tls_certfile is not None
        hint = explain_refusal(reason, "zookeeper.tls_", sent_certificate=sent)
        raise ServiceError(f"ZooKeeper at {host}:{port}: TLS refused ({reason}): {hint}")


def start_client(
    client: KazooClient, settings: ZooKeeperSettings, hosts: str, setting: str, timeout_s: float
) -> None:
    """Start ``client``, waiting at most ``timeout_s``; no answer becomes one :class:`ServiceError` line
    naming the address and ``setting`` (the hosts string carries no credentials, so it is safe to print).

    Example:
        >>> # start_client(KazooClient(**kazoo_client_options(zk)), zk, zk.connect, "zookeeper.connect", 10)
    """
    check_tls(settings, hosts, timeout_s)
    try:
        client.start(timeout=timeout_s)
    except (client.handler.timeout_exception, KazooException) as err:
        # kazoo's own text ("Connection time-out") names neither the address nor what to do.
        what = "no connection" if isinstance(err, client.handler.timeout_exception) else type(err).__name__
        auth = "" if settings.auth_scheme == "none" else f" and the {settings.auth_scheme} credentials"
        auth += " and zookeeper.use_tls (TLS port?)" if settings.use_tls else ""
        raise ServiceError(
            f"ZooKeeper at {hosts}: {what} within {timeout_s:g} s; check {setting} "
            f"(BKAUDIT_{setting.upper().replace('.', '__')}), that ZooKeeper is up and reachable from "
            f"this host{auth}"
        ) from None


def unreadable_znode(settings: ZooKeeperSettings, path: str, err: KazooException) -> ServiceError:
    """The error for a znode ZooKeeper refused to read (NoAuth, usually: creator-only ACLs).

    Example:
        >>> from kazoo.exceptions import NoAuthError
        >>> str(unreadable_znode(ZooKeeperSettings(), "/ledgers/LAYOUT", NoAuthError()))[:60]
        'ZooKeeper at 127.0.0.1:2181: cannot read /ledgers/LAYOUT (No'
    """
    return ServiceError(
        f"ZooKeeper at {settings.connect}: cannot read {path} ({type(err).__name__}); "
        "check zookeeper.auth_scheme and its credentials (BKAUDIT_ZOOKEEPER__AUTH_*) and the znode's ACL"
    )


# ------------------------------------------------------------------------------------------------ metrics

#: Why a znode in the ledger tree is ignored: a path another ledger manager would read as its own (the
#: manager setting or LAYOUT looks wrong), or a path no manager reads (foreign data, a non-canonical name).
IGNORED_OTHER_LEDGER_MANAGER = "other_ledger_manager"
IGNORED_NOT_A_LEDGER_PATH = "not_a_ledger_path"
IGNORED_ZNODE_REASONS = (IGNORED_OTHER_LEDGER_MANAGER, IGNORED_NOT_A_LEDGER_PATH)
#: Paths remembered so that each is logged once; past this many, further ones are counted but not logged.
MAX_LOGGED_IGNORED_ZNODES = 10_000


class WatcherMetrics:
    """The watcher's Prometheus metrics, in a private registry (``bkaudit_watcher_*``).

    Example:
        >>> metrics = WatcherMetrics()
        >>> metrics.events_published.labels("heartbeat").inc()
        >>> metrics.registry.get_sample_value("bkaudit_watcher_events_published_total", {"type": "heartbeat"})
        1.0
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.events_published = Counter(
            "bkaudit_watcher_events_published",
            "Change events handed to Kafka, by payload type",
            ["type"],
            registry=r,
        )
        self.delivery_failures = Counter(
            "bkaudit_watcher_delivery_failures", "Events Kafka did not acknowledge after retries", registry=r
        )
        self.topic_losses = Counter(
            "bkaudit_watcher_topic_losses",
            "Times the changes topic lost its data (acknowledged offsets went backwards: broker data loss, "
            "topic recreated); each one triggers a FULL snapshot",
            registry=r,
        )
        self.snapshot_duration = Gauge(
            "bkaudit_watcher_snapshot_duration_seconds",
            "Duration of the last snapshot scan",
            ["reason"],
            registry=r,
        )
        self.snapshot_ledgers = Gauge(
            "bkaudit_watcher_snapshot_ledgers",
            "Ledger znodes read by the last snapshot scan",
            ["reason"],
            registry=r,
        )
        self.snapshot_published = Gauge(
            "bkaudit_watcher_snapshot_events",
            "Entity events published by the last snapshot scan",
            ["reason"],
            registry=r,
        )
        self.snapshots = Counter(
            "bkaudit_watcher_snapshots",
            "Snapshot scans by reason and outcome",
            ["reason", "outcome"],
            registry=r,
        )
        self.watch_registrations = Counter(
            "bkaudit_watcher_watch_registrations", "(Re-)registrations of persistent watches", registry=r
        )
        self.session_state = Gauge(
            "bkaudit_watcher_zookeeper_session_state",
            "1 for the current ZooKeeper session state (CONNECTED, SUSPENDED, LOST)",
            ["state"],
            registry=r,
        )
        self.session_expirations = Counter(
            "bkaudit_watcher_zookeeper_session_expirations", "ZooKeeper sessions lost", registry=r
        )
        self.publish_lag = Histogram(
            "bkaudit_watcher_publish_lag_seconds",
            "Time from an event's emission (event time) to Kafka's acknowledgement",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.change_to_ack = Histogram(
            "bkaudit_watcher_change_to_kafka_seconds",
            "Live ledger changes: znode mtime (ZooKeeper's clock) to Kafka's acknowledgement (ours)",
            buckets=(
                0.005,
                0.01,
                0.015,
                0.02,
                0.03,
                0.04,
                0.05,
                0.075,
                0.1,
                0.15,
                0.2,
                0.3,
                0.5,
                1,
                2,
                5,
                10,
            ),
            registry=r,
        )
        self.unacked_events = Gauge(
            "bkaudit_watcher_unacked_events", "Events handed to Kafka and not yet acknowledged", registry=r
        )
        self.last_heartbeat = Gauge(
            "bkaudit_watcher_last_heartbeat_timestamp_seconds",
            "Watcher clock of the last heartbeat",
            registry=r,
        )
        self.zookeeper_reads = Counter(
            "bkaudit_watcher_zookeeper_reads", "ZooKeeper reads issued, by purpose", ["purpose"], registry=r
        )
        self.ledgers_tracked = Gauge(
            "bkaudit_watcher_ledgers_tracked", "Ledgers in the watcher's index", registry=r
        )
        self.queue_depth = Gauge(
            "bkaudit_watcher_queue_depth", "Items waiting in the watcher's event queue", registry=r
        )
        self.undecodable = Counter(
            "bkaudit_watcher_undecodable_znodes",
            "Znodes whose data did not decode, by kind",
            ["kind"],
            registry=r,
        )
        self.ignored_znodes = Counter(
            "bkaudit_watcher_ignored_znodes",
            "Sightings (scans, notifications) of znodes in the ledger tree that are not ledgers, by reason",
            ["reason"],
            registry=r,
        )
        for reason in IGNORED_ZNODE_REASONS:
            self.ignored_znodes.labels(reason)
        for state in ("CONNECTED", "SUSPENDED", "LOST"):
            self.session_state.labels(state).set(0)

    def set_session_state(self, state: str) -> None:
        """Flag ``state`` as the current session state."""
        for name in ("CONNECTED", "SUSPENDED", "LOST"):
            self.session_state.labels(name).set(1 if name == state else 0)


# ------------------------------------------------------------------------------------------------ routing

# What a path under the watched tree is (see _Router.route).
R_OTHER, R_LEDGER, R_LEDGER_DIR, R_MARK, R_MARK_DIR, R_DELAY, R_UR_BASE = range(7)
R_WRITABLE, R_READONLY, R_COOKIE, R_BOOKIE_DIR, R_RACK = range(7, 12)
R_IGNORED = 12  # in the ledger tree (not special), but no ledger znode or directory of this manager
R_AUTORECOVERY = 13  # disable, the check-time znodes, auditorelection (and its votes), locks (and each lock)

_HEX4 = re.compile(r"[0-9a-f]{4}")


class _Router:
    """Tells what a znode path is for the watcher (ledger, mark, bookie node, directory of interest...)."""

    def __init__(self, root: str, manager: LedgerManagerType, rack_path: str | None) -> None:
        self.root = root
        self.manager = manager
        self.prefix = root + "/"
        self.ur = UnderreplicationPaths(root)
        self.urledgers_prefix = self.ur.urledgers + "/"
        self.delay_path = self.ur.lost_bookie_recovery_delay
        self.autorecovery_dirs = (self.ur.auditor_election, self.ur.locks)
        self.autorecovery_nodes = frozenset([self.ur.disable, *(self.ur.ctime(c) for c in CtimeZnode)])
        self.rack_path = rack_path
        self.bookie_dirs = {
            available_path(root): RegistrationKind.WRITABLE,
            readonly_path(root): RegistrationKind.READONLY,
            cookies_path(root): RegistrationKind.COOKIE,
        }

    def _in_autorecovery_dir(self, path: str) -> bool:
        return path in self.autorecovery_dirs or path.rpartition("/")[0] in self.autorecovery_dirs

    def route(self, path: str) -> tuple[int, Any]:
        if path == self.rack_path:
            return R_RACK, None
        if not path.startswith(self.prefix):
            return (R_LEDGER_DIR, None) if path == self.root else (R_OTHER, None)
        first, _, tail = path[len(self.prefix) :].partition("/")
        if first in (AVAILABLE_NODE, COOKIES_NODE):
            kind = self.bookie_dirs.get(path)
            if kind is not None:
                return R_BOOKIE_DIR, kind
            registration = parse_registration_path(path, self.root)
            if registration is None:
                return R_OTHER, None
            if registration.kind is RegistrationKind.WRITABLE:
                return R_WRITABLE, registration.bookie_id
            if registration.kind is RegistrationKind.READONLY:
                return R_READONLY, registration.bookie_id
            return R_COOKIE, registration.bookie_id
        if first == UNDERREPLICATION_NODE:
            if not tail:
                return R_UR_BASE, None
            if path == self.delay_path:
                return R_DELAY, None
            if path in self.autorecovery_nodes or self._in_autorecovery_dir(path):
                return R_AUTORECOVERY, None
            if path == self.ur.urledgers:
                return R_MARK_DIR, None
            if path.startswith(self.urledgers_prefix):
                parts = path[len(self.urledgers_prefix) :].split("/")
                if len(parts) <= 4 and all(_HEX4.fullmatch(p) for p in parts):
                    return R_MARK_DIR, None
                ledger_id = parse_urledger_path(path, self.root)
                if ledger_id is not None:
                    return R_MARK, ledger_id
            return R_OTHER, None
        node = classify_path(path, self.manager, self.root)
        if node.kind is ZnodeKind.LEDGER:
            return R_LEDGER, node.ledger_id
        if node.kind is ZnodeKind.INTERMEDIATE:
            return R_LEDGER_DIR, None
        if node.kind is ZnodeKind.OTHER:
            return R_IGNORED, None
        return R_OTHER, None


class _IgnoredZnodes:
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


# ------------------------------------------------------------------------------------------------ worker

# Read/marker tokens: (op, path, snapshot or None, extra). A snapshot in the token means the read holds a
# read slot (released when processed) and its result belongs to that snapshot.
OP_LEDGER, OP_MARK, OP_DELAY, OP_REGISTRATION, OP_BOOKIE_LIST, OP_RACK, OP_FALLBACK_LIST = range(7)
OP_BEGIN, OP_END, OP_STATE, OP_HEARTBEAT, OP_RACK_FILE, OP_STOP, OP_RACK_REFRESH = range(7, 14)
OP_BATCH = 14  # a multiRead of ledgers or marks: extra = (leaf op, paths, ids)
# A round trip (exists) issued for a deleted cluster-level znode: its answer comes after every read issued
# before it, so the delete is applied in ZooKeeper's order relative to them. extra = the delete to apply.
OP_DELETE_BARRIER = 15
OP_AUTORECOVERY = 16  # a marker: read AutoRecovery's znodes now (extra = the snapshot, or None)
OP_TAILS = 17  # a marker from the delivery-report thread: the held tails can go out alone now
OP_PROBE = 18  # a liveness probe's answer (extra = bookie id, answered, address, detail)
OP_COOKIE = 19  # a cookie's read (extra = bookie id, snapshot or None)
OP_MANAGED = 20  # a managed-ledger or cursor znode's read (extra = (name, cursor)): the recipe's
WATCH_EVENT = "watch-event"
#: Of the worker's gathering sleep, the part during which kazoo's connection thread leaves the burst's
#: notifications in the socket: it wakes once to read them all, and has handed them over when the worker
#: wakes.
READS_HELD_FRACTION = 0.75
#: Queue items the worker takes at once (a chunk): the ledger reads its notifications trigger go out together.
MAX_CHUNK_ITEMS = 1000

# The index packs mzxid << 16 | scan epoch. Epochs wrap at 65536; a stale stamp could only match again after
# 65536 consecutive *incomplete* scans, since every complete scan re-stamps or removes every entry.
_EPOCH_BITS = 16
_EPOCH_MASK = (1 << _EPOCH_BITS) - 1
_RECONNECT_REASONS = (pb.SnapshotBegin.RECONNECT, pb.SnapshotBegin.SESSION_EXPIRED)

_PURPOSE = {
    OP_LEDGER: "ledger",
    OP_MARK: "mark",
    OP_DELAY: "recovery_delay",
    OP_REGISTRATION: "registration",
    OP_COOKIE: "cookie",
    OP_BOOKIE_LIST: "bookie_list",
    OP_RACK: "rack_map",
    OP_FALLBACK_LIST: "fallback_list",
    OP_BATCH: "multi_read",
    OP_DELETE_BARRIER: "delete_barrier",
    OP_AUTORECOVERY: "autorecovery",
    OP_MANAGED: "managed_ledger",
}


@dataclasses.dataclass
class WatcherStatus:
    """What the watcher has done so far (for tests, the CLI and logs).

    Example:
        >>> WatcherStatus().snapshots_completed
        0
    """

    snapshots_started: int = 0
    snapshots_completed: int = 0
    snapshots_incomplete: int = 0
    last_snapshot: Snapshot | None = None
    events_published: int = 0
    mode: str = ""
    up_to_date: bool = False


class ChangeWatcher:
    """Watches one BookKeeper cluster's ZooKeeper and publishes its changes (see the module docstring).

    Lifecycle: :meth:`start` (connect, detect layout, add the watch, start threads, begin the START
    snapshot), then :meth:`stop` (clean: flush Kafka) — or :meth:`run` for both around a blocking wait.
    ``zookeeper`` is the kazoo client (tests expire its session).

    Example:
        >>> # watcher = ChangeWatcher(load_settings()); watcher.start()
        >>> # watcher.wait_for_snapshots(1, timeout_s=300)   # the START snapshot is on Kafka
        >>> # watcher.stop()
    """

    def __init__(
        self,
        settings: Settings,
        *,
        publisher: ChangePublisher | None = None,
        metrics: WatcherMetrics | None = None,
        progress: ProgressLine | None = None,
    ) -> None:
        self.settings = settings
        self.config = settings.watcher
        self.root = validate_root(settings.zookeeper.ledgers_root)
        self.metrics = metrics if metrics is not None else WatcherMetrics()
        self.publisher = publisher or ChangePublisher(settings.kafka, on_delivered=self._on_delivered)
        if publisher is not None and publisher._on_delivered is None:
            publisher._on_delivered = self._on_delivered
        if progress is None:
            enabled = None if self.config.progress == "auto" else self.config.progress == "on"
            progress = ProgressLine(enabled=enabled)
        self._progress = progress
        self.status = WatcherStatus()
        self.run_id = uuid.uuid4().hex
        self.zookeeper: KazooClient = KazooClient(
            **kazoo_client_options(settings.zookeeper, inline_callbacks=True)
        )
        self._rack_client: KazooClient | None = None
        # Unbounded: ZooKeeper's notifications and answers are handed in by kazoo's connection thread, which
        # must not block (kazoo's own callback queue, which this replaces, was unbounded too). The bound
        # (queue_size) holds back the heartbeats only.
        self._queue: queue.SimpleQueue[tuple[Any, Any, Any]] = queue.SimpleQueue()
        self._tails_released_at = 0.0  # monotonic time of the last release of held records
        self._reads = OrderedReads(self.zookeeper, self._deliver)
        self._rack_reads: OrderedReads | None = None
        self._slots = ReadSlots(self.config.snapshot_concurrency)
        self._fallback = FallbackWatches(self._put)
        self._persistent: PersistentWatches | None = None
        self._managed: ManagedLedgerRecipe | None = None  # Pulsar's /managed-ledgers (settings.pulsar)
        self.fallback_mode = False
        self._multi_read = False
        # Live ledger reads of one chunk of notifications (path -> ledger id), sent as one multiRead.
        self._pending_ledger_reads: dict[str, int] = {}
        self._live_batch_size = self.config.snapshot_batch_size
        self._change_batch_s = self.config.change_batch_ms / 1000
        self.bursts_gathered = 0  # ledger bursts the worker let gather (its own decisions, for tests)
        self.manager = LedgerManagerType.HIERARCHICAL
        self.cluster = ""
        self._router: _Router | None = None
        self._ignored: _IgnoredZnodes | None = None  # with the router: both need the ledger manager
        self._builder: events.EventBuilder | None = None
        # worker state (touched only by the worker thread)
        self._ledgers: dict[int, int] = {}  # ledger id -> mzxid << 16 | epoch
        self._marks: dict[int, int] = {}  # ledger id -> mzxid << 16 | epoch
        self._bookies: BookieRegistry | None = None  # with the watch mode: the fallback marks listings
        self._delay: tuple[int, bool] | None = None  # (mzxid, present) last published
        self._autorecovery: AutoRecoveryRecipe | None = None  # with the router: it needs the ledgers root
        self._rack_published: tuple[Any, ...] | None = None
        self._rack_payload: pb.RackMap | None = None
        self._epoch = 0
        self._current: Snapshot | None = None
        # controller state (set from kazoo's connection thread, read by the controller)
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._connected = threading.Event()
        self._pending_reason: events.SnapshotReason | None = None
        self._request_lock = threading.Lock()  # the listener (connection thread) and the controller
        self._readd_needed = False  # a reconnect happened: re-add the persistent watch before scanning
        self._force_full = False  # next scan must be FULL (delivery failure)
        self._session_lost = False
        self._disconnects = 0
        self._up_to_date = False
        self._full_done = False
        self._started = False
        self._status_lock = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._metrics_server: Any = None
        self._rack_file_seen: tuple[float, int] | None = None
        self._read_counter = {op: self.metrics.zookeeper_reads.labels(name) for op, name in _PURPOSE.items()}
        self._event_counters: dict[str, Any] = {}
        self._liveness: LivenessProbes | None = None
        if self.config.bookie_probe_interval_s > 0:
            self._liveness = LivenessProbes(
                self._on_probe_answer,
                interval_s=self.config.bookie_probe_interval_s,
                timeout_s=self.config.bookie_probe_timeout_s,
                tls=bookie_tls_config(settings.bookie),
            )

    # ============================================================================================ lifecycle

    def start(self) -> None:
        """Connect, detect the cluster, register the watch and start the threads; returns while the START
        snapshot runs. Raises ServiceError/ConfigError when the cluster or Kafka cannot be used."""
        try:
            self._start()
        except BaseException:
            self._stopping.set()
            for client in (self._rack_client, self.zookeeper):
                if client is not None:
                    with contextlib.suppress(Exception):
                        client.stop()
                        client.close()
            with contextlib.suppress(Exception):
                self.publisher.close(1.0)
            if self._metrics_server is not None:
                self._metrics_server.shutdown()
                self._metrics_server = None
            raise

    def _start(self) -> None:
        if self.config.metrics_port:
            # First: a taken port then fails at once, before any connection is opened, and a watcher still
            # waiting for ZooKeeper or Kafka is already visible to Prometheus.
            self._metrics_server = serve_metrics(
                self.metrics.registry,
                self.config.metrics_port,
                self.config.metrics_host,
                setting="watcher.metrics_port",
                host_setting="watcher.metrics_host",
            )
        client = self.zookeeper
        self._connect(client, self.settings.zookeeper.connect, "zookeeper.connect")
        self._connected.set()
        self.metrics.set_session_state("CONNECTED")
        self._detect_cluster()
        self._router = _Router(self.root, self.manager, self._same_client_rack_path())
        self._ignored = _IgnoredZnodes(self.metrics.ignored_znodes, self.root, self.manager)
        self._builder = events.EventBuilder(self.cluster, self.run_id)
        self.publisher.start()
        client.add_listener(self._on_state)
        if self.settings.pulsar.follow_managed_ledgers:
            self._managed = ManagedLedgerRecipe(
                self.settings.pulsar.managed_ledgers_path,
                read=lambda path, znode: self._read(OP_MANAGED, path, znode, None),
                emit=self._emit,
            )
        self._choose_watch_mode()
        self._autorecovery = self._autorecovery_recipe(self._router)
        self._bookies = self._bookie_registry()
        # multiRead (ZooKeeper >= 3.6) batches snapshot reads; the fallback needs a watch per read instead.
        self._multi_read = (
            not self.fallback_mode
            and self.config.snapshot_batch_size > 1
            and self._reads.supports_multi_read()
        )
        self.metrics.unacked_events.set_function(lambda: self.publisher.unacked)
        self._start_thread("bkaudit-watch-worker", self._worker_loop)
        self._start_rack_source()
        self._start_thread("bkaudit-watch-heartbeat", self._heartbeat_loop)
        if self._liveness is not None:
            self._liveness.start()
        self._started = True
        self.request_snapshot(pb.SnapshotBegin.START)
        self._start_thread("bkaudit-watch-controller", self._controller_loop)
        logger.info(
            "watching cluster %s: ledgers root %s, %s manager, %s mode, topic %s",
            self.cluster,
            self.root,
            self.manager.value,
            self.status.mode,
            self.publisher.topic,
        )

    def run(self, stop_event: threading.Event, *, exit_after_snapshot: bool = False) -> int:
        """:meth:`start`, wait until ``stop_event`` is set (or the START snapshot is out), :meth:`stop`.

        Returns 0, or 1 when the START snapshot was requested to finish but did not complete.
        """
        self.start()
        try:
            while not stop_event.wait(0.5):
                if exit_after_snapshot and self.status.snapshots_completed >= 1:
                    break
        finally:
            self.stop()
        return 0 if not exit_after_snapshot or self.status.snapshots_completed >= 1 else 1

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop watching: abort scans, publish what is queued, flush Kafka, close ZooKeeper."""
        timeout = timeout_s if timeout_s is not None else self.config.shutdown_timeout_s
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._wake.set()
        if self._liveness is not None:
            self._liveness.stop()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread.name in (
                "bkaudit-watch-controller",
                "bkaudit-watch-heartbeat",
                "bkaudit-watch-rackfile",
            ):
                thread.join(max(0.1, deadline - time.monotonic()))
        worker = next((t for t in self._threads if t.name == "bkaudit-watch-worker"), None)
        if worker is not None:
            # The stop marker goes behind everything kazoo has already delivered.
            with contextlib.suppress(Exception):
                self._reads.marker((OP_STOP, "", None, None))
            worker.join(max(0.1, deadline - time.monotonic()))
            if worker.is_alive():
                self.publisher.abort()
                self._put(((OP_STOP, "", None, None), None, None))
                worker.join(5.0)
        for client in (self._rack_client, self.zookeeper):
            if client is not None:
                with contextlib.suppress(Exception):
                    client.stop()
                    client.close()
        self.publisher.close(max(1.0, deadline - time.monotonic()))
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        logger.info("watcher stopped (%d events published)", self.status.events_published)

    def request_snapshot(self, reason: events.SnapshotReason = pb.SnapshotBegin.PERIODIC) -> None:
        """Ask the controller for a scan (``START`` and ``PUBLISH_FAILED`` make it FULL).

        Requests coalesce; a pending reconnect or session-expiry reason is never replaced by a weaker one.
        """
        with self._request_lock:
            if reason in (pb.SnapshotBegin.START, pb.SnapshotBegin.PUBLISH_FAILED):
                self._force_full = True
            pending = self._pending_reason
            if pending not in _RECONNECT_REASONS or reason == pb.SnapshotBegin.SESSION_EXPIRED:
                self._pending_reason = reason
        self._wake.set()

    def _take_request(self) -> tuple[events.SnapshotReason | None, bool]:
        with self._request_lock:
            reason, self._pending_reason = self._pending_reason, None
            readd, self._readd_needed = self._readd_needed, False
            return reason, readd

    def wait_for_snapshots(self, count: int, timeout_s: float = 60.0) -> bool:
        """Wait until ``count`` snapshots have completed (their END markers handed to Kafka)."""
        deadline = time.monotonic() + timeout_s
        with self._status_lock:
            while self.status.snapshots_completed < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._status_lock.wait(remaining)
        return True

    def _connect(self, client: KazooClient, hosts: str, setting: str) -> None:
        """Start ``client``; a ZooKeeper that does not answer in time becomes one ServiceError line."""
        zookeeper = self.settings.zookeeper
        timeout_s = zookeeper.connect_timeout_s or max(10.0, zookeeper.session_timeout_s)
        start_client(client, zookeeper, hosts, setting, timeout_s)

    def _start_thread(self, name: str, target: Callable[[], None]) -> None:
        os_name = name.removeprefix("bkaudit-")  # "watch-worker": top -H and /proc show it
        thread = threading.Thread(target=named_target(os_name, target), name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _detect_cluster(self) -> None:
        client = self.zookeeper
        if self.config.ledger_manager is not None:
            self.manager = LedgerManagerType.from_name(self.config.ledger_manager)
        else:
            try:
                data, _ = client.get(layout_path(self.root))
                self.manager = parse_layout(data).manager
            except NoNodeError:
                logger.warning(
                    "no %s: assuming the default hierarchical ledger manager", layout_path(self.root)
                )
            except FormatError as err:
                raise ServiceError(f"cannot read the cluster's LAYOUT: {err}") from None
            except KazooException as err:
                raise self._unreadable(layout_path(self.root), err) from None
        if self.manager is LedgerManagerType.MS:
            raise ConfigError(
                "the ms ledger manager keeps ledger metadata outside ZooKeeper: nothing to watch"
            )
        try:
            data, _ = client.get(instance_id_path(self.root))
            self.cluster = (data or b"").decode("utf-8", "replace").strip()
        except NoNodeError:
            self.cluster = ""
        except KazooException as err:
            raise self._unreadable(instance_id_path(self.root), err) from None
        if not self.cluster:
            if not self.settings.cluster:
                raise ServiceError(
                    f"no cluster id at {instance_id_path(self.root)} "
                    f"(is {self.root} a BookKeeper ledgers root?); set `cluster` to watch anyway"
                )
            self.cluster = self.settings.cluster

    def _unreadable(self, path: str, err: KazooException) -> ServiceError:
        return unreadable_znode(self.settings.zookeeper, path, err)

    def _choose_watch_mode(self) -> None:
        mode = self.config.watch_mode
        if mode != "fallback":
            watches = PersistentWatches(self.zookeeper)
            if mode == "persistent" or watches.supported():
                # Added BEFORE the snapshot scan: nothing can change unseen between the scan and the watch.
                watches.add(self.root, self._on_persistent_event)
                self.metrics.watch_registrations.inc()
                if self._managed is not None:  # re-added with the root's by readd_all
                    watches.add(self._managed.root, self._on_persistent_event)
                self._persistent = watches
            elif mode == "auto":
                logger.warning("ZooKeeper has no AddWatch (< 3.6): using one-shot child and data watches")
        self.fallback_mode = self._persistent is None
        self.status.mode = "fallback" if self.fallback_mode else "persistent"

    # ============================================================================================ rack map

    def _same_client_rack_path(self) -> str | None:
        if self.config.rack_map_znode is not None and self.config.rack_map_zookeeper is None:
            return self.config.rack_map_znode
        return None

    def _start_rack_source(self) -> None:
        if self.config.rack_map_znode is not None and self.config.rack_map_zookeeper is not None:
            client = KazooClient(
                **kazoo_client_options(
                    self.settings.zookeeper, self.config.rack_map_zookeeper, inline_callbacks=True
                )
            )
            self._connect(client, self.config.rack_map_zookeeper, "watcher.rack_map_zookeeper")
            self._rack_client = client
            self._rack_reads = OrderedReads(client, self._deliver)
            self._rack_reads.marker((OP_RACK_REFRESH, "", None, None))

            def on_rack_state(state: str) -> None:
                if state == KazooState.CONNECTED and self._rack_reads is not None:
                    # kazoo dropped the one-shot watch on disconnect: read (and watch) again.
                    self._rack_reads.marker((OP_RACK_REFRESH, "", None, None))

            client.add_listener(on_rack_state)
        elif self.config.rack_map_file is not None:
            self._start_thread("bkaudit-watch-rackfile", self._rack_file_loop)

    def _rack_source_name(self) -> str:
        if self.config.rack_map_znode is not None:
            if self.config.rack_map_zookeeper is not None:
                return f"zookeeper:{self.config.rack_map_zookeeper}!{self.config.rack_map_znode}"
            return f"zookeeper:{self.config.rack_map_znode}"
        return f"file:{self.config.rack_map_file}"

    def _rack_file_loop(self) -> None:
        path = Path(self.config.rack_map_file or "")
        while not self._stopping.is_set():
            try:
                stat = path.stat()
                seen: tuple[float, int] = (stat.st_mtime, stat.st_size)
            except OSError:
                seen = (0.0, -1)
            if seen != self._rack_file_seen:
                self._rack_file_seen = seen
                data: bytes | None = None
                if seen[1] >= 0:
                    try:
                        data = path.read_bytes()
                    except OSError as err:
                        logger.warning("cannot read rack map file %s: %s", path, err.strerror)
                self._put(((OP_RACK_FILE, str(path), None, (data, int(seen[0] * 1000))), None, None))
            self._stopping.wait(self.config.rack_map_poll_s)

    # ============================================================================================ callbacks

    def _put(self, item: tuple[Any, Any, Any]) -> None:
        # Never blocks (kazoo's connection thread calls it) and never drops.
        self._queue.put(item)

    def _put_unless_busy(self, item: tuple[Any, Any, Any]) -> bool:
        """Queue ``item`` unless ``queue_size`` items already wait (for what a busy worker can skip)."""
        if self._queue.qsize() >= self.config.queue_size:
            return False
        self._queue.put(item)
        return True

    def _deliver(self, token: Any, value: Any, error: BaseException | None) -> None:
        self._put((token, value, error))

    def _on_persistent_event(self, event: WatchedEvent) -> None:
        self._put((WATCH_EVENT, event, None))

    def _on_rack_watch(self, event: WatchedEvent) -> None:
        if event.type != EventType.NONE:
            self._put((WATCH_EVENT, event, "rack"))

    def _on_state(self, state: str) -> None:
        # On kazoo's connection thread: must not block. Flags for the controller, a marker for the worker.
        self.metrics.set_session_state(str(state))
        if state == KazooState.CONNECTED:
            self._connected.set()
            reason = pb.SnapshotBegin.SESSION_EXPIRED if self._session_lost else pb.SnapshotBegin.RECONNECT
            self._session_lost = False
            if self._started:
                with self._request_lock:
                    self._readd_needed = True
                self.request_snapshot(reason)
        else:
            self._connected.clear()
            self._up_to_date = False
            self._disconnects += 1
            if state == KazooState.LOST:
                self._session_lost = True
                self.metrics.session_expirations.inc()
        with contextlib.suppress(Exception):
            self._reads.marker((OP_STATE, "", None, str(state)))

    def _on_delivered(self, kind: str, event_time_ms: int, change_time_ms: int | None) -> None:
        now = time.time()
        self.metrics.publish_lag.observe(max(0.0, now - event_time_ms / 1000.0))
        if change_time_ms is not None:
            # ZooKeeper's clock (mtime) against ours: exact on one host, as good as clock sync otherwise.
            self.metrics.change_to_ack.observe(max(0.0, now - change_time_ms / 1000.0))

    # ============================================================================================ controller

    def _controller_loop(self) -> None:
        next_periodic = self._next_periodic()
        while not self._stopping.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            if self._stopping.is_set():
                break
            if self.publisher.failed and not self._force_full:
                self.metrics.delivery_failures.inc()
                self.publisher.renew_producer_soon()  # a producer that stopped delivering stays stuck
                self.request_snapshot(pb.SnapshotBegin.PUBLISH_FAILED)
            if self.publisher.topic_lost:
                self._on_topic_lost()
            if self.publisher.stalled_for() > PRODUCER_STALL_S:
                self._on_producer_stalled()
            if next_periodic is not None and time.monotonic() >= next_periodic:
                next_periodic = self._next_periodic()
                self.request_snapshot(pb.SnapshotBegin.PERIODIC)
            if not self._connected.is_set():
                continue
            reason, readd = self._take_request()
            if readd and not self._readd_watches():
                # Disconnected again: keep both requests for the next CONNECTED.
                with self._request_lock:
                    self._readd_needed = True
                if reason is not None:
                    self.request_snapshot(reason)
                continue
            if reason is None:
                continue
            try:
                self._run_snapshot(reason)
            except Exception:
                logger.exception("snapshot scan failed; retrying")
                self.request_snapshot(reason)
                self._stopping.wait(1.0)
            next_periodic = self._next_periodic()

    def _on_topic_lost(self) -> None:
        """The changes topic lost its data (offsets went backwards): a FULL snapshot rebuilds it.

        The job detects the same loss on its side and reads the new topic from its beginning, where this
        snapshot lands; without it, everything published before the loss would be missing there.
        """
        reason = self.publisher.take_topic_lost()
        self.metrics.topic_losses.inc()
        self.publisher.renew_producer_soon()  # one that knew the old topic may never deliver to the new
        try:
            partitions = self.publisher.refresh_partitions()
        except ServiceError as err:
            logger.warning("changes topic lost its data; its partitions cannot be read yet (%s)", err)
            partitions = self.publisher.partition_count
        logger.warning(
            "changes topic %s lost its data (%s); publishing a FULL snapshot into it (%d partitions)",
            self.publisher.topic,
            reason,
            partitions,
        )
        self.request_snapshot(pb.SnapshotBegin.PUBLISH_FAILED)

    def _on_producer_stalled(self) -> None:
        """The producer owed delivery reports for PRODUCER_STALL_S: when the broker answers (the topic is
        listed), the producer is stuck (e.g. on a topic deleted and re-created): a new one, and a FULL
        snapshot for what the old one never delivered. A broker that is away is waited for."""
        stalled_s = self.publisher.stalled_for()
        self.publisher.note_progress()  # either way, look again PRODUCER_STALL_S from now
        try:
            partitions = self.publisher.refresh_partitions(timeout_s=5.0)
        except Exception as err:  # the broker is away: the producer retries
            logger.debug("Kafka owes acknowledgements for %.0f s and does not answer (%s)", stalled_s, err)
            return
        self.publisher.renew_producer_soon()
        logger.warning(
            "Kafka answers (%s, %d partitions) but acknowledged nothing for %.0f s: replacing the producer "
            "and publishing a FULL snapshot",
            self.publisher.topic,
            partitions,
            stalled_s,
        )
        self.request_snapshot(pb.SnapshotBegin.PUBLISH_FAILED)

    def _next_periodic(self) -> float | None:
        interval = self.config.reconciliation_interval_s
        return time.monotonic() + interval if interval > 0 else None

    def _readd_watches(self) -> bool:
        if self._persistent is None:
            return True  # fallback: the reconciliation scan re-arms every one-shot watch
        try:
            count = self._persistent.readd_all(timeout=max(5.0, self.settings.zookeeper.session_timeout_s))
        except (KazooException, Exception) as err:
            logger.warning("re-adding the persistent watch failed (%s); waiting for the next connection", err)
            return False
        self.metrics.watch_registrations.inc(count)
        logger.info("persistent watch re-added after reconnect")
        return True

    def _run_snapshot(self, reason: events.SnapshotReason) -> None:
        with self._request_lock:
            full = not self._full_done or self._force_full
            self._force_full = False
        if full:
            self.publisher.clear_failed()  # this FULL snapshot republishes whatever was not delivered
        mode = pb.SnapshotBegin.FULL if full else pb.SnapshotBegin.DELTA
        snapshot = Snapshot.new(reason, mode, epoch=0)
        disconnects_at_start = self._disconnects
        self.status.snapshots_started += 1
        logger.info(
            "snapshot %s (%s, %s) started", snapshot.snapshot_id[:8], snapshot.reason_name, _mode(mode)
        )
        pacer = RatePacer(
            self.config.reconciliation_reads_per_s if reason == pb.SnapshotBegin.PERIODIC else 0
        )

        def aborted() -> bool:
            return (
                self._stopping.is_set()
                or not self._connected.is_set()
                or self._disconnects != disconnects_at_start
                or not snapshot.complete
            )

        self._reads.marker((OP_BEGIN, "", None, snapshot))
        walk_timeout_s = max(30.0, self.settings.zookeeper.session_timeout_s * 2)
        walker = TreeWalker(
            self.zookeeper,
            aborted,
            on_listed=self._fallback.mark_listed if self.fallback_mode else None,
            timeout_s=walk_timeout_s,
        )
        child_watch = self._fallback.child_watch if self.fallback_mode else None
        data_watch = self._fallback.data_watch if self.fallback_mode else None

        def issue(
            op: int,
            path: str,
            extra: Any = None,
            *,
            listing: bool = False,
            watch: Callable[..., Any] | None = None,
        ) -> None:
            if not self._slots.acquire(aborted):
                raise ScanAborted("aborted while waiting for a read slot")
            pacer.wait(aborted)
            snapshot.reads_issued += 1
            self._read_counter[op].inc()
            token = (op, path, snapshot, extra)
            if listing:
                self._reads.get_children(path, token, watch=child_watch)
            else:
                self._reads.get(path, token, watch=watch or data_watch)

        # A batch holds read slots while it fills: keep it well below the slot limit.
        batch_size = (
            max(1, min(self.config.snapshot_batch_size, self._slots.limit // 2)) if self._multi_read else 1
        )
        batch: tuple[list[str], list[Any]] = ([], [])
        batch_op = OP_LEDGER

        def add_leaf(op: int, path: str, info: Any) -> None:
            nonlocal batch_op
            if batch_size == 1:
                issue(op, path, info)
                return
            if batch[0] and op != batch_op:
                flush()
            if not self._slots.acquire(aborted):
                raise ScanAborted("aborted while waiting for a read slot")
            pacer.wait(aborted)
            batch_op = op
            batch[0].append(path)
            batch[1].append(info)
            if len(batch[0]) >= batch_size:
                flush()

        def flush() -> None:
            paths, infos = batch
            if not paths:
                return
            snapshot.reads_issued += len(paths)
            self._read_counter[OP_BATCH].inc()
            self._reads.get_many(list(paths), (OP_BATCH, "", snapshot, (batch_op, list(paths), list(infos))))
            paths.clear()
            infos.clear()

        router = self._require_router()
        try:
            # Bookies first: they are what timers depend on. Listings are diffed by the worker, in order.
            for path, kind in router.bookie_dirs.items():
                issue(OP_BOOKIE_LIST, path, kind, listing=True)
            if self.fallback_mode:
                issue(OP_FALLBACK_LIST, router.ur.base, listing=True)
            issue(OP_DELAY, router.delay_path)
            self._reads.marker((OP_AUTORECOVERY, router.ur.base, None, snapshot))
            if router.rack_path is not None:
                issue(OP_RACK, router.rack_path, watch=self._on_rack_watch)

            def classify_mark(path: str) -> tuple[int, Any]:
                route, info = router.route(path)
                if route == R_MARK:
                    return NodeKind.LEAF, info
                return (NodeKind.DIRECTORY, None) if route == R_MARK_DIR else (NodeKind.SKIP, None)

            def classify_ledger(path: str) -> tuple[int, Any]:
                node = classify_path(path, self.manager, self.root)
                if node.kind is ZnodeKind.LEDGER:
                    return NodeKind.LEAF, node.ledger_id
                if node.kind is ZnodeKind.INTERMEDIATE:
                    return NodeKind.DIRECTORY, None
                if node.kind is ZnodeKind.OTHER:
                    self._note_ignored(path)
                return NodeKind.SKIP, None

            walker.walk(
                router.ur.urledgers, classify_mark, lambda p, i: add_leaf(OP_MARK, p, i), watch=child_watch
            )
            flush()
            progress_every = time.monotonic()

            def on_ledger(path: str, ledger_id: Any) -> None:
                nonlocal progress_every
                add_leaf(OP_LEDGER, path, ledger_id)
                now = time.monotonic()
                if self._progress.enabled and now - progress_every > 0.5:
                    progress_every = now
                    self._progress.update(self._progress_text(snapshot))

            walker.walk(self.root, classify_ledger, on_ledger, watch=child_watch)
            flush()
            if self._managed is not None:  # a walker of its own: no fallback child watches there
                plain = TreeWalker(self.zookeeper, aborted, timeout_s=walk_timeout_s)
                self._managed.scan(plain, lambda path, znode: issue(OP_MANAGED, path, znode))
            if not self._slots.drained(aborted):
                raise ScanAborted("aborted while waiting for the last reads")
        except ScanAborted as err:
            snapshot.fail(str(err))
        finally:
            for _ in batch[0]:  # slots taken by a batch that was never sent
                self._slots.release()
            end_token = (OP_END, self.root, None, (snapshot, disconnects_at_start))
            if snapshot.complete:
                # END is a real round trip: its completion comes after every read issued before it, including
                # the registration reads the worker issued while processing the bookie listings.
                self._reads.exists(self.root, end_token)
            else:
                self._slots.drained(lambda: self._stopping.is_set(), timeout_s=10.0)
                self._reads.marker(end_token)  # stragglers of an aborted scan are published as live reads
        while not snapshot.done.wait(0.5):
            if self._stopping.is_set():
                return
        if self._progress.enabled:
            self._progress.finish(self._progress_text(snapshot, final=True))

    def _progress_text(self, snapshot: Snapshot, *, final: bool = False) -> str:
        elapsed = max(snapshot.elapsed_s(), 1e-6)
        read = snapshot.counts.ledgers_scanned
        state = "done" if final and snapshot.complete else ("incomplete" if final else "running")
        return (
            f"snapshot {snapshot.reason_name.lower()} {state}: {read:,} ledgers read "
            f"({read / elapsed:,.0f}/s), {snapshot.counts.ledgers_published:,} published, {elapsed:,.0f} s"
        )

    def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_interval_s
        while not self._stopping.wait(interval):
            self.metrics.queue_depth.set(self._queue.qsize())
            if self._up_to_date and self._connected.is_set():
                self._put_unless_busy(
                    ((OP_HEARTBEAT, "", None, None), None, None)
                )  # a full queue means we are busy anyway

    def _autorecovery_recipe(self, router: _Router) -> AutoRecoveryRecipe:
        fallback = self.fallback_mode
        undecodable = self.metrics.undecodable
        return AutoRecoveryRecipe(
            self.zookeeper,
            router.ur,
            emit=self._emit,
            undecodable=lambda what, count: undecodable.labels(what).inc(count),
            data_watch=self._fallback.data_watch if fallback else None,
            child_watch=self._fallback.child_watch if fallback else None,
            on_read=self._read_counter[OP_AUTORECOVERY].inc,
        )

    def _bookie_registry(self) -> BookieRegistry:
        fallback = self.fallback_mode
        cookie_watch = self._fallback.data_watch if fallback else None
        undecodable = self.metrics.undecodable.labels("registration")
        return BookieRegistry(
            read_registration=lambda path, extra: self._read(OP_REGISTRATION, path, extra, None),
            read_cookie=lambda path, extra: self._read(OP_COOKIE, path, extra, cookie_watch),
            emit=self._emit,
            liveness=self._liveness,
            mark_listed=self._fallback.mark_listed if fallback else None,
            undecodable=undecodable.inc,
        )

    def _require_bookies(self) -> BookieRegistry:
        registry = self._bookies
        if registry is None:
            raise ServiceError("the watcher is not started")
        return registry

    def _require_autorecovery(self) -> AutoRecoveryRecipe:
        recipe = self._autorecovery
        if recipe is None:
            raise ServiceError("the watcher is not started")
        return recipe

    def _require_router(self) -> _Router:
        if self._router is None:
            raise ServiceError("the watcher is not started")
        return self._router

    # ============================================================================================ worker

    def _worker_loop(self) -> None:
        while True:
            try:
                if self.publisher.holding and not self.publisher.release_pending:
                    since = time.monotonic() - self._tails_released_at
                    idle_s = max(TAIL_RELEASE_IDLE_S, TAIL_RELEASE_MIN_INTERVAL_S - since)
                    first = self._queue.get(timeout=idle_s)
                else:
                    first = self._queue.get()
            except queue.Empty:
                # Nothing more to publish for now: end each partition with a one-record batch.
                self._release_tails()
                continue
            if self._process(first):
                return
            if self._pending_ledger_reads and self._change_batch_s and self._queue.empty():
                # A ledger changed after a quiet spell: let the rest of its burst gather (one sleep, no
                # wake-up per notification), so their reads go out as one multiRead and their events as
                # one batch. Other notifications (bookies, the recovery delay) are read at once. kazoo's
                # connection thread, meanwhile, reads the burst's notifications once, near the end.
                self.bursts_gathered += 1
                self._hold_zookeeper_reads(self._change_batch_s * READS_HELD_FRACTION)
                time.sleep(self._change_batch_s)
            for item in self._take_chunk():
                if self._process(item):
                    return
            self._flush_ledger_reads()
            self._require_autorecovery().flush()
            if (
                self._current is None
                and self.publisher.holding
                and not self.publisher.release_pending
                and time.monotonic() - self._tails_released_at >= TAIL_RELEASE_MAX_INTERVAL_S
            ):
                # Live changes keep coming without a pause: end the partitions' batches now and then
                # anyway, or the held records would wait for a pause (or a full hold) to become visible.
                # Not during a scan, whose stream must not be cut into small batches.
                self._release_tails()

    def _hold_zookeeper_reads(self, seconds: float) -> None:
        handler = self.zookeeper.handler
        if isinstance(handler, PollingHandler):
            handler.hold_reads_until(time.monotonic() + seconds)

    def _take_chunk(self) -> list[tuple[Any, Any, Any]]:
        """What waits in the queue now (at most ``MAX_CHUNK_ITEMS``), in order."""
        chunk: list[tuple[Any, Any, Any]] = []
        get = self._queue.get_nowait
        with contextlib.suppress(queue.Empty):
            while len(chunk) < MAX_CHUNK_ITEMS:
                chunk.append(get())
        return chunk

    def _process(self, item: tuple[Any, Any, Any]) -> bool:
        """Turn one queue item into events (or reads); True when it is the stop marker."""
        token, value, error = item
        try:
            if token in (WATCH_EVENT, FALLBACK_EVENT):
                self._on_watch_event(value, rack=error == "rack")
                return False
            op = token[0]
            if op == OP_STOP:
                return True
            self._on_item(op, token, value, error)
        except Exception:
            # Never let one bad item stop the stream; a reconciliation repairs whatever it missed.
            logger.exception("watcher worker failed on an item; scheduling a reconciliation")
            self.request_snapshot(pb.SnapshotBegin.RECONNECT)
        return False

    def _release_tails(self, *, finish: bool = False) -> None:
        """End each partition with a one-record batch without waiting here: the records before the tails
        go now, the tails when the delivery-report thread queues OP_TAILS (every earlier record acked)."""
        if not finish:
            self._tails_released_at = time.monotonic()
        try:
            if finish:
                self.publisher.finish_release_tails()
            else:
                self.publisher.start_release_tails(self._on_tails_ready)
        except KafkaTimeout:
            logger.debug("stopping with held records; stop() flushes what it can")
        except Exception:
            # The records stay held (nothing is lost); try again at the next pause.
            logger.exception("sending the held change events failed; retrying")
            self._stopping.wait(1.0)

    def _on_tails_ready(self) -> None:
        # On the delivery-report thread: must not block.
        self._put(((OP_TAILS, "", None, None), None, None))

    def _on_probe_answer(self, bookie_id: str, answered: bool, address: str, detail: str) -> None:
        # On the liveness thread: the worker publishes it, in order with the bookie's status events.
        self._put(((OP_PROBE, "", None, (bookie_id, answered, address, detail)), None, None))

    def _on_item(self, op: int, token: tuple[Any, ...], value: Any, error: Any) -> None:
        _, path, snapshot, extra = token
        if op == OP_TAILS:
            self._release_tails(finish=True)
            return
        if op == OP_HEARTBEAT:
            self._emit_heartbeats()
            return
        if op == OP_PROBE:
            self._require_bookies().publish_probe(*extra)
            return
        if op == OP_BEGIN:
            self._begin_snapshot(extra)
            return
        if op == OP_END:
            self._end_snapshot(*extra)
            return
        if op == OP_STATE:
            if extra in (KazooState.SUSPENDED, KazooState.LOST):
                self._fallback.reset()  # kazoo dropped every one-shot watch
            return
        if op == OP_RACK_FILE:
            data, version = extra
            self._apply_rack_data(data, version, present=data is not None, snapshot=None)
            return
        if op == OP_RACK_REFRESH:
            self._read_rack(None)
            return
        if op == OP_AUTORECOVERY:
            self._require_autorecovery().read(_open(extra))
            return
        try:
            if snapshot is not None and snapshot.done.is_set():
                snapshot = None  # a straggler of an ended (aborted) scan: publish like a live read
            self._on_read(op, path, snapshot, extra, value, error)
        finally:
            if token[2] is not None:
                self._slots.release(len(extra[1]) if op == OP_BATCH else 1)

    # -------------------------------------------------------------------------------------- notifications

    def _on_watch_event(self, event: WatchedEvent, *, rack: bool = False) -> None:
        router = self._require_router()
        if rack:
            self._read_rack(None)
            return
        event_type, path = event.type, event.path
        if event_type == EventType.NONE:
            return
        if self._managed is not None and self._managed.owns(path):
            self._managed.on_event(event)
            return
        route, info = router.route(path)
        if route == R_AUTORECOVERY:
            self._require_autorecovery().note_change()  # read once per chunk: a burst of lock changes
            return
        if event_type == EventType.CHILD:
            self._relist(route, path, info)
            return
        watch = self._fallback.data_watch if self.fallback_mode else None
        if event_type in (EventType.CREATED, EventType.CHANGED):
            if route == R_LEDGER:
                packed = self._ledgers.get(info)
                if packed is not None:  # seen since the current scan began: no inferred delete for it
                    self._ledgers[info] = (packed & ~_EPOCH_MASK) | self._epoch
                self._read_ledger(path, info, watch)
            elif route == R_MARK:
                packed = self._marks.get(info)
                if packed is not None:
                    self._marks[info] = (packed & ~_EPOCH_MASK) | self._epoch
                self._read(OP_MARK, path, info, watch)
            elif route == R_DELAY:
                self._read(OP_DELAY, path, None, watch)
            elif route in (R_WRITABLE, R_READONLY):
                self._require_bookies().read_registration(path, _registration_kind(route), info, None)
            elif route == R_COOKIE:  # created, or rewritten (a new instanceId or directories)
                self._require_bookies().read_cookie(path, info, None)
            elif route == R_RACK:
                self._read_rack(None)
            elif route == R_IGNORED:
                self._note_ignored(path)
        elif event_type == EventType.DELETED:
            if route == R_LEDGER:
                packed = self._ledgers.pop(info, None)
                self._emit(
                    events.ledger_deleted(
                        info, last_mzxid=(packed >> _EPOCH_BITS) if packed is not None else 0
                    ),
                    None,
                )
            elif route == R_MARK:
                packed = self._marks.pop(info, None)
                last = (packed >> _EPOCH_BITS) if packed is not None else 0
                self._emit(events.underreplication_cleared(info, last_mzxid=last), None)
            elif route in (R_DELAY, R_WRITABLE, R_READONLY, R_COOKIE):
                # Cluster-level facts share one Kafka key, so their order is the job's order: a delete must
                # not overtake the read of an earlier change (delay set to 30 s, then a bookie restarted:
                # applying the restart first would judge it by the old delay). Apply it behind a round trip.
                self._read_counter[OP_DELETE_BARRIER].inc()
                self._reads.exists(path, (OP_DELETE_BARRIER, path, None, (route, info)))
            elif route == R_RACK:
                self._read_rack(None)

    def _note_ignored(self, path: str) -> None:
        if self._ignored is not None:
            self._ignored.note(path)

    def _read(self, op: int, path: str, extra: Any, watch: Callable[..., Any] | None) -> None:
        self._read_counter[op].inc()
        self._reads.get(path, (op, path, None, extra), watch=watch)

    def _read_ledger(self, path: str, ledger_id: int, watch: Callable[..., Any] | None) -> None:
        """Read a changed ledger znode: at once (fallback mode, no multiRead), or with the other ledgers of
        this chunk of notifications in one multiRead (:meth:`_flush_ledger_reads`).

        Either way the answer reaches the queue behind the notification, so it is at least as new as the
        change; a path changed twice in one chunk is read once (the answer holds the newest version).
        """
        if watch is not None or not self._multi_read:
            self._read(OP_LEDGER, path, ledger_id, watch)
            return
        pending = self._pending_ledger_reads
        pending[path] = ledger_id
        if len(pending) >= self._live_batch_size:
            self._flush_ledger_reads()

    def _flush_ledger_reads(self) -> None:
        """Send the ledger reads gathered by :meth:`_read_ledger` (one getData, or one multiRead)."""
        pending = self._pending_ledger_reads
        if not pending:
            return
        if len(pending) == 1:
            path, ledger_id = pending.popitem()
            self._read(OP_LEDGER, path, ledger_id, None)
            return
        paths, ids = list(pending), list(pending.values())
        pending.clear()
        self._read_counter[OP_BATCH].inc()
        self._reads.get_many(paths, (OP_BATCH, "", None, (OP_LEDGER, paths, ids)))

    def _relist(self, route: int, path: str, info: Any) -> None:
        """Fallback mode: a child watch fired; list again with a new watch (the completion does the rest)."""
        if not self.fallback_mode:
            return
        self._read_counter[OP_FALLBACK_LIST].inc()
        if route == R_BOOKIE_DIR:
            self._reads.get_children(
                path, (OP_BOOKIE_LIST, path, None, info), watch=self._fallback.child_watch
            )
        elif route in (R_LEDGER_DIR, R_MARK_DIR, R_UR_BASE):
            self._reads.get_children(
                path, (OP_FALLBACK_LIST, path, None, None), watch=self._fallback.child_watch
            )

    # -------------------------------------------------------------------------------------- read results

    def _on_read(
        self, op: int, path: str, snapshot: Snapshot | None, extra: Any, value: Any, error: Any
    ) -> None:
        if op == OP_MANAGED:
            if error is None and self._managed is not None:
                self._managed.on_read(extra, value[0], value[1], snapshot)
            elif error is not None and not isinstance(error, NoNodeError) and snapshot is not None:
                snapshot.fail(f"read of {path} failed: {type(error).__name__}")
            return
        if op == OP_DELETE_BARRIER:
            # Whatever the round trip answered (the znode may already be back, or the connection lost),
            # the delete happened: apply it now. A later re-creation has its own notification and read.
            self._apply_delete(*extra)
            return
        if error is not None:
            if op == OP_REGISTRATION:
                # Gone already (its delete notification came first) or a lost read: publish what is known.
                kind, bookie_id, in_snapshot = extra
                self._require_bookies().registration_answered(kind, bookie_id, None, _open(in_snapshot))
            elif op == OP_COOKIE:  # deleted meanwhile (its delete notification applies that)
                bookie_id, in_snapshot = extra
                self._require_bookies().cookie_answered(bookie_id, None, _open(in_snapshot))
            if isinstance(error, NoNodeError):
                self._on_absent(op, path, snapshot, extra)
            else:
                # ConnectionLoss / SessionExpired: the state change that follows triggers a reconciliation.
                if snapshot is not None:
                    snapshot.fail(f"read of {path} failed: {type(error).__name__}")
                logger.debug("read of %s failed: %s", path, type(error).__name__)
            return
        if op == OP_BATCH:
            leaf_op, paths, ids = extra
            handle = self._on_ledger if leaf_op == OP_LEDGER else self._on_mark_read
            for leaf_path, leaf_id, result in zip(paths, ids, value, strict=True):
                if isinstance(result, tuple):
                    handle(leaf_path, leaf_id, result[0], result[1], snapshot)
                elif not isinstance(result, NoNodeError) and snapshot is not None:
                    snapshot.fail(f"read of {leaf_path} failed: {type(result).__name__}")
        elif op == OP_LEDGER:
            data, stat = value
            self._on_ledger(path, extra, data, stat, snapshot)
        elif op == OP_MARK:
            data, stat = value
            self._on_mark(extra, data, stat, snapshot)
        elif op == OP_DELAY:
            data, stat = value
            self._apply_delay(data, stat, snapshot)
        elif op == OP_REGISTRATION:
            data, stat = value
            kind, bookie_id, in_snapshot = extra
            self._require_bookies().registration_answered(kind, bookie_id, (data, stat), _open(in_snapshot))
        elif op == OP_COOKIE:
            data, stat = value
            bookie_id, in_snapshot = extra
            self._require_bookies().cookie_answered(bookie_id, (stat, data), _open(in_snapshot))
        elif op == OP_BOOKIE_LIST:
            self._require_bookies().on_list(path, extra, value, snapshot)
        elif op == OP_FALLBACK_LIST:
            self._on_fallback_list(path, value, snapshot)
        elif op == OP_RACK:
            if isinstance(value, tuple):
                data, stat = value
                self._apply_rack_data(data, stat.mzxid, present=True, snapshot=snapshot)
            # an exists() answer (the znode appeared or not): read it for real
            elif value is not None:
                self._read_rack(snapshot)

    def _apply_delete(self, route: int, info: Any) -> None:
        """A cluster-level znode was deleted (applied in order, see OP_DELETE_BARRIER)."""
        if route == R_DELAY:
            self._apply_delay(None, None, None)
        elif route in (R_WRITABLE, R_READONLY):
            # Reads still pending for this bookie were issued *after* the delete (the barrier's answer comes
            # after every earlier one): publish the gap now, or a quick re-registration would hide it.
            self._require_bookies().set_registration(
                info, _registration_kind(route), None, None, after_delete=True
            )
        elif route == R_COOKIE:
            self._require_bookies().set_cookie(info, False, None)

    def _on_absent(self, op: int, path: str, snapshot: Snapshot | None, extra: Any) -> None:
        if op == OP_DELAY:
            self._apply_delay(None, None, snapshot)
        elif op == OP_BOOKIE_LIST:
            self._fallback.forget_directory(path)
            self._require_bookies().on_list(path, extra, [], snapshot)
        elif op == OP_FALLBACK_LIST:
            self._fallback.forget_directory(path)
        elif op == OP_RACK:
            self._apply_rack_data(None, 0, present=False, snapshot=snapshot)
            reads = self._rack_reads or self._reads
            # Watch for the znode's creation.
            reads.exists(path, (OP_RACK, path, None, None), watch=self._on_rack_watch)
        # Ledgers, marks, registrations: the delete notification arrives (or arrived) on its own.

    def _on_ledger(
        self, path: str, ledger_id: int, data: bytes | None, stat: Any, snapshot: Snapshot | None
    ) -> None:
        if snapshot is not None:
            snapshot.counts.ledgers_scanned += 1
        packed = self._ledgers.get(ledger_id)
        self._ledgers[ledger_id] = (stat.mzxid << _EPOCH_BITS) | self._epoch
        if (
            packed is not None
            and packed >> _EPOCH_BITS == stat.mzxid
            and (snapshot is None or not snapshot.is_full)
        ):
            return  # already published this version
        payload: Any
        try:
            metadata = decode_ledger_metadata(data, znode_ctime=stat.ctime, ledger_id=ledger_id)  # type: ignore[arg-type]
            payload = events.ledger_upserted(ledger_id, metadata, stat, path)
        except FormatError as err:
            reason = events.redact_reason(str(err), data or b"")
            payload = events.ledger_undecodable(ledger_id, path, stat, reason)
            self.metrics.undecodable.labels("ledger").inc()
            if snapshot is not None:
                snapshot.counts.ledgers_undecodable += 1
        if snapshot is not None:
            snapshot.counts.ledgers_published += 1
        self._emit(payload, snapshot)

    def _on_mark_read(
        self, _path: str, ledger_id: int, data: bytes | None, stat: Any, snapshot: Snapshot | None
    ) -> None:
        self._on_mark(ledger_id, data, stat, snapshot)

    def _on_mark(self, ledger_id: int, data: bytes | None, stat: Any, snapshot: Snapshot | None) -> None:
        packed = self._marks.get(ledger_id)
        self._marks[ledger_id] = (stat.mzxid << _EPOCH_BITS) | self._epoch
        if (
            packed is not None
            and packed >> _EPOCH_BITS == stat.mzxid
            and (snapshot is None or not snapshot.is_full)
        ):
            return
        try:
            mark = parse_underreplicated_ledger(data or b"")
            payload = events.underreplication_set(ledger_id, mark, stat)
        except FormatError as err:
            self.metrics.undecodable.labels("underreplication_mark").inc()
            payload = events.underreplication_set(
                ledger_id, None, stat, error=events.redact_reason(str(err), data or b"")
            )
        if snapshot is not None:
            snapshot.counts.marks_published += 1
        self._emit(payload, snapshot)

    def _apply_delay(self, data: bytes | None, stat: Any, snapshot: Snapshot | None) -> None:
        present = stat is not None
        state = (stat.mzxid if present else 0, present)
        if state == self._delay and (snapshot is None or not snapshot.is_full):
            return
        self._delay = state
        seconds: int | None = None
        error = ""
        if present:
            try:
                seconds = parse_lost_bookie_recovery_delay(data or b"")
            except FormatError as err:
                self.metrics.undecodable.labels("recovery_delay").inc()
                error = events.redact_reason(str(err), data or b"")
        self._emit(events.recovery_delay(seconds, present=present, stat=stat, error=error), snapshot)

    # -------------------------------------------------------------------------------------- bookies

    def _on_fallback_list(self, path: str, children: list[str], snapshot: Snapshot | None) -> None:
        """Fallback mode: a directory listed with a child watch; read what is new, list new subdirectories."""
        router = self._require_router()
        self._fallback.mark_listed(path)
        watch = self._fallback.data_watch
        prefix = path if path.endswith("/") else path + "/"
        for name in children:
            child = prefix + name
            route, info = router.route(child)
            if route == R_LEDGER:
                if info not in self._ledgers:
                    self._read(OP_LEDGER, child, info, watch)
            elif route == R_MARK:
                if info not in self._marks:
                    self._read(OP_MARK, child, info, watch)
            elif route == R_DELAY:
                if self._delay is None or not self._delay[1]:
                    self._read(OP_DELAY, child, None, watch)
            elif route == R_IGNORED:
                self._note_ignored(child)
            elif route in (
                R_LEDGER_DIR,
                R_MARK_DIR,
                R_UR_BASE,
                R_BOOKIE_DIR,
            ) and self._fallback.claim_directory(child):
                self._relist(route, child, info)

    # -------------------------------------------------------------------------------------- rack map

    def _read_rack(self, snapshot: Snapshot | None) -> None:
        path = self.config.rack_map_znode
        if path is None:
            return
        reads = self._rack_reads or self._reads
        self._read_counter[OP_RACK].inc()
        reads.get(path, (OP_RACK, path, None, None), watch=self._on_rack_watch)

    def _apply_rack_data(
        self, data: bytes | None, version: int, *, present: bool, snapshot: Snapshot | None
    ) -> None:
        source = self._rack_source_name()
        state = (present, version, data)
        if state == self._rack_published and (snapshot is None or not snapshot.is_full):
            return
        self._rack_published = state
        if not present:
            payload = events.rack_map_event(source, None, present=False, source_version=version)
        else:
            try:
                payload = events.rack_map_event(
                    source, parse_rack_map(data or b""), present=True, source_version=version
                )
            except FormatError as err:
                self.metrics.undecodable.labels("rack_map").inc()
                logger.warning("rack map %s does not parse: %s", source, err)
                payload = events.rack_map_event(
                    source, None, present=True, error=str(err)[:300], source_version=version
                )
        self._rack_payload = payload
        self._emit(payload, snapshot)

    # -------------------------------------------------------------------------------------- snapshots

    def _begin_snapshot(self, snapshot: Snapshot) -> None:
        # A new epoch: every index entry the scan (or a live event) touches gets it; at a complete END,
        # entries still carrying an older epoch were neither in ZooKeeper nor changed since: they vanished.
        self._epoch = (self._epoch + 1) & _EPOCH_MASK
        snapshot.epoch = self._epoch
        if self._managed is not None:
            self._managed.epoch = self._epoch
        self._current = snapshot
        with self._status_lock:
            self.status.last_snapshot = snapshot
        self._emit_everywhere(
            lambda p, n: events.snapshot_begin(
                snapshot.snapshot_id, snapshot.reason, snapshot.mode, partition=p, partition_count=n
            ),
            snapshot,
        )

    def _end_snapshot(self, snapshot: Snapshot, disconnects_at_start: int) -> None:
        if snapshot.complete:
            self._infer_deletions(snapshot)
            if self._managed is not None:
                self._managed.infer_deletions(snapshot)
            if snapshot.is_full:
                self._require_bookies().publish_all(snapshot)
                if self._rack_payload is not None and self._require_router().rack_path is None:
                    # A rack map not read by the scan (file, other ZooKeeper): restate it inside the bracket.
                    self._emit(self._rack_payload, snapshot)
        duration_ms = int(snapshot.elapsed_s() * 1000)
        counts = snapshot.counts
        partition_events = dict(snapshot.partition_events)
        self._emit_everywhere(
            lambda p, n: events.snapshot_end(
                snapshot.snapshot_id,
                snapshot.mode,
                complete=snapshot.complete,
                partition=p,
                partition_count=n,
                partition_events=partition_events.get(p, 0),
                counts=counts,
                duration_ms=duration_ms,
            ),
            snapshot,
        )
        self._current = None
        reason = snapshot.reason_name
        outcome = "complete" if snapshot.complete else "incomplete"
        self.metrics.snapshots.labels(reason, outcome).inc()
        self.metrics.snapshot_duration.labels(reason).set(duration_ms / 1000.0)
        self.metrics.snapshot_ledgers.labels(reason).set(counts.ledgers_scanned)
        self.metrics.snapshot_published.labels(reason).set(sum(partition_events.values()))
        self.metrics.ledgers_tracked.set(len(self._ledgers))
        if snapshot.complete:
            if snapshot.is_full:
                self._full_done = True
            if self._disconnects == disconnects_at_start and self._connected.is_set():
                self._up_to_date = True
            logger.info(
                "snapshot %s (%s) complete: %d ledgers read, %d published, %d deleted, %d undecodable, "
                "%.1f s",
                snapshot.snapshot_id[:8],
                reason,
                counts.ledgers_scanned,
                counts.ledgers_published,
                counts.ledgers_deleted,
                counts.ledgers_undecodable,
                duration_ms / 1000.0,
            )
        else:
            logger.warning(
                "snapshot %s (%s) incomplete: %s", snapshot.snapshot_id[:8], reason, snapshot.failure
            )
        with self._status_lock:
            if snapshot.complete:
                self.status.snapshots_completed += 1
            else:
                self.status.snapshots_incomplete += 1
            self.status.up_to_date = self._up_to_date
            self._status_lock.notify_all()
        snapshot.done.set()

    def _infer_deletions(self, snapshot: Snapshot) -> None:
        epoch = self._epoch
        gone = [lid for lid, packed in self._ledgers.items() if packed & _EPOCH_MASK != epoch]
        for ledger_id in gone:
            packed = self._ledgers.pop(ledger_id)
            snapshot.counts.ledgers_deleted += 1
            self._emit(
                events.ledger_deleted(ledger_id, last_mzxid=packed >> _EPOCH_BITS, inferred=True), snapshot
            )
        cleared = [lid for lid, packed in self._marks.items() if packed & _EPOCH_MASK != epoch]
        for ledger_id in cleared:
            packed = self._marks.pop(ledger_id)
            self._emit(
                events.underreplication_cleared(ledger_id, last_mzxid=packed >> _EPOCH_BITS, inferred=True),
                snapshot,
            )
        if gone or cleared:
            logger.info(
                "reconciliation: %d ledgers and %d under-replication marks vanished while unwatched",
                len(gone),
                len(cleared),
            )

    # -------------------------------------------------------------------------------------- emitting

    def _emit(self, payload: events.Payload, snapshot: Snapshot | None) -> None:
        builder = self._builder
        assert builder is not None
        event = builder.build(payload, snapshot_id=snapshot.snapshot_id if snapshot is not None else "")
        change_time_ms = None
        if snapshot is None and isinstance(payload, pb.LedgerUpserted):
            change_time_ms = payload.znode.mtime_ms
        partition = self.publisher.publish(event, change_time_ms=change_time_ms)
        if snapshot is not None:
            snapshot.partition_events[partition] += 1
        self._published_counter(event).inc()
        self.status.events_published += 1

    def _published_counter(self, event: pb.ChangeEvent) -> Any:
        kind = events.payload_type(event)
        counter = self._event_counters.get(kind)
        if counter is None:
            counter = self._event_counters[kind] = self.metrics.events_published.labels(kind)
        return counter

    def _emit_everywhere(self, make: Callable[[int, int], events.Payload], snapshot: Snapshot | None) -> None:
        builder = self._builder
        assert builder is not None
        count = self.publisher.partition_count
        for partition in range(count):
            payload = make(partition, count)
            event = builder.build(payload, snapshot_id=snapshot.snapshot_id if snapshot is not None else "")
            self.publisher.publish(event, partition=partition)
            self._published_counter(event).inc()
            self.status.events_published += 1

    def _emit_heartbeats(self) -> None:
        if not self._up_to_date or not self._connected.is_set():
            return
        builder = self._builder
        assert builder is not None
        now_ms = builder.now_ms()
        last_zxid = int(getattr(self.zookeeper, "last_zxid", 0) or 0)
        count = self.publisher.partition_count
        for partition in range(count):
            event = builder.build(
                events.heartbeat(now_ms, partition=partition, partition_count=count, last_zxid=last_zxid),
                event_time_ms=now_ms,
            )
            self.publisher.publish(event, partition=partition)
        self.metrics.events_published.labels("heartbeat").inc(count)
        self.status.events_published += count
        self.metrics.last_heartbeat.set(now_ms / 1000.0)


def _open(snapshot: Snapshot | None) -> Snapshot | None:
    """The snapshot if its bracket is still open (results after END are published as live ones)."""
    return snapshot if snapshot is not None and not snapshot.done.is_set() else None


def _registration_kind(route: int) -> RegistrationKind:
    return RegistrationKind.WRITABLE if route == R_WRITABLE else RegistrationKind.READONLY


def _mode(mode: int) -> str:
    return str(pb.SnapshotBegin.Mode.Name(mode))


__all__ = [
    "ChangeWatcher",
    "WatcherMetrics",
    "WatcherStatus",
    "kazoo_client_options",
    "start_client",
    "unreadable_znode",
]
