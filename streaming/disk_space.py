"""Full disks: the free space of the job's directories, and one line when a write found none.

A full lakehouse or checkpoint volume makes a write fail deep inside delta-rs, Spark or Python, with a
traceback per layer that names neither the directory nor the setting, and delta-rs (object_store's
buffered writer, aborted after its failed flush) prints a Rust panic of a worker thread besides. So the job
keeps a floor: :func:`floor_check` runs before every batch and table write (and at the start) and stops the
job with one line naming the directory when its volume has less than ``stream.disk_floor_mb`` free, before
a write can meet the full disk. A write that meets it anyway (one larger than the floor, another process
filling the volume) is caught too: :func:`full_disk_failure` turns such a failure (errno ``ENOSPC``
anywhere in its chain or text) into one :class:`ServiceError` line naming the fullest of the job's
directories and its setting. :func:`free_space` feeds the ``bkaudit_stream_disk_free_ratio`` gauge (a
Prometheus rule warns before it happens) and ``bkaudit status``.

Example:
    >>> import errno, tempfile
    >>> dirs = {"lakehouse_root": tempfile.gettempdir()}
    >>> err = OSError(errno.ENOSPC, "No space left on device")
    >>> str(full_disk_failure(err, dirs)).startswith("no space left on the device of lakehouse_root")
    True
    >>> full_disk_failure(ValueError("something else"), dirs) is None
    True
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from core.errors import ServiceError
from core.settings import Settings

#: The text each layer uses for ENOSPC (strerror; Java's IOException says the same).
_NO_SPACE = "No space left on device"
#: Below this free share a volume is reported by ``bkaudit status`` (and the Prometheus rule fires).
LOW_FREE_RATIO = 0.1


def job_directories(settings: Settings) -> dict[str, str | Path]:
    """The directories the job writes, by setting (their volumes must not fill up; tables on an object
    store have no volume here).

    Example:
        >>> sorted(job_directories(Settings()))
        ['checkpoint_root', 'lakehouse_root', 'log_dir']
        >>> sorted(job_directories(Settings(object_store={"lakehouse_url": "s3://b/lh"})))
        ['checkpoint_root', 'log_dir']
    """
    local: dict[str, str | Path] = (
        {} if settings.object_store.lakehouse_url else {"lakehouse_root": settings.lakehouse_root}
    )
    return {**local, "checkpoint_root": settings.checkpoint_root, "log_dir": settings.log_dir}


def low_free_space(settings: Settings) -> list[str]:
    """The job's directories whose volume is less than a tenth free or below the job's floor
    (``stream.disk_floor_mb``, where the job stops), described (for ``bkaudit status``).

    Example:
        >>> huge_floor = Settings(stream={"disk_floor_mb": 2**40})  # more than any volume holds
        >>> {"checkpoint_root", "lakehouse_root"} <= {line.split()[0] for line in low_free_space(huge_floor)}
        True
    """
    floor_bytes = settings.stream.disk_floor_mb * 2**20
    floored = floor_directories(settings)
    return [
        f.describe()
        for f in free_space(job_directories(settings))
        if f.ratio < LOW_FREE_RATIO or (f.setting in floored and f.free < floor_bytes)
    ]


@dataclass(frozen=True)
class FreeSpace:
    """Free and total bytes of the volume holding one of the job's directories."""

    setting: str
    path: str
    free: int
    total: int

    @property
    def ratio(self) -> float:
        return self.free / self.total if self.total else 0.0

    def describe(self) -> str:
        """``lakehouse_root /data/lh: 1.2 GiB free of 100.0 GiB (1 %)``.

        Example:
            >>> FreeSpace("lakehouse_root", "/lh", 2**30, 100 * 2**30).describe()
            'lakehouse_root /lh: 1.0 GiB free of 100.0 GiB (1 %)'
        """
        share = f"{self.ratio * 100:.0f} %"
        return f"{self.setting} {self.path}: {_size(self.free)} free of {_size(self.total)} ({share})"


def _size(count: int) -> str:
    """Bytes in GiB, or in MiB or KiB below a GiB (a small volume is not "0.0 GiB free of 0.0 GiB").

    Example:
        >>> _size(3 * 2**30), _size(640 * 2**10), _size(5 * 2**20)
        ('3.0 GiB', '640 KiB', '5.0 MiB')
    """
    if count >= 2**30:
        return f"{count / 2**30:.1f} GiB"
    if count >= 2**20:
        return f"{count / 2**20:.1f} MiB"
    return f"{count / 2**10:.0f} KiB"


def free_space(directories: Mapping[str, str | Path]) -> list[FreeSpace]:
    """The free space of each directory's volume (the nearest existing parent of a path not made yet).

    Example:
        >>> import tempfile
        >>> [f.setting for f in free_space({"checkpoint_root": tempfile.gettempdir()})]
        ['checkpoint_root']
    """
    found = []
    for setting, path in directories.items():
        existing = Path(path)
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        try:
            usage = shutil.disk_usage(existing)
        except OSError:
            continue
        found.append(FreeSpace(setting, str(path), usage.free, usage.total))
    return found


def floor_directories(settings: Settings) -> dict[str, str | Path]:
    """The directories whose volumes the floor keeps free: the lakehouse (when local) and the checkpoint.

    Example:
        >>> sorted(floor_directories(Settings()))
        ['checkpoint_root', 'lakehouse_root']
    """
    return {k: v for k, v in job_directories(settings).items() if k != "log_dir"}


def below_floor(directories: Mapping[str, str | Path], floor_bytes: int) -> ServiceError | None:
    """One line for the first directory whose volume has less than ``floor_bytes`` free (None if none).

    Example:
        >>> import tempfile
        >>> below_floor({"checkpoint_root": tempfile.gettempdir()}, 0) is None
        True
        >>> line = str(below_floor({"checkpoint_root": tempfile.gettempdir()}, 2**62))
        >>> line.startswith("too little space left on the device of checkpoint_root")
        True
    """
    for space in free_space(directories):
        if space.free < floor_bytes:
            return ServiceError(
                f"too little space left on the device of {space.describe()}: the job keeps "
                f"stream.disk_floor_mb ({_size(floor_bytes)}) free; free space there (or move "
                f"{space.setting}) and start the job again: it resumes from its checkpoint"
            )
    return None


def floor_check(settings: Settings) -> Callable[[], None]:
    """The check run before every batch and table write: raises :func:`below_floor`'s line.

    Example:
        >>> floor_check(Settings(stream={"disk_floor_mb": 0}))()  # 0: no floor
    """
    directories = floor_directories(settings)
    floor_bytes = settings.stream.disk_floor_mb * 2**20

    def check() -> None:
        if floor_bytes:
            low = below_floor(directories, floor_bytes)
            if low is not None:
                raise low

    return check


def full_disk_failure(failure: object, directories: Mapping[str, str | Path]) -> ServiceError | None:
    """One line for a failure that is a full disk (None for anything else), naming the fullest directory."""
    if not _is_no_space(failure):
        return None
    spaces = sorted(free_space(directories), key=lambda f: f.ratio)
    where = spaces[0].describe() if spaces else "the job's directories"
    setting = spaces[0].setting if spaces else "lakehouse_root"
    return ServiceError(
        f"no space left on the device of {where}; free space there (or move {setting}) and start the job "
        f"again: it resumes from its checkpoint"
    )


def _is_no_space(failure: object) -> bool:
    seen: set[int] = set()
    current: object = failure
    while isinstance(current, BaseException) and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno == errno.ENOSPC:
            return True
        if _NO_SPACE in str(current):
            return True
        current = current.__cause__ or current.__context__
    return isinstance(failure, str) and _NO_SPACE in failure


__all__ = [
    "LOW_FREE_RATIO",
    "FreeSpace",
    "below_floor",
    "floor_check",
    "floor_directories",
    "free_space",
    "full_disk_failure",
    "job_directories",
    "low_free_space",
]
