"""A secured cluster end to end for ZooKeeper and Kafka: ``bkaudit dev up --tls`` starts the embedded
ZooKeeper (a secureClientPort only) and the real Kafka broker (TLS on every listener, the controller's
too), both requiring client certificates, with a throwaway CA in the state directory, and no plaintext
port open. bkaudit's clients connect with the CA and a client certificate: the admin reads (``bookies
list --dev``, the same ``start_client`` the watcher, the lease and ``status`` use) and Kafka's
(``client_config``: a topic created, records produced and consumed with an encrypted client key). Each
refusal (wrong CA, missing client certificate, expired certificate, wrong key password) is one line
naming the setting, never a traceback, and no key password appears in the output or in any log record.
(Tansu, the default broker, has no TLS.)"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from kazoo.client import KazooClient

from bkaudit.testing.tls import TlsFiles, write_throwaway_ca
from connectors.devcluster import DevCluster
from connectors.kafka.client_config import assign_from_beginning, consumer_config, producer_config
from connectors.kafka.topics import ensure_topic
from connectors.zookeeper.client import kazoo_client_options, start_client
from core.errors import BkauditError
from core.settings import DevSettings, KafkaSettings, ZooKeeperSettings

pytestmark = pytest.mark.integration

Cli = Callable[..., Any]
WRONG_PASSWORD = "Wr0ng-key-password-7"


@dataclass(frozen=True)
class Secured:
    state_dir: Path
    tls: TlsFiles
    zookeeper: str
    kafka: str


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    from bkaudit.cli.main import run

    state_dir = tmp_path_factory.mktemp("secured")
    tls = write_throwaway_ca(state_dir / "tls")  # `dev up --tls` keeps a CA it finds there
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BKAUDIT_DEV__ZOOKEEPER_HEAP", "256m")
        patch.setenv("BKAUDIT_DEV__KAFKA_HEAP", "384m")
        patch.setenv("BKAUDIT_DEV__START_TIMEOUT_S", "180")
        assert run(["dev", "up", "--tls", "--state-dir", str(state_dir)]) == 0
    addresses = DevCluster(DevSettings(state_dir=state_dir)).addresses()
    try:
        yield Secured(state_dir, tls, addresses["zookeeper"], addresses["kafka"])
    finally:
        assert run(["dev", "down", "--state-dir", str(state_dir)]) == 0


def _files(tls: TlsFiles, override: dict[str, str | None]) -> dict[str, Any]:
    """``override`` with TlsFiles attribute names (``"other_ca"``) replaced by those files."""
    return {
        key: getattr(tls, value) if value in TlsFiles.__dataclass_fields__ else value
        for key, value in override.items()
    }


def test_dev_up_tls_opens_no_plaintext_port(secured: Secured):
    cluster = DevCluster(DevSettings(state_dir=secured.state_dir))  # found as started: TLS, real Kafka
    assert cluster.tls is not None and cluster.addresses()["tls"] == str(secured.state_dir / "tls")

    listeners = cluster.listeners()

    zookeeper_port, kafka_port = (
        int(address.rsplit(":", 1)[1]) for address in (secured.zookeeper, secured.kafka)
    )
    assert listeners["zookeeper"] == {zookeeper_port: True}
    assert kafka_port in listeners["kafka"] and len(listeners["kafka"]) == 2  # clients' and controller's
    assert all(listeners["kafka"].values())


# ------------------------------------------------------------------------------------------- ZooKeeper


def _zookeeper_env(tls: TlsFiles, **override: Any) -> dict[str, Any]:
    values = {
        "use_tls": "true",
        "tls_cafile": tls.ca,
        "tls_certfile": tls.client_cert,
        "tls_keyfile": tls.client_key_encrypted,
        "tls_keyfile_password": tls.key_password,
        "connect_timeout_s": "60",
    }
    return {**values, **override}


def _set_zookeeper_env(monkeypatch: pytest.MonkeyPatch, values: dict[str, Any]) -> None:
    for key, value in values.items():
        name = f"BKAUDIT_ZOOKEEPER__{key.upper()}"
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, str(value))


def test_zookeeper_admin_reads_over_mutual_tls(
    cli: Cli, secured: Secured, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.DEBUG)
    settings = ZooKeeperSettings.model_validate({**_zookeeper_env(secured.tls), "connect": secured.zookeeper})
    client = KazooClient(**kazoo_client_options(settings))
    start_client(client, settings, settings.connect, "zookeeper.connect", 60.0)
    try:
        client.create("/ledgers/available/bookie-tls-1:3181", b"", makepath=True)
    finally:
        client.stop()
        client.close()
    monkeypatch.setenv("BKAUDIT_DEV__STATE_DIR", str(secured.state_dir))

    # --dev: the CA and client pair of `dev up --tls` come with the addresses
    result = cli("bookies", "list", "--format", "json", "--dev")

    assert result.exit_code == 0, result.stderr
    assert "bookie-tls-1:3181" in json.dumps(json.loads(result.stdout))
    assert secured.tls.key_password not in caplog.text  # the encrypted key's password, at DEBUG too


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"tls_cafile": "other_ca"}, "not signed by a CA in zookeeper.tls_cafile"),
        ({"tls_certfile": None, "tls_keyfile": None}, "requires a client certificate"),
        ({"tls_certfile": "expired_cert", "tls_keyfile": "expired_key"}, "certfile: the client certificate"),
        ({"tls_keyfile_password": WRONG_PASSWORD}, "zookeeper.tls_keyfile: cannot load"),
    ],
    ids=["wrong-ca", "no-client-certificate", "expired-certificate", "wrong-key-password"],
)
def test_each_zookeeper_refusal_is_one_line_without_secrets(
    cli: Cli,
    secured: Secured,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    override: dict[str, str | None],
    expected: str,
):
    _set_zookeeper_env(monkeypatch, _zookeeper_env(secured.tls, **_files(secured.tls, override)))
    caplog.set_level(logging.DEBUG)

    result = cli("bookies", "list", "--zookeeper", secured.zookeeper)

    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    for secret in (secured.tls.key_password, WRONG_PASSWORD):
        assert secret not in result.stderr and secret not in caplog.text


# ----------------------------------------------------------------------------------------------- Kafka


def _kafka(secured: Secured, **override: Any) -> KafkaSettings:
    values: dict[str, Any] = {
        "bootstrap_servers": secured.kafka,
        "security_protocol": "SSL",
        "ssl_cafile": secured.tls.ca,
        "ssl_certfile": secured.tls.client_cert,
        "ssl_keyfile": secured.tls.client_key_encrypted,
        "ssl_password": secured.tls.key_password,
        "topic_partitions": 1,
    }
    return KafkaSettings.model_validate({**values, **override})


def test_kafka_produce_and_consume_over_mutual_tls(secured: Secured, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    settings = _kafka(secured, extra_config={"debug": "security"})  # librdkafka's TLS steps logged
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
    assert any(record.name == "connectors.kafka.librdkafka" for record in caplog.records)
    assert secured.tls.key_password not in caplog.text


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
def test_each_kafka_refusal_is_one_line_without_secrets(
    secured: Secured, caplog: pytest.LogCaptureFixture, override: dict[str, str | None], expected: str
):
    settings = _kafka(secured, bootstrap_timeout_ms=3000, **_files(secured.tls, override))
    caplog.set_level(logging.DEBUG)

    with pytest.raises(BkauditError) as refused:
        ensure_topic(settings, f"refused-{uuid.uuid4().hex[:8]}")

    line = str(refused.value)
    assert "\n" not in line and expected in line, line
    assert line.startswith(f"Kafka at {secured.kafka}: creating topic")
    for secret in (secured.tls.key_password, WRONG_PASSWORD):
        assert secret not in line and secret not in caplog.text
