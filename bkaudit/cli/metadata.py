"""`bkaudit metadata ...` commands (see shared interfaces §1). Status: being written."""

from __future__ import annotations

import typer

app = typer.Typer(help="metadata commands", no_args_is_help=True)
