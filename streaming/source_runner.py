"""Spark's runner of a Python streaming data source, quiet when the query stops.

Spark starts ``python -m pyspark.sql.streaming.python_streaming_source_runner`` for the timers query's
source (``bkaudit_kafka``) and stops it by closing its socket: pyspark's runner reads that as an error,
tries to report it on the closed socket and dies with three chained tracebacks (``EOFError``,
``BrokenPipeError``) on the job's console, at every stop of the query, a stop for a full disk included.
:func:`streaming.session.worker_python`'s launcher runs this module in its place: the same ``main`` over the
same socket, and a socket the JVM closed ends the worker quietly. Any other failure is pyspark's to report
(on the socket, and on stderr as before).

Example:
    $ python -m streaming.source_runner   # started by Spark, with its worker environment
"""

from __future__ import annotations

import sys


def run() -> int:
    """Run pyspark's source runner as its own ``__main__`` does; 0 when the JVM closed the socket."""
    from pyspark.sql.streaming.python_streaming_source_runner import main
    from pyspark.worker_util import get_sock_file_to_executor

    try:
        with get_sock_file_to_executor(timeout=None) as sock_file:
            main(sock_file, sock_file)
    except (BrokenPipeError, ConnectionResetError):  # the query stopped: nobody reads what is left
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(run())
