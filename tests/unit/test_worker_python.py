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


RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def test_a_source_runner_whose_query_stopped_ends_quietly(tmp_path: Path) -> None:
    """Spark stops a streaming source by closing its runner's socket; pyspark's runner then dies with
    chained tracebacks on the job's console. Through the workers' script it ends with nothing to say."""
    import socket

    path = str(tmp_path / "jvm.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_WORKER_FACTORY_SECRET"}
    env["PYTHON_WORKER_FACTORY_SOCK_PATH"] = path  # a Unix socket: no authentication, as Spark may start it

    def start_and_stop(executable: str) -> tuple[int, str]:
        worker = subprocess.Popen(
            [executable, "-m", RUNNER], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
        )
        connection, _ = server.accept()
        with connection:
            connection.recv(4)  # the worker's pid: it is connected
        _, stderr = worker.communicate(timeout=120)
        return worker.returncode, stderr

    try:
        assert start_and_stop(worker_python()) == (0, "")
        code, stderr = start_and_stop(sys.executable)  # pyspark's own runner, started without the script
    finally:
        server.close()
    assert code != 0 and "BrokenPipeError" in stderr  # what the script spares the console
