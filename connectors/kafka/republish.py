"""Re-send every open alert to the alerts topic (``bkaudit alerts republish``).

The alerts topic's history can be lost with the broker (a recreated topic, a broker without persistent
storage); the ``open_alerts`` Delta table still knows what is firing. This re-sends each open alert as the
job published it: same key, same stable ``alert_id``, state ``firing``, the same JSON (one encoder,
:func:`core.domain.alerts.alert_bytes` over :meth:`~core.domain.alerts.Alert.to_json`) and the
same partition rule. Consumers already deduplicate by ``alert_id`` (a replayed batch publishes again
too), so running it while the job runs, or twice, is harmless.

Example:
    >>> # report = republish_open_alerts("lakehouse", KafkaSettings(bootstrap_servers="k1:9092"))
    >>> # report.sent, report.by_kind
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from connectors.delta.tables import table_path
from core.domain.alert_book import alert_from_row
from core.domain.alerts import Alert, alert_bytes
from core.errors import FormatError, NotFoundError, ServiceError
from core.settings import KafkaSettings


@dataclass(frozen=True)
class RepublishReport:
    """What one run did: the topic, how many alerts were (or, dry, would be) sent, per kind."""

    topic: str
    dry_run: bool
    sent: int
    by_kind: dict[str, int] = field(default_factory=dict)


def open_alerts(lakehouse_root: str | Path) -> list[Alert]:
    """The open alerts of the ``open_alerts`` table, in a stable order (kind, entity).

    A missing table is an error (a wrong lakehouse path must not look like "nothing open"); a row whose
    stored id is not the id its fields give is an error too (it would be published under another id).
    """
    path = table_path(lakehouse_root, "open_alerts")
    try:
        rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    except TableNotFoundError:
        raise NotFoundError(
            f"no open_alerts table at {path}: check lakehouse_root (BKAUDIT_LAKEHOUSE_ROOT) or --lakehouse"
        ) from None
    alerts = []
    for row in rows:
        alert = alert_from_row(row)
        if alert.alert_id != row["alert_id"]:
            raise FormatError(
                f"open_alerts row {row['alert_id']} ({row['kind']} {row['entity']}) does not match its own "
                f"fields (they give id {alert.alert_id}); not republishing anything"
            )
        alerts.append(alert)
    return sorted(alerts, key=lambda a: (a.kind.value, a.entity))


def republish_open_alerts(
    lakehouse_root: str | Path, kafka: KafkaSettings, *, dry_run: bool = False
) -> RepublishReport:
    """Send every open alert to ``kafka.alerts_topic`` (created when absent) and wait for the broker's acks.

    With ``dry_run`` nothing is sent and Kafka is not contacted: the report counts what would be.
    """
    alerts = open_alerts(lakehouse_root)
    by_kind = dict(sorted(Counter(alert.kind.value for alert in alerts).items()))
    topic = kafka.alerts_topic
    if not dry_run and alerts:
        _send(kafka, topic, alerts)
    return RepublishReport(topic=topic, dry_run=dry_run, sent=len(alerts), by_kind=by_kind)


def _send(kafka: KafkaSettings, topic: str, alerts: list[Alert]) -> None:
    from confluent_kafka import Producer

    from connectors.kafka.client_config import failures_only_producer_config, kafka_errors
    from connectors.kafka.publisher import partitions_for_keys
    from connectors.kafka.tail_sender import send_records
    from connectors.kafka.topics import ensure_topic

    partitions = ensure_topic(kafka, topic)
    keys = [alert.kafka_key().encode() for alert in alerts]
    records = [
        (topic, partition, key, alert_bytes(alert.to_json()))
        for alert, key, partition in zip(alerts, keys, partitions_for_keys(keys, partitions), strict=True)
    ]
    with kafka_errors(kafka, f"republishing {len(records)} open alerts to {topic!r}"):
        failed, first_failure = send_records(Producer(failures_only_producer_config(kafka)), kafka, records)
    if failed:
        raise ServiceError(
            f"Kafka at {kafka.bootstrap_servers}: {failed} of {len(records)} open alerts were not delivered "
            f"to {topic!r} ({first_failure}); run the command again"
        )
