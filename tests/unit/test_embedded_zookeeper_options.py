"""The embedded ZooKeeper's JVM options: G1 by default, replaced by ``BKAUDIT_ZOOKEEPER_JAVA_OPTS`` (the
suite gives its many short-lived servers C1 only and the serial collector)."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.zookeeper.embedded import MAIN_CLASS, EmbeddedZooKeeper


def launched_argv(zookeeper: EmbeddedZooKeeper, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    started: list[list[str]] = []
    monkeypatch.setattr(zookeeper._process, "start", started.append)
    monkeypatch.setattr(zookeeper, "_wait_ready", lambda timeout: None)
    monkeypatch.setattr(zookeeper, "is_running", lambda: False)
    zookeeper.start()
    (argv,) = started
    return argv[: argv.index(MAIN_CLASS)]


def test_the_default_is_g1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BKAUDIT_ZOOKEEPER_JAVA_OPTS", raising=False)
    argv = launched_argv(EmbeddedZooKeeper(tmp_path, classpath="x.jar"), monkeypatch)
    assert "-XX:+UseG1GC" in argv


def test_the_environment_replaces_the_tuning_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BKAUDIT_ZOOKEEPER_JAVA_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    argv = launched_argv(EmbeddedZooKeeper(tmp_path, classpath="x.jar"), monkeypatch)
    assert "-XX:+UseSerialGC" in argv and "-XX:TieredStopAtLevel=1" in argv
    assert "-XX:+UseG1GC" not in argv  # two collectors would stop the JVM at start
