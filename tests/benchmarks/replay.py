"""The job alone under a recorded change stream: ``bench_stream.py --replay``.

ZooKeeper and the watcher need more than this machine's two cores at 10,000 changes/s (ZooKeeper alone costs
~0.2 ms of CPU per change), so this mode measures the streaming job without them. A child process plays the
watcher through the watcher's own publisher (:class:`~connectors.kafka.publisher.ChangePublisher`: same
keys, partitions, held tails released at the watcher's cadence, and event encoding). It publishes the START
snapshot of the bulk loader's cluster (:func:`bkaudit.sim.bulk.plan_ledgers`; every bookie writable, a rack
map, the recovery delay), and then, on ``go``, ledger metadata changes at ``--rate`` per second for
``--duration`` seconds (each a new znode version and mzxid of one of the cluster's ledgers, spread over all
of them), with a heartbeat to every partition each second as the watcher sends. Every change's event time
is its send time.

Figures:

- ``snapshot_ingest_s``: the job's start → every ledger a row of ``ledgers`` (the snapshot was on Kafka
  before the job started);
- ``offered_per_s``: changes the child sent per second of sending; ``applied_per_s``: changes applied per
  second, from the first send to the sink batch that applied the last one;
- ``lag_*``: per change, the wall time the ledger lane's sink finished the batch that applied it minus the
  wall time just before it was sent (p50, p99, max);
- ``job_rss_peak_mb``: the peak, sampled every 0.5 s from the job's start to the end of the drain, of the
  resident memory of the job's Python process (which also holds this benchmark's bookkeeping of the
  changes sent) plus its fold processes (``jvm_rss_peak_mb``: Spark's JVM, for the timers query, apart);
  ``job_bytes_per_ledger``: that peak, less an empty job's (``empty_job_rss_mb``, its last 5 of
  ``--baseline-settle-s`` seconds), over ``--ledgers``;
- ``lakehouse_mb_before`` / ``lakehouse_mb_after``: the lakehouse's tables on disk when the changes start
  and when the last one is applied, plus one fold interval (so the folds of the changes are in it); the
  fold's scratch (``_fold``: the mapped base of the ledger state, one file) is apart, in
  ``lakehouse_mb_by_table``;
- ``changes_mb``: the size of the change records offered (protobuf value plus key, as on Kafka).

Example:
    >>> planned_send_times(3, rate=2.0, start=10.0)
    [10.0, 10.5, 11.0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from connectors.delta._fold_process import FOLD_SCRATCH
from connectors.kafka.publisher import (
    TAIL_RELEASE_IDLE_S,
    TAIL_RELEASE_MAX_INTERVAL_S,
    TAIL_RELEASE_MIN_INTERVAL_S,
)

REPLAY_RUN_ID = "bench-replay"
CLUSTER = "bench-replay-cluster"


def planned_send_times(count: int, *, rate: float, start: float) -> list[float]:
    """When each of ``count`` changes is due at ``rate`` per second from ``start``."""
    return [start + n / rate for n in range(count)]


def _child(function: str, *args: Any) -> list[str]:
    code = f"import sys; from tests.benchmarks.replay import {function}; {function}(sys.argv[1:])"
    return [sys.executable, "-c", code, *[str(a) for a in args]]


class _Stat:
    """A znode stat for events built without ZooKeeper."""

    def __init__(self, mzxid: int, version: int, at_ms: int, length: int) -> None:
        self.czxid = 1
        self.mzxid = mzxid
        self.ctime = self.mtime = at_ms
        self.version = version
        self.dataLength = length


def _snapshot(
    publisher: Any, builder: Any, spec: Any, root: str, keep: set[int]
) -> tuple[int, dict[int, bytes]]:
    """Publish the START snapshot of ``spec``'s cluster; returns the last mzxid used and the encoded
    metadata of the ledgers in ``keep`` (the changes reuse it)."""
    from bkaudit.sim.bulk import plan_ledgers, planned_metadata
    from core import events as ev
    from core.domain.layout import ledger_path
    from core.domain.rackmap import parse_rack_map
    from core.domain.registration import decode_bookie_service_info
    from tests.benchmarks.bench_stream import RACK_MAP_PATH, _registration, snapshot_end

    partitions = publisher.partition_count
    snapshot = "bench-replay-snapshot"
    start, full = ev.SnapshotReason.START, ev.SnapshotMode.FULL
    counts_by_partition = dict.fromkeys(range(partitions), 0)

    def send(payload: Any, *, partition: int | None = None) -> None:
        used = publisher.publish(builder.build(payload, snapshot_id=snapshot), partition=partition)
        counts_by_partition[used] += 1

    for p in range(partitions):
        begin = ev.snapshot_begin(snapshot, start, full, partition=p, partition_count=partitions)
        publisher.publish(builder.build(begin, snapshot_id=snapshot), partition=p)
    send(ev.recovery_delay(0, present=True))
    group = {b.bookie_id: {"rack": b.rack, "hostname": b.bookie_id.split(":")[0]} for b in spec.bookies}
    send(
        ev.rack_map_event(
            RACK_MAP_PATH, parse_rack_map(json.dumps({"default": group}).encode()), present=True
        )
    )
    for placement in spec.bookies:
        info = decode_bookie_service_info(placement.bookie_id, _registration(placement.bookie_id))
        send(ev.bookie_status(placement.bookie_id, ev.BookieStatusValue.WRITABLE, info=info, has_cookie=True))
    zxid = 1000
    now_ms = int(time.time() * 1000)
    kept: dict[int, bytes] = {}
    for ledger in plan_ledgers(spec):
        zxid += 1
        md = planned_metadata(ledger, spec)
        path = ledger_path(ledger.ledger_id, root=root)
        payload = ev.ledger_upserted(ledger.ledger_id, md, _Stat(zxid, 0, now_ms, 200), path)
        send(payload)
        if ledger.ledger_id in keep:
            kept[ledger.ledger_id] = payload.metadata.SerializeToString()
    for p in range(partitions):
        end = snapshot_end(snapshot, spec.count, p, partitions, partition_events=counts_by_partition[p])
        publisher.publish(builder.build(end, snapshot_id=snapshot), partition=p)
    publisher.release_tails()
    publisher.flush(600)
    return zxid, kept


def _heartbeats(publisher: Any, builder: Any) -> None:
    from core import events as ev

    partitions = publisher.partition_count
    now_ms = builder.now_ms()
    for p in range(partitions):
        beat = ev.heartbeat(now_ms, partition=p, partition_count=partitions)
        publisher.publish(builder.build(beat, event_time_ms=now_ms), partition=p)


def _tails_due(idle_s: float, since_release_s: float) -> bool:
    """Whether the writer releases its held records now, at the watcher's cadence: after a pause once the
    minimum interval has passed, and at the maximum interval pause or not.

    Example:
        >>> _tails_due(0.005, 0.001), _tails_due(0.005, 0.03), _tails_due(0.0, 0.03), _tails_due(0.0, 0.06)
        (False, True, False, True)
    """
    if since_release_s >= TAIL_RELEASE_MAX_INTERVAL_S:
        return True
    return idle_s > TAIL_RELEASE_IDLE_S and since_release_s >= TAIL_RELEASE_MIN_INTERVAL_S


def writer_main(argv: list[str]) -> None:
    """Child: the snapshot, ``READY``, then on ``go`` changes at a fixed rate; writes what it sent."""
    from bkaudit.sim.bulk import BulkLoadSpec, synthetic_bookies
    from connectors.kafka.publisher import ChangePublisher
    from core import events as ev
    from core.domain.layout import ledger_path
    from core.events import kafka_key
    from core.settings import KafkaSettings

    kafka_json, root, ledgers, bookies, racks, seed, rate, duration, out_path = argv
    spec = BulkLoadSpec(
        bookies=synthetic_bookies(int(bookies), racks=int(racks)), count=int(ledgers), seed=int(seed)
    )
    publisher = ChangePublisher(KafkaSettings.model_validate_json(kafka_json), max_unacked=200_000)
    publisher.start()
    builder = ev.EventBuilder(CLUSTER, REPLAY_RUN_ID)
    # The changes: ledgers in an order coprime with the count (distinct while there are enough), their
    # metadata encoded during the snapshot so the sending loop only stamps versions and times.
    total = int(float(rate) * float(duration))
    ids = list(spec.ledger_ids())
    step = 7919 if len(ids) % 7919 else 7907
    order = [ids[(i * step) % len(ids)] for i in range(min(total, len(ids)))]
    started = time.monotonic()
    zxid, metadata = _snapshot(publisher, builder, spec, root, set(order))
    snapshot_s = time.monotonic() - started
    print(json.dumps({"ready": True, "snapshot_publish_s": round(snapshot_s, 1)}), flush=True)
    sys.stdin.readline()
    versions: dict[int, int] = {}
    sent: list[tuple[int, int, float]] = []
    offered_bytes = 0
    interval = 1.0 / float(rate)
    first = time.time()
    next_beat = time.monotonic()
    due = time.monotonic()
    released_at = time.monotonic()
    for n in range(total):
        ledger_id = order[n % len(order)]
        due += interval
        ahead = due - time.monotonic()
        if publisher.holding and _tails_due(ahead, time.monotonic() - released_at):
            publisher.release_tails()
            released_at = time.monotonic()
            ahead = due - time.monotonic()
        if ahead > TAIL_RELEASE_IDLE_S:
            time.sleep(ahead)
        if time.monotonic() >= next_beat:
            _heartbeats(publisher, builder)
            next_beat += 1.0
        version = versions[ledger_id] = versions.get(ledger_id, 0) + 1
        zxid += 1
        at = time.time()
        payload = ev.pb.LedgerUpserted(
            ledger_id=ledger_id,
            metadata=ev.pb.LedgerMetadata.FromString(metadata[ledger_id]),
            znode=ev.znode_stat(_Stat(zxid, version, int(at * 1000), 200)),
            path=ledger_path(ledger_id, root=root),
        )
        event = builder.build(payload)
        offered_bytes += event.ByteSize() + len(kafka_key(event))
        publisher.publish(event)
        sent.append((ledger_id, version, at))
    publisher.release_tails()
    finished = time.time()
    publisher.close(600)
    Path(out_path).write_text(
        json.dumps(
            {
                "sent": sent,
                "started": first,
                "finished": finished,
                "snapshot_publish_s": snapshot_s,
                "offered_bytes": offered_bytes,
            }
        )
    )


def _start_writer(
    args: argparse.Namespace, kafka: Any, root: str, out_path: Path
) -> tuple[Any, dict[str, Any]]:
    from tests.benchmarks.bench_stream import REPO

    writer = subprocess.Popen(
        _child(
            "writer_main",
            kafka.model_dump_json(),
            root,
            args.ledgers,
            args.bookies,
            args.racks,
            args.seed,
            float(str(args.rate).split(",")[0]),
            args.duration,
            out_path,
        ),
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert writer.stdout is not None
    line = writer.stdout.readline()
    if not line.strip():
        raise RuntimeError("the replay writer did not start")
    return writer, json.loads(line)


def rss_kb(pid: int) -> int:
    """Resident memory of process ``pid`` in kB (0: gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _status_kb(pid: int, fields: tuple[str, ...]) -> dict[str, int]:
    """Fields of ``/proc/<pid>/status`` in kB (those absent left out)."""
    found: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name = line.split(":")[0]
            if name in fields:
                found[name] = int(line.split()[1])
    except OSError:
        pass
    return found


def memory_mark(sink: Any) -> dict[str, Any]:
    """Where the job process's memory is now: its resident memory (anonymous, and file pages: the mapped
    base of the ledger state), Arrow's allocations, and the ledger state's holders in MB."""
    import pyarrow as pa

    status = _status_kb(os.getpid(), ("VmRSS", "RssAnon", "RssFile"))
    mark: dict[str, Any] = {name: round(kb / 1024, 1) for name, kb in status.items()}
    mark["arrow_allocated_mb"] = round(pa.total_allocated_bytes() / 2**20, 1)
    if sink is not None and sink.ledger_log.opened:
        mark["ledger_log_mb"] = {
            name: round(size / 2**20, 1) for name, size in sink.ledger_log.held_bytes().items()
        }
    return mark


def _children(pid: int) -> list[int]:
    """Every descendant of process ``pid`` (from /proc's per-thread children lists)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").glob("*"))
        except OSError:  # the process ended meanwhile
            continue
        for task in tasks:
            try:
                kids = [int(p) for p in (task / "children").read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def process_kind(command: str) -> str:
    """What a descendant of the benchmark is, from its command line.

    Example:
        >>> process_kind("python -m bkaudit.cli.main watch --zookeeper z")
        'watcher'
    """
    program = command.split(" ")[0]
    if "_fold_process" in command:
        return "fold"
    if "java" in program and "SparkSubmit" in command:
        return "spark_jvm"
    if "QuorumPeerMain" in command:
        return "zookeeper"
    if "bkaudit.cli.main watch" in command:
        return "watcher"
    if "tansu" in program or "kafka.Kafka" in command:
        return "broker"
    if "FullRead" in command or "full_read_main" in command:
        return "full_read"
    return "other"


def descendants_rss_kb() -> tuple[int, dict[str, int], list[int]]:
    """This process's resident memory now (kB), its descendants' summed by :func:`process_kind`, and the
    fold processes' pids."""
    by_kind: dict[str, int] = {}
    folds = []
    for pid in _children(os.getpid()):
        kind = process_kind(_cmdline(pid))
        by_kind[kind] = by_kind.get(kind, 0) + rss_kb(pid)
        if kind == "fold":
            folds.append(pid)
    return rss_kb(os.getpid()), by_kind, folds


class RssSampler:
    """Samples, every ``every_s`` in a thread, the resident memory of this process plus its fold processes
    (the job's Python side) and of Spark's JVM; keeps the peaks in MB.

    Example:
        >>> sampler = RssSampler(every_s=0.01); sampler.start(); time.sleep(0.05); sampler.stop()
        >>> sampler.job_peak_mb > 0
        True
    """

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s = every_s
        self.job_peak_mb = 0.0
        self.jvm_peak_mb = 0.0
        self.fold_peak_mb = 0.0
        self.fold_processes_seen = 0
        #: Peaks of every descendant by :func:`process_kind` (the watcher, ZooKeeper, ...), MB.
        self.kind_peaks_mb: dict[str, float] = {}
        self._window: dict[str, float] | None = None
        self._window_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-rss", daemon=True)
        self._seen: set[int] = set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.every_s):
                return

    def sample(self) -> None:
        job_kb, by_kind, folds = descendants_rss_kb()
        self._seen.update(folds)
        jvm_kb, fold_kb = by_kind.get("spark_jvm", 0), by_kind.get("fold", 0)
        self.fold_processes_seen = len(self._seen)
        with self._window_lock:
            for kind, kb in by_kind.items():
                self.kind_peaks_mb[kind] = round(max(self.kind_peaks_mb.get(kind, 0.0), kb / 1024), 1)
            self.job_peak_mb = max(self.job_peak_mb, (job_kb + fold_kb) / 1024)
            self.jvm_peak_mb = max(self.jvm_peak_mb, jvm_kb / 1024)
            self.fold_peak_mb = max(self.fold_peak_mb, fold_kb / 1024)
            if self._window is not None:
                self._window["job_mb"] = max(self._window["job_mb"], (job_kb + fold_kb) / 1024)
                self._window["main_mb"] = max(self._window["main_mb"], job_kb / 1024)
                self._window["fold_mb"] = max(self._window["fold_mb"], fold_kb / 1024)

    def open_window(self) -> None:
        """Start a window whose peaks :meth:`close_window` returns (the steady churn)."""
        with self._window_lock:
            self._window = {"job_mb": 0.0, "main_mb": 0.0, "fold_mb": 0.0}
        self.sample()

    def close_window(self) -> dict[str, float]:
        self.sample()
        with self._window_lock:
            window, self._window = self._window or {}, None
        return {name: round(value, 1) for name, value in window.items()}


def directory_mb(path: Path, *, skip: tuple[str, ...] = ()) -> float:
    """The size of the files under ``path`` in MB, without its top-level entries named in ``skip`` (0 when
    absent).

    Example:
        >>> directory_mb(Path("/nonexistent"))
        0.0
    """
    total = 0
    for folder, folders, names in os.walk(path):
        if folder == str(path):
            folders[:] = [name for name in folders if name not in skip]
        for name in names:
            try:
                total += os.path.getsize(os.path.join(folder, name))
            except OSError:  # removed meanwhile (a vacuum)
                continue
    return round(total / 1e6, 1)


def _by_table(lakehouse: Path) -> dict[str, float]:
    """MB per directory of the lakehouse (``_fold``: the fold's scratch, the mapped base of the ledger
    state, one file whatever the churn)."""
    return {table.name: directory_mb(table) for table in sorted(lakehouse.iterdir()) if table.is_dir()}


def table_split_mb(table_dir: Path) -> dict[str, float]:
    """A Delta table's size on disk in MB by what holds it: its log (``_delta_log``), the data files its
    newest version references, and the files it no longer references (awaiting a vacuum).

    Example:
        >>> table_split_mb(Path("/nonexistent"))
        {}
    """
    from deltalake import DeltaTable

    if not (table_dir / "_delta_log").is_dir():
        return {}
    try:
        referenced = DeltaTable(str(table_dir)).get_add_actions(flatten=True).column("size_bytes")
    except Exception:  # a commit landing meanwhile
        return {}
    log_mb = directory_mb(table_dir / "_delta_log")
    referenced_mb = round(sum(referenced.to_pylist()) / 1e6, 1)
    data_mb = directory_mb(table_dir, skip=("_delta_log",))
    return {"log": log_mb, "referenced": referenced_mb, "unreferenced": round(data_mb - referenced_mb, 1)}


#: The options that take a list, each value run one after the other (every combination).
VARIED = ("index_append_s",)


def run_replays(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`run_replay` once per variant, one after the other: every combination of the values of the
    list options (``--index-append-s 0,5``).
    The first variant's figures, and with more than one every variant's under ``by_variant``."""
    import copy
    import itertools

    choices = [[v.strip() for v in str(getattr(args, name)).split(",") if v.strip()] for name in VARIED]
    by_variant = {}
    for values in itertools.product(*choices):
        one = copy.copy(args)
        for name, value in zip(VARIED, values, strict=True):
            setattr(one, name, value)
        label = " ".join(f"{name}={value}" for name, value in zip(VARIED, values, strict=True))
        by_variant[label] = run_replay(one)
    first = next(iter(by_variant.values()))
    return {**first, "by_variant": by_variant} if len(by_variant) > 1 else first


def run_replay(args: argparse.Namespace) -> dict[str, Any]:
    """The snapshot, the job's ingest of it, then changes offered at ``--rate`` with the job alone."""
    import os
    import shutil
    import tempfile

    from bkaudit.testing.harness import ServiceHarness
    from connectors.kafka.topics import ensure_topic
    from streaming import job
    from tests.benchmarks.bench_stream import (
        SinkRecorder,
        Timers,
        _check,
        _instrument,
        _ledger_rows,
        _load,
        _note,
        _stop,
        _summary,
        _wait_idle,
        job_session_and_settings,
        wait_applied,
    )
    from tests.benchmarks.machine_probe import machine_probe_ms

    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="bkaudit-bench-replay-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    harness = ServiceHarness(state_dir / "services", zookeeper_heap="256m")
    harness.start()
    harness.stop_zookeeper()  # the job alone: no ZooKeeper, no watcher
    figures: dict[str, Any] = {
        "mode": "replay",
        "ledgers": args.ledgers,
        "bookies": args.bookies,
        "cpus": os.cpu_count(),
        "broker": harness.broker_kind,
        "load_average_at_start": _load(),
        "machine_probe_ms_at_start": machine_probe_ms(),
        "sink_queue_depth": args.sink_queue_depth,
        "index_append_s": args.index_append_s,
        "ledger_buckets": args.ledger_buckets,
        "fold_ticks": args.fold_ticks,
        "vacuum_rounds": args.vacuum_rounds,
        "fold_interval_s": args.fold_interval_s,
        "scrutiny": args.scrutiny,
    }
    writer = query = sink = recorder = timers = None
    sampler = RssSampler()
    marks: dict[str, Any] = {}
    try:
        kafka = harness.kafka_settings(topic_partitions=args.alert_partitions)
        ensure_topic(kafka, kafka.changes_topic, partitions=args.partitions)
        ensure_topic(kafka, kafka.alerts_topic, partitions=args.alert_partitions)
        spark, settings = job_session_and_settings(args, kafka, state_dir)
        baseline_mb = empty_job_rss_mb(spark, settings, state_dir / "empty-job", args.baseline_settle_s)
        _note(args, f"replay: an empty job's RSS {baseline_mb} MB")
        started = time.monotonic()
        writer, ready = _start_writer(args, kafka, "/ledgers", state_dir / "replay-sent.json")
        figures["snapshot_publish_s"] = ready["snapshot_publish_s"]
        _note(
            args, f"replay: snapshot of {args.ledgers} ledgers on Kafka in {time.monotonic() - started:.0f} s"
        )
        timers = Timers()
        _instrument(timers)
        started = time.monotonic()
        sampler.start()
        marks["before_start"] = memory_mark(None)
        query, sink = job.start(spark, settings)
        recorder = SinkRecorder(sink)
        lakehouse = Path(settings.lakehouse_root)
        rows = 0
        deadline = time.monotonic() + args.ingest_timeout
        while rows < args.ledgers and time.monotonic() < deadline:
            _check(query)
            rows = _ledger_rows(lakehouse)
            time.sleep(0.5)
        figures["snapshot_ingest_s"] = round(time.monotonic() - started, 1)
        figures["snapshot_ingest_complete"] = rows >= args.ledgers
        _note(args, f"replay: ingest {figures['snapshot_ingest_s']} s ({rows} rows)")
        if rows < args.ledgers:
            return figures
        marks["ingested"] = memory_mark(sink)
        _wait_idle(query, recorder, timeout_s=600)
        _wait_folded(sink, args.fold_interval_s * 4)
        marks["folded"] = memory_mark(sink)
        recorder.track_versions = True
        before_changes = timers.snapshot()
        figures["sink_helpers_ingest"] = Timers.delta(before_changes, {})
        figures["load_average_before_changes"] = _load()
        figures["machine_probe_ms_before_changes"] = machine_probe_ms()
        figures["lakehouse_mb_before"] = directory_mb(lakehouse, skip=(FOLD_SCRATCH,))
        figures["lakehouse_mb_by_table_before"] = _by_table(lakehouse)
        assert writer.stdin is not None
        sampler.open_window()
        timeline = Timeline(lakehouse, recorder, args.timeline_every_s)
        writer.stdin.write(b"go\n")
        writer.stdin.flush()
        timeline.start()
        writer.wait(args.duration * 20 + 600)
        # The timeline ends with the changes: the drain below builds this benchmark's own dicts of every
        # change sent and applied (GBs at millions of changes) in the job's process.
        figures["timeline"] = timeline.stop()
        figures["churn_rss_peak_mb"] = sampler.close_window()
        marks["churn_end"] = memory_mark(sink)
        result = json.loads((state_dir / "replay-sent.json").read_text())
        sent = {(ledger_id, version): at for ledger_id, version, at in result["sent"]}
        applied = wait_applied(query, recorder, sent, args.drain_timeout)
        with recorder.lock:
            batches = [b for b in recorder.batches if b["decisions"] and b["started"] >= result["started"]]
        lags = [applied[key] - sent[key] for key in applied]
        last_applied = max(applied.values(), default=result["finished"])
        time.sleep(args.fold_interval_s)  # one more fold interval: the changes' folds are in the size
        sampler.stop()
        figures["lakehouse_mb_after"] = directory_mb(lakehouse, skip=(FOLD_SCRATCH,))
        figures["lakehouse_mb_by_table"] = _by_table(lakehouse)
        figures["changes_mb"] = round(result.get("offered_bytes", 0) / 1e6, 1)
        figures["job_rss_peak_mb"] = round(sampler.job_peak_mb)
        figures["job_rss_scope"] = (
            f"the job's Python process (with this benchmark's bookkeeping) plus its fold processes "
            f"({sampler.fold_processes_seen} seen); Spark's JVM apart"
        )
        figures["jvm_rss_peak_mb"] = round(sampler.jvm_peak_mb)
        figures["fold_rss_peak_mb"] = round(sampler.fold_peak_mb)
        figures["memory_marks"] = marks
        figures["empty_job_rss_mb"] = baseline_mb
        figures["job_bytes_per_ledger"] = round(
            (figures["churn_rss_peak_mb"]["job_mb"] - baseline_mb) * 2**20 / max(args.ledgers, 1)
        )
        if sink is not None and sink.ledger_log.last_fold is not None:
            figures["last_fold"] = vars(sink.ledger_log.last_fold)
        figures.update(
            {
                "load_average_after_changes": _load(),
                "sink_helpers_changes": Timers.delta(timers.snapshot(), before_changes),
                "offered": len(sent),
                "offered_per_s": round(len(sent) / max(result["finished"] - result["started"], 1e-9)),
                "applied": len(applied),
                "applied_per_s": round(len(applied) / max(last_applied - result["started"], 1e-9)),
                "lag_s": _summary(lags) if lags else None,
                "batches": len(batches),
                "changes_per_batch": _summary([float(b["decisions"]) for b in batches], 0)
                if batches
                else None,
                "sink_seconds_per_batch": _summary([float(b["sink_seconds"] or 0) for b in batches]),
                "lag_timeline": lag_timeline(sent, applied, result["started"]),
                "slow_calls": [
                    {"name": name, "at_s": round(at - result["started"], 1), "seconds": round(took, 2)}
                    for name, at, took in timers.slow_calls
                    if at >= result["started"]
                ],
            }
        )
        job.stop_gracefully(query, timeout_s=120)
        query = None
        sink.close()  # folds every change into ledgers
        sink = None
        figures["truth"] = ledgers_against_sent(lakehouse, args.ledgers, result["sent"])
        if args.plot is not None and figures["timeline"]:
            args.plot.write_text(timeline_svg(figures["timeline"], title=_plot_title(args, figures)))
        return figures
    finally:
        if sampler._thread.is_alive():
            sampler.stop()
        if writer is not None:
            _stop(writer, 10)
        if timers is not None:
            timers.restore()
        if recorder is not None:
            recorder.restore()
        if query is not None:
            job.stop_gracefully(query, timeout_s=120)
        if sink is not None:
            sink.close()
        harness.stop()
        if args.state_dir is None:
            shutil.rmtree(state_dir, ignore_errors=True)


def job_rss_now_mb() -> dict[str, float]:
    """This process's resident memory and its fold processes' now, in MB."""
    main_kb, by_kind, _ = descendants_rss_kb()
    job_kb = main_kb + by_kind.get("fold", 0)
    return {"job_mb": round(job_kb / 1024, 1), "main_mb": round(main_kb / 1024, 1)}


class Timeline:
    """Every ``every_s`` from :meth:`start` to :meth:`stop` (none when 0), in a thread: the job's resident
    memory now, the lakehouse's size by table, this benchmark's own bookkeeping of the applied versions
    (in the job's process; not the job's), and the load. A soak reads from it whether they level off."""

    def __init__(self, lakehouse: Path, recorder: Any, every_s: float) -> None:
        self.lakehouse, self.recorder, self.every_s = lakehouse, recorder, every_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-timeline", daemon=True)
        self._started = 0.0

    def start(self) -> None:
        self._started = time.monotonic()
        if self.every_s > 0:
            self._thread.start()

    def stop(self) -> list[dict[str, Any]]:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            self.sample()
        return self.samples

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def sample(self) -> None:
        from tests.benchmarks.bench_stream import _load

        by_table = _by_table(self.lakehouse)
        with self.recorder.lock:
            bench_bytes = sum(
                ids.nbytes + versions.nbytes for ids, versions, _ in self.recorder._applied_parts
            )
        self.samples.append(
            {
                "at_s": round(time.monotonic() - self._started),
                **job_rss_now_mb(),
                "bench_bookkeeping_mb": round(bench_bytes / 2**20, 1),
                "lakehouse_mb": round(sum(by_table.values()), 1),
                # Without the ledgers' history, which grows with the changes for its retention (7 days).
                "lakehouse_mb_but_history": round(
                    sum(by_table.values()) - by_table.get("ledger_changes", 0), 1
                ),
                "lakehouse_mb_by_table": by_table,
                "index_mb_split": table_split_mb(self.lakehouse / "ledger_bookies"),
                "load": _load()[0],
            }
        )


def timeline_levels(timeline: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Whether a timeline levelled off: per series, its value at the first sample, at half time and at
    the end, and its growth per minute over the second half (MB/min).

    Example:
        >>> samples = [{"at_s": t, "job_mb": 100 + min(t, 60), "lakehouse_mb": t / 6} for t in (0, 60, 120)]
        >>> timeline_levels(samples)["job_mb"]
        {'first': 100, 'half': 160, 'last': 160, 'second_half_mb_per_min': 0.0}
    """
    if len(timeline) < 3:
        return None
    first, half, last = timeline[0], timeline[len(timeline) // 2], timeline[-1]
    minutes = max((last["at_s"] - half["at_s"]) / 60, 1e-9)
    return {
        name: {
            "first": first[name],
            "half": half[name],
            "last": last[name],
            "second_half_mb_per_min": round((last[name] - half[name]) / minutes, 2),
        }
        # job_mb counts a fold tick's child when one runs at the sample; main_mb is the job's process alone.
        for name in ("job_mb", "main_mb", "lakehouse_mb", "lakehouse_mb_but_history")
        if name in first
    }


def ledgers_against_sent(lakehouse: Path, ledgers: int, sent: list[list[Any]]) -> dict[str, int]:
    """The ``ledgers`` table (read raw, after the job's last fold) against what the writer sent: every
    ledger once, none deleted, each at the last znode version sent (0: none sent, the snapshot's)."""
    import numpy as np
    from deltalake import DeltaTable

    table = DeltaTable(str(lakehouse / "ledgers")).to_pyarrow_table(
        columns=["ledger_id", "znode_version", "deleted"]
    )
    ids = table.column("ledger_id").to_numpy()
    expected = {int(i): 0 for i in ids}
    for ledger_id, version, _ in sent:
        expected[int(ledger_id)] = max(expected.get(int(ledger_id), 0), int(version))
    found = table.column("znode_version").to_numpy(zero_copy_only=False)
    want = np.array([expected[int(i)] for i in ids], dtype=np.int64)
    deleted = table.column("deleted").to_numpy(zero_copy_only=False).astype(bool)
    return {
        "ledgers_expected": ledgers,
        "rows": table.num_rows,
        "distinct_ledgers": len(np.unique(ids)),
        "deleted": int(deleted.sum()),
        "wrong_version": int((found != want).sum()),
        "sent_not_in_table": len(set(expected) - set(ids.tolist())),
    }


def _plot_title(args: argparse.Namespace, figures: dict[str, Any]) -> str:
    return (
        f"{args.ledgers:,} ledgers, {float(str(args.rate).split(',')[0]):,.0f} changes/s for "
        f"{args.duration:.0f} s; load {figures.get('load_average_before_changes')}"
    )


def timeline_svg(timeline: list[dict[str, Any]], *, title: str, width: int = 720, height: int = 320) -> str:
    """A line chart of a timeline's job memory and lakehouse size, whole and without the history (MB),
    against time (minutes), as SVG.

    Example:
        >>> svg = timeline_svg([{"at_s": 0, "job_mb": 1, "lakehouse_mb": 2}, {"at_s": 60, "job_mb": 3,
        ...     "lakehouse_mb": 2}], title="t")
        >>> svg.startswith("<svg") and svg.count("<polyline") == 3
        True
    """
    series = (
        ("job_mb", "#1f77b4", "job RSS (MB)"),
        ("lakehouse_mb", "#d62728", "lakehouse (MB)"),
        ("lakehouse_mb_but_history", "#2ca02c", "lakehouse but ledger_changes (MB)"),
    )
    left, right, top, bottom = 60, 20, 40, 40
    end_s = max(max(s["at_s"] for s in timeline), 1)
    top_mb = max(max(s.get(name, 0) for s in timeline) for name, _, _ in series) * 1.1 or 1
    x = lambda at_s: left + (width - left - right) * at_s / end_s  # noqa: E731
    y = lambda mb: height - bottom - (height - top - bottom) * mb / top_mb  # noqa: E731
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        f'font-size="12"><rect width="100%" height="100%" fill="white"/>',
        f'<text x="{left}" y="20">{title}</text>',
        f'<line x1="{left}" y1="{y(0)}" x2="{width - right}" y2="{y(0)}" stroke="black"/>',
        f'<line x1="{left}" y1="{y(0)}" x2="{left}" y2="{top}" stroke="black"/>',
        f'<text x="{width - right}" y="{height - 10}" text-anchor="end">{end_s / 60:.0f} min</text>',
        f'<text x="{left - 5}" y="{top + 4}" text-anchor="end">{top_mb:,.0f}</text>',
        f'<text x="{left - 5}" y="{y(0) + 4}" text-anchor="end">0</text>',
    ]
    for n, (name, colour, label) in enumerate(series):
        points = " ".join(f"{x(s['at_s']):.1f},{y(s.get(name, 0)):.1f}" for s in timeline)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>')
        parts.append(f'<text x="{left + 10 + 200 * n}" y="{top + 14}" fill="{colour}">{label}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def empty_job_rss_mb(spark: Any, settings: Any, state_dir: Path, settle_s: float = 20.0) -> float:
    """The resident memory of this process (plus fold processes: none) while a job with no ledgers runs (its
    own tables and checkpoints under ``state_dir``, the changes topic still empty): the baseline the ledger
    state's bytes are counted above. The peak of its last 5 of ``settle_s`` seconds (all of them if fewer)."""
    from streaming import job

    empty = settings.model_copy(
        update={"lakehouse_root": state_dir / "lakehouse", "checkpoint_root": state_dir / "checkpoints"}
    )
    query, sink = job.start(spark, empty)
    try:
        deadline = time.monotonic() + settle_s
        samples = []
        while time.monotonic() < deadline:
            time.sleep(0.5)
            samples.append(rss_kb(os.getpid()) / 1024)
        return round(max(samples[-10:]), 1)
    finally:
        job.stop_gracefully(query, timeout_s=60)
        sink.close()


def _wait_folded(sink: Any, timeout_s: float) -> bool:
    """Wait until the ledger state's overlay is folded into its base (the snapshot's rows in columns)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        held = sink.ledger_log.held_bytes()
        if held["overlay_rows"] == 0 and held.get("base_ledgers", held.get("base_rows", 0)) > 0:
            return True
        time.sleep(1)
    return False


def lag_timeline(
    sent: dict[Any, float], applied: dict[Any, float], started: float, bucket_s: float = 5.0
) -> list[dict[str, Any]]:
    """Per ``bucket_s`` of send time from ``started``: the changes sent, and their lag's p50 and max (where
    the tail of the lag comes from: a steady climb means too little capacity, a spike one slow step).

    Example:
        >>> timeline = lag_timeline({"a": 0.0, "b": 1.0, "c": 6.0}, {"a": 1.0, "b": 4.0, "c": 6.5}, 0.0)
        >>> [(bucket["at_s"], bucket["sent"], bucket["lag_max_s"]) for bucket in timeline]
        [(0, 2, 3.0), (5, 1, 0.5)]
    """
    buckets: dict[int, list[float]] = {}
    for key, at in sent.items():
        if key in applied:
            buckets.setdefault(int((at - started) // bucket_s), []).append(applied[key] - at)
    timeline = []
    for bucket, lags in sorted(buckets.items()):
        lags.sort()
        timeline.append(
            {
                "at_s": int(bucket * bucket_s),
                "sent": len(lags),
                "lag_p50_s": round(lags[len(lags) // 2], 2),
                "lag_max_s": round(lags[-1], 2),
            }
        )
    return timeline


def summary_line(figures: dict[str, Any]) -> dict[str, Any]:
    """The replay's named figures, for the one JSON line.

    Example:
        >>> summary_line({"ledgers": 5, "offered_per_s": 10, "applied_per_s": 9,
        ...               "lag_s": {"p50": 0.5, "p99": 1.0, "max": 2.0}})["lag_p99_s"]
        1.0
    """
    from tests.benchmarks.bench_stream import _load

    lag = figures.get("lag_s") or {}
    line = {
        "mode": "replay",
        "broker": figures.get("broker"),
        "index_append_s": figures.get("index_append_s"),
        "ledgers": figures.get("ledgers"),
        "offered_per_s": figures.get("offered_per_s"),
        "applied_per_s": figures.get("applied_per_s"),
        "lag_p50_s": lag.get("p50"),
        "lag_p99_s": lag.get("p99"),
        "lag_max_s": lag.get("max"),
        "snapshot_ingest_s": figures.get("snapshot_ingest_s"),
        "sink_queue_depth": figures.get("sink_queue_depth"),
        "ledger_buckets": figures.get("ledger_buckets"),
        "fold_ticks": figures.get("fold_ticks"),
        "vacuum_rounds": figures.get("vacuum_rounds"),
        "scrutiny": figures.get("scrutiny"),
        "offered": figures.get("offered"),
        "applied": figures.get("applied"),
        "changes_mb": figures.get("changes_mb"),
        "lakehouse_mb_before": figures.get("lakehouse_mb_before"),
        "lakehouse_mb_after": figures.get("lakehouse_mb_after"),
        "job_rss_peak_mb": figures.get("job_rss_peak_mb"),
        "job_bytes_per_ledger": figures.get("job_bytes_per_ledger"),
        "empty_job_rss_mb": figures.get("empty_job_rss_mb"),
        "churn_rss_peak_mb": figures.get("churn_rss_peak_mb"),
        "fold_rss_peak_mb": figures.get("fold_rss_peak_mb"),
        "jvm_rss_peak_mb": figures.get("jvm_rss_peak_mb"),
        "truth": figures.get("truth"),
        "timeline_levels": timeline_levels(figures.get("timeline") or []),
        "load_avg": {
            "start": figures.get("load_average_at_start"),
            "before_changes": figures.get("load_average_before_changes"),
            "end": _load(),
        },
        "machine_probe_ms": {
            "start": figures.get("machine_probe_ms_at_start"),
            "before_changes": figures.get("machine_probe_ms_before_changes"),
        },
    }
    if figures.get("by_variant"):
        line["by_variant"] = {
            variant: {k: v for k, v in summary_line(one).items() if k != "mode"}
            for variant, one in figures["by_variant"].items()
        }
    return line
