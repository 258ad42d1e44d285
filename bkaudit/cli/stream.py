"""`bkaudit stream`: run the Structured Streaming auditor until SIGTERM/SIGINT.

Example:
    $ BKAUDIT_KAFKA__BOOTSTRAP_SERVERS=kafka:9092 bkaudit stream
"""

from __future__ import annotations

import logging

import typer

from bkaudit.errors import BkauditError
from bkaudit.settings import load_settings


def stream(
    available_now: bool = typer.Option(False, "--available-now", help="process what is there, then exit"),
) -> None:
    """Consume the change stream, keep the Delta tables current, publish alerts."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = load_settings()
    if available_now:
        from streaming.job import query_failure, start
        from streaming.session import build_spark_session

        query, sink = start(build_spark_session(settings.spark), settings, available_now=True)
        try:
            query.awaitTermination()
        except Exception as err:  # the query failed: one line and exit 2 when the source named the fault
            failure = query_failure(err)
            if isinstance(failure, BkauditError):
                raise failure from None
            raise
        finally:
            sink.close()
        return
    from streaming.job import run

    run(settings)
