"""A class-data-sharing (CDS) archive of a Spark driver's classes, for the many short-lived drivers of a
test suite.

A test's Spark driver lives for seconds to minutes, and most of its start-up CPU goes to loading and
verifying Spark's classes. Java 17 can dump the classes a run loaded into an archive
(``-XX:ArchiveClassesAtExit``) and map that archive into later JVMs of the same classpath
(``-XX:SharedArchiveFile``): a local session's start, one query and its stop took 8.6 CPU-seconds with
the archive against 14.3 without (``tests/benchmarks/bench_test_jvms.py``). :func:`build_archive` makes
one by running such a driver once; :func:`driver_options` are the ``SPARK_SUBMIT_OPTS`` that use it. A
JVM started before the archive exists, or whose classpath differs, runs without it, silently (the options
turn the JVM's CDS warnings off). Production drivers are started once and keep the JVM's defaults.

Example:
    >>> options = driver_options(Path("/tmp/spark.jsa"))
    >>> "-XX:SharedArchiveFile=/tmp/spark.jsa" in options and "-XX:+UseSerialGC" in options
    True
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: The options both the run that dumps the archive and the drivers that map it run with: C1 only and the
#: serial collector (a test driver's heap is small; G1's threads cost CPU for nothing there).
BASE_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
#: A missing or mismatched archive is not worth a line in a test's output.
QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")

#: One local session, one query with a shuffle, one Arrow UDF (its Python worker), then the JVM's exit:
#: the classes a test driver loads (run as ``python -c``). The JVM writes an archive as it exits, so the
#: run waits for it.
DRIVER_RUN = """
import pyspark.sql.functions as F
from core.settings import SparkSettings
from streaming.session import build_spark_session
spark = build_spark_session(SparkSettings(master="local[2]", shuffle_partitions=2), for_tests=True)
assert spark.range(100000).groupBy((F.col("id") % 7).alias("k")).count().count() == 7
assert spark.range(1000).mapInArrow(lambda batches: batches, "id long").count() == 1000
jvm = spark.sparkContext._gateway.proc
spark.stop()
jvm.stdin.close()
jvm.wait(timeout=300)
"""


def archive_path() -> Path:
    """Where the archive of this Java and this pyspark lives (a name per user, Java binary and Spark jars:
    another of either is another archive).

    Example:
        >>> archive_path().suffix
        '.jsa'
    """
    java = shutil.which("java", path=_java_path()) or "java"
    spec = importlib.util.find_spec("pyspark")
    jars_dir = Path(next(iter(spec.submodule_search_locations or ()), ".")) / "jars" if spec else Path(".")
    jars = sorted(p.name for p in jars_dir.glob("*.jar")) if jars_dir.is_dir() else []
    key = "\n".join([os.path.realpath(java), importlib.metadata.version("pyspark"), *jars, *BASE_OPTIONS])
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"bkaudit-spark-{os.getuid()}-{digest}.jsa"


def driver_options(archive: Path) -> str:
    """``SPARK_SUBMIT_OPTS`` for a test driver that maps ``archive`` when it exists."""
    return " ".join((*BASE_OPTIONS, f"-XX:SharedArchiveFile={archive}", *QUIET))


def build_archive(archive: Path | None = None, timeout_s: float = 600.0) -> Path:
    """Dump the archive (one Spark driver's run, ~40 CPU-seconds) unless it exists; its path.

    Written under a temporary name and renamed when complete, so a JVM never maps half an archive; two
    builds at once each write their own and the last rename wins.
    """
    archive = archive or archive_path()
    if archive.exists():
        return archive
    staged = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
    options = " ".join((*BASE_OPTIONS, f"-XX:ArchiveClassesAtExit={staged}", *QUIET))
    env = {**os.environ, "SPARK_SUBMIT_OPTS": options}
    try:
        subprocess.run(
            [sys.executable, "-c", DRIVER_RUN],
            env=env,
            check=True,
            timeout=timeout_s,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        staged.replace(archive)
    finally:
        staged.unlink(missing_ok=True)
    return archive


def _java_path() -> str | None:
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin") if home else None


if __name__ == "__main__":
    print(build_archive())
