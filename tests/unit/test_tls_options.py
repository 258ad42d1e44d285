"""TLS settings without servers: every kazoo client gets ``zookeeper.tls_*`` (the key password registered
with the secret filter); the ``kafka.ssl_*`` files are checked before a handshake (wrong key password,
expired client certificate, half a pair: one line each, no password in it); Spark's JVM Kafka source
refuses a secured cluster instead of connecting without its settings."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from bkaudit.testing.tls import TlsFiles, write_throwaway_ca
from connectors.kafka.client_config import tls_refusal
from connectors.zookeeper.client import kazoo_client_options
from core.errors import ConfigError
from core.logsetup import SECRET_FILTER
from core.settings import KafkaSettings, Settings, ZooKeeperSettings
from streaming.job import kafka_source_options


def test_tls_settings_reach_kazoo_and_the_key_password_is_a_secret():
    settings = ZooKeeperSettings(
        use_tls=True,
        tls_cafile=Path("/etc/zk/ca.pem"),
        tls_certfile=Path("/etc/zk/client.pem"),
        tls_keyfile=Path("/etc/zk/client.key"),
        tls_keyfile_password="Zk-key-pw-1",
    )

    options = kazoo_client_options(settings)

    assert (options["use_ssl"], options["verify_certs"], options["check_hostname"]) == (True, True, False)
    assert (options["ca"], options["certfile"], options["keyfile"]) == (
        "/etc/zk/ca.pem",
        "/etc/zk/client.pem",
        "/etc/zk/client.key",
    )
    assert options["keyfile_password"] == "Zk-key-pw-1"
    assert "Zk-key-pw-1" in SECRET_FILTER.secrets
    assert "Zk-key-pw-1" not in repr(settings)


def test_plaintext_by_default():
    assert "use_ssl" not in kazoo_client_options(ZooKeeperSettings())


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return write_throwaway_ca(tmp_path_factory.mktemp("tls"))


def _kafka(tls: TlsFiles, **override: object) -> KafkaSettings:
    values: dict[str, object] = {
        "bootstrap_servers": "127.0.0.1:1",  # nothing listens: only the files are checked
        "security_protocol": "SSL",
        "ssl_cafile": tls.ca,
        "ssl_certfile": tls.client_cert,
        "ssl_keyfile": tls.client_key_encrypted,
        "ssl_password": tls.key_password,
    }
    return KafkaSettings.model_validate({**values, **override})


def test_the_client_files_are_checked_before_any_handshake(tls: TlsFiles):
    assert tls_refusal(_kafka(tls)) is None
    wrong = tls_refusal(_kafka(tls, ssl_password="Not-the-pw-9"))
    expired = tls_refusal(_kafka(tls, ssl_certfile=tls.expired_cert, ssl_keyfile=tls.expired_key))
    half = tls_refusal(_kafka(tls, ssl_keyfile=None))
    assert isinstance(wrong, ConfigError) and str(wrong).startswith("kafka.ssl_keyfile: cannot load")
    assert "Not-the-pw-9" not in str(wrong)
    assert isinstance(expired, ConfigError) and "expired on" in str(expired)
    assert isinstance(half, ConfigError) and "go together" in str(half)


def test_the_jvm_kafka_source_refuses_a_secured_cluster(tmp_path: Path):
    settings = Settings(kafka={"security_protocol": "SSL"}, stream={"source_format": "kafka"})
    with pytest.raises(ConfigError, match="bkaudit_kafka"):
        kafka_source_options(settings, ["t"], tmp_path / "status.json")
    secured_python_source = Settings(kafka={"security_protocol": "SSL"})
    assert kafka_source_options(secured_python_source, ["t"], tmp_path / "s.json")["subscribe"] == "t"


def test_a_plaintext_port_is_named_as_such(tls: TlsFiles):
    """A TLS client at a port that answers in plaintext (a ZooKeeper clientPort closes on the ClientHello)."""
    from connectors.tls import client_context, explain_refusal, first_refusal

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def answer_in_plaintext() -> None:
            connection, _ = server.accept()
            with connection:
                connection.recv(1024)
                connection.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")

        thread = threading.Thread(target=answer_in_plaintext, daemon=True)
        thread.start()
        context = client_context("kafka.ssl_", tls.ca, None, None, None)
        refused = first_refusal(context, [("127.0.0.1", 1), ("127.0.0.1", port)], 30.0)
        thread.join(30)

    assert refused is not None and refused[1] == port, refused
    assert "does not speak TLS on this port" in explain_refusal(refused[2], "kafka.ssl_")
