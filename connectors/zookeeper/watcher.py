"""``bkaudit watch``: BookKeeper's ZooKeeper metadata as a complete, ordered change stream on Kafka.

:class:`ChangeWatcher` is the session; what each part of the tree means is a recipe it owns, the way kazoo
layers recipes over its client (details in ``docs/watcher.md``):

* **The session** (this module). Connects (:mod:`connectors.zookeeper.client`), reads the cluster's id and
  ledger manager, adds the persistent recursive watch (AddWatch) *before* the snapshot scan and again after
  every reconnect (servers without AddWatch get :mod:`connectors.zookeeper.fallback_watch`), and runs the
  snapshot scans: a FULL one at start, after a delivery failure or into a lost topic, a reconciliation
  after a reconnect, a session expiry or periodically.
* **One ordered stream.** Every watch notification, every read completion
  (:class:`~connectors.zookeeper.ordered_reads.OrderedReads`) and every marker is handed, as kazoo's
  connection thread receives it, to one FIFO (kazoo's callbacks run inline:
  :class:`~connectors.zookeeper.handler.PollingHandler`), in ZooKeeper's order for the session; one worker
  thread routes each item to its recipe in that order. A CREATED/CHANGED notification triggers a read; the
  event is emitted when the read's completion is dequeued.
* **Recipes.** The ledger tree (:mod:`~connectors.zookeeper.ledger_tree`: ledgers, marks, the compact
  index, inferred deletions), the bookie registry (:mod:`~connectors.zookeeper.bookies`), AutoRecovery's
  znodes and the recovery delay (:mod:`~connectors.zookeeper.autorecovery`), the rack map
  (:mod:`~connectors.zookeeper.rack_map`), Pulsar's managed ledgers
  (:mod:`~connectors.zookeeper.managed_ledgers`). Each is given the session's reads and the emitter.
* **The emitter** (:mod:`~connectors.zookeeper.emitter`): events to
  :class:`~connectors.kafka.publisher.ChangePublisher` (keyed by entity, back-pressure instead of drops);
  a delivery failure makes the session publish a FULL snapshot.

Example:
    >>> router = _Router("/ledgers", LedgerManagerType.HIERARCHICAL, None)
    >>> router.route("/ledgers/00/0000/L0007"), router.route("/ledgers/available/bk1:3181")
    ((1, 7), (7, 'bk1:3181'))
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
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
from connectors.zookeeper.autorecovery import OP_DELAY, AutoRecoveryRecipe, RecoveryDelay
from connectors.zookeeper.bookies import BookieRegistry
from connectors.zookeeper.client import kazoo_client_options, start_client, unreadable_znode
from connectors.zookeeper.emitter import Emitter
from connectors.zookeeper.fallback_watch import FALLBACK_EVENT, FallbackWatches
from connectors.zookeeper.handler import PollingHandler
from connectors.zookeeper.ledger_tree import (
    IGNORED_ZNODE_REASONS,
    OP_LEDGER,
    OP_MARK,
    IgnoredZnodes,
    LedgerTree,
    node_of_mark,
)
from connectors.zookeeper.managed_ledgers import ManagedLedgerRecipe
from connectors.zookeeper.ordered_reads import OrderedReads
from connectors.zookeeper.persistent_watch import PersistentWatches
from connectors.zookeeper.rack_map import OP_RACK, OP_RACK_FILE, OP_RACK_REFRESH, RackMapSource
from connectors.zookeeper.snapshot import (
    EPOCH_MASK,
    OP_BATCH,
    NodeKind,
    ProgressLine,
    RatePacer,
    ReadSlots,
    ScanAborted,
    ScanReads,
    Snapshot,
    TreeWalker,
)
from core import events
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
    parse_layout,
    readonly_path,
    validate_root,
)
from core.domain.registration import RegistrationKind, parse_registration_path
from core.domain.underreplication import CtimeZnode, UnderreplicationPaths
from core.errors import ConfigError, FormatError, ServiceError
from core.metrics_http import serve_metrics
from core.pb import change_events_pb2 as pb
from core.settings import Settings
from core.threadnames import named_target

logger = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------------------ metrics


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
_DIRECTORIES = (R_LEDGER_DIR, R_MARK_DIR, R_UR_BASE, R_BOOKIE_DIR)  # listed with a child watch (fallback)


class _Router:
    """Tells what a znode path is for the watcher (ledger, mark, bookie node, directory of interest...)."""

    def __init__(self, root: str, manager: LedgerManagerType, rack_path: str | None) -> None:
        self.root = root
        self.manager = manager
        self.prefix = root + "/"
        self.ur = UnderreplicationPaths(root)
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
            return self._route_bookie(path)
        if first == UNDERREPLICATION_NODE:
            return self._route_underreplication(path, tail)
        node = classify_path(path, self.manager, self.root)
        if node.kind is ZnodeKind.LEDGER:
            return R_LEDGER, node.ledger_id
        if node.kind is ZnodeKind.INTERMEDIATE:
            return R_LEDGER_DIR, None
        if node.kind is ZnodeKind.OTHER:
            return R_IGNORED, None
        return R_OTHER, None

    def _route_bookie(self, path: str) -> tuple[int, Any]:
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

    def _route_underreplication(self, path: str, tail: str) -> tuple[int, Any]:
        if not tail:
            return R_UR_BASE, None
        if path == self.delay_path:
            return R_DELAY, None
        if path in self.autorecovery_nodes or self._in_autorecovery_dir(path):
            return R_AUTORECOVERY, None
        if path == self.ur.urledgers:
            return R_MARK_DIR, None
        kind, ledger_id = node_of_mark(path, self.root)
        if kind == NodeKind.LEAF:
            return R_MARK, ledger_id
        return (R_MARK_DIR, None) if kind == NodeKind.DIRECTORY else (R_OTHER, None)


# ------------------------------------------------------------------------------------------------ worker

# FIFO items are (token, value, error): a notification (WATCH_EVENT or FALLBACK_EVENT, the event, None), or a
# read's answer or a marker with the token (op, path, snapshot or None, extra). A snapshot in the token means
# the read holds a read slot (released when processed) and its result belongs to that snapshot. The ops of
# reads are also their label in the reads metric; the recipes name their own (OP_LEDGER, OP_RACK, ...).
OP_REGISTRATION = "registration"
OP_COOKIE = "cookie"  # extra = (bookie id, snapshot or None)
OP_BOOKIE_LIST = "bookie_list"
OP_FALLBACK_LIST = "fallback_list"
# A round trip (exists) issued for a deleted cluster-level znode: its answer comes after every read issued
# before it, so the delete is applied in ZooKeeper's order relative to them. extra = the delete to apply.
OP_DELETE_BARRIER = "delete_barrier"
OP_AUTORECOVERY = "autorecovery"  # a marker: read AutoRecovery's znodes now (extra = the snapshot, or None)
OP_MANAGED = "managed_ledger"  # a managed-ledger or cursor znode's read (extra = (name, cursor))
_READ_OPS = (
    *(OP_LEDGER, OP_MARK, OP_DELAY, OP_REGISTRATION, OP_COOKIE, OP_BOOKIE_LIST, OP_RACK, OP_FALLBACK_LIST),
    *(OP_BATCH, OP_DELETE_BARRIER, OP_AUTORECOVERY, OP_MANAGED),
)
# Markers, answered by nobody but the FIFO's order.
OP_BEGIN, OP_END, OP_STATE, OP_HEARTBEAT, OP_STOP = "begin", "end", "state", "heartbeat", "stop"
OP_TAILS = "tails"  # from the delivery-report thread: the held tails can go out alone now
OP_PROBE = "probe"  # a liveness probe's answer (extra = bookie id, answered, address, detail)
WATCH_EVENT = "watch-event"
#: Of the worker's gathering sleep, the part during which kazoo's connection thread leaves the burst's
#: notifications in the socket: it wakes once to read them all, and has handed them over when the worker
#: wakes.
READS_HELD_FRACTION = 0.75
#: Queue items the worker takes at once (a chunk): the ledger reads its notifications trigger go out together.
MAX_CHUNK_ITEMS = 1000

_RECONNECT_REASONS = (pb.SnapshotBegin.RECONNECT, pb.SnapshotBegin.SESSION_EXPIRED)


@dataclasses.dataclass
class WatcherStatus:
    """What the watcher has done so far (for tests, the CLI and logs).

    Example:
        >>> WatcherStatus().snapshots_completed
        0
    """

    snapshots_completed: int = 0
    mode: str = ""


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

    # The recipes and the emitter, built by start() once the cluster and the watch mode are known.
    _emitter: Emitter
    _router: _Router
    _tree: LedgerTree
    _bookies: BookieRegistry
    _autorecovery: AutoRecoveryRecipe
    _delay: RecoveryDelay
    _rack: RackMapSource
    _markers: dict[str, Callable[[Any], None]]

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
        self._clients = [self.zookeeper]  # every session opened, closed by stop()
        # Unbounded: ZooKeeper's notifications and answers are handed in by kazoo's connection thread, which
        # must not block (kazoo's own callback queue, which this replaces, was unbounded too). The bound
        # (queue_size) holds back the heartbeats only.
        self._queue: queue.SimpleQueue[tuple[Any, Any, Any]] = queue.SimpleQueue()
        self._tails_released_at = 0.0  # monotonic time of the last release of held records
        self._reads = OrderedReads(self.zookeeper, self._deliver)
        self._slots = ReadSlots(self.config.snapshot_concurrency)
        self._fallback = FallbackWatches(self._put)
        self._persistent: PersistentWatches | None = None
        self._managed: ManagedLedgerRecipe | None = None  # Pulsar's /managed-ledgers (settings.pulsar)
        self.fallback_mode = False
        self._data_watch: Callable[..., Any] | None = None  # the fallback's one-shot watches, else None
        self._child_watch: Callable[..., Any] | None = None
        self._multi_read = False
        self._change_batch_s = self.config.change_batch_ms / 1000
        self.bursts_gathered = 0  # ledger bursts the worker let gather (its own decisions, for tests)
        self.manager = LedgerManagerType.HIERARCHICAL
        self.cluster = ""
        self._epoch = 0
        self._current: Snapshot | None = None  # the scan whose bracket is open (worker thread)
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
        self._read_counter = {op: self.metrics.zookeeper_reads.labels(op) for op in _READ_OPS}
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
            self._close_clients()
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
        self._connect(self.zookeeper, self.settings.zookeeper.connect, "zookeeper.connect")
        self._connected.set()
        self.metrics.set_session_state("CONNECTED")
        self._detect_cluster()
        self._emitter = Emitter(
            self.publisher, events.EventBuilder(self.cluster, self.run_id), self.metrics.events_published
        )
        self.publisher.start()
        self.zookeeper.add_listener(self._on_state)
        if self.settings.pulsar.follow_managed_ledgers:
            self._managed = ManagedLedgerRecipe(
                self.settings.pulsar.managed_ledgers_path,
                read=lambda path, znode: self._read(OP_MANAGED, path, znode, None),
                emit=self._emitter.emit,
            )
        self._choose_watch_mode()
        self._build_recipes()
        self.metrics.unacked_events.set_function(lambda: self.publisher.unacked)
        self._start_thread("bkaudit-watch-worker", self._worker_loop)
        self._rack.start(self._open_client, self._deliver, self._start_thread, self._stopping)
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

    def _build_recipes(self) -> None:
        """The recipes, on this session's reads and the emitter (after the cluster and watch mode)."""
        emit, undecodable, fallback = self._emitter.emit, self.metrics.undecodable, self.fallback_mode
        self._rack = RackMapSource(
            self.config,
            self._reads,
            put=self._put,
            emit=emit,
            undecodable=undecodable.labels("rack_map").inc,
            count=self._read_counter[OP_RACK].inc,
        )
        self._router = _Router(self.root, self.manager, self._rack.session_path)
        # multiRead (ZooKeeper >= 3.6) batches reads; the fallback needs a watch per read instead.
        self._multi_read = (
            not fallback and self.config.snapshot_batch_size > 1 and self._reads.supports_multi_read()
        )
        self._tree = LedgerTree(
            self.root,
            self.manager,
            read=self._read,
            read_many=self._read_many,
            emit=emit,
            undecodable=lambda kind: undecodable.labels(kind).inc(),
            ignored=IgnoredZnodes(self.metrics.ignored_znodes, self.root, self.manager),
            multi_read=self._multi_read,
            live_batch_size=self.config.snapshot_batch_size,
        )
        self._delay = RecoveryDelay(emit=emit, undecodable=undecodable.labels("recovery_delay").inc)
        self._autorecovery = AutoRecoveryRecipe(
            self.zookeeper,
            self._router.ur,
            emit=emit,
            undecodable=lambda what, count: undecodable.labels(what).inc(count),
            data_watch=self._data_watch,
            child_watch=self._child_watch,
            on_read=self._read_counter[OP_AUTORECOVERY].inc,
        )
        self._bookies = BookieRegistry(
            read_registration=lambda path, extra: self._read(OP_REGISTRATION, path, extra, None),
            read_cookie=lambda path, extra: self._read(OP_COOKIE, path, extra, self._data_watch),
            emit=emit,
            liveness=self._liveness,
            mark_listed=self._fallback.mark_listed if fallback else None,
            undecodable=undecodable.labels("registration").inc,
        )
        self._markers = self._marker_handlers()

    def _marker_handlers(self) -> dict[str, Callable[[Any], None]]:
        """What the worker does with each marker's ``extra``."""
        return {
            OP_TAILS: lambda _: self._release_tails(finish=True),
            OP_HEARTBEAT: lambda _: self._emit_heartbeats(),
            OP_PROBE: lambda probe: self._bookies.publish_probe(*probe),
            OP_BEGIN: self._begin_snapshot,
            OP_END: lambda end: self._end_snapshot(*end),
            OP_STATE: self._on_state_marker,
            OP_RACK_FILE: self._rack.on_file,
            OP_RACK_REFRESH: lambda _: self._rack.read(),
            OP_AUTORECOVERY: lambda snapshot: self._autorecovery.read(_open(snapshot)),
        }

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
        self._stop_worker(deadline)
        self._close_clients()
        self.publisher.close(max(1.0, deadline - time.monotonic()))
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        published = self._emitter.published if self._started else 0
        logger.info("watcher stopped (%d events published)", published)

    def _stop_worker(self, deadline: float) -> None:
        worker = next((t for t in self._threads if t.name == "bkaudit-watch-worker"), None)
        if worker is None:
            return
        # The stop marker goes behind everything kazoo has already delivered.
        with contextlib.suppress(Exception):
            self._reads.marker((OP_STOP, "", None, None))
        worker.join(max(0.1, deadline - time.monotonic()))
        if worker.is_alive():
            self.publisher.abort()
            self._put(((OP_STOP, "", None, None), None, None))
            worker.join(5.0)

    def _close_clients(self) -> None:
        for client in reversed(self._clients):
            with contextlib.suppress(Exception):
                client.stop()
                client.close()

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

    def _open_client(self, hosts: str, setting: str) -> KazooClient:
        """Another session, with this one's credentials (a recipe's own ZooKeeper); closed by stop()."""
        client = KazooClient(**kazoo_client_options(self.settings.zookeeper, hosts, inline_callbacks=True))
        self._connect(client, hosts, setting)
        self._clients.append(client)
        return client

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
        if self.fallback_mode:
            self._data_watch, self._child_watch = self._fallback.data_watch, self._fallback.child_watch
        self.status.mode = "fallback" if self.fallback_mode else "persistent"

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
            self._check_publisher()
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

    def _check_publisher(self) -> None:
        """A failed delivery, a lost topic or a stalled producer: a FULL snapshot republishes the state."""
        if self.publisher.failed and not self._force_full:
            self.metrics.delivery_failures.inc()
            self.publisher.renew_producer_soon()  # a producer that stopped delivering stays stuck
            self.request_snapshot(pb.SnapshotBegin.PUBLISH_FAILED)
        if self.publisher.topic_lost:
            self._on_topic_lost()
        if self.publisher.stalled_for() > PRODUCER_STALL_S:
            self._on_producer_stalled()

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

    # ============================================================================================ snapshots

    def _run_snapshot(self, reason: events.SnapshotReason) -> None:
        """One scan: BEGIN, every recipe's reads, END behind the last answer; waits for the worker's END."""
        snapshot = self._new_snapshot(reason)
        disconnects_at_start = self._disconnects

        def aborted() -> bool:
            return (
                self._stopping.is_set()
                or not self._connected.is_set()
                or self._disconnects != disconnects_at_start
                or not snapshot.complete
            )

        self._reads.marker((OP_BEGIN, "", None, snapshot))
        reads = ScanReads(
            self._reads,
            snapshot,
            self._slots,
            RatePacer(self.config.reconciliation_reads_per_s if reason == pb.SnapshotBegin.PERIODIC else 0),
            aborted,
            batch_size=self.config.snapshot_batch_size if self._multi_read else 1,
            count=lambda op: self._read_counter[op].inc(),
            child_watch=self._child_watch,
            data_watch=self._data_watch,
        )
        try:
            self._scan(reads)
        except ScanAborted as err:
            snapshot.fail(str(err))
        finally:
            reads.release_unsent()
            self._send_end(snapshot, disconnects_at_start)
        while not snapshot.done.wait(0.5):
            if self._stopping.is_set():
                return
        if self._progress.enabled:
            self._progress.finish(self._progress_text(snapshot, final=True))

    def _new_snapshot(self, reason: events.SnapshotReason) -> Snapshot:
        with self._request_lock:
            full = not self._full_done or self._force_full
            self._force_full = False
        if full:
            self.publisher.clear_failed()  # this FULL snapshot republishes whatever was not delivered
        mode = pb.SnapshotBegin.FULL if full else pb.SnapshotBegin.DELTA
        snapshot = Snapshot.new(reason, mode, epoch=0)
        logger.info(
            "snapshot %s (%s, %s) started", snapshot.snapshot_id[:8], snapshot.reason_name, _mode(mode)
        )
        return snapshot

    def _scan(self, reads: ScanReads) -> None:
        """Issue the scan's reads, recipe by recipe; the worker publishes the answers in order."""
        router = self._router
        # Bookies first: they are what timers depend on. Listings are diffed by the worker, in order.
        for path, kind in router.bookie_dirs.items():
            reads.listing(OP_BOOKIE_LIST, path, kind)
        if self.fallback_mode:
            reads.listing(OP_FALLBACK_LIST, router.ur.base)
        reads.read(OP_DELAY, router.delay_path)
        self._reads.marker((OP_AUTORECOVERY, router.ur.base, None, reads.snapshot))
        self._rack.scan(reads)
        timeout_s = max(30.0, self.settings.zookeeper.session_timeout_s * 2)
        on_listed = self._fallback.mark_listed if self.fallback_mode else None
        walker = TreeWalker(self.zookeeper, reads.aborted, on_listed=on_listed, timeout_s=timeout_s)
        self._tree.scan(walker, reads, self._progress_tick(reads.snapshot))
        if self._managed is not None:  # a walker of its own: no fallback child watches there
            plain = TreeWalker(self.zookeeper, reads.aborted, timeout_s=timeout_s)
            self._managed.scan(plain, lambda path, znode: reads.read(OP_MANAGED, path, znode))
        if not self._slots.drained(reads.aborted):
            raise ScanAborted("aborted while waiting for the last reads")

    def _send_end(self, snapshot: Snapshot, disconnects_at_start: int) -> None:
        end_token = (OP_END, self.root, None, (snapshot, disconnects_at_start))
        if snapshot.complete:
            # END is a real round trip: its completion comes after every read issued before it, including
            # the registration reads the worker issued while processing the bookie listings.
            self._reads.exists(self.root, end_token)
        else:
            self._slots.drained(lambda: self._stopping.is_set(), timeout_s=10.0)
            self._reads.marker(end_token)  # stragglers of an aborted scan are published as live reads

    def _progress_tick(self, snapshot: Snapshot) -> Callable[[], None]:
        """What the ledger walk calls per ledger: the progress line, at most every 0.5 s."""
        if not self._progress.enabled:
            return lambda: None
        shown = [time.monotonic()]

        def tick() -> None:
            now = time.monotonic()
            if now - shown[0] > 0.5:
                shown[0] = now
                self._progress.update(self._progress_text(snapshot))

        return tick

    def _progress_text(self, snapshot: Snapshot, *, final: bool = False) -> str:
        elapsed = max(snapshot.elapsed_s(), 1e-6)
        read = snapshot.counts.ledgers_scanned
        state = "done" if final and snapshot.complete else ("incomplete" if final else "running")
        return (
            f"snapshot {snapshot.reason_name.lower()} {state}: {read:,} ledgers read "
            f"({read / elapsed:,.0f}/s), {snapshot.counts.ledgers_published:,} published, {elapsed:,.0f} s"
        )

    def _begin_snapshot(self, snapshot: Snapshot) -> None:
        # A new epoch: every index entry the scan (or a live event) touches gets it; at a complete END,
        # entries still carrying an older epoch were neither in ZooKeeper nor changed since: they vanished.
        self._epoch = (self._epoch + 1) & EPOCH_MASK
        snapshot.epoch = self._tree.epoch = self._epoch
        if self._managed is not None:
            self._managed.epoch = self._epoch
        self._current = snapshot
        self._emitter.emit_everywhere(
            lambda p, n: events.snapshot_begin(
                snapshot.snapshot_id, snapshot.reason, snapshot.mode, partition=p, partition_count=n
            ),
            snapshot,
        )

    def _end_snapshot(self, snapshot: Snapshot, disconnects_at_start: int) -> None:
        if snapshot.complete:
            self._tree.infer_deletions(snapshot)
            if self._managed is not None:
                self._managed.infer_deletions(snapshot)
            if snapshot.is_full:
                self._bookies.publish_all(snapshot)
                self._rack.restate(snapshot)
        duration_ms = int(snapshot.elapsed_s() * 1000)
        partition_events = dict(snapshot.partition_events)
        self._emitter.emit_everywhere(
            lambda p, n: events.snapshot_end(
                snapshot.snapshot_id,
                snapshot.mode,
                complete=snapshot.complete,
                partition=p,
                partition_count=n,
                partition_events=partition_events.get(p, 0),
                counts=snapshot.counts,
                duration_ms=duration_ms,
            ),
            snapshot,
        )
        self._current = None
        self._record_snapshot(snapshot, duration_ms, sum(partition_events.values()))
        if snapshot.complete:
            if snapshot.is_full:
                self._full_done = True
            if self._disconnects == disconnects_at_start and self._connected.is_set():
                self._up_to_date = True
        with self._status_lock:
            self.status.snapshots_completed += int(snapshot.complete)
            self._status_lock.notify_all()
        snapshot.done.set()

    def _record_snapshot(self, snapshot: Snapshot, duration_ms: int, published: int) -> None:
        """The scan's metrics and its log line."""
        reason, counts = snapshot.reason_name, snapshot.counts
        outcome = "complete" if snapshot.complete else "incomplete"
        self.metrics.snapshots.labels(reason, outcome).inc()
        self.metrics.snapshot_duration.labels(reason).set(duration_ms / 1000.0)
        self.metrics.snapshot_ledgers.labels(reason).set(counts.ledgers_scanned)
        self.metrics.snapshot_published.labels(reason).set(published)
        self.metrics.ledgers_tracked.set(len(self._tree.ledgers))
        if not snapshot.complete:
            logger.warning(
                "snapshot %s (%s) incomplete: %s", snapshot.snapshot_id[:8], reason, snapshot.failure
            )
            return
        logger.info(
            "snapshot %s (%s) complete: %d ledgers read, %d published, %d deleted, %d undecodable, %.1f s",
            snapshot.snapshot_id[:8],
            reason,
            counts.ledgers_scanned,
            counts.ledgers_published,
            counts.ledgers_deleted,
            counts.ledgers_undecodable,
            duration_ms / 1000.0,
        )

    def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_interval_s
        while not self._stopping.wait(interval):
            self.metrics.queue_depth.set(self._queue.qsize())
            if self._up_to_date and self._connected.is_set():
                # A full queue means the worker is busy anyway: skip this one.
                self._put_unless_busy(((OP_HEARTBEAT, "", None, None), None, None))

    def _emit_heartbeats(self) -> None:
        if not self._up_to_date or not self._connected.is_set():
            return
        now_ms = self._emitter.heartbeats(int(getattr(self.zookeeper, "last_zxid", 0) or 0))
        self.metrics.last_heartbeat.set(now_ms / 1000.0)

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
            if self._tree.pending_reads and self._change_batch_s and self._queue.empty():
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
            self._tree.flush_reads()
            self._autorecovery.flush()
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
                self._on_watch_event(value)
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

    def _on_state_marker(self, state: str) -> None:
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            self._fallback.reset()  # kazoo dropped every one-shot watch

    def _on_item(self, op: str, token: tuple[Any, ...], value: Any, error: Any) -> None:
        _, path, snapshot, extra = token
        marker = self._markers.get(op)
        if marker is not None:
            marker(extra)
            return
        try:
            if snapshot is not None and snapshot.done.is_set():
                snapshot = None  # a straggler of an ended (aborted) scan: publish like a live read
            if error is None:
                self._on_answer(op, path, snapshot, extra, value)
            else:
                self._on_failed_read(op, path, snapshot, extra, error)
        finally:
            if token[2] is not None:
                self._slots.release(len(extra[1]) if op == OP_BATCH else 1)

    # -------------------------------------------------------------------------------------- notifications

    def _on_watch_event(self, event: WatchedEvent) -> None:
        event_type, path = event.type, event.path
        if event_type == EventType.NONE:
            return
        if self._managed is not None and self._managed.owns(path):
            self._managed.on_event(event)
            return
        route, info = self._router.route(path)
        if route == R_AUTORECOVERY:
            self._autorecovery.note_change()  # read once per chunk: a burst of lock changes
        elif event_type == EventType.CHILD:
            self._relist(route, path, info)
        elif event_type in (EventType.CREATED, EventType.CHANGED):
            self._on_changed(route, path, info)
        elif event_type == EventType.DELETED:
            self._on_deleted(route, path, info)

    def _on_changed(self, route: int, path: str, info: Any) -> None:
        watch = self._data_watch
        if route == R_LEDGER:
            self._tree.ledger_changed(path, info, watch)
        elif route == R_MARK:
            self._tree.mark_changed(path, info, watch)
        elif route == R_DELAY:
            self._read(OP_DELAY, path, None, watch)
        elif route in (R_WRITABLE, R_READONLY):
            self._bookies.read_registration(path, _registration_kind(route), info, None)
        elif route == R_COOKIE:  # created, or rewritten (a new instanceId or directories)
            self._bookies.read_cookie(path, info, None)
        elif route == R_RACK:
            self._rack.read()
        elif route == R_IGNORED:
            self._tree.ignored.note(path)

    def _on_deleted(self, route: int, path: str, info: Any) -> None:
        if route == R_LEDGER:
            self._tree.ledger_deleted(info)
        elif route == R_MARK:
            self._tree.mark_deleted(info)
        elif route in (R_DELAY, R_WRITABLE, R_READONLY, R_COOKIE):
            # Cluster-level facts share one Kafka key, so their order is the job's order: a delete must
            # not overtake the read of an earlier change (delay set to 30 s, then a bookie restarted:
            # applying the restart first would judge it by the old delay). Apply it behind a round trip.
            self._read_counter[OP_DELETE_BARRIER].inc()
            self._reads.exists(path, (OP_DELETE_BARRIER, path, None, (route, info)))
        elif route == R_RACK:
            self._rack.read()

    def _read(self, op: str, path: str, extra: Any, watch: Callable[..., Any] | None) -> None:
        self._read_counter[op].inc()
        self._reads.get(path, (op, path, None, extra), watch=watch)

    def _read_many(self, op: str, paths: list[str], infos: list[Any]) -> None:
        self._read_counter[OP_BATCH].inc()
        self._reads.get_many(paths, (OP_BATCH, "", None, (op, paths, infos)))

    def _relist(self, route: int, path: str, info: Any) -> None:
        """Fallback mode: a child watch fired; list again with a new watch (the completion does the rest)."""
        if not self.fallback_mode:
            return
        self._read_counter[OP_FALLBACK_LIST].inc()
        if route == R_BOOKIE_DIR:
            self._reads.get_children(path, (OP_BOOKIE_LIST, path, None, info), watch=self._child_watch)
        elif route in (R_LEDGER_DIR, R_MARK_DIR, R_UR_BASE):
            self._reads.get_children(path, (OP_FALLBACK_LIST, path, None, None), watch=self._child_watch)

    # -------------------------------------------------------------------------------------- read answers

    def _on_answer(self, op: str, path: str, snapshot: Snapshot | None, extra: Any, value: Any) -> None:
        if op == OP_BATCH:
            self._tree.batch_read(extra, value, snapshot)
        elif op == OP_LEDGER:
            self._tree.ledger_read(path, extra, value[0], value[1], snapshot)
        elif op == OP_MARK:
            self._tree.mark_read(path, extra, value[0], value[1], snapshot)
        elif op == OP_MANAGED and self._managed is not None:
            self._managed.on_read(extra, value[0], value[1], snapshot)
        elif op == OP_DELETE_BARRIER:
            # Whatever the round trip answered (the znode may already be back), the delete happened: apply
            # it now. A later re-creation has its own notification and read.
            self._apply_delete(*extra)
        elif op == OP_DELAY:
            self._delay.apply(value[0], value[1], snapshot)
        elif op == OP_REGISTRATION:
            kind, bookie_id, in_snapshot = extra
            self._bookies.registration_answered(kind, bookie_id, value, _open(in_snapshot))
        elif op == OP_COOKIE:
            bookie_id, in_snapshot = extra
            self._bookies.cookie_answered(bookie_id, (value[1], value[0]), _open(in_snapshot))
        elif op == OP_BOOKIE_LIST:
            self._bookies.on_list(path, extra, value, snapshot)
        elif op == OP_FALLBACK_LIST:
            self._on_fallback_list(path, value, snapshot)
        elif op == OP_RACK:
            self._rack.on_read(value, snapshot)

    def _on_failed_read(self, op: str, path: str, snapshot: Snapshot | None, extra: Any, error: Any) -> None:
        if op == OP_DELETE_BARRIER:  # the connection was lost: the delete happened all the same
            self._apply_delete(*extra)
            return
        if op == OP_REGISTRATION:
            # Gone already (its delete notification came first) or a lost read: publish what is known.
            kind, bookie_id, in_snapshot = extra
            self._bookies.registration_answered(kind, bookie_id, None, _open(in_snapshot))
        elif op == OP_COOKIE:  # deleted meanwhile (its delete notification applies that)
            bookie_id, in_snapshot = extra
            self._bookies.cookie_answered(bookie_id, None, _open(in_snapshot))
        if isinstance(error, NoNodeError):
            self._on_absent(op, path, snapshot, extra)
        else:
            # ConnectionLoss / SessionExpired: the state change that follows triggers a reconciliation.
            if snapshot is not None:
                snapshot.fail(f"read of {path} failed: {type(error).__name__}")
            logger.debug("read of %s failed: %s", path, type(error).__name__)

    def _apply_delete(self, route: int, info: Any) -> None:
        """A cluster-level znode was deleted (applied in order, see OP_DELETE_BARRIER)."""
        if route == R_DELAY:
            self._delay.apply(None, None, None)
        elif route in (R_WRITABLE, R_READONLY):
            # Reads still pending for this bookie were issued *after* the delete (the barrier's answer comes
            # after every earlier one): publish the gap now, or a quick re-registration would hide it.
            self._bookies.set_registration(info, _registration_kind(route), None, None, after_delete=True)
        elif route == R_COOKIE:
            self._bookies.set_cookie(info, False, None)

    def _on_absent(self, op: str, path: str, snapshot: Snapshot | None, extra: Any) -> None:
        if op == OP_DELAY:
            self._delay.apply(None, None, snapshot)
        elif op == OP_BOOKIE_LIST:
            self._fallback.forget_directory(path)
            self._bookies.on_list(path, extra, [], snapshot)
        elif op == OP_FALLBACK_LIST:
            self._fallback.forget_directory(path)
        elif op == OP_RACK:
            self._rack.on_absent(path, snapshot)
        # Ledgers, marks, registrations, managed ledgers: the delete notification arrives on its own.

    def _on_fallback_list(self, path: str, children: list[str], snapshot: Snapshot | None) -> None:
        """Fallback mode: a directory listed with a child watch; read what is new, list new subdirectories."""
        self._fallback.mark_listed(path)
        watch = self._data_watch
        prefix = path if path.endswith("/") else path + "/"
        for name in children:
            child = prefix + name
            route, info = self._router.route(child)
            if route == R_LEDGER:
                if info not in self._tree.ledgers:
                    self._read(OP_LEDGER, child, info, watch)
            elif route == R_MARK:
                if info not in self._tree.marks:
                    self._read(OP_MARK, child, info, watch)
            elif route == R_DELAY:
                if not self._delay.present:
                    self._read(OP_DELAY, child, None, watch)
            elif route == R_IGNORED:
                self._tree.ignored.note(child)
            elif route in _DIRECTORIES and self._fallback.claim_directory(child):
                self._relist(route, child, info)


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
]
