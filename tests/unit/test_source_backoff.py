"""The Kafka source's broker back-off and its status file (pure code: a fake clock, no broker)."""

from __future__ import annotations

import json

import pytest

from connectors.kafka.client_config import KafkaTimeout
from connectors.kafka.planner import (
    BACKOFF_MAX_S,
    SourceStatus,
    SourceStatusCollector,
    record_fingerprint,
    with_backoff,
)
from core.errors import ServiceError
from streaming.job import query_failure


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def hung_broker(fake: FakeTime, request_timeout_s: float):
    def call():
        fake.now += request_timeout_s  # the client blocks for its request timeout, then raises
        raise KafkaTimeout("Failed to get watermark offsets")

    return call


def test_backoff_doubles_up_to_its_cap_and_stops_with_one_line_past_the_limit(tmp_path):
    fake = FakeTime()
    status = SourceStatus(str(tmp_path / "status.json"))
    with pytest.raises(ServiceError) as raised:
        with_backoff(
            "reading the latest offsets",
            hung_broker(fake, 1.0),
            limit_s=200,
            servers="k1:9092",
            status=status,
            sleep=fake.sleep,
            clock=fake.clock,
        )
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("bkaudit_kafka: Kafka at k1:9092 failed reading the latest offsets for ")
    assert "stream.broker_outage_limit_s (200 s)" in message
    assert fake.sleeps[:4] == [0.5, 1.0, 2.0, 4.0]
    assert max(fake.sleeps) == BACKOFF_MAX_S
    assert 200 <= fake.now < 200 + 1.0 + BACKOFF_MAX_S
    data = json.loads((tmp_path / "status.json").read_text())
    assert data["retries"] == len(fake.sleeps) and data["unavailable_since"] is not None


def test_a_broker_back_within_the_limit_clears_the_outage(tmp_path):
    fake = FakeTime()
    status = SourceStatus(str(tmp_path / "status.json"))
    answers = iter([KafkaTimeout("hung"), KafkaTimeout("hung"), {"t": {"0": 7}}])

    def call():
        fake.now += 30.0
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    result = with_backoff(
        "reading the latest offsets",
        call,
        limit_s=600,
        servers="k1:9092",
        status=status,
        sleep=fake.sleep,
        clock=fake.clock,
    )
    assert result == {"t": {"0": 7}}
    samples = {
        s.name: s.value for m in SourceStatusCollector(tmp_path / "status.json").collect() for s in m.samples
    }
    assert samples["bkaudit_stream_broker_unavailable_seconds"] == 0
    assert samples["bkaudit_stream_broker_retries_total"] == 2


def test_resets_are_counted_by_topic_across_restarts_of_the_planning(tmp_path):
    path = tmp_path / "status.json"
    SourceStatus(str(path)).reset("bkaudit.changes", "partition 0 ends at offset 2, before our position 23")
    SourceStatus(str(path)).reset("bkaudit.changes", "again")  # a new planning process keeps the count
    resets = next(
        m for m in SourceStatusCollector(path).collect() if m.name == "bkaudit_stream_source_resets"
    )
    assert [(s.labels, s.value) for s in resets.samples] == [({"topic": "bkaudit.changes"}, 2.0)]


def test_fingerprints_tell_records_at_the_same_offset_apart():
    same = record_fingerprint(41, 1_700_000_000_000, b"ledger/1", b"v1")
    assert same == record_fingerprint(41, 1_700_000_000_000, b"ledger/1", b"v1")
    assert same != record_fingerprint(41, 1_700_000_000_001, b"ledger/1", b"v1")  # another time
    assert same != record_fingerprint(41, 1_700_000_000_000, b"ledger/1", b"v2")  # other bytes
    assert same != record_fingerprint(41, 1_700_000_000_000, b"ledger/1v", b"1")  # key/value boundary


def test_a_query_failed_by_the_source_becomes_its_one_line():
    text = (
        "[STREAM_FAILED] Query terminated with exception: [PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] "
        "Failed when Python streaming data source perform latestOffset: Traceback (most recent call last):\n"
        '  File "spark_source.py", line 272, in latestOffset\n'
        "core.errors.ServiceError: bkaudit_kafka: Kafka at k1:9092 failed reading the latest offsets "
        "for 601 s, longer than stream.broker_outage_limit_s (600 s): _TRANSPORT: Failed to get metadata\n"
        " SQLSTATE: 38000"
    )
    failure = query_failure(text)
    assert isinstance(failure, ServiceError)
    assert str(failure) == (
        "bkaudit_kafka: Kafka at k1:9092 failed reading the latest offsets for 601 s, longer than "
        "stream.broker_outage_limit_s (600 s): _TRANSPORT: Failed to get metadata"
    )
    assert isinstance(query_failure("java.lang.OutOfMemoryError: Java heap space"), RuntimeError)


def test_a_refused_client_configuration_is_not_retried():
    from confluent_kafka import KafkaError, KafkaException

    from core.errors import ConfigError

    fake = FakeTime()

    def call():
        raise KafkaException(KafkaError(KafkaError._INVALID_ARG, 'No such configuration property: "x.y"'))

    with pytest.raises(ConfigError, match=r"kafka\.extra_config"):
        with_backoff("connecting", call, limit_s=600, servers="k1:9092", sleep=fake.sleep, clock=fake.clock)
    assert fake.sleeps == []  # waiting would not change librdkafka's answer
