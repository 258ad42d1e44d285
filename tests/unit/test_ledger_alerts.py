"""The columnar ledger alerts agree with the per-object alert book: same transitions, records and rows."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.alert_book import AlertBook, alert_to_row
from core.domain.alerts import AlertKind
from core.domain.ledger_alerts import (
    LEDGER_KINDS,
    OPEN_SCHEMA,
    alert_records,
    alert_rows,
    condition_table,
    detail_json,
    empty_open,
    ledger_transitions,
    open_from_rows,
    transition_counts,
    verdict_conditions_table,
)
from core.domain.rules.lost_ledgers import VERDICT_SCHEMA

CLUSTER = "c-ü"
BOOKIES = ["b1:3181", "b2:3181", "b3:3181"]
TOPICS = [None, "persistent://public/default/t", 'odd "topic" ü']


@st.composite
def condition_rows(draw: Any) -> list[dict[str, Any]]:
    """One call's conditions: each ledger at most once, any kind (or none), any resolution reason."""
    ledger_ids = draw(st.lists(st.integers(0, 12), unique=True, max_size=10))
    rows = []
    for ledger_id in sorted(ledger_ids):
        kind = draw(st.sampled_from([None, *LEDGER_KINDS]))
        named = sorted(draw(st.sets(st.sampled_from(BOOKIES), min_size=1))) if kind else []
        detail: dict[str, Any] | None = None
        if kind == LEDGER_KINDS[0]:
            detail = {"lost_bookies": named}
        elif kind == LEDGER_KINDS[1]:
            detail = {
                "lost_bookies": named,
                "unrecoverable_entries_sample": draw(st.lists(st.integers(0, 9))),
            }
        rows.append(
            {
                "ledger_id": ledger_id,
                "kind": kind,
                "bookies": named,
                "detail": detail,
                "topic": draw(st.sampled_from(TOPICS)),
                "resolution": None if kind else draw(st.sampled_from([None, "ledger deleted"])),
                "at_ms": draw(st.integers(1_700_000_000_000, 1_700_000_100_000)),
            }
        )
    return rows


def _apply_to_book(book: AlertBook, rows: list[dict[str, Any]]) -> None:
    """What the loss owner did per ledger before the columnar form (the reference)."""
    for row in rows:
        for kind_name in LEDGER_KINDS:
            holds = row["kind"] == kind_name
            reason = {"resolution": row["resolution"]} if row["resolution"] else None
            book.set_ledger_condition(
                AlertKind(kind_name),
                row["ledger_id"],
                holds,
                at_ms=row["at_ms"],
                bookies=row["bookies"] if holds else [],
                pulsar_topic=row["topic"],
                detail=row["detail"] if holds else reason,
            )


def _conditions(rows: list[dict[str, Any]]) -> pa.Table:
    return condition_table(
        ledger_ids=[r["ledger_id"] for r in rows],
        at_ms=[r["at_ms"] for r in rows],
        kinds=[r["kind"] for r in rows],
        bookies=[r["bookies"] for r in rows],
        details=[detail_json(r["detail"]) if r["detail"] else None for r in rows],
        topics=[r["topic"] for r in rows],
        resolutions=[r["resolution"] for r in rows],
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(condition_rows(), min_size=1, max_size=6))
def test_columnar_transitions_match_the_alert_book_call_after_call(calls: list[list[dict[str, Any]]]) -> None:
    open_now = empty_open()
    reference = AlertBook(CLUSTER)
    for rows in calls:
        reference.transitions = []
        _apply_to_book(reference, rows)
        transitions, open_now = ledger_transitions(CLUSTER, open_now, _conditions(rows))
        expected = reference.transitions
        records = alert_records(CLUSTER, transitions)
        assert [key for key, _ in records] == [a.kafka_key().encode() for a in expected]
        assert [json.loads(value) for _, value in records] == [a.to_json() for a in expected]
        assert alert_rows(CLUSTER, transitions).to_pylist() == [alert_to_row(a) for a in expected]
        assert sorted(open_now.column("alert_id").to_pylist()) == sorted(
            a.alert_id for a in reference.open.values()
        )
        assert transition_counts(transitions) == _counts(expected)
        # What the tables hold of the alerts that fired reads back as the open set held them.
        fired = transitions.filter(pc.equal(transitions.column("state"), "firing"))
        rebuilt = open_from_rows(alert_rows(CLUSTER, fired).drop_columns(["state", "detected_date"]))
        assert (
            rebuilt.to_pylist()
            == open_now.filter(pc.is_in(open_now.column("alert_id"), fired.column("alert_id")))
            .sort_by("ledger_id")
            .to_pylist()
        )


def _counts(alerts: list[Any]) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for alert in alerts:
        key = (alert.kind.value, alert.state.value)
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_a_condition_that_keeps_holding_keeps_its_alert_and_a_new_kind_replaces_it() -> None:
    def call(kind: str | None, at_ms: int, open_now: pa.Table) -> tuple[pa.Table, pa.Table]:
        detail = detail_json({"lost_bookies": ["b1"]}) if kind else None
        conditions = condition_table(
            ledger_ids=[7],
            at_ms=[at_ms],
            kinds=[kind],
            bookies=[["b1"] if kind else []],
            details=[detail],
            topics=["t"],
        )
        return ledger_transitions("c", open_now, conditions)

    fired, open_now = call(LEDGER_KINDS[0], 10, empty_open())
    again, open_now = call(LEDGER_KINDS[0], 20, open_now)
    assert (
        again.num_rows == 0
        and open_now.column("alert_id").to_pylist() == fired.column("alert_id").to_pylist()
    )
    worse, open_now = call(LEDGER_KINDS[1], 30, open_now)
    assert [(t["kind"], t["state"]) for t in worse.to_pylist()] == [
        (LEDGER_KINDS[0], "resolved"),
        (LEDGER_KINDS[1], "firing"),
    ]
    assert open_now.column("kind").to_pylist() == [LEDGER_KINDS[1]]


def test_a_resolution_never_goes_back_before_the_alert_was_detected() -> None:
    conditions = condition_table(
        ledger_ids=[1], at_ms=[100], kinds=[LEDGER_KINDS[0]], bookies=[["b1"]], details=["{}"], topics=[None]
    )
    _, open_now = ledger_transitions("c", empty_open(), conditions)
    earlier = condition_table(
        ledger_ids=[1], at_ms=[50], kinds=[None], bookies=[[]], details=[None], topics=[None]
    )
    resolved, _ = ledger_transitions("c", open_now, earlier)
    assert resolved.column("detected_at_ms").to_pylist() == [100]


def test_conditions_naming_a_ledger_twice_are_refused() -> None:
    twice = condition_table(
        ledger_ids=[1, 1],
        at_ms=[1, 2],
        kinds=[None, None],
        bookies=[[], []],
        details=[None, None],
        topics=[None, None],
    )
    with pytest.raises(ValueError, match="more than once"):
        ledger_transitions("c", empty_open(), twice)


def test_verdicts_become_conditions_with_the_rules_detail() -> None:
    verdicts = pa.Table.from_pylist(
        [
            {"ledger_id": 1, "kind": LEDGER_KINDS[0], "lost_bookies": ["b1", "b2"]},
            {"ledger_id": 2, "kind": None, "lost_bookies": []},
            {
                "ledger_id": 3,
                "kind": LEDGER_KINDS[1],
                "lost_bookies": ["b1"],
                "unrecoverable_entries_sample": [4],
            },
            {"ledger_id": 4, "kind": LEDGER_KINDS[0], "lost_bookies": ["b1", "b2"]},
        ],
        schema=VERDICT_SCHEMA,
    )
    conditions = verdict_conditions_table(verdicts, np.array([5, 6, 7, 8]), pa.array(["t", None, "u", "t"]))
    assert [json.loads(d) if d else None for d in conditions.column("detail").to_pylist()] == [
        {"lost_bookies": ["b1", "b2"]},
        None,
        {"lost_bookies": ["b1"], "unrecoverable_entries_sample": [4]},
        {"lost_bookies": ["b1", "b2"]},
    ]
    assert conditions.column("at_ms").to_pylist() == [5, 6, 7, 8]
    assert conditions.schema.names == [f.name for f in conditions.schema]


def test_an_open_set_keeps_its_schema_through_calls() -> None:
    conditions = condition_table(
        ledger_ids=[3], at_ms=[1], kinds=[LEDGER_KINDS[0]], bookies=[["b"]], details=["{}"], topics=[None]
    )
    _, open_now = ledger_transitions("c", empty_open(), conditions)
    assert open_now.schema == OPEN_SCHEMA


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text()), max_size=8))
def test_topics_are_quoted_in_bulk_exactly_as_json_dumps_quotes_them(topics: list[str | None]) -> None:
    from core.domain.ledger_alerts import _json_texts

    quoted = _json_texts(pa.array(topics, pa.string())).to_pylist()
    assert quoted == [json.dumps(topic, ensure_ascii=False) for topic in topics]


@settings(max_examples=60, deadline=None)
@given(
    st.text(),
    st.lists(st.tuples(st.sampled_from(LEDGER_KINDS), st.integers(0, 2**62), st.integers(0, 2**50))),
)
def test_ledger_alert_ids_in_bulk_are_the_per_alert_ids(
    cluster: str, alerts: list[tuple[str, int, int]]
) -> None:
    from core.domain.alerts import alert_id_of
    from core.domain.ledger_alerts import ledger_alert_ids

    kinds, ledger_ids, at_ms = (
        (pa.array(column) for column in zip(*alerts, strict=True))
        if alerts
        else (
            pa.array([], pa.string()),
            pa.array([], pa.int64()),
            pa.array([], pa.int64()),
        )
    )
    expected = [alert_id_of(cluster, kind, f"ledger/{ledger}", at) for kind, ledger, at in alerts]
    assert ledger_alert_ids(cluster, kinds, ledger_ids, at_ms) == expected
