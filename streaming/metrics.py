"""Prometheus metrics of the streaming auditor.

Two families, both in a private ``CollectorRegistry``:

- query health from a ``StreamingQueryListener``: batch duration, input rows, rows/s, watermark lag (and the
  watermark itself, so ``time() - watermark`` keeps growing when batches stop), the input backlog, state
  rows, and ``bkaudit_last_batch_timestamp_seconds`` (a liveness heartbeat: alert when it stops moving);
- audit gauges named after BookKeeper's Auditor metrics, set after every batch from the open alerts, so they
  are true gauges of the current state (BookKeeper's ``NUM_UNDER_REPLICATED_LEDGERS`` is not, issue #4572,
  and its replicas-check gauges only count the last range, PR #4822).

Status: stable.

Example:
    >>> metrics = StreamMetrics()
    >>> metrics.set_open_alerts({"LEDGER_UNDER_REPLICATED": 3})
    >>> b"bkaudit_num_under_replicated_ledgers 3.0" in metrics.exposition()
    True
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from bkaudit.metrics_http import serve_metrics

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
    "METADATA_CORRUPT": ("bkaudit_num_corrupt_ledger_znodes", "ledger znodes that cannot be decoded"),
    "BOOKIE_LOST": ("bkaudit_num_lost_bookies", "bookies missing past lostBookieRecoveryDelay"),
    "BOOKIE_UNRESPONSIVE": (
        "bkaudit_num_unresponsive_bookies",
        "registered bookies that never answer probes",
    ),
}


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
        self.audit = {
            kind: Gauge(name, help_text, registry=self.registry)
            for kind, (name, help_text) in AUDIT_GAUGES.items()
        }

    def set_open_alerts(self, counts: Mapping[str, int]) -> None:
        """Set every audit gauge from the current open-alert counts (absent kinds are 0)."""
        for kind, gauge in self.audit.items():
            gauge.set(counts.get(kind, 0))

    def on_progress(self, progress: Mapping[str, Any]) -> None:
        """Record one ``StreamingQueryProgress`` (as its JSON dict)."""
        duration_ms = (progress.get("durationMs") or {}).get("triggerExecution")
        if duration_ms is not None:
            self.batch_duration.observe(duration_ms / 1000)
        self.input_rows.set(progress.get("numInputRows") or 0)
        self.rows_per_second.set(progress.get("processedRowsPerSecond") or 0)
        self.batch_id.set(progress.get("batchId") or 0)
        watermark = _iso_to_epoch((progress.get("eventTime") or {}).get("watermark"))
        if watermark is not None and watermark > 0:
            self.watermark.set(watermark)
            self.watermark_lag.set(max(0.0, time.time() - watermark))
        self.source_backlog.set(source_backlog(progress.get("sources") or []))
        self.state_rows.set(sum(op.get("numRowsTotal") or 0 for op in progress.get("stateOperators") or []))
        self.last_batch.set(time.time())

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int) -> None:
        """Expose ``/metrics`` on ``port`` (all interfaces: Prometheus scrapes from elsewhere).

        Raises :class:`~bkaudit.errors.ServiceError` (one line naming the port) when it cannot bind.
        """
        serve_metrics(self.registry, port, "0.0.0.0", setting="stream.metrics_port")


def make_listener(metrics: StreamMetrics) -> Any:
    """A ``StreamingQueryListener`` feeding ``metrics`` (imports pyspark lazily)."""
    import json

    from pyspark.sql.streaming import StreamingQueryListener

    class ProgressListener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            metrics.on_progress(json.loads(event.progress.json))

        def onQueryIdle(self, event: Any) -> None:
            metrics.last_batch.set(time.time())

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return ProgressListener()
