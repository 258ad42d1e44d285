"""Rack maps: Pulsar's /bookies JSON, the flat config form, resolution rules and hostile input."""

from __future__ import annotations

import contextlib
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.rackmap import (
    DEFAULT_RACK,
    DEFAULT_REGION_AND_RACK,
    BookieRackInfo,
    RackMap,
    normalize_rack,
    parse_rack_map,
)
from core.errors import FormatError

# Pulsar's rack map znode (/bookies) in its JSON form
FACTS_EXAMPLE = b"""
{"group1": {"127.0.0.1:3181": {"rack": "/rack0", "hostname": "bookie1.example.com"},
            "127.0.0.2:3181": {"rack": "/rack1", "hostname": "bookie2.example.com"}},
 "group2": {"127.0.0.3:3181": {"rack": "rack0", "hostname": "bookie3.example.com"}}}
"""


def test_facts_example() -> None:
    rack_map = parse_rack_map(FACTS_EXAMPLE)
    assert len(rack_map) == 3
    assert rack_map.get("127.0.0.1:3181") == BookieRackInfo("/rack0", "bookie1.example.com", "group1")
    assert rack_map.rack_of("127.0.0.1:3181") == "/rack0"
    assert rack_map.rack_of("127.0.0.2:3181") == "/rack1"
    assert rack_map.rack_of("127.0.0.3:3181") == "/rack0"  # leading "/" prepended
    # BookKeeper asks without the port: the IP or the host name find the entry.
    assert rack_map.rack_of("127.0.0.2:4181") == "/rack1"
    assert rack_map.rack_of("bookie3.example.com:3181") == "/rack0"
    # A BP-41 id resolves through its registered address.
    assert rack_map.rack_of("bookie-3", resolved_host="bookie3.example.com") == "/rack0"
    assert rack_map.rack_of("bookie-3", resolved_host="127.0.0.1") == "/rack0"
    assert rack_map.rack_of("bookie-3") is None
    assert rack_map.rack_of("10.9.9.9:3181") is None
    assert rack_map.rack_for("10.9.9.9:3181") == DEFAULT_RACK
    assert rack_map.racks_for(["127.0.0.1:3181", "x:1"]) == {
        "127.0.0.1:3181": "/rack0",
        "x:1": "/default-rack",
    }
    assert "127.0.0.1:3181" in rack_map and "x:1" not in rack_map


def test_exact_id_wins_over_host() -> None:
    rack_map = parse_rack_map('{"g": {"10.0.0.1:3181": {"rack": "/a"}, "10.0.0.1:3182": {"rack": "/b"}}}')
    assert rack_map.rack_of("10.0.0.1:3181") == "/a"
    assert rack_map.rack_of("10.0.0.1:3182") == "/b"
    # By host alone, the entry Pulsar puts last wins.
    assert rack_map.rack_of("10.0.0.1:9999") == "/b"


def test_pulsar_order_for_host_collisions_and_duplicate_bookies() -> None:
    # Groups are walked in Java string order ("B" < "a"), entries in JSON order.
    rack_map = parse_rack_map('{"a": {"h:1": {"rack": "/from-a"}}, "B": {"h:2": {"rack": "/from-B"}}}')
    assert rack_map.rack_of("h:3") == "/from-a"
    twice = parse_rack_map('{"g2": {"h:1": {"rack": "/two"}}, "g1": {"h:1": {"rack": "/one"}}}')
    assert twice.get("h:1") == BookieRackInfo("/two", None, "g2")
    assert len(twice) == 1


@pytest.mark.parametrize(
    ("rack", "expected"),
    [
        ("/rack0", "/rack0"),
        ("rack0", "/rack0"),
        ("/region/rack", "/region/rack"),
        ("", None),
        ("/", None),
        (" / ", None),
        (None, None),
        (" ", "/ "),  # Pulsar only treats "" and a trimmed "/" as no rack
    ],
)
def test_rack_normalization(rack: str | None, expected: str | None) -> None:
    assert normalize_rack(rack) == expected
    document = {"g": {"b:1": {"rack": rack, "hostname": "h"}}}
    assert parse_rack_map(json.dumps(document)).rack_of("b:1") == expected


def test_entries_without_rack() -> None:
    rack_map = parse_rack_map('{"g": {"a:1": null, "b:1": {}, "c:1": {"hostname": "c", "extra": [1, 2]}}}')
    assert [rack_map.rack_of(b) for b in ("a:1", "b:1", "c:1")] == [None, None, None]
    assert rack_map.rack_for("c:1", default=DEFAULT_REGION_AND_RACK) == DEFAULT_REGION_AND_RACK
    assert rack_map.get("c:1") == BookieRackInfo(None, "c", "g")


def test_flat_config_form() -> None:
    rack_map = parse_rack_map('{"10.0.0.1:3181": "/rack-a", "bk-2": "rack-b", "bk-3": null, "bk-4": ""}')
    assert rack_map.rack_of("10.0.0.1:3181") == "/rack-a"
    assert rack_map.rack_of("10.0.0.1:4000") == "/rack-a"
    assert rack_map.rack_of("bk-2") == "/rack-b"
    assert rack_map.rack_of("bk-3") is None
    assert rack_map.rack_of("bk-4") is None
    assert rack_map.get("bk-2") == BookieRackInfo("/rack-b", None, None)
    assert RackMap.from_racks({"10.0.0.1:3181": "/rack-a", "bk-2": "rack-b"}).rack_of("bk-2") == "/rack-b"


def test_empty_object_is_an_empty_map() -> None:
    assert len(parse_rack_map("{}")) == 0
    assert parse_rack_map(b"\xef\xbb\xbf{}") == RackMap()  # UTF-8 BOM, as Jackson accepts


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"   ", "empty"),
        (b"\xff{}", "not UTF-8"),
        (b"{", "invalid JSON"),
        (b"[1]", "top level"),
        (b'"x"', "top level"),
        (b"null", "top level"),
        (b'{"g": {"b:1": {"rack": 5}}}', "rack of b:1"),
        (b'{"g": {"b:1": {"rack": "/r", "hostname": ["h"]}}}', "hostname of b:1"),
        (b'{"g": {"b:1": "r"}}', "must be an object"),
        (b'{"g": {"b:1": {}}, "b:2": "/r"}', "all group objects"),
        (b'{"g": [1]}', "all group objects"),
        (b'{"g": {"bad id": {"rack": "/r"}}}', "not a valid bookie id"),
        (b'{"readonly": "/r"}', "not a valid bookie id"),
        (b'{"b:1": 5}', "all group objects"),
        (b'{"b:1": "/r", "x y": "/r"}', "not a valid bookie id"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply|top level"),
        (b'{"a": ' * 50_000 + b"{}" + b"}" * 50_000, "nested too deeply|group objects"),
        (b'{"g": {"b:1": {"rack": 1' + b"0" * 5000 + b"}}}", "invalid JSON"),
    ],
)
def test_hostile_input(data: bytes, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        parse_rack_map(data)


def test_wrong_python_types() -> None:
    with pytest.raises(FormatError):
        parse_rack_map(5)  # type: ignore[arg-type]
    with pytest.raises(FormatError):
        RackMap((("a:1", BookieRackInfo("/r")), ("a:1", BookieRackInfo("/s"))))


racks = st.none() | st.text(max_size=8)
ids = st.from_regex(r"[a-z0-9.\-]{1,8}:[0-9]{1,5}", fullmatch=True)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=5),
        st.dictionaries(ids, st.fixed_dictionaries({"rack": racks}), max_size=4),
        max_size=3,
    )
)
def test_every_listed_bookie_resolves_to_its_normalized_rack(
    document: dict[str, dict[str, dict[str, str | None]]],
) -> None:
    rack_map = parse_rack_map(json.dumps(document))
    winners: dict[str, str | None] = {}
    for group in sorted(document, key=lambda g: g.encode("utf-16-be", "surrogatepass")):
        for bookie_id, info in document[group].items():
            winners[bookie_id] = normalize_rack(info["rack"])
    for bookie_id, rack in winners.items():
        assert rack_map.rack_of(bookie_id) == rack
        assert rack_map.rack_for(bookie_id) == (rack or DEFAULT_RACK)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_random_json_only_format_error(value: object) -> None:
    with contextlib.suppress(FormatError):
        parse_rack_map(json.dumps(value))


def test_fuzz_bytes_only_format_error() -> None:
    rng = random.Random(45)
    seeds = [FACTS_EXAMPLE, b'{"10.0.0.1:3181": "/rack-a", "bk-2": null}']
    parsed = 0
    for _ in range(2500):
        data = bytearray(rng.choice(seeds))
        choice = rng.randrange(4)
        if choice == 0:
            data = data[: rng.randrange(len(data))]
        elif choice == 1:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif choice == 2:
            data = bytearray(rng.choice(b'{}[]":,nul0123 ab/') for _ in range(rng.randrange(40)))
        else:
            index = rng.randrange(len(data))
            data[index:index] = rng.choice([b"{", b"[", b'"', b",", b"null", b"\\u0000", b"1e999"])
        try:
            parse_rack_map(bytes(data))
        except FormatError:
            continue
        parsed += 1
    assert parsed > 0
