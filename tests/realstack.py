"""bkaudit's pipeline beside a real BookKeeper cluster and BookKeeper's own Auditor, for tests and benchmarks.

:class:`RealStack` runs ``bkaudit watch`` and ``bkaudit stream`` as subprocesses (the chaos stack's
:class:`~tests.chaos.stack.WatcherProcess` and :class:`~tests.integration.job_process.JobRun`) pointed at a
:class:`~connectors.bookkeeper.RealBookKeeperCluster` through a ZooKeeper chroot (the cluster's prefix), with
private topics, lakehouse and checkpoint and the chaos stack's short event-time delays. Beside them:

- :class:`AuditorMarks` polls the Auditor's ``<root>/underreplication/ledgers`` tree and keeps, per ledger,
  the first ``urL`` mark seen and its znode ctime (ZooKeeper's clock: when the Auditor created it). It can
  take every ledger's replication lock first (:meth:`AuditorMarks.lock`), so ``AutoRecoveryMain``'s
  ReplicationWorker finds every mark locked and repairs nothing: the marks stay to be compared;
- :class:`AlertLog` reads the alerts topic from the beginning in a thread and keeps each alert with its
  arrival time.

Example:
    >>> mark_ledger_id("urL0000000059"), mark_ledger_id("locks")
    (59, None)
    >>> chrooted("127.0.0.1:2181", "/bk-1")
    '127.0.0.1:2181/bk-1'
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from bkaudit.testing.harness import ServiceHarness
from bkaudit.testing.kafka_io import TopicTail
from connectors.bookkeeper import RealBookKeeperCluster
from connectors.delta.tables import read_table
from connectors.kafka.topics import ensure_topic
from core.domain.layout import available_path, ledger_path, readonly_path
from core.domain.metadata import LedgerMetadata, decode_ledger_metadata
from core.domain.underreplication import (
    UnderreplicationPaths,
    ledger_id_from_urledger_path,
    parse_underreplicated_ledger,
)
from core.errors import FormatError
from core.settings import KafkaSettings
from tests.chaos.stack import STREAM_SETTINGS, WatcherProcess, job_log_tail, tail, wait_for
from tests.integration.job_process import JobRun, kill_group, planned_offsets

PARTITIONS = 2
LEDGER_KINDS = ("LEDGER_UNDER_REPLICATED", "LEDGER_UNRECOVERABLE")


def mark_ledger_id(name: str) -> int | None:
    """The ledger id of a ``urL%010d`` znode name (None for anything else), as BookKeeper parses it.

    Example:
        >>> mark_ledger_id("urL0000065536")
        65536
    """
    try:
        return ledger_id_from_urledger_path(name)
    except FormatError:
        return None


def chrooted(hosts: str, prefix: str) -> str:
    """A ZooKeeper connect string whose chroot is the cluster's prefix (``""``: no chroot).

    Example:
        >>> chrooted("127.0.0.1:2181", "")
        '127.0.0.1:2181'
    """
    return f"{hosts}{prefix}"


@dataclass(frozen=True)
class Mark:
    """One ``urL`` mark as first seen: its replicas, its znode ctime (ms) and when this process saw it."""

    ledger_id: int
    replicas: tuple[str, ...]
    ctime_ms: int
    seen_at: float


class AuditorMarks:
    """The Auditor's under-replication marks of one ledgers root, polled every ``every_s`` in a thread.

    Example:
        >>> # marks = AuditorMarks("127.0.0.1:2181/bk-1"); marks.start(); marks.snapshot()  -> {id: Mark}
    """

    def __init__(self, hosts: str, ledgers_root: str = "/ledgers", every_s: float = 0.2) -> None:
        self.paths = UnderreplicationPaths(ledgers_root)
        self.every_s = every_s
        self.client = KazooClient(hosts=hosts, timeout=10.0)
        self._marks: dict[int, Mark] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def start(self) -> None:
        self.client.start(timeout=15.0)
        self._thread = threading.Thread(target=self._loop, name="auditor-marks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with contextlib.suppress(Exception):
            self.client.stop()
            self.client.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.poll()
            except Exception as err:  # reported by the caller through ``errors``
                self.errors.append(repr(err))

    def _leaves(self, path: str, depth: int) -> Iterator[str]:
        try:
            children = self.client.get_children(path)
        except NoNodeError:
            return
        for child in children:
            if depth == 4:
                yield f"{path}/{child}"
            else:
                yield from self._leaves(f"{path}/{child}", depth + 1)

    def poll(self) -> int:
        """Read the tree once; record the marks not seen before. Returns how many are there now."""
        present = 0
        for path in self._leaves(self.paths.urledgers, 0):
            ledger_id = mark_ledger_id(path)
            if ledger_id is None:
                continue
            present += 1
            with self._lock:
                if ledger_id in self._marks:
                    continue
            try:
                data, stat = self.client.get(path)
            except NoNodeError:
                continue
            mark = parse_underreplicated_ledger(data)
            with self._lock:
                self._marks.setdefault(
                    ledger_id, Mark(ledger_id, tuple(mark.replicas), int(stat.ctime), time.time())
                )
        return present

    def snapshot(self) -> dict[int, Mark]:
        """Every mark seen so far (first sighting per ledger)."""
        with self._lock:
            return dict(self._marks)

    def since(self, at: float) -> dict[int, Mark]:
        """The marks the Auditor created at or after ``at`` (epoch seconds, by the znode's ctime)."""
        return {i: m for i, m in self.snapshot().items() if m.ctime_ms >= at * 1000}

    def lock(self, ledger_ids: Iterable[int]) -> None:
        """Hold the replication lock of every ledger (persistent ``locks/urL<id>`` znodes): the
        ReplicationWorker skips a locked mark (ZkLedgerUnderreplicationManager.getLedgerToRereplicate)."""
        self.client.ensure_path(self.paths.locks)
        for ledger_id in ledger_ids:
            with contextlib.suppress(NodeExistsError):
                self.client.create(f"{self.paths.locks}/urL{ledger_id:010d}", b'bookieId: "bkaudit-test"\n')

    def clear(self) -> None:
        """Delete every mark (what a finished ReplicationWorker does) and forget them."""
        for path in list(self._leaves(self.paths.urledgers, 0)):
            with contextlib.suppress(NoNodeError):
                self.client.delete(path)
        with self._lock:
            self._marks.clear()


@dataclass(frozen=True)
class ArrivedAlert:
    """One record of the alerts topic: when this process read it, the broker's timestamp, the alert."""

    arrived_at: float
    timestamp_ms: int
    key: str
    alert: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.alert["kind"])

    @property
    def firing(self) -> bool:
        return self.alert["state"] == "firing"


class AlertLog:
    """Every record of an alerts topic from its beginning, read in a thread as it arrives.

    Example:
        >>> # log = AlertLog(kafka); log.start(); log.firing(("BOOKIE_LOST",))
    """

    def __init__(self, kafka: KafkaSettings) -> None:
        self.kafka = kafka
        self._alerts: list[ArrivedAlert] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        tail_ = TopicTail(self.kafka, self.kafka.alerts_topic, wait_s=60.0)
        self._thread = threading.Thread(target=self._loop, args=(tail_,), name="alert-log", daemon=True)
        self._thread.start()

    def _loop(self, tail_: TopicTail) -> None:
        try:
            while not self._stop.is_set():
                records = tail_.poll(0.2)
                now = time.time()
                found = [
                    ArrivedAlert(now, r.timestamp_ms, (r.key or b"").decode(), json.loads(r.value))
                    for r in records
                ]
                with self._lock:
                    self._alerts.extend(found)
        finally:
            tail_.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def alerts(self) -> list[ArrivedAlert]:
        with self._lock:
            return list(self._alerts)

    def firing(self, kinds: Iterable[str], since: float = 0.0) -> list[ArrivedAlert]:
        """Firing alerts of ``kinds`` read at or after ``since`` (epoch seconds)."""
        wanted = set(kinds)
        return [a for a in self.alerts() if a.firing and a.kind in wanted and a.arrived_at >= since]

    def open_now(self, kinds: Iterable[str]) -> dict[str, ArrivedAlert]:
        """alert id → the firing alert of ``kinds`` not resolved since (by the topic's order)."""
        wanted = set(kinds)
        state: dict[str, ArrivedAlert] = {}
        for alert in self.alerts():
            if alert.kind not in wanted:
                continue
            if alert.firing:
                state[alert.alert["alert_id"]] = alert
            else:
                state.pop(alert.alert["alert_id"], None)
        return state

    def open_ledgers(self, kinds: Iterable[str] = LEDGER_KINDS) -> dict[int, str]:
        """ledger id → kind of its open ledger alert."""
        return {int(a.alert["ledger_id"]): a.kind for a in self.open_now(kinds).values()}


def read_ledgers(
    client: KazooClient, ledger_ids: Iterable[int], root: str = "/ledgers"
) -> dict[int, LedgerMetadata]:
    """The ledgers' metadata read straight from ZooKeeper (hierarchical manager), deleted ones left out."""
    found = {}
    for ledger_id in ledger_ids:
        with contextlib.suppress(NoNodeError):
            data, _ = client.get(ledger_path(ledger_id, root=root))
            found[ledger_id] = decode_ledger_metadata(data, ledger_id=ledger_id)
    return found


def naming(ledgers: dict[int, LedgerMetadata], bookies: Iterable[str]) -> set[int]:
    """The ledgers whose metadata names any of ``bookies`` in any segment (what the Auditor marks).

    Example:
        >>> from core.domain.metadata import _doc_example
        >>> naming({7: _doc_example()}, ["nobody:1"])
        set()
    """
    wanted = set(bookies)
    return {i for i, md in ledgers.items() if md.all_bookies & wanted}


def registered(client: KazooClient, bookie_id: str, root: str = "/ledgers") -> bool:
    """Whether ``bookie_id`` is registered (writable or read-only)."""
    return bool(
        client.exists(f"{available_path(root)}/{bookie_id}")
        or client.exists(f"{readonly_path(root)}/{bookie_id}")
    )


def registration_session(client: KazooClient, bookie_id: str, root: str = "/ledgers") -> int | None:
    """The ZooKeeper session that owns ``bookie_id``'s registration (its ephemeral owner), None when it is
    not registered: the same session before and after a pause means the pause expired nothing."""
    for path in (f"{available_path(root)}/{bookie_id}", f"{readonly_path(root)}/{bookie_id}"):
        stat = client.exists(path)
        if stat is not None:
            return int(stat.ephemeralOwner)
    return None


@dataclass
class Loss:
    """What both sides said about one loss of ``victims`` (bookie ids), times in epoch seconds."""

    victims: list[str]
    expected: set[int]
    at: float
    unregistered_at: float | None = None
    marks: dict[int, Mark] = field(default_factory=dict)
    alerts: dict[int, ArrivedAlert] = field(default_factory=dict)
    bookie_lost: dict[str, ArrivedAlert] = field(default_factory=dict)

    @property
    def marked(self) -> set[int]:
        return set(self.marks)

    @property
    def alerted(self) -> set[int]:
        return set(self.alerts)

    def complete(self) -> bool:
        return (
            self.expected <= self.marked
            and self.expected <= self.alerted
            and set(self.victims) <= set(self.bookie_lost)
        )

    def last_mark_s(self) -> float | None:
        """Seconds from the fault to the Auditor's last mark (the znode's ctime)."""
        return max(m.ctime_ms for m in self.marks.values()) / 1000 - self.at if self.marks else None

    def last_alert_s(self) -> float | None:
        """Seconds from the fault to the last ledger alert read back from the alerts topic."""
        return max(a.arrived_at for a in self.alerts.values()) - self.at if self.alerts else None

    def summary(self) -> dict[str, Any]:
        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 3)

        kinds: dict[str, int] = {}
        for alert in self.alerts.values():
            kinds[alert.kind] = kinds.get(alert.kind, 0) + 1
        lost = [a.arrived_at - self.at for a in self.bookie_lost.values()]
        return {
            "victims": self.victims,
            "expected": len(self.expected),
            "auditor_marked": len(self.marked),
            "bkaudit_alerted": len(self.alerted),
            "bkaudit_kinds": kinds,
            "missed_by_bkaudit": sorted(self.marked - self.alerted),
            "missed_by_auditor": sorted(self.alerted - self.marked),
            "unregistered_s": rounded(
                None if self.unregistered_at is None else self.unregistered_at - self.at
            ),
            "auditor_first_mark_s": rounded(
                min(m.ctime_ms for m in self.marks.values()) / 1000 - self.at if self.marks else None
            ),
            "auditor_last_mark_s": rounded(self.last_mark_s()),
            "bkaudit_bookie_lost_s": rounded(max(lost) if lost else None),
            "bkaudit_first_alert_s": rounded(
                min(a.arrived_at for a in self.alerts.values()) - self.at if self.alerts else None
            ),
            "bkaudit_last_alert_s": rounded(self.last_alert_s()),
            "complete": self.complete(),
        }


@dataclass
class RealStack:
    """bkaudit's watcher and job on a real BookKeeper cluster; the Auditor's marks; the alerts read back."""

    services: ServiceHarness
    cluster: RealBookKeeperCluster
    root: Path
    kafka: KafkaSettings
    run: JobRun
    watcher: WatcherProcess
    marks: AuditorMarks
    alerts: AlertLog
    job: Any = None
    stream_settings: dict[str, str] = field(default_factory=dict)
    #: ledgers written by the caller (looked up with bkaudit's own rows when a loss computes its truth)
    known_ledgers: set[int] = field(default_factory=set)

    @property
    def hosts(self) -> str:
        """bkaudit's ``zookeeper.connect``: the cluster's ZooKeeper, chrooted at its prefix."""
        return chrooted(self.cluster.zookeeper, self.cluster.prefix)

    def require_alive(self) -> None:
        if self.job is not None and self.job.poll() is not None:
            raise AssertionError(f"the job exited with {self.job.returncode}:\n{self.job_log()}")
        if not self.watcher.alive():
            raise AssertionError(f"the watcher exited:\n{tail(self.watcher.log)}")

    def job_log(self) -> str:
        return job_log_tail(self.run.log_tail(1, 400), 30)

    def ledger_rows(self) -> dict[int, dict[str, Any]]:
        """bkaudit's ``ledgers`` table (current rows, deleted ones left out)."""
        return {
            r["ledger_id"]: r
            for r in read_table(self.run.lakehouse, "ledgers").to_pylist()
            if not r["deleted"]
        }

    def wait_ingested(self, ledger_ids: Iterable[int], timeout_s: float = 240.0) -> float:
        """Wait until every ledger is a row of bkaudit's ``ledgers`` table and the job has read the changes
        topic to its end; returns the seconds waited."""
        wanted = set(ledger_ids)
        started = time.monotonic()

        def ingested() -> bool:
            self.require_alive()
            return wanted <= set(self.ledger_rows())

        wait_for(f"bkaudit to ingest {len(wanted)} ledgers", ingested, timeout_s, every_s=1.0)
        self.wait_read_to_end(timeout_s)
        return time.monotonic() - started

    def wait_read_to_end(self, timeout_s: float = 120.0) -> None:
        """The job committed a batch that read every partition of the changes topic to its end as of now."""
        tail_ = TopicTail(self.kafka, self.kafka.changes_topic)
        try:
            ends = {str(p): o for p, o in tail_.end_offsets().items()}
        finally:
            tail_.close()

        def read() -> bool:
            self.require_alive()
            done = planned_offsets(self.run).get(self.run.last("commits")) or {}
            return bool(done) and all(done.get(p, -1) >= end for p, end in ends.items())

        wait_for(f"the job to read {self.kafka.changes_topic} to {ends}", read, timeout_s)

    def auditor_idle(self) -> bool:
        """The Auditor finished its start-up checks (bookies, all ledgers, placement) by its log."""
        log = tail(self.cluster.auditor_log_file, 100_000)
        done = ("Completed auditBookies", "Completed checkAllLedgers", "Completed placementPolicyCheck")
        return all(line in log for line in done)

    def lose(
        self, indices: list[int], *, pause: bool = False, timeout_s: float = 120.0, settle_s: float = 3.0
    ) -> Loss:
        """``kill -9`` (or SIGSTOP with ``pause``) bookies ``indices`` at once; wait until the Auditor marked
        and bkaudit alerted every ledger naming them (or ``timeout_s``), then ``settle_s`` more for extras."""
        client = self.marks.client
        bookies = [self.cluster.bookie(i) for i in indices]
        victims = [b.bookie_id for b in bookies]
        ledgers = read_ledgers(client, set(self.ledger_rows()) | set(self.known_ledgers))
        loss = Loss(victims, naming(ledgers, victims), time.time())
        for bookie in bookies:
            bookie.pause() if pause else bookie.kill()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.require_alive()
            if loss.unregistered_at is None and not any(registered(client, v) for v in victims):
                loss.unregistered_at = time.time()
            self._collect(loss)
            if loss.complete():
                break
            time.sleep(0.1)
        time.sleep(settle_s)
        self._collect(loss)
        return loss

    def restore(
        self, indices: list[int], loss: Loss, *, resume: bool = False, timeout_s: float = 180.0
    ) -> float:
        """Bring the lost bookies back (restart, or SIGCONT with ``resume``), wait until bkaudit resolved
        the loss's alerts, then delete the Auditor's marks (as a finished ReplicationWorker would). Returns
        the seconds it took."""
        started = time.monotonic()
        for index in indices:
            if resume:
                self.cluster.bookie(index).resume()
            else:
                self.cluster.start_bookie(index)

        def resolved() -> bool:
            self.require_alive()
            still = set(self.alerts.open_ledgers()) & loss.alerted
            lost = {a.key.rsplit("/", 1)[1] for a in self.alerts.open_now(("BOOKIE_LOST",)).values()}
            return not still and not (lost & set(loss.victims))

        wait_for(f"bkaudit to resolve the alerts of {loss.victims}", resolved, timeout_s)
        self.marks.clear()
        return time.monotonic() - started

    def _collect(self, loss: Loss) -> None:
        loss.marks = self.marks.since(loss.at)
        loss.alerts = {}
        for alert in self.alerts.firing(LEDGER_KINDS, loss.at):
            # The last firing per ledger: a second lost bookie can turn UNDER_REPLICATED into UNRECOVERABLE.
            loss.alerts[int(alert.alert["ledger_id"])] = alert
        loss.bookie_lost = {}
        for alert in self.alerts.firing(("BOOKIE_LOST",), loss.at):
            loss.bookie_lost.setdefault(alert.key.rsplit("/", 1)[1], alert)

    def close(self) -> None:
        self.alerts.stop()
        self.marks.stop()
        if self.job is not None and self.job.poll() is None:
            kill_group(self.job)
        self.watcher.stop()


def _env(kafka: KafkaSettings, hosts: str, root: Path) -> dict[str, str]:
    """The settings the watcher needs: the cluster (chrooted), Kafka, the rack map znode."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKAUDIT_")}
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    env.update(
        {
            "TMPDIR": str(root / "tmp"),
            "BKAUDIT_ZOOKEEPER__CONNECT": hosts,
            "BKAUDIT_ZOOKEEPER__LEDGERS_ROOT": "/ledgers",
            "BKAUDIT_ZOOKEEPER__SESSION_TIMEOUT_S": "10",
            "BKAUDIT_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
            "BKAUDIT_KAFKA__CHANGES_TOPIC": kafka.changes_topic,
            "BKAUDIT_KAFKA__ALERTS_TOPIC": kafka.alerts_topic,
            "BKAUDIT_KAFKA__FEEDBACK_TOPIC": kafka.feedback_topic,
            "BKAUDIT_KAFKA__TOPIC_PARTITIONS": str(PARTITIONS),
            "BKAUDIT_WATCHER__HEARTBEAT_INTERVAL_S": "0.5",
            "BKAUDIT_WATCHER__RACK_MAP_ZNODE": "/bookies",
            "BKAUDIT_WATCHER__PROGRESS": "off",
            "BKAUDIT_WATCHER__SHUTDOWN_TIMEOUT_S": "5",
        }
    )
    return env


@contextlib.contextmanager
def real_stack(
    services: ServiceHarness,
    cluster: RealBookKeeperCluster,
    root: Path,
    *,
    stream_settings: dict[str, str] | None = None,
    app_id: str = "bkaudit-real",
    lock_ledgers: Iterable[int] = (),
    job_env: dict[str, str] | None = None,
) -> Iterator[RealStack]:
    """Start the alert reader, the mark poller, ``bkaudit watch`` and ``bkaudit stream`` on ``cluster``;
    everything is stopped on exit (the cluster is the caller's).

    ``lock_ledgers``: take these ledgers' replication locks first (:meth:`AuditorMarks.lock`), before the
    watcher starts: it reads all of AutoRecovery's locks again on every lock change (they are a handful
    in a real cluster), so thousands created under its eyes would cost it thousands of full reads.
    ``job_env``: other ``BKAUDIT_*`` variables of the job (settings outside the ``stream`` section)."""
    root.mkdir(parents=True, exist_ok=True)
    kafka = services.kafka_settings(topic_partitions=PARTITIONS)
    ensure_topic(kafka, kafka.changes_topic, partitions=PARTITIONS)
    ensure_topic(kafka, kafka.alerts_topic, partitions=PARTITIONS)
    hosts = chrooted(cluster.zookeeper, cluster.prefix)
    env = _env(kafka, hosts, root)
    settings = {**STREAM_SETTINGS, **(stream_settings or {})}
    run = JobRun(
        root / "job",
        kafka,
        settings,
        app_id,
        PARTITIONS,
        extra_env={**{k: v for k, v in env.items() if k.startswith("BKAUDIT_ZOOKEEPER")}, **(job_env or {})},
    )
    stack = RealStack(
        services=services,
        cluster=cluster,
        root=root,
        kafka=kafka,
        run=run,
        watcher=WatcherProcess(root, env),
        marks=AuditorMarks(hosts),
        alerts=AlertLog(kafka),
        stream_settings=settings,
    )
    stack.known_ledgers = set(lock_ledgers)
    try:
        stack.alerts.start()
        stack.marks.start()
        stack.marks.lock(stack.known_ledgers)
        stack.watcher.start()
        stack.job = run.start(1, available_now=False)
        yield stack
    finally:
        stack.close()


__all__ = [
    "LEDGER_KINDS",
    "AlertLog",
    "ArrivedAlert",
    "AuditorMarks",
    "Mark",
    "RealStack",
    "chrooted",
    "mark_ledger_id",
    "real_stack",
]
