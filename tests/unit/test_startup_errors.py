"""Start-up failures of `bkaudit watch` and `bkaudit stream` are exit 2 and one line, never a traceback.

Each case fails for real (a refused ZooKeeper or Kafka address, a port someone else holds) with short
connection timeouts, so it takes a second or two. Where a case needs one service to work in order to reach
the failing one, a stand-in takes its place: a fake kazoo client for "ZooKeeper answers" (the watcher talks
to ZooKeeper before Kafka) and a stub Spark session (the job's Kafka and metrics start-up does not need one).
`bkaudit stream` never talks to ZooKeeper, so it has no ZooKeeper case.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from connectors.kafka.client_config import kafka_errors
from core.errors import ServiceError
from core.settings import KafkaSettings

REFUSED = "127.0.0.1:1"  # nothing listens on port 1: connections are refused at once
ZK_PASSWORD = "zk-pw-8c1f"
KAFKA_PASSWORD = "kafka-pw-77d2"


@pytest.fixture(autouse=True)
def _isolated_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only the settings a test sets: no BKAUDIT_* from the caller's shell, short connection timeouts."""
    for name in list(os.environ):
        if name.startswith("BKAUDIT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("BKAUDIT_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("BKAUDIT_LAKEHOUSE_ROOT", str(tmp_path / "lakehouse"))
    monkeypatch.setenv("BKAUDIT_ZOOKEEPER__CONNECT_TIMEOUT_S", "1")
    monkeypatch.setenv("BKAUDIT_KAFKA__BOOTSTRAP_TIMEOUT_MS", "1000")
    monkeypatch.setenv("BKAUDIT_WATCHER__PROGRESS", "off")


def with_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials for both services, so the tests can check they never reach the message."""
    monkeypatch.setenv("BKAUDIT_ZOOKEEPER__AUTH_SCHEME", "digest")
    monkeypatch.setenv("BKAUDIT_ZOOKEEPER__AUTH_USERNAME", "bk")
    monkeypatch.setenv("BKAUDIT_ZOOKEEPER__AUTH_PASSWORD", ZK_PASSWORD)
    monkeypatch.setenv("BKAUDIT_KAFKA__SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("BKAUDIT_KAFKA__SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("BKAUDIT_KAFKA__SASL_USERNAME", "bkaudit")
    monkeypatch.setenv("BKAUDIT_KAFKA__SASL_PASSWORD", KAFKA_PASSWORD)


def one_line_error(result: Any) -> str:
    """The contract: exit 2, exactly one `bkaudit: ...` line on stderr, no traceback, no password."""
    assert result.exit_code == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("bkaudit: "), result.stderr
    assert "Traceback" not in result.stderr
    assert ZK_PASSWORD not in result.stderr and KAFKA_PASSWORD not in result.stderr
    return str(result.stderr)


@pytest.fixture
def taken_port() -> Iterator[tuple[str, int]]:
    """A port another socket listens on (on all interfaces: the job's metrics server binds 0.0.0.0)."""
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        yield "0.0.0.0", holder.getsockname()[1]


class ReachableZooKeeper:
    """Stands in for a kazoo client connected to a cluster: the watcher's Kafka start-up comes after it."""

    handler = SimpleNamespace(timeout_exception=KazooTimeoutError)
    fail_reads_with: type[Exception] | None = None

    def __init__(self, **_options: Any) -> None:
        pass

    def start(self, timeout: float) -> None:
        pass

    def get(self, path: str) -> tuple[bytes, Any]:
        if self.fail_reads_with is not None:
            raise self.fail_reads_with()
        if path.endswith("/INSTANCEID"):
            return b"test-cluster", None
        raise NoNodeError()  # no LAYOUT: the default manager

    def add_listener(self, _listener: Any) -> None:
        pass

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------------------ watch


def test_watch_with_zookeeper_unreachable(cli, monkeypatch):
    with_secrets(monkeypatch)
    started = time.monotonic()
    stderr = one_line_error(cli("watch", "--zookeeper", REFUSED))
    assert time.monotonic() - started < 10
    assert f"ZooKeeper at {REFUSED}: no connection within 1 s" in stderr
    assert "zookeeper.connect (BKAUDIT_ZOOKEEPER__CONNECT)" in stderr
    assert "digest credentials" in stderr


def test_watch_with_zookeeper_unreachable_from_the_environment(cli, monkeypatch):
    monkeypatch.setenv("BKAUDIT_ZOOKEEPER__CONNECT", REFUSED + "/pulsar")
    stderr = one_line_error(cli("watch"))
    assert f"ZooKeeper at {REFUSED}/pulsar: no connection" in stderr


def test_watch_with_the_rack_map_zookeeper_unreachable(cli, monkeypatch):
    from kazoo.client import KazooClient

    def client(**options: Any) -> Any:
        # The cluster's ZooKeeper answers (stand-in); the rack map's, asked for later, is really refused.
        return KazooClient(**options) if options["hosts"] == REFUSED else ReachableZooKeeper()

    monkeypatch.setattr("connectors.zookeeper.watcher.KazooClient", client)
    # The rack map source starts after Kafka: stand in for a Kafka that answers too.
    monkeypatch.setattr("connectors.kafka.publisher.ChangePublisher.start", lambda self: None)
    stderr = one_line_error(
        cli(
            "watch",
            "--zookeeper",
            "zk.example:2181",
            "--watch-mode",
            "fallback",
            "--rack-map-znode",
            "/bookies",
            "--rack-map-zookeeper",
            REFUSED,
        )
    )
    assert f"ZooKeeper at {REFUSED}: no connection within 1 s" in stderr
    assert "watcher.rack_map_zookeeper (BKAUDIT_WATCHER__RACK_MAP_ZOOKEEPER)" in stderr


def test_watch_with_zookeeper_refusing_reads(cli, monkeypatch):
    class Unauthorized(ReachableZooKeeper):
        fail_reads_with = NoAuthError

    monkeypatch.setattr("connectors.zookeeper.watcher.KazooClient", Unauthorized)
    stderr = one_line_error(cli("watch", "--zookeeper", "zk.example:2181/pulsar"))
    assert "ZooKeeper at zk.example:2181/pulsar: cannot read /ledgers/LAYOUT (NoAuthError)" in stderr
    assert "zookeeper.auth_scheme" in stderr


def test_watch_with_kafka_unreachable(cli, monkeypatch):
    with_secrets(monkeypatch)
    monkeypatch.setattr("connectors.zookeeper.watcher.KazooClient", ReachableZooKeeper)
    started = time.monotonic()
    stderr = one_line_error(cli("watch", "--zookeeper", "zk.example:2181", "--bootstrap", REFUSED))
    assert time.monotonic() - started < 10
    assert f"Kafka at {REFUSED}: creating topic 'bkaudit.changes' failed" in stderr
    assert "kafka.bootstrap_servers (BKAUDIT_KAFKA__BOOTSTRAP_SERVERS)" in stderr
    assert "SASL_PLAINTEXT settings" in stderr


def test_watch_with_a_property_librdkafka_does_not_know(cli, monkeypatch):
    with_secrets(monkeypatch)
    monkeypatch.setenv("BKAUDIT_KAFKA__EXTRA_CONFIG", '{"no.such.property": "1"}')
    monkeypatch.setattr("connectors.zookeeper.watcher.KazooClient", ReachableZooKeeper)
    stderr = one_line_error(cli("watch", "--zookeeper", "zk.example:2181", "--bootstrap", REFUSED))
    assert (
        "librdkafka refused the Kafka client configuration (_INVALID_ARG: "
        'No such configuration property: "no.such.property"' in stderr
    )
    assert "kafka.extra_config (BKAUDIT_KAFKA__EXTRA_CONFIG)" in stderr


def test_watch_with_sasl_plain_and_no_username(cli, monkeypatch):
    with_secrets(monkeypatch)
    monkeypatch.delenv("BKAUDIT_KAFKA__SASL_USERNAME")
    monkeypatch.setattr("connectors.zookeeper.watcher.KazooClient", ReachableZooKeeper)
    stderr = one_line_error(cli("watch", "--zookeeper", "zk.example:2181", "--bootstrap", REFUSED))
    assert "librdkafka refused the Kafka client configuration" in stderr
    assert "sasl.username and sasl.password must be set" in stderr


def test_watch_with_the_metrics_port_taken(cli, monkeypatch, taken_port):
    host, port = taken_port
    monkeypatch.setenv("BKAUDIT_WATCHER__METRICS_HOST", host)
    # ZooKeeper is unreachable too: the port is checked first, so its error is the one reported.
    stderr = one_line_error(cli("watch", "--zookeeper", REFUSED, "--metrics-port", str(port)))
    assert f"cannot serve metrics on {host}:{port}: the port is already in use" in stderr
    assert "watcher.metrics_port (BKAUDIT_WATCHER__METRICS_PORT)" in stderr


def test_watch_as_a_process_prints_one_error_line_and_no_traceback(tmp_path):
    """The real entry point, in its own process: what an operator sees (log lines above the error)."""
    env = {"PATH": "/usr/bin:/bin", "BKAUDIT_ZOOKEEPER__CONNECT_TIMEOUT_S": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "bkaudit.cli.main", "watch", "--zookeeper", REFUSED],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("bkaudit: ")]
    assert errors == [done.stderr.splitlines()[-1]]
    assert errors[0].startswith(f"bkaudit: ZooKeeper at {REFUSED}: no connection within 1 s")


# ------------------------------------------------------------------------------------------------ stream


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """A stand-in Spark session: the job's start-up checks (Kafka, metrics) come before any query."""
    listeners: list[Any] = []
    session = SimpleNamespace(streams=SimpleNamespace(addListener=listeners.append))
    monkeypatch.setattr("streaming.session.build_spark_session", lambda *_args, **_kwargs: session)
    return listeners


@pytest.mark.parametrize("options", [(), ("--available-now",)])
def test_stream_with_kafka_unreachable(cli, monkeypatch, no_spark, options):
    with_secrets(monkeypatch)
    monkeypatch.setenv("BKAUDIT_KAFKA__BOOTSTRAP_SERVERS", REFUSED)
    started = time.monotonic()
    stderr = one_line_error(cli("stream", *options))
    assert time.monotonic() - started < 10
    assert f"Kafka at {REFUSED}: creating topic 'bkaudit.changes' failed" in stderr
    assert "kafka.bootstrap_servers (BKAUDIT_KAFKA__BOOTSTRAP_SERVERS)" in stderr


def test_stream_with_the_metrics_port_taken(cli, monkeypatch, no_spark, taken_port):
    _host, port = taken_port
    monkeypatch.setenv("BKAUDIT_STREAM__METRICS_PORT", str(port))
    # Kafka answers (stand-in): the job then reaches its metrics server.
    monkeypatch.setattr("streaming.job.ensure_topics", lambda _settings: 4)
    stderr = one_line_error(cli("stream"))
    assert f"cannot serve metrics on 0.0.0.0:{port}: the port is already in use" in stderr
    assert "stream.metrics_port (BKAUDIT_STREAM__METRICS_PORT)" in stderr
    assert len(no_spark) == 1  # it got that far


# ------------------------------------------------------------------------------------------------ pieces


def test_kafka_errors_scrub_passwords_from_the_broker_text():
    settings = KafkaSettings(
        bootstrap_servers="k1:9092", security_protocol="SASL_SSL", sasl_password=KAFKA_PASSWORD
    )
    with pytest.raises(ServiceError) as caught, kafka_errors(settings, "opening the producer"):
        raise KafkaException(
            KafkaError(KafkaError._AUTHENTICATION, f"authentication failed for bkaudit/{KAFKA_PASSWORD}")
        )
    message = str(caught.value)
    assert KAFKA_PASSWORD not in message
    assert "authentication failed for bkaudit/***" in message
    assert message.startswith("Kafka at k1:9092: opening the producer failed (_AUTHENTICATION: ")


def test_kafka_errors_leave_other_exceptions_alone():
    with pytest.raises(ZeroDivisionError), kafka_errors(KafkaSettings(), "anything"):
        raise ZeroDivisionError()


# ------------------------------------------------------------------------------------------ operator errors


@pytest.mark.parametrize(
    ("connect", "why"),
    [
        ("not-a-host:xx", "port 'xx' is not a number from 1 to 65535"),
        ("zk1:2181:2182", "write an IPv6 address in brackets"),
        ("zk1:99999", "port '99999' is not a number from 1 to 65535"),
        ("zk1:2181,", "has an empty host"),
        ("", "has an empty host"),
        ("zk 1:2181", "'zk 1' is not a host name or address"),
        ("zk1:2181/pulsar/", "is not a ZooKeeper path"),
    ],
)
def test_watch_with_a_malformed_zookeeper_connect_string(cli, monkeypatch, connect, why):
    with_secrets(monkeypatch)
    stderr = one_line_error(cli("watch", "--zookeeper", connect))
    assert stderr.startswith("bkaudit: invalid settings: zookeeper.connect: ")
    assert why in stderr


def test_watch_with_a_malformed_rack_map_zookeeper(cli):
    stderr = one_line_error(cli("watch", "--zookeeper", REFUSED, "--rack-map-zookeeper", "zk:port"))
    assert "watcher: " in stderr and "port 'port' is not a number" in stderr


def test_watch_with_a_malformed_kafka_bootstrap_list(cli, monkeypatch):
    with_secrets(monkeypatch)
    # Refused at settings time, before the (unreachable) ZooKeeper is tried.
    stderr = one_line_error(cli("watch", "--zookeeper", REFUSED, "--bootstrap", "k1:9092,not-a-host:xx"))
    assert "kafka.bootstrap_servers: " in stderr and "'not-a-host:xx' is not host[:port]" in stderr


def test_stream_with_a_malformed_kafka_bootstrap_list(cli, monkeypatch, no_spark):
    monkeypatch.setenv("BKAUDIT_KAFKA__BOOTSTRAP_SERVERS", "kafka:ninety")
    stderr = one_line_error(cli("stream"))
    assert "kafka.bootstrap_servers: " in stderr and "port 'ninety'" in stderr


@pytest.mark.parametrize("options", [(), ("--available-now",)])
def test_stream_with_an_unwritable_checkpoint_root(cli, monkeypatch, no_spark, tmp_path, options):
    blocker = tmp_path / "a-file"  # a file where a directory must be (permissions do not stop root)
    blocker.write_text("")
    monkeypatch.setenv("BKAUDIT_CHECKPOINT_ROOT", str(blocker / "checkpoints"))
    stderr = one_line_error(cli("stream", *options))
    assert "checkpoint_root (BKAUDIT_CHECKPOINT_ROOT) is not a writable directory: " in stderr
    assert f"{blocker}/checkpoints/bkaudit-stream: Not a directory" in stderr
    assert not no_spark  # refused before the Spark session was asked for


def test_stream_with_an_unwritable_lakehouse_root(cli, monkeypatch, no_spark, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("BKAUDIT_LAKEHOUSE_ROOT", str(blocker / "lakehouse"))
    monkeypatch.setattr("streaming.job.ensure_topics", lambda _settings: 4)  # Kafka answers (stand-in)
    stderr = one_line_error(cli("stream"))
    assert (
        f"lakehouse_root (BKAUDIT_LAKEHOUSE_ROOT) is not a writable directory: {blocker}/lakehouse" in stderr
    )


def test_stream_with_its_checkpoint_on_an_object_store_needs_the_zookeeper_lease(
    cli, monkeypatch, no_spark, tmp_path
):
    monkeypatch.setenv("BKAUDIT_LAKEHOUSE_ROOT", str(tmp_path / "lakehouse"))
    monkeypatch.setenv("BKAUDIT_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("BKAUDIT_OBJECT_STORE__CHECKPOINT_URL", "s3://audit/checkpoints")
    monkeypatch.setenv("BKAUDIT_OBJECT_STORE__SECRET_ACCESS_KEY", KAFKA_PASSWORD)
    monkeypatch.setattr("streaming.job.ensure_topics", lambda _settings: 4)  # Kafka answers (stand-in)
    stderr = one_line_error(cli("stream"))
    assert "object_store.checkpoint_url needs stream.lease = zookeeper" in stderr
    assert not (tmp_path / "checkpoints").exists()  # refused before anything was created


@pytest.mark.parametrize(
    ("name", "text", "why"),
    [
        ("settings.toml", "kafka = [\n", "unreadable (Invalid value"),
        ("settings.yaml", "kafka: [\n", "unreadable (while parsing a flow node"),
        ("settings.json", "{", "unreadable ("),
        ("missing.toml", None, "no such file"),
    ],
)
@pytest.mark.parametrize("command", [("watch", "--zookeeper", REFUSED), ("stream",)])
def test_a_config_file_that_does_not_parse(cli, monkeypatch, no_spark, tmp_path, name, text, why, command):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    monkeypatch.setenv("BKAUDIT_CONFIG_FILE", str(path))
    stderr = one_line_error(cli(*command))
    assert stderr.startswith(f"bkaudit: BKAUDIT_CONFIG_FILE={path}: ") and why in stderr


def test_watch_with_an_unknown_log_level(cli):
    stderr = one_line_error(cli("watch", "--zookeeper", REFUSED, "--log-level", "LOUD"))
    assert "--log-level must be one of DEBUG, INFO, WARNING, ERROR, got 'LOUD'" in stderr


def test_a_malformed_connect_string_as_a_process(tmp_path):
    """The real entry point: exactly one line on stderr (nothing logged before it), exit 2."""
    done = subprocess.run(
        [sys.executable, "-m", "bkaudit.cli.main", "watch", "--zookeeper", "not-a-host:xx"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("bkaudit: invalid settings: zookeeper.connect: ")


def test_dev_up_with_an_unwritable_state_dir(cli, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("BKAUDIT_DEV__STATE_DIR", str(blocker / "state"))
    stderr = one_line_error(cli("dev", "up"))
    assert f"dev.state_dir (BKAUDIT_DEV__STATE_DIR) is not a writable directory: {blocker}/state" in stderr


def _cut_short(table: Path) -> Path:
    """Cut the table's newest commit in half, as a full disk or a half copy leaves it; returns it."""
    newest = sorted((table / "_delta_log").glob("*.json"))[-1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    return newest


def test_stream_on_a_lakehouse_with_a_commit_cut_short_names_the_table_and_the_file(
    cli, monkeypatch, no_spark, tmp_path
):
    from connectors.delta.tables import ensure_tables

    lakehouse = tmp_path / "lakehouse"
    ensure_tables(lakehouse)
    damaged = _cut_short(lakehouse / "ledgers")
    monkeypatch.setenv("BKAUDIT_LAKEHOUSE_ROOT", str(lakehouse))
    monkeypatch.setenv("BKAUDIT_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    stderr = one_line_error(cli("stream"))
    assert f"the Delta table 'ledgers' is damaged: {damaged} is cut short or corrupt" in stderr
    assert "A Delta table is damaged or gone" in stderr
    assert not no_spark  # refused before the Spark session was asked for


def test_stream_never_recreates_a_table_it_created_and_that_is_gone(cli, monkeypatch, no_spark, tmp_path):
    import shutil

    from connectors.delta.tables import ensure_tables

    lakehouse = tmp_path / "lakehouse"
    ensure_tables(lakehouse)
    shutil.rmtree(lakehouse / "violations")
    monkeypatch.setenv("BKAUDIT_LAKEHOUSE_ROOT", str(lakehouse))
    monkeypatch.setenv("BKAUDIT_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    stderr = one_line_error(cli("stream"))
    assert f"the Delta table 'violations' is gone from {lakehouse}" in stderr
    assert not (lakehouse / "violations").exists()


def test_query_on_a_commit_cut_short_names_the_file(cli, tmp_path):
    from connectors.delta.queries import write_example_lakehouse

    lakehouse = Path(write_example_lakehouse(str(tmp_path / "lakehouse")))
    damaged = _cut_short(lakehouse / "open_alerts")
    stderr = one_line_error(cli("query", "alerts", "--lakehouse", str(lakehouse)))
    assert f"cannot read the Delta table 'open_alerts' under {lakehouse}: it is damaged: {damaged}" in stderr
