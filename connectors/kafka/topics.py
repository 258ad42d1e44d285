"""Topic administration: create the topics bkaudit needs when they are absent.

Status: stable.

Example:
    >>> # ensure_topic(KafkaSettings(bootstrap_servers="127.0.0.1:9092"), "bkaudit.changes")
"""

from __future__ import annotations

import contextlib
import time

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

from bkaudit.errors import ServiceError
from bkaudit.settings import KafkaSettings
from connectors.kafka.client_config import admin_config, kafka_errors


def ensure_topic(
    settings: KafkaSettings, topic: str, partitions: int | None = None, timeout_s: float = 30.0
) -> int:
    """Create ``topic`` with ``partitions`` (default ``settings.topic_partitions``) unless it exists.

    Returns the topic's partition count as the broker reports it once the topic is visible. This is the
    first thing both processes ask of Kafka, so an unreachable or refusing cluster surfaces here as one
    :class:`ServiceError` line (naming the brokers), not as kafka-python's traceback.
    """
    wanted = partitions or settings.topic_partitions
    with kafka_errors(settings, f"creating topic {topic!r}"):
        admin = KafkaAdminClient(**admin_config(settings))
        try:
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics([NewTopic(topic, num_partitions=wanted, replication_factor=1)])
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                described = admin.describe_topics([topic])
                if described and not described[0].get("error_code") and described[0].get("partitions"):
                    return len(described[0]["partitions"])
                time.sleep(0.1)
            raise ServiceError(f"topic {topic!r} not visible after {timeout_s:.0f} s")
        finally:
            admin.close()
