"""``what-if`` and ``drain`` over the example lakehouse (bookie-1 lost; ledgers 1, 2, 3 on three bookies)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from connectors.delta.queries import Lakehouse, write_example_lakehouse
from connectors.delta.removal import DRAIN_REASONS, drain_answer
from core.errors import InvalidArgumentError


@pytest.fixture(scope="module")
def lakehouse(tmp_path_factory: pytest.TempPathFactory) -> Lakehouse:
    return Lakehouse(write_example_lakehouse(tmp_path_factory.mktemp("example")))


def test_bookies_already_gone_count_as_gone(lakehouse: Lakehouse) -> None:
    # Ledger 1 (E3 WQ2 on bookie-1..3): with bookie-1 already lost, bookie-2 down loses entries 0, 3, 6, 9.
    answer = lakehouse.what_if(["bookie-2"])
    assert answer.unavailable == ["bookie-1"]
    rows = {r["ledger_id"]: r for r in answer.ledgers.to_pylist()}
    assert rows[1]["verdict"] == "UNRECOVERABLE" and rows[1]["unrecoverable_entries_sample"] == [0, 3, 6, 9]
    assert rows[3]["verdict"] == "BELOW_ACK_QUORUM" and rows[3]["fewest_copies_left"] == 1
    assert not answer.safe


def test_the_lost_bookie_itself_is_asked_about_without_counting_twice(lakehouse: Lakehouse) -> None:
    answer = lakehouse.what_if(["bookie-1", "bookie-1"])
    assert answer.down == ["bookie-1"] and answer.unavailable == []
    assert answer.safe and answer.by_verdict == {
        "UNRECOVERABLE": 0,
        "BELOW_ACK_QUORUM": 2,
        "UNDER_REPLICATED": 0,
    }


def test_worst_ledgers_come_first(lakehouse: Lakehouse) -> None:
    verdicts = lakehouse.what_if(["bookie-3"]).ledgers.column("verdict").to_pylist()
    assert verdicts == ["UNRECOVERABLE", "UNRECOVERABLE", "BELOW_ACK_QUORUM"]


@pytest.mark.parametrize(
    ("down", "message"), [(["bookie-9"], "--down: unknown bookie bookie-9"), ([], "name at least one")]
)
def test_an_unknown_or_missing_bookie_is_bad_input(
    lakehouse: Lakehouse, down: list[str], message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        lakehouse.what_if(down)
    with pytest.raises(InvalidArgumentError, match="unknown bookie"):
        lakehouse.drain("bookie-9")


def test_drain_gives_the_most_pressing_reason_first() -> None:
    rows = pa.Table.from_pylist(
        [
            {"ledger_id": 1, "state": "CLOSED", "under_replication_marked": False, "open_alerts": []},
            {"ledger_id": 2, "state": "OPEN", "under_replication_marked": True, "open_alerts": []},
            {
                "ledger_id": 3,
                "state": "CLOSED",
                "under_replication_marked": True,
                "open_alerts": ["UNDER_REPLICATION_STUCK"],
            },
            {
                "ledger_id": 4,
                "state": "CLOSED",
                "under_replication_marked": True,
                "open_alerts": ["LEDGER_UNRECOVERABLE"],
            },
            {"ledger_id": 5, "state": "CLOSED", "under_replication_marked": True, "open_alerts": None},
            {
                "ledger_id": 6,
                "state": "CLOSED",
                "under_replication_marked": True,
                "open_alerts": ["REPLICATION_STALLED", "UNDER_REPLICATION_STUCK"],
            },
        ]
    )
    drained = drain_answer(rows).to_pylist()
    assert [(r["ledger_id"], r["reason"]) for r in drained] == [
        (4, "unrecoverable"),
        (6, "stalled"),
        (3, "stuck"),
        (2, "open"),
        (5, "marked"),
        (1, "not_marked"),
    ]
    assert drained[0]["reasons"] == ["unrecoverable", "marked"]
    assert drained[1]["reasons"] == ["stalled", "stuck", "marked"]
    assert drained[3]["reasons"] == ["open", "marked"]
    assert all(set(r["reasons"]) <= set(DRAIN_REASONS) for r in drained)


def test_drain_lists_the_ledgers_naming_the_bookie(lakehouse: Lakehouse) -> None:
    assert lakehouse.drain("bookie-3").column("ledger_id").to_pylist() == [1, 2, 3]
    assert lakehouse.drain("bookie-2").column("ledger_id").to_pylist() == [1, 3]
