"""Bookie ids, registration paths, BookieServiceInfoFormat (with the legacy fallback) and cookies."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.cookie import (
    Cookie,
    decode_dir_list,
    encode_dir_list,
    format_cookie,
    parse_cookie,
)
from core.domain.registration import (
    BookieAddress,
    BookieServiceInfo,
    Endpoint,
    RegistrationKind,
    RegistrationPath,
    bookie_rpc_address,
    cookie_path,
    decode_bookie_service_info,
    encode_bookie_service_info,
    is_valid_bookie_id,
    legacy_bookie_service_info,
    parse_host_port,
    parse_registration_path,
    readonly_bookie_path,
    validate_bookie_id,
    writable_bookie_path,
)
from core.errors import FormatError
from core.pb import data_formats_pb2 as pb

# Independent statement of BookKeeper's class [a-zA-Z0-9:-_.\-]: ":-_" is the range 0x3A..0x5F.
ALLOWED = set("abcdefghijklmnopqrstuvwxyz0123456789.-") | {chr(c) for c in range(0x3A, 0x60)}
texts = st.text(st.characters(codec="utf-8"), max_size=20)
bookie_ids = st.text(st.sampled_from(sorted(ALLOWED)), min_size=1, max_size=20).filter(
    lambda s: s.lower() != "readonly"
)


# ------------------------------------------------------------------------------------------------ bookie ids


@pytest.mark.parametrize(
    "bookie_id",
    ["10.0.0.1:3181", "bk-1", "bookie_1.example.com:3181", "A;B<C=D>E?F@G[H\\I]J^K_", "READONLY1", "x"],
)
def test_valid_bookie_ids(bookie_id: str) -> None:
    assert is_valid_bookie_id(bookie_id)
    assert validate_bookie_id(bookie_id) == bookie_id


@pytest.mark.parametrize(
    "bookie_id",
    ["", "readonly", "ReadOnly", "READONLY", "a/b", "a b", "a!b", "a`b", "a{b}", "é", "a\nb", "a,b"],
)
def test_invalid_bookie_ids(bookie_id: str) -> None:
    assert not is_valid_bookie_id(bookie_id)
    with pytest.raises(FormatError):
        validate_bookie_id(bookie_id)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=12))
def test_bookie_id_rule_matches_java_class(text: str) -> None:
    expected = bool(text) and set(text) <= ALLOWED and text.lower() != "readonly"
    assert is_valid_bookie_id(text) == expected


def test_non_strings_are_not_bookie_ids() -> None:
    assert not is_valid_bookie_id(5)  # type: ignore[arg-type]
    with pytest.raises(FormatError):
        validate_bookie_id(None)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------- registration paths


def test_registration_paths() -> None:
    assert writable_bookie_path("10.0.0.1:3181") == "/ledgers/available/10.0.0.1:3181"
    assert readonly_bookie_path("10.0.0.1:3181", "/bk") == "/bk/available/readonly/10.0.0.1:3181"
    assert cookie_path("bk-1") == "/ledgers/cookies/bk-1"
    with pytest.raises(FormatError):
        writable_bookie_path("readonly")
    with pytest.raises(FormatError):
        cookie_path("bk-1", "relative")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/ledgers/available/bk1:3181", RegistrationPath(RegistrationKind.WRITABLE, "bk1:3181")),
        ("/ledgers/available/readonly/bk1:3181", RegistrationPath(RegistrationKind.READONLY, "bk1:3181")),
        ("/ledgers/cookies/bk-2", RegistrationPath(RegistrationKind.COOKIE, "bk-2")),
        ("/ledgers/available/readonly", None),
        ("/ledgers/available", None),
        ("/ledgers/cookies", None),
        ("/ledgers/available/bk1:3181/x", None),
        ("/ledgers/available/bad id", None),
        ("/ledgers/available/readonly/readonly", None),
        ("/other/available/bk1:3181", None),
        ("/ledgers/00/0000/L0059", None),
    ],
)
def test_parse_registration_path(path: str, expected: RegistrationPath | None) -> None:
    assert parse_registration_path(path) == expected


@given(bookie_ids)
def test_registration_path_round_trip(bookie_id: str) -> None:
    assert parse_registration_path(writable_bookie_path(bookie_id)) == RegistrationPath(
        RegistrationKind.WRITABLE, bookie_id
    )
    assert parse_registration_path(readonly_bookie_path(bookie_id)) == RegistrationPath(
        RegistrationKind.READONLY, bookie_id
    )
    assert parse_registration_path(cookie_path(bookie_id)) == RegistrationPath(
        RegistrationKind.COOKIE, bookie_id
    )


# ------------------------------------------------------------------------------------- BookieServiceInfo


def test_legacy_fallback_from_facts() -> None:
    for data in (b"", None):
        info = decode_bookie_service_info("10.0.0.1:3181", data)
        assert info == BookieServiceInfo((Endpoint("10.0.0.1:3181", 3181, "10.0.0.1", "bookie-rpc"),))
        assert bookie_rpc_address(info) == BookieAddress("10.0.0.1", 3181)


def test_legacy_fallback_for_ids_that_are_not_addresses() -> None:
    for bookie_id in ("bookie-7", "host:", "host:port", "host:99999", ":3181", "[::1]:3181"):
        info = decode_bookie_service_info(bookie_id, b"")
        assert info.endpoints == ()
        assert bookie_rpc_address(info) is None
    # BookieSocketAddress only looks at the first two ':' parts.
    assert legacy_bookie_service_info("h:3181:x").endpoints[0].port == 3181
    with pytest.raises(FormatError):
        decode_bookie_service_info("not valid", b"")


def test_host_port() -> None:
    assert parse_host_port("bk1.example.com:3181") == BookieAddress("bk1.example.com", 3181)
    assert parse_host_port("h:0") == BookieAddress("h", 0)
    assert parse_host_port("h:65536") is None
    assert parse_host_port("h:+1") is None
    assert parse_host_port("h") is None


def _server_info(tls: bool = True, http: bool = True) -> BookieServiceInfo:
    endpoints = [Endpoint("bookie", 3181, "10.0.0.1", "bookie-rpc", extensions=("tls",) if tls else ())]
    if http:
        endpoints.append(Endpoint("httpserver", 8000, "10.0.0.1", "http"))
    return BookieServiceInfo(tuple(endpoints))


def test_what_a_real_server_publishes_is_byte_exact() -> None:
    info = _server_info()
    reference = pb.BookieServiceInfoFormat()
    reference.endpoints.add(
        id="bookie", port=3181, host="10.0.0.1", protocol="bookie-rpc", extensions=["tls"]
    )
    reference.endpoints.add(id="httpserver", port=8000, host="10.0.0.1", protocol="http")
    data = reference.SerializeToString()
    assert encode_bookie_service_info(info) == data
    assert decode_bookie_service_info("10.0.0.1:3181", data) == info
    assert bookie_rpc_address(info) == BookieAddress("10.0.0.1", 3181)


def test_properties_keep_wire_order_and_encode_key_and_value() -> None:
    info = BookieServiceInfo((), (("zone", "z1"), ("empty", ""), ("a", "1")))
    data = encode_bookie_service_info(info)
    assert data == (
        b":\x0a\x0a\x04zone\x12\x02z1" + b":\x09\x0a\x05empty\x12\x00" + b":\x06\x0a\x01a\x12\x011"
    )
    assert decode_bookie_service_info("b:1", data) == info
    assert info.property("empty") == "" and info.property("missing") is None
    # Duplicate keys on the wire: first position, last value (protobuf-java's map).
    duplicate = data + b":\x09\x0a\x04zone\x12\x01z"
    assert decode_bookie_service_info("b:1", duplicate).properties == (
        ("zone", "z"),
        ("empty", ""),
        ("a", "1"),
    )


def test_properties_written_by_protobuf_decode() -> None:
    message = pb.BookieServiceInfoFormat()
    message.properties["k1"] = "v1"
    message.properties["k2"] = "v2"
    info = decode_bookie_service_info("b:1", message.SerializeToString())
    assert dict(info.properties) == {"k1": "v1", "k2": "v2"}


def test_address_resolution_picks_first_bookie_rpc() -> None:
    first = Endpoint("a", 1, "h1", "bookie-rpc")
    second = Endpoint("b", 2, "h2", "bookie-rpc")
    http = Endpoint("http", 8000, "h0", "http")
    assert bookie_rpc_address(BookieServiceInfo((http, first, second))) == BookieAddress("h1", 1)
    assert bookie_rpc_address(BookieServiceInfo((http,))) is None
    assert bookie_rpc_address(BookieServiceInfo((Endpoint("a", 70000, "h", "bookie-rpc"),))) is None
    assert bookie_rpc_address(BookieServiceInfo((Endpoint("a", 1, "", "bookie-rpc"),))) is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"2\x02\x0a\x00", "required field"),  # endpoint without port, host, protocol
        (b"2\x1c\x0a\x06bookie", "invalid protobuf"),  # truncated
        (b"\xff\xff\xff", "invalid protobuf"),
        (b'2\x1c\n\x06bo\xffkie\x10\xed\x18\x1a\x03bk1"\nbookie-rpc', "not valid UTF-8"),
        (b":\x06\n\x01\xff\x12\x01v", "not valid UTF-8"),
    ],
)
def test_service_info_errors(data: bytes, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        decode_bookie_service_info("b:1", data)


def test_service_info_model_validation() -> None:
    with pytest.raises(FormatError):
        Endpoint("a", 2**31, "h", "p")
    with pytest.raises(FormatError):
        Endpoint("a", 1, "h\ud800", "p")
    with pytest.raises(FormatError):
        BookieServiceInfo((), (("k", "1"), ("k", "2")))
    with pytest.raises(FormatError):
        decode_bookie_service_info("b:1", "text")  # type: ignore[arg-type]


endpoints = st.builds(
    Endpoint,
    texts,
    st.integers(-(2**31), 2**31 - 1),
    texts,
    st.sampled_from(["bookie-rpc", "http", ""]) | texts,
    st.lists(texts, max_size=2).map(tuple),
    st.lists(texts, max_size=2).map(tuple),
)
properties = st.dictionaries(texts, texts, max_size=4).map(lambda d: tuple(d.items()))


@settings(max_examples=300, deadline=None)
@given(st.lists(endpoints, max_size=3).map(tuple), properties)
def test_service_info_round_trip(
    endpoint_list: tuple[Endpoint, ...], props: tuple[tuple[str, str], ...]
) -> None:
    info = BookieServiceInfo(endpoint_list, props)
    data = encode_bookie_service_info(info)
    if data:
        assert decode_bookie_service_info("b:1", data) == info
        assert encode_bookie_service_info(decode_bookie_service_info("b:1", data)) == data
    # Whatever we write, protobuf itself reads the same content.
    reference = pb.BookieServiceInfoFormat.FromString(data)
    assert [e.host for e in reference.endpoints] == [e.host for e in endpoint_list]
    assert dict(reference.properties) == dict(props)


# ---------------------------------------------------------------------------------------------------- cookies

V5_TEXT = (
    "5\n"
    'bookieHost: "10.0.0.1:3181"\n'
    'journalDir: "/data/journal1,/data/journal2"\n'
    'ledgerDirs: "2\\t/data/ledgers1\\t/data/ledgers2"\n'
    'instanceId: "3e1c9c4c-0a6f-4d2b-8e8f-1b2c3d4e5f60"\n'
    'indexDirs: "1\\t/data/index"\n'
)


def test_cookie_v5_byte_exact() -> None:
    cookie = parse_cookie(V5_TEXT.encode())
    assert cookie == Cookie(
        5,
        "10.0.0.1:3181",
        "/data/journal1,/data/journal2",
        "2\t/data/ledgers1\t/data/ledgers2",
        "3e1c9c4c-0a6f-4d2b-8e8f-1b2c3d4e5f60",
        "1\t/data/index",
    )
    assert format_cookie(cookie) == V5_TEXT
    assert cookie.journal_dir_list == ("/data/journal1", "/data/journal2")
    assert decode_dir_list(cookie.ledger_dirs) == ("/data/ledgers1", "/data/ledgers2")
    created = Cookie.create(
        "10.0.0.1:3181",
        ["/data/journal1", "/data/journal2"],
        ["/data/ledgers1", "/data/ledgers2"],
        instance_id="3e1c9c4c-0a6f-4d2b-8e8f-1b2c3d4e5f60",
        index_dirs=["/data/index"],
    )
    assert created == cookie


def test_cookie_v4_without_optional_fields() -> None:
    text = '4\nbookieHost: "bk-1"\njournalDir: "/j"\nledgerDirs: "1\\t/d"\n'
    cookie = parse_cookie(text)
    assert (cookie.layout_version, cookie.instance_id, cookie.index_dirs) == (4, None, None)
    assert format_cookie(cookie) == text


def test_cookie_v3_four_lines() -> None:
    text = "3\n10.0.0.1:3181\n/j1,/j2\n1\t/d\n"
    cookie = parse_cookie(text.encode())
    assert cookie == Cookie(3, "10.0.0.1:3181", "/j1,/j2", "1\t/d")
    assert format_cookie(cookie) == text
    # BufferedReader.readLine semantics: any line terminator, last line may be unterminated.
    assert parse_cookie("3\r\nh\r\nj\rd") == Cookie(3, "h", "j", "d")
    assert parse_cookie("3\nh\nj\n\n") == Cookie(3, "h", "j", "")
    assert parse_cookie(" 3 \nh\nj\nd\nignored\n").bookie_id == "h"


def test_cookie_empty_instance_id_is_kept_for_byte_exactness() -> None:
    text = '5\nbookieHost: "b"\njournalDir: "/j"\nledgerDirs: "1\\t/d"\ninstanceId: ""\n'
    assert format_cookie(parse_cookie(text)) == text


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"x\n",
        b"2\nh\nj\nd\n",
        b"-1\n",
        b"99999999999\n",
        b"3\nh\nj\n",
        b"3\nh",
        b"5\n",
        b'5\nbookieHost: "b"\n',
        b'5\nbookieHost: "b"\njournalDir: "/j"\nledgerDirs: 1\n',
        b"5\n\xff",
        b'5\nbookieHost: "b"\njournalDir: "/j"\nledgerDirs: "x"\nbogus: 1\n',
    ],
)
def test_cookie_errors(data: bytes) -> None:
    with pytest.raises(FormatError):
        parse_cookie(data)


def test_dir_list_encoding() -> None:
    assert encode_dir_list([]) == "0"
    assert decode_dir_list("0") == ()
    for bad in ("3\t/a", "x\t/a", "", "\t/a"):
        with pytest.raises(FormatError):
            decode_dir_list(bad)
    with pytest.raises(FormatError):
        encode_dir_list(["/a\tb"])


def test_cookie_model_validation() -> None:
    with pytest.raises(FormatError):
        Cookie(2, "b", "/j", "1\t/d")
    with pytest.raises(FormatError):
        Cookie(3, "b\nx", "/j", "1\t/d")
    with pytest.raises(FormatError):
        Cookie(3, "b", "/j", "1\t/d", instance_id="i")
    with pytest.raises(FormatError):
        Cookie(5, "b", "/j", "1\t/d", instance_id="\ud800")


line_free = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=20)
dirs = st.lists(st.text(st.characters(codec="utf-8", exclude_characters="\t\r\n"), max_size=8), max_size=3)


@settings(max_examples=300, deadline=None)
@given(
    version=st.integers(4, 7),
    host=texts,
    journals=dirs,
    ledgers=dirs,
    instance=st.none() | texts,
    index=st.none() | dirs,
)
def test_cookie_text_format_round_trip(
    version: int,
    host: str,
    journals: list[str],
    ledgers: list[str],
    instance: str | None,
    index: list[str] | None,
) -> None:
    cookie = Cookie.create(
        host, journals, ledgers, instance_id=instance, index_dirs=index, layout_version=version
    )
    text = format_cookie(cookie)
    assert parse_cookie(text.encode()) == cookie
    assert format_cookie(parse_cookie(text)) == text
    assert decode_dir_list(cookie.ledger_dirs) == tuple(ledgers)


@settings(max_examples=200, deadline=None)
@given(host=line_free, journals=line_free, ledgers=dirs)
def test_cookie_v3_round_trip(host: str, journals: str, ledgers: list[str]) -> None:
    cookie = Cookie(3, host, journals, encode_dir_list(ledgers))
    text = format_cookie(cookie)
    assert parse_cookie(text) == cookie
    assert format_cookie(parse_cookie(text.encode())) == text


# ----------------------------------------------------------------------------------------------------- fuzz


def _mutate(rng: random.Random, seed: bytes) -> bytes:
    data = bytearray(seed)
    choice = rng.randrange(6)
    if choice == 0 and data:
        return bytes(data[: rng.randrange(len(data))])
    if choice == 1 and data:
        for _ in range(rng.randrange(1, 4)):
            index = rng.randrange(len(data))
            data[index] ^= 1 << rng.randrange(8)
        return bytes(data)
    if choice == 2:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
    if choice == 3 and data:
        index = rng.randrange(len(data))
        data[index] = rng.randrange(256)
        return bytes(data)
    if choice == 4:
        index = rng.randrange(len(data) + 1)
        data[index:index] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4)))
        return bytes(data)
    return bytes(data) + bytes(data[: rng.randrange(len(data) + 1)])


def test_fuzz_service_info_only_format_error() -> None:
    rng = random.Random(41)
    seeds = [
        encode_bookie_service_info(_server_info()),
        encode_bookie_service_info(
            BookieServiceInfo(_server_info(False, False).endpoints, (("k", "v"), ("a", "")))
        ),
    ]
    decoded = 0
    for _ in range(3000):
        data = _mutate(rng, rng.choice(seeds))
        try:
            info = decode_bookie_service_info("10.0.0.1:3181", data)
        except FormatError:
            continue
        decoded += 1
        bookie_rpc_address(info)
        assert (
            decode_bookie_service_info("10.0.0.1:3181", encode_bookie_service_info(info) or b"") is not None
        )
    assert decoded > 0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # protobuf's text parser on unknown escapes
def test_fuzz_cookie_only_format_error() -> None:
    rng = random.Random(43)
    seeds = [
        V5_TEXT.encode(),
        b"3\n10.0.0.1:3181\n/j1,/j2\n1\t/d\n",
        b'4\nbookieHost: "b"\njournalDir: "/j"\nledgerDirs: "0"\n',
    ]
    for _ in range(3000):
        data = _mutate(rng, rng.choice(seeds))
        try:
            cookie = parse_cookie(data)
        except FormatError:
            continue
        assert parse_cookie(format_cookie(cookie)) == cookie
