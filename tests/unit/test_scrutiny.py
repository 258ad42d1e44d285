"""The background replicas check's walk (:mod:`streaming.scrutiny`): a pass over every closed ledger within
its pass time, a position that survives a restart, and ledgers checked when they close."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.scrutiny import ScrutinyPass, ScrutinyStore


def closed_after_of(ids: list[int]):
    ordered = sorted(ids)
    return lambda cursor, limit: [i for i in ordered if i > cursor][:limit]


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(0, 10_000), min_size=1, max_size=300), st.integers(1, 20))
def test_a_pass_checks_every_closed_ledger_once_within_the_pass_time(ids: set[int], batch_s: int) -> None:
    walk = ScrutinyPass(pass_s=600.0, max_per_batch=1000)
    after, picked = closed_after_of(list(ids)), Counter[int]()
    now_ms = 0
    walk.picks(now_ms, after, len(ids))  # the pace starts
    while walk.last_full_pass_ms is None:
        now_ms += batch_s * 1000
        picked.update(walk.picks(now_ms, after, len(ids)))
        assert now_ms <= (600 + 2 * batch_s) * 1000, "the pass took longer than its time"
    first_pass = {i: n for i, n in picked.items()}
    assert set(first_pass) == ids  # every one (the next pass may have begun in the same batch)
    assert now_ms >= 600_000 - batch_s * 1000 * 2  # no faster than the pace (within one batch's rounding)


def test_the_walk_goes_on_from_its_position_after_a_restart(tmp_path: Path) -> None:
    ids = list(range(100))
    walk = ScrutinyPass(ledgers_per_s=10.0)
    walk.picks(0, closed_after_of(ids), 100)
    assert walk.picks(3_000, closed_after_of(ids), 100) == list(range(30))
    ScrutinyStore(tmp_path).save(walk)

    restarted = ScrutinyPass(ledgers_per_s=10.0)
    ScrutinyStore(tmp_path).load(restarted)
    assert restarted.picks(4_000, closed_after_of(ids), 100) == list(range(30, 40))  # not from 0 again


def test_a_damaged_position_file_starts_a_new_walk(tmp_path: Path) -> None:
    (tmp_path / "scrutiny.json").write_text('{"cursor": 4')  # torn
    walk = ScrutinyPass()
    ScrutinyStore(tmp_path).load(walk)
    assert walk.cursor == -1


def test_closed_ledgers_go_first_and_a_batch_takes_at_most_its_share() -> None:
    walk = ScrutinyPass(ledgers_per_s=0.0, max_per_batch=2)  # no walk: only the ledgers that close
    walk.ledger_closed([7, 8, 9])
    after = closed_after_of([1, 2, 3])
    assert walk.picks(0, after, 3) == [7, 8]
    assert walk.picks(10_000, after, 3) == [9]
    assert walk.picks(20_000, after, 3) == []


def test_without_checks_on_close_a_closing_ledger_waits_for_the_walk() -> None:
    walk = ScrutinyPass(ledgers_per_s=0.0, on_close=False)
    walk.ledger_closed([7])
    assert walk.picks(0, closed_after_of([7]), 1) == []


def test_the_default_pace_walks_a_million_ledgers_in_a_day() -> None:
    walk = ScrutinyPass()
    assert 11 < walk.rate(1_000_000) < 12
    assert walk.expected_pass_s(1_000_000) == 86_400.0
    assert ScrutinyPass(ledgers_per_s=0.0).expected_pass_s(1_000_000) is None
