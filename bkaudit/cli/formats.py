"""The output choice of every command that reports state: a table for people, JSON for scripts.

Example:
    $ bkaudit status --format json
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer


class StateFormat(StrEnum):
    table = "table"
    json = "json"


StateFormatOption = Annotated[
    StateFormat, typer.Option("--format", "-f", help="table (aligned text, the default) or json (one object)")
]
