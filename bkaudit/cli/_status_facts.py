"""Is the auditor working? The facts behind `bkaudit status`, read from what the processes leave behind.

Nothing here talks to the processes themselves (their ``/metrics`` endpoints are off by default):

- **watcher**: it heartbeats every partition of the changes topic every ``watcher.heartbeat_interval_s``, so
  the newest record on that topic says when it was last alive. Silent for longer than the heartbeat
  timeout: ``down``.
- **stream**: ``bkaudit stream`` holds an exclusive lock on ``<checkpoint>/bkaudit.lock`` while it runs
  (:mod:`streaming.checkpoint_lock`); the kernel's lock table (``/proc/locks``) says whether anyone holds
  it, without touching it. Its position is the newest batch of each lane's checkpoint
  (``ledger-lane/offsets/`` for the ledger lane, ``membership/offsets/`` for the membership lane);
  the records of the changes topic past that position are its lag, and the age of the oldest of them its
  lag in seconds. Running but more than ``max_lag_s`` behind: ``lagging``.
- **audit**: open alerts per kind and the lost and read-only bookies, from the Delta tables.
- **autorecovery**: who BookKeeper's Auditor is, whether re-replication is enabled and the
  ``lostBookieRecoveryDelay`` in force, read from ZooKeeper (one short session).

The exit code (:func:`status_exit_code`) sums it up for scripts and probes: :data:`EXIT_HEALTHY`,
:data:`EXIT_CLUSTER_UNHEALTHY` or :data:`EXIT_AUDITOR_UNHEALTHY`.

Example:
    >>> stream_state(holder_alive=True, lag_s=0.4, limits=StatusLimits(heartbeat_timeout_s=10, max_lag_s=60))
    'up'
    >>> stream_state(holder_alive=True, lag_s=75.0, limits=StatusLimits(heartbeat_timeout_s=10, max_lag_s=60))
    'lagging'
"""

from __future__ import annotations

import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyarrow import ArrowException

from connectors import storage
from connectors.kafka.positions import TopicPositions
from connectors.process import pid_alive
from core.domain.alerts import AlertKind
from core.errors import BkauditError, ConfigError, ServiceError
from core.settings import Settings
from streaming.checkpoint_lock import LOCK_FILE, recorded_holder
from streaming.disk_space import low_free_space
from streaming.driver_batches import OffsetLog

MEMBERSHIP_DIR = "membership"
LEDGER_LANE_DIR = "ledger-lane"  # the driver-run ledger lane's checkpoint
STATUS_KAFKA_TIMEOUT_S = 10.0  # a status answers in seconds, whatever kafka.request_timeout_ms says
STATUS_ZOOKEEPER_TIMEOUT_S = 5.0

EXIT_HEALTHY = 0
"""bkaudit is up and the cluster is healthy."""
EXIT_CLUSTER_UNHEALTHY = 1
"""bkaudit is up; the cluster is not: an open warning or critical alert, AutoRecovery off, or no Auditor."""
EXIT_AUDITOR_UNHEALTHY = 3
"""bkaudit cannot vouch for the cluster: the watcher or the stream is down or lagging, the tables or
ZooKeeper cannot be read, or a volume of the job is almost full."""


@dataclass(frozen=True)
class StatusLimits:
    """When a component counts as down or lagging."""

    heartbeat_timeout_s: float  # the watcher is down when its topic has been silent this long
    max_lag_s: float  # a running stream is lagging when its oldest unread record is older

    @classmethod
    def defaults(cls, settings: Settings) -> StatusLimits:
        """Ten heartbeat intervals (at least 10 s), and a minute or five ledger-lane intervals of lag.

        Example:
            >>> StatusLimits.defaults(Settings())
            StatusLimits(heartbeat_timeout_s=10.0, max_lag_s=60.0)
        """
        return cls(
            heartbeat_timeout_s=max(10.0, 10 * settings.watcher.heartbeat_interval_s),
            max_lag_s=max(60.0, 5 * settings.stream.ledger_lane_interval_s),
        )


@dataclass(frozen=True)
class LanePosition:
    """Where one lane of the job stands: its newest batch's end offsets (changes topic) and when it ran.

    Example:
        >>> LanePosition("ledgers", 7, 1764146400.0, {0: 812}).offsets
        {0: 812}
    """

    lane: str
    batch_id: int
    batch_at_s: float  # epoch seconds
    offsets: dict[int, int]  # partition -> next offset to read


def stream_state(*, holder_alive: bool, lag_s: float | None, limits: StatusLimits) -> str:
    """``down`` without a live job, ``lagging`` when its oldest unread record is too old, else ``up``.

    Example:
        >>> stream_state(holder_alive=False, lag_s=None, limits=StatusLimits(10, 60))
        'down'
    """
    if not holder_alive:
        return "down"
    return "lagging" if lag_s is not None and lag_s > limits.max_lag_s else "up"


def flock_holder(path: Path, locks_table: Path = Path("/proc/locks")) -> int | None:
    """The pid holding a ``flock`` on ``path`` according to the kernel's lock table, or None.

    Raises ``OSError`` when the table cannot be read (not Linux).

    Example:
        >>> import tempfile, fcntl
        >>> lock = Path(tempfile.mkdtemp()) / "x.lock"
        >>> with open(lock, "w") as handle:
        ...     fcntl.flock(handle, fcntl.LOCK_EX)
        ...     flock_holder(lock) == os.getpid()
        True
        >>> flock_holder(lock) is None  # closed: released
        True
    """
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    for line in locks_table.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == device:
            return int(fields[4])
    return None


def job_holder(checkpoint: Path) -> dict[str, Any]:
    """Who runs the job on ``checkpoint``: ``{"alive": bool, "pid", "host", "started_at"}``.

    The kernel's lock table decides on this host. A lock file written by another host cannot be checked
    here: ``alive`` is then None (the caller judges by the checkpoint's progress).

    Example:
        >>> import tempfile
        >>> job_holder(Path(tempfile.mkdtemp()))["alive"]  # no lock file: nobody
        False
    """
    lock = checkpoint / LOCK_FILE
    recorded = recorded_holder(checkpoint)
    holder: dict[str, Any] = {k: recorded.get(k) for k in ("pid", "host", "started_at")}
    if recorded.get("host") not in (None, socket.gethostname()):
        return {**holder, "alive": None}
    try:
        pid = flock_holder(lock)
        holder["alive"] = pid is not None
        holder["pid"] = pid if pid is not None else holder["pid"]
    except OSError:  # no lock table: the recorded pid is the best there is
        holder["alive"] = isinstance(holder["pid"], int) and pid_alive(holder["pid"])
    return holder


def _source_offsets(end: dict[str, Any], topic: str) -> dict[int, int]:
    """``topic``'s partition offsets in a batch's end offsets (``{topic: {partition: offset}}``)."""
    offsets = end.get(topic)
    return {int(p): int(o) for p, o in offsets.items()} if isinstance(offsets, dict) else {}


def ledger_lane_position(checkpoint: str | Path, topic: str) -> LanePosition | None:
    """The ledger lane's newest planned batch (``ledger-lane/offsets/<id>.json``).

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> (folder / "ledger-lane" / "offsets").mkdir(parents=True)
        >>> _ = (folder / "ledger-lane" / "offsets" / "3.json").write_text('{"end": {"t": {"0": 7}}}')
        >>> position = ledger_lane_position(folder, "t")
        >>> position.batch_id, position.offsets
        (3, {0: 7})
    """
    return _driver_lane_position(storage.join(checkpoint, LEDGER_LANE_DIR), "ledgers", topic)


def membership_lane_position(checkpoint: str | Path, topic: str) -> LanePosition | None:
    """The membership lane's newest planned batch (``membership/offsets/<id>.json``).

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> (folder / "membership" / "offsets").mkdir(parents=True)
        >>> _ = (folder / "membership" / "offsets" / "4.json").write_text('{"end": {"t": {"1": 9}}}')
        >>> membership_lane_position(folder, "t").offsets
        {1: 9}
    """
    return _driver_lane_position(storage.join(checkpoint, MEMBERSHIP_DIR), "membership", topic)


def _driver_lane_position(directory: str, lane: str, topic: str) -> LanePosition | None:
    """A driver-run lane's newest planned batch (``<directory>/offsets/<id>.json``)."""
    try:
        latest = OffsetLog(storage.join(directory, "offsets")).latest()
        if latest is None:
            return None
        batch_id, entry = latest
        written_s = storage.modified_s(storage.join(directory, "offsets", f"{batch_id}.json"))
    except (OSError, ConfigError, ArrowException):  # unreadable or damaged: no position to report
        return None
    end = entry.get("end")
    offsets = _source_offsets(end, topic) if isinstance(end, dict) else {}
    return LanePosition(lane, batch_id, written_s, offsets)


def _lag(
    positions: TopicPositions, topic: str, lane: LanePosition, ends: dict[int, int], now_s: float
) -> tuple[int, float]:
    """Records of ``topic`` past the lane's position (on the partitions it reads), and the age in seconds
    of the oldest of them (0 when there are none)."""
    behind = {p: ends[p] - o for p, o in lane.offsets.items() if p in ends and ends[p] > o}
    if not behind:
        return 0, 0.0
    written = positions.record_times(topic, {p: lane.offsets[p] for p in behind})
    oldest = min(written.values(), default=None)
    age = max(0.0, now_s - oldest / 1000.0) if oldest is not None else now_s - lane.batch_at_s
    return sum(behind.values()), round(age, 1)


def watcher_status(
    positions: TopicPositions, topic: str, ends: dict[int, int] | None, now_s: float, limits: StatusLimits
) -> dict[str, Any]:
    """The watcher's state from the newest record on its topic (its heartbeats).

    Example:
        >>> # watcher_status(positions, "bkaudit.changes", {0: 812}, time.time(), limits)["state"]  → 'up'
    """
    last = {p: end - 1 for p, end in (ends or {}).items() if end > 0}
    written = positions.record_times(topic, last)
    if not written:
        detail = f"no topic {topic}" if ends is None else f"nothing published on {topic}"
        return {"state": "down", "last_seen": None, "lag_s": None, "detail": detail}
    newest_s = max(written.values()) / 1000.0
    age = round(max(0.0, now_s - newest_s), 1)
    state = "up" if age <= limits.heartbeat_timeout_s else "down"
    return {"state": state, "last_seen": newest_s, "lag_s": age, "detail": f"last heartbeat on {topic}"}


def stream_status(
    settings: Settings,
    positions: TopicPositions | None,
    ends: dict[int, int] | None,
    now_s: float,
    limits: StatusLimits,
) -> dict[str, Any]:
    """The job's state: its lock holder, each lane's last batch and lag on the changes topic (``positions``
    None: Kafka did not answer, the lag is unknown and the state rests on the lock alone).

    Example:
        >>> # stream_status(settings, positions, {0: 812}, time.time(), limits)["lag_records"]  → 0
    """
    topic = settings.kafka.changes_topic
    checkpoint = settings.checkpoint
    holder = job_holder(Path(settings.checkpoint_root) / settings.stream.app_id)
    lanes = [
        lane
        for lane in (ledger_lane_position(checkpoint, topic), membership_lane_position(checkpoint, topic))
        if lane is not None
    ]
    lane_rows: list[dict[str, Any]] = []
    for lane in lanes:
        records, age = (None, None) if positions is None else _lag(positions, topic, lane, ends or {}, now_s)
        lane_rows.append(
            {
                "lane": lane.lane,
                "batch_id": lane.batch_id,
                "last_batch": lane.batch_at_s,
                "lag_records": records,
                "lag_s": age,
            }
        )
    last_batch = max((row["last_batch"] for row in lane_rows), default=None)
    lag_s = max((row["lag_s"] for row in lane_rows if row["lag_s"] is not None), default=None)
    alive = holder["alive"]
    if alive is None:  # held from another host: alive while its batches keep coming
        alive = last_batch is not None and now_s - last_batch <= limits.max_lag_s
    state = stream_state(holder_alive=alive, lag_s=lag_s, limits=limits)
    if holder.get("pid") is not None and holder["alive"] is not False:
        who = f"pid {holder['pid']} on {holder.get('host') or '?'}"
    else:
        who = "no job holds the checkpoint"
    records = None if positions is None else sum(row["lag_records"] for row in lane_rows)
    if positions is None:
        detail = f"{who}; lag unknown (Kafka did not answer)"
    else:
        detail = f"{who}; {records} records behind on {topic}" if lanes else f"{who}; no batch yet"
    return {
        "state": state,
        "last_seen": last_batch,
        "lag_s": lag_s,
        "lag_records": records,
        "detail": detail,
        "checkpoint": str(checkpoint),
        "holder": holder,
        "lanes": lane_rows,
    }


def audit_summary(lakehouse_root: str | Path) -> dict[str, Any]:
    """Open alerts per kind and the lost and read-only bookies, from the Delta tables (an ``error`` note
    when there are none yet).

    Example:
        >>> audit_summary(Path("/nonexistent"))["error"]
        'no lakehouse at /nonexistent'
    """
    from connectors.delta.queries import Lakehouse

    try:
        with Lakehouse(lakehouse_root) as lakehouse:
            kinds = lakehouse.open_alerts(group_by=["kind"]).to_pylist()
            bookies = lakehouse.bookies().select(["bookie_id", "status", "lost"]).to_pylist()
    except BkauditError as err:
        return {"open_alerts": {}, "lost_bookies": [], "read_only_bookies": [], "error": str(err)}
    return {
        "open_alerts": {row["kind"]: row["alerts"] for row in kinds},
        "lost_bookies": sorted(row["bookie_id"] for row in bookies if row["lost"]),
        "read_only_bookies": sorted(row["bookie_id"] for row in bookies if row["status"] == "READ_ONLY"),
    }


def gather_status(settings: Settings, limits: StatusLimits, now_s: float | None = None) -> dict[str, Any]:
    """Everything `bkaudit status` reports, as one JSON-ready document (times as epoch seconds).

    ``healthy`` is true when the watcher and the stream are up.

    Example:
        >>> # gather_status(load_settings(), StatusLimits.defaults(load_settings()))["healthy"]  → True
    """
    from connectors.storage import configure_from

    configure_from(settings)  # the tables may be on an object store
    now_s = time.time() if now_s is None else now_s
    topic = settings.kafka.changes_topic
    with ThreadPoolExecutor(1, thread_name_prefix="status-zookeeper") as pool:
        autorecovery = pool.submit(autorecovery_status, settings)  # beside Kafka: both may wait for a timeout
        report = _processes_and_tables(settings, limits, topic, now_s)
        report["autorecovery"] = autorecovery.result()
    return report


def _processes_and_tables(
    settings: Settings, limits: StatusLimits, topic: str, now_s: float
) -> dict[str, Any]:
    with TopicPositions(settings.kafka, timeout_s=STATUS_KAFKA_TIMEOUT_S) as positions:
        try:
            ends = positions.end_offsets(topic)
        except ServiceError as err:  # the tables and the lock still say something: report, do not fail
            watcher = {"state": "unknown", "last_seen": None, "lag_s": None, "detail": str(err)}
            stream = stream_status(settings, None, None, now_s, limits)
        else:
            watcher = watcher_status(positions, topic, ends, now_s, limits)
            stream = stream_status(settings, positions, ends, now_s, limits)
    return {
        "healthy": watcher["state"] == "up" and stream["state"] == "up",
        "watcher": watcher,
        "stream": stream,
        **audit_summary(settings.lakehouse),
        "low_disk": low_free_space(settings),
        "limits": {"heartbeat_timeout_s": limits.heartbeat_timeout_s, "max_lag_s": limits.max_lag_s},
    }


def autorecovery_status(settings: Settings) -> dict[str, Any]:
    """BookKeeper's AutoRecovery as ZooKeeper says now (an ``error`` instead when it cannot be read).

    Example:
        >>> # autorecovery_status(settings)["auditor"]  → "10.0.0.1:3181"
    """
    from connectors.zookeeper.admin_reads import AdminReader

    try:
        timeout_s = min(
            STATUS_ZOOKEEPER_TIMEOUT_S, settings.zookeeper.connect_timeout_s or STATUS_ZOOKEEPER_TIMEOUT_S
        )
        with AdminReader(settings.zookeeper, timeout_s=timeout_s) as reader:
            view = reader.autorecovery()
    except BkauditError as err:
        return {"auditor": None, "enabled": None, "recovery_delay_s": None, "error": str(err)}
    return {"auditor": view.auditor, "enabled": view.enabled, "recovery_delay_s": view.recovery_delay_s}


def status_exit_code(report: dict[str, Any]) -> int:
    """The exit code of ``bkaudit status`` for ``report`` (:func:`gather_status`'s document).

    Example:
        >>> up = {"state": "up"}
        >>> fine = {"watcher": up, "stream": up, "open_alerts": {"PLACEMENT_SOFT": 2},
        ...         "autorecovery": {"auditor": "b1", "enabled": True}}
        >>> status_exit_code(fine)
        0
        >>> status_exit_code({**fine, "open_alerts": {"BOOKIE_LOST": 1}})
        1
        >>> status_exit_code({**fine, "stream": {"state": "lagging"}})
        3
    """
    autorecovery = report.get("autorecovery") or {}
    if (
        report["watcher"]["state"] != "up"
        or report["stream"]["state"] != "up"
        or report.get("error")
        or autorecovery.get("error")
        or report.get("low_disk")
    ):
        return EXIT_AUDITOR_UNHEALTHY
    if (
        any(_pages(kind) for kind in report.get("open_alerts") or {})
        or autorecovery.get("enabled") is False
        or autorecovery.get("auditor") is None
    ):
        return EXIT_CLUSTER_UNHEALTHY
    return EXIT_HEALTHY


def _pages(kind: str) -> bool:
    """An open alert of ``kind`` makes the cluster unhealthy (severity warning or critical; a kind this
    version does not know counts too)."""
    try:
        return AlertKind(kind).severity != "info"
    except ValueError:
        return True
