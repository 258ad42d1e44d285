"""DbLedgerStorage's index layout (core.domain.dbstorage): round trips, sort order, columnar decoding."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.domain.dbstorage import (
    INT64_MAX,
    INT64_MIN,
    STORAGE_FLAGS_ID,
    checked_ledger_id,
    decode_ledger_data,
    decode_ledger_key,
    decode_location,
    decode_location_key,
    encode_ledger_data,
    entry_runs,
    ledger_bounds,
    ledger_ids_of_keys,
    ledger_key,
    location_key,
    location_value,
    split_location,
    stored_entries,
)
from core.errors import FormatError
from core.pb.db_ledger_storage_pb2 import LedgerData

longs = st.integers(INT64_MIN, INT64_MAX)
ids = st.integers(0, INT64_MAX)


@given(longs, longs)
def test_location_key_round_trip(ledger_id: int, entry_id: int) -> None:
    key = location_key(ledger_id, entry_id)
    assert len(key) == 16
    assert decode_location_key(key) == (ledger_id, entry_id)
    assert key == ledger_id.to_bytes(8, "big", signed=True) + entry_id.to_bytes(8, "big", signed=True)


@given(longs)
def test_ledger_key_round_trip(ledger_id: int) -> None:
    assert decode_ledger_key(ledger_key(ledger_id)) == ledger_id


@given(st.integers(0, 2**31 - 1), st.integers(0, 2**32 - 1))
def test_location_value_round_trip(entry_log_id: int, offset: int) -> None:
    assert split_location(decode_location(location_value(entry_log_id, offset))) == (entry_log_id, offset)


@given(st.lists(st.tuples(ids, ids), min_size=2, max_size=20))
def test_bytewise_key_order_is_numeric_order_for_ids_from_zero(pairs: list[tuple[int, int]]) -> None:
    """RocksDB sorts keys bytewise: one ledger's entries are contiguous and ascending."""
    assert sorted(pairs, key=lambda p: location_key(*p)) == sorted(pairs)


@given(ids, ids)
def test_ledger_bounds_hold_exactly_the_ledgers_entries(ledger_id: int, entry_id: int) -> None:
    lower, upper = ledger_bounds(ledger_id)
    assert lower <= location_key(ledger_id, entry_id) < upper or entry_id == INT64_MAX
    if ledger_id < INT64_MAX:
        assert not lower <= location_key(ledger_id + 1, 0) < upper


@given(
    st.booleans(),
    st.booleans(),
    st.binary(max_size=64),
    st.none() | st.binary(max_size=32),
    st.none() | st.booleans(),
)
def test_ledger_data_is_bookkeepers_message_and_drops_the_master_key(
    exists: bool, fenced: bool, master_key: bytes, lac: bytes | None, limbo: bool | None
) -> None:
    value = encode_ledger_data(
        exists=exists, fenced=fenced, master_key=master_key, explicit_lac=lac, limbo=limbo
    )
    parsed = LedgerData.FromString(value)
    assert (parsed.exists, parsed.fenced, parsed.masterKey) == (exists, fenced, master_key)
    flags = decode_ledger_data(value)
    assert (flags.exists, flags.fenced, flags.limbo) == (exists, fenced, bool(limbo))
    assert [f.name for f in fields(flags)] == ["exists", "fenced", "limbo"]  # no master key to leak


@pytest.mark.parametrize(
    "value",
    [b"\xff\xff", b"\x08\x01", bytes.fromhex("0801100112")],  # garbage; lacks fenced/masterKey; truncated
)
def test_bad_ledger_data_is_a_format_error(value: bytes) -> None:
    with pytest.raises(FormatError, match="ledgers value"):
        decode_ledger_data(value)


@pytest.mark.parametrize(
    "call",
    [
        lambda: decode_location_key(bytes(15)),
        lambda: decode_ledger_key(bytes(9)),
        lambda: decode_location(bytes(7)),
        lambda: location_key(2**63, 0),
        lambda: ledger_key(-(2**63) - 1),
        lambda: checked_ledger_id(-1),
        lambda: checked_ledger_id(2**63),
        lambda: checked_ledger_id(True),
        lambda: location_value(2**31, 0),
        lambda: stored_entries(1, bytes(16), bytes(16)),
        lambda: ledger_ids_of_keys(bytes(9)),
    ],
)
def test_out_of_range_or_truncated_input_is_a_format_error(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(FormatError):
        call()


@given(
    ids,
    st.lists(st.tuples(st.integers(0, 5), longs, st.integers(0, 3)), max_size=40),
)
def test_stored_entries_match_a_key_by_key_reading(ledger_id: int, rows: list[tuple[int, int, int]]) -> None:
    """Columnar decoding gives what reading key by key gives: this ledger, entry id >= 0, location != 0."""
    keyed = {location_key(min(ledger_id + delta, INT64_MAX), e): loc for delta, e, loc in rows}
    ordered = sorted(keyed.items())
    keys = b"".join(k for k, _ in ordered)
    values = b"".join((0 if loc == 0 else (1 << 32) | loc).to_bytes(8, "big") for _, loc in ordered)
    expected = sorted(
        entry
        for key, loc in ordered
        for owner, entry in [decode_location_key(key)]
        if owner == ledger_id and entry >= 0 and loc != 0
    )
    assert stored_entries(ledger_id, keys, values).tolist() == expected


@given(st.sets(st.integers(0, 2**40), max_size=60))
def test_entry_runs_cover_exactly_the_entries(entries: set[int]) -> None:
    firsts, lasts = entry_runs(np.array(sorted(entries), dtype=np.int64))
    covered = {e for a, b in zip(firsts.tolist(), lasts.tolist(), strict=True) for e in range(a, b + 1)}
    assert covered == entries
    assert all(b >= a for a, b in zip(firsts, lasts, strict=True))
    assert all(nxt > prev + 1 for prev, nxt in zip(lasts[:-1], firsts[1:], strict=True))  # maximal runs


@given(st.sets(ids, max_size=30))
def test_ledger_ids_of_keys_skip_the_storage_flags(ledger_ids: set[int]) -> None:
    keys = b"".join(sorted([ledger_key(i) for i in ledger_ids] + [ledger_key(STORAGE_FLAGS_ID)]))
    assert ledger_ids_of_keys(keys).tolist() == sorted(ledger_ids)
