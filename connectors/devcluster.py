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

import logging
import socket
import ssl
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connectors.kafka.embedded import EmbeddedBroker, tansu_binary
from connectors.kafka.kafka_broker import KafkaBroker
from connectors.process import LOOPBACK, listening_ports
from connectors.tls import BOOKIE_ROLE, ServerTls
from connectors.zookeeper.embedded import EmbeddedZooKeeper
from core.errors import ConfigError
from core.logsetup import step
from core.settings import DevSettings, Settings

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from connectors.bookkeeper import BookKeeperTls, RealBookKeeperCluster


def _speaks_tls(context: ssl.SSLContext, port: int) -> bool:
    try:
        with (
            socket.create_connection((LOOPBACK, port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=LOOPBACK) as sock,
        ):
            return sock.version() is not None
    except OSError:
        return False


def _started_with_tls(root: Path) -> bool:
    """Whether the ZooKeeper under ``root`` was last configured with a TLS port only."""
    try:
        return "secureClientPort=" in (root / "zookeeper" / "zoo.cfg").read_text()
    except OSError:
        return False


def _started_with_scram(root: Path) -> bool:
    """Whether the Kafka broker under ``root`` was last configured with a SCRAM (SASL_SSL) listener."""
    try:
        return "SASL_SSL://" in (root / "kafka" / "server.properties").read_text()
    except OSError:
        return False


@dataclass
class DevCluster:
    """ZooKeeper + broker under ``settings.state_dir`` (``zookeeper/``, and ``broker/`` for Tansu or
    ``kafka/`` for a real Kafka broker, inside)."""

    settings: DevSettings = field(default_factory=DevSettings)

    def __post_init__(self) -> None:
        root = self.settings.state_dir.absolute()
        if not self.settings.tls and _started_with_tls(root):
            # `dev up --tls` ran here: status, down and --dev find its services as they are.
            self.settings = self.settings.model_copy(update={"tls": True, "broker": "kafka"})
        if self.settings.tls and not self.settings.kafka_scram and _started_with_scram(root):
            self.settings = self.settings.model_copy(update={"kafka_scram": True})
        #: With ``dev.tls``: the throwaway CA's files (``bkaudit dev up --tls`` writes them first).
        self.tls = ServerTls.in_directory(root / "tls") if self.settings.tls else None
        self.zookeeper = EmbeddedZooKeeper(
            root / "zookeeper",
            port=self.settings.zookeeper_port,
            heap=self.settings.zookeeper_heap,
            tick_ms=self.settings.zookeeper_tick_ms,
            java_bin=self.settings.java_bin,
            classpath=self.settings.zookeeper_classpath,
            tls=self.tls,
        )
        self.broker: EmbeddedBroker | KafkaBroker = self._broker()

    def _broker(self) -> EmbeddedBroker | KafkaBroker:
        """The broker ``settings.broker`` names: Tansu under ``broker/``, real Kafka under ``kafka/``."""
        root = self.settings.state_dir.absolute()
        if self.settings.broker == "kafka":
            return KafkaBroker(
                root / "kafka",
                port=self.settings.kafka_port,
                heap=self.settings.kafka_heap,
                java_bin=self.settings.java_bin,
                tls=self.tls,
                scram=self.settings.kafka_scram,
            )
        return EmbeddedBroker(root / "broker", port=self.settings.kafka_port)

    def bookkeeper(self, *, present: bool = False) -> RealBookKeeperCluster | None:
        """The real BookKeeper cluster (``bookkeeper/`` inside the state dir) when ``settings.bookkeeper`` is
        ``real`` (or, with ``present``, when that directory exists), on this ZooKeeper with ``/ledgers`` and
        the rack map ``/bookies`` at its root."""
        folder = self.settings.state_dir.absolute() / "bookkeeper"
        if self.settings.bookkeeper != "real" and not (present and folder.is_dir()):
            return None
        from connectors.bookkeeper import RealBookKeeperCluster

        started = sum(1 for _ in folder.glob("bookie-*")) if folder.is_dir() else 0
        return RealBookKeeperCluster(
            folder,
            self.zookeeper.address,
            bookies=max(self.settings.bookies, started),
            racks=self.settings.racks,
            java_bin=self.settings.java_bin,
            start_timeout_s=max(self.settings.start_timeout_s, 90.0),
            tls=self.bookkeeper_tls(),
        )

    def bookkeeper_tls(self) -> BookKeeperTls | None:
        """With ``dev.tls``: the real cluster's TLS (ZooKeeper's secure port for every JVM, bookies that
        require client certificates and authorize :data:`~connectors.tls.BOOKIE_ROLE`); else None.

        Example:
            >>> DevCluster(DevSettings(state_dir="/s")).bookkeeper_tls() is None
            True
        """
        if self.tls is None:
            return None
        from connectors.bookkeeper.tls import BookKeeperTls

        return BookKeeperTls.of(self.tls, BOOKIE_ROLE)

    def up(self) -> dict[str, str]:
        """Start whatever is not running and wait for readiness; returns the two addresses.

        A missing broker package is reported before anything starts (one line, which extra to install).
        """
        timeout = self.settings.start_timeout_s
        self._check_tls()
        if self.settings.broker == "tansu" and not self.broker.is_running():
            tansu_binary()
        try:
            with step(logger, f"ZooKeeper and the {self.settings.broker} broker: starting (or reusing)"):
                self._start_zookeeper_and_broker(timeout)
            bookkeeper = self.bookkeeper()
            if bookkeeper is not None:
                with step(logger, "real BookKeeper bookies and AutoRecovery: starting (or reusing)"):
                    bookkeeper.start()
        except Exception:
            self.broker.stop()
            self.zookeeper.stop()
            raise
        return self.addresses()

    def _check_tls(self) -> None:
        if self.tls is None:
            if self.settings.kafka_scram:
                raise ConfigError("dev.kafka_scram needs dev.tls (SCRAM users log in over TLS only)")
            return
        if self.settings.broker != "kafka":
            raise ConfigError("dev.tls needs dev.broker = kafka (Tansu has no TLS listener)")
        missing = [path for path in (self.tls.cafile, self.tls.keystore) if not path.is_file()]
        if missing:
            raise ConfigError(f"dev.tls: no {missing[0]}; `bkaudit dev up --tls` writes a throwaway CA there")

    def kafka_client_settings(self) -> dict[str, object]:
        """The ``kafka`` settings a client of this broker takes beyond its address: on a real Kafka broker no
        one-record tails (its high watermark is right after any batch, and the hold costs every burst a
        flush before its last records go out).

        Example:
            >>> DevCluster(DevSettings(state_dir="/s", broker="kafka")).kafka_client_settings()
            {'single_record_tails': False}
            >>> DevCluster(DevSettings(state_dir="/s", broker="tansu")).kafka_client_settings()
            {}
        """
        return {"single_record_tails": False} if self.settings.broker == "kafka" else {}

    def client_kafka_variables(self) -> dict[str, str]:
        """:meth:`kafka_client_settings` as ``BKAUDIT_KAFKA__*`` variables (what ``--dev`` sets).

        Example:
            >>> DevCluster(DevSettings(state_dir="/s", broker="kafka")).client_kafka_variables()
            {'BKAUDIT_KAFKA__SINGLE_RECORD_TAILS': 'false'}
        """
        return {
            f"BKAUDIT_KAFKA__{name.upper()}": str(value).lower()
            for name, value in self.kafka_client_settings().items()
        }

    def client_tls_variables(self) -> dict[str, str]:
        """With ``dev.tls``: the ``BKAUDIT_*`` variables that make a client use the CA and client pair (an
        unencrypted key: the files are throwaway); empty without TLS.

        Example:
            >>> DevCluster(DevSettings(state_dir="/s")).client_tls_variables()
            {}
        """
        if self.tls is None:
            return {}
        ca, cert, key = str(self.tls.cafile), str(self.tls.client_certfile), str(self.tls.client_keyfile)
        bookie_cert, bookie_key = (str(path) for path in self._bookie_client_pair())
        return {
            "BKAUDIT_ZOOKEEPER__USE_TLS": "true",
            "BKAUDIT_ZOOKEEPER__TLS_CAFILE": ca,
            "BKAUDIT_ZOOKEEPER__TLS_CERTFILE": cert,
            "BKAUDIT_ZOOKEEPER__TLS_KEYFILE": key,
            "BKAUDIT_KAFKA__SECURITY_PROTOCOL": "SSL",
            "BKAUDIT_KAFKA__SSL_CAFILE": ca,
            "BKAUDIT_KAFKA__SSL_CERTFILE": cert,
            "BKAUDIT_KAFKA__SSL_KEYFILE": key,
            "BKAUDIT_BOOKIE__TLS": "true",
            "BKAUDIT_BOOKIE__TLS_CA_FILE": ca,
            "BKAUDIT_BOOKIE__TLS_CERT_FILE": bookie_cert,
            "BKAUDIT_BOOKIE__TLS_KEY_FILE": bookie_key,
        }

    def _bookie_client_pair(self) -> tuple[Path, Path]:
        """The client pair bookies that authorize :data:`~connectors.tls.BOOKIE_ROLE` accept (written by
        ``ensure_throwaway_ca``), else the plain client pair."""
        assert self.tls is not None
        cert, key = self.tls.bookie_client_certfile, self.tls.bookie_client_keyfile
        if cert is not None and key is not None and cert.is_file() and key.is_file():
            return cert, key
        return self.tls.client_certfile, self.tls.client_keyfile

    def listeners(self) -> dict[str, dict[int, bool]]:
        """Every port ZooKeeper's and the broker's processes listen on, each with whether it completed a TLS
        handshake (with the client pair of ``dev.tls``; without TLS every port is plaintext: ``False``).

        Example:
            >>> DevCluster(DevSettings(state_dir="/tmp/bkaudit-doc-dev")).listeners()
            {'zookeeper': {}, 'kafka': {}}
        """
        context = self.tls.client_context() if self.tls is not None else None
        report: dict[str, dict[int, bool]] = {}
        for name, service in (("zookeeper", self.zookeeper), ("kafka", self.broker)):
            pid = service.pid()
            ports = sorted(listening_ports(pid)) if pid is not None else []
            report[name] = {port: context is not None and _speaks_tls(context, port) for port in ports}
        return report

    def secured(self, settings: Settings) -> Settings:
        """``settings`` with the clients' TLS settings of ``dev.tls`` (the CA and the client pair, for
        ZooKeeper, Kafka and the bookies the simulator serves over TLS, whose pair carries the role they
        authorize); unchanged without TLS.

        Example:
            >>> DevCluster(DevSettings(state_dir="/s")).secured(Settings()).kafka.security_protocol
            'PLAINTEXT'
        """
        if self.tls is None:
            return settings
        ca, cert, key = self.tls.cafile, self.tls.client_certfile, self.tls.client_keyfile
        zookeeper = {"use_tls": True, "tls_cafile": ca, "tls_certfile": cert, "tls_keyfile": key}
        kafka = {"security_protocol": "SSL", "ssl_cafile": ca, "ssl_certfile": cert, "ssl_keyfile": key}
        bookie_cert, bookie_key = self._bookie_client_pair()
        bookie = {"tls": True, "tls_ca_file": ca, "tls_cert_file": bookie_cert, "tls_key_file": bookie_key}
        return settings.model_copy(
            update={
                "zookeeper": settings.zookeeper.model_copy(update=zookeeper),
                "kafka": settings.kafka.model_copy(update=kafka),
                "bookie": settings.bookie.model_copy(update=bookie),
            }
        )

    def _start_zookeeper_and_broker(self, timeout: float) -> None:
        """Both at once (neither needs the other; each JVM's start is mostly one busy thread)."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="broker-start") as pool:
            broker = pool.submit(self.broker.start, timeout)
            try:
                self.zookeeper.start(timeout)
            except BaseException:
                wait([broker])  # the caller stops both; the broker must not start behind its back
                raise
            broker.result()

    def addresses(self) -> dict[str, str]:
        addresses = {"zookeeper": self.zookeeper.address, "kafka": self.broker.bootstrap}
        if self.tls is not None:
            addresses["tls"] = str(self.tls.cafile.parent)
        if isinstance(self.broker, KafkaBroker) and self.broker.sasl_bootstrap is not None:
            addresses["kafka_sasl"] = self.broker.sasl_bootstrap
        bookkeeper = self.bookkeeper()
        if bookkeeper is not None:
            addresses["bookkeeper"] = bookkeeper.service_uri
        return addresses

    def down(self) -> dict[str, bool]:
        """Stop ZooKeeper, the broker and real bookies (when ``dev up --bookkeeper real`` started them);
        reports which were running."""
        bookkeeper = self.bookkeeper(present=True)
        bookies = any(bookkeeper.stop().values()) if bookkeeper is not None else False
        report = {"zookeeper": self.zookeeper.stop(), "kafka": self.broker.stop()}
        return report | ({"bookkeeper": bookies} if bookkeeper is not None else {})

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
        bookkeeper = self.bookkeeper(present=True)
        if bookkeeper is not None:
            report["bookkeeper"] = bookkeeper.status()
        report["state_dir"] = str(self.settings.state_dir.absolute())
        report["checked_in_ms"] = round((time.time() - started) * 1000, 1)
        return report
