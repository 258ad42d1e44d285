"""`bkaudit demo`: the whole product on the embedded services and a BookKeeper cluster (the README's first
command): real BookKeeper bookies by default (:mod:`bkaudit.demo_real`), or bkaudit's simulator
(:mod:`bkaudit.demo`), which needs no Java.

Example:
    $ bkaudit demo --bookkeeper simulator
"""

from __future__ import annotations

import typer

from bkaudit.cli._io import emit_json
from core.settings import load_settings

#: The cluster the demo runs on when --bookkeeper is not given.
DEFAULT_BOOKKEEPER = "real"


def demo(
    keep_running: bool = typer.Option(False, "--keep-running", help="leave ZooKeeper and the broker running"),
    json_summary: bool = typer.Option(False, "--json", help="end with the summary as one JSON object"),
    bookkeeper: str = typer.Option(
        DEFAULT_BOOKKEEPER,
        "--bookkeeper",
        help="'real': six real Apache BookKeeper bookies (Java, the jars in .jars); "
        "'simulator': bkaudit's simulated cluster",
    ),
    verbose: bool = typer.Option(
        False, "--verbose", help="show the logs of Spark, py4j and the clients here, not in the log file"
    ),
    tls: bool = typer.Option(
        False,
        "--tls",
        help="ZooKeeper and the real Kafka broker TLS only, client certificates required, and bookies "
        "that require TLS and a role in the client certificate (dev.tls)",
    ),
) -> None:
    """Embedded services + a BookKeeper cluster + watcher + auditor, a scripted story, alerts live."""
    from bkaudit.demo import run_demo
    from bkaudit.demo_real import run_real_demo
    from core.errors import ConfigError
    from core.logsetup import configure_command_logging

    if bookkeeper not in ("real", "simulator"):
        raise ConfigError(f"--bookkeeper: {bookkeeper!r} is not one of 'real', 'simulator'")
    settings = load_settings()
    if tls:
        dev = settings.dev.model_copy(update={"tls": True, "broker": "kafka"})
        settings = settings.model_copy(update={"dev": dev})
    configure_command_logging("demo", settings.log_dir, level="WARNING", verbose=verbose)
    runner = run_real_demo if bookkeeper == "real" else run_demo
    summary = runner(settings, keep_running=keep_running)
    if json_summary:
        emit_json(summary)
