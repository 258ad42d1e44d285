"""`bkaudit alerts republish` against the real broker and a real Delta ``open_alerts`` table.

The table is written by the tables helper the sink uses (``BatchWriter.upsert``) from alerts built the way
the job builds them; the command must put on the alerts topic exactly what the job publishes for them: the
same key, partition and value bytes (so the same stable ``alert_id``), every one ``firing``, once per run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from bkaudit.testing.kafka_io import TopicTail
from connectors.delta.tables import OPEN_ALERTS, BatchWriter, ensure_tables
from connectors.kafka.publisher import partitions_for_keys
from core.domain.alert_book import alert_to_row
from core.domain.alerts import Alert, AlertKind, alert_bytes

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000
PARTITIONS = 3


def open_alerts() -> list[Alert]:
    """A lost bookie and its ledgers, a corrupt znode and a badly placed ledger, as the job builds them."""
    alerts = [
        Alert.bookie(
            cluster="c1",
            kind=AlertKind.BOOKIE_LOST,
            bookie_id="10.0.0.1:3181",
            started_at_ms=T0,
            detected_at_ms=T0 + 1,
            detail={"missing_since": "2023-11-14T22:13:20.000Z"},
        )
    ]
    for ledger_id in range(1, 8):
        alerts.append(
            Alert.ledger(
                cluster="c1",
                kind=AlertKind.LEDGER_UNDER_REPLICATED,
                ledger_id=ledger_id,
                bookies=["10.0.0.1:3181"],
                started_at_ms=T0 + ledger_id,
                detected_at_ms=T0 + 100,
                pulsar_topic="persistent://t/ns/é",  # non-ASCII kept as UTF-8, as the job does
                detail={"lost_bookies": ["10.0.0.1:3181"], "segments": [0]},
            )
        )
    alerts.append(
        Alert.ledger(
            cluster="c1",
            kind=AlertKind.METADATA_CORRUPT,
            ledger_id=41,
            started_at_ms=T0 + 5,
            detected_at_ms=T0 + 5,
            detail={"reason": "ledger metadata: truncated"},
        )
    )
    alerts.append(
        Alert.ledger(
            cluster="c1",
            kind=AlertKind.PLACEMENT_NOT_ADHERING,
            ledger_id=7,
            bookies=["b1", "b4"],
            started_at_ms=T0 + 9,
            detected_at_ms=T0 + 9,
        )
    )
    return alerts


def write_open_alerts(lakehouse: Path, alerts: list[Alert]) -> None:
    ensure_tables(lakehouse)
    rows = pa.Table.from_pylist([alert_to_row(a) for a in alerts], schema=OPEN_ALERTS.schema)
    assert BatchWriter(lakehouse, app_id="republish-test", batch_id=0).upsert("open_alerts", rows)


def records_on(kafka: Any, expected: int, settle_s: float = 3.0) -> list[tuple[int, bytes, bytes]]:
    """Every (partition, key, value) on the alerts topic, waiting for ``expected`` and then a little more."""
    tail = TopicTail(kafka, kafka.alerts_topic)
    try:
        found: list[tuple[int, bytes, bytes]] = []
        deadline = time.monotonic() + 60
        settled: float | None = None
        while time.monotonic() < deadline:
            found.extend((r.partition, r.key, r.value) for r in tail.poll())
            if len(found) >= expected:
                settled = settled or time.monotonic() + settle_s  # anything extra would show up now
                if time.monotonic() > settled:
                    break
        return found
    finally:
        tail.close()


def test_republish_sends_every_open_alert_as_the_job_publishes_it(
    cli, monkeypatch, kafka_settings, lakehouse
):
    for name in list(os.environ):
        if name.startswith("BKAUDIT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("BKAUDIT_KAFKA__BOOTSTRAP_SERVERS", kafka_settings.bootstrap_servers)
    monkeypatch.setenv("BKAUDIT_KAFKA__ALERTS_TOPIC", kafka_settings.alerts_topic)
    monkeypatch.setenv("BKAUDIT_KAFKA__TOPIC_PARTITIONS", str(PARTITIONS))
    alerts = open_alerts()
    write_open_alerts(lakehouse, alerts)

    dry = cli("alerts", "republish", "--dry-run", "--lakehouse", str(lakehouse), "--format", "json")
    assert dry.exit_code == 0, dry.stderr
    assert dry.json() == {
        "topic": kafka_settings.alerts_topic,
        "dry_run": True,
        "sent": 0,
        "open_alerts": 10,
        "by_kind": {
            "BOOKIE_LOST": 1,
            "LEDGER_UNDER_REPLICATED": 7,
            "METADATA_CORRUPT": 1,
            "PLACEMENT_NOT_ADHERING": 1,
        },
    }

    done = cli("alerts", "republish", "--lakehouse", str(lakehouse))  # the table format, as an SRE runs it
    assert done.exit_code == 0, done.stderr
    assert done.text.splitlines()[-1] == f"sent 10 open alerts to {kafka_settings.alerts_topic}"
    assert "LEDGER_UNDER_REPLICATED       7" in done.text

    keys = [a.kafka_key().encode() for a in alerts]
    expected = sorted(
        zip(
            partitions_for_keys(keys, PARTITIONS),  # the job's partition rule
            keys,
            [alert_bytes(a.to_json()) for a in alerts],  # the job's encoder: same bytes, same alert_id
            strict=True,
        )
    )
    found = records_on(kafka_settings, len(expected))
    assert sorted(found) == expected  # nothing from the dry run, each alert once
    assert {b'"state":"firing"' in value for _, _, value in found} == {True}


def test_republish_without_an_open_alerts_table(cli, tmp_path):
    result = cli("alerts", "republish", "--lakehouse", str(tmp_path / "nowhere"))
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"bkaudit: no open_alerts table at {tmp_path}/nowhere/open_alerts")


def test_republish_with_kafka_unreachable(cli, monkeypatch, lakehouse):
    monkeypatch.setenv("BKAUDIT_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.setenv("BKAUDIT_KAFKA__BOOTSTRAP_TIMEOUT_MS", "1000")
    write_open_alerts(lakehouse, open_alerts()[:1])
    result = cli("alerts", "republish", "--lakehouse", str(lakehouse))
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1].startswith("bkaudit: Kafka at 127.0.0.1:1: creating topic")
