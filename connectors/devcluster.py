"""The embedded default cluster: one ZooKeeper and one Kafka-protocol broker on loopback.

Used by ``bkaudit dev up | down | status``, the demo and the test harness. ``up`` is idempotent (running
services are reused), ``down`` stops only the processes whose pid files and command lines are ours, and
``status`` reports what runs where.

Example:
    >>> from core.settings import DevSettings
    >>> DevCluster(DevSettings(state_dir="/tmp/bkaudit-doc-dev")).status()["zookeeper"]["running"]
    False
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from connectors.kafka.embedded import EmbeddedBroker, tansu_binary
from connectors.zookeeper.embedded import EmbeddedZooKeeper
from core.settings import DevSettings


@dataclass
class DevCluster:
    """ZooKeeper + broker under ``settings.state_dir`` (``zookeeper/`` and ``broker/`` inside)."""

    settings: DevSettings = field(default_factory=DevSettings)

    def __post_init__(self) -> None:
        root = self.settings.state_dir.absolute()
        self.zookeeper = EmbeddedZooKeeper(
            root / "zookeeper",
            port=self.settings.zookeeper_port,
            heap=self.settings.zookeeper_heap,
            tick_ms=self.settings.zookeeper_tick_ms,
            java_bin=self.settings.java_bin,
            classpath=self.settings.zookeeper_classpath,
        )
        self.broker = EmbeddedBroker(root / "broker", port=self.settings.kafka_port)

    def up(self) -> dict[str, str]:
        """Start whatever is not running and wait for readiness; returns the two addresses.

        A missing broker package is reported before anything starts (one line, which extra to install).
        """
        timeout = self.settings.start_timeout_s
        if not self.broker.is_running():
            tansu_binary()
        self.zookeeper.start(timeout)
        try:
            self.broker.start(timeout)
        except Exception:
            self.zookeeper.stop()
            raise
        return self.addresses()

    def addresses(self) -> dict[str, str]:
        return {"zookeeper": self.zookeeper.address, "kafka": self.broker.bootstrap}

    def down(self) -> dict[str, bool]:
        """Stop both services; reports which were running."""
        return {"zookeeper": self.zookeeper.stop(), "kafka": self.broker.stop()}

    def status(self) -> dict[str, Any]:
        """What runs where: pid, address and log file of each service."""
        started = time.time()
        report: dict[str, Any] = {}
        for name, service, address in (
            ("zookeeper", self.zookeeper, self.zookeeper.address),
            ("kafka", self.broker, self.broker.bootstrap),
        ):
            pid = service.pid()
            report[name] = {
                "running": pid is not None,
                "pid": pid,
                "address": address if pid is not None else None,
                "log": str(service.log_file),
            }
        report["state_dir"] = str(self.settings.state_dir.absolute())
        report["checked_in_ms"] = round((time.time() - started) * 1000, 1)
        return report
