"""Ledger alerts as Arrow columns: the open set, the transitions of a call, their Kafka records and rows.

A lost bookie fires tens of thousands of ``LEDGER_UNDER_REPLICATED`` alerts at once. Building an
:class:`~core.domain.alerts.Alert` object and a JSON document per ledger cost more than the rule itself,
so the loss owner keeps its ledger alerts here as columns and goes from verdicts to encoded records in bulk:

- :data:`OPEN_SCHEMA`: the open ledger alerts, one row each (a ledger has at most one of the ledger kinds
  open; the same rules as :class:`~core.domain.alert_book.AlertBook`: a condition that keeps holding keeps
  its alert and id, one that stops holding resolves, and one that starts holding fires under a new id);
- :data:`CONDITION_SCHEMA`: what one call decided per ledger (a kind, or null when nothing holds);
- :func:`ledger_transitions`: conditions against the open set → the transitions (:data:`TRANSITION_SCHEMA`,
  ordered like the book's: by ledger, then kind) and the open set after them;
- :func:`alert_records` and :func:`alert_rows`: the transitions as the ``(key, value)`` records of
  docs/alerts.md ("The alert object") and as ``open_alerts`` / ``violations`` rows. The values
  parse to exactly what :meth:`Alert.to_json <core.domain.alerts.Alert.to_json>` gives for the same
  alert (a property test holds the two to it); ``detail`` keys are sorted, as the tables store them.

Pure: Arrow, numpy, hashlib and json; no I/O, no Spark.

Example:
    >>> conditions = condition_table(
    ...     ledger_ids=[7], at_ms=[1_700_000_000_000], kinds=["LEDGER_UNDER_REPLICATED"],
    ...     bookies=[["b1"]], details=['{"lost_bookies":["b1"]}'], topics=[None])
    >>> fired, open_now = ledger_transitions("c1", empty_open(), conditions)
    >>> [(t["kind"], t["state"], t["ledger_id"]) for t in fired.to_pylist()], open_now.num_rows
    ([('LEDGER_UNDER_REPLICATED', 'firing', 7)], 1)
    >>> later = condition_table(ledger_ids=[7], at_ms=[1_700_000_060_000], kinds=[None],
    ...     bookies=[[]], details=[None], topics=[None])
    >>> resolved, open_now = ledger_transitions("c1", open_now, later)
    >>> resolved.column("alert_id").to_pylist() == fired.column("alert_id").to_pylist(), open_now.num_rows
    (True, 0)
    >>> key, value = alert_records("c1", resolved)[0]
    >>> key, json.loads(value)["state"], json.loads(value)["detected_at"]
    (b'c1/ledger/7', 'resolved', '2023-11-14T22:14:20.000Z')
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.domain.alerts import AlertKind, AlertState, rfc3339_ms

#: The ledger kinds, in the order a ledger's transitions are listed (the book's order).
LEDGER_KINDS = (AlertKind.LEDGER_UNDER_REPLICATED.value, AlertKind.LEDGER_UNRECOVERABLE.value)

#: The open ledger alerts. ``detail`` is the alert's detail as compact JSON with sorted keys.
OPEN_SCHEMA = pa.schema(
    [
        ("alert_id", pa.string()),
        ("kind", pa.string()),
        ("ledger_id", pa.int64()),
        ("bookies", pa.list_(pa.string())),
        ("pulsar_topic", pa.string()),
        ("started_at_ms", pa.int64()),
        ("detected_at_ms", pa.int64()),
        ("detail", pa.string()),
    ]
)
#: A call's transitions: the open columns plus the state (``firing`` or ``resolved``).
TRANSITION_SCHEMA = pa.schema([*OPEN_SCHEMA, pa.field("state", pa.string())])
#: One row per evaluated ledger (each ledger once). ``kind`` null: no condition holds, so whatever is open
#: resolves; ``resolution``: a reason added to the detail of the alerts it resolves (``ledger deleted``).
CONDITION_SCHEMA = pa.schema(
    [
        ("ledger_id", pa.int64()),
        ("at_ms", pa.int64()),
        ("kind", pa.string()),
        ("bookies", pa.list_(pa.string())),
        ("detail", pa.string()),
        ("pulsar_topic", pa.string()),
        ("resolution", pa.string()),
    ]
)


def empty_open() -> pa.Table:
    """An open set with no alert.

    Example:
        >>> empty_open().num_rows
        0
    """
    return OPEN_SCHEMA.empty_table()


def open_from_rows(rows: pa.Table) -> pa.Table:
    """``open_alerts`` rows of the ledger kinds (as :func:`alert_rows` writes them) as an open set.

    Example:
        >>> fired, _ = ledger_transitions("c", empty_open(), condition_table(ledger_ids=[3], at_ms=[9],
        ...     kinds=["LEDGER_UNDER_REPLICATED"], bookies=[["b1"]], details=["{}"], topics=[None]))
        >>> open_from_rows(alert_rows("c", fired)).to_pylist()[0]["started_at_ms"]
        9
    """

    def epoch_ms(name: str) -> pa.Array:
        # Truncated to milliseconds, as the per-object form reads them.
        moments = pc.cast(rows.column(name), pa.timestamp("ms", tz="UTC"), safe=False)
        return pc.cast(moments, pa.int64())

    columns = {
        "alert_id": rows.column("alert_id"),
        "kind": rows.column("kind"),
        "ledger_id": rows.column("ledger_id"),
        "bookies": rows.column("bookies"),
        "pulsar_topic": rows.column("pulsar_topic"),
        "started_at_ms": epoch_ms("started_at"),
        "detected_at_ms": epoch_ms("detected_at"),
        "detail": _canonical_details(rows.column("detail")),
    }
    return pa.table(columns).cast(OPEN_SCHEMA).combine_chunks()


def _canonical_details(details: pa.ChunkedArray) -> pa.Array:
    """Stored details as :func:`detail_json` writes them (rows written by other code may differ in spacing
    or key order; an empty detail is ``{}``)."""
    return _per_distinct(pc.cast(details, pa.string()), lambda text: detail_json(json.loads(text or "{}")))


def detail_json(detail: dict[str, Any]) -> str:
    """A detail object as the columns hold it: compact JSON, sorted keys (as the tables store it).

    Example:
        >>> detail_json({"b": 1, "a": [2]})
        '{"a":[2],"b":1}'
    """
    return json.dumps(detail, separators=(",", ":"), sort_keys=True)


def condition_table(
    *,
    ledger_ids: Sequence[int] | np.ndarray,
    at_ms: Sequence[int] | np.ndarray,
    kinds: Sequence[str | None] | pa.Array,
    bookies: Sequence[Sequence[str]] | pa.Array,
    details: Sequence[str | None] | pa.Array,
    topics: Sequence[str | None] | pa.Array,
    resolutions: Sequence[str | None] | pa.Array | None = None,
) -> pa.Table:
    """Columns (sequences or Arrow arrays, one entry per ledger) as a :data:`CONDITION_SCHEMA` table.

    Example:
        >>> condition_table(ledger_ids=[1], at_ms=[5], kinds=[None], bookies=[[]], details=[None],
        ...                 topics=[None]).column("resolution").to_pylist()
        [None]
    """
    rows = len(ledger_ids)
    columns = [
        ledger_ids,
        at_ms,
        kinds,
        bookies,
        details,
        topics,
        resolutions if resolutions is not None else pa.nulls(rows, pa.string()),
    ]
    arrays = [_as_array(column, field.type) for column, field in zip(columns, CONDITION_SCHEMA, strict=True)]
    return pa.Table.from_arrays(arrays, schema=CONDITION_SCHEMA)


def verdict_conditions_table(verdicts: pa.Table, at_ms: np.ndarray, topics: pa.Array) -> pa.Table:
    """The lost-bookie rule's verdicts (:data:`~core.domain.rules.lost_ledgers.VERDICT_SCHEMA`) as
    conditions: the detail ``{"lost_bookies": [...]}``, plus the sample for ``LEDGER_UNRECOVERABLE``.

    Example:
        >>> from core.domain.rules.lost_ledgers import VERDICT_SCHEMA
        >>> verdicts = pa.Table.from_pylist([
        ...     {"ledger_id": 1, "kind": None, "lost_bookies": []},
        ...     {"ledger_id": 2, "kind": "LEDGER_UNRECOVERABLE", "lost_bookies": ["b1"],
        ...      "unrecoverable_entries_sample": [0, 2]}], schema=VERDICT_SCHEMA)
        >>> table = verdict_conditions_table(verdicts, np.array([5, 5]), pa.nulls(2, pa.string()))
        >>> table.column("detail").to_pylist()
        [None, '{"lost_bookies":["b1"],"unrecoverable_entries_sample":[0,2]}']
    """
    kinds = verdicts.column("kind").combine_chunks()
    named = verdicts.column("lost_bookies").combine_chunks()
    details = _per_distinct_list(named, lambda names: detail_json({"lost_bookies": names}))
    unrecoverable = np.flatnonzero(_flags(pc.equal(kinds, LEDGER_KINDS[1])))
    if len(unrecoverable):
        samples = verdicts.column("unrecoverable_entries_sample").combine_chunks()
        detail_list = details.to_pylist()
        for row in unrecoverable.tolist():
            detail_list[row] = detail_json(
                {"lost_bookies": named[row].as_py(), "unrecoverable_entries_sample": samples[row].as_py()}
            )
        details = pa.array(detail_list, pa.string())
    details = pc.if_else(pc.is_valid(kinds), details, pa.scalar(None, pa.string()))
    return condition_table(
        ledger_ids=verdicts.column("ledger_id").combine_chunks(),
        at_ms=at_ms,
        kinds=kinds,
        bookies=named,
        details=details,
        topics=topics,
    )


def ledger_transitions(
    cluster: str, open_alerts: pa.Table, conditions: pa.Table
) -> tuple[pa.Table, pa.Table]:
    """The transitions ``conditions`` cause against ``open_alerts``, and the open set after them.

    Per ledger: an open alert of another kind than the one that holds now (or of any kind when none holds)
    resolves at ``max(at_ms, its detected time)``, keeping its id, bookies, topic and detail (plus the
    resolution reason, if any); the kind that holds fires at ``at_ms`` unless it is already open.
    """
    conditions = _unique_ledgers(conditions)
    resolved, kept = _resolutions(open_alerts, conditions)
    fired = _firings(cluster, conditions, kept)
    transitions = _by_ledger_and_kind(pa.concat_tables([resolved, fired]))
    still_open = open_alerts.filter(
        pc.invert(pc.is_in(open_alerts.column("alert_id"), resolved.column("alert_id")))
    )
    return transitions, pa.concat_tables([still_open, fired.drop_columns(["state"])])


def _unique_ledgers(conditions: pa.Table) -> pa.Table:
    ids = conditions.column("ledger_id").to_numpy()
    if len(np.unique(ids)) != len(ids):
        raise ValueError("conditions name a ledger more than once")
    return conditions.combine_chunks()


def _resolutions(open_alerts: pa.Table, conditions: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """The resolved transitions, and which condition rows keep their kind's alert open (no new firing)."""
    kept = np.zeros(conditions.num_rows, dtype=bool)
    touched = open_alerts.filter(pc.is_in(open_alerts.column("ledger_id"), conditions.column("ledger_id")))
    if not touched.num_rows:
        return TRANSITION_SCHEMA.empty_table(), kept
    where = pc.index_in(touched.column("ledger_id"), conditions.column("ledger_id")).to_numpy()
    new_kind = conditions.column("kind").take(pa.array(where, pa.int64()))
    same = _flags(pc.equal(new_kind, touched.column("kind")))
    kept[where[same]] = True
    ending, where = touched.filter(pa.array(~same)), where[~same]
    at_ms = conditions.column("at_ms").to_numpy()[where]
    detected = np.maximum(at_ms, ending.column("detected_at_ms").to_numpy())
    reasons = conditions.column("resolution").take(pa.array(where, pa.int64()))
    details = _with_resolutions(ending.column("detail"), reasons)
    resolved = ending.set_column(
        ending.schema.get_field_index("detected_at_ms"), "detected_at_ms", pa.array(detected)
    )
    resolved = resolved.set_column(resolved.schema.get_field_index("detail"), "detail", details)
    state = pa.array(np.full(resolved.num_rows, AlertState.RESOLVED.value, dtype=object), pa.string())
    return resolved.append_column("state", state).cast(TRANSITION_SCHEMA), kept


def _with_resolutions(details: pa.ChunkedArray, reasons: pa.Array) -> pa.Array:
    """Each detail with ``resolution`` added where a reason is given (few rows: deleted ledgers)."""
    merged = details.combine_chunks() if isinstance(details, pa.ChunkedArray) else details
    given = np.flatnonzero(_flags(pc.is_valid(reasons)))
    if not len(given):
        return merged
    values = merged.to_pylist()
    for row in given.tolist():
        values[row] = detail_json({**json.loads(values[row] or "{}"), "resolution": reasons[row].as_py()})
    return pa.array(values, pa.string())


def _firings(cluster: str, conditions: pa.Table, kept: np.ndarray) -> pa.Table:
    holds = _flags(pc.is_valid(conditions.column("kind")))
    firing = conditions.filter(pa.array(holds & ~kept))
    kinds = firing.column("kind")
    ledger_ids = firing.column("ledger_id")
    at_ms = firing.column("at_ms")
    ids = ledger_alert_ids(cluster, kinds, ledger_ids, at_ms)
    state = pa.array(np.full(firing.num_rows, AlertState.FIRING.value, dtype=object), pa.string())
    columns = {
        "alert_id": pa.array(ids, pa.string()),
        "kind": kinds,
        "ledger_id": ledger_ids,
        "bookies": firing.column("bookies"),
        "pulsar_topic": firing.column("pulsar_topic"),
        "started_at_ms": at_ms,
        "detected_at_ms": at_ms,
        "detail": firing.column("detail"),
        "state": state,
    }
    return pa.table(columns).cast(TRANSITION_SCHEMA)


def ledger_alert_ids(
    cluster: str, kinds: pa.ChunkedArray | pa.Array, ledger_ids: pa.ChunkedArray | pa.Array, at_ms: Any
) -> list[str]:
    """:func:`~core.domain.alerts.alert_id_of` of each ledger alert (``ledger/<id>``, started at ``at_ms``):
    the identities joined as columns, one SHA-256 per row.

    Example:
        >>> from core.domain.alerts import alert_id_of
        >>> ids = ledger_alert_ids("c1", pa.array(["LEDGER_UNDER_REPLICATED"]), pa.array([7]), pa.array([5]))
        >>> ids == [alert_id_of("c1", "LEDGER_UNDER_REPLICATED", "ledger/7", 5)]
        True
    """
    identities = pc.binary_join_element_wise(
        pa.scalar(cluster),
        kinds,
        pc.binary_join_element_wise(pa.scalar("ledger/"), pc.cast(ledger_ids, pa.string()), pa.scalar("")),
        pc.cast(at_ms, pa.string()),
        pa.scalar("\x1f"),
    )
    sha256 = hashlib.sha256
    return [sha256(identity).hexdigest()[:32] for identity in pc.cast(identities, pa.binary()).to_pylist()]


def _by_ledger_and_kind(transitions: pa.Table) -> pa.Table:
    rank = pc.index_in(transitions.column("kind"), pa.array(LEDGER_KINDS)).to_numpy(zero_copy_only=False)
    order = np.lexsort((rank, transitions.column("ledger_id").to_numpy()))
    return transitions.take(pa.array(order, pa.int64()))


# ------------------------------------------------------------------------------------------------ output


def alert_records(cluster: str, transitions: pa.Table) -> list[tuple[bytes, bytes]]:
    """The transitions as Kafka ``(key, value)`` records: key ``<cluster>/ledger/<id>``, value the alert
    object (docs/alerts.md, "The alert object") as UTF-8 JSON (fields in its order)."""
    if not transitions.num_rows:
        return []
    transitions = transitions.combine_chunks()
    kinds = transitions.column("kind")
    distinct_kinds = pc.unique(kinds)
    severities = pa.array([AlertKind(kind).severity for kind in distinct_kinds.to_pylist()], pa.string())
    detail = transitions.column("detail")
    no_detail = pc.fill_null(pc.equal(detail, ""), True)
    parts = [
        '{"alert_id":"',
        transitions.column("alert_id"),
        f'","cluster":{json.dumps(cluster, ensure_ascii=False)},"kind":"',
        kinds,
        '","state":"',
        transitions.column("state"),
        '","severity":"',
        severities.take(pc.index_in(kinds, distinct_kinds)),
        '","ledger_id":',
        pc.cast(transitions.column("ledger_id"), pa.string()),
        ',"bookies":',
        _per_distinct_list(transitions.column("bookies"), _json_list),
        ',"pulsar_topic":',
        _json_texts(transitions.column("pulsar_topic")),
        ',"detected_at":"',
        _per_distinct(transitions.column("detected_at_ms"), rfc3339_ms),
        '","detail":',
        pc.if_else(no_detail, pa.scalar("{}"), detail),
        "}",
    ]
    values = _joined(parts)
    keys = _joined([f"{cluster}/ledger/", pc.cast(transitions.column("ledger_id"), pa.string())])
    return list(zip(keys, values, strict=True))


def _joined(parts: Sequence[Any]) -> list[bytes]:
    """Text constants and string columns concatenated row by row, as UTF-8 bytes (one Arrow kernel)."""
    columns = [pa.scalar(part) if isinstance(part, str) else part for part in parts]
    joined = pc.binary_join_element_wise(*columns, pa.scalar(""))
    return pc.cast(joined, pa.binary()).to_pylist()


def _json_texts(texts: pa.Array) -> pa.Array:
    """Each text as a JSON string, as ``json.dumps(text, ensure_ascii=False)`` writes it (null as
    ``null``): quoted in bulk, and the few that need an escape (a quote, a backslash or a control
    character) one by one.

    Example:
        >>> _json_texts(pa.array(["a/b", None, 'say "x"'])).to_pylist()
        ['"a/b"', 'null', '"say \\\\"x\\\\""']
    """
    quoted = pc.binary_join_element_wise(pa.scalar('"'), texts, pa.scalar('"'), pa.scalar(""))
    escaped = pc.fill_null(pc.match_substring_regex(texts, r'["\\\x00-\x1f]'), False)
    if pc.any(escaped).as_py():
        where = np.flatnonzero(escaped.to_numpy(zero_copy_only=False))
        values = quoted.to_pylist()
        for row in where.tolist():
            values[row] = _json_text(texts[row].as_py())
        quoted = pa.array(values, pa.string())
    return pc.fill_null(quoted, "null")


def alert_rows(cluster: str, transitions: pa.Table) -> pa.Table:
    """The transitions as ``open_alerts`` / ``violations`` rows (the columns of
    :func:`~core.domain.alert_book.alert_to_row`; timestamps in UTC, milliseconds).

    Example:
        >>> alert_rows("c1", TRANSITION_SCHEMA.empty_table()).column_names[:4]
        ['alert_id', 'cluster', 'kind', 'state']
    """
    rows = transitions.num_rows
    kinds = transitions.column("kind")
    severities = pc.if_else(
        pc.equal(kinds, LEDGER_KINDS[1]),
        AlertKind.LEDGER_UNRECOVERABLE.severity,
        AlertKind.LEDGER_UNDER_REPLICATED.severity,
    )
    ids = pc.cast(transitions.column("ledger_id"), pa.string())
    entity = pc.binary_join_element_wise(pa.scalar("ledger/"), ids, pa.scalar(""))
    detected = pc.cast(transitions.column("detected_at_ms"), pa.timestamp("ms", tz="UTC"))
    return pa.table(
        {
            "alert_id": transitions.column("alert_id"),
            "cluster": pa.array(np.full(rows, cluster, dtype=object), pa.string()),
            "kind": kinds,
            "state": transitions.column("state"),
            "entity": entity,
            "severity": severities,
            "ledger_id": transitions.column("ledger_id"),
            "bookies": transitions.column("bookies"),
            "pulsar_topic": transitions.column("pulsar_topic"),
            "started_at": pc.cast(transitions.column("started_at_ms"), pa.timestamp("ms", tz="UTC")),
            "detected_at": detected,
            "detected_date": pc.cast(detected, pa.date32()),
            "detail": pc.fill_null(transitions.column("detail"), "{}"),
        }
    )


def transition_counts(transitions: pa.Table) -> dict[tuple[str, str], int]:
    """``(kind, state) → transitions``, for metrics and logs.

    Example:
        >>> transition_counts(TRANSITION_SCHEMA.empty_table())
        {}
    """
    counts: dict[tuple[str, str], int] = {}
    for kind, state in zip(
        transitions.column("kind").to_pylist(), transitions.column("state").to_pylist(), strict=True
    ):
        counts[(kind, state)] = counts.get((kind, state), 0) + 1
    return counts


# ----------------------------------------------------------------------------------------------- helpers


def _flags(mask: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean Arrow column as numpy (null reads as False)."""
    return np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False), dtype=bool)


def _as_array(column: Any, type_: pa.DataType) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if isinstance(column, pa.Array):
        return column if column.type == type_ else column.cast(type_)
    return pa.array(column, type_)


def _per_distinct(values: pa.ChunkedArray | pa.Array, encode: Any) -> pa.Array:
    """``encode`` of each value, computed once per distinct value (a loss has a handful of timestamps and
    topics shared by many ledgers)."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    distinct = pc.unique(values)
    encoded = pa.array([encode(v) for v in distinct.to_pylist()], pa.string())
    return encoded.take(pc.index_in(values, distinct))


def _per_distinct_list(lists: pa.ChunkedArray | pa.Array, encode: Any) -> pa.Array:
    """Like :func:`_per_distinct` for list-of-string values (joined with a separator no id contains)."""
    lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    joined = pc.binary_join(pc.fill_null(lists, pa.scalar([], lists.type)), "\x1f")
    distinct = pc.unique(joined)
    encoded = pa.array([encode(j.split("\x1f") if j else []) for j in distinct.to_pylist()], pa.string())
    return encoded.take(pc.index_in(joined, distinct))


def _json_list(names: list[str]) -> str:
    return json.dumps(names, ensure_ascii=False, separators=(",", ":"))


def _json_text(text: str | None) -> str:
    return json.dumps(text, ensure_ascii=False)


__all__ = [
    "CONDITION_SCHEMA",
    "LEDGER_KINDS",
    "OPEN_SCHEMA",
    "TRANSITION_SCHEMA",
    "alert_records",
    "alert_rows",
    "condition_table",
    "detail_json",
    "empty_open",
    "ledger_transitions",
    "transition_counts",
    "verdict_conditions_table",
]
