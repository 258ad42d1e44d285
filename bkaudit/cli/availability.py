"""`bkaudit availability encode | decode | missing` (docs/reference.md, "Admin commands").

Thin wrappers over :mod:`core.domain.availability`; all input checking happens here or
there and surfaces as :class:`core.errors.FormatError` (exit 2, one line on stderr).

* ``encode``: stdin a JSON array of entry ids → the bytes a real bookie sends for that *set* (sorted,
  duplicates once, one group per run).
* ``decode``: stdin those bytes → ``{"version", "groups", "entries", "count"}``. ``entries`` holds at most
  ``--max-entries`` ids (default 1,000,000); when the set is larger the list is cut there and
  ``"entries_truncated": true`` is added (``count`` is always exact).
* ``missing``: stdin ``{"available": [...], "start": s, "last": l, "expected": [...]}`` →
  ``{"missing": [...]}``.

The JSON helpers (``json_int``, ``json_entry_ids`` …) are shared with :mod:`bkaudit.cli.check`.

Example:
    $ echo '[1,2,3,5,6,7,8]' | bkaudit availability encode | bkaudit availability decode
    {"version": 0, "groups": [[1, 1, 3, 0], [5, 5, 4, 0]], "entries": [1, 2, 3, 5, 6, 7, 8], "count": 7}
"""

from __future__ import annotations

from typing import Any

import typer

from bkaudit.cli._io import emit_bytes, emit_json, read_stdin_bytes, read_stdin_json
from core.domain.availability import (
    DEFAULT_ENTRY_LIMIT,
    MAX_ENTRY_ID,
    decode_availability,
    encode_availability,
    missing_entries,
)
from core.errors import FormatError

app = typer.Typer(
    help="Encode, decode and compare AvailabilityOfEntriesOfLedger bytes.", no_args_is_help=True
)


def json_kind(value: Any) -> str:
    """A JSON type name for error messages.

    Example:
        >>> json_kind(True), json_kind(1.5), json_kind("x")
        ('a boolean', 'a number', 'a string')
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number" if isinstance(value, float) else "an integer"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def json_int(value: Any, what: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """A JSON integer (not a boolean, not a float) within bounds, else :class:`FormatError`.

    Example:
        >>> json_int(3, "x", minimum=1)
        3
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise FormatError(f"{what} must be an integer, got {json_kind(value)}")
    if minimum is not None and value < minimum:
        raise FormatError(f"{what} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise FormatError(f"{what} must be at most {maximum}, got {value}")
    return value


def json_entry_ids(value: Any, what: str) -> list[int]:
    """A JSON array of entry ids in [0, 2^63-1], else :class:`FormatError`.

    Example:
        >>> json_entry_ids([3, 1], "ids")
        [3, 1]
    """
    if not isinstance(value, list):
        raise FormatError(f"{what} must be an array of entry ids, got {json_kind(value)}")
    return [json_int(item, f"{what}[{index}]", 0, MAX_ENTRY_ID) for index, item in enumerate(value)]


def json_object(value: Any, what: str) -> dict[str, Any]:
    """A JSON object, else :class:`FormatError`.

    Example:
        >>> json_object({"a": 1}, "input")
        {'a': 1}
    """
    if not isinstance(value, dict):
        raise FormatError(f"{what} must be a JSON object, got {json_kind(value)}")
    return value


def json_field(document: dict[str, Any], key: str, what: str) -> Any:
    """``document[key]``, or :class:`FormatError` naming the missing field.

    Example:
        >>> json_field({"a": 1}, "a", "input")
        1
    """
    if key not in document:
        raise FormatError(f"{what}: missing field {key!r}")
    return document[key]


@app.command("encode")
def encode_command() -> None:
    """stdin: a JSON array of entry ids; stdout: the bytes a real bookie sends for that set."""
    ids = json_entry_ids(read_stdin_json("availability encode"), "availability encode: input")
    emit_bytes(encode_availability(ids))


@app.command("decode")
def decode_command(
    max_entries: int = typer.Option(
        DEFAULT_ENTRY_LIMIT, "--max-entries", min=0, help="List at most this many ids in 'entries'."
    ),
) -> None:
    """stdin: AvailabilityOfEntriesOfLedger bytes; stdout: version, groups, entries and count as JSON."""
    available = decode_availability(read_stdin_bytes())
    output: dict[str, Any] = {
        "version": available.header_version,
        "groups": [group.as_list() for group in available.groups],
        "entries": available.entry_list(max_entries),
        "count": available.count,
    }
    if available.count > max_entries:
        output["entries_truncated"] = True
    emit_json(output)


@app.command("missing")
def missing_command() -> None:
    """stdin: {"available", "start", "last", "expected"}; stdout: {"missing": [...]}, with set semantics."""
    what = "availability missing"
    document = json_object(read_stdin_json(what), f"{what}: input")
    available = json_entry_ids(json_field(document, "available", what), f"{what}: available")
    start = json_int(json_field(document, "start", what), f"{what}: start", 0, MAX_ENTRY_ID)
    last = json_int(json_field(document, "last", what), f"{what}: last", 0, MAX_ENTRY_ID)
    expected = json_entry_ids(json_field(document, "expected", what), f"{what}: expected")
    emit_json({"missing": missing_entries(available, start, last, expected)})
