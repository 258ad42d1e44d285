"""The one place that turns :class:`core.settings.KafkaSettings` into librdkafka client configurations.

Every producer, consumer and admin client in bkaudit (watcher, Spark data source, alert sink, CLI, tests) is
a confluent-kafka (librdkafka) client built from these functions, so the embedded broker's work-arounds,
the delivery guarantees and the production security settings are applied everywhere alike. Passwords are
unwrapped from ``SecretStr`` only here, at the moment a client is built, and the configuration dict is never
logged. librdkafka's own log lines go to the Python logger ``connectors.kafka.librdkafka`` (the ``logger``
property), so the handlers' :class:`~core.logsetup.SecretFilter` sees them too.

Example:
    >>> from core.settings import KafkaSettings
    >>> config = producer_config(KafkaSettings(bootstrap_servers="127.0.0.1:9092"))
    >>> config["acks"], config["batch.size"], config["max.in.flight.requests.per.connection"]
    ('all', 262144, 1)
    >>> config["partitioner"]
    'murmur2_random'
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from pydantic import SecretStr

from connectors.tls import client_context, explain_refusal, first_refusal
from core.domain.addresses import parse_bootstrap_servers
from core.errors import ConfigError, ServiceError
from core.settings import KafkaSettings, is_secret_property

#: Where librdkafka's log lines go (through the handlers' secret filter like every other record).
LIBRDKAFKA_LOGGER = logging.getLogger("connectors.kafka.librdkafka")


class LibrdkafkaLog:
    """The ``logger`` librdkafka is given: its lines go to :data:`LIBRDKAFKA_LOGGER`, one level lower.

    librdkafka reports every refused connection and broker restart as an error; bkaudit reports what it
    cannot ride out itself (back-off warnings, one error line, metrics), so librdkafka's errors are
    warnings here, its warnings information, and its notices debug.

    Example:
        >>> LibrdkafkaLog.level_for(logging.ERROR) == logging.WARNING
        True
    """

    @staticmethod
    def level_for(level: int) -> int:
        if level >= logging.CRITICAL:
            return logging.ERROR
        if level >= logging.ERROR:
            return logging.WARNING
        if level >= logging.WARNING:
            return logging.INFO
        return logging.DEBUG

    def log(self, level: int, message: str, *args: Any, **kwargs: Any) -> None:
        LIBRDKAFKA_LOGGER.log(self.level_for(level), message, *args, **kwargs)


_LIBRDKAFKA_LOG = LibrdkafkaLog()

#: librdkafka's ``batch.size`` bound (bytes).
_MAX_BATCH_BYTES = 2_147_483_647


class KafkaTimeout(KafkaException):
    """A Kafka operation bkaudit waits for did not finish in time (a flush, a fetch, a full buffer).

    A :class:`confluent_kafka.KafkaException`, so every ``except KafkaException`` treats it as the Kafka
    failure it is.

    Example:
        >>> isinstance(KafkaTimeout("flush: 3 records pending"), KafkaException)
        True
    """


def common_config(settings: KafkaSettings) -> dict[str, Any]:
    """Connection and security properties shared by every client, then ``extra_config`` on top.

    Example:
        >>> common_config(KafkaSettings())["security.protocol"]
        'PLAINTEXT'
        >>> common_config(KafkaSettings(extra_config={"socket.keepalive.enable": "true"}))[
        ...     "socket.keepalive.enable"]
        'true'
    """
    _guard_librdkafka_log(settings)
    config: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "client.id": settings.client_id,
        "socket.timeout.ms": settings.request_timeout_ms,
        "security.protocol": settings.security_protocol,
        "log.connection.close": False,
        "logger": _LIBRDKAFKA_LOG,
    }
    if settings.sasl_mechanism is not None:
        config["sasl.mechanism"] = settings.sasl_mechanism
        if settings.sasl_username is not None:
            config["sasl.username"] = settings.sasl_username
        if settings.sasl_password is not None:
            config["sasl.password"] = settings.sasl_password.get_secret_value()
    for option, name in (
        ("ssl_cafile", "ssl.ca.location"),
        ("ssl_certfile", "ssl.certificate.location"),
        ("ssl_keyfile", "ssl.key.location"),
    ):
        value = getattr(settings, option)
        if value is not None:
            config[name] = str(value)
    if settings.ssl_password is not None:
        config["ssl.key.password"] = settings.ssl_password.get_secret_value()
    return {**config, **extra_properties(settings)}


def _guard_librdkafka_log(settings: KafkaSettings) -> None:
    """Redact this configuration's secrets from librdkafka's records even where no handler is guarded (a
    Spark worker that never configured logging)."""
    from core.logsetup import SECRET_FILTER, register_secrets

    register_secrets(_secrets(settings))
    if SECRET_FILTER not in LIBRDKAFKA_LOGGER.filters:
        LIBRDKAFKA_LOGGER.addFilter(SECRET_FILTER)


def extra_properties(settings: KafkaSettings) -> dict[str, str]:
    """``kafka.extra_config`` with its secret values unwrapped: librdkafka properties passed through as given.

    Example:
        >>> extra_properties(KafkaSettings(extra_config={"sasl.oauthbearer.client.secret": "x"}))
        {'sasl.oauthbearer.client.secret': 'x'}
    """
    return {
        name: value.get_secret_value() if isinstance(value, SecretStr) else value
        for name, value in settings.extra_config.items()
    }


def producer_config(settings: KafkaSettings) -> dict[str, Any]:
    """Producer properties: no lost event (acks=all, endless retries, back-pressure), per-key order.

    ``enable.idempotence`` stays off by default (the embedded broker does not support it), so one request in
    flight per connection is what keeps per-key order across retries. Keyed records without an explicit
    partition go where Java's default partitioner puts them (``murmur2_random``). A full local queue
    makes ``produce`` raise ``BufferError``; the senders then wait (:mod:`connectors.kafka.tail_sender`),
    never drop.

    Example:
        >>> producer_config(KafkaSettings(producer_batch_size=65536))["batch.size"]
        65536
        >>> producer_config(KafkaSettings(producer_batch_size=0))["batch.num.messages"]
        1
    """
    config = {
        **common_config(settings),
        "acks": settings.producer_acks,
        "linger.ms": settings.producer_linger_ms,
        "message.send.max.retries": settings.producer_retries,
        "max.in.flight.requests.per.connection": settings.producer_max_in_flight,
        "request.timeout.ms": settings.request_timeout_ms,
        "message.timeout.ms": max(
            settings.producer_delivery_timeout_ms, settings.producer_linger_ms + settings.request_timeout_ms
        ),
        "enable.idempotence": settings.producer_enable_idempotence,
        "partitioner": "murmur2_random",
    }
    if settings.producer_batch_size > 0:
        config["batch.size"] = min(settings.producer_batch_size, _MAX_BATCH_BYTES)
    else:
        config["batch.num.messages"] = 1  # one record per batch
    return {**config, **extra_properties(settings)}  # extra_config wins over our defaults too


def failures_only_producer_config(settings: KafkaSettings) -> dict[str, Any]:
    """:func:`producer_config` for a producer whose callers need only failed deliveries reported (librdkafka's
    ``delivery.report.only.error``): the job's alerts, feedback and forwarding, which wait for every
    acknowledgement with a flush and count failures. A delivery report is a Python call per record; a lost
    bookie's 31,000 alerts spent ~25 ms in them. ``extra_config`` still wins.

    Example:
        >>> failures_only_producer_config(KafkaSettings())["delivery.report.only.error"]
        True
    """
    return {**producer_config(settings), "delivery.report.only.error": True, **extra_properties(settings)}


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
    """Consumer properties with short group timeouts (fast joins on the embedded broker), no auto commit.

    bkaudit's readers assign partitions and keep offsets themselves (Spark's checkpoint); librdkafka still
    wants a ``group.id``, so without one the client id names a group that is never joined.

    Example:
        >>> config = consumer_config(KafkaSettings(), None)
        >>> config["enable.auto.commit"], config["group.id"]
        (False, 'bkaudit.reader')
    """
    config = {
        **common_config(settings),
        "group.id": group_id or f"{settings.client_id}.reader",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": settings.consumer_session_timeout_ms,
        "heartbeat.interval.ms": settings.consumer_heartbeat_interval_ms,
        "max.poll.interval.ms": max(
            settings.consumer_max_poll_interval_ms, settings.consumer_session_timeout_ms
        ),
    }
    return {**config, **extra_properties(settings)}


def admin_config(settings: KafkaSettings) -> dict[str, Any]:
    """Admin client properties (topic creation, metadata).

    Example:
        >>> "bootstrap.servers" in admin_config(KafkaSettings())
        True
    """
    return common_config(settings)


def error_text(err: BaseException) -> str:
    """A Kafka failure as ``NAME: text`` (librdkafka's error name, or the exception's class).

    Example:
        >>> error_text(KafkaException(KafkaError(KafkaError._TIMED_OUT, "no answer")))
        '_TIMED_OUT: no answer'
        >>> error_text(KafkaTimeout("flush: 3 records pending"))
        'KafkaTimeout: flush: 3 records pending'
    """
    first = err.args[0] if err.args else None
    if isinstance(first, KafkaError):
        return f"{first.name()}: {first.str()}"
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def error_code(err: BaseException) -> int | None:
    """librdkafka's error code inside ``err`` (None when it carries none).

    Example:
        >>> error_code(KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS))) == (
        ...     KafkaError.TOPIC_ALREADY_EXISTS)
        True
    """
    first = err.args[0] if err.args else None
    return first.code() if isinstance(first, KafkaError) else None


def configuration_error(err: BaseException) -> ConfigError | None:
    """The one-line error for a client configuration librdkafka refused (an unknown property or a bad value,
    typically from ``kafka.extra_config``); None for any other failure. Retrying such an error is useless.

    Example:
        >>> error = KafkaException(KafkaError(KafkaError._INVALID_ARG, "No such property: x"))
        >>> str(configuration_error(error)).split(";")[0]
        'librdkafka refused the Kafka client configuration (_INVALID_ARG: No such property: x)'
        >>> configuration_error(KafkaTimeout("flush")) is None
        True
    """
    if error_code(err) != KafkaError._INVALID_ARG:
        return None
    return ConfigError(
        f"librdkafka refused the Kafka client configuration ({error_text(err)}); check kafka.extra_config "
        "(BKAUDIT_KAFKA__EXTRA_CONFIG) and the kafka.* settings"
    )


def _secrets(settings: KafkaSettings) -> list[str]:
    values: list[str | SecretStr | None] = [settings.sasl_password, settings.ssl_password]
    values += [value for name, value in settings.extra_config.items() if is_secret_property(name)]
    texts = [value.get_secret_value() if isinstance(value, SecretStr) else value for value in values if value]
    return [text for text in texts if text]


@contextlib.contextmanager
def kafka_errors(settings: KafkaSettings, action: str) -> Iterator[None]:
    """Turn a Kafka failure raised while ``action`` runs into one :class:`ServiceError` line.

    The line names the brokers and what to check; it never carries a password (librdkafka's messages have
    none, but they are scrubbed anyway: a broker's error text is not ours to trust).

    Example:
        >>> try:
        ...     with kafka_errors(KafkaSettings(bootstrap_servers="k1:9092"), "creating topic 't'"):
        ...         raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata"))
        ... except ServiceError as err:
        ...     print(str(err).split(";")[0])
        Kafka at k1:9092: creating topic 't' failed (_TRANSPORT: Failed to get metadata)
    """
    try:
        yield
    except (KafkaException, BufferError) as err:
        refused = configuration_error(err)
        if refused is not None:
            raise refused from None
        check_tls(settings, action)
        check_sasl(settings, action)
        detail = error_text(err)
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


#: A Kafka ApiVersions request (v0, correlation id 1, no client id): what a TLS probe sends so that a broker
#: that refuses the client certificate after a TLS 1.3 handshake says so at once.
_API_VERSIONS_REQUEST = bytes.fromhex("0000000a0012000000000001ffff")


def tls_refusal(settings: KafkaSettings, timeout_s: float = 10.0) -> ServiceError | ConfigError | None:
    """Why TLS to the brokers fails, as one line, or None (TLS is off, or accepted).

    librdkafka retries a refused handshake and reports a timeout or a transport error; this loads the
    ``kafka.ssl_*`` files (a missing file, a wrong key password, an expired client certificate:
    :class:`ConfigError`) and makes one handshake with each bootstrap server until one answers (a wrong CA,
    a missing or refused client certificate: :class:`ServiceError`).

    Example:
        >>> tls_refusal(KafkaSettings()) is None  # PLAINTEXT
        True
    """
    if settings.security_protocol not in ("SSL", "SASL_SSL"):
        return None
    password = settings.ssl_password.get_secret_value() if settings.ssl_password is not None else None
    try:
        context = client_context(
            "kafka.ssl_", settings.ssl_cafile, settings.ssl_certfile, settings.ssl_keyfile, password
        )
    except ConfigError as err:
        return err
    servers = parse_bootstrap_servers(settings.bootstrap_servers)
    refused = first_refusal(context, servers, timeout_s, hello=_API_VERSIONS_REQUEST)
    if refused is None:
        return None
    host, port, reason = refused
    hint = explain_refusal(reason, "kafka.ssl_", sent_certificate=settings.ssl_certfile is not None)
    return ServiceError(f"TLS refused by {host}:{port} ({reason}): {hint}")


def check_tls(settings: KafkaSettings, action: str) -> None:
    """Raise :func:`tls_refusal`'s line, prefixed with the brokers and ``action``, if there is one.

    Example:
        >>> check_tls(KafkaSettings(), "creating topic 't'")  # PLAINTEXT: nothing to check
    """
    refused = tls_refusal(settings)
    if refused is not None:
        raise type(refused)(f"Kafka at {settings.bootstrap_servers}: {action} failed: {refused}") from None


#: librdkafka's account of a refused SASL login ends with its own timing: "(after 361ms in state AUTH_REQ)".
_SASL_TIMING = re.compile(r"\s*\(after \d+ms in state \w+\)$")


def sasl_refusal(settings: KafkaSettings, timeout_s: float = 10.0) -> ServiceError | None:
    """Why the brokers refuse the SASL login, as one line, or None (SASL is off, or the login succeeds).

    librdkafka retries a refused login in silence and reports the request's timeout as a transport failure;
    its authentication error only reaches an error callback. This logs in with one admin client until the
    brokers answer or refuse (a wrong user or password, a mechanism the brokers do not enable).

    Example:
        >>> sasl_refusal(KafkaSettings(security_protocol="SSL")) is None
        True
    """
    from confluent_kafka.admin import AdminClient

    if not settings.security_protocol.startswith("SASL_"):
        return None
    refused: list[str] = []
    unreachable: list[str] = []  # no broker answered at all: there is no login to judge

    def on_error(error: KafkaError) -> None:
        if error.code() == KafkaError._AUTHENTICATION:
            refused.append(error.str())
        elif error.code() == KafkaError._ALL_BROKERS_DOWN:
            unreachable.append(error.str())

    config: dict[str, Any] = {**admin_config(settings), "error_cb": on_error, "log_level": 0}
    try:
        admin = AdminClient(config)
    except KafkaException:  # a configuration librdkafka refuses: its own line says so
        return None
    deadline = time.monotonic() + timeout_s
    while not refused and not unreachable and time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=0.5)
            return None
        except KafkaException:
            admin.poll(0)  # serves the error callback
    if not refused:
        return None
    where, _, reason = refused[0].partition(": ")
    reason = _SASL_TIMING.sub("", reason.removeprefix("SASL authentication error: "))
    for secret in _secrets(settings):
        reason = reason.replace(secret, "***")
    return ServiceError(
        f"SASL authentication refused by {where.split('://')[-1].split('/')[0]} ({reason}): check "
        "kafka.sasl_mechanism, kafka.sasl_username and kafka.sasl_password"
    )


def check_sasl(settings: KafkaSettings, action: str) -> None:
    """Raise :func:`sasl_refusal`'s line, prefixed with the brokers and ``action``, if there is one.

    Example:
        >>> check_sasl(KafkaSettings(), "creating topic 't'")  # PLAINTEXT: nothing to check
    """
    refused = sasl_refusal(settings)
    if refused is not None:
        raise ServiceError(f"Kafka at {settings.bootstrap_servers}: {action} failed: {refused}") from None


#: How long a producer's metadata request for an absent topic is repeated while a broker that creates
#: topics on first use creates it (Kafka does so after answering; seconds).
AUTO_CREATE_WAIT_S = 5.0


def partition_count(client: Any, topic: str, timeout_s: float) -> int:
    """How many partitions ``topic`` has, from fresh metadata of any client (producer, consumer, admin).

    The request names the topic: from a producer (librdkafka's ``allow.auto.create.topics`` is on for
    producers) a broker that creates topics on first use creates it, as a first send would; a consumer's
    or admin client's request creates nothing. (The sink asks before each publish: after a broker lost its
    data, its alerts go to the recreated topic.) Raises :class:`KafkaException` when the broker does not
    answer in time, and :class:`~core.errors.ServiceError` when the topic does not exist.

    Kafka creates such a topic in the background: the creating request is answered "unknown topic", and a
    producer's request is asked again for up to :data:`AUTO_CREATE_WAIT_S` (Tansu creates it at once).
    """
    from confluent_kafka import Producer

    started = time.monotonic()
    settle = AUTO_CREATE_WAIT_S if isinstance(client, Producer) else 0.0
    while True:
        remaining = max(0.1, timeout_s - (time.monotonic() - started))
        described = client.list_topics(topic, timeout=remaining).topics.get(topic)
        if described is not None and described.error is None and described.partitions:
            return len(described.partitions)
        if time.monotonic() - started >= min(settle, timeout_s):
            raise ServiceError(f"Kafka topic {topic!r} does not exist (or has no partitions)")
        time.sleep(0.05)


def assign_from_beginning(consumer: Any, topic: str, timeout_s: float) -> int:
    """Assign every partition of ``topic`` to ``consumer`` from its first offset (no group join, which is
    slow on the embedded broker); returns the partition count.

    Example:
        >>> # consumer = Consumer(consumer_config(settings, None))
        >>> # assign_from_beginning(consumer, settings.alerts_topic, 10.0)
    """
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    count = partition_count(consumer, topic, timeout_s)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(count)])
    return count


__all__ = [
    "KafkaTimeout",
    "admin_config",
    "assign_from_beginning",
    "check_sasl",
    "common_config",
    "configuration_error",
    "consumer_config",
    "error_code",
    "error_text",
    "extra_properties",
    "failures_only_producer_config",
    "holds_tails",
    "kafka_errors",
    "partition_count",
    "producer_config",
    "sasl_refusal",
]
