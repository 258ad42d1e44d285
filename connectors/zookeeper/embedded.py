"""The embedded ZooKeeper server for development, the demo and tests.

Runs the ZooKeeper server classes that ship inside the installed pyspark
(``java -cp "<pyspark>/jars/*" org.apache.zookeeper.server.quorum.QuorumPeerMain zoo.cfg``) on loopback,
with its own data directory, a free port, the four-letter words ``ruok,srvr,mntr,envi``, the admin server
off and a log4j2 configuration that writes a readable ``zookeeper.log``. A system ZooKeeper can be used
instead by pointing ``zookeeper_classpath`` at its jars.

Example:
    >>> from pathlib import Path
    >>> zk = EmbeddedZooKeeper(Path("/tmp/bkaudit-doc-zk"))
    >>> zk.address if zk.is_running() else "not running"
    'not running'
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path

from connectors.process import (
    LOOPBACK,
    ManagedProcess,
    ProcessService,
    ensure_port_free,
    free_port,
    port_is_free,
    recorded_int,
)
from connectors.tls import ServerTls
from core.errors import ServiceError

MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
#: The connection factory that serves TLS (the default NIO one does not).
NETTY_FACTORY = "org.apache.zookeeper.server.NettyServerCnxnFactory"

_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = File
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{ISO8601}} %-5p [%t] %c{{1}}: %m%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = File
logger.quiet.name = org.apache.zookeeper.server.NIOServerCnxn
logger.quiet.level = WARN
"""


def pyspark_jars_classpath() -> str:
    """The ``<pyspark>/jars/*`` classpath of the installed pyspark (holds zookeeper-3.9.x jars)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError("pyspark is not installed: it provides the ZooKeeper server jars")
    jars = Path(next(iter(spec.submodule_search_locations))) / "jars"
    if not any(jars.glob("zookeeper-*.jar")):
        raise ServiceError(f"no zookeeper-*.jar under {jars}")
    return f"{jars}/*"


def four_letter_word(
    port: int, word: str, host: str = LOOPBACK, timeout: float = 2.0, tls: ssl.SSLContext | None = None
) -> str:
    """Send a ZooKeeper four-letter word (``ruok``, ``srvr``, ``mntr``, ``envi``) and return the answer
    (over TLS with ``tls``, for a secureClientPort)."""
    with socket.create_connection((host, port), timeout=timeout) as raw:
        sock = tls.wrap_socket(raw, server_hostname=host) if tls is not None else raw
        sock.sendall(word.encode("ascii"))
        chunks: list[bytes] = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


@dataclass
class EmbeddedZooKeeper(ProcessService):
    """A standalone ZooKeeper server owned by bkaudit, state under ``state_dir``.

    Example:
        >>> from pathlib import Path
        >>> EmbeddedZooKeeper(Path("/tmp/x")).data_dir
        PosixPath('/tmp/x/zookeeper-data')
    """

    state_dir: Path
    port: int = 0
    heap: str = "1g"
    tick_ms: int = 500
    java_bin: str = "java"
    classpath: str | None = None
    #: Serve TLS only (a secureClientPort with client certificates required, no plaintext port).
    tls: ServerTls | None = None
    #: The JVM's tuning options (its collector, its compilers); ``BKAUDIT_ZOOKEEPER_JAVA_OPTS`` replaces
    #: the default (G1) for every embedded server a process starts, as a test suite does.
    java_options: tuple[str, ...] = field(
        default_factory=lambda: tuple(os.environ.get("BKAUDIT_ZOOKEEPER_JAVA_OPTS", "-XX:+UseG1GC").split())
    )

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).absolute()
        self._process = ManagedProcess("zookeeper", self.state_dir, marker=str(self.config_file))
        self._port_chosen_by_us = self.port == 0
        self._restarting = False
        if self.port == 0:
            self.port = self._recorded_port() or 0

    @property
    def data_dir(self) -> Path:
        return self.state_dir / "zookeeper-data"

    @property
    def config_file(self) -> Path:
        return self.state_dir / "zoo.cfg"

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def _recorded_port(self) -> int | None:
        return recorded_int(self.config_file, "secureClientPort" if self.tls else "clientPort")

    def _port_lines(self) -> list[str]:
        if self.tls is None:
            return [f"clientPort={self.port}", f"clientPortAddress={LOOPBACK}"]
        # Netty serves the TLS port; PEM key and trust stores (ZooKeeper 3.8+); ssl.* lines become the
        # zookeeper.ssl.* properties.
        return [
            f"secureClientPort={self.port}",
            f"secureClientPortAddress={LOOPBACK}",
            f"ssl.keyStore.location={self.tls.keystore}",
            "ssl.keyStore.type=PEM",
            f"ssl.trustStore.location={self.tls.cafile}",
            "ssl.trustStore.type=PEM",
            "ssl.clientAuth=need",
        ]

    def _tls_context(self) -> ssl.SSLContext | None:
        return self.tls.client_context() if self.tls is not None else None

    def _write_config(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # maxClientCnxns=0: the simulator holds one session per bookie, all from 127.0.0.1.
        self.config_file.write_text(
            "\n".join(
                [
                    f"tickTime={self.tick_ms}",
                    f"dataDir={self.data_dir}",
                    *self._port_lines(),
                    "maxClientCnxns=0",
                    f"minSessionTimeout={2 * self.tick_ms}",
                    f"maxSessionTimeout={240 * self.tick_ms}",  # 2 minutes at 500 ms ticks
                    "4lw.commands.whitelist=ruok,srvr,mntr,envi",
                    "admin.enableServer=false",
                    "autopurge.snapRetainCount=3",
                    "autopurge.purgeInterval=1",
                    "preAllocSize=16384",
                    "",
                ]
            )
        )
        (self.state_dir / "zookeeper-log4j2.properties").write_text(_LOG4J2.format(log_file=self.log_file))

    def start(self, timeout: float = 60.0) -> None:
        """Start (idempotent: a running server is left alone) and wait until it answers ``ruok``."""
        if self.is_running():
            self._wait_ready(timeout)
            return
        java = shutil.which(self.java_bin)
        if java is None:
            raise ServiceError(
                f"ZooKeeper needs Java: {self.java_bin!r} is not on PATH (install openjdk-17-jre-headless)"
            )
        if self.port == 0 or (
            self._port_chosen_by_us and not port_is_free(self.port) and not self._restarting
        ):
            self.port = free_port()  # a port we picked before may have been taken since
        else:
            ensure_port_free(self.port, "zookeeper")
        self._write_config()
        classpath = self.classpath or pyspark_jars_classpath()
        argv = [
            java,
            f"-Xmx{self.heap}",
            *self.java_options,
            "-Dzookeeper.admin.enableServer=false",
            "-Djute.maxbuffer=67108864",  # 1 M-child listings (flat layout) exceed the 1 MB default
            f"-Dlog4j2.configurationFile={self.state_dir / 'zookeeper-log4j2.properties'}",
            "-Dzookeeper.jmx.log4j.disable=true",
            *([f"-Dzookeeper.serverCnxnFactory={NETTY_FACTORY}"] if self.tls else []),
            "-cp",
            classpath,
            MAIN_CLASS,
            str(self.config_file),
        ]
        self._process.start(argv)
        self._wait_ready(timeout)

    def _ready(self) -> bool:
        try:
            tls = self._tls_context()
            return four_letter_word(self.port, "ruok", timeout=0.5, tls=tls) == "imok" and "Mode:" in (
                four_letter_word(self.port, "srvr", timeout=0.5, tls=tls)
            )
        except OSError:
            return False

    def _wait_ready(self, timeout: float) -> None:
        self._process.wait_until(self._ready, timeout, what=f"answering on {self.address}")

    def stop(self, *, hard: bool = False) -> bool:
        """Stop the server (SIGKILL when ``hard``); data stays. True when one was running."""
        return self._process.stop(hard=hard)

    def restart(self, timeout: float = 60.0, downtime: float = 0.0) -> None:
        """Stop and start again on the same port with the same data (sessions survive if short enough)."""
        self.stop()
        if downtime:
            time.sleep(downtime)
        self._restarting = True  # clients reconnect to this address: keep the port, fail loudly if taken
        deadline = time.monotonic() + 10
        while not port_is_free(self.port) and time.monotonic() < deadline:
            time.sleep(0.1)  # the old listener may linger a moment after the process exits
        try:
            self.start(timeout)
        finally:
            self._restarting = False

    def stats(self) -> dict[str, str]:
        """The ``mntr`` figures (znode count, data size, latency...) as a dict."""
        answer = four_letter_word(self.port, "mntr", tls=self._tls_context())
        pairs = (line.split("\t", 1) for line in answer.splitlines() if "\t" in line)
        return {key: value for key, value in pairs}

    def log_tail(self, lines: int = 40) -> str:
        return self._process.log_tail(lines) if self.log_file.exists() else "(no log)"
