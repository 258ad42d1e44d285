"""`bkaudit query ...`: the SRE's questions over the Delta tables (DuckDB through Arrow; no Spark).

Every command reads the lakehouse under the ``lakehouse_root`` setting (``--lakehouse PATH`` overrides it;
the demo's tables are in ``lakehouse/demo``) and prints ``--format table`` (aligned text, the default),
``json`` (one array) or ``csv`` (with a header); the table view shows a narrow set of columns,
``--columns a,b`` (or ``all``) chooses them, and its times (``detail`` included) are RFC 3339. Listings stop
at ``--limit`` rows (1000; 0 = all) with a note on stderr. A missing lakehouse, table or ledger, or an
argument a command does not take, exits 2 with one line on stderr. The queries themselves live in
:mod:`connectors.delta.queries`.

Example:
    $ bkaudit query alerts --group-by kind --lakehouse lakehouse/demo
    $ bkaudit query under-replicated --group-by rack
    $ bkaudit query ledgers --bookie bookie-00 --format csv
    $ bkaudit query history 7
    $ bkaudit query what-if --down bookie-01 --down bookie-02 --format json
    $ bkaudit query drain bookie-01
    $ bkaudit query auditor-diff --grace 600
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bkaudit.cli._io import positional_or_named
from bkaudit.cli.formats import StateFormat, emit_state
from core.errors import InvalidArgumentError

if TYPE_CHECKING:
    import pyarrow as pa

    from connectors.delta.queries import Lakehouse

app = typer.Typer(
    help="Ask the Delta tables what is at risk, why and since when (DuckDB; no Spark).", no_args_is_help=True
)


class OutputFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


LakehouseOption = Annotated[
    str | None,
    typer.Option(
        "--lakehouse",
        help="root of the Delta tables, a path or s3://bucket/prefix (default: the lakehouse_root setting, "
        "or object_store.lakehouse_url)",
    ),
]
FormatOption = Annotated[
    OutputFormat, typer.Option("--format", "-f", help="table (aligned text), json (one array) or csv")
]
LimitOption = Annotated[int, typer.Option("--limit", help="print at most this many rows; 0 prints all")]
GroupByOption = Annotated[list[str] | None, typer.Option("--group-by", help="count per key (repeatable)")]
KindOption = Annotated[list[str] | None, typer.Option("--kind", help="alert kind (repeatable)")]
BookieOption = Annotated[str | None, typer.Option("--bookie", help="bookie id")]
RackOption = Annotated[
    str | None, typer.Option("--rack", help="rack, e.g. /rack-0 (/default-rack: none set)")
]
TopicOption = Annotated[
    str | None, typer.Option("--topic", help="Pulsar topic, persistent://tenant/ns/topic")
]
NamespaceOption = Annotated[str | None, typer.Option("--namespace", help="Pulsar namespace, tenant/ns")]
LedgerIdOption = Annotated[int | None, typer.Option("--ledger-id", help="ledger id")]
ColumnsOption = Annotated[
    str | None,
    typer.Option(
        "--columns",
        help="comma-separated columns to print, or 'all' (default: a narrow set for the table view, every "
        "column for json and csv)",
    ),
]

DEFAULT_LIMIT = 1000

#: The columns the table view shows unless --columns says otherwise (json and csv show every column).
NARROW: dict[str, tuple[str, ...]] = {
    "alerts": ("kind", "severity", "entity", "pulsar_topic", "since"),
    "under-replicated": ("ledger_id", "kind", "lost_bookies", "racks", "pulsar_topic", "since"),
    "placement-ledgers": ("ledger_id", "kind", "bookies", "racks", "pulsar_topic", "since"),
    "ledgers": ("ledger_id", "state", "bookies", "pulsar_topic", "placement", "open_alerts", "updated_at"),
    "bookies": ("bookie_id", "status", "lost", "missing_since", "flaps", "rack", "ledgers", "open_alerts"),
    "violations": ("detected_at", "kind", "state", "entity", "pulsar_topic"),
    "auditor-diff": (
        "diff",
        "ledger_id",
        "findings",
        "lost_bookies",
        "since",
        "marked_since",
        "pulsar_topic",
    ),
    "drain": ("ledger_id", "reason", "state", "under_replication_marked", "pulsar_topic", "open_alerts"),
}


def _lakehouse(location: str | None) -> Lakehouse:
    from connectors.delta.queries import Lakehouse
    from connectors.storage import configure_from, is_remote

    if location is None or is_remote(location):  # the settings say where, or hold the credentials
        from core.settings import load_settings

        settings = load_settings()
        configure_from(settings)
        location = settings.lakehouse if location is None else location
    return Lakehouse(location)


def _columns(table: pa.Table, fmt: OutputFormat, columns: str | None, narrow: tuple[str, ...]) -> pa.Table:
    """The columns to print: those asked for (unknown ones are bad input), else the narrow set in the table
    view when the result has it (a grouped result does not), else all."""
    if columns is not None and columns.strip().lower() != "all":
        wanted = [name.strip() for name in columns.split(",") if name.strip()]
        unknown = [name for name in wanted if name not in table.column_names]
        if unknown or not wanted:
            raise InvalidArgumentError(
                f"--columns: no column {', '.join(unknown) or '(none given)'}; this query has "
                f"{', '.join(table.column_names)}"
            )
        return table.select(wanted)
    if columns is None and fmt is OutputFormat.table and narrow and set(narrow) <= set(table.column_names):
        return table.select(list(narrow))
    return table


def _print(
    lakehouse: str | None,
    fmt: OutputFormat,
    limit: int | None,
    query: Callable[[Lakehouse, int | None], pa.Table],
    columns: str | None = None,
    narrow: tuple[str, ...] = (),
) -> None:
    """Run ``query`` with one row more than ``limit`` (to know whether rows were cut) and print the chosen
    columns of it."""
    from bkaudit.cli._render import readable_times, render

    if limit is not None and limit < 0:
        raise InvalidArgumentError(f"--limit must be 0 (all) or more, got {limit}")
    wanted = limit or None  # 0 and None: every row
    with _lakehouse(lakehouse) as opened:
        table = query(opened, None if wanted is None else wanted + 1)
    if wanted is not None and table.num_rows > wanted:
        table = table.slice(0, wanted)
        sys.stderr.write(f"bkaudit: showing the first {wanted} rows; --limit 0 prints all\n")
    table = _columns(table, fmt, columns, narrow)
    render(readable_times(table) if fmt is OutputFormat.table else table, fmt.value, sys.stdout)


def _moment(text: str | None, option: str) -> datetime | None:
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgumentError(
            f"{option} must be an ISO date or time (UTC unless given), got {text!r}"
        ) from None


@app.command("alerts")
def alerts(
    kind: KindOption = None,
    severity: Annotated[str | None, typer.Option("--severity", help="critical, warning or info")] = None,
    bookie: BookieOption = None,
    rack: RackOption = None,
    ledger_id: LedgerIdOption = None,
    topic: TopicOption = None,
    namespace: NamespaceOption = None,
    group_by: GroupByOption = None,
    lakehouse: LakehouseOption = None,
    fmt: FormatOption = OutputFormat.table,
    limit: LimitOption = DEFAULT_LIMIT,
    columns: ColumnsOption = None,
) -> None:
    """Open alerts, oldest first; --group-by kind|severity|bookie|rack|topic|namespace counts them."""
    _print(
        lakehouse,
        fmt,
        limit,
        lambda lh, rows: lh.open_alerts(
            kinds=kind,
            severity=severity,
            bookie=bookie,
            rack=rack,
            ledger_id=ledger_id,
            topic=topic,
            namespace=namespace,
            group_by=group_by,
            limit=rows,
        ),
        columns,
        NARROW["alerts"],
    )


@app.command("under-replicated")
def under_replicated(
    bookie: Annotated[str | None, typer.Option("--bookie", help="lost bookie the ledgers name")] = None,
    rack: Annotated[str | None, typer.Option("--rack", help="rack of the lost bookie")] = None,
    topic: TopicOption = None,
    namespace: NamespaceOption = None,
    unrecoverable: Annotated[
        bool, typer.Option("--unrecoverable", help="only ledgers with entries that have no copy left")
    ] = False,
    group_by: GroupByOption = None,
    lakehouse: LakehouseOption = None,
    fmt: FormatOption = OutputFormat.table,
    limit: LimitOption = DEFAULT_LIMIT,
    columns: ColumnsOption = None,
) -> None:
    """Ledgers under-replicated or unrecoverable now; --group-by bookie|rack|topic|namespace|kind."""
    _print(
        lakehouse,
        fmt,
        limit,
        lambda lh, rows: lh.under_replicated(
            bookie=bookie,
            rack=rack,
            topic=topic,
            namespace=namespace,
            unrecoverable_only=unrecoverable,
            group_by=group_by,
            limit=rows,
        ),
        columns,
        NARROW["under-replicated"],
    )


@app.command("placement")
def placement(
    rack: RackOption = None,
    kind: KindOption = None,
    topic: TopicOption = None,
    namespace: NamespaceOption = None,
    ledgers: Annotated[
        bool, typer.Option("--ledgers", help="one row per ledger instead of per rack")
    ] = False,
    plan: Annotated[
        bool,
        typer.Option(
            "--plan",
            help="one relocation plan per failing segment of each PLACEMENT_NOT_ADHERING ledger: the fewest "
            "replica moves that make it meet the policy (stream.placement_policy) strictly",
        ),
    ] = False,
    by_target: Annotated[
        bool,
        typer.Option(
            "--by-target",
            help="with --plan: one row per target bookie, the plans' moves, ledgers and bytes_to_move on it",
        ),
    ] = False,
    lakehouse: LakehouseOption = None,
    fmt: FormatOption = OutputFormat.table,
    limit: LimitOption = DEFAULT_LIMIT,
    columns: ColumnsOption = None,
) -> None:
    """Open placement violations per rack (PLACEMENT_NOT_ADHERING, PLACEMENT_SOFT); --ledgers lists them,
    --plan says how to fix them (--by-target: what the plans move to each bookie)."""
    if by_target and not plan:
        raise InvalidArgumentError("--by-target goes with --plan")
    if plan:
        config = _placement_config()
        _print(
            lakehouse,
            fmt,
            limit,
            lambda lh, rows: lh.placement_plans(
                config, topic=topic, namespace=namespace, by_target=by_target, limit=rows
            ),
            columns,
        )
        return
    _print(
        lakehouse,
        fmt,
        limit,
        lambda lh, rows: lh.placement(
            rack=rack, kinds=kind, topic=topic, namespace=namespace, by_ledger=ledgers, limit=rows
        ),
        columns,
        NARROW["placement-ledgers"],
    )


def _placement_config() -> Any:
    """The placement policy the job audits against (the stream settings)."""
    from core.settings import load_settings

    return load_settings().stream.placement_policy_config()


@app.command("ledgers")
def ledgers(
    bookie: Annotated[
        str | None, typer.Option("--bookie", help="ledgers whose metadata names this bookie")
    ] = None,
    rack: Annotated[str | None, typer.Option("--rack", help="ledgers naming a bookie of this rack")] = None,
    topic: TopicOption = None,
    namespace: NamespaceOption = None,
    state: Annotated[str | None, typer.Option("--state", help="OPEN, IN_RECOVERY or CLOSED")] = None,
    placement: Annotated[
        str | None, typer.Option("--placement", help="FAIL, MEETS_SOFT or MEETS_STRICT")
    ] = None,
    include_deleted: Annotated[bool, typer.Option("--include-deleted", help="also deleted ledgers")] = False,
    lakehouse: LakehouseOption = None,
    fmt: FormatOption = OutputFormat.table,
    limit: LimitOption = DEFAULT_LIMIT,
    columns: ColumnsOption = None,
) -> None:
    """Ledgers with their ensemble, topic, placement and open alerts (e.g. a dead bookie's: --bookie)."""
    _print(
        lakehouse,
        fmt,
        limit,
        lambda lh, rows: lh.ledgers(
            bookie=bookie,
            rack=rack,
            topic=topic,
            namespace=namespace,
            state=state,
            placement=placement,
            include_deleted=include_deleted,
            limit=rows,
        ),
        columns,
        NARROW["ledgers"],
    )


@app.command("history")
def history(
    ledger_id: Annotated[int | None, typer.Argument(help="the ledger (or --ledger-id)")] = None,
    named_id: LedgerIdOption = None,
    lakehouse: LakehouseOption = None,
    fmt: FormatOption = OutputFormat.table,
    columns: ColumnsOption = None,
) -> None:
    """One ledger's story: its metadata versions (Delta change feed) and alert transitions, in time order."""
    chosen = positional_or_named(ledger_id, named_id, "--ledger-id")
    _print(lakehouse, fmt, None, lambda lh, _rows: lh.ledger_history(chosen), columns)


@app.command("topic")
def topic(
    name: Annotated[str, typer.Argument(help="persistent://tenant/namespace/topic, or its managed ledger")],
    lakehouse: LakehouseOption = None,
    fmt: FormatOption = OutputFormat.table,
    columns: ColumnsOption = None,
) -> None:
    """One Pulsar topic's ledgers (its own, then its cursors') and what BookKeeper has of each: MISSING, ok,
    offloaded (tiered storage), as the watcher last read its managed ledger."""
    _print(lakehouse, fmt, None, lambda lh, _rows: lh.topic(name), columns)


@app.command("orphans")
def orphans(
    lakehouse: LakehouseOption = None,
    fmt: FormatOption = OutputFormat.table,
    limit: LimitOption = DEFAULT_LIMIT,
    columns: ColumnsOption = None,
) -> None:
    """Ledgers orphaned by their Pulsar topic (open LEDGER_ORPHANED), largest first."""
    _print(lakehouse, fmt, limit, lambda lh, rows: _first(lh.orphans(), rows), columns)


@app.command("bookies")
def bookies(
    status: Annotated[
        str | None, typer.Option("--status", help="WRITABLE, READ_ONLY, GONE or UNKNOWN")
    ] = None,
    rack: RackOption = None,
    lost: Annotated[bool | None, typer.Option("--lost/--not-lost", help="only lost / only not lost")] = None,
    lakehouse: LakehouseOption = None,
    fmt: FormatOption = OutputFormat.table,
    columns: ColumnsOption = None,
) -> None:
    """Bookies: membership, rack, flaps, how many ledgers name each, what is open about it."""
    _print(
        lakehouse,
        fmt,
        None,
        lambda lh, _rows: lh.bookies(status=status, rack=rack, lost=lost),
        columns,
        NARROW["bookies"],
    )


@app.command("violations")
def violations(
    kind: KindOption = None,
    state: Annotated[str | None, typer.Option("--state", help="firing or resolved")] = None,
    ledger_id: LedgerIdOption = None,
    bookie: BookieOption = None,
    since: Annotated[
        str | None, typer.Option("--since", help="from this time (ISO 8601; UTC unless given)")
    ] = None,
    until: Annotated[str | None, typer.Option("--until", help="before this time (ISO 8601)")] = None,
    group_by: GroupByOption = None,
    lakehouse: LakehouseOption = None,
    fmt: FormatOption = OutputFormat.table,
    limit: LimitOption = DEFAULT_LIMIT,
    columns: ColumnsOption = None,
) -> None:
    """Alert transitions in time order; --group-by kind|state|severity|bookie|rack|namespace|day."""
    since_at, until_at = _moment(since, "--since"), _moment(until, "--until")
    _print(
        lakehouse,
        fmt,
        limit,
        lambda lh, rows: lh.violations(
            kinds=kind,
            state=state,
            ledger_id=ledger_id,
            bookie=bookie,
            since=since_at,
            until=until_at,
            group_by=group_by,
            limit=rows,
        ),
        columns,
        NARROW["violations"],
    )


@app.command("what-if")
def what_if(
    down: Annotated[
        list[str], typer.Option("--down", help="a bookie that would go away (repeatable)", show_default=False)
    ],
    lakehouse: LakehouseOption = None,
    fmt: Annotated[
        StateFormat,
        typer.Option("--format", "-f", help="table (aligned text, the default) or json (one object)"),
    ] = StateFormat.table,
    limit: LimitOption = DEFAULT_LIMIT,
) -> None:
    """What happens if these bookies go away now (with those already gone): safe, and each ledger's verdict
    (UNRECOVERABLE, BELOW_ACK_QUORUM, UNDER_REPLICATED). Exits 1 when not safe."""
    if limit < 0:
        raise InvalidArgumentError(f"--limit must be 0 (all) or more, got {limit}")
    with _lakehouse(lakehouse) as opened:
        answer = opened.what_if(down)
    document = answer.to_document()
    if limit and len(document["ledgers"]) > limit:
        document["ledgers"] = document["ledgers"][:limit]
        sys.stderr.write(f"bkaudit: listing the first {limit} ledgers; --limit 0 lists all\n")
    if fmt is StateFormat.table:
        document["ledgers"] = [_readable_what_if_row(row) for row in document["ledgers"]]
    emit_state(document, fmt)
    if not answer.safe:
        raise typer.Exit(1)


def _readable_what_if_row(row: dict[str, Any]) -> dict[str, Any]:
    """The columns that fit a terminal: the sample and quorums stay in the JSON."""
    keep = ("ledger_id", "verdict", "lost_bookies", "fewest_copies_left", "topic")
    return {name: row[name] for name in keep}


@app.command("drain")
def drain(
    bookie: Annotated[str | None, typer.Argument(help="the bookie being drained (or --bookie)")] = None,
    named_bookie: BookieOption = None,
    lakehouse: LakehouseOption = None,
    fmt: FormatOption = OutputFormat.table,
    limit: LimitOption = DEFAULT_LIMIT,
    columns: ColumnsOption = None,
) -> None:
    """Ledgers that still name a bookie and why each has not moved (unrecoverable, stuck, open, marked,
    not_marked), most pressing first."""
    chosen = positional_or_named(bookie, named_bookie, "--bookie")
    _print(lakehouse, fmt, limit, lambda lh, rows: _first(lh.drain(chosen), rows), columns, NARROW["drain"])


def _first(table: pa.Table, rows: int | None) -> pa.Table:
    return table if rows is None else table.slice(0, rows)


@app.command("auditor-diff")
def auditor_diff(
    grace: Annotated[
        float | None,
        typer.Option(
            "--grace",
            min=0,
            metavar="SECONDS",
            help="how long BookKeeper's Auditor may take to mark a ledger bkaudit finds at risk "
            "(default: stream.auditor_lagging_grace_s, AUDITOR_LAGGING's grace)",
        ),
    ] = None,
    lakehouse: LakehouseOption = None,
    fmt: FormatOption = OutputFormat.table,
    limit: LimitOption = DEFAULT_LIMIT,
    columns: ColumnsOption = None,
) -> None:
    """Where BookKeeper's Auditor and bkaudit disagree: ledgers at risk with no under-replication mark past
    the grace (at_risk_unmarked), and marks on ledgers bkaudit finds healthy (marked_healthy)."""
    if grace is None:
        from core.settings import load_settings

        grace = load_settings().stream.auditor_lagging_grace_s
    _print(
        lakehouse,
        fmt,
        limit,
        lambda lh, rows: _first(lh.auditor_diff(grace_s=grace), rows),
        columns,
        NARROW["auditor-diff"],
    )
