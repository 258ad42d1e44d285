"""`bkaudit alerts tail` against the real broker: the newest transitions of the alerts topic, filtered by
kind, as lines or as the published JSON; a record that is not an alert is reported, never dropped."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import pytest

from bkaudit.testing.kafka_io import produce
from connectors.kafka.alert_tail import AlertTail
from connectors.kafka.topics import ensure_topic
from core.domain.alerts import Alert, AlertKind

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000


def transitions() -> list[Alert]:
    """A bookie lost, two of its ledgers under-replicated, then the bookie back (resolved)."""
    lost = Alert.bookie(
        cluster="c1", kind=AlertKind.BOOKIE_LOST, bookie_id="b1:3181", started_at_ms=T0, detected_at_ms=T0
    )
    ledgers = [
        Alert.ledger(
            cluster="c1",
            kind=AlertKind.LEDGER_UNDER_REPLICATED,
            ledger_id=ledger_id,
            bookies=["b1:3181"],
            started_at_ms=T0 + ledger_id,
            detected_at_ms=T0 + 10,
        )
        for ledger_id in (1, 2)
    ]
    return [lost, *ledgers, lost.resolved(at_ms=T0 + 20)]


@pytest.fixture
def alerts_kafka(kafka_settings, monkeypatch, bk_services) -> Any:
    """An alerts topic of two partitions holding the transitions on partition 0, in order, and a record
    that is not JSON on partition 1; the CLI's settings point at it."""
    kafka = kafka_settings.model_copy(
        update={"alerts_topic": bk_services.unique_topic("bkaudit.alerts.tail")}
    )
    ensure_topic(kafka, kafka.alerts_topic, partitions=2)
    records = [(b"k", alert.to_bytes(), 0) for alert in transitions()] + [(b"x", b"\xffnot json", 1)]
    produce(kafka, kafka.alerts_topic, records)
    for name in list(os.environ):
        if name.startswith("BKAUDIT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("BKAUDIT_KAFKA__BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    monkeypatch.setenv("BKAUDIT_KAFKA__ALERTS_TOPIC", kafka.alerts_topic)
    return kafka


def test_the_newest_transitions_print_as_the_published_json(cli, alerts_kafka):
    result = cli("alerts", "tail", "--last", "2", "--format", "json")
    assert result.exit_code == 0, result.stderr
    printed = [json.loads(line) for line in result.text.splitlines()]
    assert printed == [a.to_json() for a in transitions()[-2:]]
    # The record that is no alert is named on stderr (where it is and why), not counted among the two.
    assert "partition 1 offset 0: not JSON" in result.stderr


def test_a_kind_filter_and_the_line_format(cli, alerts_kafka):
    result = cli("alerts", "tail", "--kind", "BOOKIE_LOST")
    assert result.exit_code == 0, result.stderr
    lines = result.text.splitlines()
    assert [line.split()[1:4] for line in lines] == [
        ["firing", "warning", "BOOKIE_LOST"],
        ["resolved", "warning", "BOOKIE_LOST"],
    ]
    assert all("bookies b1:3181" in line for line in lines)


def test_an_unknown_kind_or_topic_is_one_line(cli, alerts_kafka, monkeypatch, bk_services):
    typo = cli("alerts", "tail", "--kind", "BOOKIE_LOSTT")
    assert typo.exit_code == 2 and typo.stderr.count("\n") == 1 and "no such alert kind" in typo.stderr
    monkeypatch.setenv("BKAUDIT_KAFKA__ALERTS_TOPIC", bk_services.unique_topic("bkaudit.alerts.none"))
    absent = cli("alerts", "tail")
    assert absent.exit_code == 2 and absent.stderr.count("\n") == 1, absent.stderr
    assert "does not exist" in absent.stderr


def test_following_returns_each_new_transition_as_it_arrives(alerts_kafka):
    with AlertTail(alerts_kafka, last=0) as reader:
        assert reader.backlog() == []  # --last 0: nothing of the history
        later = Alert.bookie(
            cluster="c1", kind=AlertKind.BOOKIE_LOST, bookie_id="b9:3181", started_at_ms=T0, detected_at_ms=T0
        )
        sender = threading.Timer(
            1.0, produce, (alerts_kafka, alerts_kafka.alerts_topic, [(b"k", later.to_bytes(), 1)])
        )
        sender.start()
        deadline = time.monotonic() + 60
        followed = next(reader.follow(lambda: time.monotonic() > deadline))
        sender.join()
    assert followed.alert == later.to_json() and followed.partition == 1
