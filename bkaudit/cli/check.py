"""`bkaudit check ...` commands (see shared interfaces §1). Status: being written."""

from __future__ import annotations

import typer

app = typer.Typer(help="check commands", no_args_is_help=True)
