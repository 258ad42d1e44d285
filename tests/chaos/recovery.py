"""How the auditor is expected to come back from each fault: one small adapter per scenario.

The scenarios say *what* must hold after a fault (tables = ground truth, no alert lost, nothing skipped);
these functions say *how* the operator or the auditor gets there, so that a change of recovery mechanism is
one edit here. Each takes the :class:`~tests.chaos.stack.ChaosStack` and returns once recovery has been
driven (or fails naming what it expected).

The contract they encode (docs: troubleshooting): a fault the auditor cannot ride out stops it with exit
code 2 and ONE line naming what to do; no traceback.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from tests.chaos.stack import ChaosStack, JobProcess, last_line, tail, wait_for

#: How long a job that cannot continue may take to say so (exit 2) after the fault is over.
DECISION_S = 120.0
#: A recreated topic is told by its records, which the job reads again from the start: allow for that.
DATA_LOSS_DECISION_S = 240.0
_COMMAND = re.compile(r"`(bkaudit [^`]+)`|'(bkaudit [^']+)'|\"(bkaudit [^\"]+)\"|(bkaudit \S.*)$")


def one_line_exit(log: Path, code: int | None) -> str:
    """The job stopped as the contract says: exit 2, no traceback, the last line is the message."""
    text = tail(log, 400)
    assert code == 2, f"expected exit 2 with one line, got exit {code}:\n{tail(log)}"
    assert "Traceback" not in text, f"exit 2 but with a traceback:\n{tail(log)}"
    return last_line(log)


def bkaudit(stack: ChaosStack, command: str, timeout_s: float = 180.0) -> subprocess.CompletedProcess[str]:
    """Run a ``bkaudit ...`` command line with the job's settings, as an operator would."""
    argv = shlex.split(command)
    assert argv[0] == "bkaudit", command
    return subprocess.run(
        [*stack.run.command_prefix, sys.executable, "-m", "bkaudit.cli.main", *argv[1:]],
        env=stack.run.env(),
        cwd=stack.run.root,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def named_command(message: str) -> str:
    """The ``bkaudit ...`` command a one-line error names (in backticks or quotes, or ending the line)."""
    match = _COMMAND.search(message)
    assert match, f"the job's message names no `bkaudit ...` recovery command: {message!r}"
    return next(group for group in match.groups() if group).strip().rstrip(".")


def restart_after_named_command(stack: ChaosStack, job: JobProcess) -> str:
    """The job exited 2 naming a recovery command: run it, start the job again; returns the command."""
    message = one_line_exit(job.run.log_path(job.attempt), job.exit_code())
    command = named_command(message)
    done = bkaudit(stack, command)
    assert done.returncode == 0, f"`{command}` exited {done.returncode}: {done.stderr.strip()[-2000:]}"
    stack.start_job()
    return command


def republish_open_alerts(stack: ChaosStack) -> None:
    """The alerts topic's history is gone with the broker's data: republish what is open."""
    done = bkaudit(stack, "bkaudit alerts republish")
    assert done.returncode == 0, (
        f"`bkaudit alerts republish` exited {done.returncode}: {done.stderr.strip()[-2000:]}"
    )


# ------------------------------------------------------------------------------------------- adapters


def after_job_kill(stack: ChaosStack) -> None:
    """kill -9 of the job: restarting it is all it takes (the checkpoint and idempotent sinks do the rest)."""
    stack.start_job()


def after_watcher_kill(stack: ChaosStack) -> None:
    """kill -9 of the watcher: restart it; its START snapshot reconciles what changed meanwhile."""
    stack.watcher.start()


def after_broker_data_loss(stack: ChaosStack) -> str:
    """The broker came back empty. Either the job recovers by itself from the watcher's next full
    snapshot (it keeps running), or it exits 2 with one line naming a recovery command, which is run before
    the job is started again. Then the open alerts are republished (the alerts topic lost its history).
    Returns how it recovered, for the report.
    """
    job = stack.job
    assert job is not None

    def decided() -> bool:
        if not job.alive():
            return True
        return not stack.mismatch(stack.cluster.snapshot())

    try:
        wait_for("the job to recover from the broker's data loss or to exit 2", decided, DATA_LOSS_DECISION_S)
    except AssertionError as err:
        difference = stack.mismatch(stack.cluster.snapshot())
        raise AssertionError(f"{err}\nlast difference: {difference}\n{stack.describe()}") from None
    how = "recovered by itself"
    if not job.alive():
        how = f"exit 2, ran `{restart_after_named_command(stack, job)}`"
    republish_open_alerts(stack)
    return how


def after_broker_hang(stack: ChaosStack) -> None:
    """A broker frozen past the request timeout: the job and the watcher ride it out (back-off)."""
    stack.require_alive()


def after_future_heartbeat(stack: ChaosStack) -> None:
    """A heartbeat dated 2100: the job rejects it as a dead letter and goes on, nothing to do."""
    stack.require_alive()


def second_job_on_same_checkpoint(stack: ChaosStack, second: JobProcess) -> str:
    """A second ``bkaudit stream`` on a checkpoint in use is refused at start: exit 2, one line.
    Returns that line."""
    started = time.monotonic()
    wait_for(
        "the second job on the same checkpoint to exit",
        lambda: not second.alive(),
        DECISION_S,
    )
    line = one_line_exit(second.run.log_path(second.attempt), second.exit_code())
    print(f"second job refused after {time.monotonic() - started:.1f} s: {line}")
    return line
