"""Spark's Python workers start through a script that drops Spark's pyspark.zip from their PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streaming.session import worker_python

PRINT_PATH_AND_ARGS = (
    "import os, sys; print(os.environ['PYTHONPATH']); print(sys.executable); print(sys.argv[1:])"
)


def test_the_script_drops_only_pysparks_zip_and_runs_this_interpreter_with_the_arguments() -> None:
    zip_path = "/opt/spark home/python/lib/pyspark.zip"
    kept = ["/a", "/b c", "/opt/spark home/python/lib/py4j-0.10.9.9-src.zip", "/globs/*"]
    done = subprocess.run(
        [worker_python(), "-c", PRINT_PATH_AND_ARGS, "one", "two words"],
        env={**os.environ, "PYTHONPATH": ":".join([kept[0], zip_path, *kept[1:]])},
        capture_output=True,
        text=True,
        check=True,
    )
    path, executable, arguments = done.stdout.splitlines()
    assert path.split(":") == kept
    assert executable == sys.executable
    assert arguments == "['one', 'two words']"


def test_another_sparks_home_keeps_its_zip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "python" / "lib").mkdir(parents=True)
    (tmp_path / "python" / "lib" / "pyspark.zip").write_bytes(b"")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))  # a Spark distribution, not the installed pyspark
    assert worker_python() == sys.executable
