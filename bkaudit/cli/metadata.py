"""`bkaudit metadata decode|encode`: ledger metadata znode bytes to JSON and back (shared interfaces §1).

``decode`` reads the raw znode bytes (format 1, 2 or 3) on stdin and prints one JSON object;
``encode`` reads that object and writes the znode bytes exactly as BookKeeper's writer would, so
``decode --include-password | encode`` reproduces the input byte for byte. Bad input raises ``FormatError``,
which ``bkaudit.cli.main.run`` turns into exit code 2 and one line on stderr. The password is printed only
with ``--include-password``.

Example:
    $ bkaudit metadata decode --ledger-id 7 < znode.bin
    {"format_version": 3, "ensemble_size": 3, ..., "has_password": true, "ledger_id": 7}
    $ bkaudit metadata decode --include-password < znode.bin | bkaudit metadata encode | cmp - znode.bin
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from bkaudit.cli._io import emit_bytes, emit_json, read_stdin_bytes
from core.domain.metadata import (
    decode_ledger_metadata,
    encode_ledger_metadata,
    metadata_from_json,
    metadata_to_json,
)
from core.errors import FormatError

app = typer.Typer(help="Decode and encode ledger metadata znodes.", no_args_is_help=True)

_MAX_LEDGER_ID = 2**63 - 1


@app.command("decode")
def decode_command(
    ledger_id: Annotated[
        int | None, typer.Option("--ledger-id", help="Ledger id, added to the output as ledger_id.")
    ] = None,
    include_password: Annotated[
        bool, typer.Option("--include-password", help="Also print the password (password_b64).")
    ] = False,
) -> None:
    """Raw ledger metadata znode on stdin → one JSON object on stdout.

    Example:
        $ bkaudit metadata decode < znode.bin
    """
    if ledger_id is not None and not 0 <= ledger_id <= _MAX_LEDGER_ID:
        raise FormatError(f"--ledger-id must be in [0, {_MAX_LEDGER_ID}], got {ledger_id}")
    metadata = decode_ledger_metadata(read_stdin_bytes(), ledger_id=ledger_id)
    document = metadata_to_json(metadata, include_password=include_password)
    if ledger_id is not None:
        document["ledger_id"] = ledger_id
        topic = metadata.pulsar_topic
        if topic is not None:
            document["pulsar_topic"] = topic
    emit_json(document)


@app.command("encode")
def encode_command() -> None:
    """The JSON object of ``decode`` on stdin → raw znode bytes on stdout.

    Example:
        $ bkaudit metadata decode --include-password < znode.bin | bkaudit metadata encode > copy.bin
    """
    emit_bytes(encode_ledger_metadata(metadata_from_json(_read_json())))


def _read_json() -> Any:
    # Parsed here rather than with _io.read_stdin_json so that absurdly nested input (which makes the json
    # module raise RecursionError) is bad input too, not a traceback.
    raw = read_stdin_bytes()
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise FormatError(f"ledger metadata JSON: stdin is not UTF-8 (byte {err.start})") from None
    except json.JSONDecodeError as err:
        where = f"line {err.lineno} column {err.colno}"
        raise FormatError(f"ledger metadata JSON: stdin is not valid JSON ({err.msg} at {where})") from None
    except RecursionError:
        raise FormatError("ledger metadata JSON: stdin is nested too deeply") from None
    except ValueError as err:  # e.g. an integer with more digits than Python converts
        raise FormatError(f"ledger metadata JSON: stdin is not usable JSON ({err})") from None
