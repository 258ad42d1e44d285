"""One real Apache BookKeeper bookie process on loopback (``org.apache.bookkeeper.server.Main --conf F``).

Each bookie has its own loopback address (``127.0.0.2``, ``127.0.0.3``...: the whole 127/8 reaches ``lo`` on
Linux), its own port, conf, journal and ledger directories under its state directory, a small heap and a
log4j2 configuration writing ``bookie-N.log``. Its bookie id is ``<address>:<port>`` (``advertisedAddress``,
``listeningInterface`` set so that it binds that address only, ``allowLoopback=true``). DbLedgerStorage,
no HTTP server, no auto-recovery inside the bookie.

Example:
    >>> from pathlib import Path
    >>> bookie = RealBookie(Path("/tmp/bkaudit-doc-bk/bookie-1"), index=1, service_uri="zk+hierarchical://127.0.0.1:1/ledgers")
    >>> bookie.address, bookie.is_running()
    ('127.0.0.2', False)
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from connectors.process import ManagedProcess, ProcessService, free_port, port_open, recorded_int
from core.errors import ServiceError

MAIN_CLASS = "org.apache.bookkeeper.server.Main"
DB_LEDGER_STORAGE = "org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage"

#: JVM options BookKeeper's bin/common.sh adds on Java 9+ (Netty and DbLedgerStorage need them).
JVM_OPENS = (
    "-Dio.netty.tryReflectionSetAccessible=true",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.util.zip=ALL-UNNAMED",
    "-Djava.net.preferIPv4Stack=true",
)

LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = File
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{ISO8601}} %-5p [%t] %c{{1}}: %m%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = File
logger.zk.name = org.apache.zookeeper
logger.zk.level = WARN
"""


def bookie_address(index: int) -> str:
    """The loopback address of bookie ``index`` (1-based): 127.0.0.(index+1).

    Example:
        >>> bookie_address(1), bookie_address(300)
        ('127.0.0.2', '127.0.1.45')
    """
    if not 1 <= index <= 60000:
        raise ServiceError(f"bookie index {index} out of range 1..60000")
    number = index + 1
    return f"127.0.{number // 256}.{number % 256}"


def java_binary(java_bin: str = "java") -> str:
    """The java executable, or a one-line ServiceError when it is missing.

    Example:
        >>> java_binary("no-such-java-here")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        core.errors.ServiceError: BookKeeper needs Java: 'no-such-java-here' is not on PATH ...
    """
    java = shutil.which(java_bin)
    if java is None:
        raise ServiceError(
            f"BookKeeper needs Java: {java_bin!r} is not on PATH (install openjdk-17-jre-headless)"
        )
    return java


def render_conf(values: dict[str, object]) -> str:
    """A Java properties file from ``values`` (one ``key=value`` a line).

    Example:
        >>> render_conf({"bookiePort": 3181, "allowLoopback": True})
        'bookiePort=3181\\nallowLoopback=true\\n'
    """

    def text(value: object) -> str:
        return str(value).lower() if isinstance(value, bool) else str(value)

    return "".join(f"{key}={text(value)}\n" for key, value in values.items())


@dataclass
class RealBookie(ProcessService):
    """A real bookie owned by bkaudit, state under ``state_dir`` (conf, dirs, pid and log).

    Example:
        >>> from pathlib import Path
        >>> RealBookie(Path("/tmp/b/bookie-2"), 2, "zk+hierarchical://127.0.0.1:1/ledgers").log_file.name
        'bookie-2.log'
    """

    state_dir: Path
    index: int
    service_uri: str
    classpath: str = ""
    port: int = 0
    heap: str = "256m"
    direct_memory: str = "256m"
    java_bin: str = "java"
    extra_conf: dict[str, object] = field(default_factory=dict)
    #: More JVM options (ZooKeeper's client TLS on a secured cluster).
    jvm_options: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).absolute()
        self.address = bookie_address(self.index)
        self.name = f"bookie-{self.index}"
        self._process = ManagedProcess(self.name, self.state_dir, marker=str(self.conf_file))
        if self.port == 0:
            self.port = self._recorded_port() or 0

    @property
    def conf_file(self) -> Path:
        return self.state_dir / f"{self.name}.conf"

    @property
    def bookie_id(self) -> str:
        """``<address>:<port>``, as the bookie registers itself."""
        return f"{self.address}:{self.port}"

    def _recorded_port(self) -> int | None:
        return recorded_int(self.conf_file, "bookiePort")

    def conf_values(self, *, read_only: bool = False) -> dict[str, object]:
        """The bookie's server configuration (``extra_conf`` last, so it can override anything)."""
        values: dict[str, object] = {
            "metadataServiceUri": self.service_uri,
            "bookiePort": self.port,
            "advertisedAddress": self.address,
            # Any interface name: with advertisedAddress set, the bookie then binds that address only.
            "listeningInterface": "lo",
            "useHostNameAsBookieID": False,
            "allowLoopback": True,
            "journalDirectories": self.state_dir / "journal",
            "ledgerDirectories": self.state_dir / "ledgers",
            "ledgerStorageClass": DB_LEDGER_STORAGE,
            "dbStorage_writeCacheMaxSizeMb": 16,
            "dbStorage_readAheadCacheMaxSizeMb": 8,
            "dbStorage_rocksDB_blockCacheSize": 8 * 1024 * 1024,
            "dbStorage_rocksDB_writeBufferSizeMB": 4,
            "journalPreAllocSizeMB": 4,
            "journalSyncData": False,  # tests on a shared disk: no fsync per add
            "entryLogSizeLimit": 64 * 1024 * 1024,
            "httpServerEnabled": False,
            "autoRecoveryDaemonEnabled": False,
            "forceReadOnlyBookie": read_only,
            "readOnlyModeEnabled": True,
            "diskUsageThreshold": 0.99,
            "diskUsageWarnThreshold": 0.98,
            "serverNumIOThreads": 2,
            "numAddWorkerThreads": 1,
            "numReadWorkerThreads": 1,
            "numJournalCallbackThreads": 1,
            "zkTimeout": 10000,
            "gcWaitTime": 60000,
        }
        values.update(self.extra_conf)
        return values

    def write_conf(self, *, read_only: bool = False) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.conf_file.write_text(render_conf(self.conf_values(read_only=read_only)))
        (self.state_dir / "log4j2.properties").write_text(LOG4J2.format(log_file=self.log_file))

    def argv(self) -> list[str]:
        """The command line of the bookie process."""
        return [
            java_binary(self.java_bin),
            f"-Xmx{self.heap}",
            "-Xms32m",
            f"-XX:MaxDirectMemorySize={self.direct_memory}",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # C1 only: a fraction of the start-up CPU, enough for a test bookie
            "-Xss512k",
            *JVM_OPENS,
            *self.jvm_options,
            f"-Dlog4j2.configurationFile={self.state_dir / 'log4j2.properties'}",
            "-cp",
            self.classpath,
            MAIN_CLASS,
            "--conf",
            str(self.conf_file),
        ]

    def launch(self, *, read_only: bool = False) -> None:
        """Start the process without waiting (a running bookie is left alone); see :meth:`wait_ready`."""
        if self.is_running():
            return
        if self.port == 0:
            self.port = free_port(self.address)
        self.write_conf(read_only=read_only)
        self._process.start(self.argv())

    def wait_ready(self, registered: Callable[[], bool], timeout: float = 60.0) -> None:
        """Wait until the bookie answers on its port and ``registered()`` (its znode exists); a bookie that
        exits first or takes too long is a ServiceError naming its log file."""
        self._process.wait_until(
            lambda: port_open(self.port, self.address) and registered(),
            timeout,
            what=f"registered and answering on {self.bookie_id}",
        )

    def start(
        self, registered: Callable[[], bool], timeout: float = 60.0, *, read_only: bool = False
    ) -> None:
        """:meth:`launch` then :meth:`wait_ready`."""
        self.launch(read_only=read_only)
        self.wait_ready(registered, timeout)

    def stop(self, *, hard: bool = False) -> bool:
        """Stop the bookie (SIGTERM, or SIGKILL when ``hard``); its data stays. True when one was running."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGCONT)  # a paused JVM cannot act on SIGTERM
        return self._process.stop(hard=hard)

    def kill(self) -> bool:
        """``kill -9``: the bookie's ZooKeeper session (and registration) lingers until it expires."""
        return self.stop(hard=True)

    def pause(self) -> None:
        """SIGSTOP: the process is alive but answers nothing (a hung bookie)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        self._signal(signal.SIGCONT)

    def _signal(self, signum: int) -> None:
        pid = self.pid()
        if pid is None:
            raise ServiceError(f"{self.name} is not running (log {self.log_file})")
        os.kill(pid, signum)

    def log_tail(self, lines: int = 40) -> str:
        return self._process.log_tail(lines)
