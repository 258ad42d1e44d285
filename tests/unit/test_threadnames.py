"""OS thread names (``core.threadnames``): what ``top -H`` and ``/proc/<pid>/task/*/comm`` show."""

from __future__ import annotations

import sys
import threading

import pytest

from core.threadnames import MAX_NAME_BYTES, current_thread_os_name, named_target

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names via /proc: Linux")


def _name_seen_in_thread(name: str) -> str | None:
    seen: list[str | None] = []
    thread = threading.Thread(target=named_target(name, lambda: seen.append(current_thread_os_name())))
    thread.start()
    thread.join()
    return seen[0]


def test_a_named_target_runs_under_its_name() -> None:
    assert _name_seen_in_thread("watch-worker") == "watch-worker"


def test_a_long_name_is_cut_to_what_linux_keeps() -> None:
    assert _name_seen_in_thread("bkaudit-watch-controller") == "bkaudit-watch-controller"[:MAX_NAME_BYTES]


def test_the_calling_thread_keeps_its_name() -> None:
    before = current_thread_os_name()
    _name_seen_in_thread("other")
    assert current_thread_os_name() == before
