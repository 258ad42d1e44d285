"""Real services for tests: embedded ZooKeeper + broker in a private directory, plus fault helpers.

Example:
    >>> import tempfile
    >>> harness = ServiceHarness(tempfile.mkdtemp())
    >>> harness.running
    False
"""

from __future__ import annotations

import itertools
import os
import uuid
from pathlib import Path

from kazoo.client import KazooClient

from bkaudit.sim.bookie import expire_session
from connectors.bookkeeper import RealBookKeeperCluster
from connectors.devcluster import DevCluster
from core.settings import DevSettings, KafkaSettings


class ServiceHarness:
    """Starts and owns one embedded ZooKeeper and one broker for a test session.

    Example:
        >>> # harness = ServiceHarness("/tmp/h"); harness.start()
        >>> # client = harness.kazoo_client(harness.new_chroot())
        >>> # harness.expire_session(client)   # the session is really expired by the server
    """

    def __init__(
        self, state_dir: str | Path, *, zookeeper_heap: str = "1g", broker: str | None = None
    ) -> None:
        self.state_dir = Path(state_dir)
        # The broker: ``broker``, else $BKAUDIT_DEV__BROKER (as for `bkaudit dev up`), else the default.
        choice = {"broker": broker or os.environ.get("BKAUDIT_DEV__BROKER") or DevSettings().broker}
        self.cluster = DevCluster(
            DevSettings.model_validate(
                {"state_dir": self.state_dir, "zookeeper_heap": zookeeper_heap, **choice}
            )
        )
        self._counter = itertools.count()
        self.running = False

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        self.cluster.up()
        self.running = True

    def stop(self) -> None:
        self.cluster.down()
        self.running = False

    @property
    def zookeeper_address(self) -> str:
        return self.cluster.zookeeper.address

    @property
    def kafka_bootstrap(self) -> str:
        return self.cluster.broker.bootstrap

    @property
    def broker_kind(self) -> str:
        """Which broker runs: ``tansu`` or ``kafka`` (a real Apache Kafka node)."""
        return self.cluster.settings.broker

    def kafka_settings(self, **overrides: object) -> KafkaSettings:
        """Kafka settings pointing at the embedded broker, with unique topic names for one test."""
        suffix = self._unique("t")
        values: dict[str, object] = {
            "bootstrap_servers": self.kafka_bootstrap,
            "changes_topic": f"bkaudit.changes.{suffix}",
            "alerts_topic": f"bkaudit.alerts.{suffix}",
            "feedback_topic": f"bkaudit.feedback.{suffix}",
            "tracked_topic": f"bkaudit.tracked.{suffix}",
            "decisions_topic": f"bkaudit.decisions.{suffix}",
            **self.cluster.kafka_client_settings(),
        }
        values.update(overrides)
        return KafkaSettings.model_validate(values)

    def _unique(self, prefix: str) -> str:
        return f"{prefix}{os.getpid()}-{next(self._counter)}-{uuid.uuid4().hex[:6]}"

    def unique_topic(self, prefix: str = "test") -> str:
        return f"{prefix}.{self._unique('t')}"

    # -- ZooKeeper -----------------------------------------------------------------------------------
    def new_chroot(self) -> str:
        """Create and return a fresh chroot path (``/test-…``) so each test sees an empty tree."""
        chroot = f"/{self._unique('test-')}"
        client = self.kazoo_client()
        try:
            client.ensure_path(chroot)
        finally:
            client.stop()
            client.close()
        return chroot

    def zookeeper_hosts(self, chroot: str = "") -> str:
        return f"{self.zookeeper_address}{chroot}"

    def kazoo_client(self, chroot: str = "", *, timeout: float = 10.0, **kwargs: object) -> KazooClient:
        """A started kazoo client on the embedded ZooKeeper (optionally inside ``chroot``)."""
        client = KazooClient(hosts=self.zookeeper_hosts(chroot), timeout=timeout, **kwargs)
        client.start(timeout=timeout)
        return client

    def expire_session(self, client: KazooClient, timeout: float = 30.0) -> None:
        """Make the server expire ``client``'s session, the way a long network partition would
        (:func:`bkaudit.sim.bookie.expire_session`); returns once ``client`` is connected again."""
        expire_session(client, self.zookeeper_address, timeout)

    def restart_zookeeper(self, downtime: float = 0.0) -> None:
        """Stop ZooKeeper and start it again (same port, same data); clients see a disconnection."""
        self.cluster.zookeeper.restart(downtime=downtime)

    def stop_zookeeper(self) -> None:
        self.cluster.zookeeper.stop()

    def start_zookeeper(self) -> None:
        self.cluster.zookeeper.start()

    # -- broker --------------------------------------------------------------------------------------
    def stop_broker(self, *, lose_data: bool = False) -> None:
        """Stop the broker; with ``lose_data`` every topic and record is gone at :meth:`start_broker` (a
        cluster that lost its data). Tansu loses them at every restart; a real Kafka broker keeps them on
        disk unless ``lose_data``."""
        self.cluster.broker.stop()
        if lose_data:
            self.cluster.broker.discard_data()

    def start_broker(self) -> None:
        self.cluster.broker.start()

    # -- real BookKeeper ----------------------------------------------------------------------------
    def real_bookkeeper(self, bookies: int = 3, racks: int = 2, **options: object) -> RealBookKeeperCluster:
        """Start a real BookKeeper cluster (``bookies`` processes in ``racks`` racks) on the harness's
        ZooKeeper under a fresh prefix (``/bk-…/ledgers``, rack map ``/bk-…/bookies``); stop it with
        its ``stop()``."""
        prefix = f"/{self._unique('bk-')}"
        cluster = RealBookKeeperCluster(
            self.state_dir / prefix.lstrip("/"),
            self.zookeeper_address,
            bookies=bookies,
            racks=racks,
            prefix=prefix,
            **options,  # type: ignore[arg-type]
        )
        cluster.start()
        return cluster

    # -- diagnostics ---------------------------------------------------------------------------------
    def log_tails(self, lines: int = 60) -> dict[str, str]:
        return {
            "zookeeper": self.cluster.zookeeper.log_tail(lines),
            "broker": self.cluster.broker.log_tail(lines),
        }
