"""Operating-system names for threads, so ``top -H``, ``ps -L`` and ``/proc`` tell them apart.

Python (before 3.14) leaves every thread with the process's name. On Linux a thread can rename itself
through ``/proc/self/task/<tid>/comm`` (15 bytes at most); elsewhere, or when that fails, nothing happens.

Example:
    >>> seen = []
    >>> run = named_target("bk-doc-example", lambda: seen.append(current_thread_os_name()))
    >>> thread = threading.Thread(target=run); thread.start(); thread.join()
    >>> seen[0] in ("bk-doc-example", None)
    True
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Bytes of a Linux thread name (``TASK_COMM_LEN`` less the terminating zero).
MAX_NAME_BYTES = 15


def _comm_path() -> Path:
    return Path(f"/proc/self/task/{threading.get_native_id()}/comm")


def name_this_thread(name: str) -> bool:
    """Give the calling thread ``name`` (cut to 15 bytes) as its OS name; True when that worked.

    Example:
        >>> done = []
        >>> thread = threading.Thread(target=lambda: done.append(name_this_thread("bk-doc")))
        >>> thread.start(); thread.join(); done[0] in (True, False)
        True
    """
    with contextlib.suppress(OSError):
        _comm_path().write_bytes(name.encode()[:MAX_NAME_BYTES])
        return True
    return False


def current_thread_os_name() -> str | None:
    """The calling thread's OS name (None where it cannot be read).

    Example:
        >>> current_thread_os_name() is None or isinstance(current_thread_os_name(), str)
        True
    """
    with contextlib.suppress(OSError):
        return _comm_path().read_text().strip()
    return None


def named_target(name: str, target: Callable[..., Any]) -> Callable[..., Any]:
    """``target``, run in a thread that first takes ``name`` as its OS name (see :func:`name_this_thread`).

    Example:
        >>> results = []
        >>> run = named_target("bk-x", lambda value: results.append(value * 2))
        >>> thread = threading.Thread(target=run, args=(21,)); thread.start(); thread.join(); results
        [42]
    """

    def run(*args: Any, **kwargs: Any) -> Any:
        name_this_thread(name)
        return target(*args, **kwargs)

    return run


__all__ = ["MAX_NAME_BYTES", "current_thread_os_name", "name_this_thread", "named_target"]
