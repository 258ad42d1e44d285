"""The watcher's recipe for the rack map: which rack each bookie is in, as one ``RackMap`` event.

Three sources, chosen by the settings (``watcher.rack_map_*``):

* **Pulsar's ``/bookies`` znode on the watcher's own ZooKeeper**: read by every snapshot scan
  (:meth:`RackMapSource.scan`) and again whenever its one-shot data watch fires; an absent znode is an
  empty map, and an ``exists`` watch waits for its creation.
* **The same znode on another ZooKeeper** (``rack_map_zookeeper``): a client of its own (opened by the
  watcher's session, which owns every connection), read at start and after every reconnect, since kazoo
  drops one-shot watches on a disconnect.
* **A JSON file** (Pulsar's form or a flat one, :mod:`core.domain.rackmap`), polled by mtime and size on a
  thread of its own.

Whatever the source, reads and file contents reach the watcher's FIFO (ops :data:`OP_RACK`,
:data:`OP_RACK_REFRESH`, :data:`OP_RACK_FILE`) and the worker applies them in order: a ``RackMap`` event
carries the whole map and is published when the source changed; a map that does not parse is published
with its error and no entries (the job keeps the last valid map). A FULL snapshot restates a map its scan
did not read (:meth:`RackMapSource.restate`).

Example:
    >>> from core.settings import WatcherSettings
    >>> source = RackMapSource(WatcherSettings(rack_map_znode="/bookies"), None, put=print, emit=print)
    >>> source.session_path, source.source
    ('/bookies', 'zookeeper:/bookies')
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.protocol.states import EventType, KazooState, WatchedEvent

from connectors.zookeeper.emitter import Emit
from connectors.zookeeper.ordered_reads import Deliver, OrderedReads
from connectors.zookeeper.snapshot import ScanReads, Snapshot
from core import events
from core.domain.rackmap import parse_rack_map
from core.errors import FormatError
from core.pb import change_events_pb2 as pb
from core.settings import WatcherSettings

logger = logging.getLogger(__name__)

OP_RACK = "rack_map"  # a read of the znode (or an exists() watching for its creation)
OP_RACK_REFRESH = "rack_refresh"  # a marker: read the znode again (its watch fired, or it reconnected)
OP_RACK_FILE = "rack_file"  # the file's contents: extra = (bytes or None when absent, mtime in ms)
_REFRESH = (OP_RACK_REFRESH, "", None, None)


@dataclasses.dataclass(eq=False)
class RackMapSource:
    """Follows the configured rack map source for the watcher's worker.

    ``reads`` are the session's ordered reads (replaced by a client of its own for another ZooKeeper);
    ``put`` queues an item on the watcher's FIFO; ``undecodable`` counts a map that does not parse;
    ``count`` counts each read.
    """

    config: WatcherSettings
    reads: OrderedReads | None
    _: dataclasses.KW_ONLY
    put: Callable[[tuple[Any, Any, Any]], None]
    emit: Emit
    undecodable: Callable[[], None] = lambda: None
    count: Callable[[], None] = lambda: None
    _published: tuple[Any, ...] | None = dataclasses.field(default=None, init=False)
    _payload: pb.RackMap | None = dataclasses.field(default=None, init=False)

    @property
    def session_path(self) -> str | None:
        """The znode when it is on the watcher's own ZooKeeper (read by its scans), else None."""
        return self.config.rack_map_znode if self.config.rack_map_zookeeper is None else None

    @property
    def source(self) -> str:
        """The source as events name it: ``zookeeper:[<hosts>!]<znode>`` or ``file:<path>``."""
        config = self.config
        if config.rack_map_znode is None:
            return f"file:{config.rack_map_file}"
        hosts = f"{config.rack_map_zookeeper}!" if config.rack_map_zookeeper is not None else ""
        return f"zookeeper:{hosts}{config.rack_map_znode}"

    def start(
        self,
        connect: Callable[[str, str], KazooClient],
        deliver: Deliver,
        start_thread: Callable[[str, Callable[[], None]], None],
        stopping: threading.Event,
    ) -> None:
        """Open the other ZooKeeper (``connect(hosts, setting)``) or start polling the file."""
        config = self.config
        if config.rack_map_znode is not None and config.rack_map_zookeeper is not None:
            client = connect(config.rack_map_zookeeper, "watcher.rack_map_zookeeper")
            self.reads = OrderedReads(client, deliver)
            self.reads.marker(_REFRESH)
            client.add_listener(self._on_state)
        elif config.rack_map_file is not None:
            start_thread("bkaudit-watch-rackfile", lambda: self._poll_file(stopping))

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED and self.reads is not None:
            # kazoo dropped the one-shot watch on disconnect: read (and watch) again.
            self.reads.marker(_REFRESH)

    def on_watch(self, event: WatchedEvent) -> None:
        """The znode's one-shot watch (kazoo's connection thread): read it again, in the FIFO's order."""
        if event.type != EventType.NONE:
            self.put((_REFRESH, None, None))

    # -- the worker ------------------------------------------------------------------------------------
    def scan(self, reads: ScanReads) -> None:
        """A snapshot scan reads the znode when it is on the watcher's ZooKeeper."""
        if self.session_path is not None:
            reads.read(OP_RACK, self.session_path, watch=self.on_watch)

    def read(self) -> None:
        """Read the znode (with its watch); its answer comes back as :data:`OP_RACK`."""
        path = self.config.rack_map_znode
        if path is None or self.reads is None:
            return
        self.count()
        self.reads.get(path, (OP_RACK, path, None, None), watch=self.on_watch)

    def on_read(self, value: Any, snapshot: Snapshot | None) -> None:
        """A read's ``(data, stat)``, or an ``exists`` answer (the znode appeared: read it for real)."""
        if isinstance(value, tuple):
            data, stat = value
            self.apply(data, stat.mzxid, present=True, snapshot=snapshot)
        elif value is not None:
            self.read()

    def on_absent(self, path: str, snapshot: Snapshot | None) -> None:
        """No znode: an empty map, and a watch for the znode's creation."""
        self.apply(None, 0, present=False, snapshot=snapshot)
        if self.reads is not None:
            self.reads.exists(path, (OP_RACK, path, None, None), watch=self.on_watch)

    def on_file(self, contents: tuple[bytes | None, int]) -> None:
        """The file poller's ``(bytes or None, mtime ms)``."""
        data, version = contents
        self.apply(data, version, present=data is not None, snapshot=None)

    def apply(self, data: bytes | None, version: int, *, present: bool, snapshot: Snapshot | None) -> None:
        """Publish the map when the source changed (always inside a FULL ``snapshot``)."""
        state = (present, version, data)
        if state == self._published and (snapshot is None or not snapshot.is_full):
            return
        self._published = state
        self._payload = self._parse(data, version) if present else self._absent(version)
        self.emit(self._payload, snapshot)

    def restate(self, snapshot: Snapshot) -> None:
        """Inside a FULL snapshot's bracket: the map its scan did not read (file, other ZooKeeper)."""
        if self._payload is not None and self.session_path is None:
            self.emit(self._payload, snapshot)

    def _absent(self, version: int) -> pb.RackMap:
        return events.rack_map_event(self.source, None, present=False, source_version=version)

    def _parse(self, data: bytes | None, version: int) -> pb.RackMap:
        try:
            entries = parse_rack_map(data or b"")
        except FormatError as err:
            self.undecodable()
            logger.warning("rack map %s does not parse: %s", self.source, err)
            return events.rack_map_event(
                self.source, None, present=True, error=str(err)[:300], source_version=version
            )
        return events.rack_map_event(self.source, entries, present=True, source_version=version)

    # -- the file poller's thread ----------------------------------------------------------------------
    def _poll_file(self, stopping: threading.Event) -> None:
        path = Path(self.config.rack_map_file or "")
        seen_before: tuple[float, int] | None = None
        while not stopping.is_set():
            try:
                stat = path.stat()
                seen: tuple[float, int] = (stat.st_mtime, stat.st_size)
            except OSError:
                seen = (0.0, -1)
            if seen != seen_before:
                seen_before = seen
                data: bytes | None = None
                if seen[1] >= 0:
                    try:
                        data = path.read_bytes()
                    except OSError as err:
                        logger.warning("cannot read rack map file %s: %s", path, err.strerror)
                self.put(((OP_RACK_FILE, str(path), None, (data, int(seen[0] * 1000))), None, None))
            stopping.wait(self.config.rack_map_poll_s)
