"""Bookie wire frames: byte-exact requests and responses, incremental framing, strict parsing,
classification of answers into probe results, and a fuzz loop showing bad bytes only raise FormatError."""

from __future__ import annotations

import contextlib
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.bookie import frames
from connectors.bookie.client import (
    AuthRequired,
    BadResponse,
    BookieError,
    EntryList,
    EntryPresent,
    LastConfirmed,
    NoEntry,
    NoLedger,
    Timeout,
    availability_of,
    classify_last_entry_response,
    classify_list_entries_response,
    classify_read_entry_response,
    parse_bookie_address,
)
from connectors.bookie.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    FrameDecoder,
    encode_frame,
    list_entries_request,
    list_entries_response,
    parse_request,
    parse_response,
    peek_header,
    read_entry_request,
    read_entry_response,
    status_response,
)
from core.domain.availability import EntryAvailability, encode_availability
from core.errors import FormatError
from core.pb import bookkeeper_protocol_pb2 as pb

# Example bytes of a v3 protocol frame.
REQUEST_LEDGER5_TXN1 = bytes.fromhex("0a 06 08 03 10 0b 18 01 e2 06 02 08 05")
FRAMED_REQUEST_LEDGER5_TXN1 = bytes.fromhex("00 00 00 0d 0a 06 08 03 10 0b 18 01 e2 06 02 08 05")
ENOLEDGER_RESPONSE_LEDGER5_TXN1 = bytes.fromhex("0a 06 08 03 10 0b 18 01 10 92 03 e2 06 05 08 92 03 10 05")


def list_header(ledger_id: int = 5, txn_id: int = 1) -> pb.BKPacketHeader:
    return list_entries_request(ledger_id, txn_id).header


# ----------------------------------------------------------------------------- bytes as BookKeeper sends them


def test_list_entries_request_is_byte_exact_with_the_facts_example():
    assert list_entries_request(ledger_id=5, txn_id=1).SerializeToString() == REQUEST_LEDGER5_TXN1


def test_framed_request_has_a_big_endian_length_prefix():
    framed = encode_frame(list_entries_request(ledger_id=5, txn_id=1))
    assert framed == FRAMED_REQUEST_LEDGER5_TXN1
    assert framed[:4] == b"\x00\x00\x00\x0d"


def test_enoledger_response_is_byte_exact_with_the_facts_example():
    response = list_entries_response(list_header(), ledger_id=5, status=pb.ENOLEDGER)
    assert response.SerializeToString() == ENOLEDGER_RESPONSE_LEDGER5_TXN1


def test_facts_response_bytes_parse_to_enoledger_for_ledger_5():
    response = parse_response(ENOLEDGER_RESPONSE_LEDGER5_TXN1)
    assert (response.header.version, response.header.operation, response.header.txnId) == (3, 11, 1)
    assert response.status == pb.ENOLEDGER == 402
    inner = response.getListOfEntriesOfLedgerResponse
    assert (inner.status, inner.ledgerId, inner.HasField("availabilityOfEntriesOfLedger")) == (402, 5, False)


def test_facts_request_bytes_parse_on_the_server_side():
    request = parse_request(REQUEST_LEDGER5_TXN1)
    assert request.header.version == pb.VERSION_THREE
    assert request.header.operation == pb.GET_LIST_OF_ENTRIES_OF_LEDGER
    assert request.header.txnId == 1
    assert not request.header.HasField("priority")  # BookKeeper's client does not set it
    assert request.getListOfEntriesOfLedgerRequest.ledgerId == 5


def test_framed_facts_request_decodes_through_the_frame_decoder():
    assert FrameDecoder().feed(FRAMED_REQUEST_LEDGER5_TXN1) == [REQUEST_LEDGER5_TXN1]


# ---------------------------------------------------------------------------------------------- builders


def test_read_entry_request_is_a_plain_read_without_master_key_or_fencing():
    request = read_entry_request(ledger_id=5, entry_id=9, txn_id=77)
    assert request.header.operation == pb.READ_ENTRY and request.header.version == pb.VERSION_THREE
    assert (request.readRequest.ledgerId, request.readRequest.entryId) == (5, 9)
    assert not request.readRequest.HasField("masterKey")
    assert not request.readRequest.HasField("flag")
    assert parse_request(request.SerializeToString()) == request


@pytest.mark.parametrize("txn_id", [0, 1, 2**63, 2**64 - 1])
def test_any_uint64_txn_id_round_trips(txn_id):
    framed = encode_frame(list_entries_request(123, txn_id))
    (body,) = FrameDecoder().feed(framed)
    assert parse_request(body).header.txnId == txn_id
    assert peek_header(body) == (txn_id, pb.GET_LIST_OF_ENTRIES_OF_LEDGER)


@pytest.mark.parametrize("txn_id", [-1, 2**64])
def test_txn_id_outside_uint64_is_rejected(txn_id):
    with pytest.raises(ValueError, match="uint64"):
        list_entries_request(1, txn_id)


def test_request_with_a_non_v3_version_can_be_built_for_tests():
    assert list_entries_request(5, 1, version=pb.VERSION_TWO).header.version == pb.VERSION_TWO


def test_eok_response_carries_the_availability_bytes_and_echoes_the_header():
    data = encode_availability([1, 2, 3, 5, 6, 7, 8])
    header = list_header(ledger_id=42, txn_id=99)
    response = parse_response(list_entries_response(header, 42, pb.EOK, data).SerializeToString())
    assert response.header == header
    assert response.status == response.getListOfEntriesOfLedgerResponse.status == pb.EOK
    assert response.getListOfEntriesOfLedgerResponse.availabilityOfEntriesOfLedger == data


@pytest.mark.parametrize("status", [pb.EIO, pb.EBADVERSION, pb.ETOOMANYREQUESTS])
def test_error_list_response_has_equal_top_and_inner_status_and_no_bytes(status):
    response = list_entries_response(list_header(), 5, status)
    assert response.status == response.getListOfEntriesOfLedgerResponse.status == status
    assert not response.getListOfEntriesOfLedgerResponse.HasField("availabilityOfEntriesOfLedger")


def test_eua_is_a_status_only_response_like_bookkeepers_auth_handler():
    response = parse_response(status_response(list_header(), pb.EUA).SerializeToString())
    assert response.status == pb.EUA
    assert response.ListFields()[0][0].name == "header" and len(response.ListFields()) == 2


def test_response_echoes_the_request_version_even_when_it_is_not_v3():
    header = list_entries_request(5, 8, version=pb.VERSION_TWO).header
    assert list_entries_response(header, 5, pb.EBADVERSION).header.version == pb.VERSION_TWO


def test_read_entry_responses():
    header = read_entry_request(5, 3, 4).header
    ok = parse_response(read_entry_response(header, 5, 3, pb.EOK, b"body").SerializeToString())
    assert (ok.status, ok.readResponse.body, ok.readResponse.entryId) == (pb.EOK, b"body", 3)
    missing = read_entry_response(header, 5, 3, pb.ENOENTRY)
    assert missing.status == missing.readResponse.status == pb.ENOENTRY
    assert not missing.readResponse.HasField("body")


def test_status_and_operation_names():
    assert frames.status_name(pb.EUA) == "EUA"
    assert frames.status_name(12345) == "status 12345"
    assert frames.operation_name(pb.AUTH) == "AUTH"


# ----------------------------------------------------------------------------------------- frame decoder


def test_decoder_returns_nothing_until_a_frame_is_complete():
    decoder = FrameDecoder()
    for byte in FRAMED_REQUEST_LEDGER5_TXN1[:-1]:
        assert decoder.feed(bytes([byte])) == []
    assert decoder.buffered == len(FRAMED_REQUEST_LEDGER5_TXN1) - 1
    assert decoder.feed(FRAMED_REQUEST_LEDGER5_TXN1[-1:]) == [REQUEST_LEDGER5_TXN1]
    assert decoder.buffered == 0


def test_decoder_splits_pipelined_frames_at_every_cut_point():
    bodies = [list_entries_request(ledger, ledger + 1).SerializeToString() for ledger in range(5)] + [b""]
    stream = b"".join(encode_frame(body) for body in bodies)
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder()
        assert decoder.feed(stream[:cut]) + decoder.feed(stream[cut:]) == bodies
        assert decoder.buffered == 0


@settings(max_examples=200, deadline=None)
@given(
    bodies=st.lists(st.binary(max_size=40), max_size=8),
    chunk_sizes=st.lists(st.integers(min_value=1, max_value=17), min_size=1, max_size=30),
)
def test_decoder_output_does_not_depend_on_how_the_stream_is_chunked(bodies, chunk_sizes):
    stream = b"".join(encode_frame(body) for body in bodies)
    decoder, received, offset, index = FrameDecoder(), [], 0, 0
    while offset < len(stream):
        size = chunk_sizes[index % len(chunk_sizes)]
        received += decoder.feed(stream[offset : offset + size])
        offset, index = offset + size, index + 1
    assert received == bodies


def test_decoder_accepts_an_empty_frame():
    assert FrameDecoder().feed(b"\x00\x00\x00\x00") == [b""]


def test_default_max_frame_size_is_bookkeepers_5_mb():
    assert DEFAULT_MAX_FRAME_SIZE == FrameDecoder().max_frame_size == 5 * 1024 * 1024


def test_max_frame_size_counts_the_prefix_like_netty():
    limit = 64
    at_limit = struct.pack(">i", limit - 4) + bytes(limit - 4)
    assert FrameDecoder(limit).feed(at_limit) == [bytes(limit - 4)]
    with pytest.raises(FormatError, match="exceeds the maximum frame size 64"):
        FrameDecoder(limit).feed(struct.pack(">i", limit - 3))


def test_oversize_is_detected_from_the_prefix_alone():
    # A hostile 2 GB length is refused before any body arrives (nothing is buffered for it).
    with pytest.raises(FormatError, match="exceeds"):
        FrameDecoder().feed(b"\x7f\xff\xff\xff")


def test_negative_length_is_a_format_error():
    with pytest.raises(FormatError, match="negative length -1"):
        FrameDecoder().feed(b"\xff\xff\xff\xff")


def test_a_failed_decoder_stays_failed():
    decoder = FrameDecoder()
    with pytest.raises(FormatError):
        decoder.feed(b"\x80\x00\x00\x00")
    assert decoder.failed
    with pytest.raises(FormatError, match="negative length"):
        decoder.feed(FRAMED_REQUEST_LEDGER5_TXN1)


def test_frames_before_a_bad_length_are_lost_with_the_stream():
    # Documented behaviour: a bad length poisons the connection; the caller closes it.
    decoder = FrameDecoder()
    with pytest.raises(FormatError):
        decoder.feed(FRAMED_REQUEST_LEDGER5_TXN1 + b"\xff\xff\xff\xff")


def test_tiny_max_frame_size_is_refused():
    with pytest.raises(ValueError):
        FrameDecoder(max_frame_size=3)


# ---------------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("hex_bytes", "reason"),
    [
        ("", "missing required field header; missing required field status"),
        ("0a060803100b1801", "missing required field status"),
        ("10 00", "missing required field header"),
        ("0a04 0803 100b 1000", "missing required field header.txnId"),
        ("0a060803100b1801 10e707", "unknown status code 999"),
        ("0a06 0805 100b 1801 1000", "unknown protocol version 5"),
        ("0a06 0803 1063 1801 1000", "unknown operation 99"),
        # EOK with an inner answer that lacks its required ledgerId.
        ("0a060803100b1801 1000 e206 020800", "getListOfEntriesOfLedgerResponse.ledgerId"),
    ],
)
def test_parse_response_names_what_is_wrong(hex_bytes, reason):
    with pytest.raises(FormatError, match=reason.replace(".", r"\.")) as caught:
        parse_response(bytes.fromhex(hex_bytes.replace(" ", "")))
    assert str(caught.value).startswith("response: ")


def test_parse_response_rejects_corrupt_protobuf():
    with pytest.raises(FormatError, match="undecodable protobuf"):
        parse_response(b"\x0a\xff")


def test_parse_request_rejects_a_response_missing_request_fields():
    with pytest.raises(FormatError, match=r"^request: "):
        parse_request(b"\x12\x00")


def test_peek_header_finds_the_txn_of_an_otherwise_invalid_answer():
    assert peek_header(bytes.fromhex("0a060803100b180710e707")) == (7, pb.GET_LIST_OF_ENTRIES_OF_LEDGER)
    assert peek_header(b"\xff") is None
    assert peek_header(bytes.fromhex("0a020803")) is None  # header without txnId/operation


# -------------------------------------------------------------------------------- answers → probe results


def test_eok_list_becomes_entry_list():
    data = encode_availability([0, 1, 2, 7])
    result = classify_list_entries_response(list_entries_response(list_header(), 5, pb.EOK, data), 5)
    assert isinstance(result, EntryList) and result.kind == "entry_list" and result.conclusive
    assert list(result.availability.iter_entries()) == [0, 1, 2, 7]


def test_enoledger_becomes_no_ledger_which_counts_as_empty():
    result = classify_list_entries_response(parse_response(ENOLEDGER_RESPONSE_LEDGER5_TXN1), 5)
    assert result == NoLedger() and result.conclusive
    assert availability_of(result) == EntryAvailability.empty()


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (list_entries_response(list_header(), 5, pb.EIO), BookieError(pb.EIO)),
        (list_entries_response(list_header(), 5, pb.EBADVERSION), BookieError(pb.EBADVERSION)),
        (status_response(list_header(), pb.EUA), AuthRequired()),
        (status_response(list_header(), pb.EIO), BookieError(pb.EIO)),
    ],
)
def test_other_statuses_are_not_conclusive(response, expected):
    result = classify_list_entries_response(response, 5)
    assert result == expected and not result.conclusive
    assert availability_of(result) is None


def test_inner_status_wins_when_the_top_level_says_eok():
    response = list_entries_response(list_header(), 5, pb.EOK, bytes(64))
    response.getListOfEntriesOfLedgerResponse.status = pb.ENOLEDGER
    assert classify_list_entries_response(response, 5) == NoLedger()


def test_top_level_error_wins_over_an_inner_eok():
    response = list_entries_response(list_header(), 5, pb.EOK, bytes(64))
    response.status = pb.EIO
    assert classify_list_entries_response(response, 5) == BookieError(pb.EIO)


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        (status_response(list_header(), pb.EOK), "without a getListOfEntriesOfLedgerResponse"),
        (list_entries_response(list_header(), 5, pb.EOK), "without availability bytes"),
        (list_entries_response(list_header(), 6, pb.EOK, bytes(64)), "for ledger 6, asked for 5"),
        (list_entries_response(list_header(), 5, pb.EOK, bytes(10)), "availability: truncated header"),
    ],
)
def test_inconsistent_eok_answers_are_bad_responses(response, reason):
    result = classify_list_entries_response(response, 5)
    assert isinstance(result, BadResponse) and reason in result.reason


def test_read_entry_answers():
    header = read_entry_request(5, 3, 4).header
    classify = classify_read_entry_response
    assert classify(read_entry_response(header, 5, 3, pb.EOK, b"abcd"), 5, 3) == EntryPresent(body_size=4)
    assert classify(read_entry_response(header, 5, 3, pb.ENOENTRY), 5, 3) == NoEntry()
    assert classify(read_entry_response(header, 5, 3, pb.ENOLEDGER), 5, 3) == NoLedger()
    assert classify(read_entry_response(header, 5, 3, pb.EIO), 5, 3) == BookieError(pb.EIO)
    assert classify(status_response(header, pb.EUA), 5, 3) == AuthRequired()
    wrong = classify(read_entry_response(header, 5, 4, pb.EOK, b""), 5, 3)
    assert isinstance(wrong, BadResponse) and "5:4" in wrong.reason


def test_a_read_of_entry_minus_one_gives_the_lac_the_last_entry_carries():
    header = read_entry_request(5, frames.LAST_ADD_CONFIRMED, 4).header
    classify = classify_last_entry_response
    # The LAC sits after ledger id and entry id, whatever digest and payload follow; an echoed entry id of -1
    # (the request's) is not compared with the entry's own id.
    body = frames.encode_entry_header(5, 12, 11, 3) + bytes(8) + b"abc"
    assert classify(read_entry_response(header, 5, -1, pb.EOK, body), 5) == LastConfirmed(11, 12)
    first = frames.encode_entry_header(5, 0, -1, 0)  # the first entry: nothing was confirmed before it
    assert classify(read_entry_response(header, 5, -1, pb.EOK, first), 5) == LastConfirmed(-1, 0)
    assert classify(read_entry_response(header, 5, -1, pb.ENOENTRY), 5) == NoEntry()
    assert classify(read_entry_response(header, 5, -1, pb.ENOLEDGER), 5) == NoLedger()
    assert classify(read_entry_response(header, 5, -1, pb.EIO), 5) == BookieError(pb.EIO)
    short = classify(read_entry_response(header, 5, -1, pb.EOK, body[:20]), 5)
    assert isinstance(short, BadResponse) and "header" in short.reason
    other = classify(read_entry_response(header, 5, -1, pb.EOK, frames.encode_entry_header(6, 1, 0, 0)), 5)
    assert isinstance(other, BadResponse) and "ledger 6" in other.reason


def test_result_kinds_are_distinct_names():
    kinds = {
        cls.kind
        for cls in (
            EntryList,
            NoLedger,
            EntryPresent,
            NoEntry,
            AuthRequired,
            Timeout,
            BookieError,
            BadResponse,
            LastConfirmed,
        )
    }
    assert len(kinds) == 9
    assert BookieError(pb.EIO).status_name == "EIO"


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:3181", ("127.0.0.1", 3181)),
        ("[::1]:1", ("::1", 1)),
        ("b.ns.svc:65535", ("b.ns.svc", 65535)),
    ],
)
def test_bookie_addresses(address, expected):
    assert parse_bookie_address(address) == expected


@pytest.mark.parametrize("address", ["", "host", ":3181", "host:", "host:abc", "host:0", "host:70000"])
def test_bad_bookie_addresses(address):
    with pytest.raises(FormatError):
        parse_bookie_address(address)


# ------------------------------------------------------------------------------------------------- fuzz


def _valid_response_frames() -> list[bytes]:
    header = list_header(ledger_id=5, txn_id=1)
    read_header = read_entry_request(5, 3, 2).header
    return [
        ENOLEDGER_RESPONSE_LEDGER5_TXN1,
        list_entries_response(
            header, 5, pb.EOK, encode_availability([1, 2, 3, 5, 6, 7, 8])
        ).SerializeToString(),
        list_entries_response(header, 5, pb.EIO).SerializeToString(),
        status_response(header, pb.EUA).SerializeToString(),
        read_entry_response(read_header, 5, 3, pb.EOK, b"payload").SerializeToString(),
        read_entry_response(read_header, 5, 3, pb.ENOENTRY).SerializeToString(),
    ]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    choice = rng.randrange(4)
    if choice == 0 and data:  # truncated
        return data[: rng.randrange(len(data))]
    if choice == 1 and data:  # bit flips
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            position = rng.randrange(len(mutated))
            mutated[position] ^= 1 << rng.randrange(8)
        return bytes(mutated)
    if choice == 2:  # random garbage
        return rng.randbytes(rng.randrange(40))
    # valid prefix + random tail
    return data[: rng.randrange(len(data) + 1)] + rng.randbytes(rng.randrange(12))


def test_fuzz_only_format_error_escapes_the_decoder_and_the_parsers():
    rng = random.Random(20240611)
    valid_bodies = _valid_response_frames()
    valid_streams = [encode_frame(body) for body in valid_bodies]
    cases = 0
    outcomes = {"parsed": 0, "format_error": 0}
    for _ in range(6000):
        body = _mutate(rng, rng.choice(valid_bodies))
        stream = _mutate(rng, b"".join(rng.sample(valid_streams, rng.randint(1, 3))))
        for parse in (parse_response, parse_request):
            try:
                parse(body)
                outcomes["parsed"] += 1
            except FormatError:
                outcomes["format_error"] += 1
            cases += 1
        peek_header(body)  # never raises at all
        decoder = FrameDecoder(max_frame_size=rng.choice([64, 1024, DEFAULT_MAX_FRAME_SIZE]))
        try:
            for start in range(0, len(stream), 7):
                for frame in decoder.feed(stream[start : start + 7]):
                    with contextlib.suppress(FormatError):
                        classify_list_entries_response(parse_response(frame), 5)
        except FormatError:
            outcomes["format_error"] += 1
        cases += 1
    assert cases >= 5000 * 3
    assert outcomes["parsed"] > 0 and outcomes["format_error"] > 0  # the fuzz reached both outcomes
