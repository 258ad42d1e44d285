"""The real Kafka broker's files and command lines (pure: nothing starts), and how the setting picks it."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from bkaudit.testing.harness import ServiceHarness
from connectors.devcluster import DevCluster
from connectors.kafka.embedded import EmbeddedBroker
from connectors.kafka.kafka_broker import (
    FAST_START_JVM_OPTIONS,
    KafkaBroker,
    archive_options,
    bootstrap_template,
    class_archive,
    failure_reason,
    format_argv,
    jvm_argv,
    log4j2_properties,
    meta_properties,
    new_cluster_id,
    server_argv,
    server_properties,
)
from core.settings import DevSettings, Settings


def _properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {key: value for key, value in pairs}


def test_server_properties_describe_one_combined_node_on_loopback():
    props = _properties(server_properties(19092, 19093, Path("/state/data")))
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == f"{props['node.id']}@127.0.0.1:19093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["log.dirs"] == "/state/data"


def test_server_properties_fit_one_node_and_the_tests_expectations():
    props = _properties(server_properties(1, 2, Path("/d")))
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
        "default.replication.factor",
    ):
        assert props[key] == "1", key
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["auto.create.topics.enable"] == "true"  # a client's metadata request creates, as on Tansu
    assert props["num.partitions"] == "4"  # Tansu's default for auto-created topics


def test_extra_properties_override_and_add():
    props = _properties(
        server_properties(1, 2, Path("/d"), num_partitions=2, extra={"num.partitions": "7", "a.b": "c"})
    )
    assert props["num.partitions"] == "7"
    assert props["a.b"] == "c"


def test_log4j2_writes_to_standard_output_with_chatty_loggers_at_warn():
    text = log4j2_properties()
    assert "appender.out.type = Console" in text
    assert "logger.q0.name = state.change.logger" in text
    assert "logger.q0.level = WARN" in text


def test_jvm_argv_carries_heap_marker_log_config_and_classpath():
    argv = jvm_argv("/usr/bin/java", "256m", "/jars/kafka/*", Path("/s"), "kafka-/s")
    assert argv[0] == "/usr/bin/java"
    assert "-Xmx256m" in argv
    assert "-Dbkaudit.service=kafka-/s" in argv
    assert "-Dlog4j2.configurationFile=/s/log4j2.properties" in argv
    assert argv[-2:] == ["-cp", "/jars/kafka/*"]
    assert set(FAST_START_JVM_OPTIONS) <= set(argv)


def test_format_and_server_argv():
    prefix = ["java", "-cp", "x"]
    assert format_argv(prefix, "CID", Path("/s/server.properties")) == [
        *prefix,
        "kafka.tools.StorageTool",
        "format",
        "-t",
        "CID",
        "-c",
        "/s/server.properties",
        "--ignore-formatted",
    ]
    assert server_argv(prefix, Path("/s/server.properties")) == [
        *prefix,
        "kafka.Kafka",
        "/s/server.properties",
    ]


def test_cluster_id_is_sixteen_random_bytes_in_url_safe_base64():
    first, second = new_cluster_id(), new_cluster_id()
    assert first != second
    assert len(base64.urlsafe_b64decode(first + "==")) == 16


def test_cluster_ids_never_start_with_a_dash():
    # argparse4j would take "-t -abc..." for a flag: Kafka's own Uuid.randomUuid avoids it too.
    assert not any(new_cluster_id().startswith("-") for _ in range(2000))


def test_meta_properties_are_what_the_formatter_writes_for_one_kraft_node():
    props = _properties(meta_properties("CID", "DIR"))
    assert props == {"node.id": "1", "directory.id": "DIR", "version": "1", "cluster.id": "CID"}


def test_the_bootstrap_template_is_named_after_the_jars(tmp_path: Path):
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "kafka_2.13-4.1.1.jar").write_bytes(b"")
    first = bootstrap_template(f"{jars}/*", tmp_path / "state")
    assert first.parent == jars
    (jars / "kafka_2.13-4.1.1.jar").rename(jars / "kafka_2.13-4.2.0.jar")
    assert bootstrap_template(f"{jars}/*", tmp_path / "state") != first


def test_class_archive_lives_beside_writable_jars_else_in_the_state_dir(tmp_path: Path):
    jars = tmp_path / "jars"
    jars.mkdir()
    beside = class_archive("/usr/bin/java", f"{jars}/*", tmp_path / "state")
    assert beside.parent == jars
    assert class_archive("/usr/bin/java", "/a.jar:/b.jar", tmp_path / "state").parent == tmp_path / "state"
    options, pending = archive_options(beside, "7")
    assert options == (f"-XX:ArchiveClassesAtExit={pending}",)
    beside.write_bytes(b"archive")
    assert archive_options(beside, "7") == ((f"-XX:SharedArchiveFile={beside}",), None)


def test_failure_reason_prefers_the_first_error_with_its_exception():
    log = "\n".join(
        [
            "2026 INFO [main] starting",
            "2026 ERROR [main] DataPlaneAcceptor: Unable to start acceptor for PLAINTEXT",
            "org.apache.kafka.common.KafkaException: Socket server failed to bind to 127.0.0.1:1: in use.",
            "\tat kafka.network.Acceptor.openServerSocket(SocketServer.scala:1)",
            "2026 ERROR [main] BrokerServer: Fatal error during broker startup",
        ]
    )
    reason = failure_reason(log)
    assert reason is not None
    assert reason.endswith(
        "Unable to start acceptor for PLAINTEXT: org.apache.kafka.common.KafkaException: "
        "Socket server failed to bind to 127.0.0.1:1: in use."
    )


def test_recorded_ports_and_cluster_id_are_reused(tmp_path: Path):
    (tmp_path / "kafka-broker.json").write_text(
        json.dumps({"port": 1234, "controller_port": 1235, "cluster_id": "CID"})
    )
    broker = KafkaBroker(tmp_path)
    assert (broker.port, broker.controller_port, broker.cluster_id) == (1234, 1235, "CID")
    assert broker.bootstrap == "127.0.0.1:1234"
    assert not broker.is_running()


def test_the_dev_setting_picks_the_broker(tmp_path: Path):
    assert DevSettings().broker == "tansu"
    assert isinstance(DevCluster(DevSettings(state_dir=tmp_path)).broker, EmbeddedBroker)
    cluster = DevCluster(DevSettings(state_dir=tmp_path, broker="kafka", kafka_heap="300m"))
    assert isinstance(cluster.broker, KafkaBroker)
    assert cluster.broker.state_dir == tmp_path.absolute() / "kafka"
    assert cluster.broker.heap == "300m"


def test_the_environment_picks_the_broker_for_dev_up_and_the_harness(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("BKAUDIT_DEV__BROKER", "kafka")
    assert Settings().dev.broker == "kafka"
    assert Settings(dev={"state_dir": tmp_path}).dev.broker == "kafka"  # merged with other dev values
    assert ServiceHarness(tmp_path).broker_kind == "kafka"
    assert ServiceHarness(tmp_path, broker="tansu").broker_kind == "tansu"
    monkeypatch.setenv("BKAUDIT_DEV__BROKER", "redpanda")
    with pytest.raises(ValueError):
        ServiceHarness(tmp_path)
