"""The one helper that builds the Spark session, for tests, the demo and production alike.

Everything bkaudit needs from Spark is set here: UTC session time zone, Arrow on, the RocksDB state store
provider (required by ``transformWithStateInPandas`` timers), changelog checkpointing, many recent progress
updates kept for metrics, loopback-only driver in local mode, and ``PYSPARK_PYTHON`` set to the running
interpreter (through :func:`worker_python`) so that Spark's Python workers import the same environment.

Example:
    >>> from core.settings import SparkSettings
    >>> spark_conf(SparkSettings(master="local[2]"), for_tests=True)["spark.ui.enabled"]
    'false'
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import sys
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from core.logsetup import library_log
from core.settings import SparkSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

T = TypeVar("T")

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def spark_conf(settings: SparkSettings, *, for_tests: bool = False) -> dict[str, str]:
    """The Spark configuration :func:`build_spark_session` applies (``extra_conf`` wins).

    Example:
        >>> conf = spark_conf(SparkSettings())
        >>> conf["spark.sql.streaming.stateStore.providerClass"].endswith("RocksDBStateStoreProvider")
        True
    """
    conf = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.streaming.numRecentProgressUpdates": str(settings.num_recent_progress_updates),
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.driver.memory": settings.driver_memory,
        "spark.ui.enabled": "false" if for_tests else str(settings.ui_enabled).lower(),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.adaptive.enabled": "false" if for_tests else "true",
        "spark.executorEnv.PYSPARK_PYTHON": worker_python(),
    }
    if settings.master.startswith("local"):
        # Local mode talks only to itself; never listen on a public interface.
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
    if for_tests:
        conf["spark.sql.streaming.stopActiveRunOnRestart"] = "true"
        conf["spark.sql.streaming.forceDeleteTempCheckpointLocation"] = "true"
        conf["spark.python.worker.reuse"] = "true"
    conf.update(settings.extra_conf)
    return conf


#: The start of Spark's Python workers: this interpreter (@PYTHON@), without pyspark.zip on PYTHONPATH.
_WORKER_PYTHON = """#!/bin/sh
# Spark's Python workers, written by bkaudit (streaming/session.py): pyspark is imported from the installed
# package, which has compiled bytecode, not from pyspark.zip, which Spark puts first on PYTHONPATH and whose
# modules Python compiles again at every worker start.
set -f
kept=
old_ifs=$IFS
IFS=:
for entry in $PYTHONPATH; do
  case $entry in
    */python/lib/pyspark.zip) ;;
    *) kept=${kept:+$kept:}$entry ;;
  esac
done
IFS=$old_ifs
PYTHONPATH=$kept
export PYTHONPATH
# A streaming source's runner that ends quietly when its query stops (streaming/source_runner.py).
if [ "$1" = "-m" ] && [ "$2" = "pyspark.sql.streaming.python_streaming_source_runner" ]; then
  shift 2
  exec @PYTHON@ -m streaming.source_runner "$@"
fi
exec @PYTHON@ "$@"
"""


def worker_python() -> str:
    """The executable Spark's Python workers start: a small script that runs this interpreter with
    pyspark imported from the installed package instead of Spark's ``pyspark.zip`` (the same code), and
    a streaming source's runner through :mod:`streaming.source_runner` (quiet when its query stops).

    Spark gives a driver-side worker (a Python data source's reader, ``transformWithStateInPandas``'s
    set-up) a fixed 10 s to start and connect back. From the zip, Python compiles pyspark's modules at
    every start: 1.5 s of CPU for a data source's reader against 0.5 s from the package, which on a busy
    host is the difference. When the zip belongs to another Spark than the installed pyspark, or the
    script cannot be written, this is :data:`sys.executable`.

    Example:
        >>> Path(worker_python()).name.startswith(("bkaudit-python-", "python"))
        True
    """
    if not _zip_is_the_installed_pyspark():
        return sys.executable
    script = _WORKER_PYTHON.replace("@PYTHON@", shlex.quote(sys.executable))
    digest = hashlib.sha256(script.encode("utf-8")).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"bkaudit-python-{os.getuid()}-{digest}"
    try:
        if not path.exists():
            staged = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            staged.write_text(script, encoding="utf-8")
            staged.chmod(0o755)
            staged.replace(path)
    except OSError as err:
        logger.info("Python workers start from pyspark.zip (cannot write %s: %s)", path, err)
        return sys.executable
    return str(path)


def _zip_is_the_installed_pyspark() -> bool:
    """Whether Spark's ``python/lib/pyspark.zip`` is the installed pyspark's own (a pip-installed pyspark,
    whose directory is Spark's home)."""
    import pyspark

    installed = Path(pyspark.__file__).parent.resolve()
    home = Path(os.environ.get("SPARK_HOME") or installed).resolve()
    return home == installed and (home / "python" / "lib" / "pyspark.zip").is_file()


def build_spark_session(settings: SparkSettings | None = None, *, for_tests: bool = False) -> SparkSession:
    """Build (or return the already running) Spark session configured for bkaudit.

    Example:
        >>> # spark = build_spark_session(SparkSettings(master="local[2]"))
        >>> # spark.conf.get("spark.sql.session.timeZone")  → 'UTC'
    """
    from pyspark.sql import SparkSession

    settings = settings or SparkSettings()
    if os.environ.get("PYSPARK_PYTHON") in (None, sys.executable):
        os.environ["PYSPARK_PYTHON"] = worker_python()
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # The JVM must run in UTC too: Python data sources convert timestamps on both sides.
    os.environ.setdefault("TZ", "UTC")
    conf = {"spark.master": settings.master, "spark.app.name": settings.app_name}
    conf.update(spark_conf(settings, for_tests=for_tests))
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    log = library_log()
    if log is not None:
        launch_jvm_into(log, conf)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    if settings.local_nice and settings.master.startswith("local"):
        lower_local_priority(session, settings.local_nice)
    return session


def stop_spark(timeout_s: float = 60.0) -> bool:
    """Stop this process' Spark context, if it started one, and wait up to ``timeout_s`` for it; returns
    whether it stopped.

    Run while the process still answers the JVM's callbacks: the JVM tells the session's query listener
    of each query's end and delivers what it queued before its listener bus stops; a process that ends
    first leaves it calling into a closed socket (a Java stack trace on the console).

    Example:
        >>> # stop_spark()  → True (the context stopped, or there was none)
    """
    if "pyspark" not in sys.modules:
        return True
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        return True
    stopping = threading.Thread(target=context.stop, name="bkaudit-spark-stop", daemon=True)
    stopping.start()
    stopping.join(timeout_s)
    return not stopping.is_alive()


class QueryStarter:
    """A Python thread whose peer thread in the local JVM keeps the driver's CPU priority.

    PySpark pins each Python thread to one JVM thread, which runs the calls that Python thread makes. A
    query started from a JVM thread gets its execution thread from it, and with it that thread's priority,
    which passes on to the processes it spawns. The timers query's execution thread spawns a Python worker
    for ``transformWithStateInPandas`` and fails unless that worker connects back within Spark's fixed
    10 s. At ``spark.local_nice`` 10 beside busy processes at nice 0, Python's start-up alone can take
    longer. :func:`lower_local_priority` leaves this thread's peer as it is, so queries started through
    :func:`start_at_driver_priority` get their workers started at the driver's priority.

    Example:
        >>> # starter = QueryStarter(session); starter.jvm_thread  → 6753 (a thread id of the JVM)
    """

    def __init__(self, session: SparkSession):
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="query-starter")
        self.jvm_thread = self._thread.submit(_jvm_thread_of_the_caller, session).result()

    def run(self, call: Callable[[], T]) -> T:
        """Run ``call`` on this thread, so that the JVM work it starts begins at the driver's priority."""
        return self._thread.submit(call).result()


#: The query starter of each local JVM (by its process id), made before the JVM is reniced.
_starters: dict[int, QueryStarter] = {}


def _jvm_thread_of_the_caller(session: SparkSession) -> int | None:
    """The Linux thread id of the JVM thread that serves the calling Python thread, or None off Linux."""
    jvm = session.sparkContext._jvm
    assert jvm is not None  # a live session's context has its gateway
    path = str(jvm.java.io.File("/proc/thread-self").getCanonicalPath())  # /proc/PID/task/TID
    parts = path.split("/")
    return int(parts[-1]) if len(parts) == 5 and parts[3] == "task" else None


def _local_jvm_pid(session: SparkSession) -> int | None:
    process = getattr(session.sparkContext._gateway, "proc", None)  # the JVM that pyspark launched
    return process.pid if process is not None else None


def query_starter(session: SparkSession) -> QueryStarter | None:
    """The local JVM's :class:`QueryStarter`, made on first use; None when the JVM is not this
    process's child on Linux (priorities are the cluster's business then).

    Example:
        >>> # query_starter(session).jvm_thread  → 6753
    """
    pid = _local_jvm_pid(session)
    if pid is None or not Path(f"/proc/{pid}/task").is_dir():
        return None
    if pid not in _starters:
        _starters[pid] = QueryStarter(session)
    return _starters[pid]


def start_at_driver_priority(session: SparkSession, start: Callable[[], Any]) -> Any:
    """Call ``start`` (a streaming query's start) so that the threads and Python workers Spark starts
    for the query run at the driver's priority, whatever ``spark.local_nice`` made of the rest of the JVM.

    Example:
        >>> # query = start_at_driver_priority(spark, writer.start)
    """
    starter = query_starter(session)
    return start() if starter is None else starter.run(start)


def launch_jvm_into(log: Path, conf: dict[str, str]) -> bool:
    """Start Spark's JVM with its stdout and stderr appended to ``log``, unless one runs already.

    Everything the JVM prints lands there: its log4j console output (warnings such as "Current batch is
    falling behind"), its start-up banner, and what the Python workers it starts print (their output is
    copied to the JVM's own streams, outside log4j). Returns whether it started one.

    Example:
        >>> # launch_jvm_into(Path(".bkaudit/logs/stream.log"), {"spark.master": "local[2]"})  → True
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return False
    spark_submit_conf = SparkConf(loadDefaults=False).setAll(list(conf.items()))
    with open(log, "ab") as output:
        gateway = launch_gateway(spark_submit_conf, popen_kwargs={"stdout": output, "stderr": output})
    SparkContext._ensure_initialized(gateway=gateway)
    return True


def lower_local_priority(session: SparkSession, nice: int) -> int:
    """Make every thread of the local Spark JVM at least ``nice``; threads it starts later, and the Python
    workers they spawn, inherit it. The driver keeps its priority, so when the cores are short the loss
    path (a driver thread) runs first and Spark takes what is left. The one exception is the
    :class:`QueryStarter`'s peer thread, and what queries started through it start.
    Linux only (a thread's priority is its own there); returns the threads changed.

    Example:
        >>> # lower_local_priority(build_spark_session(SparkSettings(master="local[2]")), 5)  → 57
    """
    starter = query_starter(session)
    if starter is None:
        logger.info("spark.local_nice applies only to a JVM this process launched on Linux; ignored")
        return 0
    tasks = Path(f"/proc/{_local_jvm_pid(session)}/task")
    changed = 0
    for _ in range(2):  # a second pass for threads started during the first
        for task in tasks.iterdir():
            if task.name == str(starter.jvm_thread):
                continue  # it starts the queries (QueryStarter says why)
            try:
                if os.getpriority(os.PRIO_PROCESS, int(task.name)) < nice:
                    os.setpriority(os.PRIO_PROCESS, int(task.name), nice)
                    changed += 1
            except (OSError, ValueError):  # the thread ended meanwhile
                continue
    logger.info("the Spark JVM runs at nice %d (%d threads)", nice, changed)
    return changed
