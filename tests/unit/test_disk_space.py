"""A full disk stops the job with one line naming the directory, not a traceback per layer."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from streaming.disk_space import free_space, full_disk_failure


def real_enospc() -> OSError:
    """The kernel's own ENOSPC: a write to /dev/full."""
    try:
        with open("/dev/full", "wb") as full:
            full.write(b"x")
            full.flush()
    except OSError as err:
        return err
    raise AssertionError("writing /dev/full did not fail")


def test_a_failed_write_is_named_with_the_fullest_directory(tmp_path: Path) -> None:
    failure = full_disk_failure(real_enospc(), {"lakehouse_root": tmp_path, "checkpoint_root": tmp_path})
    assert failure is not None
    text = str(failure)
    assert text.startswith("no space left on the device of ")
    assert f" {tmp_path}: " in text and "GiB free of" in text
    assert "start the job again: it resumes from its checkpoint" in text


@pytest.mark.parametrize(
    "wrapped",
    [
        RuntimeError("the streaming query failed: ... IOException: No space left on device\n at ..."),
        Exception("Generic DeltaTable error: Io error: No space left on device (os error 28)"),
    ],
)
def test_the_layers_own_wordings_and_causes_are_recognised(wrapped: Exception, tmp_path: Path) -> None:
    assert full_disk_failure(wrapped, {"log_dir": tmp_path}) is not None
    try:
        raise RuntimeError("the query failed") from real_enospc()
    except RuntimeError as chained:
        assert full_disk_failure(chained, {"log_dir": tmp_path}) is not None


def test_other_failures_are_left_alone(tmp_path: Path) -> None:
    assert full_disk_failure(OSError(errno.EACCES, "Permission denied"), {"log_dir": tmp_path}) is None


def test_free_space_of_a_directory_not_made_yet_is_its_parents(tmp_path: Path) -> None:
    (space,) = free_space({"checkpoint_root": tmp_path / "not" / "yet"})
    assert space.path == str(tmp_path / "not" / "yet") and 0 < space.ratio <= 1


def test_stream_on_a_full_disk_prints_one_line_and_exits_2(cli, monkeypatch, tmp_path: Path) -> None:
    def fails(_settings: object, **_options: object) -> None:
        raise RuntimeError("the streaming query failed") from real_enospc()

    monkeypatch.setattr("streaming.job.run", fails)  # the job's own failure path, past its start-up checks
    monkeypatch.setenv("BKAUDIT_LAKEHOUSE_ROOT", str(tmp_path / "lakehouse"))
    result = cli("stream")
    assert result.exit_code == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("bkaudit: no space left on the device of "), result.stderr


def test_a_volume_below_the_floor_refuses_the_start_in_one_line(cli, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BKAUDIT_LAKEHOUSE_ROOT", str(tmp_path / "lakehouse"))
    monkeypatch.setenv("BKAUDIT_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("BKAUDIT_STREAM__DISK_FLOOR_MB", str(2**40))  # more than any volume holds
    result = cli("stream")
    assert result.exit_code == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(
        f"bkaudit: too little space left on the device of lakehouse_root {tmp_path / 'lakehouse'}: "
    ), result.stderr
    assert "the job keeps stream.disk_floor_mb (" in result.stderr


def test_status_names_a_volume_below_the_floor(tmp_path: Path) -> None:
    from core.settings import Settings
    from streaming.disk_space import low_free_space

    settings = Settings(lakehouse_root=tmp_path, checkpoint_root=tmp_path, log_dir=tmp_path)
    assert all(not line.startswith("lakehouse_root") for line in low_free_space(settings)) or (
        free_space({"x": tmp_path})[0].ratio < 0.1  # this disk is really nearly full
    )
    floored = settings.model_copy(
        update={"stream": settings.stream.model_copy(update={"disk_floor_mb": 2**40})}
    )
    assert [line.split()[0] for line in low_free_space(floored)][:2] == ["lakehouse_root", "checkpoint_root"]


def test_the_stream_process_ends_with_its_code_whatever_its_teardown_would_do() -> None:
    """Native threads can abort the interpreter's teardown (SIGABRT, exit 134) after the job's line: the
    ``bkaudit stream`` process ends before it, with its own code. The teardown here aborts for sure."""
    import os
    import subprocess
    import sys

    program = (
        "import atexit, os, sys\n"
        "atexit.register(os.abort)  # a teardown that aborts, as native threads may make it\n"
        "from bkaudit.cli.main import run\n"
        "sys.argv = ['bkaudit', 'stream']\n"
        "sys.exit(run())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKAUDIT_")}
    env["BKAUDIT_STREAM__DISK_FLOOR_MB"] = "-1"  # a bad setting: the quickest way to the line and exit 2
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.startswith("bkaudit: ") and "disk_floor_mb" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
