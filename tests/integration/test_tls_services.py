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
import os
import subprocess
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
from connectors.kafka.kafka_broker import KafkaBroker
from connectors.kafka.topics import ensure_topic
from connectors.zookeeper.client import kazoo_client_options, start_client
from core.errors import BkauditError
from core.settings import DevSettings, KafkaSettings, ZooKeeperSettings
from tests.integration.event_fixtures import run_watch_once

pytestmark = pytest.mark.integration

Cli = Callable[..., Any]
WRONG_PASSWORD = "Wr0ng-key-password-7"
SCRAM_USER = "bkaudit-auditor"
SCRAM_PASSWORD = "scram-password-4c1e9b"


@dataclass(frozen=True)
class Secured:
    state_dir: Path
    tls: TlsFiles
    zookeeper: str
    kafka: str
    kafka_sasl: str  # the same broker's SASL_SSL listener (SCRAM users, no client certificate)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    from bkaudit.cli.main import run

    state_dir = tmp_path_factory.mktemp("secured")
    tls = write_throwaway_ca(state_dir / "tls")  # `dev up --tls` keeps a CA it finds there
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BKAUDIT_DEV__ZOOKEEPER_HEAP", "256m")
        patch.setenv("BKAUDIT_DEV__KAFKA_HEAP", "384m")
        patch.setenv("BKAUDIT_DEV__START_TIMEOUT_S", "180")
        assert run(["dev", "up", "--tls", "--scram", "--state-dir", str(state_dir)]) == 0
    cluster = DevCluster(DevSettings(state_dir=state_dir))  # found as started: TLS and SCRAM
    try:
        assert isinstance(cluster.broker, KafkaBroker)
        cluster.broker.add_scram_user(SCRAM_USER, SCRAM_PASSWORD)
        addresses = cluster.addresses()
        yield Secured(state_dir, tls, addresses["zookeeper"], addresses["kafka"], addresses["kafka_sasl"])
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
    sasl_port = int(secured.kafka_sasl.rsplit(":", 1)[1])
    assert listeners["zookeeper"] == {zookeeper_port: True}
    # The clients' (mutual TLS), the SCRAM users' (SASL_SSL) and the controller's: all TLS.
    assert {kafka_port, sasl_port} <= set(listeners["kafka"]) and len(listeners["kafka"]) == 3
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


# ----------------------------------------------------------------------------------- Kafka SASL/SCRAM


def _scram(secured: Secured, **override: Any) -> KafkaSettings:
    """A SCRAM-SHA-512 user over TLS that checks the broker's certificate only (no client certificate)."""
    values: dict[str, Any] = {
        "bootstrap_servers": secured.kafka_sasl,
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": SCRAM_USER,
        "sasl_password": SCRAM_PASSWORD,
        "ssl_cafile": secured.tls.ca,
        "topic_partitions": 1,
    }
    return KafkaSettings.model_validate({**values, **override})


def _scram_environment(monkeypatch: pytest.MonkeyPatch, settings: KafkaSettings) -> None:
    """The job's reader takes its security settings from the environment, as Spark's workers do."""
    assert settings.sasl_password is not None
    for name, value in {
        "SECURITY_PROTOCOL": settings.security_protocol,
        "SASL_MECHANISM": settings.sasl_mechanism,
        "SASL_USERNAME": settings.sasl_username,
        "SASL_PASSWORD": settings.sasl_password.get_secret_value(),
        "SSL_CAFILE": settings.ssl_cafile,
        "EXTRA_CONFIG": json.dumps(settings.extra_config),
    }.items():
        monkeypatch.setenv(f"BKAUDIT_KAFKA__{name}", str(value))


def test_the_watcher_the_job_and_the_alerts_over_sasl_scram(
    secured: Secured, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    import pyarrow as pa

    from connectors.kafka.planner import KafkaPlanner
    from connectors.kafka.publisher import ChangePublisher
    from connectors.kafka.tail_sender import send_records
    from core import events

    caplog.set_level(logging.DEBUG)
    # librdkafka's SASL and configuration steps logged, at debug, through the secret filter
    settings = _scram(secured, extra_config={"debug": "security,conf,broker"})
    changes, alerts = (f"scram-{name}-{uuid.uuid4().hex[:8]}" for name in ("changes", "alerts"))
    # The watcher's producer: the change events of three ledgers.
    publisher = ChangePublisher(settings, changes, partitions=1)
    publisher.start()
    builder = events.EventBuilder("c", "r", clock_ms=lambda: 5)
    try:
        for ledger in (1, 2, 3):
            publisher.publish(builder.build(events.ledger_deleted(ledger)))
        publisher.flush(60)
        assert publisher.delivered == 3
    finally:
        publisher.close()
    # The job's reader, with the settings of its environment: the three records planned and read.
    _scram_environment(monkeypatch, settings)
    reader = KafkaPlanner({"kafka.bootstrap.servers": secured.kafka_sasl, "subscribe": changes})
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    keys = [
        row["key"]
        for part in reader.partitions(start, end)
        for batch in reader.read(part)
        for row in pa.Table.from_batches([batch]).to_pylist()
    ]
    assert keys == [b"ledger/1", b"ledger/2", b"ledger/3"]
    # The sink's alert producer, and the alerts read back as `bkaudit alerts` reads them.
    ensure_topic(settings, alerts)
    failed, first_failure = send_records(
        Producer(producer_config(settings)), settings, [(alerts, 0, b"ledger/1", b'{"kind": "K"}')]
    )
    assert (failed, first_failure) == (0, None)
    consumer = Consumer(consumer_config(settings, None))
    try:
        assign_from_beginning(consumer, alerts, 60)
        message = consumer.poll(60)
        assert message is not None and message.error() is None and message.key() == b"ledger/1"
    finally:
        consumer.close()
    assert any(record.name == "connectors.kafka.librdkafka" for record in caplog.records)
    assert SCRAM_PASSWORD not in caplog.text


def test_bkaudit_watch_with_a_wrong_scram_password_is_one_line_at_debug_without_secrets(
    secured: Secured, tmp_path: Path
):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKAUDIT_")}
    env.update({f"BKAUDIT_ZOOKEEPER__{k.upper()}": str(v) for k, v in _zookeeper_env(secured.tls).items()})
    env.update(
        {
            "BKAUDIT_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
            "BKAUDIT_KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
            "BKAUDIT_KAFKA__SASL_USERNAME": SCRAM_USER,
            "BKAUDIT_KAFKA__SASL_PASSWORD": WRONG_PASSWORD,
            "BKAUDIT_KAFKA__SSL_CAFILE": str(secured.tls.ca),
            "BKAUDIT_KAFKA__BOOTSTRAP_TIMEOUT_MS": "3000",
            "BKAUDIT_KAFKA__EXTRA_CONFIG": '{"debug": "security,conf,broker"}',
            "BKAUDIT_WATCHER__PROGRESS": "off",
            "BKAUDIT_CLUSTER": "scram-test",  # no BookKeeper cluster on this ZooKeeper (no INSTANCEID)
        }
    )
    ran = run_watch_once(
        secured.zookeeper,
        secured.kafka_sasl,
        f"scram-watch-{uuid.uuid4().hex[:8]}",
        env=env,
        cwd=tmp_path,
    )
    done = subprocess.CompletedProcess(ran.args, ran.returncode, ran.stdout.decode(), ran.stderr.decode())
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("bkaudit: Kafka at") and "SASL authentication refused" in last, last
    assert "kafka.sasl_username and kafka.sasl_password" in last
    assert "Traceback" not in done.stderr
    output = done.stdout + done.stderr
    broker_log = (secured.state_dir / "kafka" / "broker.log").read_text(errors="replace")
    for secret in (WRONG_PASSWORD, SCRAM_PASSWORD, secured.tls.key_password):
        assert secret not in output and secret not in broker_log
    assert "connectors.kafka.librdkafka" in output  # librdkafka's debug lines were there to leak it
