"""TailSender: batched sends whose last record per partition goes out alone, after a flush.

The producer here is a recorder of calls (the sender's logic is pure bookkeeping around it); the effect on a
real broker's high watermark is tested in tests/integration/test_services.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from kafka.errors import KafkaTimeoutError

from connectors.kafka.tail_sender import TailSender


class _Future:
    def __init__(self) -> None:
        self.callbacks: list[Any] = []
        self.errbacks: list[Any] = []

    def add_callback(self, fn: Any) -> None:
        self.callbacks.append(fn)

    def add_errback(self, fn: Any) -> None:
        self.errbacks.append(fn)


class _Recorder:
    """Records sends and flushes in order; can be told to fail the next send or flush."""

    def __init__(self) -> None:
        self.log: list[Any] = []
        self.futures: list[_Future] = []
        self.fail_sends = 0
        self.fail_flushes = 0

    def send(self, topic: str, *, key: bytes | None, value: bytes, partition: int) -> _Future:
        if self.fail_sends:
            self.fail_sends -= 1
            raise KafkaTimeoutError("buffer full")
        self.log.append((topic, partition, value))
        future = _Future()
        self.futures.append(future)
        return future

    def flush(self, timeout: float | None = None) -> None:
        if self.fail_flushes:
            self.fail_flushes -= 1
            raise KafkaTimeoutError("Timeout waiting for future")
        self.log.append("flush")


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
    sender.send("t", key=None, value=b"a", partition=0, on_success=acked.append, on_error=acked.append)
    sender.send("t", key=None, value=b"b", partition=0)
    assert len(producer.futures) == 1 and producer.futures[0].callbacks == [acked.append]
    sender.release()
    assert producer.futures[1].callbacks == [] and producer.futures[1].errbacks == []


def _holding_a() -> tuple[_Recorder, TailSender]:
    producer = _Recorder()
    sender = TailSender(producer, hold_tails=True)
    sender.send("t", key=None, value=b"a", partition=0)
    return producer, sender


def test_a_refused_send_loses_neither_the_held_record_nor_the_new_one():
    producer, sender = _holding_a()
    producer.fail_sends = 1
    with pytest.raises(KafkaTimeoutError):
        sender.send("t", key=None, value=b"b", partition=0)
    # "a" is still held; the caller retries "b".
    sender.send("t", key=None, value=b"b", partition=0)
    sender.flush()
    assert _sends(producer.log) == [("t", 0, b"a"), ("t", 0, b"b")]


def test_a_flush_timeout_keeps_the_tails_for_the_next_release():
    producer, sender = _holding_a()
    producer.fail_flushes = 1
    with pytest.raises(KafkaTimeoutError):
        sender.release(timeout_s=0.1)
    assert sender.holding == 1 and producer.log == []
    sender.release()
    assert producer.log == ["flush", ("t", 0, b"a")]


def test_a_send_failing_during_release_keeps_the_unsent_tails():
    producer = _Recorder()
    sender = TailSender(producer, hold_tails=True)
    for partition in range(3):
        sender.send("t", key=None, value=b"p%d" % partition, partition=partition)
    producer.fail_sends = 0
    original_send = producer.send
    calls = {"n": 0}

    def send_failing_second(*args: Any, **kwargs: Any) -> _Future:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KafkaTimeoutError("buffer full")
        return original_send(*args, **kwargs)

    producer.send = send_failing_second  # type: ignore[method-assign]
    with pytest.raises(KafkaTimeoutError):
        sender.release()
    assert sender.holding == 2
    sender.release()
    assert sorted(_sends(producer.log)) == [("t", 0, b"p0"), ("t", 1, b"p1"), ("t", 2, b"p2")]


def test_release_with_nothing_held_does_not_flush():
    producer = _Recorder()
    TailSender(producer, hold_tails=True).release()
    assert producer.log == []
