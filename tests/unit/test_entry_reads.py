"""The replicas check by entry reads against the check by entry lists, on random ledgers and losses."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.rules.entry_reads import ReadAnswer, answers_from_reads, entries_to_read
from core.domain.rules.replicas import BookieStatus, ReplicasResult, classify_replicas, segment_ranges
from core.domain.rules.replicas import LedgerSegment as Segment
from core.domain.striping import has_entry

POOL = [f"b{i}" for i in range(7)]


@st.composite
def ledgers(draw: Any) -> dict[str, Any]:
    """A closed ledger, the entries each bookie truly holds (its stripes less some losses) or NO_LEDGER."""
    ensemble_size = draw(st.integers(1, 5))
    write_quorum = draw(st.integers(1, ensemble_size))
    ack_quorum = draw(st.integers(1, write_quorum))
    last_entry_id = draw(st.integers(0, 60))
    firsts = sorted(draw(st.sets(st.integers(1, last_entry_id + 3), max_size=2)) | {0})
    segments = [Segment(first, tuple(draw(st.permutations(POOL))[:ensemble_size])) for first in firsts]
    striped: dict[str, set[int]] = {}
    for index, first, end in segment_ranges(segments, last_entry_id):
        for position, bookie in enumerate(segments[index].ensemble):
            held = {e for e in range(first, end + 1) if has_entry(e, position, ensemble_size, write_quorum)}
            striped.setdefault(bookie, set()).update(held)
    truth: dict[str, Any] = {}
    for bookie, held in sorted(striped.items()):
        if draw(st.integers(0, 9)) == 0:
            truth[bookie] = BookieStatus.NO_LEDGER
        else:
            lost = draw(st.sets(st.sampled_from(sorted(held)), max_size=3)) if held else set()
            truth[bookie] = held - lost
    return {
        "ensemble_size": ensemble_size,
        "write_quorum": write_quorum,
        "ack_quorum": ack_quorum,
        "last_entry_id": last_entry_id,
        "segments": segments,
        "striped": striped,
        "truth": truth,
    }


def _answer(truth: Any, entry_id: int) -> ReadAnswer:
    if truth is BookieStatus.NO_LEDGER:
        return ReadAnswer.NO_LEDGER
    return ReadAnswer.PRESENT if entry_id in truth else ReadAnswer.NO_ENTRY


def _verdict(ledger: dict[str, Any], answers: dict[str, Any]) -> Any:
    return classify_replicas(
        ensemble_size=ledger["ensemble_size"],
        write_quorum=ledger["write_quorum"],
        ack_quorum=ledger["ack_quorum"],
        state="CLOSED",
        last_entry_id=ledger["last_entry_id"],
        segments=ledger["segments"],
        answers=answers,
    )


def _to_read(ledger: dict[str, Any], percent: float, seed: int = 0) -> dict[str, list[int]]:
    return entries_to_read(
        ledger["segments"],
        ensemble_size=ledger["ensemble_size"],
        write_quorum=ledger["write_quorum"],
        last_entry_id=ledger["last_entry_id"],
        sample_percent=percent,
        seed=seed,
    )


@settings(max_examples=300, deadline=None)
@given(ledger=ledgers())
def test_reading_every_striped_entry_gives_the_verdict_of_the_entry_lists(ledger):
    reads = {
        bookie: {e: _answer(ledger["truth"][bookie], e) for e in held}
        for bookie, held in ledger["striped"].items()
    }
    by_reads = _verdict(ledger, answers_from_reads(reads, ledger["last_entry_id"]))
    assert by_reads == _verdict(ledger, ledger["truth"])


@settings(max_examples=300, deadline=None)
@given(ledger=ledgers(), percent=st.sampled_from([0.0, 10.0, 50.0, 100.0]), seed=st.integers(0, 99))
def test_a_sample_is_never_worse_than_the_truth_and_sees_every_lost_fragment_end(ledger, percent, seed):
    planned = _to_read(ledger, percent, seed)
    for bookie, entries in planned.items():  # only entries the bookie must hold are read
        assert set(entries) <= ledger["striped"][bookie]
    reads = {b: {e: _answer(ledger["truth"][b], e) for e in entries} for b, entries in planned.items()}
    sampled = _verdict(ledger, answers_from_reads(reads, ledger["last_entry_id"]))
    truth = _verdict(ledger, ledger["truth"])
    assert sampled.min_replicas >= truth.min_replicas
    ends_lost = any(
        answer is not ReadAnswer.PRESENT for answered in reads.values() for answer in answered.values()
    )
    if ends_lost:
        assert sampled.result is not ReplicasResult.OK


@settings(max_examples=200, deadline=None)
@given(ledger=ledgers())
def test_every_fragment_has_its_first_and_last_entry_read_on_its_bookie(ledger):
    planned = _to_read(ledger, 0.0)
    segments, last = ledger["segments"], ledger["last_entry_id"]
    for index, first, end in segment_ranges(segments, last):
        for position, bookie in enumerate(segments[index].ensemble):
            fragment = [
                e
                for e in range(first, end + 1)
                if has_entry(e, position, ledger["ensemble_size"], ledger["write_quorum"])
            ]
            if fragment:
                assert {fragment[0], fragment[-1]} <= set(planned[bookie])


def test_a_bookie_whose_reads_went_unanswered_is_unknown_not_missing():
    segments = [Segment(0, ("a", "b"))]
    reads = {"a": {0: ReadAnswer.PRESENT, 1: ReadAnswer.PRESENT}, "b": {0: ReadAnswer.UNKNOWN}}
    answers = answers_from_reads(reads, last_entry_id=1)
    verdict = classify_replicas(
        ensemble_size=2,
        write_quorum=2,
        ack_quorum=2,
        state="CLOSED",
        last_entry_id=1,
        segments=segments,
        answers=answers,
    )
    assert answers["b"] is BookieStatus.UNAVAILABLE
    assert verdict.unknown_bookies == ("b",) and verdict.min_replicas == 2


def test_an_unanswered_read_among_answered_ones_is_not_a_missing_entry():
    answers = answers_from_reads({"a": {0: ReadAnswer.UNKNOWN, 5: ReadAnswer.PRESENT}}, last_entry_id=5)
    assert 0 in answers["a"] and 5 in answers["a"]
