"""`bkaudit stream`: run the Structured Streaming auditor until SIGTERM/SIGINT.

Example:
    $ BKAUDIT_KAFKA__BOOTSTRAP_SERVERS=kafka:9092 bkaudit stream
"""

from __future__ import annotations

import logging

import typer

from bkaudit.settings import load_settings


def stream(
    available_now: bool = typer.Option(False, "--available-now", help="process what is there, then exit"),
) -> None:
    """Consume the change stream, keep the Delta tables current, publish alerts."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = load_settings()
    if available_now:
        from streaming.job import start
        from streaming.session import build_spark_session

        query, sink = start(build_spark_session(settings.spark), settings, available_now=True)
        query.awaitTermination()
        sink.close()
        return
    from streaming.job import run

    run(settings)
