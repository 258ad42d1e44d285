"""Shell completion: ``bkaudit --show-completion`` prints the script, and the script's requests complete
commands and options."""

from __future__ import annotations

import os
import subprocess
import sys

BKAUDIT = [sys.executable, "-m", "bkaudit.cli.main"]


def complete(words: str) -> list[str]:
    """What bash completion offers for the command line ``words`` (the last word being completed)."""
    env = {
        **os.environ,
        "_BKAUDIT_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - 1),
    }
    done = subprocess.run(BKAUDIT, env=env, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.split()


def test_show_completion_prints_a_bash_script_for_bkaudit() -> None:
    # The shell named, not detected: detection reads the process' ancestors, and a test run started in the
    # background has no shell among them ("Shell  not supported").
    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    done = subprocess.run(
        [*BKAUDIT, "--show-completion", "bash"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "_BKAUDIT_COMPLETE=complete_bash" in done.stdout and "complete -o" in done.stdout


def test_completion_offers_commands_subcommands_and_options() -> None:
    assert complete("bkaudit st") == ["stream", "status"]
    assert complete("bkaudit alerts t") == ["tail"]
    assert "--dev" in complete("bkaudit status --")
