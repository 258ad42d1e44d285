"""Settings: env prefix and nesting, config files, secrets masked, bad values as one ConfigError line."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from connectors.kafka.client_config import admin_config, consumer_config, holds_tails, producer_config
from core.errors import ConfigError
from core.settings import CONFIG_FILE_ENV, Settings, load_settings
from streaming.session import ROCKSDB_PROVIDER, spark_conf


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):

    for key in list(os.environ):
        if key.startswith("BKAUDIT_"):
            monkeypatch.delenv(key)


def test_defaults_are_the_embedded_development_setup():
    settings = load_settings()
    assert settings.kafka.changes_topic == "bkaudit.changes"
    assert settings.kafka.alerts_topic == "bkaudit.alerts"
    assert settings.zookeeper.ledgers_root == "/ledgers"
    assert str(settings.lakehouse_root) == "lakehouse"


def test_environment_variables_with_prefix_and_nesting_override(monkeypatch):
    monkeypatch.setenv("BKAUDIT_KAFKA__BOOTSTRAP_SERVERS", "k1:9092,k2:9092")
    monkeypatch.setenv("BKAUDIT_LAKEHOUSE_ROOT", "/data/lh")
    monkeypatch.setenv("BKAUDIT_DEV__ZOOKEEPER_PORT", "2182")
    settings = load_settings()
    assert settings.kafka.bootstrap_servers == "k1:9092,k2:9092"
    assert str(settings.lakehouse_root) == "/data/lh"
    assert settings.dev.zookeeper_port == 2182


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("c.toml", '[kafka]\nbootstrap_servers = "file:9092"\nsasl_password = "pw-from-file"\n'),
        ("c.yaml", "kafka:\n  bootstrap_servers: file:9092\n  sasl_password: pw-from-file\n"),
        (
            "c.json",
            json.dumps({"kafka": {"bootstrap_servers": "file:9092", "sasl_password": "pw-from-file"}}),
        ),
    ],
)
def test_config_file_is_read_and_environment_wins(monkeypatch, tmp_path, name, body):
    path = tmp_path / name
    path.write_text(body)
    monkeypatch.setenv(CONFIG_FILE_ENV, str(path))
    settings = load_settings()
    assert settings.kafka.bootstrap_servers == "file:9092"
    assert settings.kafka.sasl_password is not None
    assert settings.kafka.sasl_password.get_secret_value() == "pw-from-file"
    monkeypatch.setenv("BKAUDIT_KAFKA__BOOTSTRAP_SERVERS", "env:9092")
    assert load_settings().kafka.bootstrap_servers == "env:9092"


def test_secrets_never_show_in_repr_or_json_dump():
    settings = Settings(kafka={"sasl_password": "hunter2"}, zookeeper={"auth_password": "zk-secret"})
    for text in (repr(settings), str(settings), settings.model_dump_json()):
        assert "hunter2" not in text
        assert "zk-secret" not in text
    # ...but the client builder gets the real value.
    config = producer_config(Settings(kafka={"sasl_mechanism": "PLAIN", "sasl_password": "hunter2"}).kafka)
    assert config["sasl.password"] == "hunter2"


def test_security_settings_map_to_librdkafka_properties():
    kafka = Settings(
        kafka={
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "auditor",
            "sasl_password": "s-pw",
            "ssl_cafile": "/etc/ca.pem",
            "ssl_certfile": "/etc/client.pem",
            "ssl_keyfile": "/etc/client.key",
            "ssl_password": "k-pw",
        }
    ).kafka
    for config in (producer_config(kafka), consumer_config(kafka, None), admin_config(kafka)):
        assert {name: config[name] for name in SECURITY_PROPERTIES} == {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "auditor",
            "sasl.password": "s-pw",
            "ssl.ca.location": "/etc/ca.pem",
            "ssl.certificate.location": "/etc/client.pem",
            "ssl.key.location": "/etc/client.key",
            "ssl.key.password": "k-pw",
        }


SECURITY_PROPERTIES = (
    "security.protocol",
    "sasl.mechanism",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
)


def test_extra_config_passes_any_librdkafka_property_and_masks_secret_looking_ones():
    settings = Settings(
        kafka={
            "extra_config": {
                "sasl.oauthbearer.client.secret": "oauth-s3cret",
                "ssl.keystore.password": "ks-s3cret",
                "some.token": "tok-s3cret",
                "linger.ms": "7",
            }
        }
    )
    for text in (repr(settings), str(settings), settings.model_dump_json()):
        assert "s3cret" not in text
    assert '"linger.ms":"7"' in settings.model_dump_json()
    config = producer_config(settings.kafka)
    assert config["sasl.oauthbearer.client.secret"] == "oauth-s3cret"
    assert config["ssl.keystore.password"] == "ks-s3cret"
    assert config["linger.ms"] == "7"  # it overrides bkaudit's own value
    assert consumer_config(settings.kafka, None)["some.token"] == "tok-s3cret"


def test_extra_config_from_the_environment_is_json(monkeypatch):
    monkeypatch.setenv(
        "BKAUDIT_KAFKA__EXTRA_CONFIG", '{"sasl.oauthbearer.method": "oidc", "fetch.wait.max.ms": "50"}'
    )
    kafka = load_settings().kafka
    assert admin_config(kafka)["fetch.wait.max.ms"] == "50"
    assert admin_config(kafka)["sasl.oauthbearer.method"] == "oidc"
    assert "oidc" not in repr(kafka)


def test_bad_values_give_one_config_error_line(monkeypatch):
    monkeypatch.setenv("BKAUDIT_DEV__ZOOKEEPER_PORT", "not-a-port")
    with pytest.raises(ConfigError) as raised:
        load_settings()
    assert "dev.zookeeper_port" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_missing_or_unknown_config_file_is_a_config_error(monkeypatch, tmp_path):
    monkeypatch.setenv(CONFIG_FILE_ENV, str(tmp_path / "absent.toml"))
    with pytest.raises(ConfigError, match="no such file"):
        load_settings()
    other = tmp_path / "c.ini"
    other.write_text("x")
    monkeypatch.setenv(CONFIG_FILE_ENV, str(other))
    with pytest.raises(ConfigError, match=r"\.toml"):
        load_settings()


def test_ledgers_root_must_be_absolute():
    with pytest.raises(ConfigError, match="ledgers_root"):
        load_settings(zookeeper={"ledgers_root": "ledgers"})


def test_kafka_client_defaults_work_around_tansu_and_keep_order():
    settings = load_settings().kafka
    producer = producer_config(settings)
    # Batching, with each burst ending in one-record batches (Tansu's high watermark counts only the first
    # record of a partition's last batch).
    assert producer["batch.size"] > 0 and holds_tails(settings)
    assert not holds_tails(settings.model_copy(update={"single_record_tails": False}))
    assert producer["acks"] == "all"
    assert producer["max.in.flight.requests.per.connection"] == 1
    assert producer["enable.idempotence"] is False  # Tansu has no idempotent producer support
    assert producer["partitioner"] == "murmur2_random"  # Java's default partitioner
    consumer = consumer_config(settings, "g")
    assert consumer["session.timeout.ms"] <= 10_000  # Tansu's first join waits for the full timeout
    assert consumer["enable.auto.commit"] is False
    # Production overrides through settings, one place.
    tuned = producer_config(
        settings.model_copy(update={"producer_batch_size": 65536, "producer_linger_ms": 10})
    )
    assert (tuned["batch.size"], tuned["linger.ms"]) == (65536, 10)


def test_spark_conf_sets_what_the_job_needs():
    conf = spark_conf(load_settings().spark, for_tests=True)
    assert conf["spark.sql.streaming.stateStore.providerClass"] == ROCKSDB_PROVIDER
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert conf["spark.sql.execution.arrow.pyspark.enabled"] == "true"
    assert conf["spark.ui.enabled"] == "false"
    assert int(conf["spark.sql.streaming.numRecentProgressUpdates"]) >= 1000
    extra = spark_conf(
        load_settings(spark={"extra_conf": {"spark.ui.enabled": "true"}}).spark, for_tests=True
    )
    assert extra["spark.ui.enabled"] == "true"


def test_publish_processes_is_deprecated_with_a_clear_message(caplog):
    with caplog.at_level("WARNING", logger="core.settings"):
        settings = load_settings(stream={"publish_processes": 4})
    assert settings.stream.publish_processes == 4  # accepted (old config files still load), ignored
    assert (
        "stream.publish_processes (BKAUDIT_STREAM__PUBLISH_PROCESSES) is deprecated and ignored"
        in caplog.text
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="core.settings"):
        load_settings()
    assert "publish_processes" not in caplog.text


def test_extra_config_secrets_stay_out_of_help_and_the_effective_settings(cli, monkeypatch):
    from bkaudit.settings_docs import effective_settings_json

    monkeypatch.setenv("BKAUDIT_KAFKA__EXTRA_CONFIG", '{"sasl.oauthbearer.client.secret": "oauth-9922"}')
    monkeypatch.setenv("BKAUDIT_KAFKA__SASL_PASSWORD", "sasl-9911")
    text = effective_settings_json(load_settings())
    assert "oauth-9922" not in text and "sasl-9911" not in text
    assert '"sasl.oauthbearer.client.secret": "**********"' in text
    for command in ((), ("watch",), ("stream",), ("alerts", "republish")):
        result = cli(*command, "--help")
        shown = result.stdout.decode("utf-8") + result.stderr
        assert result.exit_code == 0 and "Usage" in shown
        assert "oauth-9922" not in shown and "sasl-9911" not in shown


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("c.toml", '[kafka]\nbootstrap_server = "k1:9092"\n'),
        ("c.yaml", "kafka:\n  bootstrap_server: k1:9092\n"),
        ("c.json", json.dumps({"kafka": {"bootstrap_server": "k1:9092"}})),
    ],
)
def test_an_unknown_key_inside_a_config_file_section_names_it_the_file_and_the_likely_setting(
    monkeypatch, tmp_path, name, body
):
    path = tmp_path / name
    path.write_text(body)
    monkeypatch.setenv(CONFIG_FILE_ENV, str(path))
    with pytest.raises(ConfigError) as raised:
        load_settings()
    message = str(raised.value)
    assert message == (
        "invalid settings: kafka.bootstrap_server: no such setting; did you mean kafka.bootstrap_servers? "
        f"(from config file {path})"
    )


@pytest.mark.parametrize(
    ("body", "key", "suggestion"),
    [
        ('[kafak]\nclient_id = "me"\n', "kafak", "kafka"),  # a mistyped section
        ('[stream]\napp_idd = "a"\n', "stream.app_idd", "stream.app_id"),
        ('lakehouse = "lh"\n', "lakehouse", "lakehouse_root"),  # top level
        ('[agent]\nadresses = {"b" = "h:1"}\n', "agent.adresses", "agent.addresses"),
    ],
)
def test_every_section_of_a_config_file_refuses_unknown_keys(monkeypatch, tmp_path, body, key, suggestion):
    path = tmp_path / "c.toml"
    path.write_text(body)
    monkeypatch.setenv(CONFIG_FILE_ENV, str(path))
    with pytest.raises(ConfigError) as raised:
        load_settings()
    assert f"{key}: no such setting; did you mean {suggestion}? (from config file {path})" in str(
        raised.value
    )
    assert "\n" not in str(raised.value)


def test_an_unknown_key_with_nothing_close_says_so_without_a_guess(monkeypatch, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[watcher]\nzzz = 1\n")
    monkeypatch.setenv(CONFIG_FILE_ENV, str(path))
    with pytest.raises(ConfigError, match=r"watcher\.zzz: no such setting \(from config file ") as raised:
        load_settings()
    assert "did you mean" not in str(raised.value)


def test_an_unknown_set_key_is_one_line_with_the_likely_setting(cli, restored_environment):
    result = cli("--set", "kafka.bootstrap_server=k1:9092", "config", "show")
    assert result.exit_code == 2 and result.stdout == b""
    assert result.stderr == (
        "bkaudit: --set kafka.bootstrap_server: no such setting; did you mean kafka.bootstrap_servers?\n"
    )


def test_a_malformed_set_value_names_the_key_and_set_not_the_config_file(cli, restored_environment):
    result = cli("--set", "kafka.extra_config=notjson", "config", "show")
    assert result.exit_code == 2 and result.stdout == b""
    assert result.stderr == (
        "bkaudit: invalid settings: kafka.extra_config: not JSON (Expecting value at column 1) (from --set)\n"
    )
    typed = cli("--set", "dev.zookeeper_port=x", "config", "show")
    assert typed.exit_code == 2 and typed.stderr.startswith("bkaudit: invalid settings: dev.zookeeper_port: ")
    assert typed.stderr.endswith(" (from --set)\n")


def test_a_malformed_value_names_the_variable_or_the_file_it_came_from(monkeypatch, tmp_path):
    monkeypatch.setenv("BKAUDIT_KAFKA__EXTRA_CONFIG", '{"linger.ms": ')
    with pytest.raises(ConfigError) as raised:
        load_settings()
    assert str(raised.value) == (
        "invalid settings: kafka.extra_config: not JSON (Expecting value at column 15) "
        "(from BKAUDIT_KAFKA__EXTRA_CONFIG)"
    )
    monkeypatch.delenv("BKAUDIT_KAFKA__EXTRA_CONFIG")
    path = tmp_path / "c.toml"
    path.write_text('[kafka]\nextra_config = "notjson"\n')
    monkeypatch.setenv(CONFIG_FILE_ENV, str(path))
    with pytest.raises(ConfigError) as raised:
        load_settings()
    assert str(raised.value) == (
        f"invalid settings: kafka.extra_config: Input should be a valid dictionary (from config file {path})"
    )
    monkeypatch.setenv("BKAUDIT_DEV__ZOOKEEPER_PORT", "x")  # the variable, not the file, gave this one
    with pytest.raises(ConfigError, match=r"dev\.zookeeper_port: .* \(from BKAUDIT_DEV__ZOOKEEPER_PORT\)"):
        load_settings()


SAMPLE_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "bkaudit.toml"


def test_the_sample_config_file_loads_with_its_commented_keys_too(monkeypatch, tmp_path):
    monkeypatch.setenv(CONFIG_FILE_ENV, str(SAMPLE_CONFIG))
    settings = load_settings()
    assert settings.kafka.bootstrap_servers == "kafka1:9092,kafka2:9092,kafka3:9092"
    assert settings.watcher.rack_map_znode == "/bookies"
    assert settings.kafka.extra_config == {"socket.keepalive.enable": "true"}
    # The keys shown commented out are settings too: the file stays true when they are switched on.
    text = SAMPLE_CONFIG.read_text()
    switched_on = re.sub(r"^# (\w+ = )", r"\1", text, flags=re.MULTILINE)
    assert switched_on.count("\n") == text.count("\n") and switched_on != text
    path = tmp_path / "bkaudit.toml"
    path.write_text(switched_on)
    monkeypatch.setenv(CONFIG_FILE_ENV, str(path))
    assert load_settings().kafka.sasl_mechanism == "SCRAM-SHA-512"
