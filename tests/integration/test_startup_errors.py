"""`bkaudit watch` against a real ZooKeeper with Kafka unreachable: exit 2 and one line, no traceback.

The unit tests (tests/unit/test_startup_errors.py) stand in for ZooKeeper in this case; here the watcher
really connects, reads the cluster and only then fails on Kafka, so the order and the clean-up are real too.
"""

from __future__ import annotations

import os
import time

import pytest

pytestmark = pytest.mark.integration

KAFKA_PASSWORD = "kafka-pw-31e9"


def test_watch_with_a_real_zookeeper_and_kafka_unreachable(cli, monkeypatch, bk_services, zk_chroot):
    for name in list(os.environ):
        if name.startswith("BKAUDIT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("BKAUDIT_CLUSTER", "it-cluster")  # a fresh chroot has no INSTANCEID
    monkeypatch.setenv("BKAUDIT_KAFKA__BOOTSTRAP_TIMEOUT_MS", "1000")
    monkeypatch.setenv("BKAUDIT_KAFKA__SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("BKAUDIT_KAFKA__SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("BKAUDIT_KAFKA__SASL_USERNAME", "bkaudit")  # PLAIN needs both (librdkafka checks)
    monkeypatch.setenv("BKAUDIT_KAFKA__SASL_PASSWORD", KAFKA_PASSWORD)
    monkeypatch.setenv("BKAUDIT_WATCHER__PROGRESS", "off")
    started = time.monotonic()
    result = cli("watch", "--zookeeper", bk_services.zookeeper_hosts(zk_chroot), "--bootstrap", "127.0.0.1:1")
    assert time.monotonic() - started < 15
    assert result.exit_code == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("bkaudit: Kafka at 127.0.0.1:1: creating topic 'bkaudit.changes' failed")
    assert "Traceback" not in result.stderr and KAFKA_PASSWORD not in result.stderr
