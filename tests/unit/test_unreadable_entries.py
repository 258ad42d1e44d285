"""Entries a DbLedgerStorage bookie lists but cannot read (its entry log file deleted or truncated).

A real BookKeeper 4.17 bookie answers ``READ_ENTRY`` for such an entry with ``EIO`` while its RocksDB index
still lists it (tests/integration/test_real_bookie_storage.py shows both on a real bookie). The replicas
check counts the entry as missing on that bookie, as BookKeeper's LedgerChecker does, and the agent's
index reader leaves it out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.agent.index import DbStorageIndexReader, DbStorageIndexWriter, entry_log_sizes
from connectors.bookie.client import BookieError, EntryPresent, NoEntry, Timeout
from connectors.bookie.frames import EIO
from connectors.bookie.ledger_probe import read_answer, read_answered
from core.domain.dbstorage import (
    entry_log_id,
    location_key,
    location_value,
    readable_entries,
    stored_entries,
)
from core.domain.rules.entry_reads import ReadAnswer, answers_from_reads
from core.domain.rules.replicas import BookieStatus, ReplicasResult, classify_replicas


def test_eio_to_a_read_is_an_unreadable_entry_and_an_answer() -> None:
    assert read_answer(BookieError(EIO)) is ReadAnswer.UNREADABLE
    assert read_answered(BookieError(EIO))
    # Other statuses and silence stay unknown: they say nothing about the entry.
    for result in (BookieError(506), BookieError(503), Timeout(2.0)):
        assert read_answer(result) is ReadAnswer.UNKNOWN and not read_answered(result)
    assert read_answered(NoEntry()) and read_answered(EntryPresent(3))


def test_a_bookie_answering_eio_for_its_fragment_loses_its_copies() -> None:
    """E3/W3/A2: one bookie's copies unreadable leaves two of three (LESS_THAN_WQ), not an unknown bookie."""
    ensemble = ["b0", "b1", "b2"]
    reads = {
        "b0": {0: ReadAnswer.UNREADABLE, 5: ReadAnswer.UNREADABLE},
        "b1": {0: ReadAnswer.PRESENT, 5: ReadAnswer.PRESENT},
        "b2": {0: ReadAnswer.PRESENT, 5: ReadAnswer.PRESENT},
    }
    answers = answers_from_reads(reads, last_entry_id=5)
    assert answers["b0"] is not BookieStatus.UNAVAILABLE
    assert 0 not in answers["b0"] and 5 not in answers["b0"]  # type: ignore[operator]
    verdict = classify_replicas(
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        state="CLOSED",
        last_entry_id=5,
        segments=[(0, ensemble)],
        answers=answers,
    )
    assert verdict.result is ReplicasResult.LESS_THAN_WQ
    assert not verdict.unknown_bookies


def test_entry_log_names() -> None:
    assert [entry_log_id(n) for n in ("0.log", "ff.log", "1A.log")] == [0, 255, 26]
    for name in ("lastId", "lastMark", "x.log", ".log", "0.log.tmp", "0.txn", "ledgers"):
        assert entry_log_id(name) is None


def test_readable_entries_leave_out_missing_and_truncated_logs() -> None:
    keys = b"".join(location_key(7, e) for e in range(6))
    values = b"".join(location_value(log, 1028 + 49 * e) for e, log in enumerate([0, 0, 1, 1, 2, 2]))
    everything = {0: 10_000, 1: 10_000, 2: 10_000}
    assert readable_entries(7, keys, values, everything).tolist() == stored_entries(7, keys, values).tolist()
    assert readable_entries(7, keys, values, {1: 10_000, 2: 10_000}).tolist() == [2, 3, 4, 5]
    # Log 2 cut just after entry 4's offset (1224): entry 5 (at 1273) is past its end.
    assert readable_entries(7, keys, values, {0: 10_000, 1: 10_000, 2: 1225}).tolist() == [0, 1, 2, 3, 4]
    assert readable_entries(7, keys, values, {}).tolist() == []


@pytest.fixture
def ledger_dir(tmp_path: Path) -> Path:
    writer = DbStorageIndexWriter(tmp_path / "ledgers")
    writer.add_entries(7, range(4), master_key=b"k" * 20)  # the writer's locations: entry log 1
    writer.close()
    return tmp_path / "ledgers"


def test_the_reader_checks_entry_logs_only_in_a_ledger_directory(ledger_dir: Path, tmp_path: Path) -> None:
    current = ledger_dir / "current"
    assert entry_log_sizes(ledger_dir) is None  # no lastId: an index-only directory, not checked
    reader = DbStorageIndexReader([ledger_dir], refresh_s=0, view_root=tmp_path / "views")
    try:
        assert reader.entries_of(7).tolist() == [0, 1, 2, 3]
        (current / "lastId").write_text("1\n")  # the entry logger's file: entry logs live here
        assert reader.entries_of(7).tolist() == [], "entry log 1 is missing"
        (current / "1.log").write_bytes(bytes(1024 + 64 * 3))  # entries at 1088, 1152, 1216, 1280
        assert entry_log_sizes(ledger_dir) == {1: 1216}
        assert reader.entries_of(7).tolist() == [0, 1]
        (current / "1.log").write_bytes(bytes(4096))
        assert reader.entries_of(7).tolist() == [0, 1, 2, 3]
    finally:
        reader.close()
