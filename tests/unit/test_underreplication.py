"""Under-replication tree: urL paths, marks, rereplication LAYOUT, recovery delay, ctime znodes, lock/vote."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.underreplication import (
    REREPLICATION_LAYOUT,
    CtimeZnode,
    RereplicationLayout,
    UnderreplicatedLedger,
    UnderreplicationPaths,
    format_auditor_vote,
    format_ctime,
    format_lock_data,
    format_lost_bookie_recovery_delay,
    format_rereplication_layout,
    format_underreplicated_ledger,
    ledger_id_from_urledger_path,
    parse_auditor_vote,
    parse_ctime,
    parse_lock_data,
    parse_lost_bookie_recovery_delay,
    parse_rereplication_layout,
    parse_underreplicated_ledger,
    parse_urledger_path,
    urledger_lock_path,
    urledger_path,
    vote_sequence,
)
from core.errors import FormatError

MAX_ID = 2**63 - 1
ids = st.one_of(
    st.integers(0, MAX_ID), st.sampled_from([0, 59, 2147483646, 2147483647, 2**32, 10**10, MAX_ID])
)
# Any Unicode text without lone surrogates (which UTF-8 cannot carry).
texts = st.text(st.characters(codec="utf-8"), max_size=30)

# ---------------------------------------------------------------------------------------------------- paths


def test_urledger_path_from_facts() -> None:
    assert urledger_path(59) == "/ledgers/underreplication/ledgers/0000/0000/0000/003b/urL0000000059"
    assert ledger_id_from_urledger_path(urledger_path(59)) == 59


def test_urledger_paths_at_the_edges() -> None:
    assert urledger_path(0) == "/ledgers/underreplication/ledgers/0000/0000/0000/0000/urL0000000000"
    assert urledger_path(0xCAFEBEEF0000FEED & MAX_ID, "/bk") == (
        "/bk/underreplication/ledgers/4afe/beef/0000/feed/urL" + str(0xCAFEBEEF0000FEED & MAX_ID)
    )
    assert urledger_path(MAX_ID).endswith("/7fff/ffff/ffff/ffff/urL9223372036854775807")
    for bad in (-1, MAX_ID + 1):
        with pytest.raises(FormatError):
            urledger_path(bad)
    with pytest.raises(FormatError):
        urledger_path(1, "bad-root")


def test_every_underreplication_path() -> None:
    paths = UnderreplicationPaths("/pulsar/ledgers")
    assert paths.base == "/pulsar/ledgers/underreplication"
    assert paths.urledgers == "/pulsar/ledgers/underreplication/ledgers"
    assert paths.locks == "/pulsar/ledgers/underreplication/locks"
    assert paths.layout == "/pulsar/ledgers/underreplication/LAYOUT"
    assert paths.disable == "/pulsar/ledgers/underreplication/disable"
    assert paths.lost_bookie_recovery_delay == "/pulsar/ledgers/underreplication/lostBookieRecoveryDelay"
    assert paths.auditor_election == "/pulsar/ledgers/underreplication/auditorelection"
    assert (
        paths.ctime(CtimeZnode.CHECK_ALL_LEDGERS) == "/pulsar/ledgers/underreplication/checkallledgersctime"
    )
    assert paths.ctime(CtimeZnode.PLACEMENT_POLICY_CHECK).endswith("/placementpolicycheckctime")
    assert paths.ctime(CtimeZnode.REPLICAS_CHECK).endswith("/replicascheckctime")
    assert urledger_lock_path(59) == "/ledgers/underreplication/locks/urL0000000059"


@settings(max_examples=300, deadline=None)
@given(ids)
def test_urledger_path_round_trip(ledger_id: int) -> None:
    path = urledger_path(ledger_id)
    assert ledger_id_from_urledger_path(path) == ledger_id
    assert parse_urledger_path(path) == ledger_id
    assert ledger_id_from_urledger_path(urledger_lock_path(ledger_id)) == ledger_id
    assert parse_urledger_path(path.rsplit("/", 1)[0]) is None


def test_id_extraction_is_javas_regex() -> None:
    assert ledger_id_from_urledger_path("anything/urL12") == 12
    assert ledger_id_from_urledger_path("urL0000000059\n") == 59  # Java's $ allows a final line terminator
    for bad in ("urL", "urLx", "/a/urL12/b", "urL99999999999999999999", "urL١٢"):
        with pytest.raises(FormatError):
            ledger_id_from_urledger_path(bad)


def test_strict_path_parse_refuses_non_canonical() -> None:
    assert parse_urledger_path("/ledgers/underreplication/ledgers/0000/0000/0000/003c/urL0000000059") is None
    assert parse_urledger_path("/ledgers/underreplication/ledgers/0000/0000/0000/003b/urL59") is None
    assert parse_urledger_path("/ledgers/underreplication/locks/urL0000000059") is None
    assert parse_urledger_path("/other/underreplication/ledgers/0000/0000/0000/003b/urL0000000059") is None
    assert parse_urledger_path(urledger_path(59) + "\n") is None


# ----------------------------------------------------------------------------------------------------- mark


def test_mark_from_facts_byte_exact() -> None:
    data = b'replica: "10.0.0.5:3181"\nctime: 1718000000000\n'
    mark = parse_underreplicated_ledger(data)
    assert mark == UnderreplicatedLedger(("10.0.0.5:3181",), 1718000000000)
    assert format_underreplicated_ledger(mark).encode() == data


def test_placement_repair_mark_has_no_replicas() -> None:
    assert parse_underreplicated_ledger(b"ctime: 1\n") == UnderreplicatedLedger((), 1)
    assert format_underreplicated_ledger(UnderreplicatedLedger(())) == ""


def test_mark_escapes_like_java() -> None:
    mark = UnderreplicatedLedger(('a"b\\c\té',), -5)
    text = format_underreplicated_ledger(mark)
    assert text == 'replica: "a\\"b\\\\c\\t\\303\\251"\nctime: -5\n'
    assert parse_underreplicated_ledger(text) == mark


@settings(max_examples=300, deadline=None)
@given(st.lists(texts, max_size=5), st.none() | st.integers(-(2**63), 2**63 - 1))
def test_mark_round_trip(replicas: list[str], ctime: int | None) -> None:
    mark = UnderreplicatedLedger(tuple(replicas), ctime)
    text = format_underreplicated_ledger(mark)
    assert parse_underreplicated_ledger(text.encode()) == mark
    assert format_underreplicated_ledger(parse_underreplicated_ledger(text)) == text


@pytest.mark.parametrize(
    "data",
    [
        b"replica: 5\n",
        b"ctime: x\n",
        b"ctime: 99999999999999999999\n",
        b"bogus: 1\n",
        b'replica: "\xff"',
        b"{",
    ],
)
def test_mark_errors(data: bytes) -> None:
    with pytest.raises(FormatError):
        parse_underreplicated_ledger(data)


def test_mark_model_validation() -> None:
    with pytest.raises(FormatError):
        UnderreplicatedLedger(["a"])  # type: ignore[arg-type]
    with pytest.raises(FormatError):
        UnderreplicatedLedger((), 2**63)
    with pytest.raises(FormatError):
        UnderreplicatedLedger(("\ud800",))


# ------------------------------------------------------------------------------------- rereplication LAYOUT


def test_rereplication_layout_byte_exact() -> None:
    assert format_rereplication_layout() == 'type: "BASIC"\nversion: 1\n'
    assert parse_rereplication_layout(b'type: "BASIC"\nversion: 1\n') == REREPLICATION_LAYOUT


@pytest.mark.parametrize(
    "data", [b'type: "FANCY"\nversion: 1\n', b'type: "BASIC"\nversion: 2\n', b'type: "basic"\nversion: 1\n']
)
def test_rereplication_layout_mismatch(data: bytes) -> None:
    with pytest.raises(FormatError, match="incompatible"):
        parse_rereplication_layout(data)
    layout = parse_rereplication_layout(data, require_compatible=False)
    assert format_rereplication_layout(layout).encode() == data


@pytest.mark.parametrize("data", [b"", b'type: "BASIC"\n', b"version: 1\n", b"type: BASIC\nversion: 1\n"])
def test_rereplication_layout_invalid(data: bytes) -> None:
    with pytest.raises(FormatError):
        parse_rereplication_layout(data)


def test_rereplication_layout_encoder_refuses_bad_models() -> None:
    with pytest.raises(FormatError):
        format_rereplication_layout(RereplicationLayout("BASIC", 2**31))


# ------------------------------------------------------------------------------------ lostBookieRecoveryDelay


@pytest.mark.parametrize(
    ("data", "value"), [(b"0", 0), (b"30", 30), (b"+7", 7), (b"007", 7), ("2147483647", 2**31 - 1)]
)
def test_recovery_delay(data: bytes | str, value: int) -> None:
    assert parse_lost_bookie_recovery_delay(data) == value


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not a decimal"),
        (b" 5", "not a decimal"),
        (b"5\n", "not a decimal"),
        (b"5s", "not a decimal"),
        (b"0x10", "not a decimal"),
        (b"1.5", "not a decimal"),
        (b"-1", "negative"),
        (b"2147483648", "32-bit"),
        (b"99999999999999999999999", "32-bit"),
        (b"\xff", "not ASCII"),
        ("٣", "not a decimal"),
    ],
)
def test_recovery_delay_errors(data: bytes | str, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        parse_lost_bookie_recovery_delay(data)


@given(st.integers(0, 2**31 - 1))
def test_recovery_delay_round_trip(seconds: int) -> None:
    text = format_lost_bookie_recovery_delay(seconds)
    assert text == str(seconds)
    assert parse_lost_bookie_recovery_delay(text.encode()) == seconds


@pytest.mark.parametrize("bad", [-1, 2**31, True, "5"])
def test_recovery_delay_encoder_errors(bad: object) -> None:
    with pytest.raises(FormatError):
        format_lost_bookie_recovery_delay(bad)  # type: ignore[arg-type]


# -------------------------------------------------------------------------------------------- ctime znodes


@pytest.mark.parametrize("kind", list(CtimeZnode))
def test_ctime_byte_exact(kind: CtimeZnode) -> None:
    assert format_ctime(kind, 1718000000000) == b"\x08\x80\xb8\x9e\x86\x80\x32"
    assert parse_ctime(kind, b"\x08\x80\xb8\x9e\x86\x80\x32") == 1718000000000
    assert format_ctime(kind, None) == b""
    assert parse_ctime(kind, b"") is None
    assert parse_ctime(kind, format_ctime(kind, -1)) == -1


@pytest.mark.parametrize("kind", list(CtimeZnode))
@given(st.none() | st.integers(-(2**63), 2**63 - 1))
def test_ctime_round_trip(kind: CtimeZnode, ctime: int | None) -> None:
    data = format_ctime(kind, ctime)
    assert parse_ctime(kind, data) == ctime
    assert format_ctime(kind, parse_ctime(kind, data)) == data


@pytest.mark.parametrize("data", [b"\x08", b"\x08\xff", b"\x0a\x05ab", b"\xff\xff\xff"])
def test_ctime_errors(data: bytes) -> None:
    with pytest.raises(FormatError):
        parse_ctime(CtimeZnode.REPLICAS_CHECK, data)


def test_ctime_type_errors() -> None:
    with pytest.raises(FormatError):
        parse_ctime(CtimeZnode.REPLICAS_CHECK, "text")  # type: ignore[arg-type]
    with pytest.raises(FormatError):
        format_ctime(CtimeZnode.REPLICAS_CHECK, 2**63)


# -------------------------------------------------------------------------------------------- lock and vote


def test_lock_and_vote_byte_exact() -> None:
    assert format_lock_data("worker-1") == 'bookieId: "worker-1"\n'
    assert parse_lock_data(b'bookieId: "worker-1"\n') == "worker-1"
    assert format_lock_data(None) == ""
    assert parse_lock_data(b"") is None
    assert format_auditor_vote("10.0.0.1:3181") == 'bookieId: "10.0.0.1:3181"\n'
    assert parse_auditor_vote(b'bookieId: "10.0.0.1:3181"\n') == "10.0.0.1:3181"
    assert parse_auditor_vote(b"") is None


@given(st.none() | texts)
def test_lock_and_vote_round_trip(bookie_id: str | None) -> None:
    assert parse_lock_data(format_lock_data(bookie_id)) == bookie_id
    assert parse_auditor_vote(format_auditor_vote(bookie_id).encode()) == bookie_id


def test_lock_and_vote_errors() -> None:
    for parse in (parse_lock_data, parse_auditor_vote):
        with pytest.raises(FormatError):
            parse(b"bookieId: 5\n")
    with pytest.raises(FormatError):
        format_lock_data("\udc00")
    with pytest.raises(FormatError):
        format_auditor_vote("\udc00")


def test_vote_sequence() -> None:
    assert vote_sequence("V_0000000003") == 3
    assert vote_sequence("/ledgers/underreplication/auditorelection/V_0000000012") == 12
    assert vote_sequence("V_-2147483648") == -(2**31)
    for bad in ("V_", "X_0000000001", "V_0000000001x", "V_12345678901"):
        with pytest.raises(FormatError):
            vote_sequence(bad)


# ----------------------------------------------------------------------------------------------------- fuzz


def _mutate(rng: random.Random, seed: bytes) -> bytes:
    data = bytearray(seed)
    choice = rng.randrange(6)
    if choice == 0 and data:
        return bytes(data[: rng.randrange(len(data))])
    if choice == 1 and data:
        index = rng.randrange(len(data))
        data[index] ^= 1 << rng.randrange(8)
        return bytes(data)
    if choice == 2:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(48)))
    if choice == 3:
        alphabet = b'replica:ctime"bookieId type BASIC version \\n0123456789-{}#'
        return bytes(rng.choice(alphabet) for _ in range(rng.randrange(48)))
    if choice == 4:
        index = rng.randrange(len(data) + 1)
        data[index:index] = bytes([rng.randrange(256)])
        return bytes(data)
    return bytes(data) * 2


FUZZ_TARGETS: dict[str, tuple[Callable[[bytes], object], list[bytes]]] = {
    "mark": (
        parse_underreplicated_ledger,
        [b'replica: "10.0.0.5:3181"\nctime: 1718000000000\n', b'replica: "a"\nreplica: "b"\n'],
    ),
    "rereplication-layout": (parse_rereplication_layout, [b'type: "BASIC"\nversion: 1\n']),
    "recovery-delay": (parse_lost_bookie_recovery_delay, [b"30", b"2147483647"]),
    "ctime": (lambda d: parse_ctime(CtimeZnode.CHECK_ALL_LEDGERS, d), [b"\x08\x80\xb8\x9e\x86\x80\x32", b""]),
    "lock": (parse_lock_data, [b'bookieId: "worker-1"\n']),
    "vote": (parse_auditor_vote, [b'bookieId: "10.0.0.1:3181"\n']),
    "url-id": (lambda d: ledger_id_from_urledger_path(d.decode("latin-1")), [urledger_path(59).encode()]),
    "url-strict": (lambda d: parse_urledger_path(d.decode("latin-1")), [urledger_path(2**40 + 7).encode()]),
}


# protobuf's text parser warns (DeprecationWarning) about unknown escapes such as "\." before rejecting them.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("target", sorted(FUZZ_TARGETS))
def test_fuzz_only_format_error(target: str) -> None:
    decode, seeds = FUZZ_TARGETS[target]
    rng = random.Random(target)
    for _ in range(1000):
        data = _mutate(rng, rng.choice(seeds))
        with contextlib.suppress(FormatError):
            decode(data)
