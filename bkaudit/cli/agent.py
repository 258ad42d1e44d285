"""`bkaudit agent`: serve a DbLedgerStorage bookie's RocksDB indexes to the auditor over gRPC, until SIGTERM.

Runs beside one bookie, opens its ``current/ledgers`` and ``current/locations`` read-only (the bookie keeps
running undisturbed) and answers which entries of a ledger, and which ledgers, the bookie holds. TLS and
a bearer token are required (``--insecure`` serves plaintext, for loopback tests only). When listening,
it prints one JSON line to stdout: ``{"agent": "host:port", "tls": true}``. Settings: the ``agent``
section (``BKAUDIT_AGENT__*``); the options override them.

Example:
    $ bkaudit agent --ledger-dirs /bk/ledgers --listen 0.0.0.0:3182 \\
        --tls-cert /etc/bkaudit/agent.crt --tls-key /etc/bkaudit/agent.key --token-file /etc/bkaudit/token
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from pathlib import Path
from typing import Any

import typer

from core.errors import InvalidArgumentError
from core.logsetup import configure_logging, register_secrets
from core.settings import AgentSettings, load_settings


def _agent_settings(**overrides: Any) -> AgentSettings:
    """The ``agent`` section with the given options on top (options override the environment/file)."""
    base = load_settings()
    given = {key: value for key, value in overrides.items() if value not in (None, [], False)}
    return load_settings(agent={**base.agent.model_dump(), **given}).agent if given else base.agent


def _split_dirs(value: str | None) -> list[Path] | None:
    return [Path(part) for part in value.split(",") if part] if value else None


def agent(
    ledger_dirs: str | None = typer.Option(
        None, "--ledger-dirs", help="the bookie's ledger (or index) directories, comma-separated"
    ),
    listen: str | None = typer.Option(None, "--listen", help="host:port to serve on (default 0.0.0.0:3182)"),
    tls_cert: str | None = typer.Option(None, "--tls-cert", help="certificate chain (PEM)"),
    tls_key: str | None = typer.Option(None, "--tls-key", help="private key (PEM)"),
    token_file: str | None = typer.Option(None, "--token-file", help="file holding the bearer token"),
    insecure: bool = typer.Option(False, "--insecure", help="plaintext, no TLS (loopback tests only)"),
    refresh: float | None = typer.Option(
        None, "--refresh", help="seconds between index reopens (default 10)"
    ),
    log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING, ERROR"),
) -> None:
    """Answer the auditor's questions about this bookie's entries from its RocksDB indexes."""
    from bkaudit.cli.watch import _log_level

    configure_logging(_log_level(log_level))
    settings = _agent_settings(
        ledger_dirs=_split_dirs(ledger_dirs),
        listen=listen,
        tls_cert_file=tls_cert,
        tls_key_file=tls_key,
        token_file=token_file,
        insecure=insecure,
        refresh_s=refresh,
    )
    if not settings.ledger_dirs:
        raise InvalidArgumentError("--ledger-dirs is required (the bookie's ledgerDirectories)")
    if settings.token_file is None:
        raise InvalidArgumentError("--token-file is required: every call carries a bearer token")
    if (settings.tls_cert_file is None) != (settings.tls_key_file is None):
        raise InvalidArgumentError("--tls-cert and --tls-key go together")
    if settings.tls_cert_file is None and not settings.insecure:
        raise InvalidArgumentError(
            "--tls-cert and --tls-key are required (or --insecure, for loopback tests)"
        )

    from connectors.agent.index import DbStorageIndexReader
    from connectors.agent.server import read_token_file, start_agent_server

    token = read_token_file(settings.token_file)
    register_secrets([token])
    tls = None
    if settings.tls_cert_file is not None and settings.tls_key_file is not None:
        tls = (_read(settings.tls_cert_file), _read(settings.tls_key_file))
    reader = DbStorageIndexReader(settings.ledger_dirs, refresh_s=settings.refresh_s)
    try:
        running = start_agent_server(reader, settings.listen, token=token, tls=tls)
    except BaseException:
        reader.close()
        raise
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        logging.getLogger(__name__).info("signal %d: stopping", signum)
        stop.set()

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
    host = settings.listen.rsplit(":", 1)[0]
    typer.echo(json.dumps({"agent": f"{host}:{running.port}", "tls": tls is not None}))  # ready: stoppable
    try:
        # Python runs a signal's handler on the main thread, woken only when the kernel delivers the signal
        # to it; one delivered to a gRPC thread would leave a wait without timeout blocked for good.
        while not stop.wait(0.5):
            pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        running.stop()


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise InvalidArgumentError(f"{path}: {err.strerror}") from None
