"""A real Apache BookKeeper 4.17 cluster on loopback: N bookie processes in racks, on bkaudit's ZooKeeper.

:class:`RealBookKeeperCluster` formats the cluster with BookKeeper's own shell (``initnewcluster``) under a
ZooKeeper path prefix (``<prefix>/ledgers``, so many clusters can share one ZooKeeper), writes Pulsar's rack
map znode (``<prefix>/bookies``) and a rack script for BookKeeper's ``ScriptBasedMapping`` from the same
assignment (so bkaudit and BookKeeper's placement agree), starts the bookies, writes ledgers with the real
Java client (``infra/bookkeeper/LedgerWriter.java``) and starts or stops BookKeeper's Auditor
(``AutoRecoveryMain``).

Example:
    >>> cluster = RealBookKeeperCluster("/tmp/bkaudit-doc-bk", "127.0.0.1:2181", racks=2, prefix="/bk")
    >>> cluster.ledgers_root, cluster.rack_map_znode, cluster.rack_of(3)
    ('/bk/ledgers', '/bk/bookies', '/rack-1')
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from connectors.bookkeeper.bookie import JVM_OPENS, RealBookie, java_binary, render_conf
from connectors.bookkeeper.shell import BookKeeperShell
from connectors.bookkeeper.tls import BookKeeperTls
from connectors.process import ManagedProcess
from core.errors import ServiceError

AUTORECOVERY_CLASS = "org.apache.bookkeeper.replication.AutoRecoveryMain"
WRITER_SOURCE = Path(__file__).resolve().parents[2] / "infra" / "bookkeeper" / "LedgerWriter.java"


def bookkeeper_classpath() -> str:
    """The ``java -cp`` value of the bookkeeper component (fetched by Maven on first use).

    Example:
        >>> # bookkeeper_classpath()  ->  '<clone>/.jars/bookkeeper/*', the jars copied on first use
    """
    from connectors.jars import classpath

    return classpath("bookkeeper")


@dataclass
class RealBookKeeperCluster:
    """``bookies`` real bookies (bookie ``i`` on 127.0.0.(i+1), rack ``/rack-((i-1) % racks + 1)``).

    Example:
        >>> RealBookKeeperCluster("/tmp/x", "127.0.0.1:2181").service_uri
        'zk+hierarchical://127.0.0.1:2181/ledgers'
    """

    state_dir: Path
    zookeeper: str
    bookies: int = 3
    racks: int = 2
    prefix: str = ""
    classpath: str | None = None
    java_bin: str = "java"
    start_timeout_s: float = 90.0
    bookie_conf: dict[str, object] = field(default_factory=dict)
    #: A secured cluster: ZooKeeper over TLS for every JVM and kazoo client, bookies with TLS and roles.
    tls: BookKeeperTls | None = None

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).absolute()
        if self.prefix and (not self.prefix.startswith("/") or self.prefix.endswith("/")):
            raise ServiceError(f"bookkeeper prefix {self.prefix!r}: must start with '/' and not end with one")
        self._bookies = {index: self._make_bookie(index) for index in range(1, self.bookies + 1)}
        self._auditor = ManagedProcess(
            "autorecovery", self.state_dir / "autorecovery", marker=str(self._auditor_conf)
        )

    def _make_bookie(self, index: int) -> RealBookie:
        return RealBookie(
            self.state_dir / f"bookie-{index}",
            index,
            self.service_uri,
            classpath=self.classpath or "",
            java_bin=self.java_bin,
            extra_conf={**(self.tls.bookie_conf() if self.tls else {}), **self.bookie_conf},
            jvm_options=self._jvm_tls,
        )

    @property
    def _jvm_tls(self) -> tuple[str, ...]:
        return self.tls.zookeeper_jvm_options() if self.tls is not None else ()

    @property
    def _client_tls(self) -> dict[str, object]:
        return self.tls.client_conf() if self.tls is not None else {}

    # -- names -----------------------------------------------------------------------------------------
    @property
    def ledgers_root(self) -> str:
        return f"{self.prefix}/ledgers"

    @property
    def rack_map_znode(self) -> str:
        return f"{self.prefix}/bookies"

    @property
    def service_uri(self) -> str:
        """BookKeeper's ``metadataServiceUri`` for this cluster."""
        return f"zk+hierarchical://{self.zookeeper}{self.ledgers_root}"

    @property
    def rack_script(self) -> Path:
        return Path(self.state_dir) / "racks.sh"

    @property
    def _auditor_conf(self) -> Path:
        return Path(self.state_dir) / "autorecovery" / "autorecovery.conf"

    def rack_of(self, index: int) -> str:
        return f"/rack-{(index - 1) % max(self.racks, 1) + 1}"

    def bookie(self, index: int) -> RealBookie:
        """Bookie ``index`` (1-based)."""
        try:
            return self._bookies[index]
        except KeyError:
            raise ServiceError(f"no bookie {index} (the cluster has {self.bookies})") from None

    def all_bookies(self) -> list[RealBookie]:
        return list(self._bookies.values())

    def shell(self) -> BookKeeperShell:
        """BookKeeper's shell on this cluster."""
        return BookKeeperShell(
            Path(self.state_dir) / "shell",
            self.service_uri,
            self._classpath(),
            self.java_bin,
            jvm_options=self._jvm_tls,
        )

    def _classpath(self) -> str:
        if not self.classpath:
            self.classpath = bookkeeper_classpath()
            for bookie in self._bookies.values():
                bookie.classpath = self.classpath
        return self.classpath

    # -- ZooKeeper -------------------------------------------------------------------------------------
    def _kazoo(self) -> KazooClient:
        tls = self.tls.kazoo_options() if self.tls is not None else {}
        client = KazooClient(hosts=self.zookeeper, timeout=10.0, **tls)
        try:
            client.start(timeout=15.0)
        except Exception as err:
            raise ServiceError(
                f"bookkeeper cluster: ZooKeeper {self.zookeeper} unreachable ({err})"
            ) from None
        return client

    def _owners(self, client: KazooClient, bookie_id: str) -> set[int]:
        """The sessions owning ``bookie_id``'s registrations now (writable or read-only)."""
        available = f"{self.ledgers_root}/available"
        stats = (
            client.exists(f"{available}/{bookie_id}"),
            client.exists(f"{available}/readonly/{bookie_id}"),
        )
        return {stat.ephemeralOwner for stat in stats if stat is not None}

    def _registered(self, client: KazooClient, bookie: RealBookie) -> Callable[[], bool]:
        """A readiness check: registered by a session other than the ones registered before a stopped
        bookie is launched (after ``kill -9`` the old registration lives until its session expires)."""
        stale = set() if bookie.is_running() else self._owners(client, bookie.bookie_id)
        return lambda: bool(self._owners(client, bookie.bookie_id) - stale)

    def rack_map(self, groups: dict[int, str] | None = None) -> dict[str, dict[str, dict[str, str]]]:
        """Pulsar's ``BookiesRackConfiguration`` JSON for the bookies: each in its affinity group of
        ``groups`` (bookie index → group), else in group ``default``."""
        document: dict[str, dict[str, dict[str, str]]] = {}
        for bookie in self._bookies.values():
            group = (groups or {}).get(bookie.index, "default")
            info = {"rack": self.rack_of(bookie.index), "hostname": bookie.address}
            document.setdefault(group, {})[bookie.bookie_id] = info
        return document

    def set_groups(self, groups: dict[int, str] | None) -> None:
        """Rewrite the rack map znode with the bookies in these affinity groups (None: all ``default``),
        as Pulsar's ``bookies set-bookie-rack --group`` does; racks are unchanged."""
        client = self._kazoo()
        try:
            client.set(self.rack_map_znode, json.dumps(self.rack_map(groups), sort_keys=True).encode())
        finally:
            client.stop()
            client.close()

    def _write_racks(self, client: KazooClient) -> None:
        data = json.dumps(self.rack_map(), sort_keys=True).encode()
        if client.exists(self.rack_map_znode):
            client.set(self.rack_map_znode, data)
        else:
            client.create(self.rack_map_znode, data, makepath=True)
        # ScriptBasedMapping passes host names (each bookie has its own address) and reads one rack each.
        cases = "".join(
            f'    {bookie.address}|{bookie.address}:*) echo "{self.rack_of(bookie.index)}" ;;\n'
            for bookie in self._bookies.values()
        )
        default = '    *) echo "/default-rack" ;;\n'
        script = f'#!/bin/sh\nfor host in "$@"; do\n  case "$host" in\n{cases}{default}  esac\ndone\n'
        self.rack_script.write_text(script)
        self.rack_script.chmod(0o755)

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        """Format the cluster if new, write the rack map, start every bookie and wait until all registered."""
        Path(self.state_dir).mkdir(parents=True, exist_ok=True)
        self._classpath()
        client = self._kazoo()
        try:
            if not client.exists(f"{self.ledgers_root}/LAYOUT"):
                if self.prefix:
                    client.ensure_path(self.prefix)
                self.shell().init_new_cluster()
            for bookie in self._bookies.values():
                if bookie.port == 0:
                    from connectors.process import free_port

                    bookie.port = free_port(bookie.address)
            self._write_racks(client)
            checks = {}
            for bookie in self._bookies.values():
                checks[bookie.index] = self._registered(client, bookie)
                bookie.launch()
            try:
                for bookie in self._bookies.values():
                    bookie.wait_ready(checks[bookie.index], self.start_timeout_s)
            except ServiceError:
                self.stop()
                raise
        finally:
            client.stop()
            client.close()

    def start_bookie(self, index: int, *, read_only: bool = False) -> None:
        """(Re)start bookie ``index`` (``read_only``: ``forceReadOnlyBookie``) and wait until registered."""
        bookie = self.bookie(index)
        self._classpath()
        client = self._kazoo()
        try:
            bookie.start(self._registered(client, bookie), self.start_timeout_s, read_only=read_only)
        finally:
            client.stop()
            client.close()

    def restart_bookie(self, index: int, *, read_only: bool = False) -> None:
        """Stop bookie ``index`` cleanly and start it again (same port and data)."""
        self.bookie(index).stop()
        self._wait_unregistered(index)
        self.start_bookie(index, read_only=read_only)

    def _wait_unregistered(self, index: int, timeout: float = 30.0) -> None:
        bookie = self.bookie(index)
        client = self._kazoo()
        try:
            deadline = time.monotonic() + timeout
            while self._owners(client, bookie.bookie_id) and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            client.stop()
            client.close()

    def stop(self) -> dict[str, bool]:
        """Stop the Auditor and every bookie; data stays. Reports which were running."""
        report = {"autorecovery": self.stop_auditor()}
        for bookie in self._bookies.values():
            report[bookie.name] = bookie.stop()
        return report

    def status(self) -> dict[str, Any]:
        """Pid, bookie id, rack and log file of each bookie, and the Auditor's pid."""
        return {
            "ledgers_root": self.ledgers_root,
            "service_uri": self.service_uri,
            "rack_map_znode": self.rack_map_znode,
            "bookies": [
                {
                    "name": bookie.name,
                    "bookie_id": bookie.bookie_id if bookie.port else None,
                    "rack": self.rack_of(bookie.index),
                    "pid": bookie.pid(),
                    "log": str(bookie.log_file),
                }
                for bookie in self._bookies.values()
            ],
            "autorecovery_pid": self._auditor.pid(),
        }

    # -- ledgers ---------------------------------------------------------------------------------------
    def write_ledgers(
        self,
        count: int,
        *,
        ensemble: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        entries: int = 5,
        open_ledgers: int = 0,
        topic_prefix: str = "public/default/persistent/bkaudit",
        custom: tuple[str, bytes] | None = None,
        timeout: float = 300.0,
    ) -> dict[str, Any]:
        """Create ``count`` ledgers with BookKeeper's Java client (rack-aware placement over the rack
        script), ``entries`` entries each, the last ``open_ledgers`` left open, with Pulsar's custom
        metadata (and ``custom``, one more key and UTF-8 value). Returns
        ``{"closed": [ids], "open": [ids], "seconds": s}``."""
        argv = [
            java_binary(self.java_bin),
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            *JVM_OPENS,
            *self._jvm_tls,
            f"-Dlog4j2.configurationFile={self._writer_log4j()}",
            "-cp",
            self._classpath(),
            str(WRITER_SOURCE),
            *("--conf", str(self._client_conf()), "--ledgers", str(count), "--ensemble", str(ensemble)),
            *(
                "--write-quorum",
                str(write_quorum),
                "--ack-quorum",
                str(ack_quorum),
                "--entries",
                str(entries),
            ),
            *("--open", str(open_ledgers), "--topic-prefix", topic_prefix),
            *(("--custom-key", custom[0], "--custom-value", custom[1].decode()) if custom else ()),
        ]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise ServiceError(f"LedgerWriter: not done in {timeout:.0f} s") from None
        if done.returncode != 0:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise ServiceError(f"LedgerWriter exit {done.returncode}: {tail}")
        try:
            return dict(json.loads(done.stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            raise ServiceError(f"LedgerWriter printed no JSON: {done.stdout[-300:]!r}") from None

    def _client_conf(self) -> Path:
        """The writer's client configuration: this cluster, rack-aware placement over the rack script."""
        path = Path(self.state_dir) / "client.conf"
        values: dict[str, object] = {
            "metadataServiceUri": self.service_uri,
            "zkTimeout": 10000,
            "addEntryTimeout": 30,
            "ensemblePlacementPolicy": "org.apache.bookkeeper.client.RackawareEnsemblePlacementPolicy",
            "networkTopologyScriptFileName": self.rack_script,
            **self._client_tls,
        }
        path.write_text(render_conf(values))
        return path

    def _writer_log4j(self) -> Path:
        path = Path(self.state_dir) / "writer-log4j2.properties"
        log = Path(self.state_dir) / "ledger-writer.log"
        path.write_text(
            "status = error\nappender.f.type = File\nappender.f.name = F\n"
            f"appender.f.fileName = {log}\nappender.f.layout.type = PatternLayout\n"
            "appender.f.layout.pattern = %d %-5p [%t] %c{1}: %m%n\n"
            "rootLogger.level = WARN\nrootLogger.appenderRef.f.ref = F\n"
        )
        return path

    # -- Auditor ---------------------------------------------------------------------------------------
    def start_auditor(self, check_interval_s: int = 5, timeout: float = 60.0) -> None:
        """Start BookKeeper's ``AutoRecoveryMain`` (Auditor + ReplicationWorker) with
        ``lostBookieRecoveryDelay=0`` and short audit intervals; waits until an Auditor is elected."""
        if self._auditor.pid() is None:
            conf = self._auditor_conf
            conf.parent.mkdir(parents=True, exist_ok=True)
            values: dict[str, object] = {
                "metadataServiceUri": self.service_uri,
                "zkTimeout": 10000,
                "lostBookieRecoveryDelay": 0,
                "auditorPeriodicCheckInterval": check_interval_s,
                "auditorPeriodicBookieCheckInterval": check_interval_s,
                "auditorPeriodicPlacementPolicyCheckInterval": check_interval_s,
                "networkTopologyScriptFileName": self.rack_script,
                "ensemblePlacementPolicy": "org.apache.bookkeeper.client.RackawareEnsemblePlacementPolicy",
                "httpServerEnabled": False,
                "allowLoopback": True,
                **self._client_tls,
            }
            conf.write_text(render_conf(values))
            log4j = conf.parent / "log4j2.properties"
            log4j.write_text(
                "status = warn\nappender.f.type = File\nappender.f.name = F\n"
                f"appender.f.fileName = {self._auditor.log_file}\nappender.f.layout.type = PatternLayout\n"
                "appender.f.layout.pattern = %d{ISO8601} %-5p [%t] %c{1}: %m%n\n"
                "rootLogger.level = INFO\nrootLogger.appenderRef.f.ref = F\n"
                "logger.zk.name = org.apache.zookeeper\nlogger.zk.level = WARN\n"
            )
            argv = [
                java_binary(self.java_bin), "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                *JVM_OPENS, *self._jvm_tls,
                f"-Dlog4j2.configurationFile={log4j}", "-cp", self._classpath(), AUTORECOVERY_CLASS,
                "--conf", str(conf),
            ]  # fmt: skip
            self._auditor.start(argv)
        client = self._kazoo()
        election = f"{self.ledgers_root}/underreplication/auditorelection"
        try:
            self._auditor.wait_until(
                lambda: bool(client.exists(election) and client.get_children(election)),
                timeout,
                what="electing an Auditor",
            )
        finally:
            client.stop()
            client.close()

    def stop_auditor(self) -> bool:
        """Stop ``AutoRecoveryMain``; True when it was running."""
        return self._auditor.stop()

    @property
    def auditor_log_file(self) -> Path:
        return self._auditor.log_file
