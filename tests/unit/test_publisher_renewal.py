"""A producer that stopped delivering (librdkafka keeps a deleted topic's leader epochs and never delivers to
the re-created one) is replaced on the publishing thread when the watcher asks: its records are failed
without raising the publisher's failure flag (the full snapshot that asked republishes them), and every
back-pressure permit they held comes back, so a publish blocked behind them goes on."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError

from connectors.kafka import publisher as publisher_module
from connectors.kafka.publisher import ChangePublisher
from core import events
from core.settings import KafkaSettings


class StalledProducer:
    """Accepts every record and delivers none, until purged (then each fails as librdkafka reports it)."""

    def __init__(self, _config: dict[str, Any]) -> None:
        self.queued: list[tuple[bytes, Any]] = []
        self.purged = False

    def produce(self, topic: str, *, value: bytes, key: bytes, partition: int, on_delivery: Any) -> None:
        self.queued.append((value, on_delivery))

    def poll(self, timeout: float = -1) -> int:
        time.sleep(min(max(timeout, 0.0), 0.05))
        return 0

    def purge(self, *_args: Any, **_kwargs: Any) -> None:
        self.purged = True

    def flush(self, timeout: float = -1) -> int:
        if self.purged:
            queued, self.queued = self.queued, []
            for _value, report in queued:
                report(KafkaError(KafkaError._PURGE_QUEUE), None)
        return len(self.queued)

    def __len__(self) -> int:
        return len(self.queued)


def event(ledger_id: int) -> Any:
    return events.EventBuilder("c", "r", clock_ms=lambda: 5).build(events.ledger_deleted(ledger_id))


class Producers(list[StalledProducer]):
    """The producer factory a publisher is given, keeping every producer it made."""

    def __call__(self, config: dict[str, Any]) -> StalledProducer:
        self.append(StalledProducer(config))
        return self[-1]


@pytest.fixture
def producers(monkeypatch) -> Producers:
    monkeypatch.setattr(publisher_module, "ensure_topic", lambda *_args, **_kwargs: 4)  # no broker
    return Producers()


@pytest.mark.parametrize("held", [True, False], ids=["held-tails", "straight"])
def test_a_publish_blocked_behind_a_stalled_producer_goes_on_once_it_is_replaced(producers, held):
    settings = KafkaSettings() if held else KafkaSettings(producer_batch_size=0)  # 0: nothing held
    publisher = ChangePublisher(settings, "t", max_unacked=3, producer_factory=producers)
    publisher.start()
    try:
        for ledger_id in range(3):
            publisher.publish(event(ledger_id))
        assert publisher.holding == held and len(producers[0]) == (0 if held else 3)
        blocked = threading.Thread(target=publisher.publish, args=(event(99),), daemon=True)
        blocked.start()
        blocked.join(1.5)
        assert blocked.is_alive(), "every permit is held by a record the stalled producer never reports"

        publisher.renew_producer_soon()
        blocked.join(10)
        assert not blocked.is_alive()
        assert len(producers) == 2 and publisher.producers_replaced == 1
        assert publisher.delivery_failures == 3 and publisher.unacked == 1
        assert not publisher.failed  # the snapshot that asked for the new producer republishes them
        for ledger_id in (100, 101):  # the permits came back: two more go without blocking
            publisher.publish(event(ledger_id))
        assert publisher.unacked == 3
    finally:
        publisher.abort()
        publisher.close(timeout_s=0.5)


def test_without_a_request_the_producer_is_kept(producers):
    publisher = ChangePublisher(KafkaSettings(), "t", producer_factory=producers)
    publisher.start()
    try:
        publisher.publish(event(1))
        publisher.publish(event(2))
        assert len(producers) == 1 and publisher.producers_replaced == 0
    finally:
        publisher.abort()
        publisher.close(timeout_s=0.5)


def test_stalled_for_counts_from_the_first_record_owed_and_restarts_at_each_report(producers):
    publisher = ChangePublisher(KafkaSettings(producer_batch_size=0), "t", producer_factory=producers)
    publisher.start()
    try:
        assert publisher.stalled_for() == 0.0  # nothing owed
        publisher.publish(event(1))
        time.sleep(0.3)
        assert publisher.stalled_for() >= 0.3
        publisher.note_progress()
        assert publisher.stalled_for() < 0.3
        _value, report = producers[0].queued.pop()
        report(KafkaError(KafkaError._MSG_TIMED_OUT), None)  # a report (here a failure) answers the debt
        assert publisher.unacked == 0 and publisher.stalled_for() == 0.0
    finally:
        publisher.abort()
        publisher.close(timeout_s=0.5)
