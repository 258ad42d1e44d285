"""The vectorised lost-bookie rule agrees with the per-ledger rule (``LedgerMetadata.is_recoverable``).

The oracle reads a row exactly as the sink read it before the rule was vectorised: a password-less
:class:`LedgerMetadata` from the row (format version absent → 3, a ledger that is not closed has last entry
-1 and length 0), ``is_recoverable`` over the lost bookies it names, ten ``unrecoverable_entries`` as the
sample, and LEDGER_UNDER_REPLICATED for a row that is not valid metadata. Rows are generated in batches so
one ledger's columns can never leak into its neighbour's verdict.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from core.domain.ledger_alerts import verdict_conditions_table
from core.domain.metadata import LedgerMetadata, LedgerState, Segment
from core.domain.rules.lost_ledgers import (
    LOST_BOOKIE_INPUT_SCHEMA,
    VERDICT_SCHEMA,
    WHAT_IF_SCHEMA,
    lost_bookie_verdicts,
    what_if_verdicts,
)
from core.errors import FormatError

POOL = ["b0:3181", "b1:3181", "b2:3181", "b3:3181", "b4:3181", "b5:3181"]


def row_metadata(row: dict[str, Any]) -> LedgerMetadata | None:
    """The row read as the sink reads it, or None when it is not valid metadata."""
    segments = [(s["first_entry_id"], list(s["ensemble"])) for s in row["segments"] or []]
    try:
        closed = row["state"] == "CLOSED"
        return LedgerMetadata(
            format_version=int(row["format_version"] or 3),
            ensemble_size=int(row["ensemble_size"]),
            write_quorum=int(row["write_quorum"]),
            ack_quorum=int(row["ack_quorum"]),
            state=LedgerState(row["state"]),
            last_entry_id=int(row["last_entry_id"]) if closed else -1,
            length=int(row["length"] or 0) if closed else 0,
            segments=tuple(Segment(int(first), tuple(ensemble)) for first, ensemble in segments),
        )
    except (FormatError, KeyError, ValueError, TypeError):
        return None


def named_lost(row: dict[str, Any], lost: set[str]) -> list[str]:
    return sorted({b for s in row["segments"] or [] for b in s["ensemble"]} & lost)


def per_ledger_condition(row: dict[str, Any], lost: set[str]) -> tuple[str, dict[str, Any]] | None:
    """The rule for one ledger through :class:`LedgerMetadata` (what the simulator asks of one ledger)."""
    named = named_lost(row, lost)
    if not named or not row["state"]:
        return None
    detail: dict[str, Any] = {"lost_bookies": named}
    metadata = row_metadata(row)
    if metadata is None:
        return "LEDGER_UNDER_REPLICATED", detail
    if metadata.is_recoverable(named):
        return "LEDGER_UNDER_REPLICATED", detail
    detail["unrecoverable_entries_sample"] = list(metadata.unrecoverable_entries(named, limit=10))
    return "LEDGER_UNRECOVERABLE", detail


@st.composite
def valid_rows(draw: st.DrawFn, ledger_id: int) -> dict[str, Any]:
    """A ledger row :class:`LedgerMetadata` accepts: any state, quorums, segments and last entry."""
    size = draw(st.integers(1, 5))
    write_quorum = draw(st.integers(1, size))
    ack_quorum = draw(st.integers(1, write_quorum))
    state = draw(st.sampled_from(["OPEN", "IN_RECOVERY", "CLOSED", "CLOSED"]))
    version = draw(st.sampled_from([None, 2, 3, 3] + ([1] if write_quorum == ack_quorum else [])))
    big = draw(st.booleans()) and draw(st.booleans())
    gaps = draw(st.lists(st.integers(1, 2**40 if big else 12), max_size=3))
    firsts = [0]
    for gap in gaps:
        firsts.append(firsts[-1] + gap)
    segments = [
        {
            "first_entry_id": first,
            "ensemble": draw(st.lists(st.sampled_from(POOL), min_size=size, max_size=size)),
        }
        for first in firsts
    ]
    last = draw(st.one_of(st.integers(-1, firsts[-1] + 30), st.sampled_from([-1, 0])))
    return {
        "ledger_id": ledger_id,
        "state": state,
        "format_version": version,
        "ensemble_size": size,
        "write_quorum": write_quorum,
        "ack_quorum": ack_quorum,
        "last_entry_id": last if state == "CLOSED" else draw(st.sampled_from([-1, -1, last])),
        "length": draw(st.sampled_from([None, 0, 100])),
        "segments": segments,
    }


def _with_member(row: dict[str, Any], segment: int, position: int, member: str | None) -> dict[str, Any]:
    segments = [dict(s, ensemble=list(s["ensemble"])) for s in row["segments"]]
    segments[segment]["ensemble"][position] = member
    return {**row, "segments": segments}


@st.composite
def broken_rows(draw: st.DrawFn, ledger_id: int) -> dict[str, Any]:
    """A valid row with exactly one thing metadata rejects (so no other fault hides it)."""
    row = draw(valid_rows(ledger_id))
    size, segments = row["ensemble_size"], row["segments"]
    segment = draw(st.integers(0, len(segments) - 1))
    position = draw(st.integers(0, size - 1))
    fault = draw(
        st.sampled_from(
            [
                "write quorum above ensemble",
                "ack quorum above write quorum",
                "zero ack quorum",
                "unknown state",
                "empty state",
                "no state",
                "unknown version",
                "v1 with its own ack quorum",
                "v1 first bookie CLOSED",
                "first segment not at 0",
                "segments out of order",
                "ensemble of the wrong size",
                "invalid bookie id",
                "no bookie id",
                "closed without last entry",
                "closed before entry -1",
                "negative length",
                "no segments",
            ]
        )
    )
    if fault == "write quorum above ensemble":
        return {**row, "write_quorum": size + draw(st.integers(1, 2))}
    if fault == "ack quorum above write quorum":
        return {**row, "ack_quorum": row["write_quorum"] + 1}
    if fault == "zero ack quorum":
        return {**row, "ack_quorum": 0}
    if fault == "unknown state":
        return {**row, "state": "BOGUS"}
    if fault == "empty state":
        return {**row, "state": ""}
    if fault == "no state":
        return {**row, "state": None}
    if fault == "unknown version":
        return {**row, "format_version": draw(st.sampled_from([4, -1]))}
    if fault == "v1 with its own ack quorum":
        assume(size >= 2)
        return {**row, "format_version": 1, "write_quorum": 2, "ack_quorum": 1}
    if fault == "v1 first bookie CLOSED":
        return {
            **_with_member(row, segment, 0, "CLOSED"),
            "format_version": 1,
            "ack_quorum": row["write_quorum"],
        }
    if fault == "first segment not at 0":
        moved = [dict(s) for s in segments]
        moved[0]["first_entry_id"] = draw(st.sampled_from([-1, 1]))
        return {**row, "segments": moved}
    if fault == "segments out of order":
        assume(len(segments) > 1)
        moved = [dict(s) for s in segments]
        moved[-1]["first_entry_id"] = moved[-2]["first_entry_id"] - draw(st.integers(0, 1))
        return {**row, "segments": moved}
    if fault == "ensemble of the wrong size":
        resized = [dict(s) for s in segments]
        ensemble = list(resized[segment]["ensemble"])
        resized[segment]["ensemble"] = ensemble[:-1] if draw(st.booleans()) else [*ensemble, POOL[0]]
        return {**row, "segments": resized}
    if fault == "invalid bookie id":
        return _with_member(row, segment, position, draw(st.sampled_from(["readonly", "ReadOnly", "bad id"])))
    if fault == "no bookie id":
        return _with_member(row, segment, position, None)
    if fault == "closed without last entry":
        return {**row, "state": "CLOSED", "last_entry_id": None}
    if fault == "closed before entry -1":
        return {**row, "state": "CLOSED", "last_entry_id": -2}
    if fault == "negative length":
        return {**row, "state": "CLOSED", "length": -1}
    return {**row, "segments": []}


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[dict[str, Any]], set[str]]:
    count = draw(st.integers(1, 8))
    rows = [draw(st.one_of(valid_rows(i), valid_rows(i), broken_rows(i))) for i in range(count)]
    lost = set(draw(st.lists(st.sampled_from([*POOL, "readonly", "CLOSED"]), max_size=4)))
    return rows, lost


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_vectorised_and_per_ledger_rules_agree(batch: tuple[list[dict[str, Any]], set[str]]) -> None:
    rows, lost = batch
    verdicts = lost_bookie_verdicts(pa.Table.from_pylist(rows, schema=LOST_BOOKIE_INPUT_SCHEMA), lost)
    assert verdicts.schema == VERDICT_SCHEMA
    assert verdicts.column("ledger_id").to_pylist() == [row["ledger_id"] for row in rows]
    conditions = verdict_conditions_table(verdicts, np.zeros(len(rows), np.int64), pa.nulls(len(rows)))
    for row, verdict, condition in zip(rows, verdicts.to_pylist(), conditions.to_pylist(), strict=True):
        alerted = (condition["kind"], json.loads(condition["detail"])) if condition["kind"] else None
        assert alerted == per_ledger_condition(row, lost), (row, lost)
        named = {b for s in row["segments"] for b in s["ensemble"]} & lost
        assert verdict["lost_bookies"] == sorted(named)
        metadata = row_metadata(row) if named and row["state"] else None
        expected_fewest = metadata.fewest_copies_left(named) if metadata is not None else None
        assert verdict["fewest_copies_left"] == expected_fewest, (row, lost)


def copies_by_entry(metadata: LedgerMetadata, lost: set[str]) -> list[int]:
    """Brute force: for every entry the ledger holds (for an open last segment, one entry of each write
    set), the members of its write set that are not lost."""
    size, quorum = metadata.ensemble_size, metadata.write_quorum
    copies = []
    for segment in metadata.segment_ranges():
        last = segment.first_entry_id + size - 1 if segment.is_open_ended else segment.last_entry_id
        for entry_id in range(segment.first_entry_id, (last if last is not None else -1) + 1):
            write_set = [segment.ensemble[(entry_id + i) % size] for i in range(quorum)]
            copies.append(sum(1 for member in write_set if member not in lost))
    return copies


@settings(max_examples=300, deadline=None)
@given(valid_rows(1), st.sets(st.sampled_from(POOL), max_size=4))
def test_fewest_copies_left_is_the_fewest_of_any_entry(row: dict[str, Any], lost: set[str]) -> None:
    assume(all(s["first_entry_id"] < 200 for s in row["segments"]))
    metadata = row_metadata(row)
    assert metadata is not None
    copies = copies_by_entry(metadata, lost)
    assert metadata.fewest_copies_left(lost) == (min(copies) if copies else None)


def closed(ledger_id: int, size: int, wq: int, aq: int, last: int, *segments: tuple[int, list[str]]) -> dict:
    return {
        "ledger_id": ledger_id,
        "state": "CLOSED",
        "ensemble_size": size,
        "write_quorum": wq,
        "ack_quorum": aq,
        "last_entry_id": last,
        "segments": [{"first_entry_id": f, "ensemble": e} for f, e in segments],
    }


def verdicts_of(rows: list[dict[str, Any]], lost: set[str]) -> list[tuple[Any, ...]]:
    table = lost_bookie_verdicts(pa.Table.from_pylist(rows, schema=LOST_BOOKIE_INPUT_SCHEMA), lost)
    return [(v["kind"], v["lost_bookies"], v["unrecoverable_entries_sample"]) for v in table.to_pylist()]


def test_open_segment_uses_the_ack_quorum_rule() -> None:
    # E=3 WQ=3 AQ=2: two lost bookies leave every entry a copy, but recovery can never close the ledger.
    open_ledger = {**closed(1, 3, 3, 2, -1, (0, ["a", "b", "c"])), "state": "OPEN"}
    assert verdicts_of([open_ledger], {"a", "b"}) == [("LEDGER_UNRECOVERABLE", ["a", "b"], [])]
    assert verdicts_of([open_ledger], {"a"}) == [("LEDGER_UNDER_REPLICATED", ["a"], None)]
    # The same ledger closed keeps every entry: under-replicated only.
    assert verdicts_of([closed(1, 3, 3, 2, 9, (0, ["a", "b", "c"]))], {"a", "b"})[0][0] == (
        "LEDGER_UNDER_REPLICATED"
    )


def test_sample_lists_the_smallest_lost_entries_across_segments() -> None:
    # WQ=1: every entry on a lost bookie is gone; entries 0..4 on [a, b], 5..9 on [c, a].
    row = closed(1, 2, 1, 1, 9, (0, ["a", "b"]), (5, ["c", "a"]))
    assert verdicts_of([row], {"a"}) == [("LEDGER_UNRECOVERABLE", ["a"], [0, 2, 4, 5, 7, 9])]


def test_a_ledger_naming_no_lost_bookie_or_without_state_has_no_verdict() -> None:
    rows = [closed(1, 1, 1, 1, 3, (0, ["a"])), {**closed(2, 1, 1, 1, 3, (0, ["b"])), "state": None}]
    assert verdicts_of(rows, {"b"}) == [(None, [], None), (None, ["b"], None)]
    assert verdicts_of(rows, set()) == [(None, [], None), (None, [], None)]


def test_a_single_string_is_refused_as_the_lost_set() -> None:
    with pytest.raises(TypeError, match="not a single string"):
        lost_bookie_verdicts(pa.Table.from_pylist([], schema=LOST_BOOKIE_INPUT_SCHEMA), "b1:3181")  # type: ignore[arg-type]


def test_text_columns_of_either_physical_type_are_read() -> None:
    # Delta files written by a MERGE hold string_view columns.
    row = closed(1, 2, 2, 2, 3, (0, ["a", "b"]))
    table = pa.Table.from_pylist([row], schema=LOST_BOOKIE_INPUT_SCHEMA)
    viewed = table.set_column(1, "state", table.column("state").cast(pa.string_view()))
    assert verdicts_of([row], {"a", "b"}) == [
        (v["kind"], v["lost_bookies"], v["unrecoverable_entries_sample"])
        for v in lost_bookie_verdicts(viewed, {"a", "b"}).to_pylist()
    ]


def per_ledger_what_if(row: dict[str, Any], down: set[str]) -> str | None:
    """The what-if grade of one ledger through :class:`LedgerMetadata`."""
    condition = per_ledger_condition(row, down)
    if condition is None:
        return None
    if condition[0] == "LEDGER_UNRECOVERABLE":
        return "UNRECOVERABLE"
    metadata = row_metadata(row)
    fewest = metadata.fewest_copies_left(named_lost(row, down)) if metadata is not None else None
    return "BELOW_ACK_QUORUM" if fewest is not None and fewest < row["ack_quorum"] else "UNDER_REPLICATED"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_what_if_grades_each_ledger_as_the_per_ledger_rules_do(
    batch: tuple[list[dict[str, Any]], set[str]],
) -> None:
    rows, down = batch
    graded = what_if_verdicts(pa.Table.from_pylist(rows, schema=LOST_BOOKIE_INPUT_SCHEMA), down)
    assert graded.schema == WHAT_IF_SCHEMA
    assert graded.column("verdict").to_pylist() == [per_ledger_what_if(row, down) for row in rows], down


def test_what_if_separates_a_lost_copy_from_a_copy_below_the_ack_quorum() -> None:
    # E=3 WQ=3 AQ=2, entries 0..4: one bookie down leaves 2 copies, two leave 1, three leave none.
    row = closed(1, 3, 3, 2, 4, (0, ["a", "b", "c"]))
    table = pa.Table.from_pylist([row], schema=LOST_BOOKIE_INPUT_SCHEMA)
    answers = [what_if_verdicts(table, down).to_pylist()[0] for down in ({"a"}, {"a", "b"}, {"a", "b", "c"})]
    assert [(a["verdict"], a["fewest_copies_left"]) for a in answers] == [
        ("UNDER_REPLICATED", 2),
        ("BELOW_ACK_QUORUM", 1),
        ("UNRECOVERABLE", 0),
    ]
    assert answers[2]["unrecoverable_entries_sample"] == [0, 1, 2, 3, 4]
