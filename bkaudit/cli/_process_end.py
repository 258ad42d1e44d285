"""The end of a command's own process, for commands that must not go through the interpreter's teardown.

``bkaudit stream`` leaves native threads behind when it stops: delta-rs's Tokio runtime, Arrow's thread
pools, the Kafka and ZooKeeper clients' threads, daemon threads blocked in native calls. At interpreter
teardown Python 3.11 ends a daemon thread that wakes up with ``pthread_exit``, whose forced unwinding
through C++ frames calls ``std::terminate``, and static destructors stop thread pools whose threads still
run: the process then aborts (SIGABRT, "terminate called without an active exception", exit 134) after
it has printed its line, and a service manager sees a crash instead of exit 2. Such a command calls
:func:`skip_teardown`; when it runs as the process' own command line (:func:`owns_process`: it may then
stop what the process holds, as ``bkaudit stream`` stops its Spark context before its line), :func:`finish`
flushes the logs and the standard streams and ends the process with its exit code at once
(``os._exit``). What the job committed is on disk by then: its batch logs and queued batches are
fsynced, Delta commits are files written before they count, and alerts are acknowledged by Kafka before
any table write.

Example:
    >>> finish(0)  # nothing asked for it: returns, the caller exits as usual
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

_owned = False
_requested = False


def own_process() -> None:
    """Say that the command runs as this process' own command line (not called by code in it)."""
    global _owned
    _owned = True


def owns_process() -> bool:
    """Whether the command may stop what the whole process holds (its Spark context, say)."""
    return _owned


def skip_teardown() -> None:
    """Ask :func:`finish` to end the process without the interpreter's teardown."""
    global _requested
    _requested = True


def finish(code: int) -> None:
    """End the process now with ``code`` (logs and streams flushed) if its own command asked for it."""
    if not (_owned and _requested):
        return
    logging.shutdown()  # flushes and closes every handler: the log file is complete
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream has nothing left to flush
            stream.flush()
    os._exit(code)
