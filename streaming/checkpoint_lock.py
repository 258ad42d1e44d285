"""One job per checkpoint: an exclusive OS lock on a file in the checkpoint directory, held for its life.

Two jobs on one checkpoint run side by side for a while (both republishing alerts), then one dies with a
misleading Delta commit error. The lock refuses the second at start, naming the holder. It is a
``fcntl.flock`` on ``<checkpoint>/bkaudit.lock``: the kernel releases it when the holding process ends,
however it ends (``kill -9`` included), so a stale lock file never blocks a restart; the pid, host and start
time written into the file are only there to name the holder.

Limits: ``flock`` is per host on local filesystems (and emulated on NFS v4). A checkpoint on HDFS or an object
store (through ``fs.defaultFS``) is not where the lock lives: the lock file is then on the driver host's local
disk at the same path and only stops a second job on that host: ``stream.lease = zookeeper`` adds a lease
in ZooKeeper that holds across hosts (:mod:`connectors.zookeeper.lease`); see infra/README.md.

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> with CheckpointLock(folder):
    ...     try:
    ...         CheckpointLock(folder).acquire()
    ...     except ConfigError as err:
    ...         print("refused:", "is in use by pid" in str(err))
    refused: True
    >>> with CheckpointLock(folder) as lock:  # released: the next one gets it
    ...     lock.holder()["pid"] == os.getpid()
    True
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from core.errors import ConfigError

LOCK_FILE = "bkaudit.lock"


class CheckpointLock:
    """The exclusive lock of one checkpoint directory (which must exist)."""

    def __init__(self, checkpoint: Path) -> None:
        self.checkpoint = checkpoint
        self.path = checkpoint / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`ConfigError` naming the holder; then record who holds it."""
        # O_CLOEXEC (Python's default): the JVM and worker processes this job starts do not inherit the lock,
        # so it ends with this process.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(_read_holder(fd))
            os.close(fd)
            raise ConfigError(
                f"checkpoint {self.checkpoint} is in use by {holder}: another `bkaudit stream` runs on it; "
                f"stop that one first, or give this one its own checkpoint_root/stream.app_id "
                f"(the lock is {self.path}; it is released when its holder exits)"
            ) from None
        except OSError as err:
            os.close(fd)
            raise ConfigError(f"cannot lock checkpoint {self.checkpoint}: {err.strerror}") from None
        self._fd = fd
        _write_holder(fd)

    def holder(self) -> dict[str, Any]:
        """What the lock file says about its holder (empty when unreadable)."""
        with contextlib.suppress(OSError), open(self.path, "rb") as file:
            return _parse_holder(file.read())
        return {}

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> CheckpointLock:
        self.acquire()
        return self

    def __exit__(
        self, _type: type[BaseException] | None, _value: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.release()


def _write_holder(fd: int) -> None:
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        return _parse_holder(os.pread(fd, 4096, 0))
    except OSError:
        return {}


def recorded_holder(checkpoint: Path) -> dict[str, Any]:
    """What the lock file of ``checkpoint`` says of its last holder (``pid``, ``host``, ``started_at``); an
    empty dict when there is no file or it says nothing readable. Whether that holder still runs is the
    kernel's lock table's to say, not the file's.

    Example:
        >>> import tempfile
        >>> recorded_holder(Path(tempfile.mkdtemp()))
        {}
    """
    try:
        return _parse_holder((checkpoint / LOCK_FILE).read_bytes())
    except OSError:
        return {}


def _parse_holder(data: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(data.decode("utf-8"))
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    """``pid 42 on host-a since 2026-01-01T00:00:00Z`` (or a note that the holder is still starting).

    Example:
        >>> _describe({"pid": 42, "host": "a", "started_at": "2026-01-01T00:00:00Z"})
        'pid 42 on a since 2026-01-01T00:00:00Z'
        >>> _describe({})
        'a process that has not recorded itself yet'
    """
    if "pid" not in holder:
        return "a process that has not recorded itself yet"
    return f"pid {holder['pid']} on {holder.get('host', '?')} since {holder.get('started_at', '?')}"
