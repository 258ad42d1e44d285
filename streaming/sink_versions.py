"""A batch's new ledger versions, column by column: the common decision (``ledger_state``) without a dict
per ledger (no I/O).

Most of a micro-batch is new versions of ledgers that nothing else in the batch touches. For those the sink
parses the payloads in one pass (Arrow's JSON reader), drops stale and duplicate versions against the
ledgers' current versions in bulk (:func:`plan_versions`), builds the new ``ledgers`` rows as columns
(:func:`version_rows`) and screens their rack-aware placement over the batch (:func:`adhering_versions`).
A ledger whose evaluation could change an alert goes to the per-ledger handlers of
:mod:`streaming.sink_batch` instead. One rule, two forms: ``tests/unit/test_sink_versions.py`` holds the
columnar result equal to the handlers'.

Example:
    >>> decisions = pa.table({"kind": ["ledger_state", "ledger_deleted"], "ledger_id": [1, 2]})
    >>> versions, rest = split_versions(decisions)
    >>> versions.column("ledger_id").to_pylist(), rest.column("ledger_id").to_pylist()
    ([1], [2])
"""

from __future__ import annotations

import binascii
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from connectors.delta.tables import LEDGER_BUCKETS, LEDGERS, SNAPSHOT_SEEN
from connectors.kafka.publisher import partitions_for_keys
from core.domain.isolation import ISOLATION_METADATA_KEY, IsolationGroups, decode_isolation_config
from core.domain.rules.evaluate import PlacementPolicyConfig
from core.domain.rules.isolation import isolation_screen_columns
from core.domain.rules.placement_batch import DEFAULT_RACK_CODE, rack_codes, rackaware_screen_codes
from core.errors import FormatError

#: The fields of a ``ledger_state`` payload the rows need (:func:`streaming.decode.ledger_payload`, plus the
#: snapshot id the processor adds); others are ignored.
PAYLOAD_SCHEMA = pa.schema(
    [
        *(
            pa.field(name, LEDGERS.schema.field(name).type)  # typed as the ``ledgers`` columns they fill
            for name in (
                "state",
                "format_version",
                "ensemble_size",
                "write_quorum",
                "ack_quorum",
                "last_entry_id",
                "length",
                "digest_type",
                "segments",
                "ctime_ms",
                "pulsar_topic",
                "has_password",
                "mzxid",
                "znode_ctime_ms",
                "znode_mtime_ms",
            )
        ),
        ("custom_metadata", pa.list_(pa.struct([("key", pa.string()), ("value_b64", pa.string())]))),
        ("version", pa.int32()),
        ("snapshot_id", pa.string()),
    ]
)
_REQUIRED = ("state", "segments", "mzxid", "ensemble_size", "write_quorum", "ack_quorum", "last_entry_id")
_TIMESTAMP = LEDGERS.schema.field("updated_at").type


def split_versions(decisions: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(the ``ledger_state`` decisions of ledgers no other decision of the batch names, every other one)."""
    ids = decisions.column("ledger_id")
    is_version = pc.fill_null(pc.equal(decisions.column("kind"), "ledger_state"), False)
    named_otherwise = pc.drop_null(ids.filter(pc.invert(is_version)))
    alone = pc.and_(is_version, pc.invert(pc.fill_null(pc.is_in(ids, value_set=named_otherwise), True)))
    return decisions.filter(alone), decisions.filter(pc.invert(alone))


def parse_payloads(payloads: pa.ChunkedArray | pa.Array) -> pa.Table | None:
    """The payloads as :data:`PAYLOAD_SCHEMA` columns, parsed in one pass; None when one is not in that
    shape (a decision queued by an older version: the per-ledger handlers read those).

    Example:
        >>> one = '{"state":"CLOSED","segments":[{"first_entry_id":0,"ensemble":["b1"]}],"mzxid":5,' \\
        ...       '"ensemble_size":1,"write_quorum":1,"ack_quorum":1,"last_entry_id":3}'
        >>> parse_payloads(pa.array([one])).column("mzxid").to_pylist()
        [5]
        >>> parse_payloads(pa.array(['{"state":"CLOSED","segments":[[0,["b1"]]],"mzxid":5}'])) is None
        True
    """
    if isinstance(payloads, pa.ChunkedArray):
        payloads = payloads.combine_chunks()
    if len(payloads) == 0 or payloads.null_count:
        return None
    payloads = payloads.cast(pa.large_string())  # either string type (Spark may send large ones)
    if not _each_opens_an_object(payloads):
        return None
    empty, newline = pa.scalar("", pa.large_string()), pa.scalar("\n", pa.large_string())
    lines = pc.binary_join_element_wise(payloads, empty, newline)  # each payload and a newline, contiguous
    offsets = np.frombuffer(lines.buffers()[1], np.int64, len(lines) + 1, lines.offset * 8)
    text = lines.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    longest = int(np.diff(offsets).max())
    options = pa_json.ParseOptions(explicit_schema=PAYLOAD_SCHEMA, unexpected_field_behavior="ignore")
    try:
        parsed = pa_json.read_json(
            pa.BufferReader(text),
            read_options=pa_json.ReadOptions(block_size=max(4 << 20, 2 * longest)),
            parse_options=options,
        )
    except pa.ArrowInvalid:
        return None
    if parsed.num_rows != len(payloads) or any(parsed.column(c).null_count for c in _REQUIRED):
        return None
    return parsed.combine_chunks()


def _each_opens_an_object(payloads: pa.Array) -> bool:
    """Whether every payload opens a JSON object. Arrow's JSON reader (26.0) crashes the process when the
    first value it reads is a top-level ``null``; and a payload that opens an object yields at least one
    row, so the reader's row count equals the payload count only when each yields exactly one.
    """
    return bool(pc.all(pc.starts_with(payloads, "{")).as_py())


@dataclass(frozen=True)
class VersionPlan:
    """What a batch's version decisions do, per decision row (positions into the decisions).

    ``final``: per ledger with a newer version, the row of its newest one; ``final_at_ms``: that row's event
    time (the ledger's change time); ``first_at_ms``: the event time of its first applied row. ``seen``:
    the rows that show their ledger exists (all but stale reads of a deleted ledger).
    """

    final: np.ndarray
    final_at_ms: np.ndarray
    first_at_ms: np.ndarray
    seen: np.ndarray


def plan_versions(
    ledger_ids: np.ndarray, at_ms: np.ndarray, mzxid: np.ndarray, current: np.ndarray, gone: np.ndarray
) -> VersionPlan:
    """Which rows apply: per ledger, in event-time order (then arrival), a row applies when its ``mzxid``
    is above the ledger's current one (``current``, -1 when unknown, per row) and every earlier row's.

    Example:
        >>> ids, at, mz = np.array([7, 7, 7, 8]), np.array([1, 2, 3, 1]), np.array([5, 4, 6, 2])
        >>> plan = plan_versions(ids, at, mz, np.array([3, 3, 3, 9]), np.array([False, False, False, True]))
        >>> plan.final.tolist(), plan.final_at_ms.tolist(), plan.first_at_ms.tolist(), plan.seen.tolist()
        ([2], [3], [1], [True, True, True, False])
    """
    n = len(ledger_ids)
    order = np.lexsort((np.arange(n), at_ms, ledger_ids))
    ids, versions, when = ledger_ids[order], mzxid[order], at_ms[order]
    starts = np.r_[True, ids[1:] != ids[:-1]] if n else np.zeros(0, bool)
    group = np.cumsum(starts) - 1
    highest_before = _running_max_before(versions, group, starts)
    applied = versions > np.maximum(current[order], highest_before)
    applied_before = _count_before(applied, group, starts)
    seen_sorted = applied | (applied_before > 0) | ~gone[order]
    groups = int(starts.sum())
    last_applied = np.full(groups, -1, np.int64)
    first_applied = np.full(groups, -1, np.int64)
    rows = np.flatnonzero(applied)
    last_applied[group[rows]] = rows  # ascending: the last write per group wins
    first_applied[group[rows[::-1]]] = rows[::-1]
    chosen = last_applied >= 0
    seen = np.zeros(n, bool)
    seen[order] = seen_sorted
    return VersionPlan(
        final=order[last_applied[chosen]],
        final_at_ms=when[last_applied[chosen]],
        first_at_ms=when[first_applied[chosen]],
        seen=seen,
    )


def _running_max_before(values: np.ndarray, group: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per position, the highest value at earlier positions of its group (-1 for a group's first)."""
    if not len(values):
        return values.copy()
    ranks, inverse = np.unique(values, return_inverse=True)
    keyed = group * (len(ranks) + 1) + inverse + 1  # groups ascend, so one running max serves them all
    running = np.maximum.accumulate(keyed) - group * (len(ranks) + 1) - 1
    before = np.r_[-1, running[:-1]]
    before[starts] = -1
    return np.where(before >= 0, ranks[np.maximum(before, 0)], -1)


def _count_before(flags: np.ndarray, group: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per position, how many earlier positions of its group are set."""
    if not len(flags):
        return np.zeros(0, np.int64)
    total = np.cumsum(flags) - flags
    return total - total[np.flatnonzero(starts)][group]


def version_rows(
    decisions: pa.Table,
    parsed: pa.Table,
    plan: VersionPlan,
    cluster: str,
    carried: pa.Table,
) -> pa.Table:
    """The ``ledgers`` rows of the plan's new versions (placement still unset); ``carried``: the current
    rows' columns a new version keeps (``ledger_id`` and :data:`streaming.sink_batch.CARRIED_COLUMNS`)."""
    taken = pa.array(plan.final, pa.int64())
    ids = decisions.column("ledger_id").take(taken).combine_chunks()
    fields = parsed.take(taken)
    n = len(ids)
    columns: dict[str, Any] = {
        "ledger_id": ids,
        "ledger_bucket": pa.array((ids.to_numpy() % LEDGER_BUCKETS).astype(np.int32)),
        "cluster": pa.array(np.full(n, cluster, object), pa.string()),
        "segments": fields.column("segments"),
        "bookies": _distinct_bookies(fields.column("segments").combine_chunks()),
        "custom_metadata": _custom_values(fields.column("custom_metadata").combine_chunks()),
        "znode_version": fields.column("version"),
        "deleted": pa.array(np.zeros(n, bool)),
        "updated_at": pa.array(plan.final_at_ms * 1000, pa.int64()).cast(_TIMESTAMP),
    }
    for name in fields.column_names:
        if name in LEDGERS.schema.names and name not in columns:
            columns[name] = fields.column(name)
    at = pc.index_in(ids, value_set=carried.column("ledger_id"))  # null where the ledger is new
    for name in carried.column_names:
        if name != "ledger_id":
            columns[name] = carried.column(name).combine_chunks().take(at)
    return pa.Table.from_arrays([_column(columns, f, n) for f in LEDGERS.schema], schema=LEDGERS.schema)


def _column(columns: Mapping[str, Any], target: pa.Field, n: int) -> pa.Array:
    value = columns.get(target.name)
    return pa.nulls(n, target.type) if value is None else value.cast(target.type)


def _distinct_bookies(segments: pa.ListArray) -> pa.ListArray:
    """Per ledger, every bookie its segments name, sorted and once each (as ``ledgers.bookies``)."""
    ensembles = pc.list_flatten(segments).field("ensemble")
    members = pc.list_flatten(ensembles)
    member_ledger = pc.list_parent_indices(segments).to_numpy()[pc.list_parent_indices(ensembles).to_numpy()]
    encoded = pc.dictionary_encode(members)
    names = np.asarray(encoded.dictionary.to_pylist(), dtype=object)
    rank = np.empty(len(names), np.int64)
    rank[np.argsort(names, kind="stable")] = np.arange(len(names))
    width = max(len(names), 1)
    keys = np.unique(member_ledger * width + rank[encoded.indices.to_numpy()])
    ledger, position = keys // width, keys % width
    offsets = np.r_[0, np.cumsum(np.bincount(ledger, minlength=len(segments)))].astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.sort(names)[position], pa.string()))


def _custom_values(entries: pa.ListArray) -> pa.ListArray:
    """Custom metadata as ``ledgers`` stores it: the base64 values decoded (the keys as they are)."""
    flat = pc.list_flatten(entries)
    values = [binascii.a2b_base64(v or "") for v in flat.field("value_b64").to_pylist()]
    pairs = pa.StructArray.from_arrays(
        [flat.field("key"), pa.array(values, pa.binary())], names=["key", "value"]
    )
    offsets = pc.fill_null(entries, pa.scalar([], entries.type)).offsets
    return pa.ListArray.from_arrays(offsets, pairs)


def snapshot_sightings(decisions: pa.Table, parsed: pa.Table, seen: np.ndarray, partitions: int) -> pa.Table:
    """``snapshot_seen`` rows of the seen rows that a snapshot reported."""
    chosen = pa.array(np.flatnonzero(seen), pa.int64())
    snapshot = parsed.column("snapshot_id").take(chosen)
    in_snapshot = pc.is_valid(snapshot)
    ids = decisions.column("ledger_id").take(chosen).filter(in_snapshot)
    keys = [b"ledger/%d" % i for i in ids.to_pylist()]
    return pa.table(
        {
            "snapshot_id": snapshot.filter(in_snapshot),
            "kafka_partition": pa.array(partitions_for_keys(keys, partitions), pa.int32()),
            "ledger_id": ids,
        },
        schema=SNAPSHOT_SEEN.schema,
    )


def adhering_versions(
    rows: pa.Table, racks: Mapping[str, str | None], policy: PlacementPolicyConfig
) -> np.ndarray:
    """Per row: whether its placement needs no per-ledger look (a ledger that is not closed has none; a
    closed one passes the rack-aware screen). Other policies are always judged per ledger."""
    closed = pc.fill_null(pc.equal(rows.column("state"), "CLOSED"), False).to_numpy(zero_copy_only=False)
    if policy.policy != "rackaware" or not closed.any():
        return ~closed
    segments = rows.column("segments").combine_chunks()
    ensembles = pc.list_flatten(segments).field("ensemble")
    members = pc.dictionary_encode(pc.list_flatten(ensembles))
    member_codes = rack_codes(members.dictionary.to_pylist(), racks)
    screened = rackaware_screen_codes(
        member_codes[members.indices.to_numpy()] if len(members) else np.zeros(0, np.int64),
        pc.list_value_length(ensembles).to_numpy(zero_copy_only=False).astype(np.int64),
        pc.list_parent_indices(segments).to_numpy(),
        pc.fill_null(rows.column("write_quorum"), 0).to_numpy(zero_copy_only=False).astype(np.int64),
        DEFAULT_RACK_CODE,
        min_racks_per_write_quorum=policy.min_racks_per_write_quorum,
        enforce_min_racks_per_write_quorum=policy.enforce_min_racks_per_write_quorum,
    )
    return ~closed | screened


def isolation_violating_versions(
    rows: pa.Table, groups: Mapping[str, str | None], writable: Collection[str]
) -> np.ndarray:
    """Per row: whether a member is outside the affinity groups its isolation config allows (the config
    in custom metadata, decoded once per distinct value; one that does not decode is not judged here)."""
    violating = np.zeros(rows.num_rows, bool)
    custom = rows.column("custom_metadata").combine_chunks()
    entries = pc.list_flatten(custom)
    if not len(entries) or not any(groups.values()):
        return violating
    is_config = pc.fill_null(pc.equal(entries.field("key"), ISOLATION_METADATA_KEY), False)
    positions = np.flatnonzero(is_config.to_numpy(zero_copy_only=False))
    if not len(positions):
        return violating
    owner = pc.list_parent_indices(custom).to_numpy()
    backwards = positions[::-1]  # the last value of a key wins, as BookKeeper reads custom metadata
    _, first = np.unique(owner[backwards], return_index=True)
    chosen = backwards[first]
    values = pc.dictionary_encode(entries.field("value").take(pa.array(chosen)))
    configs: list[IsolationGroups] = []
    index_of_value = np.full(len(values.dictionary), -1, np.int64)
    for position, value in enumerate(values.dictionary.to_pylist()):
        decoded = _decoded_or_none(value)
        if decoded is not None:
            index_of_value[position] = len(configs)
            configs.append(decoded)
    ledger_config = np.full(rows.num_rows, -1, np.int64)
    ledger_config[owner[chosen]] = index_of_value[values.indices.to_numpy()]
    if not configs:
        return violating
    segments = rows.column("segments").combine_chunks()
    ensembles = pc.list_flatten(segments).field("ensemble")
    members = pc.dictionary_encode(pc.list_flatten(ensembles))
    ensemble_ledger = pc.list_parent_indices(segments).to_numpy()
    return isolation_screen_columns(
        members.dictionary.to_pylist(),
        members.indices.to_numpy() if len(members) else np.zeros(0, np.int64),
        ensemble_ledger[pc.list_parent_indices(ensembles).to_numpy()],
        ledger_config,
        pc.fill_null(rows.column("ensemble_size"), 0).to_numpy(zero_copy_only=False).astype(np.int64),
        configs,
        groups,
        writable,
    )


def _decoded_or_none(value: bytes | None) -> IsolationGroups | None:
    try:
        return None if value is None else decode_isolation_config(value)
    except FormatError:
        return None


class LazyRows(Mapping[int, Any]):
    """Values by ledger id: a dict's, and for further ids (none of the dict's) values built only when one
    is asked for; for a reader that usually needs only the ids, such as the loss owner with nothing lost.

    Example:
        >>> rows = LazyRows({1: "a"}, np.array([2, 3]), lambda: ["b", "c"])
        >>> len(rows), sorted(rows), rows[3]
        (3, [1, 2, 3], 'c')
    """

    def __init__(self, rows: Mapping[int, Any], ids: np.ndarray, load: Callable[[], list[Any]]) -> None:
        self._rows = rows
        self._ids = ids
        self._load = load
        self._loaded: dict[int, Any] | None = None

    def __getitem__(self, ledger_id: int) -> Any:
        if ledger_id in self._rows:
            return self._rows[ledger_id]
        if self._loaded is None:
            self._loaded = dict(zip(self._ids.tolist(), self._load(), strict=True))
        return self._loaded[ledger_id]

    def __iter__(self) -> Iterator[int]:
        yield from self._rows
        yield from self._ids.tolist()

    def __len__(self) -> int:
        return len(self._rows) + len(self._ids)
