"""`bkaudit demo`: run the demo on the embedded default cluster (the README's first command).

Example:
    $ bkaudit demo
"""

from __future__ import annotations

import typer

from bkaudit.cli._io import emit_json
from bkaudit.settings import load_settings


def demo(
    keep_running: bool = typer.Option(False, "--keep-running", help="leave ZooKeeper and the broker running"),
) -> None:
    """Start the embedded services, run the pipeline end to end, print a summary."""
    from bkaudit.demo import run_demo

    emit_json(run_demo(load_settings(), keep_running=keep_running))
