"""Pulsar's managed-ledger znodes (:mod:`core.domain.managed_ledger`): every format Pulsar writes decodes to
the same ledgers, and bad bytes are one FormatError, never another exception."""

from __future__ import annotations

import struct

import pytest
from google.protobuf import text_format
from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.managed_ledger import (
    ManagedCursorInfo,
    ManagedLedgerInfo,
    TopicLedger,
    decode_managed_cursor_info,
    decode_managed_ledger_info,
    encode_managed_cursor_info,
    encode_managed_ledger_info,
    managed_ledger_path,
)
from core.errors import FormatError
from core.pb import managed_ledger_pb2 as pb

ids = st.integers(0, 2**63 - 1)
optional_counts = st.one_of(st.none(), st.integers(0, 2**40))
ledgers = st.builds(
    TopicLedger,
    ledger_id=ids,
    entries=optional_counts,
    size=optional_counts,
    timestamp_ms=optional_counts,
    offloaded=st.booleans(),
    bookkeeper_deleted=st.booleans(),
)
infos = st.builds(
    ManagedLedgerInfo,
    ledgers=st.lists(ledgers, max_size=6).map(tuple),
    terminated_at=st.one_of(st.none(), st.tuples(ids, st.integers(-1, 2**40))),
    properties=st.lists(st.tuples(st.text(max_size=8), st.text(max_size=8)), max_size=3).map(tuple),
)


@settings(max_examples=200, deadline=None)
@given(infos, st.sampled_from(["NONE", "ZLIB", "LZ4", "ZSTD", "SNAPPY"]))
def test_what_pulsar_writes_reads_back(info: ManagedLedgerInfo, compression: str) -> None:
    decoded = decode_managed_ledger_info(encode_managed_ledger_info(info, compression=compression))
    # Only a complete offload or a deleted BookKeeper copy writes an offload context: both read back.
    assert decoded == info


@settings(max_examples=100, deadline=None)
@given(infos)
def test_the_text_format_of_pulsar_1_reads_like_the_binary(info: ManagedLedgerInfo) -> None:
    message = pb.ManagedLedgerInfo()
    message.ParseFromString(encode_managed_ledger_info(info))
    assert decode_managed_ledger_info(text_format.MessageToString(message).encode()) == info


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_decode_or_give_one_format_error(data: bytes) -> None:
    for decode in (decode_managed_ledger_info, decode_managed_cursor_info):
        try:
            decode(data)
        except FormatError as err:
            assert "\n" not in str(err)


def _compressed_znode(codec: str, payload: bytes, size: int) -> bytes:
    metadata = pb.ManagedLedgerInfoMetadata(compressionType=codec, uncompressedSize=size).SerializeToString()
    return struct.pack(">HI", 0x4778, len(metadata)) + metadata + payload


@pytest.mark.parametrize("codec", ["ZLIB", "LZ4", "ZSTD", "SNAPPY"])
def test_a_body_that_does_not_decompress_or_has_the_wrong_size_is_refused(codec: str) -> None:
    body = encode_managed_ledger_info(ManagedLedgerInfo((TopicLedger(3),)))
    good = encode_managed_ledger_info(ManagedLedgerInfo((TopicLedger(3),)), compression=codec)
    payload = good[6 + struct.unpack(">I", good[2:6])[0] :]
    with pytest.raises(FormatError, match=f"{codec} data does not decompress"):
        decode_managed_ledger_info(_compressed_znode(codec, b"\xff\xfe not compressed", len(body)))
    with pytest.raises(FormatError, match="the header says 99"):
        decode_managed_ledger_info(_compressed_znode(codec, payload, 99))


@pytest.mark.parametrize("codec", ["ZLIB", "LZ4", "ZSTD", "SNAPPY"])
def test_decompression_never_writes_past_the_stated_size(codec: str) -> None:
    """A small znode that inflates to far more than its header states (a compression bomb) is refused
    without inflating it all; a stated size above the cap is refused before anything is read."""
    bomb = encode_managed_ledger_info(
        ManagedLedgerInfo(properties=(("k", "x" * 3_000_000),)), compression=codec
    )
    payload = bomb[6 + struct.unpack(">I", bomb[2:6])[0] :]
    with pytest.raises(FormatError):
        decode_managed_ledger_info(_compressed_znode(codec, payload, 1_000))
    with pytest.raises(FormatError, match="at most"):
        decode_managed_ledger_info(_compressed_znode(codec, payload, 2**31 - 1))


def test_a_cursor_names_its_ledger_unless_it_keeps_its_position_in_the_znode() -> None:
    cursor = decode_managed_cursor_info(encode_managed_cursor_info(ManagedCursorInfo(12, (7, 3), 1_000)))
    assert cursor.ledger_ids == (12,) and cursor.mark_delete == (7, 3) and cursor.last_active_ms == 1_000
    assert decode_managed_cursor_info(encode_managed_cursor_info(ManagedCursorInfo(None))).ledger_ids == ()
    with pytest.raises(FormatError, match="ManagedCursorInfo does not decode"):
        decode_managed_cursor_info(b"\x10\x01")  # no cursorsLedgerId, which is required


@pytest.mark.parametrize(
    ("topic", "path"),
    [
        ("persistent://public/default/orders", "/managed-ledgers/public/default/persistent/orders"),
        ("persistent://prop/cluster/ns/t", "/managed-ledgers/prop/cluster/ns/persistent/t"),
        ("persistent://t/n/a b", "/managed-ledgers/t/n/persistent/a%20b"),
    ],
)
def test_the_znode_of_a_topic(topic: str, path: str) -> None:
    assert managed_ledger_path(topic) == path


@pytest.mark.parametrize(
    "topic", ["orders", "non-persistent://t/n/x", "persistent://t/x", "persistent://t//x"]
)
def test_a_topic_without_a_managed_ledger_is_refused(topic: str) -> None:
    with pytest.raises(FormatError):
        managed_ledger_path(topic)
