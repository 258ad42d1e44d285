"""A real Apache Kafka broker (4.1, one combined broker + controller node in KRaft mode) on loopback.

The alternative to the Tansu stand-in (:mod:`connectors.kafka.embedded`) for ``bkaudit dev up``, the demo and
the tests (``dev.broker = "kafka"``). Same interface as :class:`~connectors.kafka.embedded.EmbeddedBroker`;
unlike Tansu it keeps its topics on disk, so they survive a restart. The jars come from Maven
(:func:`connectors.jars.classpath`, component ``kafka``).

Under ``state_dir``: ``server.properties`` and ``log4j2.properties`` (written at every start from the
recorded ports), ``kafka-broker.json`` (client port, controller port, cluster id), ``data/`` (formatted once
by Kafka's own ``StorageTool``), ``broker.log`` (the JVM's output and Kafka's log) and ``broker.pid``. The
quorum is static (``controller.quorum.voters``), so a controller port that has to change between two starts
does not strand the data.

Example:
    >>> from pathlib import Path
    >>> KafkaBroker(Path("/tmp/bkaudit-doc-kafka")).is_running()
    False
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from connectors.kafka.embedded import broker_answers_metadata
from connectors.process import (
    LOOPBACK,
    ManagedProcess,
    ProcessService,
    ensure_port_free,
    free_port,
    port_is_free,
)
from connectors.tls import ServerTls
from core.errors import ServiceError

#: Kafka's server main class and its storage formatter (``kafka-storage.sh``) in ``kafka_2.13``.
SERVER_MAIN = "kafka.Kafka"
STORAGE_TOOL_MAIN = "kafka.tools.StorageTool"

#: The one node's id (broker and controller alike).
NODE_ID = 1

#: JVM options for a small, quick-starting test broker: a serial collector (no GC threads to share the
#: cores, heap grown on demand), the quick C1 compiler only, class-data sharing.
FAST_START_JVM_OPTIONS = (
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
    "-Djava.awt.headless=true",
)

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = Out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = %d{{ISO8601}} %-5p [%t] %c{{1}}: %m%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = Out
{quiet}
"""

#: Loggers that write a line per partition or request at INFO: warnings only.
_QUIET_LOGGERS = (
    "state.change.logger",
    "kafka.request.logger",
    "kafka.cluster.Partition",
    "kafka.log.LogCleaner",
    "org.apache.kafka.storage.internals.log",
    "org.apache.kafka.common.config",
    "org.apache.kafka.common.utils.AppInfoParser",
    "kafka.server.metadata",
    "org.apache.kafka.image",
)


def new_cluster_id() -> str:
    """A Kafka cluster id: a random UUID in URL-safe base64 without padding (22 characters).

    Example:
        >>> len(new_cluster_id())
        22
    """
    while True:  # like Kafka's Uuid.randomUuid: never a leading "-" (it would read as a command-line flag)
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):
            return text


def meta_properties(cluster_id: str, directory_id: str, node_id: int = NODE_ID) -> str:
    """The ``meta.properties`` Kafka's storage formatter writes into a log directory (version 1, KRaft).

    Example:
        >>> meta_properties("C", "D").splitlines()
        ['node.id=1', 'directory.id=D', 'version=1', 'cluster.id=C']
    """
    return f"node.id={node_id}\ndirectory.id={directory_id}\nversion=1\ncluster.id={cluster_id}\n"


def server_properties(
    port: int,
    controller_port: int,
    data_dir: Path,
    *,
    num_partitions: int = 4,
    extra: dict[str, str] | None = None,
) -> str:
    """The ``server.properties`` of one combined broker + controller node on 127.0.0.1.

    One node: replication factor 1 (and min ISR 1) for every internal topic, few partitions for them (quick
    first group join), no initial rebalance delay, a long broker session (no self-fencing after a freeze),
    topics auto-created with ``num_partitions`` (Tansu's default is 4) and small cleaner buffers. ``extra``
    adds or overrides properties.

    Example:
        >>> text = server_properties(9092, 9093, Path("/d"), extra={"num.partitions": "2"})
        >>> "listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093" in text.splitlines()
        True
        >>> [line for line in text.splitlines() if line.startswith("num.partitions")]
        ['num.partitions=2']
    """
    properties = {
        "process.roles": "broker,controller",
        "node.id": str(NODE_ID),
        "controller.quorum.voters": f"{NODE_ID}@{LOOPBACK}:{controller_port}",
        "listeners": f"PLAINTEXT://{LOOPBACK}:{port},CONTROLLER://{LOOPBACK}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": str(num_partitions),
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "auto.create.topics.enable": "true",
        "delete.topic.enable": "true",
        "group.initial.rebalance.delay.ms": "0",
        # The controller shares the process: after a freeze (SIGSTOP in the hang tests) it would fence its
        # own broker for a missed heartbeat and move every partition's leader epoch; a long session avoids it.
        "broker.session.timeout.ms": "60000",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "share.coordinator.state.topic.num.partitions": "1",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "background.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "log.cleaner.threads": "1",
        "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
    }
    properties.update(extra or {})
    return _properties_text(properties)


def tls_properties(tls: ServerTls, port: int, controller_port: int) -> dict[str, str]:
    """The :func:`server_properties` overrides that make every listener TLS with client certificates
    required (mutual TLS), the controller's included: no plaintext port.

    The key and certificate go in inline (``ssl.keystore.key``): Kafka reads a PEM key store file only with
    an encrypted key, and the CA as a PEM trust store file.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "ks.pem").write_text("KEY-PEM" + chr(10) + "-----BEGIN CERTIFICATE-----")
        >>> props = tls_properties(ServerTls(d / "ca.pem", d / "ks.pem", d / "c", d / "k"), 9093, 9094)
        >>> props["listeners"], props["ssl.client.auth"]
        ('SSL://127.0.0.1:9093,CONTROLLER://127.0.0.1:9094', 'required')
    """
    keystore = tls.keystore.read_text()
    marker = "-----BEGIN CERTIFICATE-----"
    key, _, chain = keystore.partition(marker)
    return {
        "listeners": f"SSL://{LOOPBACK}:{port},CONTROLLER://{LOOPBACK}:{controller_port}",
        "advertised.listeners": f"SSL://{LOOPBACK}:{port}",
        "inter.broker.listener.name": "SSL",
        "listener.security.protocol.map": "SSL:SSL,CONTROLLER:SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.key": key.strip(),
        "ssl.keystore.certificate.chain": (marker + chain).strip(),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls.cafile),
        "ssl.client.auth": "required",
    }


#: The SASL mechanisms the SCRAM listener of :func:`scram_properties` accepts.
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")

_SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


def scram_properties(tls: ServerTls, port: int, sasl_port: int, controller_port: int) -> dict[str, str]:
    """:func:`tls_properties` plus a ``SASL_SSL`` listener on ``sasl_port``: SCRAM-SHA-256/512 users over
    TLS that authenticates the broker only (no client certificate asked there), as a cluster whose clients
    log in with a password has it. Still no plaintext port.

    The users and their salted credentials live in the cluster's metadata (KRaft): they are added with the
    admin API (:meth:`KafkaBroker.add_scram_user`, Kafka's ``kafka-configs --alter --entity-type users``),
    so no password is in a file or on a command line.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "ks.pem").write_text("KEY-PEM" + chr(10) + "-----BEGIN CERTIFICATE-----")
        >>> props = scram_properties(ServerTls(d / "ca.pem", d / "ks.pem", d / "c", d / "k"), 1, 2, 3)
        >>> props["listeners"]
        'SSL://127.0.0.1:1,SASL_SSL://127.0.0.1:2,CONTROLLER://127.0.0.1:3'
        >>> props["sasl.enabled.mechanisms"], props["listener.name.sasl_ssl.ssl.client.auth"]
        ('SCRAM-SHA-256,SCRAM-SHA-512', 'none')
    """
    properties = tls_properties(tls, port, controller_port)
    login = {
        f"listener.name.sasl_ssl.{mechanism.lower()}.sasl.jaas.config": _SCRAM_LOGIN
        for mechanism in SCRAM_MECHANISMS
    }
    return {
        **properties,
        "listeners": f"SSL://{LOOPBACK}:{port},SASL_SSL://{LOOPBACK}:{sasl_port},"
        f"CONTROLLER://{LOOPBACK}:{controller_port}",
        "advertised.listeners": f"SSL://{LOOPBACK}:{port},SASL_SSL://{LOOPBACK}:{sasl_port}",
        "listener.security.protocol.map": "SSL:SSL,SASL_SSL:SASL_SSL,CONTROLLER:SSL",
        "sasl.enabled.mechanisms": ",".join(SCRAM_MECHANISMS),
        "listener.name.sasl_ssl.ssl.client.auth": "none",
        **login,
    }


def client_tls_properties(tls: ServerTls) -> dict[str, str]:
    """librdkafka properties for a client of a :func:`tls_properties` broker (its readiness check).

    Example:
        >>> tls = ServerTls(Path("ca"), Path("ks"), Path("c"), Path("k"))
        >>> client_tls_properties(tls)["security.protocol"]
        'SSL'
    """
    return {
        "security.protocol": "SSL",
        "ssl.ca.location": str(tls.cafile),
        "ssl.certificate.location": str(tls.client_certfile),
        "ssl.key.location": str(tls.client_keyfile),
    }


def _properties_text(properties: dict[str, str]) -> str:
    # Java properties: a value's newlines written as \n (PEM blocks), backslashes doubled.
    lines = (
        f"{key}={value.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}\n"
        for key, value in properties.items()
    )
    return "".join(lines)


def log4j2_properties() -> str:
    """Kafka's log4j2 configuration: everything to standard output (``broker.log``), chatty loggers quiet.

    Example:
        >>> "rootLogger.level = INFO" in log4j2_properties()
        True
    """
    quiet = "\n".join(
        f"logger.q{index}.name = {name}\nlogger.q{index}.level = WARN"
        for index, name in enumerate(_QUIET_LOGGERS)
    )
    return _LOG4J2.format(quiet=quiet)


def jvm_argv(
    java: str,
    heap: str,
    classpath: str,
    state_dir: Path,
    marker: str,
    options: tuple[str, ...] = FAST_START_JVM_OPTIONS,
) -> list[str]:
    """The ``java ... -cp`` prefix shared by the storage formatter and the server.

    ``marker`` goes into the command line as a system property: it is how a later ``stop`` knows the pid is
    ours.

    Example:
        >>> jvm_argv("java", "256m", "/j/*", Path("/s"), "kafka-/s")[:3]
        ['java', '-Xmx256m', '-Xms32m']
    """
    return [
        java,
        f"-Xmx{heap}",
        "-Xms32m",
        *options,
        f"-Dbkaudit.service={marker}",
        f"-Dlog4j2.configurationFile={state_dir / 'log4j2.properties'}",
        "-cp",
        classpath,
    ]


def class_archive(java: str, classpath: str, fallback_dir: Path) -> Path:
    """Where the broker's class-data sharing archive lives: beside the jars (else in ``fallback_dir``).

    The JVM writes it when a broker started without one stops cleanly (``-XX:ArchiveClassesAtExit``);
    later starts map the classes from it (``-XX:SharedArchiveFile``), which cuts the start by about half.
    Its name carries a digest of the Java binary, as an archive only fits the JVM that wrote it; the JVM
    ignores an archive that does not fit (``-Xshare:auto``).

    Example:
        >>> class_archive("/usr/bin/java", "/no/such/dir/*", Path("/s")).parent
        PosixPath('/s')
    """
    binary = Path(os.path.realpath(java))
    try:
        stamp = f"{binary}:{binary.stat().st_mtime_ns}"
    except OSError:
        stamp = str(binary)
    digest = hashlib.sha256(stamp.encode()).hexdigest()[:12]
    jars = Path(classpath[:-2]) if classpath.endswith("/*") else None
    folder = jars if jars is not None and jars.is_dir() and os.access(jars, os.W_OK) else fallback_dir
    return folder / f".kafka-broker-{digest}.jsa"


def bootstrap_template(classpath: str, fallback_dir: Path) -> Path:
    """Where a copy of the ``bootstrap.checkpoint`` that Kafka's formatter wrote is kept, beside the jars.

    The file holds the initial feature levels (``metadata.version``) of these jars' Kafka version and no
    cluster id, so a fresh data directory is formatted with a copy of it and a new ``meta.properties``,
    without starting the formatter's JVM again. Its name carries a digest of the jars' names (the version).

    Example:
        >>> bootstrap_template("/no/such/dir/*", Path("/s")).name.startswith(".kafka-bootstrap-")
        True
    """
    jars = Path(classpath[:-2]) if classpath.endswith("/*") else None
    if jars is not None and jars.is_dir():
        names = "\n".join(sorted(path.name for path in jars.glob("*.jar")))
    else:
        names = classpath
    digest = hashlib.sha256(names.encode()).hexdigest()[:12]
    writable = jars is not None and jars.is_dir() and os.access(jars, os.W_OK)
    return (jars if writable and jars is not None else fallback_dir) / f".kafka-bootstrap-{digest}.checkpoint"


def archive_options(archive: Path, pid_tag: str) -> tuple[tuple[str, ...], Path | None]:
    """The JVM options that use ``archive``, or write it (to a temporary name) when it is missing.

    Returns the options and the temporary file the JVM writes at exit (None when the archive exists).

    Example:
        >>> archive_options(Path("/no/a.jsa"), "1")
        (('-XX:ArchiveClassesAtExit=/no/a.jsa.1.tmp',), PosixPath('/no/a.jsa.1.tmp'))
    """
    if archive.exists():
        return (f"-XX:SharedArchiveFile={archive}",), None
    pending = archive.with_name(f"{archive.name}.{pid_tag}.tmp")
    return (f"-XX:ArchiveClassesAtExit={pending}",), pending


def format_argv(prefix: list[str], cluster_id: str, config: Path) -> list[str]:
    """Kafka's storage formatter: ``StorageTool format -t <cluster id> -c <server.properties>``.

    With a static quorum (``controller.quorum.voters``) neither ``--standalone`` nor
    ``--initial-controllers`` applies; ``--ignore-formatted`` makes a second format a no-op.

    Example:
        >>> format_argv(["java"], "AAAAAAAAAAAAAAAAAAAAAA", Path("/s/server.properties"))[1:4]
        ['kafka.tools.StorageTool', 'format', '-t']
    """
    return [*prefix, STORAGE_TOOL_MAIN, "format", "-t", cluster_id, "-c", str(config), "--ignore-formatted"]


def failure_reason(log_text: str) -> str | None:
    r"""What went wrong, from a JVM's output: the first ERROR line (with the exception on the next line) or
    the first uncaught exception; None when there is neither.

    Example:
        >>> failure_reason("x\nException in thread \"main\" ConfigException: bad value\n\tat a.b(C.java:1)")
        'Exception in thread "main" ConfigException: bad value'
        >>> failure_reason("t ERROR [main] Acceptor: Unable to start\nKafkaException: in use\n\tat x")
        't ERROR [main] Acceptor: Unable to start: KafkaException: in use'
        >>> failure_reason("all fine") is None
        True
    """
    lines = [line.strip() for line in log_text.splitlines()]
    for index, line in enumerate(lines):
        if " ERROR " in line or line.startswith("Exception in thread"):
            following = lines[index + 1] if index + 1 < len(lines) else ""
            if " ERROR " in line and ("Exception" in following or "Error" in following):
                line = f"{line}: {following}"
            return line[:400]
    return None


def server_argv(prefix: list[str], config: Path) -> list[str]:
    """The broker: ``kafka.Kafka <server.properties>``.

    Example:
        >>> server_argv(["java"], Path("/s/server.properties"))
        ['java', 'kafka.Kafka', '/s/server.properties']
    """
    return [*prefix, SERVER_MAIN, str(config)]


@dataclass
class KafkaBroker(ProcessService):
    """A real Kafka broker owned by bkaudit, state (pid, ports, data, log) under ``state_dir``.

    ``classpath`` defaults to the Maven-fetched ``kafka`` component; ``extra_properties`` add to or
    override :func:`server_properties`.

    Example:
        >>> from pathlib import Path
        >>> KafkaBroker(Path("/tmp/x-kafka"), port=19092).bootstrap
        '127.0.0.1:19092'
    """

    state_dir: Path
    port: int = 0
    heap: str = "512m"
    java_bin: str = "java"
    classpath: str | None = None
    num_partitions: int = 4
    extra_properties: dict[str, str] = field(default_factory=dict)
    jvm_options: tuple[str, ...] = FAST_START_JVM_OPTIONS
    format_timeout_s: float = 60.0
    #: Serve TLS only (every listener, client certificates required).
    tls: ServerTls | None = None
    #: With ``tls``: also a SASL_SSL listener for SCRAM users (:func:`scram_properties`).
    scram: bool = False

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).absolute()
        self._marker = f"kafka-{self.state_dir}"
        self._process = ManagedProcess("broker", self.state_dir, marker=self._marker)
        self._port_chosen_by_us = self.port == 0
        recorded = self._recorded()
        if self.port == 0:
            self.port = int(recorded.get("port", 0))
        self.controller_port = int(recorded.get("controller_port", 0))
        #: The SASL_SSL listener's port (``scram``); 0 without one.
        self.sasl_port = int(recorded.get("sasl_port", 0)) if self.scram else 0
        self.cluster_id = str(recorded.get("cluster_id") or new_cluster_id())

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def sasl_bootstrap(self) -> str | None:
        """The SASL_SSL listener's address (``scram``), else None.

        Example:
            >>> KafkaBroker(Path("/tmp/bkaudit-doc-kafka")).sasl_bootstrap is None
            True
        """
        return f"{LOOPBACK}:{self.sasl_port}" if self.scram and self.sasl_port else None

    @property
    def config_file(self) -> Path:
        return self.state_dir / "server.properties"

    @property
    def data_dir(self) -> Path:
        return self.state_dir / "data"

    @property
    def _state_file(self) -> Path:
        return self.state_dir / "kafka-broker.json"

    def _recorded(self) -> dict[str, Any]:
        try:
            recorded = json.loads(self._state_file.read_text())
        except (OSError, ValueError):
            return {}
        return recorded if isinstance(recorded, dict) else {}

    def start(self, timeout: float = 60.0) -> None:
        """Start (idempotent), formatting the storage on first use; wait until it answers a metadata request.

        A broker that cannot start (no Java, a bad property, a taken port) is one :class:`ServiceError`
        line that names the log file.
        """
        if self.is_running():
            self._wait_ready(timeout)
            return
        java = shutil.which(self.java_bin)
        if java is None:
            raise ServiceError(
                f"the Kafka broker needs Java: {self.java_bin!r} is not on PATH "
                "(install openjdk-17-jre-headless)"
            )
        self._choose_ports()
        classpath = self._classpath()
        archive = class_archive(java, classpath, self.state_dir)
        sharing, pending = archive_options(archive, f"{os.getpid()}-{uuid.uuid4().hex[:6]}")
        self._write_files(archive, pending)
        prefix = jvm_argv(java, self.heap, classpath, self.state_dir, self._marker, self.jvm_options)
        self._format(prefix + list(sharing if pending is None else ()), timeout)
        start = self.log_file.stat().st_size if self.log_file.exists() else 0
        self._process.start(server_argv(prefix + list(sharing), self.config_file))
        try:
            self._wait_ready(timeout)
        except ServiceError as err:
            reason = failure_reason(self._log_since(start))
            self._process.stop(hard=True)  # never leave a half-started broker behind
            if reason is None:
                raise
            raise ServiceError(f"kafka broker did not start: {reason}; log {self.log_file}") from err

    def _choose_ports(self) -> None:
        if self.port == 0 or (self._port_chosen_by_us and not port_is_free(self.port)):
            self.port = free_port()  # a port we picked before may have been taken since
        else:
            ensure_port_free(self.port, "kafka broker")
        if self.controller_port in (0, self.port) or not port_is_free(self.controller_port):
            self.controller_port = self._another_free_port()
        if self.scram and (
            self.sasl_port in (0, self.port, self.controller_port) or not port_is_free(self.sasl_port)
        ):
            self.sasl_port = self._another_free_port()

    def _another_free_port(self) -> int:
        """A free port that is none of the ports already chosen."""
        port = free_port()
        while port in (self.port, self.controller_port, self.sasl_port):
            port = free_port()
        return port

    def _write_files(self, archive: Path, pending: Path | None) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        state = {"port": self.port, "controller_port": self.controller_port, "cluster_id": self.cluster_id}
        if self.scram:
            state["sasl_port"] = self.sasl_port
        if pending is not None:
            state |= {"class_archive": str(archive), "class_archive_pending": str(pending)}
        self._state_file.write_text(json.dumps(state))
        self.config_file.write_text(
            server_properties(
                self.port,
                self.controller_port,
                self.data_dir,
                num_partitions=self.num_partitions,
                extra={**self._tls_properties(), **self.extra_properties},
            )
        )
        (self.state_dir / "log4j2.properties").write_text(log4j2_properties())

    def _tls_properties(self) -> dict[str, str]:
        if self.tls is None:
            if self.scram:
                raise ServiceError("kafka broker: SCRAM users are served over TLS only (give it tls)")
            return {}
        if self.scram:
            return scram_properties(self.tls, self.port, self.sasl_port, self.controller_port)
        return tls_properties(self.tls, self.port, self.controller_port)

    def add_scram_user(self, user: str, password: str, mechanism: str = "SCRAM-SHA-512") -> None:
        """Add (or change) a SCRAM user of the SASL_SSL listener, through the admin API over the mutual
        TLS listener (Kafka stores only the salted credential). The password is never logged.

        Example:
            >>> try:
            ...     KafkaBroker(Path("/tmp/bkaudit-doc-kafka")).add_scram_user("u", "p")
            ... except ServiceError as err:
            ...     print(err)
            kafka broker: no SCRAM listener (start it with tls and scram)
        """
        from confluent_kafka.admin import (
            AdminClient,
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        if self.tls is None or not self.scram:
            raise ServiceError("kafka broker: no SCRAM listener (start it with tls and scram)")
        kind = {"SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256, "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512}
        upsert = UserScramCredentialUpsertion(
            user, ScramCredentialInfo(kind[mechanism], 8192), password.encode(), os.urandom(16)
        )
        quiet = {"log_level": 0}  # librdkafka's notices (a purged background queue) would go to stderr
        admin = AdminClient({"bootstrap.servers": self.bootstrap, **quiet, **client_tls_properties(self.tls)})
        for future in admin.alter_user_scram_credentials([upsert], request_timeout=30).values():
            future.result(timeout=60)

    def _classpath(self) -> str:
        if self.classpath is None:
            from connectors.jars import classpath

            self.classpath = classpath("kafka")
        return self.classpath

    def _format(self, prefix: list[str], timeout: float) -> None:
        """Format ``data/`` once (Kafka refuses to start on unformatted storage).

        Kafka's ``StorageTool`` formats the first data directory of these jars; its ``bootstrap.checkpoint``
        is kept (:func:`bootstrap_template`) and later fresh directories get a copy of it and their own
        ``meta.properties``, which is all the formatter writes for a static quorum."""
        if (self.data_dir / "meta.properties").exists():
            return
        template = bootstrap_template(self._classpath(), self.state_dir)
        if template.exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(template, self.data_dir / "bootstrap.checkpoint")
            meta = meta_properties(self.cluster_id, new_cluster_id())
            (self.data_dir / "meta.properties").write_text(meta)  # last: it marks the directory formatted
            return
        self._run_formatter(prefix, timeout)
        written = self.data_dir / "bootstrap.checkpoint"
        if written.exists() and not template.exists():
            pending = template.with_name(f"{template.name}.{os.getpid()}.tmp")
            try:
                shutil.copyfile(written, pending)
                os.replace(pending, template)
            except OSError:
                pending.unlink(missing_ok=True)  # only the next fresh start formats with the tool again

    def _run_formatter(self, prefix: list[str], timeout: float) -> None:
        limit = min(timeout, self.format_timeout_s)
        with open(self.log_file, "ab") as log:
            start = log.tell()
            try:
                done = subprocess.run(
                    format_argv(prefix, self.cluster_id, self.config_file),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.state_dir,
                    timeout=limit,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise ServiceError(
                    f"kafka broker: formatting its storage took over {limit:.0f} s; log {self.log_file}"
                ) from None
        if done.returncode != 0:
            reason = failure_reason(self._log_since(start)) or self._process.log_tail(3)
            raise ServiceError(
                f"kafka broker: formatting its storage failed (exit {done.returncode}): {reason}; "
                f"log {self.log_file}"
            )

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_file, "rb") as log:
                log.seek(offset)
                return log.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _wait_ready(self, timeout: float) -> None:
        self._process.wait_until(
            lambda: broker_answers_metadata(
                self.bootstrap, 1.0, client_tls_properties(self.tls) if self.tls is not None else None
            ),
            timeout,
            what=f"answering on {self.bootstrap}",
        )

    def stop(self, *, hard: bool = False) -> bool:
        """Stop the broker (SIGKILL when ``hard``); its topics stay on disk. True when one was running."""
        stopped = self._process.stop(timeout=30.0, hard=hard)
        self._keep_class_archive()
        return stopped

    def _keep_class_archive(self) -> None:
        """Move the class archive a cleanly stopped broker wrote into place (first writer wins)."""
        recorded = self._recorded()
        archive, pending = recorded.get("class_archive"), recorded.get("class_archive_pending")
        if not isinstance(archive, str) or not isinstance(pending, str):
            return
        written = Path(pending)
        try:
            if written.exists() and written.stat().st_size > 0 and not Path(archive).exists():
                os.replace(written, archive)
        except OSError:
            pass  # only a slower next start
        written.unlink(missing_ok=True)
        kept = {key: value for key, value in recorded.items() if "class_archive" not in key}
        self._state_file.write_text(json.dumps(kept))

    def discard_data(self) -> None:
        """Delete every topic and record (the broker must be stopped); the next start formats afresh.

        This is how tests make the broker lose its data, which Tansu does at every restart.

        Example:
            >>> KafkaBroker(Path("/tmp/bkaudit-doc-kafka-none")).discard_data()  # nothing there: a no-op
        """
        if self.is_running():
            raise ServiceError(f"kafka broker: stop it before discarding its data ({self.data_dir})")
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        return self._process.log_tail(lines) if self.log_file.exists() else "(no log)"
