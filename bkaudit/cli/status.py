"""`bkaudit status`: is the auditor working? Watcher and stream up or not, their lag, open alerts, bookies.

Reads what the processes leave behind (the changes topic's heartbeats, the job's checkpoint and lock, the
Delta tables; see :mod:`bkaudit.cli._status_facts`), so it needs no metrics port, and AutoRecovery's znodes
from ZooKeeper. A table by default, one JSON object with ``--format json``. The exit code sums it up: 0 when
bkaudit is up and the cluster healthy, 1 when bkaudit is up and the cluster is not (an open warning or
critical alert, AutoRecovery off, no Auditor), 3 when bkaudit cannot vouch for it (watcher or stream down
or lagging, tables or ZooKeeper unreadable, a volume almost full), 2 for bad input.

Example:
    $ bkaudit status
    component  state  last_seen                 lag_s  detail
    ---------  -----  ------------------------  -----  ------------------------------------------------
    watcher    up     2026-11-26T09:00:01.503Z    0.4  last heartbeat on bkaudit.changes
    stream     up     2026-11-26T09:00:01.220Z    0.0  pid 4242 on host-a; 0 records behind on bkaudit.changes
    open alerts: BOOKIE_LOST 1, LEDGER_UNDER_REPLICATED 7
    lost bookies: bookie-03
    read-only bookies: none
    autorecovery: on; Auditor 10.0.0.7:3181; lostBookieRecoveryDelay 0 s
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any

import typer

from bkaudit.cli._io import emit_json
from bkaudit.cli._render import plain
from bkaudit.cli.formats import StateFormat, StateFormatOption
from bkaudit.cli.live import DevOption, use_dev_services


def _moment(epoch_s: float | None) -> datetime | None:
    return None if epoch_s is None else datetime.fromtimestamp(epoch_s, UTC)


def _json_ready(report: dict[str, Any]) -> dict[str, Any]:
    """Epoch seconds of the report as RFC 3339 strings (``last_seen``, ``last_batch``)."""
    converted = dict(report)
    for name in ("watcher", "stream"):
        part = dict(report[name])
        part["last_seen"] = plain(_moment(part["last_seen"]))
        if "lanes" in part:
            part["lanes"] = [
                {**lane, "last_batch": plain(_moment(lane["last_batch"]))} for lane in part["lanes"]
            ]
        converted[name] = part
    return converted


def render_status(report: dict[str, Any], out: IO[str]) -> None:
    """The human view: one row per component, then the audit's open alerts and bookies.

    Example:
        >>> import io
        >>> part = {"state": "down", "last_seen": None, "lag_s": None, "detail": "-"}
        >>> out = io.StringIO()
        >>> render_status({"watcher": part, "stream": part, "open_alerts": {"BOOKIE_LOST": 1},
        ...                "lost_bookies": ["b1"], "read_only_bookies": []}, out)
        >>> out.getvalue().splitlines()[-3:]
        ['open alerts: BOOKIE_LOST 1', 'lost bookies: b1', 'read-only bookies: none']
    """
    import pyarrow as pa

    from bkaudit.cli._render import render

    names = ("watcher", "stream")
    table = pa.table(
        {
            "component": list(names),
            "state": [report[n]["state"] for n in names],
            "last_seen": pa.array(
                [_moment(report[n]["last_seen"]) for n in names], pa.timestamp("ms", "UTC")
            ),
            "lag_s": pa.array([report[n]["lag_s"] for n in names], pa.float64()),
            "detail": [report[n]["detail"] for n in names],
        }
    )
    render(table, "table", out)
    alerts = report["open_alerts"]
    listed = ", ".join(f"{kind} {count}" for kind, count in sorted(alerts.items())) or "none"
    out.write(f"open alerts: {listed}\n")
    out.write(f"lost bookies: {', '.join(report['lost_bookies']) or 'none'}\n")
    out.write(f"read-only bookies: {', '.join(report['read_only_bookies']) or 'none'}\n")
    if "autorecovery" in report:
        out.write(f"autorecovery: {_autorecovery_line(report['autorecovery'])}\n")
    for volume in report.get("low_disk") or ():
        out.write(f"low disk: {volume}\n")
    if report.get("error"):
        out.write(f"tables: {report['error']}\n")


def _autorecovery_line(autorecovery: dict[str, Any]) -> str:
    """AutoRecovery in one line.

    Example:
        >>> print(_autorecovery_line({"auditor": None, "enabled": False, "recovery_delay_s": None}))
        OFF (disable znode present); no Auditor elected; lostBookieRecoveryDelay not set (the Auditor's own)
    """
    if autorecovery.get("error"):
        return f"unknown ({autorecovery['error']})"
    enabled = "on" if autorecovery.get("enabled") else "OFF (disable znode present)"
    auditor = autorecovery.get("auditor")
    elected = "no Auditor elected" if auditor is None else f"Auditor {auditor or '(vote names no bookie)'}"
    delay = autorecovery.get("recovery_delay_s")
    shown = "not set (the Auditor's own)" if delay is None else f"{delay} s"
    return f"{enabled}; {elected}; lostBookieRecoveryDelay {shown}"


def status(
    fmt: StateFormatOption = StateFormat.table,
    heartbeat_timeout: float | None = typer.Option(
        None,
        "--heartbeat-timeout",
        min=0,
        metavar="SECONDS",
        help="without a heartbeat this long the watcher is down (default: 10 intervals, at least 10)",
    ),
    max_lag: float | None = typer.Option(
        None,
        "--max-lag",
        min=0,
        metavar="SECONDS",
        help="a running stream this far behind is lagging (default: 60)",
    ),
    dev: DevOption = False,
) -> None:
    """Watcher and stream up or not, their lag and last batch, open alerts, lost and read-only bookies,
    AutoRecovery. Exit 0: all healthy; 1: the cluster is not; 3: bkaudit cannot vouch for it."""
    from bkaudit.cli._status_facts import StatusLimits, gather_status, status_exit_code
    from connectors.kafka.client_config import LIBRDKAFKA_LOGGER
    from core.settings import load_settings

    use_dev_services(dev)
    settings = load_settings()
    defaults = StatusLimits.defaults(settings)
    limits = StatusLimits(
        heartbeat_timeout_s=defaults.heartbeat_timeout_s if heartbeat_timeout is None else heartbeat_timeout,
        max_lag_s=defaults.max_lag_s if max_lag is None else max_lag,
    )
    # A broker that does not answer is part of the report; the client's own retry lines would repeat it.
    level = LIBRDKAFKA_LOGGER.level
    LIBRDKAFKA_LOGGER.setLevel(logging.CRITICAL)
    try:
        report = gather_status(settings, limits)
    finally:
        LIBRDKAFKA_LOGGER.setLevel(level)
    if fmt is StateFormat.json:
        emit_json(_json_ready(report))
    else:
        render_status(report, sys.stdout)
    code = status_exit_code(report)
    if code:
        raise typer.Exit(code)
