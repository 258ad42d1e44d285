"""Change events: payload builders, envelope, Kafka codec (hostile input → FormatError), replay."""

from __future__ import annotations

import random
from collections import namedtuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import events
from core.domain.metadata import (
    DigestType,
    LedgerMetadata,
    LedgerPassword,
    LedgerState,
    Segment,
    decode_ledger_metadata,
    encode_ledger_metadata,
)
from core.domain.rackmap import parse_rack_map
from core.domain.registration import decode_bookie_service_info
from core.domain.underreplication import UnderreplicatedLedger
from core.errors import FormatError
from core.pb import change_events_pb2 as pb
from tests.unit.test_metadata import varint

Stat = namedtuple("Stat", "czxid mzxid ctime mtime version dataLength")
PASSWORD = b"s3cret-ledger-password"
V3_HEADER = b"BookieMetadataFormatVersion\t3\n"


def metadata(password: bytes = PASSWORD, **overrides: object) -> LedgerMetadata:
    values: dict[str, object] = {
        "ensemble_size": 3,
        "write_quorum": 2,
        "ack_quorum": 2,
        "state": LedgerState.CLOSED,
        "last_entry_id": 99,
        "length": 4096,
        "digest_type": DigestType.CRC32C,
        "password": LedgerPassword(password),
        "segments": (
            Segment(0, ("b1:3181", "b2:3181", "b3:3181")),
            Segment(50, ("b1:3181", "b4:3181", "b3:3181")),
        ),
        "ctime": 1700000000000,
        "ctoken": 0,
        "custom_metadata": (
            ("pulsar/managed-ledger", b"public/default/persistent/orders"),
            ("k", b"\x00\xff"),
        ),
    }
    values.update(overrides)
    return LedgerMetadata(**values)  # type: ignore[arg-type]


def builder() -> events.EventBuilder:
    return events.EventBuilder("cluster-1", "run-1", clock_ms=lambda: 1_000)


def all_payloads() -> list[events.Payload]:
    md = metadata()
    info = decode_bookie_service_info("10.0.0.1:3181", b"")
    return [
        events.ledger_upserted(7, md, Stat(1, 2, 3, 4, 5, 6), "/ledgers/00/0000/L0007"),
        events.ledger_deleted(7, last_mzxid=2, last_version=5, inferred=True),
        events.ledger_undecodable(8, "/ledgers/00/0000/L0008", Stat(1, 1, 0, 0, 0, 9), "bad"),
        events.bookie_status("10.0.0.1:3181", pb.BookieStatus.WRITABLE, info=info, has_cookie=True),
        events.bookie_status("bk-2", pb.BookieStatus.GONE),
        events.underreplication_set(7, UnderreplicatedLedger(("b1:3181",), 5), Stat(1, 2, 3, 4, 0, 10)),
        events.underreplication_cleared(7, last_mzxid=3, inferred=True),
        events.recovery_delay(30, present=True, stat=Stat(1, 2, 3, 4, 0, 2)),
        events.recovery_delay(None, present=False),
        events.rack_map_event(
            "zookeeper:/bookies", parse_rack_map('{"g": {"b1:3181": {"rack": "r"}}}'), present=True
        ),
        events.snapshot_begin(
            "s", pb.SnapshotBegin.START, pb.SnapshotBegin.FULL, partition=1, partition_count=4
        ),
        events.snapshot_end(
            "s",
            pb.SnapshotBegin.FULL,
            complete=True,
            partition=1,
            partition_count=4,
            partition_events=3,
            counts=events.SnapshotCounts(1, 2, 3, 4, 5, 6),
            duration_ms=7,
        ),
        events.heartbeat(1_000, partition=3, partition_count=4, last_zxid=99),
    ]


# ---------------------------------------------------------------------------------------------- builders


def test_ledger_metadata_carries_everything_but_the_password() -> None:
    md = metadata()
    message = events.ledger_metadata_message(md)
    assert (message.ensemble_size, message.write_quorum, message.ack_quorum) == (3, 2, 2)
    assert message.state == pb.LedgerMetadata.CLOSED
    assert (message.last_entry_id, message.length) == (99, 4096)
    assert message.digest_type == pb.LedgerMetadata.CRC32C
    assert message.has_password
    assert [(s.first_entry_id, list(s.ensemble)) for s in message.segments] == [
        (0, ["b1:3181", "b2:3181", "b3:3181"]),
        (50, ["b1:3181", "b4:3181", "b3:3181"]),
    ]
    assert message.ctime_ms == message.creation_time_ms == 1700000000000
    assert message.HasField("ctoken") and message.ctoken == 0
    assert [(c.key, c.value) for c in message.custom_metadata] == list(md.custom_metadata)
    assert message.pulsar_topic == "persistent://public/default/orders"
    assert PASSWORD not in message.SerializeToString()
    assert "password" not in {f.name for f in pb.LedgerMetadata.DESCRIPTOR.fields}


def test_ledger_metadata_without_stored_ctime_uses_the_znode_ctime_and_no_digest_without_password() -> None:
    md = LedgerMetadata(
        ensemble_size=1, write_quorum=1, ack_quorum=1, segments=(Segment(0, ("b:1",)),), znode_ctime=42
    )
    message = events.ledger_metadata_message(md)
    assert not message.HasField("ctime_ms") and message.creation_time_ms == 42
    assert not message.has_password and message.digest_type == pb.LedgerMetadata.DIGEST_TYPE_UNSPECIFIED
    assert not message.HasField("pulsar_topic") and not message.HasField("ctoken")


def test_a_v1_ledger_decodes_into_an_event() -> None:
    blob = (
        b"BookieMetadataFormatVersion\t1\n2\n3\n0\n"
        b"0\t10.0.0.1:3181\t10.0.0.2:3181\t10.0.0.3:3181\n-102\tCLOSED"
    )
    message = events.ledger_metadata_message(decode_ledger_metadata(blob, znode_ctime=5))
    assert message.format_version == 1 and message.state == pb.LedgerMetadata.IN_RECOVERY
    assert message.ack_quorum == 2 and not message.has_password


def test_bookie_status_from_registration_and_legacy_ids() -> None:
    info = decode_bookie_service_info("10.0.0.1:3181", b"")
    message = events.bookie_status(
        "10.0.0.1:3181", pb.BookieStatus.READ_ONLY, info=info, registration=Stat(5, 6, 7, 8, 0, 0)
    )
    assert message.rpc_address == "10.0.0.1:3181" and message.registration.czxid == 5
    assert not message.has_cookie
    unresolvable = events.bookie_status(
        "bookie-7", pb.BookieStatus.WRITABLE, info=decode_bookie_service_info("bookie-7", b"")
    )
    assert unresolvable.rpc_address == "" and not unresolvable.endpoints


def test_envelope_sequence_time_and_keys() -> None:
    clock = iter([5, 3, 9])
    b = events.EventBuilder("c", "r", clock_ms=lambda: next(clock))
    first = b.build(events.ledger_deleted(1))
    second = b.build(events.bookie_status("bk", pb.BookieStatus.GONE), snapshot_id="snap")
    third = b.build(events.heartbeat(9, partition=0, partition_count=1), event_time_ms=9)
    assert [e.sequence for e in (first, second, third)] == [1, 2, 3]
    assert [e.event_time_ms for e in (first, second, third)] == [5, 5, 9]
    assert [e.entity_key for e in (first, second, third)] == ["ledger/1", "bookie/bk", "cluster"]
    assert second.snapshot_id == "snap" and first.snapshot_id == ""
    assert events.kafka_key(second) == b"bookie/bk"
    with pytest.raises(FormatError):
        events.EventBuilder("", "r")


def test_every_payload_round_trips_through_the_codec() -> None:
    b = builder()
    for payload in all_payloads():
        event = b.build(payload)
        decoded = events.decode_event(events.encode_event(event))
        assert decoded == event
        assert events.payload_type(decoded) == events._FIELD_BY_TYPE[type(payload)]
        assert decoded.entity_key == events.entity_key_of(payload)


def test_entity_keys_parse_back() -> None:
    assert events.parse_entity_key(events.ledger_key(2**63 - 1)) == (events.EntityKind.LEDGER, 2**63 - 1)
    assert events.parse_entity_key("bookie/a:1") == (events.EntityKind.BOOKIE, "a:1")
    for bad in ("", "ledger/", "ledger/-1", "ledger/9223372036854775808", "bookie/", "Ledger/1", "ledger/1x"):
        with pytest.raises(FormatError):
            events.parse_entity_key(bad)


# ---------------------------------------------------------------------------------------------- hostile input


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "no schema version"),
        (b"\x08\x01", "no cluster"),
        (b"\x08\x01\x12\x01c", "no payload"),
        (b"\x08\x07\x12\x01c", "newer than this reader"),
        (b"\xff\xff\xff", "not a valid protobuf"),
        (b"\x12\x03\xff\xfe\xfd", "not a valid protobuf"),  # cluster string is not UTF-8
        (b"\x0a" * 100, "not a valid protobuf"),
    ],
)
def test_bad_bytes_raise_format_error(data: bytes, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        events.decode_event(data)


def test_inconsistent_envelopes_are_rejected() -> None:
    event = builder().build(events.ledger_deleted(5))
    event.entity_key = "ledger/6"
    with pytest.raises(FormatError, match="does not match"):
        events.decode_event(events.encode_event(event))
    event = builder().build(events.ledger_deleted(5))
    event.ledger_deleted.ledger_id = -5
    event.entity_key = "ledger/-5"
    with pytest.raises(FormatError, match="negative ledger id"):
        events.decode_event(events.encode_event(event))
    event = builder().build(events.bookie_status("bk", pb.BookieStatus.GONE))
    event.bookie_status.bookie_id = ""
    event.entity_key = "bookie/"
    with pytest.raises(FormatError, match="without a bookie id"):
        events.decode_event(events.encode_event(event))
    event = builder().build(events.bookie_probe("bk", answered=True, address="bk", detail="answered"))
    event.bookie_probe.bookie_id = ""
    event.entity_key = "bookie/"
    with pytest.raises(FormatError, match="bookie probe without a bookie id"):
        events.decode_event(events.encode_event(event))
    event = builder().build(events.bookie_probe("bk", answered=True, address="bk", detail="answered"))
    event.entity_key = "cluster"
    with pytest.raises(FormatError, match="does not match its bookie_probe payload"):
        events.decode_event(events.encode_event(event))
    with pytest.raises(FormatError, match="expected bytes"):
        events.decode_event("text")  # type: ignore[arg-type]
    with pytest.raises(FormatError, match="accepted"):
        events.decode_event(b"\x00" * (events.MAX_EVENT_BYTES + 1))


def _assert_valid_or_format_error(data: bytes) -> None:
    try:
        event = events.decode_event(data)
    except FormatError:
        return
    events.validate_event(event)  # whatever decodes is a consistent event
    assert events.decode_event(events.encode_event(event)) == event


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_fuzz_random_bytes_never_escape_as_another_error(data: bytes) -> None:
    _assert_valid_or_format_error(data)


_VALID = [events.encode_event(builder().build(p)) for p in all_payloads()]


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(_VALID),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
    st.integers(0, 50),
)
def test_fuzz_mutated_events_never_escape_as_another_error(
    blob: bytes, flips: list[tuple[int, int]], cut: int
) -> None:
    mutated = bytearray(blob)
    for position, value in flips:
        mutated[position % len(mutated)] = value
    _assert_valid_or_format_error(bytes(mutated))
    _assert_valid_or_format_error(bytes(mutated[: max(0, len(mutated) - cut)]))


@settings(max_examples=300, deadline=None)
@given(secret=st.binary(min_size=4, max_size=64), ledger_id=st.integers(0, 2**63 - 1))
def test_fuzz_no_password_byte_run_reaches_an_event(secret: bytes, ledger_id: int) -> None:
    password = b"\xfe\xfdPW" + secret  # a marker so that the check cannot hit other fields by chance
    md = decode_ledger_metadata(encode_ledger_metadata(metadata(password)), ledger_id=ledger_id)
    event = builder().build(events.ledger_upserted(ledger_id, md, Stat(1, 2, 3, 4, 0, 100), "/p"))
    assert password not in events.encode_event(event)


def test_undecodable_reasons_never_copy_znode_bytes() -> None:
    rng = random.Random(5)
    good = encode_ledger_metadata(metadata())
    for _ in range(300):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[: rng.randrange(len(data))]
        text_form = (
            b'BookieMetadataFormatVersion\t2\npassword: "' + PASSWORD + b'"\nbogus: ' + bytes(data[:10])
        )
        for blob in (bytes(data), text_form):
            try:
                decode_ledger_metadata(blob)
            except FormatError as err:
                reason = events.redact_reason(str(err), blob)
                assert PASSWORD.decode() not in reason
                assert len(reason) <= events.MAX_REASON_CHARS
                for token in reason.split():
                    if len(token) >= 4 and token not in ("<…>", "…"):
                        assert token.encode() not in blob or token in str(err).split()[:3], (token, reason)


def test_redaction_keeps_the_decoder_context() -> None:
    reason = events.redact_reason("ledger metadata v2: 3:1 : Expected identifier, got: 'pw-123'", b"pw-123")
    assert reason == "ledger metadata v2: 3:1 : Expected identifier, got: <…>"
    assert len(events.redact_reason("x" * 1000, b"")) == events.MAX_REASON_CHARS


# ---------------------------------------------------------------------------------------------- replay


def _md() -> LedgerMetadata:
    return metadata()


def test_replay_keeps_the_highest_mzxid_and_honours_deletes() -> None:
    b = builder()
    state = events.ReplayedState()

    def up(mzxid: int, version: int) -> pb.ChangeEvent:
        return b.build(events.ledger_upserted(1, _md(), Stat(1, mzxid, 0, 0, version, 1), "/p"))

    state.apply(up(5, 1), partition=0)
    state.apply(up(5, 1), partition=0)  # duplicate
    state.apply(up(3, 0), partition=0)  # stale
    assert state.ledger_versions() == {1: (5, 1)}
    state.apply(b.build(events.ledger_deleted(1, last_mzxid=5)), partition=0)
    state.apply(up(5, 1), partition=0)  # a stale read after the delete stays deleted
    assert state.ledger_versions() == {}
    state.apply(up(9, 0), partition=0)  # re-created later
    assert state.ledger_versions() == {1: (9, 0)}
    state.apply(b.build(events.ledger_undecodable(1, "/p", Stat(1, 10, 0, 0, 1, 3), "bad")), partition=0)
    assert state.ledgers[1].undecodable_reason == "bad"


def test_replay_infers_vanished_entities_from_complete_full_brackets_per_partition() -> None:
    b = builder()
    state = events.ReplayedState()
    stat = Stat(1, 5, 0, 0, 0, 1)
    for ledger_id, partition in ((1, 0), (2, 1), (3, 0)):
        state.apply(b.build(events.ledger_upserted(ledger_id, _md(), stat, "/p")), partition=partition)
    state.apply(b.build(events.underreplication_set(3, UnderreplicatedLedger(("b",)), stat)), partition=0)
    state.apply(b.build(events.bookie_status("bk", pb.BookieStatus.WRITABLE)), partition=0)

    def bracket(partition: int, snapshot: str, complete: bool, *inside: events.Payload) -> None:
        begin = events.snapshot_begin(
            snapshot, pb.SnapshotBegin.START, pb.SnapshotBegin.FULL, partition=partition, partition_count=2
        )
        state.apply(b.build(begin, snapshot_id=snapshot), partition=partition)
        for payload in inside:
            state.apply(b.build(payload, snapshot_id=snapshot), partition=partition)
        end = events.snapshot_end(
            snapshot, pb.SnapshotBegin.FULL, complete=complete, partition=partition, partition_count=2,
            partition_events=len(inside), counts=events.SnapshotCounts(), duration_ms=1,
        )  # fmt: skip
        state.apply(b.build(end, snapshot_id=snapshot), partition=partition)

    # An incomplete bracket proves nothing.
    bracket(0, "s1", False)
    assert set(state.ledger_versions()) == {1, 2, 3}
    # Partition 0's complete bracket names ledger 3 (not its mark) only: ledger 1 and the bookie vanished,
    # the mark was cleared; partition 1's ledger 2 is untouched.
    bracket(0, "s2", True, events.ledger_upserted(3, _md(), stat, "/p"))
    assert set(state.ledger_versions()) == {2, 3}
    assert state.mark_replicas() == {}
    assert state.bookie_statuses() == {"bk": "GONE"}
    assert state.live_bookie_statuses() == {}
    assert "s2" in state.completed_snapshots


def test_replay_tracks_cluster_level_state() -> None:
    b = builder()
    state = events.ReplayedState()
    state.apply(b.build(events.recovery_delay(30, present=True)), partition=0)
    state.apply(b.build(events.rack_map_event("file:x", None, present=False)), partition=0)
    state.apply(b.build(events.heartbeat(77, partition=1, partition_count=2)), partition=1)
    assert state.recovery_delay is not None and state.recovery_delay.seconds == 30
    assert state.rack_map is not None and not state.rack_map.present
    assert state.last_heartbeat_ms == {1: 77}
    assert state.clusters == {"cluster-1"}


def test_replay_counts_live_events_inside_a_full_bracket_as_seen() -> None:
    b = builder()
    state = events.ReplayedState()
    stat = Stat(1, 5, 0, 0, 0, 1)
    begin = events.snapshot_begin(
        "s", pb.SnapshotBegin.START, pb.SnapshotBegin.FULL, partition=0, partition_count=1
    )
    state.apply(b.build(begin, snapshot_id="s"), partition=0)
    # Created after the scan passed its directory: only a live event tells about it.
    state.apply(b.build(events.ledger_upserted(9, _md(), stat, "/p")), partition=0)
    end = events.snapshot_end(
        "s", pb.SnapshotBegin.FULL, complete=True, partition=0, partition_count=1, partition_events=0,
        counts=events.SnapshotCounts(), duration_ms=1,
    )  # fmt: skip
    state.apply(b.build(end, snapshot_id="s"), partition=0)
    assert set(state.ledger_versions()) == {9}


def test_a_ledger_znode_with_a_field_a_newer_bookkeeper_added_is_published_like_the_ledger_without_it():
    """The watcher publishes what decode reads: the new field is skipped, the ledger is not undecodable."""
    after_header = encode_ledger_metadata(metadata())[len(V3_HEADER) :]
    prefix_length = next(index + 1 for index, byte in enumerate(after_header) if byte < 0x80)  # a varint
    body = after_header[prefix_length:] + b"\xa0\x06\x05\xa2\x06\x03new"  # field 100: varint, then bytes
    newer = V3_HEADER + varint(len(body)) + body
    md = decode_ledger_metadata(newer, ledger_id=7)
    stat = Stat(1, 2, 3, 4, 5, len(newer))
    assert md.wire.unknown_fields == ("field 100",)
    assert events.ledger_upserted(7, md, stat, "/p") == events.ledger_upserted(7, metadata(), stat, "/p")
