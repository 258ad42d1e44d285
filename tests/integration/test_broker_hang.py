"""A hung broker under a running job: ride it out with back-off, or stop with one line and exit 2.

The broker is frozen for real (SIGSTOP of the embedded broker's process: connections stay open and nothing
answers, as with a hung or partitioned broker), then thawed with SIGCONT. The Kafka client gives up on a
request after ``kafka.request_timeout_ms`` (30 s by default); the job used to die with it (exit 1, and a
restart loop under systemd). Now the source's planning retries with back-off for up to
``stream.broker_outage_limit_s``, and only past that limit does the job stop, with one line and exit 2.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from connectors.delta.tables import read_table
from connectors.kafka.topics import ensure_topic
from core.settings import Settings
from streaming import job
from tests.integration.event_fixtures import Watcher, alerts_on

pytestmark = [pytest.mark.integration, pytest.mark.chaos]  # also part of `pytest -m chaos`

BOOKIES = [f"10.0.3.{i}:3181" for i in range(1, 7)]
RACKS = {b: f"/rack{i % 3}" for i, b in enumerate(BOOKIES)}
LOST = BOOKIES[0]
REQUEST_TIMEOUT_MS = 5_000  # the client gives up on a request after this (30 s by default)
HANG_S = 3 * REQUEST_TIMEOUT_MS / 1000  # where the job used to die: well past one request's timeout


def ring(first: int) -> list[str]:
    return [BOOKIES[(first + k) % len(BOOKIES)] for k in range(3)]


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def ledger_rows(lakehouse: Path) -> int:
    try:
        return read_table(lakehouse, "ledgers").num_rows
    except Exception:  # not created yet
        return 0


@contextlib.contextmanager
def frozen(bk_services, seconds: float) -> Iterator[None]:
    """The broker stopped (SIGSTOP) for ``seconds``, then continued, whatever happens in between."""
    pid = bk_services.cluster.broker.pid()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


def publish_healthy_cluster(kafka, clock_start_ms: int) -> Watcher:
    clock = iter(range(clock_start_ms, clock_start_ms + 10**9, 10))
    watcher = Watcher(kafka, lambda: next(clock))
    watcher.rack_map(RACKS)
    for bookie in BOOKIES:
        watcher.bookie(bookie, "WRITABLE")
    for ledger_id in range(1, 7):
        watcher.ledger(ledger_id, ring(ledger_id))
    watcher.heartbeat(clock_start_ms + 100_000, 2)
    watcher.flush()
    return watcher


def test_a_broker_hang_longer_than_the_request_timeout_is_ridden_out(
    spark, bk_services, kafka_settings, tmp_path
):
    """The job rides out the hang and counts it in the broker metrics (the ledger lane's tailing consumer
    reports the broker it lost); once the broker answers again, no outage is left open."""
    kafka = kafka_settings.model_copy(
        update={"topic_partitions": 2, "request_timeout_ms": REQUEST_TIMEOUT_MS}
    )
    settings = Settings(
        kafka=kafka,
        lakehouse_root=tmp_path / "lh",
        checkpoint_root=tmp_path / "cp",
        stream={"watermark_delay_s": 0.5, "default_recovery_delay_s": 0},
    )
    ensure_topic(kafka, kafka.changes_topic, partitions=2)
    t0 = int(time.time() * 1000) - 600_000
    watcher = publish_healthy_cluster(kafka, t0)
    query, sink = job.start(spark, settings)
    try:
        wait_until(lambda: ledger_rows(settings.lakehouse_root) == 6, 240, "the first batch")
        with frozen(bk_services, HANG_S):
            pass
        assert query.isActive and query.exception() is None, query.exception()
        # Events after the hang are processed: the bookie loss raises its alerts.
        watcher.bookie(LOST, "GONE")
        watcher.heartbeat(t0 + 200_000, 2)
        watcher.close()
        expected = {("BOOKIE_LOST", None)} | {
            ("LEDGER_UNDER_REPLICATED", i) for i in range(1, 7) if LOST in ring(i)
        }
        wait_until(
            lambda: {(a["kind"], a["ledger_id"]) for _, a in alerts_on(kafka, 5)} >= expected,
            240,
            "the bookie loss's alerts after the hang",
        )
        retries = sink.metrics.registry.get_sample_value("bkaudit_stream_broker_retries_total")
        assert retries is not None and retries >= 1
        assert sink.metrics.registry.get_sample_value("bkaudit_stream_broker_unavailable_seconds") == 0
    finally:
        job.stop_gracefully(query, sink)
        sink.close()


def test_a_hang_past_the_outage_limit_stops_the_job_with_one_line_and_exit_2(
    cli, monkeypatch, spark, bk_services, kafka_settings, tmp_path
):
    kafka = kafka_settings.model_copy(update={"topic_partitions": 2})
    ensure_topic(kafka, kafka.changes_topic, partitions=2)
    publish_healthy_cluster(kafka, int(time.time() * 1000) - 600_000).close()
    for name in list(os.environ):
        if name.startswith("BKAUDIT_"):
            monkeypatch.delenv(name)
    env = {
        "KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "KAFKA__CHANGES_TOPIC": kafka.changes_topic,
        "KAFKA__FEEDBACK_TOPIC": kafka.feedback_topic,
        "KAFKA__ALERTS_TOPIC": kafka.alerts_topic,
        "KAFKA__TOPIC_PARTITIONS": "2",
        "KAFKA__REQUEST_TIMEOUT_MS": "2000",
        "STREAM__BROKER_OUTAGE_LIMIT_S": "5",
        "STREAM__WATERMARK_DELAY_S": "0.5",
        "LAKEHOUSE_ROOT": str(tmp_path / "lh"),
        "CHECKPOINT_ROOT": str(tmp_path / "cp"),
        # The suite's Spark session is reused; these keep its configuration as it was.
        "SPARK__MASTER": os.environ.get("BKAUDIT_TEST_SPARK_MASTER", "local[2]"),
        "SPARK__SHUFFLE_PARTITIONS": "2",
        "SPARK__UI_ENABLED": "false",
    }
    for name, value in env.items():
        monkeypatch.setenv(f"BKAUDIT_{name}", value)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def freeze_after_the_first_batch() -> None:
        with contextlib.suppress(AssertionError):
            wait_until(lambda: ledger_rows(tmp_path / "lh") == 6, 240, "the first batch")
            with frozen(bk_services, 20):  # past the 5 s limit, short of the old 30 s
                pass
            # The old job rode a 20 s hang out by accident and would run forever: stop it so the test ends.
            wait_until(lambda: not spark.streams.active, 60, "the job to stop")
        for query in spark.streams.active:
            query.stop()

    freezer = threading.Thread(target=freeze_after_the_first_batch, daemon=True)
    freezer.start()
    try:
        result = cli("stream")
    finally:
        freezer.join(120)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("bkaudit: bkaudit_kafka: Kafka at "), result.stderr
    assert "stream.broker_outage_limit_s (5 s)" in result.stderr
    assert "Traceback" not in result.stderr
    # A job run by a caller in the same process leaves the caller's Spark session as it found it.
    assert spark.range(3).count() == 3
