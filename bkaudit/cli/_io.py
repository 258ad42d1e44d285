"""Shared plumbing for commands: stdin readers, JSON output, and the bad-input contract.

Every command exits 0 on success and 2 with a one-line message on stderr for bad input (never a
traceback); JSON goes to stdout as one UTF-8 object. Commands raise :class:`core.errors.BkauditError`
(or ``FormatError``) for bad input and ``bkaudit.cli.main.run`` turns it into exit code 2.

Example:
    >>> import io, sys
    >>> emit_json({"b": 1, "a": [1, 2]}, stream=io.StringIO())
"""

from __future__ import annotations

import json
import sys
from typing import IO, Any

from core.errors import FormatError


def read_stdin_bytes() -> bytes:
    """All of stdin as bytes."""
    return sys.stdin.buffer.read()


def read_stdin_json(what: str) -> Any:
    """Parse stdin as one JSON document; bad JSON raises :class:`FormatError` naming ``what``.

    Example:
        >>> # echo '{"a": 1}' | bkaudit ...  → {"a": 1}
    """
    raw = read_stdin_bytes()
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise FormatError(f"{what}: stdin is not UTF-8 (byte {err.start})") from None
    except json.JSONDecodeError as err:
        where = f"line {err.lineno} column {err.colno}"
        raise FormatError(f"{what}: stdin is not valid JSON ({err.msg} at {where})") from None
    except RecursionError:
        raise FormatError(f"{what}: stdin JSON is nested too deeply") from None
    except ValueError as err:  # e.g. an integer literal longer than Python's 4300-digit limit
        raise FormatError(f"{what}: stdin JSON has an unusable value ({str(err).splitlines()[0]})") from None


def emit_json(value: Any, stream: IO[str] | None = None) -> None:
    """Write ``value`` as one JSON object and a newline to stdout (UTF-8, non-ASCII kept)."""
    out = stream if stream is not None else sys.stdout
    out.write(json.dumps(value, ensure_ascii=False, separators=(", ", ": ")) + "\n")
    out.flush()


def emit_bytes(data: bytes) -> None:
    """Write raw bytes to stdout (for encoders)."""
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def positional_or_named(positional: Any, named: Any, flag: str) -> Any:
    """The value given either as the positional argument or as ``flag`` (the same thing spelled two ways);
    neither, or two different values, is bad input.

    Example:
        >>> positional_or_named(None, 7, "--ledger-id"), positional_or_named("7", None, "--ledger-id")
        (7, '7')
    """
    if positional is None and named is None:
        raise FormatError(f"give the {flag.lstrip('-').replace('-', ' ')} (positional or {flag})")
    if positional is not None and named is not None and str(positional) != str(named):
        raise FormatError(f"two different values: {positional} and {flag} {named}")
    return positional if positional is not None else named
