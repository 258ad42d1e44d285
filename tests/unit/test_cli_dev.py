"""``--dev`` on every command that talks to services: the addresses of ``bkaudit dev up``, or one line."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bkaudit.cli.live import DEV_VARIABLES, admin_reader, use_dev_services
from connectors.devcluster import DevCluster
from core.settings import load_settings

#: Every command that reads ZooKeeper or Kafka.
SERVICE_COMMANDS = [
    ["status"],
    ["stream"],
    ["watch"],
    ["alerts", "tail"],
    ["alerts", "republish"],
    ["bookies", "list"],
    ["metadata", "show", "7"],
]


@pytest.fixture
def no_address_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever ``--dev`` writes into the environment is undone after the test. (``delenv`` of an absent
    variable records nothing to undo; ``setenv`` first makes the absence the state restored.)"""
    for variable in [*DEV_VARIABLES.values(), "BKAUDIT_KAFKA__SINGLE_RECORD_TAILS"]:
        monkeypatch.setenv(variable, "")
        monkeypatch.delenv(variable)


@pytest.mark.parametrize("args", SERVICE_COMMANDS, ids=" ".join)
def test_dev_without_dev_up_running_is_one_line_naming_what_is_down(
    cli: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    no_address_variables: None,
    args: list[str],
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("BKAUDIT_DEV__STATE_DIR", str(state))
    result = cli(*args, "--dev")
    assert result.exit_code == 2
    assert result.stderr == (
        f"bkaudit: --dev: the zookeeper and the kafka of `bkaudit dev up` are not running "
        f"(state dir {state.absolute()}); start them with `bkaudit dev up`\n"
    )


@pytest.fixture
def dev_up_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """`bkaudit dev up`'s ZooKeeper and broker reported running at fixed addresses."""
    monkeypatch.setattr(
        DevCluster,
        "status",
        lambda self: {"zookeeper": {"running": True}, "kafka": {"running": True}, "state_dir": "s"},
    )
    monkeypatch.setattr(
        DevCluster, "addresses", lambda self: {"zookeeper": "127.0.0.1:21810", "kafka": "127.0.0.1:19092"}
    )


def test_dev_points_zookeeper_and_kafka_at_dev_up_and_a_commands_own_flag_still_wins(
    no_address_variables: None, dev_up_running: None
) -> None:
    assert use_dev_services(True) == {
        "BKAUDIT_ZOOKEEPER__CONNECT": "127.0.0.1:21810",
        "BKAUDIT_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:19092",
    }
    settings = load_settings()
    assert (settings.zookeeper.connect, settings.kafka.bootstrap_servers) == (
        "127.0.0.1:21810",
        "127.0.0.1:19092",
    )
    assert admin_reader("zk9:2181/bk", None).settings.connect == "zk9:2181/bk"


def test_dev_on_a_real_kafka_broker_sends_without_one_record_tails(
    monkeypatch: pytest.MonkeyPatch, no_address_variables: None, dev_up_running: None
) -> None:
    # The hold of each partition's last record is for the embedded broker's high watermark; on real Kafka
    # it only delays every burst's last records by a flush.
    monkeypatch.setenv("BKAUDIT_DEV__BROKER", "kafka")
    assert use_dev_services(True)["BKAUDIT_KAFKA__SINGLE_RECORD_TAILS"] == "false"
    assert load_settings().kafka.single_record_tails is False


def test_one_service_down_is_named_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_address_variables: None
) -> None:
    monkeypatch.setattr(
        DevCluster,
        "status",
        lambda self: {"zookeeper": {"running": True}, "kafka": {"running": False}, "state_dir": "s"},
    )
    with pytest.raises(
        Exception, match=r"^--dev: the kafka of `bkaudit dev up` is not running \(state dir s\)"
    ):
        use_dev_services(True)


def test_the_addresses_dev_set_are_gone_after_the_test_that_set_them() -> None:
    """Runs after the test above in the same process: a variable left behind would point every later
    test of this worker at the fake addresses (it did, and failed four status tests)."""
    assert not any(variable in os.environ for variable in DEV_VARIABLES.values())
