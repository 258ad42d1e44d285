"""Pulsar's managed ledgers against BookKeeper: which listed ledgers are missing, which ledgers are orphaned.

One rule, two callers: the job's topics stage (:mod:`streaming.topics`) and the simulator's ground truth
(:mod:`bkaudit.sim.truth`). Columnar: the listings and the ledgers are Arrow tables.

* **Listed.** A managed ledger lists its ledgers (``ManagedLedgerInfo``) and each cursor its cursor ledger
  (``ManagedCursorInfo.cursorsLedgerId``): :func:`listed_table` has one row per (managed ledger, ledger),
  with ``excused`` set for a ledger offloaded completely and then deleted from BookKeeper (tiered storage).
* **Missing** (:func:`missing_pairs`): a listed, not excused ledger BookKeeper does not have. The job fires
  ``TOPIC_LEDGER_MISSING`` only after ``pulsar.missing_grace_s`` of event time (:func:`due`), since Pulsar
  creates a ledger before listing it and unlists it before deleting it.
* **Orphaned** (:func:`orphaned_ledgers`): a live ledger whose custom metadata names a managed ledger
  (``pulsar/managed-ledger``, the owning topic) that does not list it (as its ledger or a cursor's), or that
  does not exist, and that is older than ``pulsar.orphan_grace_s``. Schema and compacted-topic ledgers
  (custom metadata ``component`` other than ``managed-ledger``) are never orphaned by this rule.

Example:
    >>> from core.domain.managed_ledger import ManagedLedgerInfo, TopicLedger
    >>> listed = listed_table({"t/n/persistent/x": Listing((TopicLedger(1), TopicLedger(2)), {})})
    >>> missing_pairs(listed, np.array([1])).to_pylist()
    [{'managed_ledger': 't/n/persistent/x', 'ledger_id': 2}]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.domain.managed_ledger import TopicLedger
from core.domain.metadata import pulsar_topic_from_managed_ledger

#: Custom metadata of a Pulsar ledger (``LedgerMetadataUtils``): ``component`` says what it is for.
COMPONENT_KEY = "component"
CURSOR_KEY = "pulsar/cursor"
#: Components this rule judges: a managed ledger's and its cursors' ledgers (schema and compacted-topic
#: ledgers are owned otherwise).
MANAGED_COMPONENTS = frozenset({"managed-ledger"})

LISTED_SCHEMA = pa.schema(
    [
        pa.field("managed_ledger", pa.string(), nullable=False),
        pa.field("topic", pa.string()),
        pa.field("ledger_id", pa.int64(), nullable=False),
        pa.field("owner", pa.string(), nullable=False),  # "topic" or "cursor <name>"
        pa.field("excused", pa.bool_(), nullable=False),  # offloaded completely, BookKeeper copy deleted
        pa.field("offloaded", pa.bool_(), nullable=False),  # offloaded completely
    ]
)


@dataclass(frozen=True)
class Listing:
    """What one managed ledger lists: its ledgers, and each cursor's ledger (None: kept in the znode)."""

    ledgers: tuple[TopicLedger, ...] = ()
    cursors: dict[str, int | None] = field(default_factory=dict)


def listed_table(listings: dict[str, Listing]) -> pa.Table:
    """One row per (managed ledger, ledger it needs), in name order.

    Example:
        >>> listing = Listing((TopicLedger(3, offloaded=True, bookkeeper_deleted=True),), {"sub": 9})
        >>> rows = listed_table({"t/n/persistent/x": listing}).to_pylist()
        >>> [(r["ledger_id"], r["owner"], r["excused"]) for r in rows]
        [(3, 'topic', True), (9, 'cursor sub', False)]
    """
    columns: dict[str, list[object]] = {name: [] for name in LISTED_SCHEMA.names}

    def add(name: str, topic: str | None, ledger_id: int, owner: str, excused: bool, offloaded: bool) -> None:
        for key, value in zip(
            LISTED_SCHEMA.names, (name, topic, ledger_id, owner, excused, offloaded), strict=True
        ):
            columns[key].append(value)

    for name in sorted(listings):
        listing, topic = listings[name], pulsar_topic_from_managed_ledger(name)
        for ledger in listing.ledgers:
            add(
                name,
                topic,
                ledger.ledger_id,
                "topic",
                ledger.gone_from_bookkeeper_by_design,
                ledger.offloaded,
            )
        for cursor in sorted(listing.cursors):
            ledger_id = listing.cursors[cursor]
            if ledger_id is not None:
                add(name, topic, ledger_id, f"cursor {cursor}", False, False)
    return pa.table(columns, schema=LISTED_SCHEMA)


def missing_pairs(listed: pa.Table, existing: np.ndarray) -> pa.Table:
    """``(managed_ledger, ledger_id)`` of every listed ledger BookKeeper does not have (``existing``: the ids
    of the live ledgers), unless offloaded and deleted from BookKeeper by design; distinct, sorted.

    Example:
        >>> listed = listed_table({"a/b/persistent/c": Listing((TopicLedger(5),), {"s": 5})})
        >>> missing_pairs(listed, np.array([], np.int64)).num_rows
        1
    """
    ids = listed.column("ledger_id").to_numpy()
    gone = ~np.isin(ids, np.asarray(existing, dtype=np.int64))
    excused = listed.column("excused").to_numpy(zero_copy_only=False)
    chosen = listed.filter(pa.array(gone & ~excused)).select(["managed_ledger", "ledger_id"])
    if not chosen.num_rows:
        return chosen
    distinct = chosen.group_by(["managed_ledger", "ledger_id"]).aggregate([])
    return distinct.select(["managed_ledger", "ledger_id"]).sort_by(
        [("managed_ledger", "ascending"), ("ledger_id", "ascending")]
    )


def due(since_ms: np.ndarray, now_ms: int, grace_ms: int) -> np.ndarray:
    """Which conditions, holding since ``since_ms``, have held for ``grace_ms`` at ``now_ms``.

    Example:
        >>> due(np.array([0, 50]), 100, 60).tolist()
        [True, False]
    """
    return (now_ms - np.asarray(since_ms, dtype=np.int64)) >= grace_ms


#: The ledger columns :func:`orphaned_ledgers` reads (the ``ledgers`` table's names).
LEDGER_COLUMNS = ("ledger_id", "pulsar_topic", "ctime_ms", "length", "component")


def orphaned_ledgers(ledgers: pa.Table, listed: pa.Table, now_ms: int, grace_ms: int) -> pa.Table:
    """The live ``ledgers`` (:data:`LEDGER_COLUMNS`; ``component`` null when not stored) that name an owning
    topic that does not list them, created at least ``grace_ms`` before ``now_ms``; sorted by id.

    Example:
        >>> listed = listed_table({"a/b/persistent/c": Listing((TopicLedger(1),), {})})
        >>> ledgers = pa.table({"ledger_id": [1, 2, 3], "pulsar_topic": ["persistent://a/b/c"] * 3,
        ...                     "ctime_ms": [0, 0, 90], "length": [10, 20, 30],
        ...                     "component": ["managed-ledger", None, "managed-ledger"]})
        >>> orphaned_ledgers(ledgers, listed, now_ms=100, grace_ms=50).column("ledger_id").to_pylist()
        [2]
    """
    owned = pc.is_valid(ledgers.column("pulsar_topic"))
    component = ledgers.column("component")
    judged = pc.or_(pc.is_null(component), pc.is_in(component, pa.array(sorted(MANAGED_COMPONENTS))))
    old = pc.less_equal(pc.fill_null(ledgers.column("ctime_ms"), now_ms), now_ms - grace_ms)
    candidates = ledgers.filter(pc.and_(pc.and_(owned, judged), old)).select(list(LEDGER_COLUMNS))
    if not candidates.num_rows:
        return candidates.select(list(LEDGER_COLUMNS))
    pairs = listed.select(["topic", "ledger_id"]).rename_columns(["pulsar_topic", "ledger_id"])
    pairs = pairs.group_by(["pulsar_topic", "ledger_id"]).aggregate([])
    orphans = candidates.join(pairs, ["pulsar_topic", "ledger_id"], join_type="left anti")
    return orphans.select(list(LEDGER_COLUMNS)).sort_by("ledger_id")


def component_column(custom_metadata: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The ``component`` value of each row's custom metadata (``list<struct<key, value>>``, the ``ledgers``
    table's), null where absent; columnar.

    Example:
        >>> kind = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
        >>> rows = pa.array([[{"key": "component", "value": b"schema"}], [], None], kind)
        >>> component_column(rows).to_pylist()
        ['schema', None, None]
    """
    lists = (
        custom_metadata.combine_chunks() if isinstance(custom_metadata, pa.ChunkedArray) else custom_metadata
    )
    result = np.full(len(lists), None, dtype=object)
    if len(lists):
        flat = pc.list_flatten(lists)
        parents = pc.list_parent_indices(lists).to_numpy()
        hit = pc.fill_null(pc.equal(flat.field("key"), COMPONENT_KEY), False).to_numpy(zero_copy_only=False)
        values = pc.cast(flat.field("value").filter(pa.array(hit)), pa.string()).to_pylist()
        result[parents[hit]] = values
    return pa.array(result.tolist(), pa.string())


def component_of(custom_metadata: list[dict[str, object]] | None) -> str | None:
    """The ``component`` custom metadata value (``managed-ledger``, ``schema``, ...), None when absent.

    Example:
        >>> component_of([{"key": "component", "value": b"schema"}])
        'schema'
    """
    for entry in custom_metadata or ():
        if entry.get("key") == COMPONENT_KEY:
            value = entry.get("value")
            if isinstance(value, bytes):
                return value.decode("utf-8", "replace")
            return None if value is None else str(value)
    return None
