"""The Prometheus ``/metrics`` endpoint of both processes, with a start-up failure as one line.

A taken port is the usual reason a metrics server cannot start (a second watcher on the host, a restart
while the old process lingers); ``prometheus_client`` raises a bare ``OSError`` then. This turns it into a
:class:`~core.errors.ServiceError` that names the address and the setting to change, so the CLI prints
one line and exits 2.

Example:
    >>> import socket
    >>> from prometheus_client import CollectorRegistry
    >>> with socket.socket() as taken:
    ...     taken.bind(("127.0.0.1", 0)); taken.listen()
    ...     port = taken.getsockname()[1]
    ...     try:
    ...         serve_metrics(CollectorRegistry(), port, "127.0.0.1", setting="watcher.metrics_port")
    ...     except ServiceError as err:
    ...         print("in use" in str(err), "watcher.metrics_port" in str(err))
    True True
"""

from __future__ import annotations

import errno
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from core.errors import ServiceError


def _env_var(setting: str) -> str:
    return "BKAUDIT_" + setting.upper().replace(".", "__")


def serve_metrics(
    registry: CollectorRegistry, port: int, host: str, *, setting: str, host_setting: str | None = None
) -> Any:
    """Serve ``registry`` on ``host:port`` from a daemon thread; returns the server (``.shutdown()`` it).

    ``setting`` and ``host_setting`` are the dotted names of the port and address settings
    (``watcher.metrics_port``), quoted in the error so the reader knows what to change.
    """
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            hint = (
                f"the port is already in use; set another {setting} ({_env_var(setting)}), 0 to turn the "
                "endpoint off, or stop the process holding the port"
            )
        else:  # EACCES below 1024, an address not on this host, a name that does not resolve...
            names = [setting] + ([host_setting] if host_setting else [])
            hint = f"{err.strerror or err}; check " + " and ".join(f"{n} ({_env_var(n)})" for n in names)
        raise ServiceError(f"cannot serve metrics on {host}:{port}: {hint}") from None
    return server
