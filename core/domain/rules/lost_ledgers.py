"""The lost-bookie rule over many ledgers at once: Arrow columns in, one verdict per ledger out.

A ledger whose metadata names a lost bookie in any segment, open or closed, is ``LEDGER_UNDER_REPLICATED``,
or ``LEDGER_UNRECOVERABLE`` when losing those bookies loses data. The rule is exactly
:meth:`LedgerMetadata.is_recoverable <core.domain.metadata.LedgerMetadata.is_recoverable>` (the form a
single decoded ledger is asked with, by the simulator) and the property test in
``tests/unit/test_lost_ledgers.py`` holds the two forms to the same answers:

- a closed (or bounded) segment is unrecoverable when some entry in it has its whole write set lost;
- the open-ended last segment of a ledger that is not closed is unrecoverable when some write set of it lost
  ``ack_quorum`` or more bookies (BookKeeper's recovery can then never establish the last entry);
- a row that is not valid metadata (quorums out of order, segments out of order, a bad bookie id, ...) is
  ``LEDGER_UNDER_REPLICATED``: the lost bookie is named, nothing more can be said.

Work is numpy over whole columns (segments, ensemble members, write-set windows): no Python object per
ledger, which is what lets a loss reach tens of thousands of ledgers in a few tens of milliseconds.

Example:
    >>> ledgers = pa.Table.from_pylist([
    ...     {"ledger_id": 1, "state": "CLOSED", "ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2,
    ...      "last_entry_id": 9, "segments": [{"first_entry_id": 0, "ensemble": ["b1", "b2", "b3"]}]},
    ...     {"ledger_id": 2, "state": "OPEN", "ensemble_size": 2, "write_quorum": 2, "ack_quorum": 1,
    ...      "last_entry_id": -1, "segments": [{"first_entry_id": 0, "ensemble": ["b3", "b4"]}]},
    ... ], schema=LOST_BOOKIE_INPUT_SCHEMA)
    >>> lost_bookie_verdicts(ledgers, {"b1", "b2"}).to_pylist()[0]["kind"]
    'LEDGER_UNRECOVERABLE'
    >>> verdicts = lost_bookie_verdicts(ledgers, {"b1"}).to_pylist()
    >>> [(v["ledger_id"], v["kind"], v["lost_bookies"]) for v in verdicts]
    [(1, 'LEDGER_UNDER_REPLICATED', ['b1']), (2, None, [])]
"""

from __future__ import annotations

from collections.abc import Mapping, Set

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.domain.metadata import is_valid_bookie_id

UNDER_REPLICATED = "LEDGER_UNDER_REPLICATED"
UNRECOVERABLE = "LEDGER_UNRECOVERABLE"
#: How many unrecoverable entry ids a verdict lists (``detail.unrecoverable_entries_sample``).
SAMPLE_LIMIT = 10

_SEGMENT = pa.struct([("first_entry_id", pa.int64()), ("ensemble", pa.list_(pa.string()))])
#: The ledger columns the rule reads (the ``ledgers`` table's types; ``ledger_bookies`` rows carry them).
LOST_BOOKIE_INPUT_SCHEMA = pa.schema(
    [
        ("ledger_id", pa.int64()),
        ("state", pa.string()),
        ("format_version", pa.int32()),
        ("ensemble_size", pa.int32()),
        ("write_quorum", pa.int32()),
        ("ack_quorum", pa.int32()),
        ("last_entry_id", pa.int64()),
        ("length", pa.int64()),
        ("segments", pa.list_(_SEGMENT)),
    ]
)
#: One verdict per input row, in input order. ``kind`` is null when no condition holds; ``lost_bookies`` are
#: the lost bookies the ledger names (sorted); the sample is set for ``LEDGER_UNRECOVERABLE`` only;
#: ``fewest_copies_left`` is the fewest copies an entry of the ledger keeps (null when the ledger names no
#: lost bookie, its metadata is not valid, or it holds no entry), as ``LedgerMetadata.fewest_copies_left``.
VERDICT_SCHEMA = pa.schema(
    [
        ("ledger_id", pa.int64()),
        ("kind", pa.string()),
        ("lost_bookies", pa.list_(pa.string())),
        ("unrecoverable_entries_sample", pa.list_(pa.int64())),
        ("fewest_copies_left", pa.int32()),
    ]
)

_STATES = pa.array(["OPEN", "IN_RECOVERY", "CLOSED"])
_INT64_MAX = 2**63 - 1
_V1_CLOSED_TAG = "CLOSED"


def lost_bookie_verdicts(ledgers: pa.Table, lost: Set[str], *, sample_limit: int = SAMPLE_LIMIT) -> pa.Table:
    """The lost-bookie verdict of every row of ``ledgers`` (columns of :data:`LOST_BOOKIE_INPUT_SCHEMA`;
    others are ignored) given the ``lost`` bookies: a :data:`VERDICT_SCHEMA` table, one row per input row.

    Example:
        >>> one = pa.Table.from_pylist([{"ledger_id": 7, "state": "CLOSED", "ensemble_size": 2,
        ...     "write_quorum": 1, "ack_quorum": 1, "last_entry_id": 4,
        ...     "segments": [{"first_entry_id": 0, "ensemble": ["b1", "b2"]}]}],
        ...     schema=LOST_BOOKIE_INPUT_SCHEMA)
        >>> verdict = lost_bookie_verdicts(one, {"b2"}).to_pylist()[0]
        >>> verdict["kind"], verdict["lost_bookies"], verdict["unrecoverable_entries_sample"]
        ('LEDGER_UNRECOVERABLE', ['b2'], [1, 3])
    """
    if isinstance(lost, str):
        raise TypeError("lost must be a collection of bookie ids, not a single string")
    columns = _typed_columns(ledgers)
    rows = ledgers.num_rows
    lost_names = sorted(lost)
    if rows == 0 or not lost_names:
        return _verdict_table(
            columns["ledger_id"], pa.nulls(rows, pa.string()), _empty_lists(rows), None, None
        )
    shape = _Shape.of(columns)
    named, named_counts = _named_lost(shape, lost_names)
    state = columns["state"]
    has_state = pc.fill_null(pc.not_equal(state, ""), False).to_numpy(zero_copy_only=False)
    holds = (named_counts > 0) & has_state
    valid = _valid_metadata(columns, shape)
    closed = pc.fill_null(pc.equal(state, "CLOSED"), False).to_numpy(zero_copy_only=False)
    judged = holds & valid
    windows = _Windows.of(columns, shape, lost_names, judged, closed)
    unrecoverable = judged & windows.unrecoverable_ledgers(rows)
    no_kind = pa.scalar(None, pa.string())
    kinds = pc.if_else(unrecoverable, UNRECOVERABLE, pc.if_else(holds, UNDER_REPLICATED, no_kind))
    sample = windows.sample(unrecoverable, sample_limit)
    return _verdict_table(columns["ledger_id"], kinds, named, sample, windows.fewest_left)


#: What losing some bookies would do to one ledger, worst first (``what_if_verdicts``).
WHAT_IF_VERDICTS = ("UNRECOVERABLE", "BELOW_ACK_QUORUM", "UNDER_REPLICATED")
WHAT_IF_SCHEMA = pa.schema(
    [
        ("ledger_id", pa.int64()),
        ("verdict", pa.string()),
        ("lost_bookies", pa.list_(pa.string())),
        ("fewest_copies_left", pa.int32()),
        ("unrecoverable_entries_sample", pa.list_(pa.int64())),
    ]
)


def what_if_verdicts(ledgers: pa.Table, down: Set[str]) -> pa.Table:
    """What each ledger would suffer if the ``down`` bookies went away: the lost-bookie rule's verdict graded.

    ``UNRECOVERABLE`` when the rule says ``LEDGER_UNRECOVERABLE`` (some entry keeps no copy, or an open
    ledger could never be closed); ``BELOW_ACK_QUORUM`` when every entry keeps a copy but some keeps fewer
    than the ledger's ack quorum; ``UNDER_REPLICATED`` otherwise; null for a ledger that names none of them.
    One row per input row (:data:`WHAT_IF_SCHEMA`).

    Example:
        >>> rows = pa.Table.from_pylist([{"ledger_id": 7, "state": "CLOSED", "ensemble_size": 3,
        ...     "write_quorum": 3, "ack_quorum": 2, "last_entry_id": 4,
        ...     "segments": [{"first_entry_id": 0, "ensemble": ["b1", "b2", "b3"]}]}],
        ...     schema=LOST_BOOKIE_INPUT_SCHEMA)
        >>> [what_if_verdicts(rows, down).column("verdict")[0].as_py()
        ...  for down in ({"b1"}, {"b1", "b2"}, {"b1", "b2", "b3"})]
        ['UNDER_REPLICATED', 'BELOW_ACK_QUORUM', 'UNRECOVERABLE']
    """
    verdicts = lost_bookie_verdicts(ledgers, down)
    kind = verdicts.column("kind")
    fewest = verdicts.column("fewest_copies_left")
    ack_quorum = _typed_columns(ledgers)["ack_quorum"]
    below = pc.fill_null(pc.less(fewest, pc.cast(ack_quorum, pa.int32())), False)
    no_verdict = pa.scalar(None, pa.string())
    verdict = pc.if_else(
        pc.equal(kind, UNRECOVERABLE),
        "UNRECOVERABLE",
        pc.if_else(pc.is_null(kind), no_verdict, pc.if_else(below, "BELOW_ACK_QUORUM", "UNDER_REPLICATED")),
    )
    return pa.Table.from_arrays(
        [
            verdicts.column("ledger_id"),
            verdict,
            verdicts.column("lost_bookies"),
            fewest,
            verdicts.column("unrecoverable_entries_sample"),
        ],
        schema=WHAT_IF_SCHEMA,
    )


# ----------------------------------------------------------------------------------------------- columns


def _typed_columns(ledgers: pa.Table) -> dict[str, pa.Array]:
    """The input columns as single arrays of the canonical types (string_view and friends are cast)."""
    missing = [name for name in ("ledger_id", "state", "segments") if name not in ledgers.column_names]
    if missing:
        raise ValueError(f"the lost-bookie rule needs the column(s) {', '.join(missing)}")
    out: dict[str, pa.Array] = {}
    for field in LOST_BOOKIE_INPUT_SCHEMA:
        if field.name in ledgers.column_names:
            column = ledgers.column(field.name).cast(field.type)
            out[field.name] = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        else:
            out[field.name] = pa.nulls(ledgers.num_rows, field.type)
    return out


def _ints(array: pa.Array, fill: int) -> np.ndarray:
    return np.asarray(pc.fill_null(array, fill).to_numpy(zero_copy_only=False), dtype=np.int64)


class _Shape:
    """Segments and ensemble members flattened, with the ledger (row) each belongs to."""

    def __init__(
        self,
        segment_counts: np.ndarray,
        segment_ledger: np.ndarray,
        firsts: pa.Array,
        ensembles: pa.Array,
    ) -> None:
        self.segment_counts = segment_counts
        self.segment_ledger = segment_ledger
        self.segment_start = np.concatenate(([0], np.cumsum(segment_counts)[:-1])).astype(np.int64)
        self.segment_index = (
            np.arange(len(segment_ledger), dtype=np.int64) - self.segment_start[segment_ledger]
        )
        self.firsts = firsts
        self.ensembles = ensembles
        self.ensemble_lengths = _ints(pc.list_value_length(ensembles), 0)
        self.member_start = np.concatenate(([0], np.cumsum(self.ensemble_lengths))).astype(np.int64)
        self.members = ensembles.flatten()
        self.member_segment = np.asarray(pc.list_parent_indices(ensembles), dtype=np.int64)
        self.member_ledger = segment_ledger[self.member_segment]

    @classmethod
    def of(cls, columns: Mapping[str, pa.Array]) -> _Shape:
        segments = columns["segments"]
        counts = _ints(pc.list_value_length(segments), 0)
        flat = segments.flatten()
        return cls(
            counts,
            np.asarray(pc.list_parent_indices(segments), dtype=np.int64),
            pc.struct_field(flat, "first_entry_id"),
            pc.struct_field(flat, "ensemble"),
        )


def _named_lost(shape: _Shape, lost_names: list[str]) -> tuple[pa.Array, np.ndarray]:
    """Per ledger, the lost bookies it names in any segment (sorted, each once), and how many."""
    rows = len(shape.segment_counts)
    codes = pc.index_in(shape.members, value_set=pa.array(lost_names, pa.string()))
    on_lost = pc.is_valid(codes).to_numpy(zero_copy_only=False)
    width = len(lost_names)
    pairs = np.unique(shape.member_ledger[on_lost] * width + _ints(codes, 0)[on_lost])
    ledgers, names = pairs // width, pairs % width
    counts = np.bincount(ledgers, minlength=rows).astype(np.int64)
    offsets = pa.array(np.concatenate(([0], np.cumsum(counts))).astype(np.int32))
    values = pa.array(lost_names, pa.string()).take(pa.array(names, pa.int64()))
    return pa.ListArray.from_arrays(offsets, values), counts


def _any_per_ledger(flags: np.ndarray, owner: np.ndarray, rows: int) -> np.ndarray:
    return np.bincount(owner[flags], minlength=rows) > 0


def _valid_metadata(columns: Mapping[str, pa.Array], shape: _Shape) -> np.ndarray:
    """Rows :class:`LedgerMetadata` would accept (read as ``to_metadata`` reads a row; see the module doc)."""
    rows = len(shape.segment_counts)
    state = columns["state"]
    closed = pc.fill_null(pc.equal(state, "CLOSED"), False).to_numpy(zero_copy_only=False)
    known_state = pc.fill_null(pc.is_in(state, value_set=_STATES), False).to_numpy(zero_copy_only=False)
    version = _ints(columns["format_version"], 0)
    version = np.where(version == 0, 3, version)  # absent (or 0) reads as the current format
    ensemble_size, write_quorum, ack_quorum = (
        _ints(columns[name], 0) for name in ("ensemble_size", "write_quorum", "ack_quorum")
    )
    quorums = (ack_quorum >= 1) & (ack_quorum <= write_quorum) & (write_quorum <= ensemble_size)
    last_entry_id = columns["last_entry_id"]
    closed_ok = pc.is_valid(last_entry_id).to_numpy(zero_copy_only=False)
    closed_ok &= _ints(last_entry_id, -1) >= -1
    closed_ok &= _ints(columns["length"], 0) >= 0
    valid = known_state & np.isin(version, (1, 2, 3)) & quorums & (~closed | closed_ok)
    valid &= (version != 1) | (ack_quorum == write_quorum)  # v1 stores no ack quorum: it is WQ
    valid &= shape.segment_counts > 0
    return valid & ~_bad_segments(shape, ensemble_size, version == 1, rows)


def _bad_segments(shape: _Shape, ensemble_size: np.ndarray, version_1: np.ndarray, rows: int) -> np.ndarray:
    """Ledgers with a segment out of order, of the wrong size, or naming an invalid bookie id."""
    firsts = shape.firsts
    first = _ints(firsts, 0)
    previous = np.concatenate(([0], first[:-1]))
    position = shape.segment_index
    bad = ~pc.is_valid(firsts).to_numpy(zero_copy_only=False)
    bad |= (position == 0) & (first != 0)
    bad |= (position > 0) & (first <= previous)
    bad |= ~pc.is_valid(shape.ensembles).to_numpy(zero_copy_only=False)
    bad |= shape.ensemble_lengths != ensemble_size[shape.segment_ledger]
    bad_ledgers = _any_per_ledger(bad, shape.segment_ledger, rows)
    members = shape.members
    names = pc.unique(members).drop_null().to_pylist()
    invalid_names = [name for name in names if not is_valid_bookie_id(name)]
    bad_member = ~pc.is_valid(members).to_numpy(zero_copy_only=False)
    if invalid_names:
        bad_member |= pc.fill_null(pc.is_in(members, value_set=pa.array(invalid_names)), False).to_numpy(
            zero_copy_only=False
        )
    if version_1.any():  # the v1 text format reads a first bookie named CLOSED as the closing line
        first_member = np.arange(len(members), dtype=np.int64) == shape.member_start[shape.member_segment]
        closed_tag = pc.fill_null(pc.equal(members, _V1_CLOSED_TAG), False).to_numpy(zero_copy_only=False)
        bad_member |= first_member & closed_tag & version_1[shape.member_ledger]
    return bad_ledgers | _any_per_ledger(bad_member, shape.member_ledger, rows)


# ------------------------------------------------------------------------------------- write-set windows


class _Windows:
    """Every write-set window (segment, start index) of the judged ledgers with how many bookies it lost.

    Window ``s`` of a segment holds the members at ``s .. s+WQ-1`` (mod E): the write set of the entries
    ≡ s (mod E). Counts come from a running sum of lost flags over the flattened members, wrapping once.
    """

    def __init__(self) -> None:
        self.segment_unrecoverable = np.empty(0, dtype=bool)
        self.segment_ledger = np.empty(0, dtype=np.int64)
        self.fully_lost_first = np.empty(0, dtype=np.int64)  # first entry id of each fully lost window
        self.fully_lost_later = np.empty(0, dtype=np.int64)  # how many more entries that window has
        self.fully_lost_size = np.empty(0, dtype=np.int64)
        self.fully_lost_ledger = np.empty(0, dtype=np.int64)
        self.fewest_left: pa.Array | None = None  # per ledger: fewest copies an entry keeps (null: no entry)

    @classmethod
    def of(
        cls,
        columns: Mapping[str, pa.Array],
        shape: _Shape,
        lost_names: list[str],
        judged: np.ndarray,
        closed: np.ndarray,
    ) -> _Windows:
        windows = cls()
        segment_judged = judged[shape.segment_ledger]
        if not segment_judged.any():
            windows.segment_ledger = shape.segment_ledger
            windows.segment_unrecoverable = np.zeros(len(shape.segment_ledger), dtype=bool)
            return windows
        ledger = shape.segment_ledger
        size = _ints(columns["ensemble_size"], 1)[ledger]
        write_quorum = _ints(columns["write_quorum"], 1)[ledger]
        ack_quorum = _ints(columns["ack_quorum"], 1)[ledger]
        first, last, open_ended = _segment_ranges(columns, shape, closed)
        empty = ~open_ended & (last < first)

        flags = pc.fill_null(pc.is_in(shape.members, value_set=pa.array(lost_names)), False)
        running = np.concatenate(([0], np.cumsum(flags.to_numpy(zero_copy_only=False), dtype=np.int64)))
        member_judged = segment_judged[shape.member_segment]
        segment = shape.member_segment[member_judged]
        begin = shape.member_start[segment]
        window_start = np.flatnonzero(member_judged) - begin
        lost_count = _window_lost_counts(running, begin, window_start, size[segment], write_quorum[segment])

        worst = np.zeros(len(ledger), dtype=np.int64)
        np.maximum.at(worst, segment, lost_count)
        # A window holds entries when its first entry in the segment (ids are absolute) is in the segment's
        # range; the open-ended last segment of a ledger that is not closed holds every window.
        offset = np.mod(window_start - first[segment], size[segment])
        bound = np.where(open_ended[segment], _INT64_MAX, last[segment])
        exists = ~empty[segment] & (offset <= bound - first[segment])
        windows.fewest_left = _min_per_ledger(
            write_quorum[segment][exists] - lost_count[exists],
            ledger[segment][exists],
            len(shape.segment_counts),
        )
        # A window fully lost: its entries have no copy.
        fully = (lost_count == write_quorum[segment]) & exists
        full_segment = segment[fully]
        bounded_loss = np.bincount(full_segment, minlength=len(ledger)) > 0
        windows.segment_unrecoverable = np.where(open_ended, worst >= ack_quorum, bounded_loss & ~empty)
        windows.segment_ledger = ledger
        entry = first[full_segment] + offset[fully]
        windows.fully_lost_first = entry
        windows.fully_lost_size = size[full_segment]
        windows.fully_lost_later = (bound[fully] - entry) // windows.fully_lost_size
        windows.fully_lost_ledger = ledger[full_segment]
        return windows

    def unrecoverable_ledgers(self, rows: int) -> np.ndarray:
        return _any_per_ledger(self.segment_unrecoverable, self.segment_ledger, rows)

    def sample(self, unrecoverable: np.ndarray, limit: int) -> pa.Array:
        """Per ledger, the ``limit`` smallest entry ids whose whole write set is lost (UNRECOVERABLE rows)."""
        rows = len(unrecoverable)
        keep = unrecoverable[self.fully_lost_ledger] if len(self.fully_lost_ledger) else np.empty(0, bool)
        first, size = self.fully_lost_first[keep], self.fully_lost_size[keep]
        ledger = self.fully_lost_ledger[keep]
        # Every window lists at most `limit` entries: the smallest `limit` of the ledger are among them.
        take = (
            np.minimum(self.fully_lost_later[keep], limit - 1) + 1 if limit > 0 else np.zeros(len(first), int)
        )
        owner = np.repeat(np.arange(len(first), dtype=np.int64), take)
        step = np.arange(len(owner), dtype=np.int64) - np.repeat(np.cumsum(take) - take, take)
        entries = first[owner] + step * size[owner]
        entry_ledger = ledger[owner]
        order = np.lexsort((entries, entry_ledger))
        entries, entry_ledger = entries[order], entry_ledger[order]
        group_start = np.searchsorted(entry_ledger, entry_ledger, side="left")
        listed = (np.arange(len(entries)) - group_start) < limit
        counts = np.bincount(entry_ledger[listed], minlength=rows)
        offsets = pa.array(np.concatenate(([0], np.cumsum(counts))).astype(np.int32))
        values = pa.array(entries[listed], pa.int64())
        return pa.ListArray.from_arrays(offsets, values, mask=pa.array(~unrecoverable))


def _min_per_ledger(values: np.ndarray, owner: np.ndarray, rows: int) -> pa.Array:
    """Per row, the smallest of its ``values`` (null for a row that owns none)."""
    fewest = np.full(rows, _INT64_MAX, dtype=np.int64)
    np.minimum.at(fewest, owner, values)
    none = fewest == _INT64_MAX
    return pa.array(np.where(none, 0, fewest).astype(np.int32), pa.int32(), mask=none)


def _segment_ranges(
    columns: Mapping[str, pa.Array], shape: _Shape, closed: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(first, last, open_ended)`` per segment.

    Segment k covers ``[first_k, first_{k+1} - 1]``, clipped to the last entry when the ledger is closed; the
    last segment of a ledger that is not closed is open-ended.
    """
    ledger = shape.segment_ledger
    first = _ints(shape.firsts, 0)
    is_last = shape.segment_index == shape.segment_counts[ledger] - 1
    next_first = np.concatenate((first[1:], [0]))
    closed_segment = closed[ledger]
    ledger_last = _ints(columns["last_entry_id"], -1)[ledger]
    last = np.where(is_last, ledger_last, next_first - 1)
    last = np.where(closed_segment & ~is_last, np.minimum(last, ledger_last), last)
    open_ended = is_last & ~closed_segment
    return first, last, open_ended


def _window_lost_counts(
    running: np.ndarray, begin: np.ndarray, start: np.ndarray, size: np.ndarray, write_quorum: np.ndarray
) -> np.ndarray:
    """Lost members in each window ``start .. start+WQ-1`` (mod E) of an ensemble stored at ``begin``."""
    head_end = np.minimum(start + write_quorum, size)
    wrapped = start + write_quorum - head_end  # members taken from the ensemble's beginning
    return (running[begin + head_end] - running[begin + start]) + (running[begin + wrapped] - running[begin])


def _empty_lists(rows: int) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(np.zeros(rows + 1, dtype=np.int32)), pa.array([], pa.string()))


def _verdict_table(
    ledger_id: pa.Array, kinds: pa.Array, named: pa.Array, sample: pa.Array | None, fewest: pa.Array | None
) -> pa.Table:
    rows = len(ledger_id)
    if sample is None:
        sample = pa.nulls(rows, pa.list_(pa.int64()))
    if fewest is None:
        fewest = pa.nulls(rows, pa.int32())
    return pa.Table.from_arrays([ledger_id, kinds, named, sample, fewest], schema=VERDICT_SCHEMA)


__all__ = [
    "LOST_BOOKIE_INPUT_SCHEMA",
    "SAMPLE_LIMIT",
    "UNDER_REPLICATED",
    "UNRECOVERABLE",
    "VERDICT_SCHEMA",
    "WHAT_IF_SCHEMA",
    "WHAT_IF_VERDICTS",
    "lost_bookie_verdicts",
    "what_if_verdicts",
]
