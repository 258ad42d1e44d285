"""Start, find and stop the local server processes bkaudit owns (embedded ZooKeeper and broker).

A :class:`ManagedProcess` is a daemon started in its own session with a pid file and a log file in a state
directory, so it outlives the command that started it and a later ``bkaudit dev down`` can find it. Stopping
checks that the pid still belongs to us (its command line names our marker) so a recycled pid is never
killed.

Example:
    >>> port = free_port()
    >>> 1024 <= port <= 65535
    True
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import ServiceError

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free a moment ago on ``host``.

    Example:
        >>> isinstance(free_port(), int)
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def ensure_port_free(port: int, what: str, host: str = LOOPBACK) -> None:
    """Raise a clear :class:`ServiceError` when ``port`` is already taken (rather than hang later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            raise ServiceError(f"{what}: port {host}:{port} is already in use ({err.strerror})") from None


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """True when ``port`` can be bound on ``host`` now.

    Example:
        >>> port_is_free(free_port())
        True
    """
    try:
        ensure_port_free(port, "probe", host)
    except ServiceError:
        return False
    return True


def port_open(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def recorded_int(config_file: Path, key: str) -> int | None:
    """The integer ``key=value`` line of a properties-style file a service was started with, or None.

    A restarted service reuses the port its earlier start wrote into its own configuration file.

    Example:
        >>> import tempfile
        >>> conf = Path(tempfile.mkdtemp()) / "zoo.cfg"
        >>> _ = conf.write_text("tickTime=500\\nclientPort=2181\\n")
        >>> recorded_int(conf, "clientPort"), recorded_int(conf, "bookiePort")
        (2181, None)
        >>> recorded_int(conf.with_name("missing.cfg"), "clientPort") is None
        True
    """
    try:
        for line in config_file.read_text().splitlines():
            if line.startswith(f"{key}="):
                return int(line.split("=", 1)[1])
    except (OSError, ValueError):
        return None
    return None


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (IPv4 and IPv6, any address), read from ``/proc``.

    Example:
        >>> with socket.socket() as server:
        ...     server.bind((LOOPBACK, 0)); server.listen()
        ...     server.getsockname()[1] in listening_ports(os.getpid())
        True
    """
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    ports: set[int] = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            for fields in (line.split() for line in lines):
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def pid_alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        status = Path(f"/proc/{pid}/stat").read_text()
        if status.rsplit(")", 1)[-1].split()[0] == "Z":
            return False
    return True


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


class ProcessService:
    """What an embedded service says of its one :class:`ManagedProcess` (``self._process``): its pid,
    whether it runs, its log file.

    Example:
        >>> class Service(ProcessService):
        ...     def __init__(self, state_dir: Path) -> None:
        ...         self._process = ManagedProcess("svc", state_dir, marker="svc-marker")
        >>> service = Service(Path("/tmp/bkaudit-doc-svc"))
        >>> service.log_file.name, service.is_running()
        ('svc.log', False)
    """

    _process: ManagedProcess

    @property
    def log_file(self) -> Path:
        return self._process.log_file

    def pid(self) -> int | None:
        return self._process.pid()

    def is_running(self) -> bool:
        return self.pid() is not None


@dataclass
class ManagedProcess:
    """One server process owned by bkaudit, identified by ``name`` inside ``state_dir``.

    ``marker`` must appear in the process's command line; it guards against killing a recycled pid.
    """

    name: str
    state_dir: Path
    marker: str
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def pid_file(self) -> Path:
        return self.state_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.state_dir / f"{self.name}.log"

    def pid(self) -> int | None:
        """The pid of our running process, or None (stale pid files are ignored)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if pid_alive(pid) and self.marker in _cmdline(pid):
            return pid
        return None

    def start(self, argv: Sequence[str], env: dict[str, str] | None = None) -> int:
        """Start ``argv`` detached (own session), output to the log file; returns the pid."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            try:
                self._popen = subprocess.Popen(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=env,
                    cwd=self.state_dir,
                )
            except FileNotFoundError:
                raise ServiceError(f"{self.name}: cannot run {argv[0]!r}: not found") from None
        self.pid_file.write_text(f"{self._popen.pid}\n")
        return self._popen.pid

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``ready`` until true; fail fast with the log tail if the process dies or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            if self._popen is not None and self._popen.poll() is not None:
                raise ServiceError(
                    f"{self.name} exited with code {self._popen.returncode} before {what}; "
                    f"log {self.log_file}: {self.log_tail(5)}"
                )
            time.sleep(0.1)
        raise ServiceError(
            f"{self.name}: not {what} after {timeout:.0f} s; log {self.log_file}: {self.log_tail(5)}"
        )

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log, joined with ' | ' when used in one-line errors."""
        try:
            text = self.log_file.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return "(no log)"
        return " | ".join(line.strip() for line in text if line.strip()) if lines <= 5 else "\n".join(text)

    def stop(self, timeout: float = 10.0, *, hard: bool = False) -> bool:
        """Stop our process (SIGTERM, then SIGKILL after ``timeout``); True when one was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL if hard else signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pid_alive(pid) and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.05)
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            while pid_alive(pid):
                self._reap()
                time.sleep(0.05)
        self._reap()
        self.pid_file.unlink(missing_ok=True)
        return True

    def _reap(self) -> None:
        if self._popen is not None:
            with contextlib.suppress(Exception):
                self._popen.poll()
