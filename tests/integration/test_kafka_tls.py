"""Kafka with mutual TLS: the real Kafka broker (KRaft) serves TLS only, on every listener, with client
certificates required; bkaudit's clients (built by ``connectors.kafka.client_config`` from the ``kafka.ssl_*``
settings, an encrypted client key among them) create a topic, produce and consume, and each refusal (wrong
CA, missing client certificate, expired certificate, wrong key password) is one line naming the setting,
with no secret in it or in the logs. (Tansu, the default embedded broker, has no TLS listener.)"""

from __future__ import annotations

import logging
import socket
import ssl
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer

from bkaudit.testing.tls import TlsFiles, write_throwaway_ca
from connectors.kafka.client_config import assign_from_beginning, consumer_config, producer_config
from connectors.kafka.kafka_broker import KafkaBroker
from connectors.kafka.topics import ensure_topic
from connectors.process import LOOPBACK, listening_ports
from connectors.tls import ServerTls
from core.errors import BkauditError
from core.settings import KafkaSettings

pytestmark = pytest.mark.integration

WRONG_PASSWORD = "Wr0ng-kafka-key-password"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return write_throwaway_ca(tmp_path_factory.mktemp("kafka-tls"))


@pytest.fixture(scope="module")
def tls_broker(tls: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    server = ServerTls(tls.ca, tls.server_keystore, tls.client_cert, tls.client_key)
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka-tls-state"), heap="384m", tls=server)
    broker.start(timeout=180)
    try:
        yield broker
    finally:
        broker.stop()


def _settings(broker: KafkaBroker, tls: TlsFiles, **override: object) -> KafkaSettings:
    values: dict[str, object] = {
        "bootstrap_servers": broker.bootstrap,
        "security_protocol": "SSL",
        "ssl_cafile": tls.ca,
        "ssl_certfile": tls.client_cert,
        "ssl_keyfile": tls.client_key_encrypted,
        "ssl_password": tls.key_password,
        "topic_partitions": 1,
    }
    return KafkaSettings.model_validate({**values, **override})


def _speaks_tls_only(port: int, tls: TlsFiles) -> bool:
    context = ssl.create_default_context(cafile=str(tls.ca))
    context.load_cert_chain(str(tls.client_cert), str(tls.client_key))
    with (
        socket.create_connection((LOOPBACK, port), timeout=30) as raw,
        context.wrap_socket(raw, server_hostname=LOOPBACK) as sock,
    ):
        return sock.getpeercert() is not None


def test_produce_and_consume_over_mutual_tls_with_no_plaintext_port(tls: TlsFiles, tls_broker: KafkaBroker):
    settings = _settings(tls_broker, tls)
    topic = f"tls-{uuid.uuid4().hex[:8]}"
    assert ensure_topic(settings, topic) == 1
    producer = Producer(producer_config(settings))
    for index in range(3):
        producer.produce(topic, key=b"ledger/%d" % index, value=b"v%d" % index)
    assert producer.flush(60) == 0
    consumer = Consumer(consumer_config(settings, None))
    try:
        assign_from_beginning(consumer, topic, 60)
        values = []
        while len(values) < 3:
            message = consumer.poll(60)
            assert message is not None and message.error() is None
            values.append(message.value())
    finally:
        consumer.close()
    assert values == [b"v0", b"v1", b"v2"]
    pid = tls_broker.pid()
    assert pid is not None
    ports = listening_ports(pid)
    assert ports == {tls_broker.port, tls_broker.controller_port}
    assert all(_speaks_tls_only(port, tls) for port in ports)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"ssl_cafile": "other_ca"}, "not signed by a CA in kafka.ssl_cafile"),
        ({"ssl_certfile": None, "ssl_keyfile": None}, "requires a client certificate"),
        ({"ssl_certfile": "expired_cert", "ssl_keyfile": "expired_key"}, "kafka.ssl_certfile: the client"),
        ({"ssl_password": WRONG_PASSWORD}, "kafka.ssl_keyfile: cannot load"),
    ],
    ids=["wrong-ca", "no-client-certificate", "expired-certificate", "wrong-key-password"],
)
def test_each_refusal_is_one_line_without_secrets(
    tls: TlsFiles,
    tls_broker: KafkaBroker,
    caplog: pytest.LogCaptureFixture,
    override: dict[str, str | None],
    expected: str,
):
    files = {
        key: getattr(tls, value) if value in TlsFiles.__dataclass_fields__ else value
        for key, value in override.items()
    }
    settings = _settings(tls_broker, tls, bootstrap_timeout_ms=3000, **files)
    caplog.set_level(logging.DEBUG)

    with pytest.raises(BkauditError) as refused:
        ensure_topic(settings, f"refused-{uuid.uuid4().hex[:8]}")

    line = str(refused.value)
    assert "\n" not in line and expected in line, line
    assert line.startswith(f"Kafka at {tls_broker.bootstrap}: creating topic")
    for secret in (tls.key_password, WRONG_PASSWORD):
        assert secret not in line and secret not in caplog.text
