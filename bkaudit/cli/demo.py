"""`bkaudit demo`: the whole product on the embedded default cluster (the README's first command).

Example:
    $ bkaudit demo
"""

from __future__ import annotations

import typer

from bkaudit.cli._io import emit_json
from core.settings import load_settings


def demo(
    keep_running: bool = typer.Option(False, "--keep-running", help="leave ZooKeeper and the broker running"),
    json_summary: bool = typer.Option(False, "--json", help="end with the summary as one JSON object"),
    verbose: bool = typer.Option(
        False, "--verbose", help="show the logs of Spark, py4j and the clients here, not in the log file"
    ),
) -> None:
    """Embedded services + simulator + watcher + auditor, a scripted story, alerts as they arrive."""
    from bkaudit.demo import run_demo
    from core.logsetup import configure_command_logging

    settings = load_settings()
    configure_command_logging("demo", settings.log_dir, level="WARNING", verbose=verbose)
    summary = run_demo(settings, keep_running=keep_running)
    if json_summary:
        emit_json(summary)
