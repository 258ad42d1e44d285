"""Topic administration: create the topics bkaudit needs when they are absent.

Example:
    >>> # ensure_topic(KafkaSettings(bootstrap_servers="127.0.0.1:9092"), "bkaudit.changes")
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from connectors.kafka.client_config import admin_config, check_tls, error_code, kafka_errors
from core.errors import ServiceError
from core.settings import KafkaSettings


def ensure_topic(
    settings: KafkaSettings, topic: str, partitions: int | None = None, timeout_s: float = 30.0
) -> int:
    """Create ``topic`` with ``partitions`` (default ``settings.topic_partitions``) unless it exists.

    Returns the topic's partition count as the broker reports it once the topic is visible. This is the
    first thing both processes ask of Kafka, so an unreachable or refusing cluster surfaces here as one
    :class:`ServiceError` line (naming the brokers), not as a client's traceback.
    """
    wanted = partitions or settings.topic_partitions
    # librdkafka would retry a refused TLS handshake until the bootstrap timeout: one handshake first.
    check_tls(settings, f"creating topic {topic!r}")
    with kafka_errors(settings, f"creating topic {topic!r}"):
        admin = AdminClient(admin_config(settings))
        # The first answer bounds the wait for an unreachable cluster (kafka.bootstrap_timeout_ms).
        existing = admin.list_topics(timeout=settings.bootstrap_timeout_ms / 1000).topics
        if topic not in existing or existing[topic].error is not None:
            created = admin.create_topics(
                [NewTopic(topic, num_partitions=wanted, replication_factor=1)],
                request_timeout=settings.request_timeout_ms / 1000,
            )
            try:
                created[topic].result()
            except KafkaException as err:
                if error_code(err) != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            described = admin.list_topics(timeout=settings.request_timeout_ms / 1000).topics.get(topic)
            if described is not None and described.error is None and described.partitions:
                return len(described.partitions)
            time.sleep(0.1)
        raise ServiceError(f"topic {topic!r} not visible after {timeout_s:.0f} s")
