"""`bkaudit demo`: the whole product on the embedded default cluster (the README's first command).

Example:
    $ bkaudit demo
"""

from __future__ import annotations

import logging

import typer

from bkaudit.cli._io import emit_json
from bkaudit.settings import load_settings


def demo(
    keep_running: bool = typer.Option(False, "--keep-running", help="leave ZooKeeper and the broker running"),
    json_summary: bool = typer.Option(False, "--json", help="end with the summary as one JSON object"),
) -> None:
    """Embedded services + simulator + watcher + auditor, a scripted story, alerts as they arrive."""
    from bkaudit.demo import run_demo

    logging.basicConfig(level=logging.WARNING)
    summary = run_demo(load_settings(), keep_running=keep_running)
    if json_summary:
        emit_json(summary)
