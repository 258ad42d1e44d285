"""`bkaudit metadata decode|encode|show`: ledger metadata znode bytes to JSON and back, and one ledger's
metadata read live from ZooKeeper (docs/reference.md, "Admin commands").

``decode`` reads the raw znode bytes (format 1, 2 or 3) on stdin and prints one JSON object;
``encode`` reads that object and writes the znode bytes exactly as BookKeeper's writer would, so
``decode --include-password | encode`` reproduces the input byte for byte. Bad input raises ``FormatError``,
which ``bkaudit.cli.main.run`` turns into exit code 2 and one line on stderr. ``show`` prints the same
object for the ledger's znode in a running cluster (plus its path and ledger manager), as a table by default.
The password is printed only with ``--include-password``.

Example:
    $ bkaudit metadata decode --ledger-id 7 < znode.bin
    {"format_version": 3, "ensemble_size": 3, ..., "has_password": true, "ledger_id": 7}
    $ bkaudit metadata decode --include-password < znode.bin | bkaudit metadata encode | cmp - znode.bin
    $ bkaudit metadata show 7 --zookeeper zk1:2181 --format json
    {"ledger_id": 7, "path": "/ledgers/00/0000/L0007", "ledger_manager": "hierarchical", ...}
"""

from __future__ import annotations

import base64
import json
from typing import Annotated, Any

import typer

from bkaudit.cli._io import emit_bytes, emit_json, positional_or_named, read_stdin_bytes
from bkaudit.cli.formats import StateFormat, StateFormatOption, emit_state
from bkaudit.cli.live import DevOption, LedgersRootOption, ZooKeeperOption, admin_reader, use_dev_services
from bkaudit.cli.path import ID_ARGUMENT_SETTINGS, parse_ledger_id, parse_manager
from core.domain.metadata import (
    LedgerMetadata,
    decode_ledger_metadata,
    encode_ledger_metadata,
    metadata_from_json,
    metadata_to_json,
)
from core.errors import FormatError

app = typer.Typer(help="Decode, encode, or show live ledger metadata znodes.", no_args_is_help=True)

_MAX_LEDGER_ID = 2**63 - 1

IncludePasswordOption = Annotated[
    bool, typer.Option("--include-password", help="Also print the password (password_b64).")
]


def ledger_document(
    metadata: LedgerMetadata, ledger_id: int | None, include_password: bool
) -> dict[str, Any]:
    """The ``decode`` object of ``metadata``, with ``ledger_id`` and the Pulsar topic when the id is known.

    Example:
        >>> from core.domain.metadata import _doc_example
        >>> document = ledger_document(_doc_example(), 7, include_password=False)
        >>> document["ledger_id"], "password_b64" in document
        (7, False)
    """
    document = metadata_to_json(metadata, include_password=include_password)
    if ledger_id is not None:
        document["ledger_id"] = ledger_id
        topic = metadata.pulsar_topic
        if topic is not None:
            document["pulsar_topic"] = topic
    return document


@app.command("decode")
def decode_command(
    ledger_id: Annotated[
        int | None, typer.Option("--ledger-id", help="Ledger id, added to the output as ledger_id.")
    ] = None,
    include_password: IncludePasswordOption = False,
) -> None:
    """Raw ledger metadata znode on stdin → one JSON object on stdout.

    Example:
        $ bkaudit metadata decode < znode.bin
    """
    if ledger_id is not None and not 0 <= ledger_id <= _MAX_LEDGER_ID:
        raise FormatError(f"--ledger-id must be in [0, {_MAX_LEDGER_ID}], got {ledger_id}")
    metadata = decode_ledger_metadata(read_stdin_bytes(), ledger_id=ledger_id)
    emit_json(ledger_document(metadata, ledger_id, include_password))


@app.command("show", context_settings=ID_ARGUMENT_SETTINGS)
def show_command(
    ledger_id: Annotated[
        str | None, typer.Argument(metavar="LEDGER_ID", help="Ledger id, 0..2^63-1; or give --ledger-id.")
    ] = None,
    named_id: Annotated[
        str | None, typer.Option("--ledger-id", help="the ledger id, as a named option")
    ] = None,
    fmt: StateFormatOption = StateFormat.table,
    include_password: IncludePasswordOption = False,
    zookeeper: ZooKeeperOption = None,
    ledgers_root: LedgersRootOption = None,
    manager: Annotated[
        str | None,
        typer.Option("--manager", help="Ledger manager (default: the cluster's LAYOUT), e.g. flat."),
    ] = None,
    dev: DevOption = False,
) -> None:
    """Print one ledger's metadata, read now from the cluster's ZooKeeper (like `bookkeeper shell
    ledgermetadata`): ensembles, quorums, state, last entry, custom metadata; never the password unless
    --include-password.

    Example:
        $ bkaudit metadata show 7
    """
    chosen = parse_ledger_id(positional_or_named(ledger_id, named_id, "--ledger-id"))
    use_dev_services(dev)
    reader = admin_reader(zookeeper, ledgers_root, None if manager is None else parse_manager(manager))
    with reader:
        znode = reader.read_ledger(chosen)
    try:
        metadata = decode_ledger_metadata(znode.data, znode_ctime=znode.ctime, ledger_id=chosen)
    except FormatError as err:
        raise FormatError(f"ledger {chosen} at {znode.path}: undecodable metadata ({err})") from None
    document = {
        "ledger_id": chosen,
        "path": znode.path,
        "ledger_manager": znode.manager.value,
        **ledger_document(metadata, chosen, include_password),
    }
    emit_state(document if fmt is StateFormat.json else _readable(document), fmt)


def _readable(document: dict[str, Any]) -> dict[str, Any]:
    """The table view: one column per ensemble position (so that no cell is cut), custom metadata values as
    text where they are printable UTF-8, else ``base64:...``.

    Example:
        >>> doc = _readable({"segments": [{"first_entry_id": 0, "ensemble": ["b1", "b2"]}],
        ...                  "custom_metadata": [{"key": "k", "value_b64": "/w=="}]})
        >>> doc["segments"], doc["custom_metadata"]
        ([{'first_entry_id': 0, 'bookie_0': 'b1', 'bookie_1': 'b2'}], [{'key': 'k', 'value': 'base64:/w=='}])
    """
    segments = [
        {"first_entry_id": segment["first_entry_id"]}
        | {f"bookie_{position}": bookie for position, bookie in enumerate(segment["ensemble"])}
        for segment in document["segments"]
    ]
    custom = []
    for item in document["custom_metadata"]:
        try:
            text = base64.b64decode(item["value_b64"]).decode("utf-8")
        except UnicodeDecodeError:
            text = None
        readable = text if text is not None and text.isprintable() else f"base64:{item['value_b64']}"
        custom.append({"key": item["key"], "value": readable})
    return {**document, "segments": segments, "custom_metadata": custom}


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
