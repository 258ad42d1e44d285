"""`bkaudit availability encode | decode | missing` through the real CLI entry point."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

import pytest

from core.domain.availability import encode_availability

Cli = Callable[..., Any]

HEX_1_TO_8 = (
    "00000000" + "00000002" + "00" * 56
    + "0000000000000001" + "0000000000000001" + "00000003" + "00000000"
    + "0000000000000005" + "0000000000000005" + "00000004" + "00000000"
)  # fmt: skip


def test_encode_example(cli: Cli) -> None:
    r = cli("availability", "encode", stdin="[1, 2, 3, 5, 6, 7, 8]")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.hex() == HEX_1_TO_8


def test_encode_empty_set_and_duplicates(cli: Cli) -> None:
    assert cli("availability", "encode", stdin="[]").stdout == bytes(64)
    r = cli("availability", "encode", stdin="[2, 0, 1, 1, 2]")
    assert r.exit_code == 0 and len(r.stdout) == 88
    assert r.stdout == encode_availability([0, 1, 2])


def test_decode_example(cli: Cli) -> None:
    r = cli("availability", "decode", stdin=bytes.fromhex(HEX_1_TO_8))
    assert r.exit_code == 0, r.stderr
    assert r.json() == {
        "version": 0,
        "groups": [[1, 1, 3, 0], [5, 5, 4, 0]],
        "entries": [1, 2, 3, 5, 6, 7, 8],
        "count": 7,
    }


def test_decode_periodic_group(cli: Cli) -> None:
    data = struct.pack(">ii", 0, 1) + bytes(56) + struct.pack(">qqii", 1, 10, 2, 3)
    r = cli("availability", "decode", stdin=data)
    assert r.json() == {
        "version": 0,
        "groups": [[1, 10, 2, 3]],
        "entries": [1, 2, 4, 5, 7, 8, 10, 11],
        "count": 8,
    }


def test_decode_empty(cli: Cli) -> None:
    assert cli("availability", "decode", stdin=bytes(64)).json() == {
        "version": 0,
        "groups": [],
        "entries": [],
        "count": 0,
    }


def test_decode_huge_set_is_capped(cli: Cli) -> None:
    data = struct.pack(">ii", 0, 1) + bytes(56) + struct.pack(">qqii", 0, 0, 2**31 - 1, 0)
    r = cli("availability", "decode", "--max-entries", "3", stdin=data)
    assert r.exit_code == 0, r.stderr
    assert r.json() == {
        "version": 0,
        "groups": [[0, 0, 2**31 - 1, 0]],
        "entries": [0, 1, 2],
        "count": 2**31 - 1,
        "entries_truncated": True,
    }


def test_encode_decode_round_trip(cli: Cli) -> None:
    ids = [0, 1, 2, 9, 10, 2**40, 2**63 - 1]
    encoded = cli("availability", "encode", stdin=json.dumps(ids)).stdout
    assert cli("availability", "decode", stdin=encoded).json()["entries"] == ids


@pytest.mark.parametrize(
    ("document", "missing"),
    [
        ({"available": [1, 2, 6], "start": 0, "last": 7, "expected": [4, 6]}, [4]),
        (
            {
                "available": [0, 4, 5, 9, 10, 14, 15],
                "start": 0,
                "last": 15,
                "expected": [0, 4, 5, 9, 10, 14, 15],
            },
            [],
        ),
        ({"available": [], "start": 3, "last": 5, "expected": [1, 3, 5, 7]}, [3, 5]),
        ({"available": [], "start": 5, "last": 3, "expected": [4]}, []),
    ],
)
def test_missing(cli: Cli, document: dict[str, Any], missing: list[int]) -> None:
    r = cli("availability", "missing", stdin=json.dumps(document))
    assert r.exit_code == 0, r.stderr
    assert r.json() == {"missing": missing}


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["encode"], "not json", "not valid JSON"),
        (["encode"], '{"a": 1}', "must be an array"),
        (["encode"], "[1, -2]", "at least 0"),
        (["encode"], "[true]", "got a boolean"),
        (["encode"], "[1.5]", "got a number"),
        (["encode"], '["3"]', "got a string"),
        (["encode"], "[9223372036854775808]", "at most"),
        (["encode"], b"\xff\xfe", "not UTF-8"),
        (["decode"], b"", "truncated header"),
        (["decode"], b"\x00\x00\x00\x01" + bytes(60), "unsupported header version 1"),
        (["decode"], bytes(64) + b"\x00", "trailing bytes"),
        (["decode"], b"\x00\x00\x00\x00\x7f\xff\xff\xff" + bytes(56), "truncated"),
        (["missing"], "[]", "must be a JSON object"),
        (["missing"], '{"available": [], "start": 0, "last": 1}', "missing field 'expected'"),
        (
            ["missing"],
            '{"available": [], "start": -1, "last": 1, "expected": []}',
            "start must be at least 0",
        ),
        (["missing"], '{"available": [], "start": 0, "last": false, "expected": []}', "got a boolean"),
        (["missing"], '{"available": [-4], "start": 0, "last": 1, "expected": []}', "available[0]"),
        (["missing"], '{"available": [], "start": 0, "last": 1, "expected": "1"}', "must be an array"),
    ],
)
def test_bad_input_exits_2_with_one_line(cli: Cli, args: list[str], stdin: str | bytes, message: str) -> None:
    r = cli("availability", *args, stdin=stdin)
    assert r.exit_code == 2
    assert r.stdout == b""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("bkaudit: ")
    assert message in r.stderr
    assert "Traceback" not in r.stderr
