"""The job's Prometheus metrics: query gauges from a StreamingQueryProgress (the JSON dict the listener
receives), and the sink's counters from its BatchReport (``StreamMetrics.on_batch``)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from connectors.delta.tables import read_table
from core.domain.alerts import AlertKind, AlertState
from core.settings import KafkaSettings
from streaming.metrics import (
    DEAD_LETTER_SOURCES,
    PROBE_OUTCOMES,
    PROBE_REASONS,
    ProgressDispatch,
    StreamMetrics,
)
from streaming.reports import BatchReport
from streaming.sink import ARROW_DECISION_SCHEMA, AuditSink, SinkConfig

# Shaped like Spark 4's StreamingQueryProgress.json for the bkaudit_kafka source (offsets parsed as JSON).
PROGRESS = {
    "batchId": 42,
    "numInputRows": 120,
    "processedRowsPerSecond": 60.0,
    "durationMs": {"triggerExecution": 2000},
    "eventTime": {"watermark": "2026-01-01T00:00:00.000Z"},
    "stateOperators": [{"numRowsTotal": 7}, {"numRowsTotal": 3}],
    "sources": [
        {
            "description": "bkaudit_kafka",
            "startOffset": {"bkaudit.changes": {"0": 100, "1": 50}},
            "endOffset": {"bkaudit.changes": {"0": 160, "1": 110}, "bkaudit.feedback": {"0": 9}},
            "latestOffset": {"bkaudit.changes": {"0": 200, "1": 110}, "bkaudit.feedback": {"0": 12}},
        }
    ],
}


def sample(metrics: StreamMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_with_the_driver_lane_its_batches_and_the_timers_watermark_feed_the_gauges():
    """The ledger lane's batches set the batch gauges, the timers query (the stateful
    operator) the watermark and state gauges; neither overwrites the other's."""
    metrics = StreamMetrics()
    lane = {
        "name": "bkaudit-ledgers",
        "batchId": 7,
        "numInputRows": 900,
        "durationMs": {"triggerExecution": 50},
    }
    metrics.on_progress(lane)
    metrics.on_progress({**PROGRESS, "name": "bkaudit-timers", "batchId": 3, "numInputRows": 4})
    assert sample(metrics, "bkaudit_stream_batch_id") == 7
    assert sample(metrics, "bkaudit_stream_input_rows") == 900
    assert sample(metrics, "bkaudit_stream_state_rows") == 10
    assert sample(metrics, "bkaudit_stream_watermark_timestamp_seconds") == 1767225600.0
    metrics.on_progress({**PROGRESS, "name": "bkaudit-membership", "batchId": 99})
    assert sample(metrics, "bkaudit_stream_batch_id") == 7


def test_the_spark_listener_feeds_a_job_only_the_progress_of_the_queries_it_started():
    """Every job in one Spark session hears every query's events: another job's query (or an unnamed one,
    reported late by a lagging listener bus) must not overwrite this job's gauges."""
    dispatch = ProgressDispatch()
    mine, other = StreamMetrics(), StreamMetrics()
    dispatch.add(mine)
    dispatch.add(other)
    mine.on_progress({"name": "bkaudit-ledgers", "batchId": 7, "numInputRows": 900})
    mine.watch_query("timers-of-mine")
    other.watch_query("timers-of-other")
    dispatch.progress({**PROGRESS, "id": "an-unnamed-query", "batchId": 99})
    dispatch.progress({**PROGRESS, "id": "timers-of-other", "name": "bkaudit-timers"})
    assert sample(mine, "bkaudit_stream_batch_id") == 7
    assert sample(mine, "bkaudit_stream_state_rows") == 0
    assert sample(other, "bkaudit_stream_state_rows") == 10
    dispatch.progress({**PROGRESS, "id": "timers-of-mine", "name": "bkaudit-timers"})
    assert sample(mine, "bkaudit_stream_state_rows") == 10
    assert sample(mine, "bkaudit_stream_batch_id") == 7


def test_progress_sets_every_query_gauge():
    metrics = StreamMetrics()
    before = time.time()
    metrics.on_progress(PROGRESS)
    assert sample(metrics, "bkaudit_stream_batch_id") == 42
    assert sample(metrics, "bkaudit_stream_input_rows") == 120
    assert sample(metrics, "bkaudit_stream_processed_rows_per_second") == 60.0
    assert sample(metrics, "bkaudit_stream_state_rows") == 10
    assert sample(metrics, "bkaudit_stream_batch_duration_seconds_count") == 1
    assert sample(metrics, "bkaudit_stream_batch_duration_seconds_sum") == pytest.approx(2.0)
    watermark = 1767225600.0  # 2026-01-01T00:00:00Z
    assert sample(metrics, "bkaudit_stream_watermark_timestamp_seconds") == watermark
    assert sample(metrics, "bkaudit_stream_watermark_lag_seconds") == pytest.approx(before - watermark, abs=5)
    # (200 - 160) + (110 - 110) + (12 - 9): what maxOffsetsPerTrigger left for later batches.
    assert sample(metrics, "bkaudit_stream_source_backlog_records") == 43
    last_batch = sample(metrics, "bkaudit_last_batch_timestamp_seconds")
    assert last_batch is not None and last_batch >= before


def test_progress_without_watermark_or_latest_offsets_keeps_the_gauges_sane():
    metrics = StreamMetrics()
    metrics.on_progress(
        {
            "batchId": 0,
            "eventTime": {},
            "sources": [{"endOffset": {"t": {"0": 5}}, "latestOffset": None}],
        }
    )
    assert sample(metrics, "bkaudit_stream_watermark_timestamp_seconds") == 0
    assert sample(metrics, "bkaudit_stream_watermark_lag_seconds") == 0
    assert sample(metrics, "bkaudit_stream_source_backlog_records") == 0
    assert sample(metrics, "bkaudit_stream_batch_duration_seconds_count") == 0


def test_rows_dropped_as_late_are_counted_across_batches():
    metrics = StreamMetrics()
    assert sample(metrics, "bkaudit_stream_rows_dropped_late_total") == 0
    late = {"numRowsTotal": 3, "numRowsDroppedByWatermark": 4}
    metrics.on_progress({**PROGRESS, "stateOperators": [late, {"numRowsDroppedByWatermark": 1}]})
    metrics.on_progress({**PROGRESS, "stateOperators": [{"numRowsDroppedByWatermark": 2}]})
    metrics.on_progress({**PROGRESS, "stateOperators": []})
    assert sample(metrics, "bkaudit_stream_rows_dropped_late_total") == 7


def test_the_watermark_ahead_gauge_is_how_far_the_watermark_is_past_the_wall_clock():
    metrics = StreamMetrics()
    assert sample(metrics, "bkaudit_stream_watermark_ahead_seconds") == 0  # no watermark yet
    metrics.on_progress(PROGRESS)  # 2026-01-01: behind
    assert sample(metrics, "bkaudit_stream_watermark_ahead_seconds") == 0
    ahead = datetime.fromtimestamp(time.time() + 3600, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    metrics.on_progress({**PROGRESS, "eventTime": {"watermark": ahead}})
    assert sample(metrics, "bkaudit_stream_watermark_ahead_seconds") == pytest.approx(3600, abs=60)
    assert sample(metrics, "bkaudit_stream_watermark_lag_seconds") == 0


# ------------------------------------------------------------------------------------------ the sink


def test_on_batch_counts_what_the_sink_did_and_adds_up_over_batches():
    metrics = StreamMetrics()
    first = BatchReport(
        1,
        probes=15,
        probe_outcomes={("reprobe", "healthy"): 3, ("reprobe", "failing"): 2, ("scrutiny", "healthy"): 10},
        dead_letters={"kafka": 2, "znode": 1},
        alerts=[
            {"kind": "BOOKIE_LOST", "state": "firing"},
            {"kind": "LEDGER_UNDER_REPLICATED", "state": "firing"},
            {"kind": "LEDGER_UNDER_REPLICATED", "state": "firing"},
        ],
        ledgers_written=7,
        open_alerts={"BOOKIE_LOST": 1, "LEDGER_UNDER_REPLICATED": 2},
        seconds=1.5,
    )
    second = BatchReport(
        2,
        probe_outcomes={("scrutiny", "failing"): 1, ("scrutiny", "healthy"): 4},
        dead_letters={"kafka": 1},
        alerts=[
            {"kind": "BOOKIE_LOST", "state": "resolved"},
            {"kind": "LEDGER_UNDER_REPLICATED", "state": "resolved"},
        ],
        ledgers_written=3,
        open_alerts={"LEDGER_UNDER_REPLICATED": 1},
        seconds=0.2,
    )
    metrics.on_batch(first)
    metrics.on_batch(second)

    def probes(reason, outcome):
        return sample(metrics, "bkaudit_stream_probes_total", reason=reason, outcome=outcome)

    def transitions(kind, state):
        return sample(metrics, "bkaudit_stream_alert_transitions_total", kind=kind, state=state)

    assert [probes(r, o) for r in PROBE_REASONS for o in PROBE_OUTCOMES] == [3, 2, 14, 1]
    assert sample(metrics, "bkaudit_stream_dead_letters_total", source="kafka") == 3
    assert sample(metrics, "bkaudit_stream_dead_letters_total", source="znode") == 1
    assert transitions("BOOKIE_LOST", "firing") == 1 and transitions("BOOKIE_LOST", "resolved") == 1
    assert transitions("LEDGER_UNDER_REPLICATED", "firing") == 2
    assert transitions("LEDGER_UNDER_REPLICATED", "resolved") == 1
    assert transitions("METADATA_CORRUPT", "firing") == 0
    assert sample(metrics, "bkaudit_stream_ledgers_written_total") == 10
    assert sample(metrics, "bkaudit_stream_sink_duration_seconds_count") == 2
    assert sample(metrics, "bkaudit_stream_sink_duration_seconds_sum") == pytest.approx(1.7)
    assert sample(metrics, "bkaudit_stream_sink_duration_seconds_bucket", le="0.25") == 1
    # The audit gauges are the state after the last batch, not a sum.
    assert sample(metrics, "bkaudit_num_lost_bookies") == 0
    assert sample(metrics, "bkaudit_num_under_replicated_ledgers") == 1


def test_every_sink_series_exists_at_zero_before_the_first_batch():
    # So that increase() sees the first dead letter, and the dashboard's checker knows the label values.
    metrics = StreamMetrics()
    for reason in PROBE_REASONS:
        for outcome in PROBE_OUTCOMES:
            assert sample(metrics, "bkaudit_stream_probes_total", reason=reason, outcome=outcome) == 0
    for source in DEAD_LETTER_SOURCES:
        assert sample(metrics, "bkaudit_stream_dead_letters_total", source=source) == 0
    for kind in AlertKind:
        for state in AlertState:
            labels = {"kind": kind.value, "state": state.value}
            assert sample(metrics, "bkaudit_stream_alert_transitions_total", **labels) == 0
    assert sample(metrics, "bkaudit_stream_ledgers_written_total") == 0
    assert sample(metrics, "bkaudit_stream_sink_duration_seconds_count") == 0


def test_an_empty_batch_counts_one_sink_run_and_nothing_else():
    metrics = StreamMetrics()
    metrics.on_batch(BatchReport(0, open_alerts={"BOOKIE_LOST": 1}, seconds=0.01))
    metrics.on_batch(BatchReport(1, seconds=0.01))
    assert sample(metrics, "bkaudit_stream_sink_duration_seconds_count") == 2
    assert sample(metrics, "bkaudit_stream_ledgers_written_total") == 0
    assert sample(metrics, "bkaudit_stream_dead_letters_total", source="kafka") == 0
    assert sample(metrics, "bkaudit_num_lost_bookies") == 0  # absent from the last batch's open alerts


def _decisions(*rows: dict) -> pa.Table:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return pa.Table.from_pylist(
        [{"event_time": at, "cluster": "c1", **row, "payload": json.dumps(row["payload"])} for row in rows],
        schema=ARROW_DECISION_SCHEMA,
    )


def test_the_sink_reports_each_batch_once_and_a_replay_counts_again(tmp_path, monkeypatch):
    # A batch that publishes nothing (no alert, no feedback), so no Kafka is needed: fail if it is asked for.
    def no_kafka(self):
        raise AssertionError("this batch must not publish")

    monkeypatch.setattr(AuditSink, "_kafka", no_kafka)
    metrics = StreamMetrics()
    sink = AuditSink(
        SinkConfig(lakehouse_root=tmp_path, app_id="metrics-test", kafka=KafkaSettings()), metrics
    )
    batch = _decisions(
        {"kind": "dead_letter", "payload": {"reason": "not a change event"}, "topic": "t", "partition": 0},
        {"kind": "dead_letter", "payload": {"reason": "truncated"}, "topic": "t", "partition": 1},
        {"kind": "ledger_deleted", "ledger_id": 7, "payload": {"last_mzxid": 3, "inferred": False}},
    )
    report = sink.process(batch, 0)
    assert (report.dead_letters, report.ledgers_written, report.probe_outcomes) == ({"kafka": 2}, 1, {})
    assert sample(metrics, "bkaudit_stream_dead_letters_total", source="kafka") == 2
    assert sample(metrics, "bkaudit_stream_ledgers_written_total") == 1
    assert sample(metrics, "bkaudit_stream_sink_duration_seconds_count") == 1

    replay = sink.process(batch, 0)  # Spark re-runs a batch whose commit was lost
    assert replay.skipped_replay_tables > 0
    assert read_table(tmp_path, "dead_letters").num_rows == 2  # the table holds the batch once ...
    assert sample(metrics, "bkaudit_stream_dead_letters_total", source="kafka") == 4  # ... the counter twice
    assert sample(metrics, "bkaudit_stream_ledgers_written_total") == 2
    assert sample(metrics, "bkaudit_stream_sink_duration_seconds_count") == 2
