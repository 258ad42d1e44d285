"""The job's Prometheus gauges from a StreamingQueryProgress (the JSON dict the listener receives)."""

from __future__ import annotations

import time

import pytest

from streaming.metrics import StreamMetrics

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


def sample(metrics: StreamMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name)


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
