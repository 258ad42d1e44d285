"""`bkaudit stream`: run the Structured Streaming auditor until SIGTERM/SIGINT.

One job per checkpoint: a second one on the same checkpoint exits 2 at once, naming the first (pid, host,
start time); see :mod:`streaming.checkpoint_lock`.

Example:
    $ BKAUDIT_KAFKA__BOOTSTRAP_SERVERS=kafka:9092 bkaudit stream
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

import typer

from bkaudit.cli._process_end import owns_process, skip_teardown
from bkaudit.cli.live import DevOption, use_dev_services
from core.errors import BkauditError
from core.logsetup import configure_command_logging, register_secrets
from core.settings import Settings, load_settings


def stream(
    available_now: bool = typer.Option(False, "--available-now", help="process what is there, then exit"),
    verbose: bool = typer.Option(
        False, "--verbose", help="show the logs of Spark, py4j and the clients here, not in the log file"
    ),
    dev: DevOption = False,
) -> None:
    """Consume the change stream, keep the Delta tables current, publish alerts."""
    skip_teardown()  # native threads may abort the interpreter's teardown after the line (exit 134, not 2)
    use_dev_services(dev)
    settings = load_settings()
    configure_command_logging(
        "stream", settings.log_dir, level="INFO", verbose=verbose, only_on_a_terminal=True
    )
    register_secrets(settings)
    try:
        _stream(settings, available_now=available_now)
    except BkauditError:
        raise
    except Exception as err:  # a full disk fails a write deep in delta-rs, Spark or Python: one line
        from streaming.disk_space import full_disk_failure, job_directories

        full = full_disk_failure(err, job_directories(settings))
        if full is not None:
            raise full from None
        raise
    finally:
        if owns_process():  # the JVM says its last (a listener told of the queries' end) before the line
            from streaming.session import stop_spark

            stop_spark()


def _stream(settings: Settings, *, available_now: bool) -> None:
    if available_now:
        from connectors import storage
        from streaming.job import exclusive_checkpoint, query_failure, start, started_spark

        with exclusive_checkpoint(settings) as held:
            spark = started_spark(settings)
            query, sink = start(spark, settings, available_now=True, write_check=held.write_check)
            failure: Exception | None = None
            try:
                query.awaitTermination()
            except Exception as err:  # the query failed: one line and exit 2 when the source named the fault
                failure = query_failure(err)
                if isinstance(failure, BkauditError):
                    raise failure from None
                raise
            finally:
                # No last fold on a store that does not answer (it would wait out the retries again).
                sink.close(fold=not isinstance(failure, storage.ObjectStoreUnreachable))
        return
    from streaming.job import run

    try:
        run(settings, owns_spark=owns_process())
    except BkauditError as err:
        if getattr(err, "job_was_running", False) and owns_process():  # never the process of a caller
            _exit_now(err)
        raise


def _exit_now(err: BkauditError) -> NoReturn:
    """The running job's one line, then exit 2 at once. The interpreter's own exit would let the Rust and
    Java threads still unwinding a failed write (delta-rs's runtime, Spark's listener bus) print panics and
    traces after that line; everything bkaudit owns (the lanes, the producer, the lease, Spark) is already
    stopped and flushed."""
    sys.stderr.write(f"bkaudit: {' '.join(str(err).split())}\n")
    sys.stderr.flush()
    logging.shutdown()
    os._exit(2)
