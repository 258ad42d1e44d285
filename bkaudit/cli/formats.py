"""The output choice of every command that reports state: a table for people, JSON for scripts.

Example:
    $ bkaudit status --format json
"""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import Annotated, Any

import typer

from bkaudit.cli._io import emit_json
from bkaudit.cli._render import render_document


class StateFormat(StrEnum):
    table = "table"
    json = "json"


StateFormatOption = Annotated[
    StateFormat, typer.Option("--format", "-f", help="table (aligned text, the default) or json (one object)")
]


def emit_state(document: dict[str, Any], fmt: StateFormat) -> None:
    """Print a state report: tables and ``key: value`` lines, or the one JSON object with ``json``.

    Example:
        >>> emit_state({"running": True}, StateFormat.table)
        running: true
    """
    if fmt is StateFormat.json:
        emit_json(document)
    else:
        render_document(document, sys.stdout)
