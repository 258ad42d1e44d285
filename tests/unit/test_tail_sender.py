"""TailSender: batched sends whose last record per partition goes out alone, after a flush.

The producer here is a recorder of calls (the sender's logic is pure bookkeeping around it); the effect on a
real broker's high watermark is tested in tests/integration/test_services.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from connectors.kafka.client_config import KafkaTimeout
from connectors.kafka.tail_sender import TailSender, send_records


class _Recorder:
    """Records produces and flushes in order (a confluent_kafka.Producer's calls); can be told to refuse
    the next produce (a full queue) or leave the next flush unfinished."""

    def __init__(self) -> None:
        self.log: list[Any] = []
        self.reports: list[Any] = []  # each produced record's on_delivery
        self.fail_sends = 0
        self.fail_flushes = 0
        self.polls = 0

    def produce(
        self, topic: str, *, value: bytes, key: bytes | None, partition: int, on_delivery: Any
    ) -> None:
        if self.fail_sends:
            self.fail_sends -= 1
            raise BufferError("Local: Queue full")
        self.log.append((topic, partition, value))
        self.reports.append(on_delivery)

    def poll(self, timeout: float = -1) -> int:
        self.polls += 1
        return 0

    def flush(self, timeout: float = -1) -> int:
        if self.fail_flushes:
            self.fail_flushes -= 1
            return 1  # one record still unacknowledged when the timeout ran out
        self.log.append("flush")
        return 0


def _sends(log: list[Any]) -> list[Any]:
    return [entry for entry in log if entry != "flush"]


def test_the_newest_record_of_each_partition_waits_and_is_sent_after_a_flush():
    producer = _Recorder()
    sender = TailSender(producer, hold_tails=True)
    for i in range(3):
        sender.send("t", key=b"k", value=b"p0-%d" % i, partition=0)
        sender.send("t", key=b"k", value=b"p1-%d" % i, partition=1)
    assert sender.holding == 2
    first_two_rounds = [("t", 0, b"p0-0"), ("t", 1, b"p1-0"), ("t", 0, b"p0-1"), ("t", 1, b"p1-1")]
    assert _sends(producer.log) == first_two_rounds
    sender.release()
    assert sender.holding == 0
    # The flush comes first, so nothing is pending when the tails go out: each is a batch of its own.
    assert producer.log[4:] == ["flush", ("t", 0, b"p0-2"), ("t", 1, b"p1-2")]


def test_per_partition_order_is_the_order_of_the_sends():
    producer = _Recorder()
    sender = TailSender(producer, hold_tails=True)
    sent = [(i % 3, b"v%d" % i) for i in range(30)]
    for partition, value in sent:
        sender.send("t", key=None, value=value, partition=partition)
        if value.endswith(b"7"):
            sender.release()
    sender.flush()
    for partition in range(3):
        received = [v for _, p, v in _sends(producer.log) if p == partition]
        assert received == [v for p, v in sent if p == partition]


def test_topics_hold_separately():
    producer = _Recorder()
    sender = TailSender(producer, hold_tails=True)
    sender.send("alerts", key=None, value=b"a", partition=0)
    sender.send("feedback", key=None, value=b"f", partition=0)
    assert sender.holding == 2 and producer.log == []


def test_without_holding_every_record_goes_straight_out():
    producer = _Recorder()
    sender = TailSender(producer, hold_tails=False)
    sender.send("t", key=None, value=b"a", partition=0)
    sender.send("t", key=None, value=b"b", partition=0)
    assert sender.holding == 0
    assert producer.log == [("t", 0, b"a"), ("t", 0, b"b")]


def test_callbacks_are_attached_to_the_record_they_belong_to():
    producer = _Recorder()
    sender = TailSender(producer, hold_tails=True)
    acked: list[Any] = []
    failed: list[Any] = []
    sender.send("t", key=None, value=b"a", partition=0, on_success=acked.append, on_error=failed.append)
    sender.send("t", key=None, value=b"b", partition=0)
    assert len(producer.reports) == 1
    producer.reports[0](None, "message a")  # librdkafka's delivery report: (error, message)
    assert acked == ["message a"] and failed == []
    sender.release()
    producer.reports[1](None, "message b")  # b has no callbacks: nothing to call
    assert acked == ["message a"]


def test_a_failed_delivery_reaches_the_error_callback_as_a_kafka_exception():
    from confluent_kafka import KafkaError, KafkaException

    producer = _Recorder()
    failed: list[BaseException] = []
    TailSender(producer, hold_tails=False).send(
        "t", key=None, value=b"a", partition=0, on_error=failed.append
    )
    producer.reports[0](KafkaError(KafkaError._MSG_TIMED_OUT), None)
    assert isinstance(failed[0], KafkaException)
    assert failed[0].args[0].code() == KafkaError._MSG_TIMED_OUT


def test_a_full_queue_is_waited_out_not_dropped():
    producer = _Recorder()
    sender = TailSender(producer, hold_tails=False)
    producer.fail_sends = 3
    sender.send("t", key=None, value=b"a", partition=0)
    assert producer.log == [("t", 0, b"a")] and producer.polls == 3  # delivery reports served meanwhile


def test_send_records_counts_the_failures_and_names_the_first():
    from confluent_kafka import KafkaError

    from core.settings import KafkaSettings

    class Failing(_Recorder):
        def flush(self, timeout: float = -1) -> int:
            for report in self.reports:
                report(KafkaError(KafkaError._MSG_TIMED_OUT, "Message timed out"), None)
            self.reports = []
            return super().flush(timeout)

    failed, first = send_records(Failing(), KafkaSettings(), [("t", 0, b"k", b"v"), ("t", 1, b"k", b"w")])
    assert (failed, first) == (2, "_MSG_TIMED_OUT: Message timed out")


def _holding_a() -> tuple[_Recorder, TailSender]:
    producer = _Recorder()
    sender = TailSender(producer, hold_tails=True)
    sender.send("t", key=None, value=b"a", partition=0)
    return producer, sender


def test_a_refused_send_loses_neither_the_held_record_nor_the_new_one():
    producer, sender = _holding_a()
    sender.max_block_s = 0.0
    producer.fail_sends = 1
    with pytest.raises(KafkaTimeout):
        sender.send("t", key=None, value=b"b", partition=0)
    # "a" is still held; the caller retries "b".
    sender.send("t", key=None, value=b"b", partition=0)
    sender.flush()
    assert _sends(producer.log) == [("t", 0, b"a"), ("t", 0, b"b")]


def test_a_flush_timeout_keeps_the_tails_for_the_next_release():
    producer, sender = _holding_a()
    producer.fail_flushes = 1
    with pytest.raises(KafkaTimeout):
        sender.release(timeout_s=0.1)
    assert sender.holding == 1 and producer.log == []
    sender.release()
    assert producer.log == ["flush", ("t", 0, b"a")]


def test_a_send_failing_during_release_keeps_the_unsent_tails():
    producer = _Recorder()
    sender = TailSender(producer, hold_tails=True)
    for partition in range(3):
        sender.send("t", key=None, value=b"p%d" % partition, partition=partition)
    original_produce = producer.produce
    calls = {"n": 0}

    def produce_failing_second(*args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KafkaTimeout("the producer's queue stayed full")
        original_produce(*args, **kwargs)

    producer.produce = produce_failing_second  # type: ignore[method-assign]
    with pytest.raises(KafkaTimeout):
        sender.release()
    assert sender.holding == 2
    sender.release()
    assert sorted(_sends(producer.log)) == [("t", 0, b"p0"), ("t", 1, b"p1"), ("t", 2, b"p2")]


def test_release_with_nothing_held_does_not_flush():
    producer = _Recorder()
    TailSender(producer, hold_tails=True).release()
    assert producer.log == []


class _ServedElsewhere(_Recorder):
    """A producer whose delivery reports another thread serves (``report_delay_s`` after each produce):
    polling or flushing here is a bug."""

    def __init__(self, refusals: int = 0, report_delay_s: float = 0.01) -> None:
        super().__init__()
        self.fail_sends = refusals
        self.report_delay_s = report_delay_s
        self.served: list[float] = []  # when each report ran (monotonic)

    def produce(
        self, topic: str, *, value: bytes, key: bytes | None, partition: int, on_delivery: Any
    ) -> None:
        super().produce(topic, value=value, key=key, partition=partition, on_delivery=on_delivery)

        def serve() -> None:
            on_delivery(None, None)
            self.served.append(time.monotonic())

        timer = threading.Timer(self.report_delay_s, serve)
        timer.daemon = True
        timer.start()

    def poll(self, timeout: float = -1) -> int:
        raise AssertionError("only the report thread may poll")

    def flush(self, timeout: float = -1) -> int:
        raise AssertionError("only the report thread may serve reports (flush polls)")


def test_a_sender_whose_reports_another_thread_serves_waits_for_the_queue_and_never_polls():
    producer = _ServedElsewhere(refusals=2)  # a full queue twice: wait, do not poll
    sender = TailSender(producer, hold_tails=True, reports_polled_elsewhere=True)
    for i in range(3):
        sender.send("t", key=b"k", value=b"v%d" % i, partition=0)
    sender.flush(timeout_s=5)
    assert _sends(producer.log) == [("t", 0, b"v0"), ("t", 0, b"v1"), ("t", 0, b"v2")]
    assert len(producer.served) == 3 and sender.holding == 0


def test_a_flush_returns_once_the_last_report_ran_on_the_other_thread():
    producer = _ServedElsewhere(report_delay_s=0.2)
    sender = TailSender(producer, hold_tails=False, reports_polled_elsewhere=True)
    sender.send("t", key=b"k", value=b"a", partition=0)
    sender.send("t", key=b"k", value=b"b", partition=1)
    sender.flush(timeout_s=5)
    returned = time.monotonic()
    assert len(producer.served) == 2  # not before the reports ran ...
    assert returned - max(producer.served) < 0.1  # ... and woken by the last, not by a timeout


def test_a_sender_whose_reports_another_thread_serves_times_out_while_records_stay_queued():
    sender = TailSender(_ServedElsewhere(report_delay_s=60), hold_tails=True, reports_polled_elsewhere=True)
    sender.send("t", key=b"k", value=b"a", partition=0)
    sender.send("t", key=b"k", value=b"b", partition=0)
    with pytest.raises(KafkaTimeout, match="unacknowledged"):
        sender.release(timeout_s=0.05)
    assert sender.holding == 1  # the held record is kept for the next release


def test_held_records_of_a_partition_go_out_together_and_the_newest_alone_after_a_flush():
    producer = _Recorder()
    sender = TailSender(producer, hold_tails=True, hold_records=3)
    for i in range(5):
        sender.send("t", key=b"k", value=b"p0-%d" % i, partition=0)
    sender.send("t", key=b"k", value=b"p1-0", partition=1)
    # The fourth record of partition 0 sent the three held before it, in order; two wait now.
    assert producer.log == [("t", 0, b"p0-0"), ("t", 0, b"p0-1"), ("t", 0, b"p0-2")]
    assert sender.holding == 3
    sender.release()
    assert producer.log[3:] == [("t", 0, b"p0-3"), "flush", ("t", 0, b"p0-4"), ("t", 1, b"p1-0")]
    assert sender.holding == 0


def test_a_failed_send_of_held_records_keeps_the_rest_held_in_order():
    producer = _Recorder()
    sender = TailSender(producer, hold_tails=True, hold_records=2, max_block_s=0.0)
    for i in range(2):
        sender.send("t", key=b"k", value=b"v%d" % i, partition=0)
    producer.fail_sends = 1
    with pytest.raises(KafkaTimeout):
        sender.send("t", key=b"k", value=b"v2", partition=0)
    assert sender.holding == 2  # nothing sent, nothing lost; the caller retries v2
    sender.send("t", key=b"k", value=b"v2", partition=0)
    sender.flush()
    assert _sends(producer.log) == [("t", 0, b"v0"), ("t", 0, b"v1"), ("t", 0, b"v2")]


def test_a_release_started_without_waiting_sends_the_tails_once_the_reports_ran() -> None:
    producer = _ServedElsewhere(report_delay_s=0.2)
    sender = TailSender(producer, hold_tails=True, reports_polled_elsewhere=True, hold_records=4)
    ready = threading.Event()
    sender.on_drained = ready.set
    for i in range(3):
        sender.send("t", key=b"k", value=b"a%d" % i, partition=0)
    sender.send("t", key=b"k", value=b"b0", partition=1)
    assert sender.start_release() is False  # a0, a1 in flight: the tails wait, the caller does not
    assert _sends(producer.log) == [("t", 0, b"a0"), ("t", 0, b"a1")]
    assert sender.finish_release() is False and sender.release_pending
    assert ready.wait(5)  # the report thread says when
    assert sender.finish_release() is True
    assert _sends(producer.log)[2:] == [("t", 0, b"a2"), ("t", 1, b"b0")]
    assert sender.holding == 0 and not sender.release_pending


def test_a_partition_that_got_records_during_a_started_release_keeps_holding_them() -> None:
    producer = _ServedElsewhere(report_delay_s=0.2)
    sender = TailSender(producer, hold_tails=True, reports_polled_elsewhere=True, hold_records=4)
    ready = threading.Event()
    sender.on_drained = ready.set
    sender.send("t", key=b"k", value=b"a0", partition=0)
    sender.send("t", key=b"k", value=b"a1", partition=0)
    sender.send("t", key=b"k", value=b"b0", partition=1)
    assert sender.start_release() is False
    sender.send("t", key=b"k", value=b"a2", partition=0)  # partition 0 now holds a1 and a2
    assert ready.wait(5) and sender.finish_release()
    # b0 went alone; a1 and a2 together would not end partition 0 with a one-record batch: still held.
    assert _sends(producer.log) == [("t", 0, b"a0"), ("t", 1, b"b0")]
    assert sender.holding == 2
    sender.flush(timeout_s=5)
    assert _sends(producer.log)[2:] == [("t", 0, b"a1"), ("t", 0, b"a2")]


def test_a_started_release_with_nothing_in_flight_finishes_at_once() -> None:
    producer = _ServedElsewhere()
    sender = TailSender(producer, hold_tails=True, reports_polled_elsewhere=True)
    sender.send("t", key=b"k", value=b"a0", partition=0)
    assert sender.start_release() is True
    assert _sends(producer.log) == [("t", 0, b"a0")] and sender.holding == 0


def test_the_jobs_producer_reports_only_failures_and_a_failed_record_still_fails_the_send():
    # The job's producer (alerts, feedback) has librdkafka report failed deliveries only: a delivery report
    # per acknowledged record cost a lost bookie's 31,000 alerts ~25 ms. A real librdkafka producer towards
    # an address where no broker listens: its record times out, and the send counts it.
    from confluent_kafka import Producer

    from connectors.kafka.client_config import failures_only_producer_config
    from core.settings import KafkaSettings

    settings = KafkaSettings(
        bootstrap_servers="127.0.0.1:1", producer_delivery_timeout_ms=300, request_timeout_ms=200
    )
    config = failures_only_producer_config(settings)
    assert config["delivery.report.only.error"] is True
    failed, first = send_records(Producer(config), settings, [("t", 0, b"k", b"v")])
    assert failed == 1 and first is not None and "timed out" in first.lower()
