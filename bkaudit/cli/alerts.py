"""`bkaudit alerts ...`: read and act on the alert stream.

``tail`` prints the newest alert transitions on the alerts topic (``--follow``: then each new one as it
arrives), one line each, or the published JSON (``--format json``: one object per line).

``republish`` re-sends every alert of the ``open_alerts`` table to the alerts topic as ``firing``, with its
stable ``alert_id`` and the JSON the job publishes: for when the topic's history was lost with the broker
(docs/troubleshooting.md, "The alerts topic lost its history"). Consumers deduplicate by ``alert_id``.

Example:
    $ bkaudit alerts tail --last 5 --kind BOOKIE_LOST --follow
    2026-11-28T23:10:01.123Z  firing    warning   BOOKIE_LOST  bookies 10.0.0.5:3181  id 4c1f…
    $ bkaudit alerts republish --dry-run              # how many would be sent, per kind
    $ bkaudit alerts republish --format json          # {"topic": "bkaudit.alerts", "sent": 148, ...}
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from typing import Annotated, Any

import typer

from bkaudit.cli._io import emit_json
from bkaudit.cli.live import DevOption, use_dev_services

app = typer.Typer(
    help="Read and act on the alert stream (tail the alerts topic, republish the open alerts).",
    no_args_is_help=True,
)


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


@app.command("republish")
def republish(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="count what would be sent; send nothing")
    ] = False,
    lakehouse: Annotated[
        str | None,
        typer.Option(
            "--lakehouse",
            help="root of the Delta tables, a path or s3://bucket/prefix (default: the lakehouse_root "
            "setting, or object_store.lakehouse_url)",
        ),
    ] = None,
    fmt: Annotated[
        OutputFormat, typer.Option("--format", "-f", help="table (aligned text) or json (one object)")
    ] = OutputFormat.table,
    dev: DevOption = False,
) -> None:
    """Re-send every open alert to the alerts topic (firing, same alert_id, same JSON as the job)."""
    import pyarrow as pa

    from bkaudit.cli._render import render
    from connectors.kafka.republish import republish_open_alerts
    from connectors.storage import configure_from
    from core.settings import load_settings

    use_dev_services(dev)
    settings = load_settings()
    configure_from(settings)
    report = republish_open_alerts(
        lakehouse if lakehouse is not None else settings.lakehouse, settings.kafka, dry_run=dry_run
    )
    if fmt is OutputFormat.json:
        emit_json(
            {
                "topic": report.topic,
                "dry_run": report.dry_run,
                "sent": 0 if report.dry_run else report.sent,
                "open_alerts": report.sent,
                "by_kind": report.by_kind,
            }
        )
        return
    counts = pa.table(
        {"kind": list(report.by_kind), "alerts": pa.array(list(report.by_kind.values()), pa.int64())}
    )
    render(counts, "table", sys.stdout)
    if report.dry_run:
        sys.stdout.write(f"dry run: {report.sent} open alerts would be sent to {report.topic}\n")
    else:
        sys.stdout.write(f"sent {report.sent} open alerts to {report.topic}\n")


#: Records read per partition before its end when ``--kind`` filters (the newest ``--last`` of one kind
#: are then looked for among them).
KIND_SCAN_RECORDS = 10_000


@app.command("tail")
def tail(
    last: Annotated[int, typer.Option("--last", "-n", min=0, help="how many of the newest to print")] = 20,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-F", help="then print each new transition as it arrives (Ctrl-C ends)"),
    ] = False,
    kinds: Annotated[
        list[str] | None, typer.Option("--kind", "-k", help="only this alert kind (repeatable)")
    ] = None,
    fmt: Annotated[
        OutputFormat,
        typer.Option("--format", "-f", help="table (one line per transition) or json (one object per line)"),
    ] = OutputFormat.table,
    dev: DevOption = False,
) -> None:
    """Print the newest alert transitions on the alerts topic (kafka.alerts_topic), then follow it."""
    from connectors.kafka.alert_tail import AlertTail
    from core.settings import load_settings

    wanted = _alert_kinds(kinds)
    use_dev_services(dev)
    settings = load_settings()
    scan = last if not wanted else max(last, KIND_SCAN_RECORDS)
    with AlertTail(settings.kafka, last=scan) as reader:
        backlog = reader.backlog()
        for record in (r for r in backlog if r.alert is None):  # always reported, never counted
            _print_record(record, fmt)
        shown = [r for r in backlog if r.alert is not None and _selected(r, wanted)]
        for record in shown[len(shown) - last :] if last else []:
            _print_record(record, fmt)
        if follow:
            try:
                for record in reader.follow(lambda: False):
                    if _selected(record, wanted):
                        _print_record(record, fmt)
            except KeyboardInterrupt:
                return


def _alert_kinds(kinds: list[str] | None) -> frozenset[str]:
    """The ``--kind`` values, checked against the alert vocabulary (a typo is an error, not no output)."""
    from core.domain.alerts import AlertKind
    from core.errors import ConfigError

    known = {kind.value for kind in AlertKind}
    unknown = sorted(set(kinds or ()) - known)
    if unknown:
        raise ConfigError(
            f"--kind {', '.join(unknown)}: no such alert kind (one of {', '.join(sorted(known))})"
        )
    return frozenset(kinds or ())


def _selected(record: Any, wanted: frozenset[str]) -> bool:
    """A record to print: every one without ``--kind`` (a record that is no alert is always reported)."""
    return not wanted or record.alert is None or record.alert.get("kind") in wanted


def _print_record(record: Any, fmt: OutputFormat) -> None:
    if record.alert is None:
        sys.stderr.write(
            f"bkaudit: alerts topic partition {record.partition} offset {record.offset}: {record.error}\n"
        )
    elif fmt is OutputFormat.json:
        sys.stdout.write(json.dumps(record.alert, sort_keys=True) + "\n")
    else:
        sys.stdout.write(alert_line(record.alert) + "\n")
    sys.stdout.flush()


def alert_line(alert: dict[str, Any]) -> str:
    """One alert transition as a line: when, state, severity, kind, what it names, its id.

    Example:
        >>> alert_line({"alert_id": "4c1f", "kind": "BOOKIE_LOST", "state": "firing", "severity": "warning",
        ...             "ledger_id": None, "bookies": ["b1:3181"], "detected_at": "2026-11-28T23:10:01.123Z"})
        '2026-11-28T23:10:01.123Z  firing    warning   BOOKIE_LOST  bookies b1:3181  id 4c1f'
    """
    subject = [f"ledger {alert['ledger_id']}"] if alert.get("ledger_id") is not None else []
    if alert.get("bookies"):
        subject.append("bookies " + ",".join(str(b) for b in alert["bookies"]))
    if alert.get("pulsar_topic"):
        subject.append(f"topic {alert['pulsar_topic']}")
    fields = [
        str(alert.get("detected_at", "")),
        f"{alert.get('state', ''):<8}",
        f"{alert.get('severity', ''):<8}",
        str(alert.get("kind", "")),
        *subject,
        f"id {alert.get('alert_id', '')}",
    ]
    return "  ".join(fields)
