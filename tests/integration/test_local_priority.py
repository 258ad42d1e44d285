"""spark.local_nice: the local Spark JVM, and every thread it starts later, run nicer than the driver."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from streaming.session import lower_local_priority

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
    assert min(after.values()) >= driver + 1
    assert os.getpriority(os.PRIO_PROCESS, 0) == driver
