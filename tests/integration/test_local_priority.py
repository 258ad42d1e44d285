"""spark.local_nice: the local Spark JVM, and every thread it starts later, run nicer than the driver."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyspark
import pytest

from streaming.session import lower_local_priority, query_starter, start_at_driver_priority

pytestmark = pytest.mark.integration


def _thread_nices(pid: int) -> dict[int, int]:
    nices = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            nices[int(task.name)] = os.getpriority(os.PRIO_PROCESS, int(task.name))
        except OSError:  # ended meanwhile
            continue
    return nices


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="thread priorities are read from /proc")
def test_the_local_jvm_and_the_threads_it_starts_later_run_nicer_than_the_driver(spark: Any) -> None:
    driver = os.getpriority(os.PRIO_PROCESS, 0)
    jvm = spark.sparkContext._gateway.proc.pid
    lower_local_priority(spark, driver + 1)
    before = _thread_nices(jvm)
    pool = spark._jvm.java.util.concurrent.Executors.newFixedThreadPool(2)
    try:
        assert pool.prestartAllCoreThreads() == 2  # two JVM threads certainly started after the renice
        spark.range(10_000).repartition(8).selectExpr("sum(id)").collect()  # and executor threads at work
        after = _thread_nices(jvm)
    finally:
        pool.shutdown()
    started_later = set(after) - set(before)
    assert len(started_later) >= 2
    starter = query_starter(spark)
    assert starter is not None and after.pop(starter.jvm_thread) == driver  # the one kept (the next test)
    assert min(after.values()) >= driver + 1
    assert os.getpriority(os.PRIO_PROCESS, 0) == driver


def _pre_init_worker(
    spark: Any, marks: Path, start: Any, jvm: int, timeout_s: float = 180.0
) -> tuple[int, str]:
    """Start a ``transformWithStateInPandas`` query with ``start(writer)`` and return the nice value of the
    Python worker Spark spawns for it in the JVM itself (its parent is the JVM, not the executors' daemon),
    the worker that must connect back within Spark's fixed 10 s, and where it imported pyspark from."""
    from pyspark.sql.streaming import StatefulProcessor

    marks.mkdir()
    folder = str(marks)

    class RecordsItsWorker(StatefulProcessor):  # defined here so that it travels by value
        def init(self, handle: Any) -> None:
            import os as worker_os

            import pyspark as worker_pyspark

            nice = worker_os.getpriority(worker_os.PRIO_PROCESS, 0)
            line = f"{worker_os.getppid()} {nice} {worker_pyspark.__file__}"
            with open(f"{folder}/{worker_os.getpid()}", "w") as mark:
                mark.write(line)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            yield from ()

        def close(self) -> None:
            pass

    writer = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 1)
        .load()
        .groupBy("value")
        .transformWithStateInPandas(
            statefulProcessor=RecordsItsWorker(),
            outputStructType="value long",
            outputMode="Update",
            timeMode="None",
        )
        .writeStream.format("noop")
        .option("checkpointLocation", str(marks.parent / f"{marks.name}-checkpoint"))
        .trigger(processingTime="1 second")
    )
    query = start(writer)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for mark in marks.iterdir():
                words = mark.read_text().split(" ", 2)
                if len(words) == 3 and int(words[0]) == jvm:
                    return int(words[1]), words[2]
            assert query.exception() is None, query.exception()
            time.sleep(0.2)
        raise AssertionError(f"no driver-side Python worker recorded itself within {timeout_s:.0f} s")
    finally:
        query.stop()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="thread priorities are read from /proc")
def test_a_query_started_at_driver_priority_spawns_its_driver_side_python_worker_at_the_drivers_priority(
    spark: Any, tmp_path: Path
) -> None:
    driver = os.getpriority(os.PRIO_PROCESS, 0)
    jvm = spark.sparkContext._gateway.proc.pid
    lower_local_priority(spark, driver + 1)
    # Started from the JVM thread of this test's own Python thread, the worker takes the JVM's priority ...
    plain, _ = _pre_init_worker(spark, tmp_path / "plain", lambda writer: writer.start(), jvm)
    # ... started through the query starter, the driver's.
    starter, imported_from = _pre_init_worker(
        spark, tmp_path / "starter", lambda writer: start_at_driver_priority(spark, writer.start), jvm
    )
    assert (plain, starter) == (driver + 1, driver)
    # And it imported pyspark from the installed package (compiled), not from Spark's pyspark.zip.
    assert Path(imported_from).parent == Path(pyspark.__file__).parent, imported_from
