"""`bkaudit metadata decode|encode` (docs/reference.md, "Admin commands"), run in-process through the
``cli`` fixture."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.unit.test_metadata import (
    V1_IN_RECOVERY,
    V2_IN_RECOVERY,
    java_v1,
    java_v2,
    java_v3,
    java_v3_fields,
    pb_varint,
    sample_ledger,
    v3_blob,
)

Cli = Callable[..., Any]

DOCUMENTED_KEYS = {
    "format_version",
    "ensemble_size",
    "write_quorum",
    "ack_quorum",
    "state",
    "last_entry_id",
    "length",
    "digest_type",
    "segments",
    "ctime",
    "ctoken",
    "custom_metadata",
    "has_password",
}
SECRET = b"Qv8#distinctive-ledger-pw\x01\xfe"


def assert_bad_input(result: Any, *fragments: str) -> None:
    assert result.exit_code == 2
    assert result.stdout == b""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bkaudit: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_decode_v2_example_prints_exactly_the_documented_keys(cli: Cli) -> None:
    result = cli("metadata", "decode", stdin=V2_IN_RECOVERY)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.endswith(b"\n") and result.stdout.count(b"\n") == 1
    doc = result.json()
    assert set(doc) == DOCUMENTED_KEYS
    assert doc == {
        "format_version": 2,
        "ensemble_size": 3,
        "write_quorum": 2,
        "ack_quorum": 2,
        "state": "IN_RECOVERY",
        "last_entry_id": -1,
        "length": 0,
        "digest_type": "CRC32",
        "segments": [
            {"first_entry_id": 0, "ensemble": ["192.0.2.1:1234", "192.0.2.2:1234", "192.0.2.3:1234"]}
        ],
        "ctime": None,
        "ctoken": None,
        "custom_metadata": [],
        "has_password": True,
    }


def test_decode_v1_reads_as_bookkeeper_does(cli: Cli) -> None:
    doc = cli("metadata", "decode", stdin=V1_IN_RECOVERY).json()
    assert set(doc) == DOCUMENTED_KEYS
    assert (doc["state"], doc["ack_quorum"], doc["digest_type"], doc["has_password"]) == (
        "IN_RECOVERY",
        2,
        None,
        False,
    )


def test_decode_v3_pulsar_ledger_with_ledger_id(cli: Cli) -> None:
    blob = java_v3(sample_ledger(ctime=1544002383075))
    doc = cli("metadata", "decode", "--ledger-id", "59", stdin=blob).json()
    assert set(doc) == DOCUMENTED_KEYS | {"ledger_id", "pulsar_topic"}
    assert doc["ledger_id"] == 59
    assert doc["pulsar_topic"] == "persistent://public/default/orders-partition-3"
    assert (doc["ctime"], doc["ctoken"], doc["state"], doc["last_entry_id"]) == (
        1544002383075,
        0,
        "CLOSED",
        99,
    )
    assert [entry["key"] for entry in doc["custom_metadata"]] == [
        "component",
        "pulsar/managed-ledger",
        "application",
    ]
    assert base64.b64decode(doc["custom_metadata"][2]["value_b64"]) == b"pulsar"
    without_id = cli("metadata", "decode", stdin=blob).json()
    assert set(without_id) == DOCUMENTED_KEYS


@pytest.mark.parametrize(
    "blob",
    [
        V1_IN_RECOVERY,
        V2_IN_RECOVERY,
        java_v1(sample_ledger(custom=[])),
        java_v2(sample_ledger(password=SECRET, ctime=-1)),
        java_v3(sample_ledger(password=SECRET, custom=[("b", b"\x00"), ("a", b"")])),
        java_v3(sample_ledger(state="OPEN", last_entry_id=-1, length=0)),
        b"BookieMetadataFormatVersion\t1\n3\n3\n0\n0\ta:1\tb:1\tc:1",  # 4.0 writer, no final newline
        V2_IN_RECOVERY.replace(b"ackQuorumSize: 2\n", b"").replace(b"lastEntryId: -1", b"lastEntryId: 4"),
    ],
)
def test_decode_with_password_then_encode_reproduces_the_input(cli: Cli, blob: bytes) -> None:
    decoded = cli("metadata", "decode", "--include-password", stdin=blob)
    assert decoded.exit_code == 0, decoded.stderr
    encoded = cli("metadata", "encode", stdin=decoded.stdout)
    assert encoded.exit_code == 0, encoded.stderr
    assert encoded.stdout == blob


def test_include_password_adds_password_b64(cli: Cli) -> None:
    doc = cli("metadata", "decode", "--include-password", stdin=V2_IN_RECOVERY).json()
    assert set(doc) == DOCUMENTED_KEYS | {"password_b64"}
    assert base64.b64decode(doc["password_b64"]) == b"passwd"


def secret_forms(secret: bytes) -> list[bytes]:
    forms = [secret, secret.hex().encode(), secret.hex().upper().encode(), secret[:-2]]
    for skip in range(3):  # base64 of the secret at every alignment within a longer stream
        core = base64.b64encode(secret[skip:])[4:-4]
        forms.append(core)
    forms.append(base64.b64encode(secret))
    forms.append(binascii.b2a_hex(secret[:8]))
    return forms


@pytest.mark.parametrize("writer", [java_v2, java_v3])
def test_without_include_password_no_form_of_the_password_is_printed(cli: Cli, writer: Any) -> None:
    blob = writer(sample_ledger(password=SECRET))
    result = cli("metadata", "decode", "--ledger-id", "3", stdin=blob)
    assert result.exit_code == 0
    output = result.stdout + result.stderr.encode()
    for form in secret_forms(SECRET):
        assert form not in output, form
    assert result.json()["has_password"] is True
    # Control: the check above would see the password if it were printed.
    revealed = cli("metadata", "decode", "--include-password", stdin=blob)
    assert base64.b64encode(SECRET) in revealed.stdout


def test_password_is_not_echoed_in_error_messages(cli: Cli) -> None:
    secret = b"Qv8-distinctive-ledger-pw"
    broken = V2_IN_RECOVERY.replace(b'password: "passwd"', b'password: "' + secret)
    result = cli("metadata", "decode", stdin=broken)
    assert_bad_input(result)
    for form in secret_forms(secret):
        assert form not in result.stderr.encode()
    doc = cli(
        "metadata", "decode", "--include-password", stdin=java_v3(sample_ledger(password=secret))
    ).json()
    doc["state"] = "BOGUS"
    result = cli("metadata", "encode", stdin=json.dumps(doc))
    assert_bad_input(result, "'state' must be one of")
    assert secret not in result.stderr.encode()


@pytest.mark.parametrize(
    ("stdin", "fragment"),
    [
        (b"", "empty input"),
        (bytes(range(256)) * 4, "header corrupt"),
        (b"BookieMetadataFormatVersion\tfoobar\nblahblah", "not a number"),
        (b"BookieMetadataFormatVersion\t123456789123456789\nblahblah", "10 digits"),
        (b"BookieMetadataFormatVersion\t3\n\x7f\x08", "length prefix says 127 bytes"),
        (b"BookieMetadataFormatVersion\t3\n\x02\x08\x01", "missing required field"),
        (b"BookieMetadataFormatVersion\t5\n", "not supported"),
        (java_v3(sample_ledger()) + b"\x00" * 3 * 1024 * 1024, "3145728 trailing bytes after the metadata"),
    ],
)
def test_decode_bad_input_exits_2_with_one_line(cli: Cli, stdin: bytes, fragment: str) -> None:
    assert_bad_input(cli("metadata", "decode", stdin=stdin), fragment)


def test_decode_rejects_a_negative_ledger_id(cli: Cli) -> None:
    assert_bad_input(cli("metadata", "decode", "--ledger-id", "-1", stdin=V2_IN_RECOVERY), "--ledger-id")
    assert_bad_input(cli("metadata", "decode", "--ledger-id", "x", stdin=V2_IN_RECOVERY))


def valid_document() -> dict[str, Any]:
    return {
        "format_version": 3,
        "ensemble_size": 2,
        "write_quorum": 2,
        "ack_quorum": 1,
        "state": "CLOSED",
        "last_entry_id": 10,
        "length": 100,
        "digest_type": "CRC32C",
        "segments": [{"first_entry_id": 0, "ensemble": ["b1:3181", "b2:3181"]}],
        "ctime": None,
        "ctoken": 0,
        "custom_metadata": [],
        "has_password": True,
        "password_b64": "",
    }


def test_encode_writes_what_bookkeepers_writer_writes(cli: Cli) -> None:
    result = cli("metadata", "encode", stdin=json.dumps(valid_document()))
    assert result.exit_code == 0, result.stderr
    blob = result.stdout
    assert blob.startswith(b"BookieMetadataFormatVersion\t3\n")
    assert cli("metadata", "decode", "--include-password", stdin=blob).json() == valid_document()
    as_v2 = cli(
        "metadata", "encode", stdin=json.dumps({**valid_document(), "format_version": 2, "ctoken": None})
    )
    assert as_v2.stdout.decode().endswith('password: ""\nackQuorumSize: 1\n')


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"state": "closed"}, "'state' must be one of"),
        ({"digest_type": "MAC"}, "'digest_type' must be one of"),
        ({"ensemble_size": "2"}, "'ensemble_size' must be an integer"),
        ({"segments": "b1"}, "'segments' must be an array"),
        ({"password_b64": "not base64!"}, "not valid base64"),
        ({"custom_metadata": [{"key": "k", "value_b64": "%%%"}]}, "not valid base64"),
        ({"format_version": 4}, "format version must be 1, 2 or 3"),
        ({"write_quorum": 3}, "quorums must satisfy"),
        ({"segments": [{"first_entry_id": 0, "ensemble": ["b1:3181"]}]}, "lists 1 bookies"),
        ({"ctoken": 2**64}, "out of range"),
        ({"has_password": "yes"}, "'has_password' must be true or false"),
        ({"typo_key": 1}, "unknown key(s): typo_key"),
    ],
)
def test_encode_bad_documents_exit_2_with_one_line(cli: Cli, change: dict[str, Any], fragment: str) -> None:
    assert_bad_input(cli("metadata", "encode", stdin=json.dumps({**valid_document(), **change})), fragment)


@pytest.mark.parametrize(
    ("stdin", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[]", "expected an object"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"format_version": 3}', "missing key(s)"),
        (b'{"a": ' + b"9" * 5000 + b"}", "not usable JSON"),
    ],
)
def test_encode_bad_json_exits_2_with_one_line(cli: Cli, stdin: bytes, fragment: str) -> None:
    assert_bad_input(cli("metadata", "encode", stdin=stdin), fragment)


def test_encode_without_the_password_refuses_instead_of_writing_a_different_znode(cli: Cli) -> None:
    doc = cli("metadata", "decode", stdin=V2_IN_RECOVERY).json()
    assert_bad_input(cli("metadata", "encode", stdin=json.dumps(doc)), "password_b64 is missing")


def test_decode_reads_a_znode_with_a_new_field_and_encode_refuses_it_naming_the_field(cli: Cli) -> None:
    newer = v3_blob(b"".join(java_v3_fields(sample_ledger(password=SECRET))) + pb_varint(100, 5))
    decoded = cli("metadata", "decode", "--include-password", stdin=newer)
    assert decoded.exit_code == 0, decoded.stderr
    doc = decoded.json()
    assert doc["state"] == "CLOSED" and doc["ensemble_size"] == 3 and len(doc["segments"]) == 2
    assert doc["wire"] == {"unknown_fields": ["field 100"]}
    assert_bad_input(
        cli("metadata", "encode", stdin=decoded.stdout), "cannot re-encode byte for byte", "(field 100)"
    )
