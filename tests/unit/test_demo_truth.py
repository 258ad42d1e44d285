"""The real-bookie demo's ground truth, computed from metadata alone (bkaudit.demo_truth)."""

from __future__ import annotations

from bkaudit.demo_truth import (
    lost_ledgers,
    naming,
    not_adhering,
    one_rack_write_set,
    process_stopped,
    write_sets,
)
from core.domain.metadata import LedgerMetadata, LedgerState, Segment


def _ledger(*ensembles: tuple[str, ...], write_quorum: int = 2, closed: bool = True) -> LedgerMetadata:
    segments = tuple(
        Segment(first, ensemble) for first, ensemble in zip((0, 10, 20), ensembles, strict=False)
    )
    return LedgerMetadata(
        ensemble_size=len(ensembles[0]),
        write_quorum=write_quorum,
        ack_quorum=min(write_quorum, 2),
        state=LedgerState.CLOSED if closed else LedgerState.OPEN,
        last_entry_id=29 if closed else -1,
        length=100 if closed else 0,
        segments=segments,
    )


RACKS = {"a": "/r1", "b": "/r1", "c": "/r2", "d": "/r3"}


def test_write_sets_wrap_around_the_ensemble():
    assert write_sets(("a", "b", "c", "d"), 3) == [
        ("a", "b", "c"),
        ("b", "c", "d"),
        ("c", "d", "a"),
        ("d", "a", "b"),
    ]


def test_a_write_set_in_one_rack_breaks_placement_and_unknown_bookies_share_the_default_rack():
    assert one_rack_write_set(("a", "b", "c"), 2, RACKS)  # a, b both in /r1
    assert not one_rack_write_set(("a", "c", "d"), 2, RACKS)
    assert one_rack_write_set(("x", "y", "c"), 2, RACKS)  # neither x nor y in the map


def test_placement_truth_takes_closed_ledgers_and_every_segment():
    ledgers = {
        1: _ledger(("a", "c", "d"), ("a", "b", "c")),  # the second segment fails
        2: _ledger(("a", "b", "c"), closed=False),  # open: not checked
        3: _ledger(("a", "c", "d")),
    }
    assert not_adhering(ledgers, RACKS) == {1}


def test_a_lost_bookie_puts_every_ledger_naming_it_under_replicated_open_or_closed():
    ledgers = {
        1: _ledger(("a", "c", "d"), ("b", "c", "d")),  # names a in its first segment only
        2: _ledger(("a", "b", "c"), closed=False),
        3: _ledger(("b", "c", "d")),
        4: _ledger(("a", "c"), write_quorum=1),  # no second copy of a's entries
    }
    assert naming(ledgers, ["a"]) == {1, 2, 4}
    assert lost_ledgers(ledgers, ["a"]) == {"LEDGER_UNDER_REPLICATED": {1, 2}, "LEDGER_UNRECOVERABLE": {4}}


def test_a_process_that_is_not_there_is_not_stopped():
    assert not process_stopped(None)
    assert not process_stopped(2**22 + 12345)


def test_demo_names_a_cluster_it_does_not_know_in_one_line(cli):
    result = cli("demo", "--bookkeeper", "zookeeper-only")
    assert result.exit_code == 2
    assert result.stderr == "bkaudit: --bookkeeper: 'zookeeper-only' is not one of 'real', 'simulator'\n"
