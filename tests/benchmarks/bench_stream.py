"""Benchmark: lost bookie → its ledgers' alerts on Kafka, against a full read of all ledger metadata.

Starts its own embedded ZooKeeper and broker (:class:`~bkaudit.testing.ServiceHarness`) in a
temporary directory, bulk-loads N closed ledgers over B bookies in R racks
(:func:`bkaudit.sim.bulk.bulk_load`, hierarchical layout), writes the rest of a BookKeeper cluster's znodes
(``INSTANCEID``, ``available/``, ``cookies/``, ``underreplication/lostBookieRecoveryDelay`` = 0, Pulsar's
``/bookies`` rack map), registers every bookie (a cookie each; every ephemeral ``available/<id>`` held by one
extra kazoo session), then runs the watcher (``bkaudit watch``, a child process) and the Structured
Streaming job (:func:`streaming.job.start`, ``local[2]``, in this process). Everything else that does work
while the job runs is a child process too (ZooKeeper writer, full reads), so nothing shares the job's GIL.
Prints one JSON document:

- ``full_read``: what BookKeeper's Auditor does for a lost bookie (``BookieLedgerIndexer``: list every
  ledger znode, read every one's metadata), on the same ZooKeeper, before the watcher and the job start
  (nothing else running: the baseline at its fastest). ``java``: the ZooKeeper Java client (the Auditor's
  own client; pyspark ships the jars), async ``getData`` with ``--read-in-flight`` outstanding — the
  baseline of record. ``kazoo``: the same with kazoo, for reference. ``java_under_job``: the Java read again
  while the watcher and the job run;
- ``snapshot``: the watcher's START snapshot (from its log line) and the job's ingest of it: time from the
  query's start until every ledger is a row of the ``ledgers`` Delta table (row count from the Delta log's
  add actions, no data read), ledgers/s, micro-batches;
- ``loss``: for each of ``--losses`` bookies, ``t0`` = just before its ``available/<id>`` znode is deleted
  (a graceful loss; ``lostBookieRecoveryDelay`` is 0). The job's membership lane (micro-batches in a driver
  thread, every ``--membership-trigger-s``) hands the loss to the loss owner (``sink.loss``), which encodes
  every alert of the bookie's ledgers in bulk and sends them in one
  :func:`streaming.publish.publish_records` call. An alert is "on Kafka" when
  that call returned: it waits for the broker's acknowledgement of every record (:class:`AlertAcks`; a
  consumer would time the embedded broker's fetch path, which serves backlogs of one-record batches at a
  few hundred records/s). Figures: time to ``BOOKIE_LOST``, to the first and to the last firing
  ``LEDGER_UNDER_REPLICATED``/``LEDGER_UNRECOVERABLE`` of the bookie's ledgers (all of
  ``bookie_ledger_index``'s ledgers required), and a timeline (watcher event time, membership trigger and
  batch, loss owner's publish start/acked, Delta recorded). The bookie then registers again and the time
  until all its alerts are resolved is reported (the next loss starts clean);
- ``ratio_full_read_to_last_alert``: Java full read time / loss-to-last-alert time (p50 of the losses, and
  the first loss alone: "from one run");
- ``sustained``: ledger znodes rewritten through ZooKeeper (``set`` of the same bytes: new version and
  mzxid, so the watcher reads and publishes each) at each ``--rate``/s for ``--duration`` s by a child
  process; each change's end-to-end lag = wall time the job's sink finished the micro-batch that applied it
  (the sink's ``process`` is wrapped) − wall time just before its ``set``: applied events/s, p50/p90/p99/max;
- ``profile``: where the job's time goes — per phase the query's ``durationMs`` sums (``addBatch`` is the
  whole Spark pipeline: Kafka source → decode → transformWithStateInPandas → the sink), the sink's own
  seconds, timers around the sink's Delta writes, index reads and alert publishing (wrapped in this process
  only; the code is unchanged), and with ``--spark-ui`` per-stage and per-task times from Spark's REST API.

``--replay`` (:mod:`tests.benchmarks.replay`) measures the job alone: a recorded change stream offered at
``--rate`` for ``--duration`` while ZooKeeper and the watcher are not running.

``--sink-only`` (:func:`run_sink_scale`) measures the sink alone at full scale, without ZooKeeper, watcher
or Spark: the START snapshot's decisions (built with the job's own decode and processor logic) go to the
unchanged sink in batches, then the losses, optionally with several alert producer batch sizes.

Targets: loss → last alert ≤ 1.0 s p50 with 1 M ledgers on 100 bookies and ≥ 100× faster than the Java full
read; ≤ 0.6 s p50 at 20 k ledgers. The script ends with one JSON line of the named figures
(:func:`summary_line`) after the whole document.

Run as a script for the full figure (long: run it in the background), or through pytest (``-m benchmark``)
at a small count::

    python tests/benchmarks/bench_stream.py --ledgers 1000000 --bookies 100 --racks 10
    python tests/benchmarks/bench_stream.py --sink-only --ledgers 1000000 --alert-batch-sizes 0,262144
    pytest tests/benchmarks/bench_stream.py -m benchmark -s -o addopts=""

Example:
    >>> _parse_args(["--ledgers", "10"]).ledgers
    10
    >>> _percentile([1.0, 2.0, 3.0, 4.0], 0.5)
    3.0
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

PYTEST_LEDGERS = 20_000
INSTANCE_ID = "bench-0000-4000-8000-000000000002"
RACK_MAP_PATH = "/bookies"
LOST_KINDS = ("LEDGER_UNDER_REPLICATED", "LEDGER_UNRECOVERABLE")
REPO = Path(__file__).resolve().parents[2]

logger = logging.getLogger("bench_stream")


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add = parser.add_argument
    add("--ledgers", type=int, default=1_000_000)
    add("--bookies", type=int, default=100)
    add("--racks", type=int, default=10)
    add("--seed", type=int, default=0)
    add("--heap", default="3g", help="ZooKeeper JVM heap")
    add("--partitions", type=int, default=4, help="partitions of the changes topic")
    add("--alert-partitions", type=int, default=4, help="partitions of the alerts topic")
    add("--master", default="local[2]")
    add("--shuffle-partitions", type=int, default=4)
    add("--driver-memory", default="4g")
    add(
        "--membership-trigger-s",
        type=float,
        default=0.1,
        help="stream.membership_trigger_interval_s (the membership lane)",
    )
    add("--watermark-s", type=float, default=5.0, help="stream.watermark_delay_s")
    add("--local-nice", type=int, default=None, help="spark.local_nice (default: the setting's default)")
    add(
        "--loss-variants",
        default="",
        help="side by side in one run: NICE[:TAIL] pairs, comma-separated (e.g. 0:0,10:1); loss i runs with "
        "variant i mod n: the Spark JVM and its Python workers reniced to NICE before it (lowering a nice "
        "needs root), the membership lane's tail consumer on (TAIL 1, the default) or off (0)",
    )
    add(
        "--disruption-settle-s",
        type=float,
        default=None,
        help="stream.zookeeper_disruption_settle_s (default: the setting's; 0 = BookKeeper's rules only)",
    )
    add("--max-offsets", type=int, default=0, help="stream.max_offsets_per_trigger (0: unlimited)")
    add("--timers-trigger-s", type=float, default=5.0, help="stream.timers_trigger_interval_s")
    add("--lane-interval-s", type=float, default=1.0, help="stream.ledger_lane_interval_s")
    add("--fold-interval-s", type=float, default=30.0, help="stream.ledger_fold_interval_s")
    add("--ledger-buckets", type=int, default=256, help="stream.ledger_table_buckets (16: the old layout)")
    add("--fold-ticks", type=int, default=10, help="stream.ledger_fold_ticks (1: a whole fold per interval)")
    add("--vacuum-rounds", type=int, default=3, help="stream.ledger_vacuum_rounds (0: no vacuum by the fold)")
    add(
        "--index-append-s",
        default="5",
        help="stream.index_append_interval_s; --replay takes a list (0,5) and runs each, one after the other",
    )
    add(
        "--sink-queue-depth",
        type=int,
        default=1,
        help="stream.sink_queue_depth (0: the sink inside each batch)",
    )
    add("--snapshot-timeout", type=float, default=7200.0, help="seconds for the watcher's snapshot")
    add("--ingest-timeout", type=float, default=7200.0, help="seconds for the job's snapshot ingest")
    add("--losses", type=int, default=3, help="bookies lost one after another")
    add("--loss-timeout", type=float, default=600.0)
    add("--read-in-flight", type=int, default=1000, help="full read: gets outstanding")
    add("--full-read-clients", default="java,kazoo", help="full reads before the job: java, kazoo")
    add("--rate", default="10000", help="sustained: znode sets per second; a list (100,1000) runs each")
    add("--duration", type=float, default=60.0, help="sustained: seconds of writing")
    add("--set-in-flight", type=int, default=2000, help="sustained: sets outstanding")
    add("--drain-timeout", type=float, default=600.0, help="sustained: wait for the job to apply all")
    add(
        "--watcher-batch-size",
        type=int,
        help="the watcher's kafka.producer_batch_size (0: one record per batch); default: the setting's",
    )
    add("--spark-ui", action="store_true", help="enable Spark's UI: per-stage times (binds a port)")
    add("--skip-loss", action="store_true")
    add("--skip-full-read", action="store_true")
    add("--skip-sustained", action="store_true")
    add(
        "--sink-only",
        action="store_true",
        help="no ZooKeeper/watcher/Spark: feed the sink the decisions of the START snapshot, then losses",
    )
    add(
        "--replay",
        action="store_true",
        help="the job alone: a recorded change stream offered at --rate for --duration (replay.py)",
    )
    add(
        "--baseline-settle-s",
        type=float,
        default=20.0,
        help="--replay: seconds an empty job runs for the memory baseline (job_bytes_per_ledger)",
    )
    add(
        "--timeline-every-s",
        type=float,
        default=0.0,
        help="--replay: sample the job's memory and the lakehouse's size this often during the changes "
        "(a soak's levelling off; 0: peaks only)",
    )
    add("--plot", type=Path, help="--replay with --timeline-every-s: draw the timeline here (SVG)")
    add(
        "--maintenance-every",
        type=int,
        default=0,
        help="stream.maintenance_every_batches (0: no Delta maintenance during a measurement)",
    )
    add(
        "--scrutiny",
        choices=("on", "off"),
        default="off",
        help="the job's background replicas check and probe at close (stream.scrutiny_*). Off by default: "
        "the synthetic bookies' addresses answer no probe, so every probe fails and its re-probes pile up "
        "(rounds, then a recheck every 5 minutes), which no cluster with live bookies does",
    )
    add("--changes-retention-hours", type=float, help="stream.ledger_changes_retention_hours")
    add("--maintenance-retention-hours", type=int, help="stream.maintenance_retention_hours")
    add("--sink-chunk", type=int, default=100_000, help="--sink-only: decisions per sink batch")
    add("--profile-sink", action="store_true", help="--sink-only: cProfile the first loss's sink batch")
    add(
        "--alert-batch-sizes",
        default="0",
        help="--sink-only: producer batch_size for the sink's alerts, a list runs the losses once each "
        "(0: one record per request, the default for the embedded broker)",
    )
    add("--state-dir", type=Path, help="services and lakehouse here, kept (default: a temp dir, removed)")
    add("--progress-file", type=Path, help="append a line per phase here (for long runs)")
    return parser.parse_args(argv)


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def _summary(values: list[float], digits: int = 3) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": round(statistics.median(values), digits),
        "p90": round(_percentile(values, 0.90), digits),
        "p99": round(_percentile(values, 0.99), digits),
        "max": round(max(values), digits),
        "mean": round(statistics.fmean(values), digits),
    }


def _load() -> list[float]:
    return [round(x, 1) for x in os.getloadavg()]


# ------------------------------------------------------------------------------------------------ profiling


class Timers:
    """Accumulated wall time and call counts per name, around functions patched in this process."""

    #: Calls at least this long are also kept one by one, with when they ran (wall clock).
    SLOW_CALL_S = 0.5

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.slow_calls: list[tuple[str, float, float]] = []  # (name, wall-clock start, seconds)
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started, wall = time.perf_counter(), time.time()
            try:
                return original(*args, **kwargs)
            finally:
                took = time.perf_counter() - started
                self.seconds[name] += took
                self.calls[name] += 1
                if took >= self.SLOW_CALL_S:
                    self.slow_calls.append((name, wall, took))

        setattr(owner, attribute, timed)
        self._undo.append((owner, attribute, original))

    def restore(self) -> None:
        for owner, attribute, original in reversed(self._undo):
            setattr(owner, attribute, original)
        self._undo.clear()

    def snapshot(self) -> dict[str, tuple[float, int]]:
        return {name: (self.seconds[name], self.calls[name]) for name in self.seconds}

    @staticmethod
    def delta(after: dict[str, tuple[float, int]], before: dict[str, tuple[float, int]]) -> dict[str, Any]:
        out = {}
        for name, (seconds, calls) in sorted(after.items()):
            s0, c0 = before.get(name, (0.0, 0))
            if calls - c0:
                out[name] = {"seconds": round(seconds - s0, 2), "calls": calls - c0}
        return out


def _instrument(timers: Timers) -> None:
    """Timers around the sink's expensive helpers (this process only; the code itself is unchanged)."""
    import streaming.loss as loss_module
    import streaming.sink as sink_module
    from connectors.delta import ledger_log, tables
    from streaming.probe_stage import ProbeStage

    for method in ("upsert", "replace_keys", "append"):
        timers.wrap(tables.BatchWriter, method, f"delta.{method}")
    timers.wrap(sink_module, "table_before_batch", "delta.open_before_batch")
    timers.wrap(sink_module, "_decision_rows", "sink.decision_rows")
    timers.wrap(sink_module.AuditSink, "_read_state", "sink.read_state")
    timers.wrap(sink_module, "apply_decisions", "sink.apply_decisions")
    timers.wrap(sink_module, "evaluate_ledgers", "sink.evaluate_placement")
    timers.wrap(sink_module.AuditSink, "_write_tables", "sink.write_tables")
    timers.wrap(sink_module.AuditSink, "_hand_to_loss_owner", "sink.loss_owner")
    timers.wrap(ledger_log.LedgerLog, "record", "ledger_log.record")
    timers.wrap(ledger_log.LedgerLog, "fold", "ledger_log.fold")
    timers.wrap(ledger_log.LedgerLog, "clean_index", "ledger_log.clean_index")
    timers.wrap(sink_module.AuditSink, "_vanished", "sink.snapshot_reconcile")
    timers.wrap(sink_module.AuditSink, "_publish", "sink.publish_kafka")
    timers.wrap(ProbeStage, "run", "sink.probes")
    timers.wrap(loss_module.LossAuditor, "apply", "loss.apply")
    timers.wrap(loss_module.LossAuditor, "_from_index", "loss.index_read")
    timers.wrap(loss_module.LossAuditor, "_evaluate", "loss.index_read_and_rule")
    timers.wrap(loss_module, "ledger_transitions", "loss.transitions")
    timers.wrap(loss_module.LossAuditor, "_publish", "loss.encode_and_publish")
    timers.wrap(loss_module.LossAuditor, "_record", "loss.record_delta")


class AlertAcks:
    """When the broker acknowledged each alert the sink published: the moment it is on Kafka.

    The sink's producer ``send`` gets a callback (run on the producer's I/O thread) that keeps the ack's wall
    time and the record; records are parsed only when asked. (A consumer's arrival times would measure the
    embedded broker's fetch path instead: Tansu serves a backlog of one-record batches at a few hundred
    records/s, so a consumer falls minutes behind a 6,000-alert burst.)
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._raw: list[tuple[float, bytes | dict[str, Any]]] = []
        self.arrivals: dict[tuple[str, str, str], float] = {}

    def acked(self, value: bytes) -> None:
        at = time.time()
        with self.lock:
            self._raw.append((at, value))

    def published(self, at: float, alerts: list[dict[str, Any]]) -> None:
        """Alerts the sink's publish call returned at ``at``: all acknowledged by then (an upper bound)."""
        with self.lock:
            self._raw.extend((at, alert) for alert in alerts)

    def _parse(self) -> None:
        with self.lock:
            raw, self._raw = self._raw, []
        for at, value in raw:
            alert = json.loads(value) if isinstance(value, bytes) else value
            ledger = alert.get("ledger_id")
            entity = str(ledger) if ledger is not None else (alert.get("bookies") or ["?"])[0]
            key = (alert["kind"], entity, alert["state"])
            self.arrivals[key] = min(self.arrivals.get(key, at), at)

    def times(self, kinds: tuple[str, ...], entities: set[str], state: str) -> dict[str, float]:
        """Entity → first ack of a ``state`` alert of one of ``kinds``, among ``entities``."""
        self._parse()
        found: dict[str, float] = {}
        for (kind, entity, seen_state), at in self.arrivals.items():
            if seen_state == state and kind in kinds and entity in entities:
                found[entity] = min(found.get(entity, at), at)
        return found

    def forget(self) -> None:
        self._parse()
        self.arrivals.clear()


class SinkRecorder:
    """Wraps one job's two lanes: per ledger-lane batch when ``process`` ran and the ledger versions it
    applied; per loss-owner call (``sink.loss.apply``, from either
    lane) when it ran and the event time of every ``bookie_lost`` it carried; per ``publish`` call (both
    lanes' one send path, :func:`streaming.publish.publish`, which returns once every record is acked) its
    wall times and alerts (:class:`AlertAcks`)."""

    def __init__(self, sink: Any, acks: AlertAcks | None = None) -> None:
        import streaming.loss as loss_module
        import streaming.sink as sink_module

        self.sink = sink
        self.original = sink.process
        self.lock = threading.Lock()
        self.batches: list[dict[str, Any]] = []
        self.loss_calls: list[dict[str, Any]] = []  # one per sink.loss.apply call that carried membership
        self.publishes: list[tuple[float, float]] = []  # (started, returned: every record acked)
        # (ledger id, znode version) -> wall time applied: kept as arrays per batch while the job runs (a
        # dict of 600,000 changes would be ~100 MB of this benchmark's in the job's measured process)
        self._applied: dict[tuple[int, int], float] = {}
        self._applied_parts: list[tuple[Any, Any, float]] = []
        self.track_versions = False
        # bookie -> (event time of its bookie_lost decision, the loss call's index in loss_calls)
        self.lost_event_times: dict[str, tuple[float, int]] = {}
        self.acks = acks or AlertAcks()
        self._undo: list[tuple[Any, str, Any]] = []
        # Instance attributes: the lanes look these up on self; ``publish`` is looked up in each module.
        self._patch(sink, "process", self.process)
        self._patch(sink.loss, "apply", self._timed_apply(sink.loss.apply))
        # The loss owner sends records it encoded in bulk; the ledger lane sends Alert objects.
        self._patch(loss_module, "publish_records", self._timed_publish(loss_module.publish_records))
        self._patch(sink_module, "publish", self._timed_publish(sink_module.publish))

    def _patch(self, owner: Any, attribute: str, replacement: Any) -> None:
        self._undo.append((owner, attribute, getattr(owner, attribute)))
        setattr(owner, attribute, replacement)

    def restore(self) -> None:
        for owner, attribute, original in reversed(self._undo):
            setattr(owner, attribute, original)
        self._undo.clear()

    def _timed_publish(self, publish: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.time()
            try:
                published = publish(*args, **kwargs)
                self.acks.published(time.time(), published or [])
                return published
            finally:
                with self.lock:
                    self.publishes.append((started, time.time()))

        return timed

    def _timed_apply(self, apply: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            membership = list(kwargs.get("membership") or ())
            started = time.time()
            report = apply(*args, **kwargs)
            if membership:
                with self.lock:
                    self.loss_calls.append(
                        {
                            "app_id": kwargs.get("app_id"),
                            "batch_id": kwargs.get("batch_id"),
                            "started": started,
                            "published_at": getattr(report, "published_at", None),
                            "finished": time.time(),
                            "alerts": len(getattr(report, "values", None) or []),
                            "phase_s": dict(getattr(report, "phase_s", None) or {}),
                        }
                    )
                    for row in membership:
                        if row["kind"] == "bookie_lost":
                            entry = (row["at_ms"] / 1000.0, len(self.loss_calls) - 1)
                            self.lost_event_times.setdefault(row["bookie_id"], entry)
            return report

        return timed

    def process(self, decisions: Any, batch_id: int) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        started = time.time()
        keys: tuple[Any, Any] | None = None
        if self.track_versions and decisions.num_rows:
            states = decisions.filter(pc.equal(decisions.column("kind"), "ledger_state"))
            if states.num_rows:
                found = pc.extract_regex(states.column("payload"), r'"version":(?P<v>-?\d+)')
                versions = pc.struct_field(found, "v")
                known = pc.is_valid(versions)
                ids = states.column("ledger_id").filter(known).to_numpy()
                keys = (ids, pc.cast(versions.filter(known), pa.int64()).to_numpy())
        report = self.original(decisions, batch_id)
        finished = time.time()
        with self.lock:
            self.batches.append(
                {
                    "batch_id": batch_id,
                    "started": started,
                    "finished": finished,
                    "decisions": decisions.num_rows,
                    "sink_seconds": getattr(report, "seconds", None),
                    "alerts": len(getattr(report, "alerts", None) or []),
                    "ledgers_written": getattr(report, "ledgers_written", 0),
                }
            )
            if keys is not None:
                self._applied_parts.append((*keys, finished))
        return report

    @property
    def applied(self) -> dict[tuple[int, int], float]:
        """(ledger id, znode version) -> when the batch that first applied it finished (call holding
        ``lock``)."""
        for ids, versions, finished in self._applied_parts:
            for key in zip(ids.tolist(), versions.tolist(), strict=True):
                self._applied.setdefault(key, finished)
        self._applied_parts.clear()
        return self._applied


def _query_progress(query: Any) -> list[dict[str, Any]]:
    return [p if isinstance(p, dict) else json.loads(p.json) for p in query.recentProgress]


def _progress_profile(progress: list[dict[str, Any]], since_batch: int = -1) -> dict[str, Any]:
    """Sums of the query's per-batch durations (s) over batches after ``since_batch``."""
    totals: dict[str, float] = defaultdict(float)
    batches = rows = dropped = 0
    for entry in progress:
        if entry.get("batchId", -1) <= since_batch:
            continue
        batches += 1
        rows += int(entry.get("numInputRows") or 0)
        for operator in entry.get("stateOperators") or []:
            dropped += int(operator.get("numRowsDroppedByWatermark") or 0)
        for name, value in (entry.get("durationMs") or {}).items():
            totals[name] += value / 1000
    return {
        "batches": batches,
        "input_rows": rows,
        "rows_dropped_by_watermark": dropped,
        "duration_s": {name: round(value, 2) for name, value in sorted(totals.items())},
    }


def _batch_durations(query: Any, batch_ids: set[int]) -> list[dict[str, Any]]:
    """The query's progress (trigger start, input rows, durationMs) of the given micro-batches."""
    return [
        {
            "batch_id": p.get("batchId"),
            "timestamp": p.get("timestamp"),
            "rows": p.get("numInputRows"),
            "ms": p.get("durationMs"),
        }
        for p in _query_progress(query)
        if p.get("batchId") in batch_ids
    ]


def _iso_s(text: str) -> float:
    """Epoch seconds of a progress timestamp (``2026-01-01T00:00:00.123Z``)."""
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _stage_breakdown(spark: Any, batch_ids: set[int]) -> list[dict[str, Any]]:
    """Spark stages of the given micro-batches from the UI's REST API (``--spark-ui``): per stage its tasks,
    wall time and summed task time, per task its duration. The result stage's first ``shuffle_partitions``
    tasks run transformWithStateInPandas; the others re-read the source for the dead-letter branch."""
    import urllib.request

    url = spark.sparkContext.uiWebUrl
    if not url:
        return []
    base = f"{url}/api/v1/applications/{spark.sparkContext.applicationId}"

    def get(path: str) -> Any:
        with urllib.request.urlopen(base + path, timeout=30) as answer:
            return json.loads(answer.read())

    out = []
    for job in get("/jobs"):
        match = re.search(r"batch = (\d+)", job.get("description") or "")
        if not match or int(match.group(1)) not in batch_ids:
            continue
        for stage_id in sorted(job.get("stageIds") or []):
            for stage in get(f"/stages/{stage_id}"):
                if stage.get("status") != "COMPLETE":
                    continue
                tasks = get(f"/stages/{stage_id}/{stage['attemptId']}/taskList?length=1000")
                out.append(
                    {
                        "batch": int(match.group(1)),
                        "stage": stage_id,
                        "name": stage.get("name"),
                        "tasks": stage.get("numTasks"),
                        "wall_ms": _ui_ms(stage.get("completionTime")) - _ui_ms(stage.get("submissionTime")),
                        "task_run_ms": stage.get("executorRunTime"),
                        "jvm_cpu_ms": round((stage.get("executorCpuTime") or 0) / 1e6),
                        "shuffle_write_records": stage.get("shuffleWriteRecords"),
                        "task_ms": [
                            t.get("duration") for t in sorted(tasks, key=lambda t: t.get("index", 0))
                        ],
                    }
                )
    return out


def _ui_ms(text: str | None) -> int:
    from datetime import datetime

    if not text:
        return 0
    return int(datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp() * 1000)


# ---------------------------------------------------------------------------------------------- the cluster


def _write_cluster(admin: Any, spec: Any, root: str) -> None:
    """The znodes of a BookKeeper cluster around the bulk-loaded ledgers (``initnewcluster`` + Auditor)."""
    from core.domain.layout import available_path, cookies_path, instance_id_path, readonly_path
    from core.domain.underreplication import (
        UnderreplicationPaths,
        format_lost_bookie_recovery_delay,
        format_rereplication_layout,
    )

    paths = UnderreplicationPaths(root)
    admin.ensure_path(root)
    for path, data in (
        (available_path(root), b""),
        (readonly_path(root), b""),
        (instance_id_path(root), INSTANCE_ID.encode()),
        (cookies_path(root), b""),
        (paths.base, b""),
        (paths.layout, format_rereplication_layout().encode()),
        (paths.urledgers, b""),
        (paths.locks, b""),
        (paths.lost_bookie_recovery_delay, format_lost_bookie_recovery_delay(0).encode()),
    ):
        admin.create(path, data, makepath=True)
    group = {b.bookie_id: {"rack": b.rack, "hostname": b.bookie_id.split(":")[0]} for b in spec.bookies}
    admin.create(RACK_MAP_PATH, json.dumps({"default": group}, separators=(",", ":")).encode(), makepath=True)


def _registration(bookie_id: str) -> bytes:
    from bkaudit.sim.bookie import service_info_for
    from core.domain.registration import encode_bookie_service_info

    host, port = bookie_id.rsplit(":", 1)
    return encode_bookie_service_info(service_info_for(host, int(port)))


def _register_bookies(admin: Any, session: Any, spec: Any, root: str) -> None:
    """A cookie per bookie (admin) and every ephemeral ``available/<id>`` on ``session``."""
    from core.domain.cookie import Cookie, format_cookie
    from core.domain.registration import cookie_path, writable_bookie_path

    for placement in spec.bookies:
        bookie_id = placement.bookie_id
        cookie = Cookie.create(bookie_id, ["/data/journal"], ["/data/ledgers"], instance_id=INSTANCE_ID)
        admin.create(cookie_path(bookie_id, root), format_cookie(cookie).encode())
        session.create(writable_bookie_path(bookie_id, root), _registration(bookie_id), ephemeral=True)


# ----------------------------------------------------------------------------------------- child processes


def _child(function: str, *args: Any) -> list[str]:
    """Command running ``function(argv)`` of this module in a fresh interpreter (cwd: the repository)."""
    code = f"import sys; from tests.benchmarks.bench_stream import {function}; {function}(sys.argv[1:])"
    return [sys.executable, "-c", code, *[str(a) for a in args]]


def _start_watcher(
    hosts: str, kafka: Any, partitions: int, log: Path, batch_size: int | None = None
) -> subprocess.Popen[bytes]:
    """``bkaudit watch`` as its own process, as in production; its log tells when the snapshot is out.

    ``batch_size``: the watcher's ``kafka.producer_batch_size`` (None: the setting's default)."""
    command = [
        sys.executable,
        "-m",
        "bkaudit.cli.main",
        "watch",
        "--zookeeper",
        hosts,
        "--bootstrap",
        kafka.bootstrap_servers,
        "--topic",
        kafka.changes_topic,
        "--partitions",
        str(partitions),
        "--rack-map-znode",
        RACK_MAP_PATH,
        "--reconciliation-interval",
        "0",
        "--heartbeat-interval",
        "1",
        "--log-level",
        "INFO",
    ]
    env = {**os.environ, "BKAUDIT_WATCHER__PROGRESS": "off", "BKAUDIT_ZOOKEEPER__SESSION_TIMEOUT_S": "30"}
    if batch_size is not None:
        env["BKAUDIT_KAFKA__PRODUCER_BATCH_SIZE"] = str(batch_size)
    with log.open("wb") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)


def _topic_losses(log: Path) -> int:
    """How often the watcher took the changes topic for lost (acknowledged offsets went backwards) and
    published a FULL snapshot into it: each one is a whole snapshot more for the job to apply."""
    if not log.exists():
        return 0
    return log.read_text(errors="replace").count("publishing a FULL snapshot into it")


_SNAPSHOT_DONE = re.compile(
    r"snapshot \S+ \(START\) complete: (\d+) ledgers read, (\d+) published.*?([\d.]+) s"
)


def _wait_snapshot(process: subprocess.Popen[bytes], log: Path, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = _SNAPSHOT_DONE.search(log.read_text(errors="replace"))
        if match:
            return {
                "ledgers_read": int(match.group(1)),
                "events_published": int(match.group(2)),
                "duration_s": float(match.group(3)),
            }
        if process.poll() is not None:
            raise RuntimeError(f"bkaudit watch exited ({process.returncode}): {log.read_text()[-3000:]}")
        time.sleep(1.0)
    raise RuntimeError(f"the watcher's START snapshot did not complete within {timeout_s:.0f} s")


def _stop(process: subprocess.Popen[Any] | None, timeout_s: float = 60.0) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def writer_main(argv: list[str]) -> None:
    """Child: rewrite ledger znodes at a fixed rate; writes ``[[ledger, new version, wall time], ...]``."""
    from kazoo.client import KazooClient

    from bkaudit.sim.bulk import BulkLoadSpec, synthetic_bookies
    from core.domain.layout import ledger_path

    hosts, root, ledgers, bookies, racks, seed, rate, duration, in_flight, out_path = argv
    spec = BulkLoadSpec(
        bookies=synthetic_bookies(int(bookies), racks=int(racks)), count=int(ledgers), seed=int(seed)
    )
    ids = list(spec.ledger_ids())
    total = int(float(rate) * float(duration))
    step = (
        7919 if len(ids) % 7919 else 7907
    )  # coprime with the count: distinct ledgers while there are enough
    order = [ids[(i * step) % len(ids)] for i in range(min(total, len(ids)))]
    client = KazooClient(hosts=hosts, timeout=60.0)
    client.start(timeout=60)
    slots = threading.BoundedSemaphore(int(in_flight))
    data_of: dict[int, bytes] = {}

    def keep(ledger_id: int) -> Any:
        def completed(result: Any) -> None:
            data_of[ledger_id] = result.get()[0]
            slots.release()

        return completed

    for ledger_id in order:
        slots.acquire()
        client.get_async(ledger_path(ledger_id, root=root)).rawlink(keep(ledger_id))
    for _ in range(int(in_flight)):
        slots.acquire()
    for _ in range(int(in_flight)):
        slots.release()
    print("READY", flush=True)
    sys.stdin.readline()
    sent: list[tuple[int, int, float]] = []
    errors = [0]

    def record(ledger_id: int, at: float) -> Any:
        def completed(result: Any) -> None:
            try:
                sent.append((ledger_id, result.get().version, at))
            except Exception:
                errors[0] += 1
            slots.release()

        return completed

    interval = 1.0 / float(rate)
    started = time.time()
    next_at = time.monotonic()
    for n in range(total):
        ledger_id = order[n % len(order)]
        next_at += interval
        ahead = next_at - time.monotonic()
        if ahead > 0.002:
            time.sleep(ahead)
        slots.acquire()
        at = time.time()
        client.set_async(ledger_path(ledger_id, root=root), data_of[ledger_id]).rawlink(record(ledger_id, at))
    for _ in range(int(in_flight)):
        slots.acquire()
    finished = time.time()
    client.stop()
    client.close()
    Path(out_path).write_text(
        json.dumps(
            {"sent": sent, "errors": errors[0], "started": started, "finished": finished, "writes": total}
        )
    )


# BookKeeper's Auditor is Java: the same work with the ZooKeeper Java client is the baseline of record; the
# kazoo figure is for reference. Run as ``java FullRead.java`` (a JDK 11+ runs a single source file).
_FULL_READ_JAVA = r"""
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Semaphore;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.zookeeper.AsyncCallback;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.Watcher;
import org.apache.zookeeper.ZooKeeper;

/** BookieLedgerIndexer's work: list every ledger znode (2-4-4 hierarchical layout), read every one. */
public class FullRead {
    public static void main(String[] args) throws Exception {
        String hosts = args[0];
        String root = args[1];
        int inFlight = Integer.parseInt(args[2]);
        CountDownLatch connected = new CountDownLatch(1);
        ZooKeeper zk = new ZooKeeper(hosts, 60000, event -> {
            if (event.getState() == Watcher.Event.KeeperState.SyncConnected) connected.countDown();
        });
        connected.await();
        long started = System.nanoTime();
        List<String> leaves = new ArrayList<>();
        for (String l1 : zk.getChildren(root, false)) {
            if (l1.length() != 2 || !l1.chars().allMatch(Character::isDigit)) continue;
            for (String l2 : zk.getChildren(root + "/" + l1, false)) {
                if (!l2.chars().allMatch(Character::isDigit)) continue;
                String dir = root + "/" + l1 + "/" + l2;
                for (String leaf : zk.getChildren(dir, false)) {
                    if (leaf.startsWith("L")) leaves.add(dir + "/" + leaf);
                }
            }
        }
        long listed = System.nanoTime();
        Semaphore slots = new Semaphore(inFlight);
        CountDownLatch done = new CountDownLatch(leaves.size());
        AtomicLong bytes = new AtomicLong();
        AtomicLong errors = new AtomicLong();
        AsyncCallback.DataCallback callback = (rc, path, ctx, data, stat) -> {
            if (rc == KeeperException.Code.OK.intValue()) {
                bytes.addAndGet(data.length);
            } else {
                errors.incrementAndGet();
            }
            slots.release();
            done.countDown();
        };
        for (String path : leaves) {
            slots.acquire();
            zk.getData(path, false, callback, null);
        }
        done.await();
        long finished = System.nanoTime();
        zk.close();
        System.out.printf(
            "{\"ledgers_read\": %d, \"errors\": %d, \"in_flight\": %d, \"list_s\": %.2f, "
                + "\"get_s\": %.2f, \"total_s\": %.2f, \"metadata_bytes\": %d}%n",
            leaves.size(), errors.get(), inFlight, (listed - started) / 1e9, (finished - listed) / 1e9,
            (finished - started) / 1e9, bytes.get());
    }
}
"""


def full_read_main(argv: list[str]) -> None:
    """Child: the kazoo full read; prints its figures as JSON."""
    hosts, root, in_flight = argv
    print(json.dumps(_full_read(hosts, root, int(in_flight))))


def _run_full_read(kind: str, hosts: str, root: str, in_flight: int, work_dir: Path) -> dict[str, Any]:
    """A full read in its own process (``java`` or ``kazoo``), never sharing a GIL or a JVM with the job."""
    if kind == "java":
        import pyspark

        source = work_dir / "FullRead.java"
        source.write_text(_FULL_READ_JAVA)
        jars = Path(pyspark.__file__).parent / "jars"
        command = ["java", "-Xmx1g", "-cp", f"{jars}/*", str(source), hosts, root, str(in_flight)]
    else:
        command = _child("full_read_main", hosts, root, in_flight)
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=7200, cwd=REPO, check=False)
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures["process_wall_s"] = round(time.monotonic() - started, 1)
    figures["reads_per_s"] = round(figures["ledgers_read"] / max(figures["get_s"], 1e-9))
    figures["load_average"] = _load()
    return figures


def _full_read(hosts: str, root: str, in_flight: int) -> dict[str, Any]:
    """BookieLedgerIndexer's work with kazoo: list the ledger tree, ``get`` every ledger znode."""
    from kazoo.client import KazooClient

    from core.domain.layout import is_special_znode

    client = KazooClient(hosts=hosts, timeout=60.0)
    client.start(timeout=60)
    try:
        started = time.monotonic()
        # 2-4-4 hierarchical: <root>/DD/DDDD/LDDDD; each level's listings all in flight.
        level1 = [f"{root}/{c}" for c in client.get_children(root) if len(c) == 2 and c.isdigit()]
        level2: list[str] = []
        for path, result in [(p, client.get_children_async(p)) for p in level1]:
            level2.extend(f"{path}/{c}" for c in result.get(timeout=60) if c.isdigit())
        leaves: list[str] = []
        for path, result in [(p, client.get_children_async(p)) for p in level2]:
            leaves.extend(f"{path}/{c}" for c in result.get(timeout=60) if not is_special_znode(c))
        listed = time.monotonic()
        slots = threading.BoundedSemaphore(in_flight)
        done = threading.Event()
        counts = {"remaining": len(leaves), "bytes": 0, "errors": 0}
        lock = threading.Lock()

        def completed(result: Any) -> None:
            try:
                size, failed = len(result.get()[0] or b""), 0
            except Exception:
                size, failed = 0, 1
            slots.release()
            with lock:
                counts["bytes"] += size
                counts["errors"] += failed
                counts["remaining"] -= 1
                if counts["remaining"] == 0:
                    done.set()

        if not leaves:
            done.set()
        for path in leaves:
            slots.acquire()
            client.get_async(path).rawlink(completed)
        done.wait(7200)
        finished = time.monotonic()
        return {
            "ledgers_read": len(leaves),
            "errors": counts["errors"],
            "in_flight": in_flight,
            "list_s": round(listed - started, 2),
            "get_s": round(finished - listed, 2),
            "total_s": round(finished - started, 2),
            "metadata_bytes": counts["bytes"],
        }
    finally:
        client.stop()
        client.close()


# -------------------------------------------------------------------------------------------------- phases


def _ledger_rows(lakehouse: Path) -> int:
    """Ledger rows the job has written, from the Delta logs (add actions' record counts; no data file read):
    ``ledgers`` (folded) plus the ``ledger_changes`` files of batches after the last fold (a ledger changed
    twice since counts twice: enough to see a snapshot's ledgers all in)."""
    from deltalake import DeltaTable

    from connectors.delta.tables import last_fold

    def records(actions: Any) -> int:
        return int(sum(actions.column("num_records").to_pylist())) if actions.num_rows else 0

    ledgers = DeltaTable(str(lakehouse / "ledgers"))
    folded = last_fold(ledgers)
    rows = records(ledgers.get_add_actions(flatten=True))
    changes_path = lakehouse / "ledger_changes"
    if DeltaTable.is_deltatable(str(changes_path)):
        import pyarrow as pa
        import pyarrow.compute as pc

        actions = pa.table(DeltaTable(str(changes_path)).get_add_actions(flatten=True))
        if actions.num_rows and folded is not None:
            actions = actions.filter(pc.greater(actions.column("min.batch_id"), folded))
        rows += records(actions)
    return rows


def _check(query: Any) -> None:
    if query.exception() is not None:
        raise RuntimeError(f"the streaming query failed: {query.exception()}")


def _wait_idle(query: Any, recorder: SinkRecorder, quiet_batches: int = 2, timeout_s: float = 600.0) -> bool:
    """Wait until the job has caught up: ``quiet_batches`` micro-batches started after this call produced no
    decision (the watcher's heartbeats make every batch non-empty, so "no input" never happens), or no batch
    ran for 30 s."""
    called = time.time()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _check(query)
        with recorder.lock:
            recent = [b for b in recorder.batches if b["started"] >= called]
            last = recorder.batches[-1]["finished"] if recorder.batches else called
        if len(recent) >= quiet_batches and all(b["decisions"] == 0 for b in recent[-quiet_batches:]):
            return True
        if time.time() - max(last, called) > 30 and not query.status.get("isTriggerActive"):
            return True
        time.sleep(0.2)
    return False


def _membership_lane_idle(query: Any) -> None:
    """Wait until the membership lane has nothing left to process. A real loss comes at any moment of the
    watcher's heartbeat cycle, but :func:`_wait_idle` returns right after the ledger lane's batch of a
    heartbeat, while the membership lane still processes the same heartbeat (22-156 ms): every deletion
    then waited for that batch (0.07-0.1 s of each 1 M loss, 2026-11-30)."""
    membership = getattr(query, "membership", None)
    if membership is not None:
        membership.processAllAvailable()


def _wait_for(
    acks: AlertAcks, kinds: tuple[str, ...], entities: set[str], state: str, timeout: float, query: Any = None
) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    found: dict[str, float] = {}
    while time.monotonic() < deadline:
        found = acks.times(kinds, entities, state)
        if len(found) >= len(entities):
            return found
        if query is not None:
            _check(query)
        time.sleep(0.05)
    return found


def _loss_timeline(
    recorder: SinkRecorder,
    bookie_id: str,
    membership: Any,
    publishes: list[tuple[float, float]],
    t0: float,
) -> dict[str, Any]:
    """Where a loss's time went, in seconds after ``t0``: the watcher's event time, the membership lane's
    batch (planned, read; from its progress), the loss owner's call (publish started, every alert acked,
    Delta recorded)."""
    event_at, call_index = recorder.lost_event_times.get(bookie_id, (None, None))
    with recorder.lock:
        call = recorder.loss_calls[call_index] if call_index is not None else None
    progress = None
    if call and call["app_id"].endswith(".membership") and membership is not None:
        found = _batch_durations(membership, {call["batch_id"]})
        progress = next((d for d in found if d.get("timestamp")), None)
    planned = _iso_s(progress["timestamp"]) if progress else None
    ms = (progress or {}).get("ms") or {}
    read = planned + (ms["latestOffset"] + ms["getBatch"]) / 1000 if planned and ms else None
    publish = next(
        (
            (started, acked)
            for started, acked in publishes
            if call and call["started"] <= started <= call["finished"]
        ),
        None,
    )

    def since(at: float | None) -> float | None:
        return round(at - t0, 3) if at else None

    return {
        "watcher_event": since(event_at),
        "membership_batch_planned": since(planned),
        "membership_batch_read": since(read),
        "loss_apply_start": since(call["started"] if call else None),
        "publish_start": since(publish[0] if publish else None),
        "publish_acked": since(publish[1] if publish else None),
        "delta_recorded": since(call["finished"] if call else None),
        "membership_batch_ms": ms or None,
        "loss_owner_phase_s": (call or {}).get("phase_s") or None,
    }


def _lose_bookies(
    args: argparse.Namespace,
    session: Any,
    spec: Any,
    index: dict[str, Any],
    root: str,
    query: Any,
    recorder: SinkRecorder,
    spark: Any,
) -> dict[str, Any]:
    from core.domain.registration import writable_bookie_path

    bookies = [b.bookie_id for b in spec.bookies]
    chosen = [bookies[(i * 37 + 11) % len(bookies)] for i in range(min(args.losses, len(bookies)))]
    runs = []
    acks = recorder.acks
    variants = _loss_variants(args.loss_variants)
    for number, bookie_id in enumerate(chosen):
        ledgers = {str(i) for i in index[bookie_id]}
        variant = variants[number % len(variants)] if variants else None
        if variant is not None:
            _apply_variant(query, spark, variant)
        _wait_idle(query, recorder, timeout_s=300)
        acks.forget()
        recorder.lost_event_times.pop(bookie_id, None)
        with recorder.lock:
            first_batch, first_publish = len(recorder.batches), len(recorder.publishes)
        _membership_lane_idle(query)
        load = _load()
        t0 = time.time()
        session.delete(writable_bookie_path(bookie_id, root))
        fired = _wait_for(acks, LOST_KINDS, ledgers, "firing", args.loss_timeout, query)
        lost_at = acks.times(("BOOKIE_LOST",), {bookie_id}, "firing").get(bookie_id)
        run: dict[str, Any] = {
            "bookie": bookie_id,
            "variant": _variant_label(variant) if variant is not None else None,
            "ledgers": len(ledgers),
            "alerts_acked": len(fired),
            "complete": len(fired) == len(ledgers),
            "load_average": load,
            "bookie_lost_alert_s": round(lost_at - t0, 3) if lost_at else None,
            "first_ledger_alert_s": round(min(fired.values()) - t0, 3) if fired else None,
            "last_ledger_alert_s": round(max(fired.values()) - t0, 3) if fired else None,
        }
        _wait_idle(query, recorder, timeout_s=300)
        with recorder.lock:
            batches = [b for b in recorder.batches[first_batch:] if b["decisions"]]
            publishes = recorder.publishes[first_publish:]
        run["timeline_s"] = _loss_timeline(
            recorder, bookie_id, getattr(query, "membership", None), publishes, t0
        )
        run["sink_batches"] = [
            {k: (round(v - t0, 3) if k in ("started", "finished") else v) for k, v in b.items()}
            for b in batches
        ]
        run["query_batches"] = _batch_durations(query, {b["batch_id"] for b in batches})
        if args.spark_ui:
            run["stages"] = _stage_breakdown(spark, {b["batch_id"] for b in batches})
        # Come back: the alerts resolve; wait for that so the next loss starts clean.
        acks.forget()
        t1 = time.time()
        session.create(writable_bookie_path(bookie_id, root), _registration(bookie_id), ephemeral=True)
        resolved = _wait_for(acks, LOST_KINDS, ledgers, "resolved", args.loss_timeout, query)
        run["return_last_resolved_s"] = round(max(resolved.values()) - t1, 3) if resolved else None
        run["resolved_complete"] = len(resolved) == len(ledgers)
        runs.append(run)
        logger.info("loss of %s: %s", bookie_id, {k: v for k, v in run.items() if "batches" not in k})
        if not run["complete"]:
            break
    lasts = [r["last_ledger_alert_s"] for r in runs if r["complete"]]
    firsts = [r["first_ledger_alert_s"] for r in runs if r["complete"]]
    by_variant: dict[str, list[float]] = {}
    for run in runs:
        if run["complete"] and run["variant"] is not None:
            by_variant.setdefault(run["variant"], []).append(run["last_ledger_alert_s"])
    return {
        "runs": runs,
        "last_alert_p50_s": round(statistics.median(lasts), 3) if lasts else None,
        "first_alert_p50_s": round(statistics.median(firsts), 3) if firsts else None,
        "ledgers_per_bookie_mean": round(statistics.mean(len(v) for v in index.values()), 1),
        "last_alert_p50_s_by_variant": {k: round(statistics.median(v), 3) for k, v in by_variant.items()},
    }


def _loss_variants(text: str) -> list[tuple[int, bool]]:
    """``"0:0,10"`` → ``[(0, False), (10, True)]`` (nice, tail consumer).

    Example:
        >>> _loss_variants("0:0, 10")
        [(0, False), (10, True)]
    """
    parts = [part.strip().split(":") for part in text.split(",") if part.strip()]
    return [(int(p[0]), p[1:] != ["0"]) for p in parts]


def _variant_label(variant: tuple[int, bool]) -> str:
    return f"nice={variant[0]},tail={int(variant[1])}"


def _apply_variant(query: Any, spark: Any, variant: tuple[int, bool]) -> None:
    """Turn the membership lane's tail consumer on or off; renice the Spark JVM and its descendants
    (every thread)."""
    nice, tail = variant
    query.membership._reader.enabled = tail
    jvm = spark.sparkContext._gateway.proc.pid
    for pid in _descendants(jvm) | {jvm}:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                os.setpriority(os.PRIO_PROCESS, int(task.name), nice)
            except OSError:
                continue


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def wait_applied(
    query: Any, recorder: SinkRecorder, sent: dict[tuple[int, int], float], timeout_s: float
) -> dict[tuple[int, int], float]:
    """Wait until the sink applied every sent (ledger, version), or ``timeout_s``; returns when each of
    those applied was (wall time)."""
    deadline = time.monotonic() + timeout_s
    missing = set(sent)  # shrinks as changes are applied: each check costs what is still missing
    while time.monotonic() < deadline:
        with recorder.lock:
            applied = recorder.applied
            missing = {key for key in missing if key not in applied}
        if not missing:
            break
        _check(query)
        time.sleep(0.5)
    with recorder.lock:
        applied = recorder.applied
        return {key: applied[key] for key in sent if key in applied}


def _sustained(
    args: argparse.Namespace,
    rate: float,
    hosts: str,
    root: str,
    query: Any,
    recorder: SinkRecorder,
    work_dir: Path,
) -> dict[str, Any]:
    """Rewrite ledger znodes at ``--rate`` (a child); lag = sink batch finished − just before the set."""
    out_path = work_dir / f"writes-{rate:g}.json"
    writer = subprocess.Popen(
        _child(
            "writer_main",
            hosts,
            root,
            args.ledgers,
            args.bookies,
            args.racks,
            args.seed,
            rate,
            args.duration,
            args.set_in_flight,
            out_path,
        ),
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert writer.stdin is not None and writer.stdout is not None
        if writer.stdout.readline().strip() != b"READY":
            raise RuntimeError("the writer did not start")
        _wait_idle(query, recorder, timeout_s=300)
        recorder.track_versions = True
        with recorder.lock:
            first_batch = len(recorder.batches)
        load = _load()
        writer.stdin.write(b"go\n")
        writer.stdin.flush()
        writer.wait(args.duration * 20 + 600)
    finally:
        _stop(writer, 10)
    result = json.loads(out_path.read_text())
    sent = {(ledger_id, version): at for ledger_id, version, at in result["sent"]}
    applied = wait_applied(query, recorder, sent, args.drain_timeout)
    recorder.track_versions = False
    with recorder.lock:
        batches = [b for b in recorder.batches[first_batch:] if b["decisions"]]
    lags = [applied[key] - sent[key] for key in applied]
    last_applied = max(applied.values(), default=result["finished"])
    started = result["started"]
    return {
        "target_rate_per_s": rate,
        "duration_s": args.duration,
        "load_average_at_start": load,
        "writes": result["writes"],
        "write_errors": result["errors"],
        "writer_rate_per_s": round(result["writes"] / max(result["finished"] - started, 1e-9)),
        "applied": len(applied),
        "applied_per_s": round(len(applied) / max(last_applied - started, 1e-9)),
        "drain_after_writes_s": round(last_applied - result["finished"], 2),
        "lag_s": _summary(lags),
        "batches": len(batches),
        "decisions_per_batch": _summary([float(b["decisions"]) for b in batches], 0),
        "sink_seconds_per_batch": _summary([float(b["sink_seconds"] or 0) for b in batches]),
        "batch_interval_s": _summary([b["finished"] - a["finished"] for a, b in itertools.pairwise(batches)]),
    }


# -------------------------------------------------------------------------------------------- sink only


def _decision_table(decisions: list[dict[str, Any]], cluster: str) -> Any:
    """Decisions (processor output) as the Arrow table the sink receives (``DECISION_SCHEMA``)."""
    import pyarrow as pa

    from streaming.loss import utc_from_ms
    from streaming.sink import ARROW_DECISION_SCHEMA

    return pa.Table.from_pylist(
        [
            {
                "kind": d["kind"],
                "event_time": utc_from_ms(d["event_time_ms"]),
                "cluster": cluster,
                "ledger_id": d.get("ledger_id"),
                "bookie_id": d.get("bookie_id"),
                "payload": json.dumps(d["payload"], separators=(",", ":"), sort_keys=True),
            }
            for d in decisions
        ],
        schema=ARROW_DECISION_SCHEMA,
    )


class _Stat:
    """A znode stat for events built without ZooKeeper."""

    def __init__(self, zxid: int, at_ms: int, length: int) -> None:
        self.czxid = self.mzxid = zxid
        self.ctime = self.mtime = at_ms
        self.version = 0
        self.dataLength = length


class _Processor:
    """The job's stage 1 and 2 without Spark: decode (``streaming.decode``) and the processor's logic."""

    def __init__(self, cluster: str) -> None:
        from core import events as ev
        from streaming.processor import ClusterLogic, LedgerLogic, ProcessorConfig

        self.cluster = cluster
        self.builder = ev.EventBuilder(cluster, "bench-sink-only")
        self.cluster_logic = ClusterLogic(ProcessorConfig())
        self.ledger_logic = LedgerLogic(ProcessorConfig())
        self.cluster_state: dict[str, Any] | None = None

    def decide(self, payload: Any, snapshot_id: str = "") -> list[dict[str, Any]]:
        from streaming.decode import DEFAULT_LEDGER_BUCKETS, _event_row

        row = _event_row(self.builder.build(payload, snapshot_id=snapshot_id), DEFAULT_LEDGER_BUCKETS)
        change = {
            "kind": row["kind"],
            "event_time_ms": row["event_time"] // 1000,
            "ledger_id": row["ledger_id"],
            "bookie_id": row["bookie_id"],
            "snapshot_id": row["snapshot_id"],
            "cluster": row["cluster"],
            "payload": json.loads(row["payload"]),
        }
        if row["state_key"] == "cluster":
            self.cluster_state, out, _ = self.cluster_logic.apply(self.cluster_state, [change])
        else:  # a new ledger: no state yet
            _, out, _ = self.ledger_logic.apply(None, [change])
        return out


def snapshot_end(
    snapshot: str, ledgers: int, partition: int, partitions: int, *, partition_events: int
) -> Any:
    """The complete FULL snapshot's end marker for one partition (all ``ledgers`` scanned and published)."""
    from core import events as ev

    counts = ev.SnapshotCounts(ledgers_scanned=ledgers, ledgers_published=ledgers)
    return ev.snapshot_end(
        snapshot,
        ev.SnapshotMode.FULL,
        complete=True,
        partition=partition,
        partition_count=partitions,
        partition_events=partition_events,
        counts=counts,
        duration_ms=0,
    )


def _snapshot_decisions(spec: Any, processor: _Processor, partitions: int, root: str) -> Any:
    """The decisions of the watcher's START snapshot of the bulk-loaded cluster, in the watcher's order."""
    from bkaudit.sim.bulk import plan_ledgers, planned_metadata
    from core import events as ev
    from core.domain.layout import ledger_path
    from core.domain.metadata import encode_ledger_metadata
    from core.domain.rackmap import parse_rack_map
    from core.domain.registration import decode_bookie_service_info

    snapshot = "bench-sink-only-snapshot"
    start, full = ev.SnapshotReason.START, ev.SnapshotMode.FULL
    for p in range(partitions):
        yield processor.decide(
            ev.snapshot_begin(snapshot, start, full, partition=p, partition_count=partitions)
        )
    yield processor.decide(ev.recovery_delay(0, present=True), snapshot)
    group = {b.bookie_id: {"rack": b.rack, "hostname": b.bookie_id.split(":")[0]} for b in spec.bookies}
    rack_map = parse_rack_map(json.dumps({"default": group}).encode())
    yield processor.decide(ev.rack_map_event(RACK_MAP_PATH, rack_map, present=True), snapshot)
    zxid = 1000
    for ledger in plan_ledgers(spec):
        zxid += 1
        md = planned_metadata(ledger, spec)
        stat = _Stat(zxid, int(time.time() * 1000), len(encode_ledger_metadata(md)))
        path = ledger_path(ledger.ledger_id, root=root)
        yield processor.decide(ev.ledger_upserted(ledger.ledger_id, md, stat, path), snapshot)
    for placement in spec.bookies:
        info = decode_bookie_service_info(placement.bookie_id, _registration(placement.bookie_id))
        status = ev.BookieStatusValue.WRITABLE
        yield processor.decide(
            ev.bookie_status(placement.bookie_id, status, info=info, has_cookie=True), snapshot
        )
    for p in range(partitions):
        yield processor.decide(snapshot_end(snapshot, spec.count, p, partitions, partition_events=0))


def _profile_lines(profiler: Any, limit: int = 30) -> list[str]:
    """The top of a cProfile by cumulative time, one line per function (seconds, calls, where)."""
    import pstats

    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda item: item[1][3], reverse=True)  # type: ignore[attr-defined]
    lines = []
    for (path, line, name), (_, calls, own, cumulative, _) in rows[:limit]:
        where = f"{Path(path).name}:{line}({name})" if line else name
        lines.append(f"{cumulative:8.3f} s cum {own:8.3f} s own {calls:>8} calls  {where}")
    return lines


def run_sink_scale(args: argparse.Namespace) -> dict[str, Any]:
    """``--sink-only``: the sink's ingest and lost-bookie fan-out at full scale, without Spark.

    The job's stages 1-2 are replayed in this process (the same decode and processor logic, no Spark, no
    state store), the sink (:class:`streaming.sink.AuditSink`, unchanged) gets the decisions in batches of
    ``--sink-chunk``; then for each loss the cluster logic's decisions for ``GONE`` (delay 0) go to the sink
    as one batch, and each alert's broker ack is timed. What this leaves out is Spark's own
    per-batch cost (source, shuffle, transformWithStateInPandas), measured by the full benchmark.
    """
    from bkaudit.sim.bulk import BulkLoadSpec, bookie_ledger_index, synthetic_bookies
    from connectors.kafka.embedded import EmbeddedBroker
    from connectors.kafka.topics import ensure_topic
    from core import events as ev
    from core.domain.registration import decode_bookie_service_info
    from core.settings import Settings
    from streaming.job import sink_config
    from streaming.sink import AuditSink

    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="bkaudit-bench-sink-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    broker = EmbeddedBroker(state_dir / "broker")
    broker.start()
    figures: dict[str, Any] = {
        "mode": "sink-only (no Spark: decode + processor logic in process, the sink unchanged)",
        "ledgers": args.ledgers,
        "bookies": args.bookies,
        "racks": args.racks,
        "cpus": os.cpu_count(),
        "load_average_at_start": _load(),
        "config": {k: v for k, v in vars(args).items() if k not in ("state_dir", "progress_file")},
    }
    timers = Timers()
    closers: list[Any] = [timers.restore]
    try:
        spec = BulkLoadSpec(
            bookies=synthetic_bookies(args.bookies, racks=args.racks), count=args.ledgers, seed=args.seed
        )
        index = bookie_ledger_index(spec)
        suffix = f"{os.getpid()}-{int(time.time())}"
        kafka_values = {
            "bootstrap_servers": broker.bootstrap,
            "changes_topic": f"bench.changes.{suffix}",
            "alerts_topic": f"bench.alerts.{suffix}",
            "feedback_topic": f"bench.feedback.{suffix}",
        }
        settings = Settings(
            cluster=INSTANCE_ID,
            kafka=kafka_values,
            lakehouse_root=state_dir / "lakehouse",
            checkpoint_root=state_dir / "checkpoints",
        )
        for topic in (settings.kafka.changes_topic, settings.kafka.feedback_topic):
            ensure_topic(settings.kafka, topic, partitions=args.partitions)
        ensure_topic(settings.kafka, settings.kafka.alerts_topic, partitions=args.alert_partitions)
        _instrument(timers)
        sink = AuditSink(sink_config(settings, args.partitions))
        closers.append(sink.close)
        processor = _Processor(INSTANCE_ID)
        batch_id = 0
        pending: list[dict[str, Any]] = []
        chunks = []
        decide_s = 0.0
        started = time.monotonic()
        mark = time.monotonic()
        for decisions in _snapshot_decisions(spec, processor, args.partitions, "/ledgers"):
            pending.extend(decisions)
            if len(pending) >= args.sink_chunk:
                decide_s += time.monotonic() - mark
                report = sink.process(_decision_table(pending, INSTANCE_ID), batch_id)
                chunks.append({"batch_id": batch_id, "decisions": len(pending), "sink_s": report.seconds})
                _note(args, f"sink-only ingest: {chunks[-1]}")
                batch_id += 1
                pending = []
                mark = time.monotonic()
        decide_s += time.monotonic() - mark
        if pending:
            report = sink.process(_decision_table(pending, INSTANCE_ID), batch_id)
            chunks.append({"batch_id": batch_id, "decisions": len(pending), "sink_s": report.seconds})
            batch_id += 1
        total = time.monotonic() - started
        sink_s = sum(c["sink_s"] for c in chunks)
        figures["ingest"] = {
            "seconds": round(total, 1),
            "decode_and_logic_s": round(decide_s, 1),
            "sink_s": round(sink_s, 1),
            "sink_decisions_per_s": round(sum(c["decisions"] for c in chunks) / max(sink_s, 1e-9)),
            "ledger_rows": _ledger_rows(Path(settings.lakehouse_root)),
            "batches": chunks,
            "sink_helpers": Timers.delta(timers.snapshot(), {}),
        }
        _note(args, f"sink-only ingest done: {total:.0f} s", figures)

        bookies = [b.bookie_id for b in spec.bookies]
        chosen = [bookies[(i * 37 + 11) % len(bookies)] for i in range(min(args.losses, len(bookies)))]
        figures["loss"] = []
        recorders: list[SinkRecorder] = []
        for batch_size in (int(b) for b in args.alert_batch_sizes.split(",") if b):
            kafka = settings.kafka.model_copy(
                update={"producer_batch_size": batch_size, "producer_linger_ms": 5 if batch_size else 0}
            )
            sink.close()
            sink = AuditSink(sink_config(settings.model_copy(update={"kafka": kafka}), args.partitions))
            closers.append(sink.close)
            if recorders:
                recorders[-1].restore()
            recorder = SinkRecorder(sink)
            recorders.append(recorder)
            closers.append(recorder.restore)
            runs: list[dict[str, Any]] = []
            for bookie_id in chosen:
                ledgers = {str(i) for i in index[bookie_id]}
                before = timers.snapshot()
                recorder.acks.forget()
                t0 = time.time()
                gone = processor.decide(
                    ev.bookie_status(bookie_id, ev.BookieStatusValue.GONE, has_cookie=True)
                )
                profiler = None
                if args.profile_sink and not runs and not figures["loss"]:
                    import cProfile

                    profiler = cProfile.Profile()
                    profiler.enable()
                report = sink.process(_decision_table(gone, INSTANCE_ID), batch_id)
                if profiler is not None:
                    profiler.disable()
                    figures["sink_profile"] = _profile_lines(profiler)
                batch_id += 1
                fired = _wait_for(recorder.acks, LOST_KINDS, ledgers, "firing", args.loss_timeout)
                published = recorder.publishes[-1] if recorder.publishes else (t0, t0)
                run = {
                    "bookie": bookie_id,
                    "ledgers": len(ledgers),
                    "alerts_acked": len(fired),
                    "complete": len(fired) == len(ledgers),
                    "sink_s": report.seconds,
                    "publish_start_s": round(published[0] - t0, 3),
                    "publish_acked_s": round(published[1] - t0, 3),
                    "first_ledger_alert_s": round(min(fired.values()) - t0, 3) if fired else None,
                    "last_ledger_alert_s": round(max(fired.values()) - t0, 3) if fired else None,
                    "sink_helpers": Timers.delta(timers.snapshot(), before),
                }
                info = decode_bookie_service_info(bookie_id, _registration(bookie_id))
                back = processor.decide(
                    ev.bookie_status(bookie_id, ev.BookieStatusValue.WRITABLE, info=info, has_cookie=True)
                )
                run["return_sink_s"] = sink.process(_decision_table(back, INSTANCE_ID), batch_id).seconds
                batch_id += 1
                runs.append(run)
                _note(args, f"sink-only loss (alert batch_size {batch_size}): {run}", figures)
            lasts = [float(r["last_ledger_alert_s"]) for r in runs if r["complete"]]
            figures["loss"].append(
                {
                    "alert_producer_batch_size": batch_size,
                    "runs": runs,
                    "last_alert_p50_s": round(statistics.median(lasts), 3) if lasts else None,
                }
            )
        return figures
    finally:
        for close in reversed(closers):
            with contextlib.suppress(Exception):
                close()
        broker.stop()
        if args.state_dir is None:
            import shutil

            shutil.rmtree(state_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------- main


def _note(args: argparse.Namespace, text: str, figures: dict[str, Any] | None = None) -> None:
    """Log a phase; with ``--progress-file`` append it there and keep the figures so far next to it."""
    logger.info(text)
    if args.progress_file is not None:
        with args.progress_file.open("a") as out:
            out.write(f"{time.strftime('%H:%M:%S')} {text}\n")
        if figures is not None:
            args.progress_file.with_suffix(".partial.json").write_text(
                json.dumps(figures, indent=2, default=str)
            )


class _MemoryMarks:
    """Resident memory by process kind, sampled every second from the benchmark's start: at each
    :meth:`mark`, this process now (the job runs in it, beside the bulk loader's bookkeeping) and the peaks
    so far of this process with its fold processes (``job``), Spark's JVM, the watcher and ZooKeeper, in MB.
    The job's own growth is a mark's ``job`` peak less ``before_job``'s ``this_process``."""

    def __init__(self) -> None:
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))  # run as a script: the replay module is imported as a package's
        from tests.benchmarks.replay import RssSampler, rss_kb

        self._rss_kb = rss_kb
        self._sampler = RssSampler(every_s=1.0)
        self._sampler.start()
        self.marks: dict[str, dict[str, float]] = {}

    def mark(self, phase: str) -> None:
        self._sampler.sample()
        self.marks[phase] = {
            "this_process": round(self._rss_kb(os.getpid()) / 1024, 1),
            "job": round(self._sampler.job_peak_mb, 1),
            **self._sampler.kind_peaks_mb,
        }

    def stop(self) -> None:
        self._sampler.stop()


def _given(**values: Any) -> dict[str, Any]:
    """The settings an option gave (those left None keep the setting's default).

    Example:
        >>> _given(a=1, b=None)
        {'a': 1}
    """
    return {name: value for name, value in values.items() if value is not None}


def job_session_and_settings(args: argparse.Namespace, kafka: Any, state_dir: Path) -> tuple[Any, Any]:
    """The Spark session and the job's settings the benchmark's options ask for (tables under
    ``state_dir``; no Delta maintenance during a measurement unless ``--maintenance-every``)."""
    from core.settings import Settings, SparkSettings
    from streaming.session import build_spark_session

    spark = build_spark_session(
        SparkSettings(
            master=args.master,
            ui_enabled=args.spark_ui,
            shuffle_partitions=args.shuffle_partitions,
            driver_memory=args.driver_memory,
            **_given(local_nice=args.local_nice),
        )
    )
    settings = Settings(
        kafka=kafka.model_dump(),
        lakehouse_root=state_dir / "lakehouse",
        checkpoint_root=state_dir / "checkpoints",
        stream={
            "membership_trigger_interval_s": args.membership_trigger_s,
            "watermark_delay_s": args.watermark_s,
            "max_offsets_per_trigger": args.max_offsets or None,
            "maintenance_every_batches": args.maintenance_every,
            "sink_queue_depth": args.sink_queue_depth,
            "timers_trigger_interval_s": args.timers_trigger_s,
            "ledger_lane_interval_s": args.lane_interval_s,
            "ledger_fold_interval_s": args.fold_interval_s,
            "ledger_table_buckets": args.ledger_buckets,
            "ledger_fold_ticks": args.fold_ticks,
            "ledger_vacuum_rounds": args.vacuum_rounds,
            "index_append_interval_s": float(str(args.index_append_s).split(",")[0]),
            **({} if args.scrutiny == "on" else {"scrutiny_on_close": False, "scrutiny_ledgers_per_s": 0}),
            **_given(
                ledger_changes_retention_hours=args.changes_retention_hours,
                maintenance_retention_hours=args.maintenance_retention_hours,
                zookeeper_disruption_settle_s=args.disruption_settle_s,
            ),
        },
    )
    return spark, settings


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Start everything, measure; returns the figures (see the module docstring)."""
    from bkaudit.sim.bulk import BulkLoadSpec, bookie_ledger_index, bulk_load, synthetic_bookies
    from bkaudit.testing.harness import ServiceHarness
    from connectors.kafka.topics import ensure_topic
    from streaming import job

    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="bkaudit-bench-stream-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    harness = ServiceHarness(state_dir / "services", zookeeper_heap=args.heap)
    harness.start()
    excluded = ("state_dir", "progress_file")
    figures: dict[str, Any] = {
        "ledgers": args.ledgers,
        "bookies": args.bookies,
        "racks": args.racks,
        "cpus": os.cpu_count(),
        "broker": harness.broker_kind,
        "load_average_at_start": _load(),
        "config": {k: v for k, v in vars(args).items() if k not in excluded},
    }
    closers: list[Any] = []
    memory = _MemoryMarks()
    figures["memory_mb"] = memory.marks
    closers.append(memory.stop)
    try:
        root = "/ledgers"
        chroot = harness.new_chroot()
        hosts = harness.zookeeper_hosts(chroot)
        admin = harness.kazoo_client(chroot, timeout=60)
        closers.append(lambda: (admin.stop(), admin.close()))
        spec = BulkLoadSpec(
            bookies=synthetic_bookies(args.bookies, racks=args.racks), count=args.ledgers, seed=args.seed
        )
        _write_cluster(admin, spec, root)
        started = time.monotonic()
        load = bulk_load(admin, spec, root=root, create_layout=True, progress=False)
        figures["load"] = {"created": load.created, "seconds": round(time.monotonic() - started, 1)}
        started = time.monotonic()
        index = bookie_ledger_index(spec)
        figures["load"]["index_seconds"] = round(time.monotonic() - started, 1)
        session = harness.kazoo_client(chroot, timeout=30)
        closers.append(lambda: (session.stop(), session.close()))
        _register_bookies(admin, session, spec, root)
        memory.mark("loaded")
        _note(args, f"loaded {load.created} ledgers in {figures['load']['seconds']} s", figures)
        if not args.skip_full_read:
            # Before the watcher and the job: the Auditor's full read at its best (nothing else running).
            figures["full_read"] = {
                kind: _run_full_read(kind, hosts, root, args.read_in_flight, state_dir)
                for kind in args.full_read_clients.split(",")
                if kind
            }
            _note(args, f"full read: {figures['full_read']}", figures)

        kafka = harness.kafka_settings(topic_partitions=args.alert_partitions)
        ensure_topic(kafka, kafka.changes_topic, partitions=args.partitions)
        ensure_topic(kafka, kafka.alerts_topic, partitions=args.alert_partitions)
        watch_log = state_dir / "watch.log"
        watcher = _start_watcher(hosts, kafka, args.partitions, watch_log, args.watcher_batch_size)
        closers.append(lambda: _stop(watcher))
        started = time.monotonic()
        snapshot = _wait_snapshot(watcher, watch_log, args.snapshot_timeout)
        figures["snapshot"] = {
            "watcher_snapshot_s": snapshot["duration_s"],
            "watcher_wait_s": round(time.monotonic() - started, 1),
            "watcher_events": snapshot["events_published"],
            "watcher_events_per_s": round(snapshot["events_published"] / max(snapshot["duration_s"], 1e-9)),
        }
        memory.mark("watcher_snapshot")
        _note(args, f"watcher snapshot: {figures['snapshot']}", figures)

        spark, settings = job_session_and_settings(args, kafka, state_dir)
        timers = Timers()
        closers.append(timers.restore)
        _instrument(timers)
        memory.mark("before_job")
        started = time.monotonic()
        query, sink = job.start(spark, settings)
        recorder = SinkRecorder(sink)
        closers.append(recorder.restore)

        def stop_job() -> None:
            _stop(watcher)  # no more input (heartbeats included): the running batch is the last one
            job.stop_gracefully(query, timeout_s=120)
            sink.close()

        closers.append(stop_job)
        lakehouse = Path(settings.lakehouse_root)
        deadline = time.monotonic() + args.ingest_timeout
        rows = 0
        last_note = time.monotonic()
        while time.monotonic() < deadline:
            _check(query)
            rows = _ledger_rows(lakehouse)
            if rows >= args.ledgers:
                break
            if time.monotonic() - last_note > 60:
                _note(args, f"ingest: {rows} ledger rows after {time.monotonic() - started:.0f} s")
                last_note = time.monotonic()
            time.sleep(0.5)
        ingest_s = time.monotonic() - started
        figures["snapshot"].update(
            {
                "job_ingest_s": round(ingest_s, 1),
                "job_ingest_complete": rows >= args.ledgers,
                "job_ledger_rows": rows,
                "job_ledgers_per_s": round(rows / max(ingest_s, 1e-9)),
            }
        )
        _wait_idle(query, recorder, timeout_s=600)
        with recorder.lock:
            ingest_batches = [b for b in recorder.batches if b["decisions"]]
        progress = _query_progress(query)
        by_id = {p.get("batchId"): p for p in progress}
        figures["snapshot"]["job_batches"] = len(ingest_batches)
        figures["profile"] = {
            "ingest": {
                "query": _progress_profile(progress),
                "sink_process_s": round(sum(b["finished"] - b["started"] for b in ingest_batches), 2),
                "sink_helpers": Timers.delta(timers.snapshot(), {}),
                "batches": [
                    {
                        "batch_id": b["batch_id"],
                        "decisions": b["decisions"],
                        "sink_s": b["sink_seconds"],
                        "input_rows": (by_id.get(b["batch_id"]) or {}).get("numInputRows"),
                        "ms": (by_id.get(b["batch_id"]) or {}).get("durationMs"),
                    }
                    for b in ingest_batches[:100]
                ],
                "stages": _stage_breakdown(spark, {b["batch_id"] for b in ingest_batches[:2]})
                if args.spark_ui
                else [],
            }
        }
        memory.mark("ingested")
        _note(args, f"ingest: {figures['snapshot']}", figures)
        if rows < args.ledgers:
            return figures

        if not args.skip_loss:
            before = timers.snapshot()
            since = max((p.get("batchId", -1) for p in _query_progress(query)), default=-1)
            figures["loss"] = _lose_bookies(args, session, spec, index, root, query, recorder, spark)
            figures["profile"]["loss"] = {
                "query": _progress_profile(_query_progress(query), since),
                "sink_helpers": Timers.delta(timers.snapshot(), before),
            }
            memory.mark("losses")
            _note(args, f"loss: p50 last alert {figures['loss']['last_alert_p50_s']} s", figures)
        if not args.skip_full_read and "java" in figures.get("full_read", {}):
            figures["full_read"]["java_under_job"] = _run_full_read(
                "java", hosts, root, args.read_in_flight, state_dir
            )
            _note(args, f"full read under the job: {figures['full_read']['java_under_job']}", figures)
            runs = [r for r in (figures.get("loss") or {}).get("runs", []) if r["complete"]]
            baseline = figures["full_read"]["java"].get("total_s")
            if runs and baseline:
                figures["ratio_full_read_to_last_alert"] = {
                    "baseline": "java full read on the quiet cluster (its fastest)",
                    "full_read_s": baseline,
                    "p50": round(baseline / figures["loss"]["last_alert_p50_s"], 2),
                    "first_run": round(baseline / runs[0]["last_ledger_alert_s"], 2),
                }
        if not args.skip_sustained:
            figures["sustained"] = []
            for rate in (float(r) for r in str(args.rate).split(",") if r):
                before = timers.snapshot()
                since = max((p.get("batchId", -1) for p in _query_progress(query)), default=-1)
                level = _sustained(args, rate, hosts, root, query, recorder, state_dir)
                level["profile"] = {
                    "query": _progress_profile(_query_progress(query), since),
                    "sink_helpers": Timers.delta(timers.snapshot(), before),
                }
                figures["sustained"].append(level)
                _note(args, f"sustained: {level}", figures)
        return figures
    finally:
        for close in reversed(closers):
            with contextlib.suppress(Exception):
                close()
        figures["watcher_topic_losses"] = _topic_losses(state_dir / "watch.log")
        harness.stop()
        if args.state_dir is None:
            import shutil

            shutil.rmtree(state_dir, ignore_errors=True)


def summary_line(figures: dict[str, Any]) -> dict[str, Any]:
    """The figures the targets name, for the one JSON line the script ends with.

    Example:
        >>> summary_line({"ledgers": 10, "bookies": 2, "load_average_at_start": [0.1, 0.2, 0.3],
        ...     "full_read": {"java": {"total_s": 4.0}},
        ...     "loss": {"runs": [{"last_ledger_alert_s": 0.5, "alerts_acked": 5, "complete": True,
        ...     "bookie_lost_alert_s": 0.2}]}})["speedup_p50"]
        8.0
    """
    loss = figures.get("loss") or {}
    # --sink-only: one level per alert producer batch size; the line is the first size's.
    level = loss if isinstance(loss, dict) else (loss[0] if loss else {})
    runs = level.get("runs", [])
    lasts = [r["last_ledger_alert_s"] if r["complete"] else None for r in runs]
    complete = [x for x in lasts if x is not None]
    p50 = round(statistics.median(complete), 3) if complete else None
    full_read = ((figures.get("full_read") or {}).get("java") or {}).get("total_s")
    return {
        "ledgers": figures.get("ledgers"),
        "bookies": figures.get("bookies"),
        "broker": figures.get("broker"),
        "full_read_s": full_read,
        "loss_to_last_alert_s": lasts,
        "loss_to_last_alert_p50_s": p50,
        "speedup_p50": round(full_read / p50, 1) if full_read and p50 else None,
        "alerts_per_loss": [r["alerts_acked"] for r in runs],
        "loss_to_bookie_lost_s": [r.get("bookie_lost_alert_s") for r in runs],
        "loss_to_first_alert_s": [r.get("first_ledger_alert_s") for r in runs],
        "full_read_under_job_s": ((figures.get("full_read") or {}).get("java_under_job") or {}).get(
            "total_s"
        ),
        "watcher_topic_losses": figures.get("watcher_topic_losses"),
        "load_avg": {"start": figures.get("load_average_at_start"), "end": _load()},
        "mode": figures.get("mode", "job"),
        "alert_producer_batch_size": level.get("alert_producer_batch_size"),
        "loss_to_last_alert_p50_s_by_variant": level.get("last_alert_p50_s_by_variant") or None,
        "loss_load_average": [r.get("load_average") for r in runs],
        "loss_owner_phase_s": [(r.get("timeline_s") or {}).get("loss_owner_phase_s") for r in runs],
        "memory_mb": figures.get("memory_mb") or None,
        "loss_timeline_s": [
            {k: v for k, v in (r.get("timeline_s") or {}).items() if isinstance(v, int | float)} for r in runs
        ],
    }


@pytest.mark.benchmark
def test_stream_figures() -> None:
    """Prints the figures at a small scale; asserts completeness only (no timing: machines differ)."""
    args = _parse_args(
        [
            *("--ledgers", str(PYTEST_LEDGERS), "--heap", "1g", "--driver-memory", "2g"),
            *("--losses", "2", "--rate", "500", "--duration", "20"),
        ]
    )
    figures = run_benchmark(args)
    print(json.dumps(figures, indent=2))
    print(json.dumps(summary_line(figures)))
    assert figures["snapshot"]["job_ingest_complete"]
    assert all(run["complete"] for run in figures["loss"]["runs"])
    assert figures["full_read"]["java"]["ledgers_read"] == PYTEST_LEDGERS
    for level in figures["sustained"]:
        assert level["applied"] == level["writes"] - level["write_errors"]


if __name__ == "__main__":
    import signal

    # SIGTERM (kill <pid>) unwinds like an exception: services stopped, children stopped, temp dir removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logger.setLevel(logging.INFO)
    arguments = _parse_args(sys.argv[1:])
    if arguments.replay:
        sys.path.insert(0, str(REPO))  # run as a script: the replay module imports this one as a package's
        from tests.benchmarks import replay

        results = replay.run_replays(arguments)
        print(json.dumps(results, indent=2))
        print(json.dumps(replay.summary_line(results)))
        sys.exit(0)
    run = run_sink_scale if arguments.sink_only else run_benchmark
    results = run(arguments)
    print(json.dumps(results, indent=2))
    print(json.dumps(summary_line(results)))
