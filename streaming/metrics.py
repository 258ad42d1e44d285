"""Prometheus metrics of the streaming auditor.

Three families, all in a private ``CollectorRegistry``:

- query health from a ``StreamingQueryListener``: batch duration, input rows, rows/s, watermark lag (and the
  watermark itself, so ``time() - watermark`` keeps growing when batches stop), how far the watermark is
  ahead of the wall clock (then events dated now are late), the input rows the stateful operator dropped
  as late (Spark drops them without a trace), the input backlog, state rows, and
  ``bkaudit_last_batch_timestamp_seconds`` (a liveness heartbeat: alert when it stops moving);
- what the sink did, from its :class:`~streaming.reports.BatchReport` after every batch (:meth:`on_batch`):
  probes by reason and outcome, dead letters by source, alert transitions published by kind and state,
  ledger rows written, and the sink's own seconds per batch (the batch duration above is the whole trigger:
  reading, decoding, the stateful stage and the sink). These counters count work done, not unique events: a
  batch Spark replays after a crash between the sink and the checkpoint commit is counted again (its alerts
  are published again, with the same ids; its table writes are skipped as done but still counted);
- audit gauges named after BookKeeper's Auditor metrics, set after every batch from the open alerts, so they
  are true gauges of the current state (BookKeeper's ``NUM_UNDER_REPLICATED_LEDGERS`` is not, issue #4572,
  and its replicas-check gauges only count the last range, PR #4822).

Example:
    >>> metrics = StreamMetrics()
    >>> metrics.set_open_alerts({"LEDGER_UNDER_REPLICATED": 3})
    >>> b"bkaudit_num_under_replicated_ledgers 3.0" in metrics.exposition()
    True
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from connectors.kafka.planner import SourceStatusCollector
from core.domain.alerts import AlertKind, AlertState
from core.metrics_http import serve_metrics

if TYPE_CHECKING:
    from streaming.reports import BatchReport, LossReport

#: The ledger lane's batches feed the batch gauges, and the timers query (the stateful operator, which
#: holds the watermark) the watermark gauges; the membership lane's tiny batches feed neither.
DRIVER_LEDGER_LANE = "bkaudit-ledgers"
TIMERS_QUERY = "bkaudit-timers"
#: Kinds whose open count the loss owner reports (streaming.loss.OWNED_ALERT_KINDS' values).
_LOSS_KINDS = frozenset(
    {
        "BOOKIE_LOST",
        "LEDGER_UNDER_REPLICATED",
        "LEDGER_UNRECOVERABLE",
        "AUTORECOVERY_DISABLED",
        "AUDITOR_MISSING",
        "REPLICATION_STALLED",
        "ZOOKEEPER_DISRUPTION",
        "AUDITOR_CHECKS_OVERDUE",
        "AUDITOR_LAGGING",
    }
)

# Alert kind → gauge name (BookKeeper's Auditor names, lower-cased, bkaudit_ prefix).
AUDIT_GAUGES = {
    "LEDGER_UNDER_REPLICATED": ("bkaudit_num_under_replicated_ledgers", "ledgers naming a lost bookie"),
    "LEDGER_UNRECOVERABLE": (
        "bkaudit_num_unrecoverable_ledgers",
        "ledgers with an entry that has no copy left",
    ),
    "PLACEMENT_NOT_ADHERING": (
        "bkaudit_num_ledgers_not_adhering_to_placement_policy",
        "closed ledgers failing the placement policy",
    ),
    "PLACEMENT_ISOLATION_VIOLATED": (
        "bkaudit_num_ledgers_violating_bookie_isolation",
        "ledgers with a member outside the affinity groups their isolation config allows",
    ),
    "PLACEMENT_SOFT": (
        "bkaudit_num_ledgers_softly_adhering_to_placement_policy",
        "closed ledgers only softly adhering",
    ),
    "REPLICAS_NO_REPLICA": (
        "bkaudit_num_ledgers_having_no_replica_of_an_entry",
        "ledgers with an entry no bookie holds (confirmed by re-probes)",
    ),
    "REPLICAS_LESS_THAN_AQ": (
        "bkaudit_num_ledgers_having_less_than_aq_replicas_of_an_entry",
        "ledgers with an entry held by fewer than AQ bookies",
    ),
    "REPLICAS_LESS_THAN_WQ": (
        "bkaudit_num_ledgers_having_less_than_wq_replicas_of_an_entry",
        "ledgers with an entry held by fewer than WQ bookies",
    ),
    "UNDER_REPLICATION_STUCK": (
        "bkaudit_num_underreplicated_ledgers_elapsed_recovery_grace_period",
        "urL marks older than the grace period",
    ),
    "METADATA_CORRUPT": (
        "bkaudit_num_corrupt_ledger_znodes",
        "ledger znodes (and Pulsar managed-ledger znodes) that cannot be decoded",
    ),
    "RACK_MAP_INVALID": (
        "bkaudit_rack_map_invalid",
        "1 while the current rack map cannot be read (placement unknown, not evaluated)",
    ),
    "BOOKIE_LOST": ("bkaudit_num_lost_bookies", "bookies missing past lostBookieRecoveryDelay"),
    "BOOKIE_UNRESPONSIVE": (
        "bkaudit_num_unresponsive_bookies",
        "registered bookies that never answer probes",
    ),
    "BOOKIE_AUTH_REFUSED": (
        "bkaudit_num_bookies_refusing_auth",
        "live bookies that refuse bkaudit's TLS or credentials (or want ones it was not given)",
    ),
    "AUTORECOVERY_DISABLED": (
        "bkaudit_autorecovery_disabled",
        "1 while AutoRecovery has been switched off (underreplication/disable) past its grace period",
    ),
    "AUDITOR_MISSING": (
        "bkaudit_auditor_missing",
        "1 while no Auditor has been elected for longer than the grace period while bookies run",
    ),
    "REPLICATION_STALLED": (
        "bkaudit_num_stalled_replication_locks",
        "ledgers whose replication lock has been held past the grace period",
    ),
    "AUDITOR_CHECKS_OVERDUE": (
        "bkaudit_auditor_checks_overdue",
        "1 while one of the Auditor's periodic checks is overdue past the grace period "
        "(checkallledgersctime, placementpolicycheckctime, replicascheckctime)",
    ),
    "AUDITOR_LAGGING": (
        "bkaudit_auditor_lagging",
        "1 while a ledger at risk has had no under-replication mark from the Auditor past the grace period",
    ),
    "ZOOKEEPER_DISRUPTION": (
        "bkaudit_zookeeper_disruption",
        "1 while bookies whose registration vanished still answer (ZooKeeper lost their sessions, not them)",
    ),
    # Pulsar's managed ledgers against BookKeeper (streaming.topics).
    "TOPIC_LEDGER_MISSING": (
        "bkaudit_num_topic_ledgers_missing",
        "ledgers a Pulsar managed ledger (or cursor) lists that BookKeeper does not have",
    ),
    "LEDGER_ORPHANED": (
        "bkaudit_num_orphaned_ledgers",
        "ledgers whose owning Pulsar topic no longer lists them, older than pulsar.orphan_grace_s",
    ),
}

# Label values the sink reports (streaming.reports.BatchReport), created at zero so that rates and
# `increase()` see the first event and the dashboard's checker knows them. A value outside these is still
# counted.
PROBE_REASONS = ("reprobe", "scrutiny")
PROBE_OUTCOMES = ("healthy", "failing")
DEAD_LETTER_SOURCES = ("kafka", "znode", "future", "managed_ledger")


def source_backlog(sources: list[Mapping[str, Any]]) -> int:
    """Records the sources had beyond what the batch read: latest offset minus end offset, summed.

    Spark reports the offsets of each source as ``{"topic": {"partition": offset}}`` (the Python Kafka
    source reports its latest offsets too). Partitions missing from either side, and sources whose offsets
    are not in that shape (another source format), count nothing.

    Example:
        >>> source_backlog([{"endOffset": {"t": {"0": 5, "1": 7}}, "latestOffset": {"t": {"0": 9, "1": 7}}}])
        4
        >>> source_backlog([{"endOffset": "opaque", "latestOffset": None}])
        0
    """
    total = 0
    for source in sources:
        end, latest = source.get("endOffset"), source.get("latestOffset")
        if not isinstance(end, Mapping) or not isinstance(latest, Mapping):
            continue
        for topic, partitions in latest.items():
            read = end.get(topic)
            if not isinstance(partitions, Mapping) or not isinstance(read, Mapping):
                continue
            for partition, newest in partitions.items():
                position = read.get(partition)
                if isinstance(newest, int) and isinstance(position, int):
                    total += max(0, newest - position)
    return total


def rows_dropped_late(operators: list[Mapping[str, Any]]) -> int:
    """Input rows the stateful operators dropped as older than the watermark, in one progress report.

    Example:
        >>> rows_dropped_late([{"numRowsDroppedByWatermark": 2}, {"numRowsTotal": 7}])
        2
    """
    return sum(op.get("numRowsDroppedByWatermark") or 0 for op in operators)


def _iso_to_epoch(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


class StreamMetrics:
    """The registry, the gauges, and the hooks the job calls."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.batch_duration = Histogram(
            "bkaudit_stream_batch_duration_seconds",
            "micro-batch duration",
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=self.registry,
        )
        self.input_rows = Gauge(
            "bkaudit_stream_input_rows", "rows read by the last batch", registry=self.registry
        )
        self.rows_per_second = Gauge(
            "bkaudit_stream_processed_rows_per_second",
            "processing rate of the last batch",
            registry=self.registry,
        )
        self.watermark_lag = Gauge(
            "bkaudit_stream_watermark_lag_seconds",
            "wall clock minus event-time watermark",
            registry=self.registry,
        )
        self.watermark = Gauge(
            "bkaudit_stream_watermark_timestamp_seconds",
            "event-time watermark after the last batch (epoch seconds)",
            registry=self.registry,
        )
        self.watermark_ahead = Gauge(
            "bkaudit_stream_watermark_ahead_seconds",
            "event-time watermark minus wall clock, 0 when behind (when ahead, events dated now are late)",
            registry=self.registry,
        )
        self._watermark_s = 0.0
        self.watermark_ahead.set_function(lambda: max(0.0, self._watermark_s - time.time()))
        self.rows_dropped_late = Counter(
            "bkaudit_stream_rows_dropped_late",
            "input rows the stateful operator dropped as older than the watermark (never applied)",
            registry=self.registry,
        )
        self.source_backlog = Gauge(
            "bkaudit_stream_source_backlog_records",
            "records the last batch left unread (nonzero only when maxOffsetsPerTrigger caps a batch)",
            registry=self.registry,
        )
        self.state_rows = Gauge(
            "bkaudit_stream_state_rows", "rows in the state store", registry=self.registry
        )
        self.last_batch = Gauge(
            "bkaudit_last_batch_timestamp_seconds",
            "when the last batch finished (liveness)",
            registry=self.registry,
        )
        self.batch_id = Gauge("bkaudit_stream_batch_id", "id of the last batch", registry=self.registry)
        self._spark_queries: set[str] = set()
        self.disk_free_ratio = Gauge(
            "bkaudit_stream_disk_free_ratio",
            "free share of the volume holding each of the job's directories (lakehouse, checkpoint, logs)",
            ["setting"],
            registry=self.registry,
        )
        self.sink_duration = Histogram(
            "bkaudit_stream_sink_duration_seconds",
            "seconds the foreachBatch sink took per batch (tables, probes, alerts; not the stateful stage)",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=self.registry,
        )
        self.probes = Counter(
            "bkaudit_stream_probes",
            "ledger probes the sink ran, by reason (reprobe, scrutiny) and outcome (healthy, failing)",
            ["reason", "outcome"],
            registry=self.registry,
        )
        self.dead_letters = Counter(
            "bkaudit_stream_dead_letters",
            "dead_letters rows the sink wrote, by source (kafka: not a change event; znode: undecodable; "
            "future: dated too far ahead of the receiving clock)",
            ["source"],
            registry=self.registry,
        )
        self.alert_transitions = Counter(
            "bkaudit_stream_alert_transitions",
            "alert transitions published to the alerts topic, by kind and state (firing, resolved)",
            ["kind", "state"],
            registry=self.registry,
        )
        self.scrutiny_pass_started = Gauge(
            "bkaudit_scrutiny_pass_started_timestamp_seconds",
            "when the background replicas check's current pass over the closed ledgers began (epoch s)",
            registry=self.registry,
        )
        self.scrutiny_last_full_pass = Gauge(
            "bkaudit_scrutiny_last_full_pass_timestamp_seconds",
            "when the background replicas check last completed a pass over every closed ledger (epoch s; "
            "0: none yet)",
            registry=self.registry,
        )
        self.scrutiny_expected_pass = Gauge(
            "bkaudit_scrutiny_expected_pass_seconds",
            "how long one pass over the closed ledgers takes at the check's pace (0: the check is off)",
            registry=self.registry,
        )
        self.ledgers_written = Counter(
            "bkaudit_stream_ledgers_written",
            "ledger rows the sink upserted (new versions, deletes, under-replication marks, placement)",
            registry=self.registry,
        )
        for reason in PROBE_REASONS:
            for outcome in PROBE_OUTCOMES:
                self.probes.labels(reason, outcome)
        for source in DEAD_LETTER_SOURCES:
            self.dead_letters.labels(source)
        for kind in AlertKind:
            for state in AlertState:
                self.alert_transitions.labels(kind.value, state.value)
        self.audit = {
            kind: Gauge(name, help_text, registry=self.registry)
            for kind, (name, help_text) in AUDIT_GAUGES.items()
        }
        # The Kafka source's broker outages and topic resets (it plans in another process; the job points
        # this at the source's status file).
        self.source_status = SourceStatusCollector(None)
        self.registry.register(self.source_status)
        # Open alerts per kind as last reported by each lane (the loss owner's kinds, the ledger lane's rest).
        self._open_by_lane: dict[str, dict[str, int]] = {"ledgers": {}, "loss": {}}

    def set_open_alerts(self, counts: Mapping[str, int]) -> None:
        """Set every audit gauge from the current open-alert counts (absent kinds are 0).

        Example:
            >>> metrics = StreamMetrics()
            >>> metrics.set_open_alerts({"BOOKIE_LOST": 1})
            >>> metrics.registry.get_sample_value("bkaudit_num_lost_bookies")
            1.0
        """
        for kind, gauge in self.audit.items():
            gauge.set(counts.get(kind, 0))

    def on_batch(self, report: BatchReport) -> None:
        """Record what the sink did in one batch: the sink counters, its duration and the audit gauges.

        The sink calls this once at the end of every batch it completes (a batch that fails is counted when
        its replay completes). A replayed batch counts again: these count work done, not unique events.

        Example:
            >>> from streaming.reports import BatchReport
            >>> metrics = StreamMetrics()
            >>> metrics.on_batch(
            ...     BatchReport(
            ...         3,
            ...         probe_outcomes={("scrutiny", "failing"): 2},
            ...         dead_letters={"kafka": 1},
            ...         alerts=[{"kind": "BOOKIE_LOST", "state": "firing"}],
            ...         ledgers_written=5,
            ...         open_alerts={"BOOKIE_LOST": 1},
            ...         seconds=0.4,
            ...     )
            ... )
            >>> labels = {"reason": "scrutiny", "outcome": "failing"}
            >>> metrics.registry.get_sample_value("bkaudit_stream_probes_total", labels)
            2.0
            >>> metrics.registry.get_sample_value("bkaudit_stream_ledgers_written_total")
            5.0
        """
        for (reason, outcome), probes in report.probe_outcomes.items():
            self.probes.labels(reason, outcome).inc(probes)
        for source, rows in report.dead_letters.items():
            self.dead_letters.labels(source).inc(rows)
        for alert in report.alerts:
            self.alert_transitions.labels(alert["kind"], alert["state"]).inc()
        self.ledgers_written.inc(report.ledgers_written)
        self.sink_duration.observe(report.seconds)
        self.scrutiny_pass_started.set((report.scrutiny_pass_started_ms or 0) / 1000)
        self.scrutiny_last_full_pass.set((report.scrutiny_last_full_pass_ms or 0) / 1000)
        self.scrutiny_expected_pass.set(report.scrutiny_expected_pass_s or 0)
        self._open_by_lane = {
            "ledgers": {k: n for k, n in report.open_alerts.items() if k not in _LOSS_KINDS},
            "loss": {k: n for k, n in report.open_alerts.items() if k in _LOSS_KINDS},
        }
        self.set_open_alerts({**self._open_by_lane["ledgers"], **self._open_by_lane["loss"]})

    def on_membership_batch(self, report: LossReport, loss_open: Mapping[str, int]) -> None:
        """Record the alerts one membership-lane batch published, and the loss owner's open counts.

        Example:
            >>> from streaming.reports import LossReport
            >>> metrics = StreamMetrics()
            >>> report = LossReport("a", 1, transitions={("BOOKIE_LOST", "firing"): 1})
            >>> metrics.on_membership_batch(report, {"BOOKIE_LOST": 1})
            >>> metrics.registry.get_sample_value("bkaudit_num_lost_bookies")
            1.0
        """
        for (kind, state), alerts in report.transitions.items():
            self.alert_transitions.labels(kind, state).inc(alerts)
        self._open_by_lane["loss"] = dict(loss_open)
        self.set_open_alerts({**self._open_by_lane["ledgers"], **self._open_by_lane["loss"]})

    def on_progress(self, progress: Mapping[str, Any]) -> None:
        """Record one ``StreamingQueryProgress`` (as its JSON dict) of the ledger lane (others are ignored:
        the membership lane's tiny batches would hide the ledger lane's lag)."""
        name = progress.get("name")
        if name not in (None, DRIVER_LEDGER_LANE, TIMERS_QUERY):
            return
        if name != TIMERS_QUERY:
            self._batch_progress(progress)
        if name != DRIVER_LEDGER_LANE:
            self._watermark_progress(progress)

    def watch_query(self, query_id: str) -> None:
        """Take the Spark listener's events of the query with this id (a query's id outlives its restarts);
        other queries of the session are other jobs'."""
        self._spark_queries.add(str(query_id))

    def on_spark_progress(self, progress: Mapping[str, Any]) -> None:
        """:meth:`on_progress` for a Spark listener's event: only of the queries this job started."""
        if str(progress.get("id")) in self._spark_queries:
            self.on_progress(progress)

    def on_spark_idle(self, query_id: str) -> None:
        if query_id in self._spark_queries:
            self.last_batch.set(time.time())

    def _batch_progress(self, progress: Mapping[str, Any]) -> None:
        duration_ms = (progress.get("durationMs") or {}).get("triggerExecution")
        if duration_ms is not None:
            self.batch_duration.observe(duration_ms / 1000)
        self.input_rows.set(progress.get("numInputRows") or 0)
        self.rows_per_second.set(progress.get("processedRowsPerSecond") or 0)
        self.batch_id.set(progress.get("batchId") or 0)
        self.source_backlog.set(source_backlog(progress.get("sources") or []))
        self.last_batch.set(time.time())

    def _watermark_progress(self, progress: Mapping[str, Any]) -> None:
        watermark = _iso_to_epoch((progress.get("eventTime") or {}).get("watermark"))
        if watermark is not None and watermark > 0:
            self.watermark.set(watermark)
            self.watermark_lag.set(max(0.0, time.time() - watermark))
            self._watermark_s = watermark  # the ahead gauge is computed when scraped
        operators = progress.get("stateOperators") or []
        self.state_rows.set(sum(op.get("numRowsTotal") or 0 for op in operators))
        self.rows_dropped_late.inc(rows_dropped_late(operators))

    def watch_free_space(self, directories: Mapping[str, str | Path]) -> None:
        """Serve the free share of each directory's volume, measured when scraped."""
        from streaming.disk_space import free_space

        for setting, path in directories.items():

            def ratio(one: Mapping[str, str | Path] = {setting: path}) -> float:
                found = free_space(one)
                return found[0].ratio if found else float("nan")

            self.disk_free_ratio.labels(setting).set_function(ratio)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int) -> None:
        """Expose ``/metrics`` on ``port`` (all interfaces: Prometheus scrapes from elsewhere).

        Raises :class:`~core.errors.ServiceError` (one line naming the port) when it cannot bind.
        """
        serve_metrics(self.registry, port, "0.0.0.0", setting="stream.metrics_port")


class ProgressDispatch:
    """The one ``StreamingQueryListener`` of a Spark session, forwarding each event to the job metrics
    subscribed to it (:func:`subscribe`).

    Spark calls every registered Python listener, one after another through the Py4J callback server, for
    every event of every query in the session: a listener per started job would make each event cost as
    many round trips as jobs were ever started in the process, and a lagging listener bus then reports a
    batch long after it ran. Subscribers are held weakly: a job's metrics that nothing else holds stop
    receiving events.

    Example:
        >>> dispatch = ProgressDispatch()
        >>> metrics = StreamMetrics()
        >>> dispatch.add(metrics)
        >>> metrics.watch_query("q-1")
        >>> progress = {"id": "q-1", "name": "bkaudit-timers", "stateOperators": [{"numRowsTotal": 2}]}
        >>> dispatch.progress(progress)
        >>> metrics.registry.get_sample_value("bkaudit_stream_state_rows")
        2.0
    """

    def __init__(self) -> None:
        self._subscribers: weakref.WeakSet[StreamMetrics] = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, metrics: StreamMetrics) -> None:
        with self._lock:
            self._subscribers.add(metrics)

    def _each(self) -> list[StreamMetrics]:
        with self._lock:
            return list(self._subscribers)

    def progress(self, progress: Mapping[str, Any]) -> None:
        for metrics in self._each():
            metrics.on_spark_progress(progress)

    def idle(self, query_id: str) -> None:
        for metrics in self._each():
            metrics.on_spark_idle(query_id)

    def listener(self) -> Any:
        """The ``StreamingQueryListener`` forwarding to this dispatch (imports pyspark lazily)."""
        import json

        from pyspark.sql.streaming import StreamingQueryListener

        dispatch = self

        class ProgressListener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                dispatch.progress(json.loads(event.progress.json))

            def onQueryIdle(self, event: Any) -> None:
                dispatch.idle(str(event.id))

            def onQueryTerminated(self, event: Any) -> None:
                pass

        return ProgressListener()


_DISPATCH_ATTRIBUTE = "_bkaudit_progress_dispatch"
_subscribe_lock = threading.Lock()


def subscribe(spark: Any, metrics: StreamMetrics) -> None:
    """Feed ``metrics`` from the progress of the Spark queries it watches (:meth:`StreamMetrics.watch_query`),
    through the session's one listener, registered on the first call."""
    with _subscribe_lock:
        dispatch = getattr(spark, _DISPATCH_ATTRIBUTE, None)
        if dispatch is None:
            dispatch = ProgressDispatch()
            spark.streams.addListener(dispatch.listener())
            setattr(spark, _DISPATCH_ATTRIBUTE, dispatch)
    dispatch.add(metrics)
