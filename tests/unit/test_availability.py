"""AvailabilityOfEntriesOfLedger: byte-exact encoding, hostile-input decoding, correct missing-entry sets."""

from __future__ import annotations

import random
import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.availability import (
    HEADER_SIZE,
    MAX_ENTRY_ID,
    EntryAvailability,
    SequenceGroup,
    decode_availability,
    encode_availability,
    missing_entries,
)
from core.domain.striping import entries_striped_to_bookie
from core.errors import FormatError
from tests.budgets import allocation_peak


def raw(groups: list[tuple[int, int, int, int]], version: int = 0, count: int | None = None) -> bytes:
    """Hand-built availability bytes, bypassing every check."""
    header = struct.pack(">ii", version, len(groups) if count is None else count) + bytes(56)
    return header + b"".join(struct.pack(">qqii", *group) for group in groups)


def naive_runs(ids: set[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for entry_id in sorted(ids):
        if runs and entry_id == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], entry_id)
        else:
            runs.append((entry_id, entry_id))
    return runs


# --- worked examples -------------------------------------------------------------------------------


def test_three_consecutive_ids_are_one_group_of_88_bytes() -> None:
    data = encode_availability([0, 1, 2])
    assert len(data) == 88
    assert [g.as_list() for g in decode_availability(data).groups] == [[0, 0, 3, 0]]


def test_exact_bytes_for_1_to_3_and_5_to_8() -> None:
    expected_hex = (
        "00000000" + "00000002" + "00" * 56
        + "0000000000000001" + "0000000000000001" + "00000003" + "00000000"
        + "0000000000000005" + "0000000000000005" + "00000004" + "00000000"
    )  # fmt: skip
    data = encode_availability([1, 2, 3, 5, 6, 7, 8])
    assert len(data) == 112
    assert data.hex() == expected_hex


def test_empty_set_is_64_zero_bytes() -> None:
    assert encode_availability([]) == bytes(64)
    decoded = decode_availability(bytes(64))
    assert decoded.groups == () and decoded.count == 0 and list(decoded.iter_entries()) == []


def test_duplicates_count_once_and_order_does_not_matter() -> None:
    assert encode_availability([8, 1, 2, 2, 3, 5, 5, 6, 7, 1]) == encode_availability([1, 2, 3, 5, 6, 7, 8])


def test_real_bookie_never_merges_runs_into_periodic_groups() -> None:
    # BP-34's example set is sent as four groups, not as (1, 10, 2, 3).
    groups = decode_availability(encode_availability([1, 2, 4, 5, 7, 8, 10, 11])).groups
    assert [g.as_list() for g in groups] == [[1, 1, 2, 0], [4, 4, 2, 0], [7, 7, 2, 0], [10, 10, 2, 0]]


def test_bp34_periodic_group_decodes() -> None:
    decoded = decode_availability(raw([(1, 10, 2, 3)]))
    assert list(decoded.iter_entries()) == [1, 2, 4, 5, 7, 8, 10, 11]
    assert decoded.count == 8
    assert [e for e in range(15) if e in decoded] == [1, 2, 4, 5, 7, 8, 10, 11]


def test_early_exit_counter_example_1() -> None:
    # BookKeeper's getUnavailableEntries answers [4, 6]; 6 is available.
    available = decode_availability(encode_availability([1, 2, 6]))
    assert missing_entries(available, 0, 7, [4, 6]) == [4]


def test_early_exit_counter_example_2_exact_stripe() -> None:
    # E=5, WQ=2, bookie 0 holds exactly its stripe; BookKeeper reports [4, 5, 9, 10, 14, 15] missing.
    stripe = list(entries_striped_to_bookie(0, 0, 15, ensemble_size=5, write_quorum=2))
    assert stripe == [0, 4, 5, 9, 10, 14, 15]
    available = decode_availability(encode_availability(stripe))
    assert missing_entries(available, 0, 15, stripe) == []


# --- header checks --------------------------------------------------------------------------------------


def test_header_version_above_zero_is_rejected() -> None:
    with pytest.raises(FormatError, match="unsupported header version 1"):
        decode_availability(raw([], version=1))


def test_negative_header_version_is_accepted_and_kept() -> None:
    decoded = decode_availability(raw([(3, 3, 2, 0)], version=-7))
    assert decoded.header_version == -7
    assert list(decoded.iter_entries()) == [3, 4]
    assert decoded.to_bytes() == raw([(3, 3, 2, 0)], version=-7)


def test_nonzero_header_padding_is_ignored_like_bookkeeper() -> None:
    data = bytearray(raw([(0, 0, 1, 0)]))
    data[20] = 0xFF
    assert list(decode_availability(bytes(data)).iter_entries()) == [0]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "truncated header: 0 bytes"),
        (bytes(63), "truncated header: 63 bytes"),
        (raw([], count=-1), "negative group count -1"),
        (raw([(0, 0, 1, 0)])[:-1], "truncated"),
        (raw([(0, 0, 1, 0)]) + b"\x00", "trailing bytes"),
        (raw([], count=2**31 - 1), "declares 2147483647 groups"),
    ],
)
def test_framing_errors(data: bytes, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        decode_availability(data)


def test_absurd_group_count_is_rejected_without_allocating() -> None:
    with allocation_peak() as peak:
        for count in (2**31 - 1, 10**9, 178956971):  # 178956971 * 24 overflows an int32 byte count
            with pytest.raises(FormatError):
                decode_availability(raw([], count=count))
    assert peak.bytes < 64 * 1024, peak


@pytest.mark.parametrize(
    ("group", "message"),
    [
        ((-1, -1, 1, 0), "negative entry id"),
        ((0, 0, 0, 0), "sequence size"),
        ((0, 0, -5, 0), "sequence size"),
        ((0, 0, 1, -3), "negative sequence period"),
        ((0, 6, 2, 0), "period 0 requires"),
        ((9, 3, 2, 3), "before the first"),
        ((0, 5, 1, 3), "whole number of periods"),
        ((0, 6, 4, 3), "sequences overlap"),
        ((MAX_ENTRY_ID, MAX_ENTRY_ID, 2, 0), "overflow"),
    ],
)
def test_bad_groups_are_rejected(group: tuple[int, int, int, int], message: str) -> None:
    with pytest.raises(FormatError, match=message):
        decode_availability(raw([group]))


@pytest.mark.parametrize(
    "groups",
    [
        [(0, 0, 5, 0), (3, 3, 5, 0)],  # spans overlap
        [(0, 0, 5, 0), (0, 0, 5, 0)],  # duplicate start (BookKeeper's TreeMap would silently keep one)
        [(0, 10, 1, 2), (1, 11, 1, 2)],  # interleaved evens and odds: BookKeeper's floorEntry misreads these
        [(0, 0, 3, 0), (2, 2, 1, 0)],
    ],
)
def test_overlapping_groups_are_rejected(groups: list[tuple[int, int, int, int]]) -> None:
    with pytest.raises(FormatError, match="overlaps"):
        decode_availability(raw(groups))


def test_groups_out_of_order_are_sorted_like_bookkeepers_treemap() -> None:
    decoded = decode_availability(raw([(10, 10, 2, 0), (0, 0, 3, 0)]))
    assert [g.as_list() for g in decoded.groups] == [[0, 0, 3, 0], [10, 10, 2, 0]]
    assert list(decoded.iter_entries()) == [0, 1, 2, 10, 11]


def test_adjacent_groups_and_contiguous_periodic_groups_merge_into_runs() -> None:
    decoded = decode_availability(raw([(0, 0, 2, 0), (2, 8, 2, 2)]))  # period == size: one solid run
    assert list(decoded.runs()) == [(0, 9)]
    assert list(decoded.gaps(0, 12)) == [(10, 12)]


# --- large sets are never expanded ----------------------------------------------------------------------


def test_huge_groups_are_handled_without_expansion() -> None:
    with allocation_peak() as peak:
        _check_huge_groups()
    assert peak.bytes < 256 * 1024, peak  # an expanded group would be gigabytes


def _check_huge_groups() -> None:
    huge = decode_availability(raw([(0, 0, 2**31 - 1, 0), (2**40, 2**40 + 3 * 10**12, 2, 3)]))
    assert huge.count == 2**31 - 1 + (10**12 + 1) * 2
    assert 2**31 - 2 in huge and 2**31 - 1 not in huge
    assert 2**40 + 3 * 5 + 1 in huge and 2**40 + 3 * 5 + 2 not in huge
    assert huge.entry_list(limit=4) == [0, 1, 2, 3]
    assert list(huge.runs(2**40 + 3 * 10**11 - 1, 2**40 + 3 * 10**11 + 4)) == [
        (2**40 + 3 * 10**11, 2**40 + 3 * 10**11 + 1),
        (2**40 + 3 * 10**11 + 3, 2**40 + 3 * 10**11 + 4),
    ]
    expected = [5, 2**31 - 1, 2**40 + 7, 2**40 + 8, 2**40 + 3 * 10**12 + 1]
    assert missing_entries(huge, 0, MAX_ENTRY_ID, expected) == [2**31 - 1, 2**40 + 8]


def test_long_runs_are_split_into_int32_sized_groups() -> None:
    available = EntryAvailability.from_runs([(0, 2**32)])
    assert [g.as_list() for g in available.groups] == [
        [0, 0, 2**31 - 1, 0],
        [2**31 - 1, 2**31 - 1, 2**31 - 1, 0],
        [2**32 - 2, 2**32 - 2, 3, 0],
    ]
    assert list(decode_availability(available.to_bytes()).runs()) == [(0, 2**32)]


def test_encoder_rejects_ids_it_cannot_represent() -> None:
    for bad in (-1, MAX_ENTRY_ID + 1, True, 1.0, "3"):
        with pytest.raises(ValueError):
            encode_availability([bad])  # type: ignore[list-item]


# --- missing_entries edge cases -------------------------------------------------------------------------


def test_missing_ignores_expected_ids_outside_the_range_and_handles_empty_range() -> None:
    assert missing_entries([], 5, 7, [1, 5, 6, 9]) == [5, 6]
    assert missing_entries([], 7, 5, [6]) == []
    assert missing_entries([0, 1], 0, 10, []) == []
    assert missing_entries([0, 1], 0, 10, [3, 3, 1]) == [3]


def test_missing_reads_periodic_groups() -> None:
    available = decode_availability(raw([(1, 10, 2, 3)]))
    assert missing_entries(available, 0, 12, range(13)) == [0, 3, 6, 9, 12]


# --- properties -------------------------------------------------------------------------------------------

id_sets = st.sets(st.integers(min_value=0, max_value=200), max_size=60) | st.sets(
    st.integers(min_value=0, max_value=MAX_ENTRY_ID), max_size=10
)


@given(id_sets)
def test_encode_decode_identity(ids: set[int]) -> None:
    data = encode_availability(ids)
    decoded = decode_availability(data)
    assert list(decoded.iter_entries()) == sorted(ids)
    assert decoded.count == len(ids)
    assert decoded.to_bytes() == data
    # One group per maximal run, exactly as a real bookie writes.
    assert [g.as_list() for g in decoded.groups] == [[a, a, b - a + 1, 0] for a, b in naive_runs(ids)]
    assert len(data) == HEADER_SIZE + 24 * len(naive_runs(ids))


@given(
    st.sets(st.integers(0, 120), max_size=80),
    st.integers(0, 130),
    st.integers(0, 130),
    st.lists(st.integers(0, 140), max_size=60),
)
def test_missing_equals_naive_set_difference(
    available: set[int], start: int, last: int, expected: list[int]
) -> None:
    naive = sorted({e for e in expected if start <= e <= last} - available)
    assert missing_entries(EntryAvailability.from_entry_ids(available), start, last, expected) == naive
    assert missing_entries(available, start, last, expected) == naive


@given(st.sets(st.integers(0, 60), max_size=50), st.integers(-3, 65), st.integers(-3, 65))
def test_runs_and_gaps_of_real_bookie_sets_match_naive(ids: set[int], low: int, high: int) -> None:
    available = EntryAvailability.from_entry_ids(ids)
    assert list(available.runs(low, high)) == naive_runs({e for e in ids if low <= e <= high})
    assert list(available.runs()) == naive_runs(ids)
    assert list(available.gaps(low, high)) == naive_runs(set(range(low, high + 1)) - ids)


@st.composite
def periodic_groups(draw: st.DrawFn) -> list[SequenceGroup]:
    groups: list[SequenceGroup] = []
    cursor = draw(st.integers(0, 5))
    for _ in range(draw(st.integers(0, 5))):
        size = draw(st.integers(1, 4))
        period = draw(st.sampled_from([0, size, size + 1, size + 3]))
        count = 1 if period == 0 else draw(st.integers(1, 4))
        groups.append(SequenceGroup(cursor, cursor + (count - 1) * period, size, period))
        cursor = cursor + (count - 1) * period + size + draw(st.integers(0, 3))
    return groups


@given(periodic_groups(), st.integers(0, 60), st.integers(0, 60))
@settings(max_examples=200)
def test_periodic_groups_agree_with_naive_expansion(groups: list[SequenceGroup], low: int, high: int) -> None:
    naive: set[int] = set()
    for g in groups:
        starts = (
            [g.first_sequence_start]
            if g.sequence_period == 0
            else range(g.first_sequence_start, g.last_sequence_start + 1, g.sequence_period)
        )
        for start in starts:
            naive.update(range(start, start + g.sequence_size))
    decoded = decode_availability(raw([tuple(g.as_list()) for g in groups]))  # type: ignore[misc]
    assert list(decoded.iter_entries()) == sorted(naive)
    assert decoded.count == len(naive)
    assert [e for e in range(max(naive, default=0) + 3) if e in decoded] == sorted(naive)
    clipped = {e for e in naive if low <= e <= high}
    assert list(decoded.runs(low, high)) == naive_runs(clipped)
    assert list(decoded.gaps(low, high)) == naive_runs(set(range(low, high + 1)) - naive)
    # Re-encoding a periodic set yields the one-group-per-run form of the same set.
    assert list(decode_availability(encode_availability(decoded.iter_entries())).iter_entries()) == sorted(
        naive
    )


# --- fuzzing: only FormatError may come out ----------------------------------------------------------------


def _check_decodes_or_format_error(data: bytes) -> None:
    try:
        decoded = decode_availability(data)
    except FormatError as err:
        assert str(err) and "\n" not in str(err)
        return
    # Whatever decodes must be internally consistent and cheap to query.
    assert decoded.count >= 0
    decoded.entry_list(limit=5)
    assert 0 in decoded or 0 not in decoded
    assert decode_availability(decoded.to_bytes()) == decoded


def test_fuzz_decoder_only_raises_format_error() -> None:
    rng = random.Random(20240601)
    seeds = [
        encode_availability([]),
        encode_availability([0, 1, 2]),
        encode_availability([1, 2, 3, 5, 6, 7, 8]),
        encode_availability(range(0, 400, 3)),
        raw([(1, 10, 2, 3), (20, 20, 5, 0), (100, 1000, 7, 9)]),
        raw([(0, 0, 2**31 - 1, 0)]),
    ]
    started = time.perf_counter()
    cases = 0
    for _ in range(4000):  # bit flips in valid inputs
        flipped = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        _check_decodes_or_format_error(bytes(flipped))
        cases += 1
    for _ in range(3000):  # truncations and extensions
        data = rng.choice(seeds)
        cut = rng.randrange(len(data) + 30)
        _check_decodes_or_format_error(
            data[:cut] if cut <= len(data) else data + rng.randbytes(cut - len(data))
        )
        cases += 1
    for _ in range(3000):  # random bytes, some with a plausible header
        length = rng.choice([rng.randrange(0, 200), HEADER_SIZE + 24 * rng.randrange(0, 6)])
        noise = bytearray(rng.randbytes(length))
        if length >= 8 and rng.random() < 0.7:
            struct.pack_into(">ii", noise, 0, rng.choice([0, 0, -1, 1]), (length - HEADER_SIZE) // 24)
        _check_decodes_or_format_error(bytes(noise))
        cases += 1
    for _ in range(1000):  # structurally valid framing, random (often hostile) group fields
        groups = [
            (
                rng.choice([rng.randrange(-5, 50), rng.randrange(-(2**63), 2**63)]),
                rng.choice([rng.randrange(-5, 80), rng.randrange(-(2**63), 2**63)]),
                rng.choice([rng.randrange(-3, 8), rng.randrange(-(2**31), 2**31)]),
                rng.choice([rng.randrange(-3, 10), rng.randrange(-(2**31), 2**31)]),
            )
            for _ in range(rng.randrange(1, 4))
        ]
        _check_decodes_or_format_error(raw(groups))
        cases += 1
    assert cases >= 10_000
    assert time.perf_counter() - started < 300  # a hang guard (a hostile group expanded), not a speed target
