"""The one place that turns :class:`bkaudit.settings.KafkaSettings` into kafka-python client options.

Every producer, consumer and admin client in bkaudit (watcher, Spark data source, alert sink, tests) is
built from these functions, so the Tansu work-arounds and the production security settings are applied
everywhere alike. Passwords are unwrapped from ``SecretStr`` only here, at the moment a client is built.

Status: stable.

Example:
    >>> from bkaudit.settings import KafkaSettings
    >>> config = producer_config(KafkaSettings(bootstrap_servers="127.0.0.1:9092"))
    >>> config["acks"], config["batch_size"], config["max_in_flight_requests_per_connection"]
    ('all', 262144, 1)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kafka.errors import KafkaError

from bkaudit.errors import ServiceError
from bkaudit.settings import KafkaSettings


def common_config(settings: KafkaSettings) -> dict[str, Any]:
    """Connection and security options shared by every client.

    Example:
        >>> common_config(KafkaSettings())["security_protocol"]
        'PLAINTEXT'
    """
    config: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers.split(","),
        "client_id": settings.client_id,
        "request_timeout_ms": settings.request_timeout_ms,
        "bootstrap_timeout_ms": settings.bootstrap_timeout_ms,
        "security_protocol": settings.security_protocol,
    }
    if settings.sasl_mechanism is not None:
        config["sasl_mechanism"] = settings.sasl_mechanism
        if settings.sasl_username is not None:
            config["sasl_plain_username"] = settings.sasl_username
        if settings.sasl_password is not None:
            config["sasl_plain_password"] = settings.sasl_password.get_secret_value()
    for option in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        value = getattr(settings, option)
        if value is not None:
            config[option] = str(value)
    if settings.ssl_password is not None:
        config["ssl_password"] = settings.ssl_password.get_secret_value()
    return config


def producer_config(settings: KafkaSettings) -> dict[str, Any]:
    """Producer options: no lost event (acks=all, endless retries, blocking back-pressure), per-key order.

    Example:
        >>> producer_config(KafkaSettings(producer_batch_size=65536))["batch_size"]
        65536
    """
    acks: str | int = (
        settings.producer_acks if settings.producer_acks == "all" else int(settings.producer_acks)
    )
    return {
        **common_config(settings),
        "acks": acks,
        "batch_size": settings.producer_batch_size,
        "linger_ms": settings.producer_linger_ms,
        "retries": settings.producer_retries,
        "max_in_flight_requests_per_connection": settings.producer_max_in_flight,
        "max_block_ms": settings.producer_max_block_ms,
        "delivery_timeout_ms": max(
            settings.producer_delivery_timeout_ms, settings.producer_linger_ms + settings.request_timeout_ms
        ),
        "enable_idempotence": settings.producer_enable_idempotence,
    }


def holds_tails(settings: KafkaSettings) -> bool:
    """Whether senders hold each partition's newest record back (:mod:`connectors.kafka.tail_sender`).

    Only when batches can hold several records (``producer_batch_size > 0``) and
    ``single_record_tails`` asks for it.

    Example:
        >>> holds_tails(KafkaSettings()), holds_tails(KafkaSettings(producer_batch_size=0))
        (True, False)
    """
    return settings.single_record_tails and settings.producer_batch_size > 0


def consumer_config(settings: KafkaSettings, group_id: str | None) -> dict[str, Any]:
    """Consumer options with short group timeouts (fast joins on Tansu) and manual offset control.

    Example:
        >>> consumer_config(KafkaSettings(), None)["enable_auto_commit"]
        False
    """
    return {
        **common_config(settings),
        "group_id": group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "session_timeout_ms": settings.consumer_session_timeout_ms,
        "heartbeat_interval_ms": settings.consumer_heartbeat_interval_ms,
        "max_poll_interval_ms": settings.consumer_max_poll_interval_ms,
    }


def admin_config(settings: KafkaSettings) -> dict[str, Any]:
    """Admin client options (topic creation, metadata).

    Example:
        >>> "bootstrap_servers" in admin_config(KafkaSettings())
        True
    """
    return common_config(settings)


def _secrets(settings: KafkaSettings) -> list[str]:
    return [
        secret.get_secret_value()
        for secret in (settings.sasl_password, settings.ssl_password)
        if secret is not None and secret.get_secret_value()
    ]


@contextlib.contextmanager
def kafka_errors(settings: KafkaSettings, action: str) -> Iterator[None]:
    """Turn a kafka-python error raised while ``action`` runs into one :class:`ServiceError` line.

    The line names the brokers and what to check; it never carries a password (kafka-python's messages
    have none, but they are scrubbed anyway: a broker's error text is not ours to trust).

    Example:
        >>> from kafka.errors import KafkaTimeoutError
        >>> try:
        ...     with kafka_errors(KafkaSettings(bootstrap_servers="k1:9092"), "creating topic 't'"):
        ...         raise KafkaTimeoutError("Unable to bootstrap from ['k1:9092']")
        ... except ServiceError as err:
        ...     print(str(err).split(";")[0])
        Kafka at k1:9092: creating topic 't' failed (KafkaTimeoutError: Unable to bootstrap from ['k1:9092'])
    """
    try:
        yield
    except KafkaError as err:
        detail = str(err)  # kafka-python's errors print as "ClassName: text" (the bare name when empty)
        for secret in _secrets(settings):
            detail = detail.replace(secret, "***")
        hint = (
            "check kafka.bootstrap_servers (BKAUDIT_KAFKA__BOOTSTRAP_SERVERS) and that the brokers are up "
            "and reachable from this host"
        )
        if settings.security_protocol != "PLAINTEXT":
            hint += f", and the {settings.security_protocol} settings (kafka.sasl_*, kafka.ssl_*)"
        raise ServiceError(
            f"Kafka at {settings.bootstrap_servers}: {action} failed ({detail}); {hint}"
        ) from None
