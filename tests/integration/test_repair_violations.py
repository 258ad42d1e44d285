"""`bkaudit repair` rebuilds ``violations`` from the real alerts topic, and ``open_alerts`` from that.

The lakehouse and the topic are written by the job's own writers (``record_transitions``, ``publish``);
the topic also holds a batch published twice (a replay). After the tables are deleted, the repair gives
back the rows they held, except the two columns the topic does not carry (``batch_id``, ``started_at``).
"""

from __future__ import annotations

import os
import shutil

import pytest
from confluent_kafka import Producer

from connectors.kafka.client_config import producer_config
from streaming.publish import publish
from tests.unit.test_repair import APP, rows_of, starts, write_batches

pytestmark = pytest.mark.integration


def test_repair_rebuilds_violations_from_the_alerts_topic(cli, monkeypatch, kafka_settings, tmp_path):
    for name in list(os.environ):
        if name.startswith("BKAUDIT_"):
            monkeypatch.delenv(name)
    lakehouse = tmp_path / "lakehouse"
    monkeypatch.setenv("BKAUDIT_LAKEHOUSE_ROOT", str(lakehouse))
    monkeypatch.setenv("BKAUDIT_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("BKAUDIT_STREAM__APP_ID", APP)
    monkeypatch.setenv("BKAUDIT_KAFKA__BOOTSTRAP_SERVERS", kafka_settings.bootstrap_servers)
    monkeypatch.setenv("BKAUDIT_KAFKA__ALERTS_TOPIC", kafka_settings.alerts_topic)
    batches = write_batches(lakehouse)
    producer = Producer(producer_config(kafka_settings))
    for transitions in [*batches, batches[-1]]:  # the last batch twice, as a replay publishes it
        publish(producer, kafka_settings, transitions)
    producer.flush(30)
    not_on_topic = ("batch_id", "started_at")
    violations = rows_of(lakehouse, "violations", drop=not_on_topic)
    open_alerts = rows_of(lakehouse, "open_alerts")
    shutil.rmtree(lakehouse / "violations")
    shutil.rmtree(lakehouse / "open_alerts")

    done = cli("repair")
    assert done.exit_code == 0, done.stderr
    assert done.text.splitlines() == [
        "rebuilt violations from the alerts topic: 14 rows",
        "rebuilt open_alerts from violations: 8 rows",
    ]
    assert rows_of(lakehouse, "violations", drop=not_on_topic) == violations
    assert rows_of(lakehouse, "open_alerts") == open_alerts  # start times confirmed by the alert ids
    starts(lakehouse)
