"""The suite's Spark class archive: a driver whose archive is missing or does not match runs without it,
and says nothing about it (a test reading a job's output must not meet a JVM warning)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from bkaudit.testing.spark_archive import archive_path, driver_options


@pytest.mark.parametrize("archive", ["missing", "not an archive"])
def test_a_driver_without_a_usable_archive_starts_and_says_nothing(tmp_path: Path, archive: str) -> None:
    assert shutil.which("java"), "the suite needs a JDK"
    path = tmp_path / "spark.jsa"
    if archive == "not an archive":
        path.write_bytes(b"\0" * 4096)
    options = driver_options(path).split()
    done = subprocess.run(["java", *options, "-version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "cds" not in (done.stdout + done.stderr).lower()
    assert "archive" not in (done.stdout + done.stderr).lower()


def test_the_archive_is_named_for_this_user_java_and_spark() -> None:
    assert archive_path().name.startswith("bkaudit-spark-") and archive_path() == archive_path()
