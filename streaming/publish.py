"""Alert transitions and feedback records onto Kafka: the one send path of both lanes of the job.

Both lanes share one producer (:class:`streaming.sink.AuditSink` owns it), so alerts reach each partition in
the order the lanes decided them. Records get explicit partitions (Kafka's default rule for their keys) so
each partition's last record can be held back and sent alone: the embedded broker's high watermark is wrong
after a multi-record batch (:mod:`connectors.kafka.tail_sender`).

Example:
    >>> encoded_alerts([])
    ([], [])
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from core.domain.alerts import Alert, alert_bytes
from core.errors import ServiceError
from core.settings import KafkaSettings

logger = logging.getLogger(__name__)


def _compact_json(message: Mapping[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def encoded_alerts(alerts: Sequence[Alert]) -> tuple[list[dict[str, Any]], list[tuple[bytes, bytes]]]:
    """The alerts as published JSON objects, and as ``(key, value)`` records (one encoder for all)."""
    published = [alert.to_json() for alert in alerts]
    keyed = [
        (alert.kafka_key().encode(), alert_bytes(body)) for alert, body in zip(alerts, published, strict=True)
    ]
    return published, keyed


def publish(
    producer: Any,
    kafka: KafkaSettings,
    alerts: Sequence[Alert],
    feedback: Sequence[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Send alert transitions and feedback, wait for every acknowledgement; returns the alerts as published.

    Raises :class:`~core.errors.ServiceError` when a record is not delivered: the caller's batch fails
    and is replayed, and a replay publishes the same alert ids again.
    """
    if not alerts and not feedback:
        return []
    published, keyed_alerts = encoded_alerts(alerts)
    counts = Counter((body["kind"], body["state"]) for body in published)
    publish_records(producer, kafka, keyed_alerts, feedback, counts=counts)
    if logger.isEnabledFor(logging.DEBUG):
        for alert in alerts:
            logger.debug(
                "alert %s %s %s %s", alert.state.value, alert.kind.value, alert.entity, alert.alert_id
            )
    return published


def publish_records(
    producer: Any,
    kafka: KafkaSettings,
    alert_records: Sequence[tuple[bytes, bytes]],
    feedback: Sequence[Mapping[str, Any]] = (),
    *,
    counts: Mapping[tuple[str, str], int] | None = None,
) -> list[bytes]:
    """Send encoded alerts (``(key, value)``, e.g. from :func:`encoded_alerts` or the columnar
    :func:`~core.domain.ledger_alerts.alert_records`) and feedback, and wait for every acknowledgement;
    returns the alert values sent. ``counts`` (``(kind, state) → alerts``) is for the log line.

    Raises :class:`~core.errors.ServiceError` as :func:`publish` does.
    """
    if not alert_records and not feedback:
        return []
    records = placed(producer, kafka, kafka.alerts_topic, alert_records)
    records += placed(
        producer,
        kafka,
        kafka.feedback_topic,
        [(f"ledger/{message['ledger_id']}".encode(), _compact_json(message)) for message in feedback],
    )
    _send_or_fail(producer, kafka, records, "alert or feedback")
    _log_published(len(alert_records), counts or {})
    return [value for _, value in alert_records]


def placed(
    producer: Any, kafka: KafkaSettings, topic: str, keyed: Sequence[tuple[bytes | None, bytes | None]]
) -> list[tuple[str, int, bytes | None, bytes | None]]:
    """``(key, value)`` records with the partition Kafka's default partitioner gives their key."""
    if not keyed:
        return []
    from connectors.kafka.client_config import partition_count
    from connectors.kafka.publisher import partitions_for_keys

    count = partition_count(producer, topic, kafka.producer_max_block_ms / 1000)
    partitions = partitions_for_keys([k or b"" for k, _ in keyed], count)
    return [(topic, p, key, value) for (key, value), p in zip(keyed, partitions, strict=True)]


def send_keyed(
    producer: Any, kafka: KafkaSettings, topic: str, keyed: Sequence[tuple[bytes | None, bytes | None]]
) -> None:
    """Send ``(key, value)`` records to ``topic`` (partitioned by key) and wait for every acknowledgement.

    Raises :class:`~core.errors.ServiceError` as :func:`publish` does.
    """
    _send_or_fail(producer, kafka, placed(producer, kafka, topic, keyed), topic)


def _send_or_fail(producer: Any, kafka: KafkaSettings, records: list[Any], what: str) -> None:
    from connectors.kafka.tail_sender import send_records

    if not records:
        return
    failed, first_failure = send_records(producer, kafka, records)
    if failed:
        raise ServiceError(
            f"{failed} {what} records were not delivered to Kafka ({first_failure}); "
            "the batch fails and is replayed when the job restarts"
        )


def _log_published(published: int, counts: Mapping[tuple[str, str], int]) -> None:
    # One line per call at INFO (a lost bookie's tens of thousands of lines cost seconds); each alert is on
    # the topic and in the violations table.
    if published:
        logger.info(
            "published %d alert transitions: %s",
            published,
            ", ".join(f"{n} {state} {kind}" for (kind, state), n in sorted(counts.items())),
        )


__all__ = ["encoded_alerts", "placed", "publish", "publish_records", "send_keyed"]
