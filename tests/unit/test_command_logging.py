"""Where the long-running commands' records go: their own on the console, the libraries' in a log file.

Each case runs in a fresh interpreter (pytest's own handlers on the root logger would make the setup a
no-op here) with one record from bkaudit's own logger and one from each library's: a ZooKeeper client
(kazoo), py4j and the Kafka client (librdkafka's lines come through ``connectors.kafka.librdkafka``).
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import logging, sys
from pathlib import Path
from core.logsetup import configure_command_logging
configure_command_logging("stream", Path(sys.argv[1]), level="INFO", verbose=sys.argv[2] == "verbose",
                          only_on_a_terminal=sys.argv[3] == "terminal-only")
for name in ("streaming.job", "kazoo.client", "py4j.clientserver", "connectors.kafka.librdkafka"):
    logging.getLogger(name).warning("from %s", name)
"""
LIBRARIES = ("kazoo.client", "py4j.clientserver", "connectors.kafka.librdkafka")


def run(log_dir: Path, *, verbose: bool = False, only_on_a_terminal: bool = False, terminal: bool = False):
    """(stdout, what reached stderr) of the script; stderr is a pseudo-terminal when ``terminal``."""
    args = [sys.executable, "-c", SCRIPT, str(log_dir), "verbose" if verbose else "-"]
    args.append("terminal-only" if only_on_a_terminal else "-")
    if not terminal:
        done = subprocess.run(args, capture_output=True, text=True, timeout=60)
        return done.stdout, done.stderr
    controller, follower = pty.openpty()
    done = subprocess.run(args, stdout=subprocess.PIPE, stderr=follower, text=True, timeout=60)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the pty's other side is closed: everything is read
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    return done.stdout, b"".join(chunks).decode()


def test_the_console_has_the_own_records_and_the_file_every_record(tmp_path: Path):
    stdout, stderr = run(tmp_path / "logs")
    log = tmp_path / "logs" / "stream.log"
    assert (
        stdout == f"logs of Spark, py4j and the Kafka and ZooKeeper clients: {log} (--verbose shows them)\n"
    )
    assert "from streaming.job" in stderr and not any(f"from {name}" in stderr for name in LIBRARIES)
    assert all(f"from {name}" in log.read_text() for name in ("streaming.job", *LIBRARIES))


def test_verbose_keeps_everything_on_the_console(tmp_path: Path):
    stdout, stderr = run(tmp_path / "logs", verbose=True)
    assert stdout == "" and not (tmp_path / "logs").exists()
    assert all(f"from {name}" in stderr for name in ("streaming.job", *LIBRARIES))


@pytest.mark.parametrize("terminal", [False, True], ids=["service", "terminal"])
def test_stream_and_watch_are_quiet_only_on_a_terminal(tmp_path: Path, terminal: bool):
    _, stderr = run(tmp_path / "logs", only_on_a_terminal=True, terminal=terminal)
    assert ("from kazoo.client" in stderr) is not terminal  # a service's collector gets everything
    assert (tmp_path / "logs" / "stream.log").exists() is terminal
    assert "from streaming.job" in stderr


def test_a_log_dir_that_cannot_be_written_is_a_warning_not_a_failure(tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    stdout, stderr = run(blocker / "logs")
    assert stdout == ""
    assert "log_dir (BKAUDIT_LOG_DIR) is not a writable directory" in stderr and "library logs stay" in stderr
    assert all(f"from {name}" in stderr for name in ("streaming.job", *LIBRARIES))
