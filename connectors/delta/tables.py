"""The auditor's Delta tables: definitions, creation, and replay-safe writes per streaming micro-batch.

Tables (under the lakehouse root, change data feed on, every column commented):

- ``ledgers``: current state, one row per ledger (deleted ledgers flagged), partitioned by
  ``ledger_bucket``: the fold of ``ledger_changes`` (:mod:`connectors.delta.ledger_log`).
- ``ledger_changes``: append-only, the ledger rows each micro-batch changed.
- ``ledger_bookies``: the bookie → ledger index, partitioned by ``bookie`` so one bookie's ledgers are read
  from its partition only; appended per version, rows of older versions removed later.
- ``bookies``: current membership, one row per bookie.
- ``open_alerts``: the conditions currently firing, one row per alert.
- ``violations``: append-only history of every alert transition, partitioned by ``detected_date``.
- ``dead_letters``: every input that could not be processed, with the reason, partitioned by
  ``received_date``.
- ``placement_plans``: a BP-54 relocation plan for every badly placed segment of a ledger with an open
  ``PLACEMENT_NOT_ADHERING`` alert, one row per move, rewritten whole when its inputs change
  (:mod:`connectors.delta.placement_plans`).

Every write of a micro-batch carries an app transaction ``(app_id, batch_id)`` and the commit metadata
``bkaudit.batch_id``. :class:`BatchWriter` skips a table that already has the batch (a replay), and
:func:`table_before_batch` reads a table as it was before a batch, so decisions on a replay see the same state
as the first attempt. See docs/design.md, "The commit protocol: why a replayed batch changes nothing".

Example:
    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> ensure_tables(root)  # doctest: +NORMALIZE_WHITESPACE
    ['bookies', 'dead_letters', 'ledger_bookies', 'ledger_changes', 'ledgers', 'open_alerts',
     'placement_plans', 'snapshot_seen', 'topics', 'violations']
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Field, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

from connectors import storage
from connectors.delta.health import record_tables, recorded_tables
from connectors.delta.scan import scan

logger = logging.getLogger(__name__)

BATCH_METADATA_KEY = "bkaudit.batch_id"
APP_METADATA_KEY = "bkaudit.app_id"
#: Commit metadata of a fold of ``ledger_changes`` into ``ledgers``: the last batch every bucket holds (a
#: reader applies the changes after it).
FOLD_METADATA_KEY = "bkaudit.fold_through"
#: ... the newest batch any bucket holds (a fold in rotation folds some buckets ahead of the others).
FOLD_REACHED_KEY = "bkaudit.fold_reached"
#: ... the bucket count the table was written with.
FOLD_BUCKETS_KEY = "bkaudit.ledger_buckets"
_NO_VERSION = -1
#: The default partition count of ``ledgers`` (``stream.ledger_table_buckets``): 256 wrote and read 1 M
#: rows as fast as 16 and in files as large in all, 1024 took twice the CPU (docs/journal.md, "Folds in
#: rotation").
LEDGER_BUCKETS = 256


def _f(name: str, kind: pa.DataType, comment: str, nullable: bool = True) -> pa.Field:
    return pa.field(name, kind, nullable=nullable, metadata={"comment": comment})


_TS = pa.timestamp("us", tz="UTC")
_SEGMENT = pa.struct([("first_entry_id", pa.int64()), ("ensemble", pa.list_(pa.string()))])
_CUSTOM = pa.struct([("key", pa.string()), ("value", pa.binary())])


@dataclass(frozen=True)
class TableSpec:
    """One table: its schema (with column comments), partitioning, key and description."""

    name: str
    schema: pa.Schema
    description: str
    key: tuple[str, ...] = ()
    partition_by: tuple[str, ...] = ()
    z_order: tuple[str, ...] = field(default=())


LEDGERS = TableSpec(
    "ledgers",
    pa.schema(
        [
            _f("ledger_id", pa.int64(), "BookKeeper ledger id", nullable=False),
            _f(
                "ledger_bucket",
                pa.int32(),
                "ledger_id % stream.ledger_table_buckets (256): the partition column",
            ),
            _f("cluster", pa.string(), "the cluster's INSTANCEID"),
            _f("state", pa.string(), "OPEN, IN_RECOVERY or CLOSED; null when the znode is undecodable"),
            _f("format_version", pa.int32(), "metadata format version of the znode (1, 2 or 3)"),
            _f("ensemble_size", pa.int32(), "E"),
            _f("write_quorum", pa.int32(), "WQ"),
            _f("ack_quorum", pa.int32(), "AQ"),
            _f("last_entry_id", pa.int64(), "last entry id of a closed ledger, -1 otherwise"),
            _f("length", pa.int64(), "bytes of a closed ledger, 0 otherwise"),
            _f("digest_type", pa.string(), "CRC32, HMAC, CRC32C, DUMMY or null"),
            _f("segments", pa.list_(_SEGMENT), "ensembles in first-entry order"),
            _f("bookies", pa.list_(pa.string()), "every bookie named in any segment, sorted"),
            _f("ctime_ms", pa.int64(), "creation time: the stored ctime, else the znode's ctime"),
            _f("pulsar_topic", pa.string(), "Pulsar topic from the pulsar/managed-ledger custom metadata"),
            _f("custom_metadata", pa.list_(_CUSTOM), "custom metadata in znode order"),
            _f("has_password", pa.bool_(), "whether the ledger has a password (never the password itself)"),
            _f("znode_version", pa.int32(), "ZooKeeper data version of the metadata znode"),
            _f("mzxid", pa.int64(), "zxid of the last change of the znode (orders updates)"),
            _f("znode_ctime_ms", pa.int64(), "znode creation time"),
            _f("znode_mtime_ms", pa.int64(), "znode modification time"),
            _f("undecodable_reason", pa.string(), "why the znode could not be decoded, else null"),
            _f(
                "placement",
                pa.string(),
                "FAIL, MEETS_SOFT, MEETS_STRICT for closed ledgers, else null "
                "(null too while the rack map is invalid: unknown)",
            ),
            _f("under_replication_marked", pa.bool_(), "an urL mark exists in ZooKeeper"),
            _f("under_replication_replicas", pa.list_(pa.string()), "replicas named by the urL mark"),
            _f("under_replication_ctime_ms", pa.int64(), "ctime stored in the urL mark"),
            _f("deleted", pa.bool_(), "the ledger znode is gone"),
            _f("updated_at", _TS, "event time of the last change applied"),
        ]
    ),
    "Current state of every ledger (one row per ledger; deleted ledgers flagged).",
    key=("ledger_id",),
    partition_by=("ledger_bucket",),
    z_order=("ledger_id",),
)

#: The ``ledgers`` columns copied into every ``ledger_bookies`` row: what the lost-bookie rule reads, so a
#: loss reads only the lost bookie's partition (a read of the ``ledgers`` table would scan every ledger).
INDEX_LEDGER_COLUMNS = (
    "state",
    "format_version",
    "ensemble_size",
    "write_quorum",
    "ack_quorum",
    "last_entry_id",
    "length",
    "segments",
    "pulsar_topic",
)


def _copied_from_ledgers(name: str) -> pa.Field:
    original = LEDGERS.schema.field(name)
    comment = (original.metadata or {}).get(b"comment", b"").decode()
    return _f(name, original.type, f"copy of ledgers.{name}: {comment}")


LEDGER_BOOKIES = TableSpec(
    "ledger_bookies",
    pa.schema(
        [
            _f(
                "bookie", pa.string(), "a bookie named by the ledger's metadata (any segment)", nullable=False
            ),
            _f("ledger_id", pa.int64(), "the ledger", nullable=False),
            _f("mzxid", pa.int64(), "metadata version the row was derived from"),
            *(_copied_from_ledgers(name) for name in INDEX_LEDGER_COLUMNS),
        ]
    ),
    "Index from bookie to the ledgers whose metadata names it (deleted ledgers removed), with the ledger "
    "columns a lost bookie's evaluation reads (null in rows written before they were added).",
    key=("ledger_id",),
    partition_by=("bookie",),
)

LEDGER_CHANGES = TableSpec(
    "ledger_changes",
    pa.schema(
        [
            *LEDGERS.schema,
            _f("batch_id", pa.int64(), "streaming micro-batch that changed the ledger", nullable=False),
        ]
    ),
    "Append-only: the ledgers each micro-batch changed, one row per ledger with its whole new state (folded "
    "into ledgers periodically; the ledgers' history).",
)

BOOKIES = TableSpec(
    "bookies",
    pa.schema(
        [
            _f("bookie_id", pa.string(), "BookKeeper bookie id", nullable=False),
            _f("cluster", pa.string(), "the cluster's INSTANCEID"),
            _f("status", pa.string(), "WRITABLE, READ_ONLY or GONE"),
            _f("lost", pa.bool_(), "missing past lostBookieRecoveryDelay (or together with others)"),
            _f("missing_since", _TS, "when it disappeared from available/ and available/readonly/"),
            _f("flaps", pa.int32(), "times it came back before it was declared lost"),
            _f("rack", pa.string(), "network location from the rack map, null = default"),
            _f(
                "rack_group",
                pa.string(),
                "affinity group from Pulsar's rack map (the top-level key of /bookies); null = none",
            ),
            _f("host", pa.string(), "bookie-rpc host from the registration"),
            _f("port", pa.int32(), "bookie-rpc port from the registration"),
            _f("rpc_address", pa.string(), "host:port the probes use (first bookie-rpc endpoint)"),
            _f("has_cookie", pa.bool_(), "a cookie exists under cookies/"),
            _f(
                "cookie_changed_at",
                _TS,
                "event time its cookie was last replaced (formatted again under the same id; its ledgers "
                "were probed then); null: never since the job first saw it",
            ),
            _f(
                "answers_entry_lists",
                pa.bool_(),
                "answers GET_LIST_OF_ENTRIES_OF_LEDGER (false: DbLedgerStorage, probed with entry reads; "
                "null: not probed yet)",
            ),
            _f("updated_at", _TS, "event time of the last change applied"),
        ]
    ),
    "Current membership of every known bookie.",
    key=("bookie_id",),
)

# Columns an alert row has in both alert tables (one definition: the two tables must agree).
_ALERT = {
    field.name: field
    for field in (
        _f("alert_id", pa.string(), "stable id of the condition", nullable=False),
        _f("cluster", pa.string(), "the cluster's INSTANCEID"),
        _f("kind", pa.string(), "alert kind (interfaces §2)"),
        _f("severity", pa.string(), "critical, warning or info"),
        _f("ledger_id", pa.int64(), "the ledger, for ledger alerts"),
        _f("bookies", pa.list_(pa.string()), "bookies involved"),
        _f("pulsar_topic", pa.string(), "Pulsar topic of the ledger, when known"),
        _f("detail", pa.string(), "alert detail (JSON)"),
    )
}

OPEN_ALERTS = TableSpec(
    "open_alerts",
    pa.schema(
        [
            *(_ALERT[name] for name in ("alert_id", "cluster", "kind")),
            _f("entity", pa.string(), "ledger/<id>, bookie/<id> or rackmap"),
            *(_ALERT[name] for name in ("severity", "ledger_id", "bookies", "pulsar_topic")),
            _f("started_at", _TS, "event time the condition started"),
            _f("detected_at", _TS, "event time it was detected"),
            _ALERT["detail"],
        ]
    ),
    "Alerts currently firing (one row per alert id).",
    key=("alert_id",),
)

VIOLATIONS = TableSpec(
    "violations",
    pa.schema(
        [
            *(_ALERT[name] for name in ("alert_id", "cluster", "kind")),
            _f("state", pa.string(), "firing or resolved"),
            *(_ALERT[name] for name in ("severity", "ledger_id", "bookies", "pulsar_topic")),
            _f("detected_at", _TS, "event time of this transition"),
            _f("detected_date", pa.date32(), "date of detected_at (partition column)"),
            _ALERT["detail"],
            _f("batch_id", pa.int64(), "streaming micro-batch that recorded it"),
            _f(
                "entity",
                pa.string(),
                "ledger/<id>, bookie/<id>, topic/... or a cluster entity (null in rows written before "
                "bkaudit kept it)",
            ),
            _f(
                "started_at",
                _TS,
                "event time the condition started (part of its alert_id; null in rows rebuilt from the "
                "alerts topic, which does not carry it, and in rows written before bkaudit kept it)",
            ),
        ]
    ),
    "Append-only history of every alert transition (firing, resolved).",
    partition_by=("detected_date",),
    z_order=("kind", "ledger_id"),
)

DEAD_LETTERS = TableSpec(
    "dead_letters",
    pa.schema(
        [
            _f(
                "source",
                pa.string(),
                "kafka (an undecodable message), znode (an undecodable znode) or future (a change event "
                "dated more than stream.max_event_time_skew_s ahead of the receiving clock)",
            ),
            _f("topic", pa.string(), "Kafka topic of the input"),
            _f("partition", pa.int32(), "Kafka partition"),
            _f("offset", pa.int64(), "Kafka offset"),
            _f("key", pa.binary(), "Kafka key"),
            _f(
                "value",
                pa.binary(),
                "Kafka value (null for znodes, and for a record holding raw ledger metadata: ledger "
                "passwords never reach a table)",
            ),
            _f("ledger_id", pa.int64(), "ledger of an undecodable znode"),
            _f("path", pa.string(), "znode path of an undecodable znode"),
            _f("reason", pa.string(), "why it could not be processed"),
            _f("received_at", _TS, "when the job saw it"),
            _f("received_date", pa.date32(), "date of received_at (partition column)"),
            _f("batch_id", pa.int64(), "streaming micro-batch that recorded it"),
        ]
    ),
    "Every input that could not be processed, with the reason.",
    partition_by=("received_date",),
)

SNAPSHOT_SEEN = TableSpec(
    "snapshot_seen",
    pa.schema(
        [
            _f("snapshot_id", pa.string(), "watcher snapshot", nullable=False),
            _f("kafka_partition", pa.int32(), "partition of the changes topic the ledger's events use"),
            _f("ledger_id", pa.int64(), "a ledger the snapshot reported", nullable=False),
        ]
    ),
    "Ledgers reported by watcher snapshots (a working table the job uses to find ledgers that vanished).",
    partition_by=("snapshot_id",),
)

PLACEMENT_PLANS = TableSpec(
    "placement_plans",
    pa.schema(
        [
            _f("cluster", pa.string(), "the cluster's INSTANCEID"),
            _f("ledger_id", pa.int64(), "a ledger with an open PLACEMENT_NOT_ADHERING alert", nullable=False),
            _f("segment", pa.int32(), "index of the segment in the ledger's metadata (0 = first)"),
            _f("first_entry_id", pa.int64(), "first entry of the segment"),
            _f("ensemble", pa.list_(pa.string()), "the segment's ensemble, which fails the policy"),
            _f("move", pa.int32(), "order of this move in the plan (0 = first); null when there is no plan"),
            _f("position", pa.int32(), "ensemble position whose replica moves"),
            _f(
                "from_bookie",
                pa.string(),
                "bookie to replace; a lost or unregistered member is replaced first (move 0 onwards)",
            ),
            _f(
                "to_bookie",
                pa.string(),
                "target bookie: registered WRITABLE, not lost, no open BOOKIE_UNRESPONSIVE alert, outside "
                "the ensemble",
            ),
            _f("to_rack", pa.string(), "the target's network location from the rack map, null = default"),
            _f(
                "bytes_to_move",
                pa.int64(),
                "bytes this move copies to the target, estimated: the ledger's length × the segment's "
                "entries stored at this position / the ledger's entries; null when the ledger is not "
                "closed (and in rows written before the column was added)",
            ),
            _f(
                "planned_ensemble",
                pa.list_(pa.string()),
                "the ensemble after every move of the plan, verified to meet the policy strictly; "
                "null when there is no plan",
            ),
            _f("reason", pa.string(), "why the segment has no valid plan, else null"),
            _f("policy", pa.string(), "placement policy the plan meets (stream.placement_policy)"),
            _f("pulsar_topic", pa.string(), "Pulsar topic of the ledger, when known"),
            _f(
                "as_of",
                _TS,
                "event time of the newest input of the plan: the ledger's version, the last change of the "
                "bookies (rack map, membership) or the newest open BOOKIE_UNRESPONSIVE alert",
            ),
        ]
    ),
    "BP-54 relocation plans: one row per replica move that makes a failing segment of a ledger with an "
    "open PLACEMENT_NOT_ADHERING alert meet the policy strictly (one row with the reason when no plan "
    "exists). Kept current by the job after every ledger fold; a plan leaves when its alert resolves.",
    key=("ledger_id", "segment", "move"),
)

_CURSOR = pa.struct([("name", pa.string()), ("ledger_id", pa.int64())])

TOPICS = TableSpec(
    "topics",
    pa.schema(
        [
            _f(
                "managed_ledger",
                pa.string(),
                "the managed ledger's name (its path below pulsar.managed_ledgers_path)",
                nullable=False,
            ),
            _f("topic", pa.string(), "the Pulsar topic (persistent://tenant/namespace/topic)"),
            _f("cluster", pa.string(), "the cluster's INSTANCEID"),
            _f("ledger_ids", pa.list_(pa.int64()), "the ledgers it lists, in order"),
            _f("offloaded_ids", pa.list_(pa.int64()), "of those, offloaded completely (tiered storage)"),
            _f(
                "bookkeeper_deleted_ids",
                pa.list_(pa.int64()),
                "of those, offloaded and then deleted from BookKeeper (not missing)",
            ),
            _f(
                "cursors",
                pa.list_(_CURSOR),
                "its cursors and each one's cursor ledger (null: kept in the znode)",
            ),
            _f("mzxid", pa.int64(), "mzxid of the managed ledger's znode as last read"),
            _f("version", pa.int32(), "data version of that znode"),
            _f(
                "undecodable_reason",
                pa.string(),
                "why its znode (or a cursor's) does not decode; null when it does",
            ),
            _f("deleted", pa.bool_(), "its znode was deleted"),
            _f("updated_at", _TS, "event time of the last change applied"),
        ]
    ),
    "Pulsar's managed ledgers as the watcher last read them, one row per managed ledger.",
    key=("managed_ledger",),
)

TABLES: dict[str, TableSpec] = {
    spec.name: spec
    for spec in (
        LEDGERS,
        LEDGER_CHANGES,
        LEDGER_BOOKIES,
        BOOKIES,
        OPEN_ALERTS,
        VIOLATIONS,
        DEAD_LETTERS,
        SNAPSHOT_SEEN,
        PLACEMENT_PLANS,
        TOPICS,
    )
}


def table_path(root: str | Path, name: str) -> str:
    """The location of the table ``name`` under ``root`` (a local path or an ``s3://`` URL).

    Example:
        >>> table_path("s3://audit/lh", "ledgers"), table_path("lh", "ledgers")
        ('s3://audit/lh/ledgers', 'lh/ledgers')
    """
    return storage.join(root, name)


def ensure_tables(root: str | Path) -> list[str]:
    """Create every table that does not exist yet (CDF on, comments set); returns the table names."""
    storage.make_dirs(root)
    existing = recorded_tables(root)
    for spec in TABLES.values():
        path = table_path(root, spec.name)
        if DeltaTable.is_deltatable(path):
            _add_missing_columns(DeltaTable(path), spec)
            continue
        if existing:
            logger.warning("creating the Delta table '%s' (empty) in the lakehouse %s", spec.name, root)
        create_table(root, spec)
    record_tables(root, set(TABLES))
    return sorted(TABLES)


def create_table(root: str | Path, spec: TableSpec) -> None:
    """Create the table ``spec`` describes, empty (change data feed on, comments set)."""
    DeltaTable.create(
        table_path(root, spec.name),
        spec.schema,
        partition_by=list(spec.partition_by) or None,
        name=spec.name,
        description=spec.description,
        configuration={"delta.enableChangeDataFeed": "true"},
    )


def _add_missing_columns(table: DeltaTable, spec: TableSpec) -> None:
    """Columns a newer bkaudit added to ``spec`` are appended (nullable, existing rows null); nothing else
    about an existing table is changed."""
    present = set(table.schema().to_arrow().names)
    missing = [Field.from_arrow(f) for f in spec.schema if f.name not in present]
    if missing:
        table.alter.add_columns(missing)


def _commit(app_id: str, batch_id: int) -> CommitProperties:
    return CommitProperties(
        custom_metadata={BATCH_METADATA_KEY: str(batch_id), APP_METADATA_KEY: app_id},
        app_transactions=[Transaction(app_id, batch_id)],
    )


class OpenTables:
    """Delta tables kept open by name and brought up to date with the commits since at each ``get``:
    opening a table afresh reads its log from the last checkpoint (tens of ms for a table of many small
    files), which a writer of many small batches would pay per table per batch. One thread's handles.

    Example:
        >>> import tempfile
        >>> root = tempfile.mkdtemp(); _ = ensure_tables(root)
        >>> tables = OpenTables(root)
        >>> tables.get("bookies") is tables.get("bookies")
        True
    """

    def __init__(self, root: str | Path) -> None:
        self.root = root
        self._tables: dict[str, DeltaTable] = {}

    def get(self, name: str) -> DeltaTable:
        """``name`` at its newest version."""
        table = self._tables.get(name)
        if table is not None:
            try:
                table.update_incremental()
                return table
            except Exception:  # a table replaced under us (a reset): open it afresh
                logger.debug("reopening the %s table", name, exc_info=True)
        table = self._tables[name] = DeltaTable(table_path(self.root, name))
        return table


def table_before_batch(
    root: str | Path, name: str, app_id: str, batch_id: int, tables: OpenTables | None = None
) -> DeltaTable:
    """The table as it was before ``batch_id`` of ``app_id`` was committed to it (latest if it was not;
    from ``tables`` when given).

    A replayed batch must decide from the same state as its first attempt, even when that attempt already
    committed to some tables before the crash.
    """
    table = tables.get(name) if tables is not None else DeltaTable(table_path(root, name))
    applied = table.transaction_version(app_id)
    if applied is None or applied < batch_id:
        return table
    for commit in table.history(50):
        if str(commit.get(BATCH_METADATA_KEY)) == str(batch_id) and commit.get(APP_METADATA_KEY) == app_id:
            return DeltaTable(table_path(root, name), version=int(commit["version"]) - 1)
    raise RuntimeError(f"{name}: batch {batch_id} of {app_id} is committed but not in the last 50 commits")


@dataclass
class BatchWriter:
    """Replay-safe writes of one micro-batch: each table is written at most once per ``(app_id, batch_id)``.

    Example:
        >>> import tempfile, pyarrow as pa
        >>> root = tempfile.mkdtemp(); _ = ensure_tables(root)
        >>> writer = BatchWriter(root, app_id="doc", batch_id=0)
        >>> writer.upsert("bookies", pa.Table.from_pylist([{"bookie_id": "b1", "status": "WRITABLE"}],
        ...                                               schema=BOOKIES.schema))
        True
        >>> BatchWriter(root, app_id="doc", batch_id=0).upsert("bookies", pa.table({"bookie_id": ["b1"]}))
        False
    """

    root: str | Path
    app_id: str
    batch_id: int
    tables: OpenTables | None = None  # handles kept open between batches (opened afresh when None)

    def _table(self, name: str) -> DeltaTable:
        return self.tables.get(name) if self.tables is not None else DeltaTable(table_path(self.root, name))

    def _pending(self, table: DeltaTable) -> bool:
        applied = table.transaction_version(self.app_id)
        return applied is None or applied < self.batch_id

    def _conform(self, spec: TableSpec, rows: pa.Table) -> pa.Table:
        columns = []
        for target in spec.schema:
            if target.name in rows.column_names:
                columns.append(rows.column(target.name).cast(target.type))
            else:
                columns.append(pa.nulls(rows.num_rows, target.type))
        return pa.Table.from_arrays(columns, schema=spec.schema)

    def append(self, name: str, rows: pa.Table) -> bool:
        """Append ``rows``; False when this batch is already in the table (or there is nothing to add)."""
        spec = TABLES[name]
        table = self._table(name)
        if not self._pending(table):
            return False
        write_deltalake(
            table,
            self._conform(spec, rows),
            mode="append",
            commit_properties=_commit(self.app_id, self.batch_id),
        )
        return True

    def upsert(self, name: str, rows: pa.Table, *, columns: Sequence[str] | None = None) -> bool:
        """Insert or replace rows by the table's key (every column taken from ``rows``).

        With ``columns``, an existing row gets only those columns from ``rows`` (the others keep what another
        writer put there: the two lanes of the job share the ``bookies`` table this way); a new row is
        inserted whole, null where ``rows`` has no value.
        """
        spec = TABLES[name]
        table = self._table(name)
        if not self._pending(table):
            return False
        source = self._conform(spec, rows)
        predicate = " AND ".join(f"t.{k} = s.{k}" for k in spec.key)
        merge = table.merge(
            source,
            predicate,
            source_alias="s",
            target_alias="t",
            commit_properties=_commit(self.app_id, self.batch_id),
        )
        if columns is None:
            merge = merge.when_matched_update_all()
        else:
            merge = merge.when_matched_update({c: f"s.{c}" for c in columns})
        merge.when_not_matched_insert_all().execute()
        return True

    def replace_keys(self, name: str, key_column: str, keys: Iterable[object], rows: pa.Table) -> bool:
        """Delete every row whose ``key_column`` is in ``keys``, then insert ``rows``, in one commit.

        Used for the index: the rows of a changed ledger are replaced, never diffed, so the result depends
        only on the batch input.
        """
        spec = TABLES[name]
        table = self._table(name)
        if not self._pending(table):
            return False
        key_list = sorted(set(keys))  # type: ignore[type-var]
        source = self._conform(spec, rows)
        if not key_list and source.num_rows == 0:
            return self._mark_only(table)
        # One merge: matched → update, unmatched source → insert, unmatched target of a replaced key → delete.
        in_list = ", ".join(_sql_literal(k) for k in key_list) or "NULL"
        predicate = " AND ".join(f"t.{c} = s.{c}" for c in (*spec.key, *_extra_keys(spec)))
        (
            table.merge(
                source,
                predicate,
                source_alias="s",
                target_alias="t",
                commit_properties=_commit(self.app_id, self.batch_id),
            )
            .when_matched_update({c: f"s.{c}" for c in spec.schema.names})
            .when_not_matched_insert({c: f"s.{c}" for c in spec.schema.names})
            .when_not_matched_by_source_delete(f"t.{key_column} IN ({in_list})")
            .execute()
        )
        return True

    def _mark_only(self, table: DeltaTable) -> bool:
        # Nothing to write; still record the batch so a replay skips identically.
        table.delete("false", commit_properties=_commit(self.app_id, self.batch_id))
        return True


def _extra_keys(spec: TableSpec) -> Sequence[str]:
    # The index is keyed by (ledger, bookie): a ledger has one row per bookie it names.
    return ("bookie",) if spec.name == "ledger_bookies" else ()


def _sql_literal(value: object) -> str:
    if isinstance(value, bool) or value is None:
        raise ValueError(f"unsupported key {value!r}")
    if isinstance(value, int):
        return str(value)
    text = str(value).replace("'", "''")
    return f"'{text}'"


def read_table(root: str | Path, name: str) -> pa.Table:
    """The current version of a table as Arrow (empty table with the schema when absent).

    ``ledgers`` and ``ledger_bookies`` are read as the job left them after its last finished batch: the
    folded rows and the changes since, the index rows of current versions (connectors.delta.ledger_log).
    """
    if name == "ledgers":
        return read_current_ledgers(root)
    if name == "ledger_bookies":
        return read_current_index(root)
    try:
        return DeltaTable(table_path(root, name)).to_pyarrow_table()
    except TableNotFoundError:
        return TABLES[name].schema.empty_table()


# -- the ledgers as the job finished them (connectors.delta.ledger_log writes them) -------------------------
def sorted_by_id(table: pa.Table) -> pa.Table:
    """``table`` ordered by ``ledger_id``.

    Example:
        >>> sorted_by_id(pa.table({"ledger_id": [3, 1]})).column("ledger_id").to_pylist()
        [1, 3]
    """
    return table.sort_by("ledger_id") if table.num_rows else table


def latest_per_ledger(tables: Sequence[pa.Table], *, order_by: str | None = None) -> pa.Table:
    """One row per ledger id, the last one in ``tables`` order (batches oldest first); with ``order_by``,
    the one with the highest value of that column (the last of those), whatever the rows' order.

    Example:
        >>> older = pa.table({"ledger_id": [1, 2], "v": [1, 1]})
        >>> latest_per_ledger([older, pa.table({"ledger_id": [1], "v": [2]})]).to_pylist()
        [{'ledger_id': 1, 'v': 2}, {'ledger_id': 2, 'v': 1}]
        >>> rows = pa.table({"ledger_id": [1, 1], "batch_id": [8, 7]})
        >>> latest_per_ledger([rows], order_by="batch_id").to_pylist()
        [{'ledger_id': 1, 'batch_id': 8}]
    """
    rows = pa.concat_tables(tables) if tables else LEDGERS.schema.empty_table()
    if rows.num_rows == 0:
        return rows
    ids = rows.column("ledger_id").to_numpy()
    keys = [np.arange(len(ids))]  # by id, then order_by, then position
    if order_by is not None:
        keys.append(rows.column(order_by).to_numpy())
    order = np.lexsort((*keys, ids))
    last = order[np.r_[ids[order][1:] != ids[order][:-1], True]]
    return rows.take(pa.array(last, pa.int64()))


def conform_to(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly ``schema``'s columns and types (absent columns null).

    Example:
        >>> conform_to(pa.table({"a": [1]}), pa.schema([("a", pa.int32()), ("b", pa.string())])).to_pylist()
        [{'a': 1, 'b': None}]
    """
    columns = [
        table.column(f.name).cast(f.type)
        if f.name in table.column_names
        else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def current_rows(base: pa.Table, overlay: Sequence[pa.Table]) -> pa.Table:
    """``base`` (one row per ledger) with the newest row of ``overlay`` (oldest first) where there is one.

    Example:
        >>> base = pa.table({"ledger_id": [1, 2], "v": [1, 1]})
        >>> current_rows(base, [pa.table({"ledger_id": [2, 3], "v": [5, 5]})]).to_pylist()
        [{'ledger_id': 1, 'v': 1}, {'ledger_id': 2, 'v': 5}, {'ledger_id': 3, 'v': 5}]
    """
    return fold_rows(base, overlay)[0] if overlay else base


def overlaid(base: pa.Table, latest: pa.Table) -> pa.Table:
    """``base`` (one row per ledger, in any order) with ``latest``'s row (one per ledger) in place of its
    own or added, sorted by ledger id. The rows are gathered once, by positions worked out on the ids
    alone: filtering, concatenating and sorting the rows copied every one of them three times (1–3 s of
    CPU for 1 M ledgers, most of it the kernel's, against 0.3 s).

    Example:
        >>> base = pa.table({"ledger_id": [3, 1], "v": [1, 1]})
        >>> overlaid(base, pa.table({"ledger_id": [2, 3], "v": [5, 5]})).to_pylist()
        [{'ledger_id': 1, 'v': 1}, {'ledger_id': 2, 'v': 5}, {'ledger_id': 3, 'v': 5}]
    """
    base_ids = _ids(base)
    latest_ids = _ids(latest)
    kept = np.flatnonzero(~np.isin(base_ids, latest_ids))
    sources = np.concatenate([kept, base.num_rows + np.arange(latest.num_rows)])
    order = np.argsort(np.concatenate([base_ids[kept], latest_ids]), kind="stable")
    return pa.concat_tables([base, latest]).take(pa.array(sources[order], pa.int64()))


def _ids(table: pa.Table) -> np.ndarray:
    column = table.column("ledger_id")
    return column.to_numpy() if column.num_chunks else np.empty(0, np.int64)


def fold_rows(
    base: pa.Table, changes: Sequence[pa.Table], *, order_by: str | None = None
) -> tuple[pa.Table, pa.Table]:
    """``base`` (one row per ledger) with the newest row of each ledger in ``changes`` (oldest first, or
    newest by the column ``order_by``): the folded state sorted by ledger id, and the newest rows alone
    (with ``base``'s columns).

    Example:
        >>> base = pa.table({"ledger_id": [1, 2], "v": [1, 1]})
        >>> folded, latest = fold_rows(base, [pa.table({"ledger_id": [3, 2], "v": [5, 5]})])
        >>> folded.to_pylist(), latest.num_rows
        ([{'ledger_id': 1, 'v': 1}, {'ledger_id': 2, 'v': 5}, {'ledger_id': 3, 'v': 5}], 2)
    """
    latest = conform_to(latest_per_ledger(changes, order_by=order_by), base.schema)
    return overlaid(base, latest), latest


def read_current_ledgers(root: str | Path) -> pa.Table:
    """Every ledger's current row from Delta alone (``ledgers`` and the changes not folded yet): what the
    job has finished, for readers outside the job (``bkaudit query``, tests, notebooks).

    Example:
        >>> import tempfile; root = tempfile.mkdtemp(); _ = ensure_tables(root)
        >>> read_current_ledgers(root).num_rows
        0
    """
    return _read_current(root)[0]


def _read_current(root: str | Path) -> tuple[pa.Table, np.ndarray]:
    """Every ledger's current row, and the ids of the ledgers changed since the last fold."""
    unchanged = np.empty(0, np.int64)
    try:
        ledgers = DeltaTable(table_path(root, "ledgers"))
    except TableNotFoundError:
        return LEDGERS.schema.empty_table(), unchanged
    folded = last_fold(ledgers)
    base = conform_to(ledgers.to_pyarrow_table(), LEDGERS.schema)
    try:
        changes_table = DeltaTable(table_path(root, "ledger_changes"))
    except TableNotFoundError:
        return sorted_by_id(base), unchanged
    where = [("batch_id", ">", folded)] if folded is not None else []
    changes = scan(changes_table, where)
    if changes.num_rows == 0:
        return sorted_by_id(base), unchanged
    current, latest = fold_rows(base, [changes], order_by="batch_id")
    return current, _ids(latest)


def last_fold(ledgers: DeltaTable) -> int | None:
    """The last batch folded into ``ledgers`` (None: no fold among its last 200 commits).

    Example:
        >>> import tempfile; root = tempfile.mkdtemp(); _ = ensure_tables(root)
        >>> last_fold(DeltaTable(table_path(root, "ledgers"))) is None
        True
    """
    for commit in ledgers.history(200):
        through = commit.get(FOLD_METADATA_KEY)
        if through is not None:
            return int(through)
    return None


def read_current_index(root: str | Path, bookies: Sequence[str] | None = None) -> pa.Table:
    """The ``ledger_bookies`` rows of every ledger's current version (of ``bookies`` only, when given).

    A ledger changed since the last fold is indexed by its current row (the job appends new versions'
    rows at its own cadence, never past a fold); the others by the table's rows of their version.

    Example:
        >>> import tempfile; root = tempfile.mkdtemp(); _ = ensure_tables(root)
        >>> read_current_index(root, ["b1"]).num_rows
        0
    """
    where = [("bookie", "in", list(bookies))] if bookies is not None else []
    try:
        indexed = scan(DeltaTable(table_path(root, "ledger_bookies")), where, prune_partitions=True)
    except TableNotFoundError:
        return LEDGER_BOOKIES.schema.empty_table()
    current, changed = _read_current(root)
    indexed = indexed.filter(pa.array(~np.isin(indexed.column("ledger_id").to_numpy(), changed)))
    changed_rows = current.filter(pa.array(np.isin(current.column("ledger_id").to_numpy(), changed)))
    pending = conform_to(index_rows_on(changed_rows, bookies), indexed.schema)
    current = current.select(["ledger_id", "mzxid", "deleted", "state"])
    if indexed.num_rows == 0 or len(current) == 0:
        return pending
    ids = current.column("ledger_id").to_numpy()
    at = np.searchsorted(ids, indexed.column("ledger_id").to_numpy()).clip(max=max(len(ids) - 1, 0))
    hit = ids[at] == indexed.column("ledger_id").to_numpy()
    mzxid = np.where(hit, pc.fill_null(current.column("mzxid"), _NO_VERSION).to_numpy()[at], _NO_VERSION)
    gone = pc.fill_null(current.column("deleted"), False).to_numpy(zero_copy_only=False)[at] & hit
    return pa.concat_tables([of_current_versions(indexed, mzxid, gone), pending])


def of_current_versions(indexed: pa.Table, mzxid: np.ndarray, gone: np.ndarray) -> pa.Table:
    """The ``ledger_bookies`` rows of ``indexed`` written for their ledger's current version: per row,
    ``mzxid`` is its ledger's current version (-1: unknown) and ``gone`` whether the ledger is deleted.

    Example:
        >>> rows = pa.table({"ledger_id": [1, 1, 2], "mzxid": [3, 4, 5]})
        >>> of_current_versions(rows, np.array([4, 4, 5]), np.array([False, False, True])).to_pylist()
        [{'ledger_id': 1, 'mzxid': 4}]
    """
    row_mzxid = pc.fill_null(indexed.column("mzxid"), -2).to_numpy()  # -2: never a version
    return indexed.filter(pa.array((row_mzxid == mzxid) & ~gone))


def maintain(
    root: str | Path, *, retention_hours: int = 168, not_compacted: Collection[str] = ()
) -> dict[str, dict[str, object]]:
    """Compact the small files streaming creates (Z-ordered where useful) and vacuum old ones. The tables
    ``not_compacted`` are vacuumed only: the job rewrites their files itself (``ledgers`` by its folds), and
    compacting them again costs a rewrite of the whole table.

    Example:
        >>> import tempfile; root = tempfile.mkdtemp(); _ = ensure_tables(root)
        >>> report = maintain(root, not_compacted=["ledgers"])
        >>> sorted(report)[:2], report["ledgers"]["optimize"]
        (['bookies', 'dead_letters'], None)
    """
    report: dict[str, dict[str, object]] = {}
    for spec in TABLES.values():
        table = DeltaTable(table_path(root, spec.name))
        optimize = table.optimize
        metrics: object = None
        if spec.name not in not_compacted:
            metrics = optimize.z_order(list(spec.z_order)) if spec.z_order else optimize.compact()
        removed = table.vacuum(
            retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False
        )
        report[spec.name] = {"optimize": metrics, "vacuumed_files": len(removed)}
    return report


def index_rows_of_versions(versions: pa.Table) -> pa.Table:
    """The ``ledger_bookies`` rows of new ledger versions (``ledgers`` rows): one per bookie in each row's
    ``bookies``, column by column.

    Example:
        >>> row = {"ledger_id": 7, "mzxid": 3, "state": "CLOSED", "bookies": ["b1", "b2"]}
        >>> rows = index_rows_of_versions(pa.Table.from_pylist([row], schema=LEDGERS.schema))
        >>> [(r["bookie"], r["ledger_id"], r["mzxid"]) for r in rows.to_pylist()]
        [('b1', 7, 3), ('b2', 7, 3)]
    """
    bookies = pc.fill_null(versions.column("bookies"), pa.scalar([], pa.list_(pa.string()))).combine_chunks()
    taken = versions.take(pc.list_parent_indices(bookies))
    columns = {"bookie": pc.list_flatten(bookies)}
    for target in LEDGER_BOOKIES.schema:
        if target.name != "bookie":
            columns[target.name] = taken.column(target.name).cast(target.type)
    return pa.Table.from_pydict(columns, schema=LEDGER_BOOKIES.schema)


def index_rows_on(rows: pa.Table, bookies: Sequence[str] | None) -> pa.Table:
    """The index rows on ``bookies`` (every bookie when None) of the live ledgers among ``rows``
    (``ledgers`` rows).

    Example:
        >>> rows = [{"ledger_id": 7, "mzxid": 3, "bookies": ["b1", "b2"]}, {"ledger_id": 8, "deleted": True}]
        >>> on = index_rows_on(pa.Table.from_pylist(rows, schema=LEDGERS.schema), ["b2", "b9"])
        >>> [(r["bookie"], r["ledger_id"], r["mzxid"]) for r in on.to_pylist()]
        [('b2', 7, 3)]
    """
    live = rows.filter(pc.invert(pc.fill_null(rows.column("deleted"), False)))
    if bookies is None:
        return index_rows_of_versions(live)
    named = pc.fill_null(live.column("bookies"), pa.scalar([], pa.list_(pa.string()))).combine_chunks()
    on = pc.is_in(pc.list_flatten(named), pa.array(list(bookies), pa.string()))
    parents = np.unique(pc.list_parent_indices(named).to_numpy()[on.to_numpy(zero_copy_only=False)])
    indexed = index_rows_of_versions(live.take(pa.array(parents, pa.int64())))
    return indexed.filter(pc.is_in(indexed.column("bookie"), pa.array(list(bookies), pa.string())))
