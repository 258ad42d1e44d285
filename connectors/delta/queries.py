"""The SRE's questions over the auditor's Delta tables, answered with DuckDB through Arrow (no Spark).

What is at risk right now, why, and since when: open alerts, ledgers under-replicated or unrecoverable
(by bookie, rack, Pulsar topic or namespace), placement violations by rack, the ledgers of a bookie, the
bookies and their status, the alert history, and the history of one ledger (its ``ledgers`` versions through
the change data feed, and its alert transitions). Used by ``bkaudit query ...`` and by the notebooks; every
query returns a ``pyarrow.Table``.

How it reads: ``deltalake`` gives the table's live files (the Delta log, so files a merge or vacuum removed
are never read) and DuckDB reads those Parquet files itself, with projection and row-group pruning;
partition values come from the log. Tables whose protocol needs reader features (deletion vectors, column
mapping) go through ``DeltaTable.to_pyarrow_dataset`` instead. Every value a caller passes is a bound
parameter of the SQL, never part of its text. Column names of the results are stable: the CLI prints them.

Conventions: a bookie without a rack in the rack map is in BookKeeper's default rack ``/default-rack``; the
*namespace* of a topic is what Pulsar's ``TopicName`` parses: ``tenant/namespace`` of
``persistent://tenant/namespace/topic``, ``property/cluster/namespace`` of a v1 name with four parts.
No query reads ``custom_metadata`` or ``dead_letters.value``, and no table holds the ledger password.

Example:
    >>> import tempfile
    >>> lakehouse = Lakehouse(write_example_lakehouse(tempfile.mkdtemp()))
    >>> lakehouse.under_replicated(group_by=["rack"]).to_pylist()[0]["ledgers"]
    2
    >>> lakehouse.ledgers(bookie="bookie-1").column("ledger_id").to_pylist()
    [1, 2]
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import duckdb
import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from connectors import storage
from connectors.delta.health import table_damage, what_to_do
from connectors.delta.placement_plans import (
    ALERT_COLUMNS,
    BOOKIE_COLUMNS,
    LEDGER_COLUMNS,
    UNRESPONSIVE,
    plan_rows,
)
from connectors.delta.scan import view_typed_dataset
from connectors.delta.tables import FOLD_METADATA_KEY, INDEX_LEDGER_COLUMNS, LEDGER_BUCKETS, TABLES, last_fold
from core.domain.alerts import AlertKind
from core.domain.rules.auditor_lag import unmarked_past_grace
from core.domain.rules.evaluate import PlacementPolicyConfig
from core.errors import InvalidArgumentError, NotFoundError, ServiceError

if TYPE_CHECKING:
    from connectors.delta.removal import WhatIf

__all__ = [
    "ALERT_KINDS",
    "DEFAULT_RACK",
    "HISTORY_SCHEMA",
    "LEDGER_RISK_KINDS",
    "PLACEMENT_KINDS",
    "Lakehouse",
    "naive_utc",
    "write_example_lakehouse",
]

#: Every alert kind, from the one enum that defines them.
ALERT_KINDS = tuple(kind.value for kind in AlertKind)
# The entity of each cluster-level kind, as SQL (enum constants, nothing from the user).
#: The ledger columns the lost-bookie rule reads besides the id (those the index copies, but the topic).
_RULE_COLUMNS = tuple(name for name in INDEX_LEDGER_COLUMNS if name != "pulsar_topic")
_MEMBERSHIP_SQL = "SELECT bookie_id, status FROM bookies ORDER BY bookie_id"
_CLUSTER_ENTITY_CASES = " ".join(
    f"WHEN v.kind = '{kind.value}' THEN '{kind.cluster_entity}'" for kind in AlertKind if kind.is_cluster_kind
)
LEDGER_RISK_KINDS = ("LEDGER_UNDER_REPLICATED", "LEDGER_UNRECOVERABLE")
PLACEMENT_KINDS = ("PLACEMENT_NOT_ADHERING", "PLACEMENT_SOFT")
SEVERITIES = ("critical", "warning", "info")
BOOKIE_STATUSES = ("WRITABLE", "READ_ONLY", "GONE", "UNKNOWN")
LEDGER_STATES = ("OPEN", "IN_RECOVERY", "CLOSED")
PLACEMENTS = ("FAIL", "MEETS_SOFT", "MEETS_STRICT")
ALERT_STATES = ("firing", "resolved")
DEFAULT_RACK = "/default-rack"  # BookKeeper's NetworkTopology.DEFAULT_RACK
INT64_MAX = 2**63 - 1

TOPIC_LEDGERS_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("managed_ledger", pa.string()),
        ("ledger_id", pa.int64()),
        ("owner", pa.string()),
        ("state", pa.string()),
        ("ledger_state", pa.string()),
        ("length", pa.int64()),
        ("entries", pa.int64()),
        ("size", pa.int64()),
    ]
)
"""``bkaudit query topic``: one row per ledger a topic needs (``state``: what BookKeeper has of it)."""

HISTORY_SCHEMA = pa.schema(
    [
        pa.field("at", pa.timestamp("us", tz="UTC")),
        pa.field("source", pa.string()),
        pa.field("table_version", pa.int64()),
        pa.field("event", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("change", pa.string()),
        pa.field("committed_at", pa.timestamp("us", tz="UTC")),
    ]
)

# Pulsar's TopicName: three parts after "://" are tenant/namespace/local, four are the v1
# property/cluster/namespace/local; anything else is not a topic name.
_MACROS = """
CREATE OR REPLACE TEMP MACRO pulsar_namespace(topic) AS (
    CASE len(string_split(split_part(topic, '://', 2), '/'))
        WHEN 3 THEN array_to_string(string_split(split_part(topic, '://', 2), '/')[1:2], '/')
        WHEN 4 THEN array_to_string(string_split(split_part(topic, '://', 2), '/')[1:3], '/')
    END
);
CREATE OR REPLACE TEMP MACRO rack_or_default(rack) AS coalesce(rack, '/default-rack');
"""

# Columns of a ledgers row whose change the history reports (not the znode bookkeeping columns).
_TRACKED = (
    "state",
    "ensemble_size",
    "write_quorum",
    "ack_quorum",
    "last_entry_id",
    "length",
    "segments",
    "pulsar_topic",
    "placement",
    "under_replication_marked",
    "under_replication_replicas",
    "undecodable_reason",
    "deleted",
    "znode_version",
)
_CDF_COLUMNS = ("ledger_id", *_TRACKED, "updated_at", "_change_type", "_commit_version", "_commit_timestamp")


# DuckDB types of the Arrow types a partition column can have (anything else stays text).
_DUCKDB_TYPES = {
    "int8": "TINYINT",
    "int16": "SMALLINT",
    "int32": "INTEGER",
    "int64": "BIGINT",
    "bool": "BOOLEAN",
    "double": "DOUBLE",
    "date32[day]": "DATE",
    "string": "VARCHAR",
}


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _choice(what: str, value: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise InvalidArgumentError(f"unknown {what} {value!r}; expected one of {', '.join(allowed)}")
    return value


def _choices(what: str, values: Iterable[str] | str | None, allowed: Sequence[str]) -> list[str]:
    if isinstance(values, str):  # one value given where a list is taken
        values = [values]
    return [_choice(what, value, allowed) for value in (values or [])]


def _ledger_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value), 10)
        except ValueError:
            raise InvalidArgumentError(f"ledger id must be a number, got {str(value)[:40]!r}") from None
    if not 0 <= value <= INT64_MAX:
        raise InvalidArgumentError(f"ledger id {value} is outside 0..{INT64_MAX}")
    return value


def _limit(value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"limit must be a non-negative integer, got {value!r}")
    return value


#: What reading a damaged or unreadable table raises: deltalake, DuckDB, Arrow, the file system.
_READ_ERRORS = (DeltaError, OSError, pa.ArrowException, duckdb.IOException, duckdb.InvalidInputException)
_COLOURS = re.compile(r"\x1b\[[0-9;]*m")
_BACKTRACE_LINE = re.compile(r"^(\d+: |at |Stack backtrace)")


def read_failure(err: BaseException) -> str:
    r"""Why a read failed, on one line: a reader's (multi-line, coloured) message without its colours,
    arrows and backtrace, at most 300 characters.

    Example:
        >>> message = "Kernel error\n  \x1b[31m↳\x1b[0m Not a directory (os error 20)\n   0: <unknown>"
        >>> read_failure(OSError(message))
        'Kernel error: Not a directory (os error 20)'
    """
    parts = []
    for line in _COLOURS.sub("", str(err)).splitlines():
        text = line.strip().lstrip("↳").strip()
        if _BACKTRACE_LINE.match(text):
            break
        if text:
            parts.append(text)
    return ": ".join(parts)[:300] or type(err).__name__


def _is_table(path: str) -> bool:
    """Whether ``path`` is a Delta table's directory; a file, or a directory that cannot be read, is not."""
    try:
        return storage.is_dir(path) and DeltaTable.is_deltatable(path)
    except (DeltaError, OSError, pa.ArrowException):
        return False


def _demo_hint(location: str) -> str:
    """Where the demo's tables are, when ``root`` holds them one or two levels down (a common slip)."""
    if storage.is_remote(location):
        return ""
    root = Path(location)
    for place in (root / "demo", root / "lakehouse" / "demo"):
        if root.name != "demo" and place.is_dir():
            return f" (the demo's tables are in {place})"
    return ""


class _Filters:
    """WHERE clauses with their bound parameters: values never enter the SQL text."""

    def __init__(self) -> None:
        self.clauses: list[str] = []
        self.params: dict[str, object] = {}

    def add(self, clause: str, **params: object) -> None:
        self.clauses.append(clause)
        self.params.update(params)

    def where(self) -> str:
        return ("WHERE " + " AND ".join(self.clauses)) if self.clauses else ""


#: Tables read through a view of what the job finished (connectors.delta.ledger_log).
_CURRENT_VIEWS = ("ledgers", "ledger_bookies")
# Every ledger's newest row: the folded table, overridden by the newest change after the last fold.
_CURRENT_LEDGERS_SQL = """
CREATE OR REPLACE TEMP VIEW ledger_changes__latest AS
SELECT * EXCLUDE (batch_id) FROM ledger_changes__all WHERE batch_id > {folded}
QUALIFY row_number() OVER (PARTITION BY ledger_id ORDER BY batch_id DESC) = 1;
CREATE OR REPLACE TEMP VIEW ledgers AS
SELECT * FROM ledgers__folded WHERE ledger_id NOT IN (SELECT ledger_id FROM ledger_changes__latest)
UNION ALL BY NAME SELECT * FROM ledger_changes__latest
"""
# The index rows of each ledger's current version (older versions' rows wait for their cleanup): a ledger
# changed since the last fold from its current row (the job appends its index rows at its own cadence,
# never past a fold), the others from the table.
_CURRENT_INDEX_SQL = f"""
CREATE OR REPLACE TEMP VIEW ledger_bookies AS
SELECT i.* FROM ledger_bookies__all i JOIN ledgers l ON i.ledger_id = l.ledger_id AND i.mzxid = l.mzxid
WHERE NOT coalesce(l.deleted, false)
  AND i.ledger_id NOT IN (SELECT ledger_id FROM ledger_changes__latest)
UNION ALL BY NAME
SELECT unnest(bookies) AS bookie, ledger_id, mzxid, {", ".join(INDEX_LEDGER_COLUMNS)}
FROM ledger_changes__latest WHERE NOT coalesce(deleted, false)
"""


class Lakehouse:
    """Read-only queries over the Delta tables under one lakehouse root; each returns a ``pyarrow.Table``.

    Every call reads the tables' current versions (a notebook kept open sees the auditor's new commits).
    Raises :class:`~core.errors.NotFoundError` for a missing root or table,
    :class:`~core.errors.ServiceError` for a table that cannot be read (damaged, unreadable files) and
    :class:`~core.errors.InvalidArgumentError` for an argument it does not accept.

    Example:
        >>> import tempfile
        >>> Lakehouse(write_example_lakehouse(tempfile.mkdtemp())).tables()[:3]
        ['bookies', 'dead_letters', 'ledger_bookies']
        >>> try:
        ...     Lakehouse("/nonexistent/lakehouse")
        ... except NotFoundError as err:
        ...     str(err)
        'no lakehouse at /nonexistent/lakehouse'
    """

    def __init__(self, root: str | Path) -> None:
        self.root = str(root)
        if not storage.is_dir(self.root):
            raise NotFoundError(f"no lakehouse at {self.root}{_demo_hint(self.root)}")
        self._con = duckdb.connect(":memory:")
        self._con.execute("SET TimeZone = 'UTC'")
        self._con.execute(_MACROS)

    def close(self) -> None:
        """Release the DuckDB connection (the object is unusable afterwards).

        Example:
            >>> import tempfile
            >>> Lakehouse(write_example_lakehouse(tempfile.mkdtemp())).close()
        """
        self._con.close()

    def __enter__(self) -> Lakehouse:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- plumbing -----------------------------------------------------------------------------------------

    def tables(self) -> list[str]:
        """The Delta tables present under the root, sorted.

        Example:
            >>> import tempfile
            >>> "ledgers" in Lakehouse(write_example_lakehouse(tempfile.mkdtemp())).tables()
            True
        """
        try:
            names = storage.list_dirs(self.root)
        except (OSError, pa.ArrowException) as err:
            why = getattr(err, "strerror", None) or " ".join(str(err).split())[:300]
            raise ServiceError(f"cannot list the lakehouse at {self.root}: {why}") from None
        return [name for name in names if _is_table(storage.join(self.root, name))]

    def _delta(self, name: str) -> DeltaTable:
        """The table ``name``; one line (not a traceback) when it is missing or cannot be read."""
        path = storage.join(self.root, name)
        try:
            if storage.is_dir(path):
                return DeltaTable(path)
        except TableNotFoundError:
            pass
        except _READ_ERRORS as err:
            damage = table_damage(path)
            why = f"it is damaged: {damage}; {what_to_do(name)}" if damage else read_failure(err)
            raise ServiceError(f"cannot read the Delta table '{name}' under {self.root}: {why}") from None
        hint = "" if self.tables() else _demo_hint(self.root) or " (it holds no Delta tables)"
        raise NotFoundError(f"no Delta table '{name}' under {self.root}{hint}")

    @contextmanager
    def _reading(self) -> Iterator[None]:
        """Turn a failed read of the tables' files into one :class:`ServiceError` line."""
        try:
            yield
        except _READ_ERRORS as err:
            # A file vanished under us (a vacuum), or is damaged or unreadable.
            raise ServiceError(f"cannot read the tables under {self.root}: {read_failure(err)}") from err

    def _view(self, name: str) -> None:
        """(Re)create the temp view ``name``: the table's current live files, and for ``ledgers`` and
        ``ledger_bookies`` what the job finished (the changes not folded yet; rows of current versions)."""
        if name not in _CURRENT_VIEWS:
            self._files_view(name, name)
            return
        self._files_view("ledgers", "ledgers__folded")
        if _is_table(storage.join(self.root, "ledger_changes")):
            self._files_view("ledger_changes", "ledger_changes__all")
        else:
            self._con.execute(
                "CREATE OR REPLACE TEMP VIEW ledger_changes__all AS "
                "SELECT *, CAST(NULL AS BIGINT) AS batch_id FROM ledgers__folded WHERE false"
            )
        folded = last_fold(self._delta("ledgers"))
        self._con.execute(_CURRENT_LEDGERS_SQL.format(folded=-1 if folded is None else int(folded)))
        if name == "ledger_bookies":
            self._files_view("ledger_bookies", "ledger_bookies__all")
            self._con.execute(_CURRENT_INDEX_SQL)

    def _files_view(self, name: str, view_name: str) -> None:
        """(Re)create the temp view ``view_name`` over the table ``name``'s current live files."""
        table = self._delta(name)
        con, view = self._con, _identifier(view_name)
        schema = pa.schema(table.schema().to_arrow())
        actions = pa.RecordBatchReader.from_stream(table.get_add_actions(flatten=True)).read_all()
        paths = [unquote(p) for p in actions.column("path").to_pylist()]
        remote = storage.is_remote(self.root) or any("://" in p for p in paths)
        if not paths or table.protocol().min_reader_version > 1 or remote:
            # No files (DuckDB cannot read an empty file list), or a table DuckDB's Parquet reader cannot
            # read correctly by itself (deletion vectors, column mapping, files elsewhere), or files on an
            # object store (DuckDB would need its httpfs extension, fetched at run time): deltalake's own
            # Arrow dataset does it.
            source: Any = schema.empty_table() if not paths else view_typed_dataset(table)
            con.register(f"{view_name}__arrow", source)
            con.execute(
                f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT * FROM {_identifier(view_name + '__arrow')}"
            )
            return
        partition_columns = set(table.metadata().partition_columns)
        # Partition values are not in the files but in the directory names (key=url-encoded value), which
        # DuckDB's hive partitioning decodes and prunes on; they are cast back to the table's types.
        # Not union_by_name: it reads every file's footer before the query (a streaming table has many
        # files), and every file of a table has its spec's schema (BatchWriter conforms each write to it).
        files = con.read_parquet(
            [storage.join(self.root, name, p) for p in paths], hive_partitioning=bool(partition_columns)
        )
        files.create_view(f"{view_name}__files", replace=True)
        present = set(files.columns)
        columns = []
        for field in schema:
            if field.name not in present:
                continue
            column = _identifier(field.name)
            if field.name in partition_columns:
                text = f"NULLIF(CAST({column} AS VARCHAR), '__HIVE_DEFAULT_PARTITION__')"
                column = f"CAST({text} AS {_DUCKDB_TYPES.get(str(field.type), 'VARCHAR')}) AS {column}"
            columns.append(column)
        source_view = _identifier(view_name + "__files")
        con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT {', '.join(columns)} FROM {source_view}")

    def _query(self, tables: Iterable[str], sql: str, params: Mapping[str, object] | None = None) -> pa.Table:
        with self._reading():
            for name in tables:
                self._view(name)
            return self._con.sql(sql, params=dict(params) if params else None).to_arrow_table()

    def _table_of_rows(self, rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
        """Rows of Python values (timestamps naive UTC) as a table of ``schema``, built by DuckDB: pyarrow
        imports pandas to convert any Python list (see :func:`naive_utc`)."""
        kinds = {"timestamp[us, tz=UTC]": ("TIMESTAMP", "TIMESTAMPTZ"), "string": ("VARCHAR",) * 2}
        kinds["int64"] = ("BIGINT", "BIGINT")
        columns, params = [], {}
        for index, field in enumerate(schema):
            given, wanted = kinds[str(field.type)]
            params[f"c{index}"] = [row[field.name] for row in rows]
            columns.append(
                f"CAST(unnest(CAST($c{index} AS {given}[])) AS {wanted}) AS {_identifier(field.name)}"
            )
        return self._con.sql(f"SELECT {', '.join(columns)}", params=params).to_arrow_table()

    @staticmethod
    def _limit_sql(limit: int | None, filters: _Filters) -> str:
        if _limit(limit) is None:
            return ""
        filters.params["row_limit"] = limit
        return "LIMIT $row_limit"

    # -- alerts -------------------------------------------------------------------------------------------

    def open_alerts(
        self,
        *,
        kinds: Sequence[str] | None = None,
        severity: str | None = None,
        bookie: str | None = None,
        rack: str | None = None,
        ledger_id: int | None = None,
        topic: str | None = None,
        namespace: str | None = None,
        group_by: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> pa.Table:
        """Alerts firing now, oldest first; or counts per ``group_by`` key (kind, severity, bookie, rack,
        topic, namespace), largest first.

        Columns: ``kind, severity, entity, ledger_id, bookies, racks, pulsar_topic, namespace, since,
        detected_at, alert_id, detail`` (``since``: when the condition started); grouped: the keys,
        ``alerts``, ``since``. A bookie or rack filter matches alerts naming that bookie, or a bookie in
        that rack.

        Example:
            >>> import tempfile
            >>> lakehouse = Lakehouse(write_example_lakehouse(tempfile.mkdtemp()))
            >>> lakehouse.open_alerts(group_by=["kind"]).to_pylist()[0]["kind"]
            'LEDGER_UNDER_REPLICATED'
            >>> lakehouse.open_alerts(kinds=["BOOKIE_LOST"]).column("bookies").to_pylist()
            [['bookie-1']]
        """
        keys = _choices(
            "group-by key", group_by, ("kind", "severity", "bookie", "rack", "topic", "namespace")
        )
        filters = _Filters()
        kinds_checked = _choices("alert kind", kinds, ALERT_KINDS)
        if kinds_checked:
            filters.add("list_contains($kinds, a.kind)", kinds=kinds_checked)
        if severity is not None:
            filters.add("a.severity = $severity", severity=_choice("severity", severity, SEVERITIES))
        if bookie is not None:
            filters.add("list_contains(a.bookies, $bookie)", bookie=bookie)
        if rack is not None:
            filters.add("list_contains(a.racks, $rack)", rack=rack)
        if ledger_id is not None:
            filters.add("a.ledger_id = $ledger_id", ledger_id=_ledger_id(ledger_id))
        if topic is not None:
            filters.add("a.pulsar_topic = $topic", topic=topic)
        if namespace is not None:
            filters.add("a.namespace = $namespace", namespace=namespace)
        base = f"""
            WITH member AS (
                SELECT x.alert_id, x.bookie, rack_or_default(b.rack) AS rack
                FROM (SELECT alert_id, unnest(bookies) AS bookie FROM open_alerts) x
                LEFT JOIN bookies b ON b.bookie_id = x.bookie
            ),
            racks AS (
                SELECT alert_id, list(DISTINCT rack ORDER BY rack) AS racks FROM member GROUP BY alert_id
            ),
            a AS (
                SELECT o.*, coalesce(r.racks, []) AS racks, pulsar_namespace(o.pulsar_topic) AS namespace
                FROM open_alerts o LEFT JOIN racks r USING (alert_id)
            ),
            selected AS (SELECT * FROM a {filters.where()})
        """
        if keys:
            expand = "bookie" in keys or "rack" in keys
            source = "selected s JOIN member m USING (alert_id)" if expand else "selected s"
            columns = {
                "kind": "s.kind",
                "severity": "s.severity",
                "bookie": "m.bookie",
                "rack": "m.rack",
                "topic": "s.pulsar_topic",
                "namespace": "s.namespace",
            }
            select = ", ".join(f"{columns[k]} AS {k}" for k in keys)
            sql = f"""{base}
                SELECT {select}, count(DISTINCT s.alert_id) AS alerts, min(s.started_at) AS since
                FROM {source} GROUP BY ALL ORDER BY alerts DESC, {", ".join(keys)}
                {self._limit_sql(limit, filters)}"""
        else:
            sql = f"""{base}
                SELECT kind, severity, entity, ledger_id, bookies, racks, pulsar_topic, namespace,
                       started_at AS since, detected_at, alert_id, detail
                FROM selected ORDER BY since, kind, entity {self._limit_sql(limit, filters)}"""
        return self._query(("open_alerts", "bookies"), sql, filters.params)

    def under_replicated(
        self,
        *,
        bookie: str | None = None,
        rack: str | None = None,
        topic: str | None = None,
        namespace: str | None = None,
        unrecoverable_only: bool = False,
        group_by: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> pa.Table:
        """Ledgers under-replicated or unrecoverable now (open ``LEDGER_*`` alerts), with why and since when.

        ``bookie`` and ``rack`` are those of the *lost* bookies the alert names (the cause). Columns:
        ``ledger_id, kind, severity, lost_bookies, racks, pulsar_topic, namespace, state, ensemble_size,
        write_quorum, ack_quorum, under_replication_marked, since``; grouped by any of bookie, rack, topic,
        namespace, kind: the keys, ``ledgers``, ``unrecoverable``, ``since`` (a ledger missing two bookies
        counts once per bookie).

        Example:
            >>> import tempfile
            >>> lakehouse = Lakehouse(write_example_lakehouse(tempfile.mkdtemp()))
            >>> [(r["ledger_id"], r["lost_bookies"]) for r in lakehouse.under_replicated().to_pylist()]
            [(1, ['bookie-1']), (2, ['bookie-1'])]
            >>> lakehouse.under_replicated(group_by=["namespace"]).to_pylist()[0]["namespace"]
            'public/default'
        """
        keys = _choices("group-by key", group_by, ("bookie", "rack", "topic", "namespace", "kind"))
        filters = _Filters()
        filters.add(
            "list_contains($kinds, a.kind)",
            kinds=["LEDGER_UNRECOVERABLE"] if unrecoverable_only else list(LEDGER_RISK_KINDS),
        )
        if bookie is not None:
            filters.add("list_contains(a.bookies, $bookie)", bookie=bookie)
        if rack is not None:
            filters.add("list_contains(a.racks, $rack)", rack=rack)
        if topic is not None:
            filters.add("a.pulsar_topic = $topic", topic=topic)
        if namespace is not None:
            filters.add("pulsar_namespace(a.pulsar_topic) = $namespace", namespace=namespace)
        base = f"""
            WITH risk AS (
                SELECT * FROM open_alerts WHERE kind IN ('LEDGER_UNDER_REPLICATED', 'LEDGER_UNRECOVERABLE')
            ),
            lost AS (
                SELECT x.alert_id, x.bookie, rack_or_default(b.rack) AS rack
                FROM (SELECT alert_id, unnest(bookies) AS bookie FROM risk) x
                LEFT JOIN bookies b ON b.bookie_id = x.bookie
            ),
            racks AS (
                SELECT alert_id, list(DISTINCT rack ORDER BY rack) AS racks FROM lost GROUP BY alert_id
            ),
            a AS (SELECT r.*, coalesce(x.racks, []) AS racks FROM risk r LEFT JOIN racks x USING (alert_id)),
            selected AS (SELECT * FROM a {filters.where()})
        """
        if keys:
            columns = {
                "bookie": "l.bookie",
                "rack": "l.rack",
                "topic": "s.pulsar_topic",
                "namespace": "pulsar_namespace(s.pulsar_topic)",
                "kind": "s.kind",
            }
            select = ", ".join(f"{columns[k]} AS {k}" for k in keys)
            sql = f"""{base}
                SELECT {select}, count(DISTINCT s.ledger_id) AS ledgers,
                       count(DISTINCT s.ledger_id) FILTER (WHERE s.kind = 'LEDGER_UNRECOVERABLE')
                           AS unrecoverable,
                       min(s.started_at) AS since
                FROM selected s JOIN lost l USING (alert_id)
                GROUP BY ALL ORDER BY ledgers DESC, {", ".join(keys)} {self._limit_sql(limit, filters)}"""
            return self._query(("open_alerts", "bookies"), sql, filters.params)
        sql = f"""{base},
            page AS (SELECT * FROM selected ORDER BY ledger_id, kind {self._limit_sql(limit, filters)})
            SELECT s.ledger_id, s.kind, s.severity, s.bookies AS lost_bookies, s.racks, s.pulsar_topic,
                   pulsar_namespace(s.pulsar_topic) AS namespace, l.state, l.ensemble_size, l.write_quorum,
                   l.ack_quorum, l.under_replication_marked, s.started_at AS since
            FROM page s
            LEFT JOIN (
                SELECT ledger_id, state, ensemble_size, write_quorum, ack_quorum, under_replication_marked
                FROM ledgers WHERE ledger_id IN (SELECT ledger_id FROM page)
            ) l USING (ledger_id)
            ORDER BY s.ledger_id, s.kind"""
        return self._query(("open_alerts", "bookies", "ledgers"), sql, filters.params)

    def placement(
        self,
        *,
        rack: str | None = None,
        kinds: Sequence[str] | None = None,
        topic: str | None = None,
        namespace: str | None = None,
        by_ledger: bool = False,
        limit: int | None = None,
    ) -> pa.Table:
        """Open placement violations per rack of the ensembles involved; or one row per ledger.

        Per rack: ``rack, not_adhering, soft, bookies`` (ledgers with an open ``PLACEMENT_NOT_ADHERING`` /
        ``PLACEMENT_SOFT`` alert whose ensemble has a bookie in the rack, and how many of the rack's bookies
        they use). Per ledger (``by_ledger``): ``ledger_id, kind, bookies, racks`` (the rack of each bookie,
        in the same order: a rack twice is the problem), ``pulsar_topic, namespace, since, detail`` (the
        failing write sets).

        Example:
            >>> import tempfile
            >>> lakehouse = Lakehouse(write_example_lakehouse(tempfile.mkdtemp()))
            >>> [(r["rack"], r["not_adhering"]) for r in lakehouse.placement().to_pylist()]
            [('/rack-0', 1), ('/rack-1', 1)]
            >>> lakehouse.placement(by_ledger=True).to_pylist()[0]["racks"]
            ['/rack-0', '/rack-0', '/rack-1']
        """
        filters = _Filters()
        filters.add(
            "list_contains($kinds, s.kind)",
            kinds=_choices("placement kind", kinds, PLACEMENT_KINDS) or list(PLACEMENT_KINDS),
        )
        if rack is not None:
            filters.add("list_contains(s.racks, $rack)", rack=rack)
        if topic is not None:
            filters.add("s.pulsar_topic = $topic", topic=topic)
        if namespace is not None:
            filters.add("pulsar_namespace(s.pulsar_topic) = $namespace", namespace=namespace)
        base = f"""
            WITH member AS (
                SELECT x.alert_id, x.bookie, x.position, rack_or_default(b.rack) AS rack
                FROM (
                    SELECT alert_id, unnest(bookies) AS bookie, generate_subscripts(bookies, 1) AS position
                    FROM open_alerts WHERE kind IN ('PLACEMENT_NOT_ADHERING', 'PLACEMENT_SOFT')
                ) x
                LEFT JOIN bookies b ON b.bookie_id = x.bookie
            ),
            racks AS (SELECT alert_id, list(rack ORDER BY position) AS racks FROM member GROUP BY alert_id),
            s AS (SELECT o.*, r.racks FROM open_alerts o JOIN racks r USING (alert_id)),
            selected AS (SELECT * FROM s {filters.where()})
        """
        if by_ledger:
            sql = f"""{base}
                SELECT ledger_id, kind, bookies, racks, pulsar_topic,
                       pulsar_namespace(pulsar_topic) AS namespace, started_at AS since, detail
                FROM selected ORDER BY ledger_id, kind {self._limit_sql(limit, filters)}"""
        else:
            rack_filter = "WHERE m.rack = $rack" if rack is not None else ""
            sql = f"""{base}
                SELECT m.rack,
                       count(DISTINCT s.ledger_id) FILTER (WHERE s.kind = 'PLACEMENT_NOT_ADHERING')
                           AS not_adhering,
                       count(DISTINCT s.ledger_id) FILTER (WHERE s.kind = 'PLACEMENT_SOFT') AS soft,
                       count(DISTINCT m.bookie) AS bookies
                FROM selected s JOIN member m USING (alert_id) {rack_filter}
                GROUP BY m.rack ORDER BY not_adhering DESC, soft DESC, m.rack
                {self._limit_sql(limit, filters)}"""
        return self._query(("open_alerts", "bookies"), sql, filters.params)

    def placement_plans(
        self,
        config: PlacementPolicyConfig,
        *,
        topic: str | None = None,
        namespace: str | None = None,
        by_target: bool = False,
        limit: int | None = None,
    ) -> pa.Table:
        """A BP-54 relocation plan per failing segment of every ledger with an open ``PLACEMENT_NOT_ADHERING``
        alert: the job's ``placement_plans`` table (current as of each ledger fold); where no job has written
        that table yet, computed now from the tables with ``config``
        (:mod:`connectors.delta.placement_plans`).

        Columns: ``ledger_id, segment, first_entry_id, ensemble, moves`` (``position N: from -> to``, ``;``
        between moves), ``bytes_to_move`` (the moves' estimated bytes), ``planned_ensemble, reason`` (why
        there is no plan), ``pulsar_topic, as_of``; ensembles are comma-separated. ``by_target``: one row per
        target bookie instead, the plans' load on it: ``to_bookie, to_rack, moves, ledgers, bytes_to_move``,
        most bytes first.

        Example:
            >>> import tempfile
            >>> from core.domain.rules.evaluate import PlacementPolicyConfig
            >>> lakehouse = Lakehouse(write_example_lakehouse(tempfile.mkdtemp()))
            >>> row = lakehouse.placement_plans(PlacementPolicyConfig()).to_pylist()[0]
            >>> row["ensemble"], row["reason"]  # three bookies in all: nowhere to move a replica
            ('bookie-1,bookie-2,bookie-3', 'no writable bookie outside the ensemble to move a replica to')
            >>> lakehouse.placement_plans(PlacementPolicyConfig(), by_target=True).num_rows
            0
        """
        if self._plans_written():
            self._view("placement_plans")
        else:
            self._con.register("placement_plans", self._computed_plans(config))
        filters = _Filters()
        if topic is not None:
            filters.add("pulsar_topic = $topic", topic=topic)
        if namespace is not None:
            filters.add("pulsar_namespace(pulsar_topic) = $namespace", namespace=namespace)
        moved = self._column_or_null("placement_plans", "bytes_to_move", "BIGINT")  # null in older tables
        if by_target:
            filters.add("to_bookie IS NOT NULL")
            sql = f"""
                SELECT to_bookie, any_value(to_rack) AS to_rack, count(*) AS moves,
                       count(DISTINCT ledger_id) AS ledgers, sum({moved}) AS bytes_to_move
                FROM placement_plans {filters.where()}
                GROUP BY to_bookie ORDER BY bytes_to_move DESC NULLS LAST, to_bookie
                {self._limit_sql(limit, filters)}"""
            return self._query((), sql, filters.params).cast(PLAN_TARGET_SCHEMA)
        sql = f"""
            SELECT ledger_id, segment, any_value(first_entry_id) AS first_entry_id,
                   array_to_string(any_value(ensemble), ',') AS ensemble,
                   string_agg('position ' || position || ': ' || from_bookie || ' -> ' || to_bookie, '; '
                              ORDER BY move) AS moves,
                   sum({moved}) AS bytes_to_move,
                   array_to_string(any_value(planned_ensemble), ',') AS planned_ensemble,
                   any_value(reason) AS reason, any_value(pulsar_topic) AS pulsar_topic,
                   max(as_of) AS as_of
            FROM placement_plans {filters.where()}
            GROUP BY ledger_id, segment ORDER BY ledger_id, segment {self._limit_sql(limit, filters)}"""
        return self._query((), sql, filters.params).cast(PLAN_SCHEMA)

    def _column_or_null(self, view: str, column: str, sql_type: str) -> str:
        """``column`` of ``view`` in SQL, or a typed null when the view lacks it (a table written before a
        newer bkaudit added the column)."""
        present = self._con.sql(f"SELECT * FROM {_identifier(view)} LIMIT 0").columns
        return _identifier(column) if column in present else f"CAST(NULL AS {sql_type})"

    def _plans_written(self) -> bool:
        """Whether a job has written ``placement_plans`` (one it only created is at version 0)."""
        return (
            _is_table(storage.join(self.root, "placement_plans"))
            and self._delta("placement_plans").version() > 0
        )

    def _computed_plans(self, config: PlacementPolicyConfig) -> pa.Table:
        """The ``placement_plans`` rows computed now from ``open_alerts``, ``ledgers``, ``bookies`` and the
        ledger counts in ``ledger_bookies``."""
        ledgers = self._query(
            ("open_alerts", "ledgers"),
            f"""SELECT {", ".join(f"l.{name}" for name in LEDGER_COLUMNS)}
                FROM ledgers l WHERE l.ledger_id IN (
                    SELECT ledger_id FROM open_alerts WHERE kind = 'PLACEMENT_NOT_ADHERING')
                ORDER BY l.ledger_id""",
        ).to_pylist()
        bookies = self._query(("bookies",), f"SELECT {', '.join(BOOKIE_COLUMNS)} FROM bookies").to_pylist()
        alerts = self._query(
            ("open_alerts",),
            f"SELECT {', '.join(ALERT_COLUMNS)} FROM open_alerts WHERE kind = $kind",
            {"kind": UNRESPONSIVE},
        ).to_pylist()
        held = self._query(
            ("ledger_bookies",), "SELECT bookie, count(*) AS n FROM ledger_bookies GROUP BY bookie"
        ).to_pylist()
        counts = {r["bookie"]: int(r["n"]) for r in held}
        return plan_rows(ledgers, bookies, counts, config, alerts)

    # -- ledgers and bookies --------------------------------------------------------------------------------

    def ledgers(
        self,
        *,
        bookie: str | None = None,
        rack: str | None = None,
        topic: str | None = None,
        namespace: str | None = None,
        state: str | None = None,
        placement: str | None = None,
        include_deleted: bool = False,
        limit: int | None = None,
    ) -> pa.Table:
        """Ledgers by id, through the bookie → ledger index when a bookie or rack is given.

        ``bookie``: ledgers whose metadata names it in any segment (a dead bookie's ledgers); ``rack``:
        naming any bookie of the rack. Columns: ``ledger_id, state, ensemble_size, write_quorum, ack_quorum,
        last_entry_id, length, bookies, pulsar_topic, namespace, placement, under_replication_marked,
        deleted, open_alerts`` (kinds open on it), ``created_at, updated_at``.

        Example:
            >>> import tempfile
            >>> lakehouse = Lakehouse(write_example_lakehouse(tempfile.mkdtemp()))
            >>> [(r["ledger_id"], r["open_alerts"]) for r in lakehouse.ledgers(bookie="bookie-2").to_pylist()]
            [(1, ['LEDGER_UNDER_REPLICATED', 'PLACEMENT_NOT_ADHERING']), (3, [])]
        """
        filters = _Filters()
        tables = ["ledgers", "open_alerts"]
        if not include_deleted:
            filters.add("NOT coalesce(l.deleted, false)")
        if bookie is not None:
            filters.add(
                "l.ledger_id IN (SELECT ledger_id FROM ledger_bookies WHERE bookie = $bookie)", bookie=bookie
            )
            tables.append("ledger_bookies")
        if rack is not None:
            filters.add(
                # A bookie the rack map (or the bookies table) does not know is in the default rack.
                "l.ledger_id IN (SELECT i.ledger_id FROM ledger_bookies i "
                "LEFT JOIN bookies b ON b.bookie_id = i.bookie WHERE rack_or_default(b.rack) = $rack)",
                rack=rack,
            )
            tables += ["ledger_bookies", "bookies"]
        if topic is not None:
            filters.add("l.pulsar_topic = $topic", topic=topic)
        if namespace is not None:
            filters.add("pulsar_namespace(l.pulsar_topic) = $namespace", namespace=namespace)
        if state is not None:
            filters.add("l.state = $state", state=_choice("ledger state", state, LEDGER_STATES))
        if placement is not None:
            filters.add("l.placement = $placement", placement=_choice("placement", placement, PLACEMENTS))
        # Two phases: the ids first (reading only the filter columns), then the rows of those ids, so the
        # wide columns of a million-row table are decoded only where they are printed.
        sql = f"""
            WITH ids AS (
                SELECT l.ledger_id FROM ledgers l {filters.where()}
                ORDER BY l.ledger_id {self._limit_sql(limit, filters)}
            ),
            selected AS (
                SELECT l.ledger_id, l.state, l.ensemble_size, l.write_quorum, l.ack_quorum, l.last_entry_id,
                       l.length, l.bookies, l.pulsar_topic, pulsar_namespace(l.pulsar_topic) AS namespace,
                       l.placement, l.under_replication_marked, l.deleted,
                       CAST(epoch_ms(l.ctime_ms) AS TIMESTAMPTZ) AS created_at, l.updated_at
                FROM ledgers l WHERE l.ledger_id IN (SELECT ledger_id FROM ids)
            ),
            alerts AS (
                SELECT ledger_id, list(DISTINCT kind ORDER BY kind) AS open_alerts FROM open_alerts
                WHERE ledger_id IN (SELECT ledger_id FROM ids) GROUP BY ledger_id
            )
            SELECT s.* EXCLUDE (created_at, updated_at), coalesce(a.open_alerts, []) AS open_alerts,
                   s.created_at, s.updated_at
            FROM selected s LEFT JOIN alerts a USING (ledger_id) ORDER BY s.ledger_id"""
        return self._query(dict.fromkeys(tables), sql, filters.params)

    def bookies(
        self, *, status: str | None = None, rack: str | None = None, lost: bool | None = None
    ) -> pa.Table:
        """Every bookie with its membership, rack, ledger count and what is open about it.

        Columns: ``bookie_id, status, lost, missing_since, flaps, rack, rpc_address, has_cookie,
        answers_entry_lists, ledgers``
        (ledgers whose metadata names it), ``at_risk_ledgers`` (open ``LEDGER_*`` alerts naming it as
        lost), ``open_alerts`` (open bookie alert kinds), ``updated_at``. A bookie that ledger metadata
        names but that was never seen registered has status ``UNKNOWN``.

        Example:
            >>> import tempfile
            >>> lakehouse = Lakehouse(write_example_lakehouse(tempfile.mkdtemp()))
            >>> columns = ["bookie_id", "status", "ledgers", "at_risk_ledgers", "open_alerts"]
            >>> [tuple(r.values()) for r in lakehouse.bookies(lost=True).select(columns).to_pylist()]
            [('bookie-1', 'GONE', 2, 2, ['BOOKIE_LOST'])]
        """
        filters = _Filters()
        if status is not None:
            filters.add("status = $status", status=_choice("bookie status", status, BOOKIE_STATUSES))
        if rack is not None:
            filters.add("rack = $rack", rack=rack)
        if lost is not None:
            filters.add("lost = $lost", lost=bool(lost))
        sql = f"""
            WITH named AS (SELECT bookie, count(*) AS ledgers FROM ledger_bookies GROUP BY bookie),
            alerts AS (
                SELECT o.bookie,
                       count(DISTINCT o.ledger_id) FILTER (
                           WHERE o.kind IN ('LEDGER_UNDER_REPLICATED', 'LEDGER_UNRECOVERABLE')) AS at_risk,
                       list(DISTINCT o.kind ORDER BY o.kind) FILTER (WHERE o.ledger_id IS NULL) AS kinds
                FROM (SELECT kind, ledger_id, unnest(bookies) AS bookie FROM open_alerts) o GROUP BY o.bookie
            ),
            every AS (
                SELECT coalesce(b.bookie_id, n.bookie) AS bookie_id, coalesce(b.status, 'UNKNOWN') AS status,
                       coalesce(b.lost, false) AS lost, b.missing_since, coalesce(b.flaps, 0) AS flaps,
                       rack_or_default(b.rack) AS rack, b.rpc_address, b.has_cookie, b.answers_entry_lists,
                       coalesce(n.ledgers, 0) AS ledgers, b.updated_at
                FROM bookies b FULL OUTER JOIN named n ON n.bookie = b.bookie_id
            )
            SELECT e.* EXCLUDE (updated_at), coalesce(a.at_risk, 0) AS at_risk_ledgers,
                   coalesce(a.kinds, []) AS open_alerts, e.updated_at
            FROM every e LEFT JOIN alerts a ON a.bookie = e.bookie_id
            {filters.where()} ORDER BY e.bookie_id"""
        return self._query(("bookies", "ledger_bookies", "open_alerts"), sql, filters.params)

    # -- taking bookies away ---------------------------------------------------------------------------------

    def what_if(self, down: Sequence[str]) -> WhatIf:
        """What happens to every ledger naming one of the ``down`` bookies if they all went away now.

        Bookies already gone (deregistered, or named by ledgers but never registered) count as gone too.
        Each ledger is graded by the lost-bookie rule (:class:`~connectors.delta.removal.WhatIf`); the
        answer is as fresh as the tables. An id that is neither a known bookie nor named by any ledger is
        an :class:`~core.errors.InvalidArgumentError`.

        Example:
            >>> import tempfile
            >>> answer = Lakehouse(write_example_lakehouse(tempfile.mkdtemp())).what_if(["bookie-2"])
            >>> answer.safe, answer.unavailable, answer.by_verdict
            (False, ['bookie-1'], {'UNRECOVERABLE': 1, 'BELOW_ACK_QUORUM': 1, 'UNDER_REPLICATED': 0})
            >>> [(r["ledger_id"], r["verdict"], r["lost_bookies"]) for r in answer.ledgers.to_pylist()]
            [(1, 'UNRECOVERABLE', ['bookie-1', 'bookie-2']), (3, 'BELOW_ACK_QUORUM', ['bookie-2'])]
        """
        from connectors.delta.removal import (
            checked_bookies,
            membership_with,
            unavailable_bookies,
            what_if_answer,
        )

        sql = f"""
            SELECT l.ledger_id, l.pulsar_topic AS topic, {", ".join(f"l.{c}" for c in _RULE_COLUMNS)}
            FROM ledgers l
            WHERE NOT coalesce(l.deleted, false)
              AND l.ledger_id IN (SELECT ledger_id FROM ledger_bookies WHERE list_contains($down, bookie))
            ORDER BY l.ledger_id"""
        rows = self._query(("ledgers", "ledger_bookies"), sql, {"down": sorted(set(down))})
        membership = membership_with(self._query(("bookies",), _MEMBERSHIP_SQL), rows)
        asked = checked_bookies(down, membership, "--down")
        return what_if_answer(asked, unavailable_bookies(membership, asked), rows)

    def drain(self, bookie: str) -> pa.Table:
        """The ledgers whose metadata still names ``bookie``, each with why it has not moved yet.

        Columns: ``ledger_id, reason`` (the most pressing of
        :data:`~connectors.delta.removal.DRAIN_REASONS`), ``reasons`` (all that hold), ``state,
        under_replication_marked, marked_since, pulsar_topic, length, open_alerts, bookies``. An unknown
        bookie id is an :class:`~core.errors.InvalidArgumentError`.

        Example:
            >>> import tempfile
            >>> drained = Lakehouse(write_example_lakehouse(tempfile.mkdtemp())).drain("bookie-1")
            >>> drained.select(["ledger_id", "reason"]).to_pylist()
            [{'ledger_id': 1, 'reason': 'not_marked'}, {'ledger_id': 2, 'reason': 'not_marked'}]
        """
        from connectors.delta.removal import checked_bookies, drain_answer, membership_with

        sql = """
            WITH named AS (SELECT ledger_id FROM ledger_bookies WHERE bookie = $bookie),
            alerts AS (
                SELECT ledger_id, list(DISTINCT kind ORDER BY kind) AS open_alerts FROM open_alerts
                WHERE ledger_id IN (SELECT ledger_id FROM named) GROUP BY ledger_id
            )
            SELECT l.ledger_id, l.state,
                   coalesce(l.under_replication_marked, false) AS under_replication_marked,
                   CAST(epoch_ms(l.under_replication_ctime_ms) AS TIMESTAMPTZ) AS marked_since,
                   l.pulsar_topic, l.length, coalesce(a.open_alerts, []) AS open_alerts, l.bookies
            FROM ledgers l LEFT JOIN alerts a USING (ledger_id)
            WHERE NOT coalesce(l.deleted, false) AND l.ledger_id IN (SELECT ledger_id FROM named)
            ORDER BY l.ledger_id"""
        rows = self._query(("ledgers", "ledger_bookies", "open_alerts"), sql, {"bookie": bookie})
        checked_bookies([bookie], membership_with(self._query(("bookies",), _MEMBERSHIP_SQL), rows), "drain")
        return drain_answer(rows)

    def auditor_diff(self, *, grace_s: float = 300.0, now: datetime | None = None) -> pa.Table:
        """Where BookKeeper's Auditor and bkaudit disagree about what needs re-replication.

        ``at_risk_unmarked``: ledgers with an open ``LEDGER_UNDER_REPLICATED`` or ``LEDGER_UNRECOVERABLE``
        for longer than ``grace_s`` (the alert starts when the bookie is lost, after
        ``lostBookieRecoveryDelay``, as the Auditor's own audit does) and no under-replication mark: nothing
        will repair them. ``marked_healthy``: ledgers with a mark and no open finding of bkaudit (no
        ``LEDGER_*``, ``REPLICAS_*`` or ``PLACEMENT_*`` alert): a false mark (a read timeout in the Auditor's
        ledger check), or a repair bkaudit has not seen the need for. Columns: ``diff, ledger_id, findings``
        (open kinds), ``lost_bookies, since`` (the finding's start), ``marked_since, marked_replicas,
        pulsar_topic``. "Unmarked past the grace" is the job's ``AUDITOR_LAGGING`` test
        (:func:`~core.domain.rules.auditor_lag.unmarked_past_grace`).

        Example:
            >>> import tempfile
            >>> diff = Lakehouse(write_example_lakehouse(tempfile.mkdtemp())).auditor_diff()
            >>> [(r["diff"], r["ledger_id"], r["lost_bookies"]) for r in diff.to_pylist()]
            [('at_risk_unmarked', 1, ['bookie-1']), ('at_risk_unmarked', 2, ['bookie-1'])]
        """
        if grace_s < 0:
            raise InvalidArgumentError(f"--grace must be 0 or more seconds, got {grace_s}")
        now_ms = _utc(now or datetime.now(UTC), "now").timestamp() * 1000
        risk = ", ".join(f"'{kind}'" for kind in LEDGER_RISK_KINDS)
        sql = f"""
            WITH findings AS (
                SELECT ledger_id, list(DISTINCT kind ORDER BY kind) AS findings,
                       list_sort(list_distinct(flatten(list(bookies) FILTER (WHERE kind IN ({risk})))))
                           AS lost_bookies,
                       min(started_at) FILTER (WHERE kind IN ({risk})) AS since
                FROM open_alerts
                WHERE ledger_id IS NOT NULL
                  AND (kind LIKE 'LEDGER\\_%' ESCAPE '\\' OR kind LIKE 'REPLICAS\\_%' ESCAPE '\\'
                       OR kind LIKE 'PLACEMENT\\_%' ESCAPE '\\')
                GROUP BY ledger_id
            ),
            current AS (
                SELECT ledger_id, coalesce(under_replication_marked, false) AS marked,
                       CAST(epoch_ms(under_replication_ctime_ms) AS TIMESTAMPTZ) AS marked_since,
                       under_replication_replicas AS marked_replicas, pulsar_topic
                FROM ledgers WHERE NOT coalesce(deleted, false)
            )
            SELECT CASE WHEN c.marked THEN 'marked_healthy' ELSE 'at_risk_unmarked' END AS diff,
                   c.ledger_id, coalesce(f.findings, []) AS findings,
                   coalesce(f.lost_bookies, []) AS lost_bookies, f.since, c.marked_since, c.marked_replicas,
                   c.pulsar_topic, c.marked, epoch_ms(f.since) AS since_ms
            FROM current c LEFT JOIN findings f USING (ledger_id)
            WHERE (NOT c.marked AND f.since IS NOT NULL) OR (c.marked AND f.ledger_id IS NULL)
            ORDER BY diff, c.ledger_id"""
        rows = self._query(("ledgers", "open_alerts"), sql)
        since_ms = rows.column("since_ms").to_numpy().astype("float64")  # null (not at risk): NaN
        marked = rows.column("marked").to_numpy().astype(bool)
        lagging = unmarked_past_grace(since_ms, marked, now_ms, grace_s * 1000)
        return rows.filter(pa.array(marked | lagging)).drop_columns(["marked", "since_ms"])

    # -- history --------------------------------------------------------------------------------------------

    def violations(
        self,
        *,
        kinds: Sequence[str] | None = None,
        state: str | None = None,
        ledger_id: int | None = None,
        bookie: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        group_by: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> pa.Table:
        """Alert transitions (the ``violations`` history) in time order; or counts per ``group_by`` key.

        Columns: ``detected_at, kind, state, severity, entity, ledger_id, bookies, pulsar_topic, alert_id,
        detail``; grouped by any of kind, state, severity, bookie, rack, namespace, day: the keys,
        ``transitions``, ``alerts`` (distinct conditions), ``first, last``. ``since``/``until`` bound
        ``detected_at`` (inclusive, exclusive).

        Example:
            >>> import tempfile
            >>> lakehouse = Lakehouse(write_example_lakehouse(tempfile.mkdtemp()))
            >>> [(r["kind"], r["state"]) for r in lakehouse.violations(ledger_id=1).to_pylist()]
            [('PLACEMENT_NOT_ADHERING', 'firing'), ('LEDGER_UNDER_REPLICATED', 'firing')]
            >>> lakehouse.violations(group_by=["kind"]).column("kind").to_pylist()[0]
            'LEDGER_UNDER_REPLICATED'
        """
        keys = _choices(
            "group-by key", group_by, ("kind", "state", "severity", "bookie", "rack", "namespace", "day")
        )
        filters = _Filters()
        kinds_checked = _choices("alert kind", kinds, ALERT_KINDS)
        if kinds_checked:
            filters.add("list_contains($kinds, v.kind)", kinds=kinds_checked)
        if state is not None:
            filters.add("v.state = $state", state=_choice("alert state", state, ALERT_STATES))
        if ledger_id is not None:
            filters.add("v.ledger_id = $ledger_id", ledger_id=_ledger_id(ledger_id))
        if bookie is not None:
            filters.add("list_contains(v.bookies, $bookie)", bookie=bookie)
        if since is not None:
            filters.add("v.detected_at >= $since", since=_utc(since, "since"))
        if until is not None:
            filters.add("v.detected_at < $until", until=_utc(until, "until"))
        if not keys:
            # Bookie alerts have no ledger id: name them by their bookie, as open_alerts' entity does (the
            # cluster-level kinds name their entity: the rack map, AutoRecovery, the Auditor).
            sql = f"""
                SELECT v.detected_at, v.kind, v.state, v.severity,
                       CASE {_CLUSTER_ENTITY_CASES}
                            WHEN v.ledger_id IS NULL THEN 'bookie/' || v.bookies[1]
                            ELSE 'ledger/' || v.ledger_id END AS entity,
                       v.ledger_id, v.bookies, v.pulsar_topic, v.alert_id, v.detail
                FROM violations v {filters.where()}
                ORDER BY v.detected_at, v.kind, v.ledger_id, v.alert_id {self._limit_sql(limit, filters)}"""
            return self._query(("violations",), sql, filters.params)
        expand = "bookie" in keys or "rack" in keys
        columns = {
            "kind": "v.kind",
            "state": "v.state",
            "severity": "v.severity",
            "bookie": "v.member",
            "rack": "rack_or_default(b.rack)",
            "namespace": "pulsar_namespace(v.pulsar_topic)",
            "day": "CAST(v.detected_at AS DATE)",
        }
        source = "violations v"
        if expand:
            source = (
                "(SELECT *, unnest(bookies) AS member FROM violations) v "
                "LEFT JOIN bookies b ON b.bookie_id = v.member"
            )
        select = ", ".join(f"{columns[k]} AS {k}" for k in keys)
        sql = f"""
            SELECT {select}, count(DISTINCT (v.alert_id, v.state, v.detected_at)) AS transitions,
                   count(DISTINCT v.alert_id) AS alerts,
                   min(v.detected_at) AS first, max(v.detected_at) AS last
            FROM {source} {filters.where()}
            GROUP BY ALL ORDER BY alerts DESC, {", ".join(keys)} {self._limit_sql(limit, filters)}"""
        return self._query(("violations", "bookies") if expand else ("violations",), sql, filters.params)

    def open_alerts_over_time(self, *, kinds: Sequence[str] | None = LEDGER_RISK_KINDS) -> pa.Table:
        """How many alerts of each kind were open after each transition, from the ``violations`` history.

        Columns: ``detected_at, kind, open_alerts`` (a step function: the value holds until the next row
        of the kind). Counts start from the first recorded transition, so they are exact when the history is
        complete (the job appends every transition).

        Example:
            >>> import tempfile
            >>> lakehouse = Lakehouse(write_example_lakehouse(tempfile.mkdtemp()))
            >>> lakehouse.open_alerts_over_time().column("open_alerts").to_pylist()
            [2]
        """
        filters = _Filters()
        if kinds is not None:
            filters.add("list_contains($kinds, kind)", kinds=_choices("alert kind", kinds, ALERT_KINDS))
        sql = f"""
            WITH steps AS (
                SELECT detected_at, kind, sum(CASE state WHEN 'firing' THEN 1 ELSE -1 END) AS delta
                FROM violations {filters.where()} GROUP BY ALL
            )
            SELECT detected_at, kind,
                   CAST(sum(delta) OVER (PARTITION BY kind ORDER BY detected_at ROWS UNBOUNDED PRECEDING)
                        AS BIGINT) AS open_alerts
            FROM steps ORDER BY detected_at, kind"""
        return self._query(("violations",), sql, filters.params)

    def ledger_history(self, ledger_id: int) -> pa.Table:
        """What happened to one ledger, in time order: its metadata changes and its alert transitions.

        From the ``ledgers`` change data feed (``source`` ``ledgers``, ``table_version``, ``event``
        ``created`` / ``changed`` / ``deleted``, ``change`` listing the columns that changed, old → new) and
        from ``violations`` (``event`` ``firing`` / ``resolved``, ``kind``, ``change`` with the bookies and
        the detail). ``at`` is event time; ``committed_at`` the wall-clock time of the Delta commit. When old
        versions were vacuumed, a ``note`` row says from which version on the metadata history is complete
        and the first row read is ``as_of`` that version. Raises :class:`~core.errors.NotFoundError` for a
        ledger the lakehouse has never seen.

        Example:
            >>> import tempfile
            >>> lakehouse = Lakehouse(write_example_lakehouse(tempfile.mkdtemp()))
            >>> for row in lakehouse.ledger_history(1).to_pylist():
            ...     print(row["event"], row["kind"])
            created None
            changed None
            firing PLACEMENT_NOT_ADHERING
            firing LEDGER_UNDER_REPLICATED
            >>> lakehouse.ledger_history(1).column("change").to_pylist()[1]
            'placement: MEETS_STRICT → FAIL'
        """
        ledger_id = _ledger_id(ledger_id)
        rows: list[dict[str, Any]] = []
        with self._reading():
            changes, complete_from = self._ledger_changes(ledger_id)
        if complete_from is not None:
            rows.append(
                {
                    "at": None,
                    "source": "ledgers",
                    "table_version": complete_from,
                    "event": "note",
                    "kind": None,
                    "change": f"versions before {complete_from} were vacuumed: earlier changes are not shown",
                    "committed_at": None,
                }
            )
        previous: dict[str, Any] | None = None
        for change in changes:
            committed_at = change["_commit_timestamp"]
            # Event time when the change carries a new one; a re-evaluation (placement after a rack move)
            # keeps the row's old updated_at, so its commit time says when it happened.
            moved_on = previous is None or change["updated_at"] != previous["updated_at"]
            at = (change["updated_at"] if moved_on else None) or committed_at
            if change["_change_type"] == "delete":
                event, text = "deleted", "row removed from the table"
            elif previous is None:  # the first version read: an insert, or where a vacuum cut the history
                event = "created" if change["_change_type"] == "insert" else "as_of"
                text = _describe(change)
            else:
                diffs = [
                    f"{column}: {_show(previous.get(column))} → {_show(change.get(column))}"
                    for column in _TRACKED
                    if previous.get(column) != change.get(column)
                ]
                if not diffs:
                    continue  # rewritten without a change the history reports
                event, text = ("deleted" if change.get("deleted") else "changed"), "; ".join(diffs)
            rows.append(
                {
                    "at": at,
                    "source": "ledgers",
                    "table_version": change["_commit_version"],
                    "event": event,
                    "kind": None,
                    "change": text,
                    "committed_at": committed_at,
                }
            )
            previous = change
        transitions = _rows(
            self._query(
                ("violations",),
                "SELECT detected_at, kind, state, bookies, detail FROM violations "
                "WHERE ledger_id = $ledger_id ORDER BY detected_at, kind",
                {"ledger_id": ledger_id},
            )
        )
        for transition in transitions:
            rows.append(
                {
                    "at": transition["detected_at"],
                    "source": "violations",
                    "table_version": None,
                    "event": transition["state"],
                    "kind": transition["kind"],
                    "change": f"bookies {_show(transition['bookies'])}; detail {transition['detail'] or {}}",
                    "committed_at": None,
                }
            )
        rows.extend(self._offloads(ledger_id))
        if not changes and not transitions:
            current = self._query(
                ("ledgers",),
                "SELECT ledger_id FROM ledgers WHERE ledger_id = $ledger_id",
                {"ledger_id": ledger_id},
            )
            if current.num_rows == 0:
                raise NotFoundError(f"ledger {ledger_id} is not in the lakehouse at {self.root}")
        # At one instant: what the ledger became, then the alerts it caused (an alert that ends before the
        # next one of its ledger starts).
        order = {
            "note": 0,
            "created": 1,
            "as_of": 1,
            "changed": 2,
            "offloaded": 3,
            "deleted": 3,
            "resolved": 4,
            "firing": 5,
        }
        rows.sort(
            key=lambda r: (
                r["at"] or datetime.min,
                order[r["event"]],
                r["table_version"] or 0,
                r["kind"] or "",
            )
        )
        return self._table_of_rows(rows, HISTORY_SCHEMA)

    def _offloads(self, ledger_id: int) -> list[dict[str, Any]]:
        """History rows of a ledger a Pulsar topic offloaded to tiered storage (``topics`` table): its
        deletion from BookKeeper is then by design, not a loss."""
        if not _is_table(storage.join(self.root, "topics")):
            return []
        found = _rows(
            self._query(
                ("topics",),
                "SELECT topic, updated_at, list_contains(bookkeeper_deleted_ids, $ledger_id) AS gone "
                "FROM topics WHERE list_contains(offloaded_ids, $ledger_id)",
                {"ledger_id": ledger_id},
            )
        )
        return [
            {
                "at": row["updated_at"],
                "source": "topics",
                "table_version": None,
                "event": "offloaded",
                "kind": None,
                "change": f"offloaded by {row['topic']} (tiered storage)"
                + ("; its BookKeeper copy deleted by design" if row["gone"] else ""),
                "committed_at": None,
            }
            for row in found
        ]

    def topic(self, topic: str) -> pa.Table:
        """One Pulsar topic's ledgers (its own, then each cursor's) with what BookKeeper has of each:
        ``MISSING``, ``ok``, ``offloaded`` (tiered storage, BookKeeper's copy deleted by design) or
        ``offloaded, still in BookKeeper`` (:func:`core.domain.managed_ledger.topic_ledger_rows`, the rule of
        ``bkaudit pulsar topic``), from the ``topics`` and ``ledgers`` tables. ``topic`` is
        ``persistent://tenant/namespace/topic`` or the managed ledger's name. Raises
        :class:`~core.errors.NotFoundError` for a topic the lakehouse does not hold.
        """
        from core.domain.managed_ledger import (
            ManagedCursorInfo,
            ManagedLedgerInfo,
            TopicLedger,
            topic_ledger_rows,
        )

        found = _rows(
            self._query(
                ("topics",),
                "SELECT * FROM topics WHERE (topic = $name OR managed_ledger = $name) "
                "AND NOT coalesce(deleted, false)",
                {"name": topic},
            )
        )
        if not found:
            raise NotFoundError(f"topic {topic!r} is not in the topics table at {self.root}")
        row = found[0]
        offloaded, deleted = set(row["offloaded_ids"] or ()), set(row["bookkeeper_deleted_ids"] or ())
        info = ManagedLedgerInfo(
            tuple(
                TopicLedger(i, offloaded=i in offloaded, bookkeeper_deleted=i in deleted)
                for i in row["ledger_ids"] or ()
            )
        )
        cursors = {c["name"]: ManagedCursorInfo(c["ledger_id"]) for c in row["cursors"] or ()}
        wanted = sorted(
            {
                *(row["ledger_ids"] or ()),
                *(c.cursor_ledger_id for c in cursors.values() if c.cursor_ledger_id is not None),
            }
        )
        live = (
            _rows(
                self._query(
                    ("ledgers",),
                    "SELECT ledger_id, state, length FROM ledgers WHERE ledger_id IN (SELECT unnest($ids)) "
                    "AND NOT coalesce(deleted, false)",
                    {"ids": wanted},
                )
            )
            if wanted
            else []
        )
        by_id = {r["ledger_id"]: r for r in live}
        rows = topic_ledger_rows(info, cursors, {i: True for i in by_id})
        for entry in rows:
            ledger = by_id.get(entry["ledger_id"]) or {}
            entry.update(
                topic=row["topic"],
                managed_ledger=row["managed_ledger"],
                ledger_state=ledger.get("state"),
                length=ledger.get("length"),
            )
        return pa.Table.from_pylist(rows, schema=TOPIC_LEDGERS_SCHEMA)

    def orphans(self) -> pa.Table:
        """The open ``LEDGER_ORPHANED`` alerts, largest first: ledgers whose topic no longer lists them,
        with their size and since when the alert is open.

        Example:
            >>> import tempfile
            >>> Lakehouse(write_example_lakehouse(tempfile.mkdtemp())).orphans().num_rows
            0
        """
        return self._query(
            ("open_alerts",),
            "SELECT ledger_id, pulsar_topic, CAST(json_extract(detail, '$.size') AS BIGINT) AS size, "
            "CAST(json_extract(detail, '$.managed_ledger_exists') AS BOOLEAN) AS managed_ledger_exists, "
            "detected_at FROM open_alerts WHERE kind = 'LEDGER_ORPHANED' "
            "ORDER BY size DESC NULLS LAST, ledger_id",
        )

    def _ledger_changes(self, ledger_id: int) -> tuple[list[dict[str, Any]], int | None]:
        """The ledger's versions, oldest first: the ``ledgers`` change data feed written before the job
        appended changes (its commits per batch; the fold's commits repeat ``ledger_changes``), then every
        row ``ledger_changes`` holds for it; and the first complete version of ``ledgers`` when earlier ones
        can no longer be read (vacuumed files)."""
        table = self._delta("ledgers")
        # An int checked by _ledger_id: no text of the caller's. No partition pruning: the bucket count
        # of older commits may differ from today's (stream.ledger_table_buckets).
        predicate = f"ledger_id = {ledger_id}"
        folds = {int(c["version"]) for c in table.history() if FOLD_METADATA_KEY in c}
        rows, complete_from = _feed(table, predicate)
        rows = [r for r in rows if r["_commit_version"] not in folds]
        if _is_table(storage.join(self.root, "ledger_changes")):
            appended, _ = _feed(self._delta("ledger_changes"), f"ledger_id = {ledger_id}")
            rows += appended
        return rows, complete_from


def _feed(table: DeltaTable, predicate: str) -> tuple[list[dict[str, Any]], int | None]:
    """A table's change data feed rows matching ``predicate`` (inserts, post-images, deletes) in commit
    order, and the first version it could read from when earlier files were vacuumed (None: all)."""

    def read(start: int) -> pa.Table:
        reader = table.load_cdf(starting_version=start, predicate=predicate, columns=list(_CDF_COLUMNS))
        return pa.RecordBatchReader.from_stream(reader).read_all()

    complete_from: int | None = None
    try:
        changes = read(0)
    except (DeltaError, pa.ArrowException, OSError):
        # Files of old versions are gone (vacuum) or the feed was off then: find the first version from
        # which the feed reads (a vacuum removes a prefix of the history, so readability is monotonic).
        low, high, found = 1, table.version(), None
        while low <= high:
            middle = (low + high) // 2
            try:
                found = (middle, read(middle))
                high = middle - 1
            except (DeltaError, pa.ArrowException, OSError):
                low = middle + 1
        if found is None:
            return [], table.version() + 1
        complete_from, changes = found
    # One ledger's rows: few, so plain Python (delta-rs gives string views, not every kernel takes them).
    rows = [r for r in _rows(changes) if r["_change_type"] in ("insert", "update_postimage", "delete")]
    rows.sort(key=lambda r: (r["_commit_version"], r["_change_type"] != "delete"))
    return rows, complete_from


def naive_utc(table: pa.Table) -> pa.Table:
    """``table`` with its zoned timestamp columns as naive ones in UTC.

    Zoned Arrow timestamps become Python objects only through pandas (pyarrow imports it, up to a second of
    a CLI call); naive ones do not. Arrow stores every timestamp as UTC, so this is a zero-copy view.

    Example:
        >>> naive_utc(pa.table({"t": pa.array([0], pa.timestamp("ms", tz="UTC"))})).schema.field("t").type
        TimestampType(timestamp[ms])
    """
    return _with_zone(table, None)


def _with_zone(table: pa.Table, zone: str | None) -> pa.Table:
    # Array.view, not cast: same buffers, and pyarrow.compute (~0.15 s to import) is not needed.
    for index, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type) and field.type.tz != zone:
            kind = pa.timestamp(field.type.unit, tz=zone)
            column = pa.chunked_array([chunk.view(kind) for chunk in table.column(index).chunks], type=kind)
            table = table.set_column(
                index, pa.field(field.name, kind, field.nullable, field.metadata), column
            )
    return table


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return naive_utc(table).to_pylist()


def _utc(value: datetime | date, what: str) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    raise InvalidArgumentError(f"{what} must be a datetime, got {value!r}")


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        if value and isinstance(value[0], dict) and "ensemble" in value[0]:
            return " | ".join(f"{s['first_entry_id']}: {','.join(s['ensemble'])}" for s in value)
        return "[" + ",".join(str(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _describe(row: Mapping[str, Any]) -> str:
    parts = [
        f"state {_show(row.get('state'))}",
        "E/WQ/AQ " + "/".join(_show(row.get(c)) for c in ("ensemble_size", "write_quorum", "ack_quorum")),
        f"segments {_show(row.get('segments'))}",
        f"placement {_show(row.get('placement'))}",
    ]
    if row.get("pulsar_topic"):
        parts.append(f"topic {row['pulsar_topic']}")
    if row.get("undecodable_reason"):
        parts.append(f"undecodable: {row['undecodable_reason']}")
    if row.get("deleted"):
        parts.append("deleted")
    return "; ".join(parts)


def write_example_lakehouse(root: str | Path) -> Path:
    """Write a tiny lakehouse for the examples: bookie-1 lost (ledgers 1 and 2), ledger 1 also badly placed.

    Three bookies in two racks; ledgers 1 (bookie-1, bookie-2, bookie-3) and 2 (bookie-1, bookie-3), 3
    (bookie-2, bookie-3); ``persistent://public/default/orders``. Written through the real table code.

    Example:
        >>> import tempfile
        >>> sorted(p.name for p in write_example_lakehouse(tempfile.mkdtemp()).iterdir() if p.is_dir())[:2]
        ['bookies', 'dead_letters']
    """
    from connectors.delta.tables import BatchWriter, ensure_tables, index_rows_of_versions

    root = Path(root)
    ensure_tables(root)
    t0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    topic = "persistent://public/default/orders"
    ensembles = {
        1: ["bookie-1", "bookie-2", "bookie-3"],
        2: ["bookie-1", "bookie-3"],
        3: ["bookie-2", "bookie-3"],
    }

    def ledger(ledger_id: int, placement: str, minutes: int) -> dict[str, Any]:
        bookies = ensembles[ledger_id]
        return {
            "ledger_id": ledger_id,
            "ledger_bucket": ledger_id % LEDGER_BUCKETS,
            "cluster": "example",
            "state": "CLOSED",
            "ensemble_size": len(bookies),
            "write_quorum": 2,
            "ack_quorum": 2,
            "last_entry_id": 9,
            "length": 100,
            "segments": [{"first_entry_id": 0, "ensemble": bookies}],
            "bookies": sorted(bookies),
            "ctime_ms": int(t0.timestamp() * 1000),
            "pulsar_topic": topic,
            "has_password": True,
            "mzxid": ledger_id,  # the version the index rows are derived from
            "placement": placement,
            "deleted": False,
            "updated_at": t0.replace(minute=minutes),
        }

    def alert(
        kind: str, entity: str, bookies: list[str], minutes: int, ledger_id: int | None = None
    ) -> dict[str, Any]:
        at = t0.replace(minute=minutes)
        return {
            "alert_id": f"{kind}-{entity}",
            "cluster": "example",
            "kind": kind,
            "state": "firing",
            "entity": entity,
            "severity": "warning",
            "ledger_id": ledger_id,
            "bookies": bookies,
            "pulsar_topic": topic if ledger_id is not None else None,
            "started_at": at,
            "detected_at": at,
            "detected_date": at.date(),
            "detail": json.dumps(detail_of(kind, bookies, at)),
        }

    def detail_of(kind: str, bookies: list[str], at: datetime) -> dict[str, Any]:
        if kind.startswith("LEDGER"):
            return {"lost_bookies": bookies}
        if kind == "BOOKIE_LOST":  # as the job writes it: epoch milliseconds (the alert stream's format)
            return {"missing_since": int(at.timestamp() * 1000) - 60_000}
        return {}

    ledgers = [ledger(1, "MEETS_STRICT", 0), ledger(2, "MEETS_STRICT", 0), ledger(3, "MEETS_STRICT", 0)]
    ledger_rows = pa.Table.from_pylist(ledgers, schema=TABLES["ledgers"].schema)
    BatchWriter(root, "example", 0).upsert("ledgers", ledger_rows)
    BatchWriter(root, "example", 0).append("ledger_bookies", index_rows_of_versions(ledger_rows))
    bookies = [
        {"bookie_id": "bookie-1", "status": "GONE", "lost": True, "rack": "/rack-0", "flaps": 0},
        {"bookie_id": "bookie-2", "status": "WRITABLE", "lost": False, "rack": "/rack-0", "flaps": 1},
        {"bookie_id": "bookie-3", "status": "WRITABLE", "lost": False, "rack": "/rack-1", "flaps": 0},
    ]
    BatchWriter(root, "example", 0).upsert(
        "bookies", pa.Table.from_pylist(bookies, schema=TABLES["bookies"].schema)
    )
    # bookie-2 moved into /rack-0 at 12:05 (ledger 1 loses rack diversity), bookie-1 lost at 12:10.
    BatchWriter(root, "example", 1).upsert(
        "ledgers", pa.Table.from_pylist([ledger(1, "FAIL", 5)], schema=TABLES["ledgers"].schema)
    )
    alerts = [
        alert("PLACEMENT_NOT_ADHERING", "ledger/1", ensembles[1], 5, 1),
        alert("BOOKIE_LOST", "bookie/bookie-1", ["bookie-1"], 10),
        alert("LEDGER_UNDER_REPLICATED", "ledger/1", ["bookie-1"], 10, 1),
        alert("LEDGER_UNDER_REPLICATED", "ledger/2", ["bookie-1"], 10, 2),
    ]
    BatchWriter(root, "example", 1).append(
        "violations", pa.Table.from_pylist(alerts, schema=TABLES["violations"].schema)
    )
    BatchWriter(root, "example", 1).append(
        "open_alerts", pa.Table.from_pylist(alerts, schema=TABLES["open_alerts"].schema)
    )
    return root


#: :meth:`Lakehouse.placement_plans`' columns.
PLAN_SCHEMA = pa.schema(
    [
        ("ledger_id", pa.int64()),
        ("segment", pa.int32()),
        ("first_entry_id", pa.int64()),
        ("ensemble", pa.string()),
        ("moves", pa.string()),
        ("bytes_to_move", pa.int64()),
        ("planned_ensemble", pa.string()),
        ("reason", pa.string()),
        ("pulsar_topic", pa.string()),
        ("as_of", pa.timestamp("us", tz="UTC")),
    ]
)

#: :meth:`Lakehouse.placement_plans`' columns per target bookie (``by_target``).
PLAN_TARGET_SCHEMA = pa.schema(
    [
        ("to_bookie", pa.string()),
        ("to_rack", pa.string()),
        ("moves", pa.int64()),
        ("ledgers", pa.int64()),
        ("bytes_to_move", pa.int64()),
    ]
)
