"""`bkaudit config show | docs`: the settings this command line and environment yield, and their reference.

Example:
    $ bkaudit --set kafka.bootstrap_servers=k1:9092 config show
    $ bkaudit config show --format json
    $ bkaudit config docs > configuration.md
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from bkaudit.cli._io import emit_json
from bkaudit.cli.formats import StateFormat, StateFormatOption

app = typer.Typer(
    help="Show the effective settings (secrets masked) and their reference.", no_args_is_help=True
)


def effective_rows(settings: Any) -> list[tuple[str, str]]:
    """``(dotted key, value as text)`` for every setting, secrets masked.

    Example:
        >>> from core.settings import Settings
        >>> rows = dict(effective_rows(Settings(kafka={"sasl_password": "s3cret"})))
        >>> rows["kafka.sasl_password"], rows["stream.app_id"]
        ('**********', 'bkaudit-stream')
    """
    from bkaudit.settings_docs import setting_docs

    document = json.loads(settings.model_dump_json())  # SecretStr dumps masked
    rows = []
    for row in setting_docs():
        value: Any = document
        for part in row.key.split("."):
            value = value[part]
        text = "" if value is None else json.dumps(value) if isinstance(value, dict | list) else str(value)
        rows.append((row.key, text.lower() if isinstance(value, bool) else text))
    return rows


@app.command("show")
def show(fmt: StateFormatOption = StateFormat.table) -> None:
    """The settings this command line (--config, --set) and environment yield; secrets masked."""
    import pyarrow as pa

    from bkaudit.cli._render import render
    from bkaudit.settings_docs import effective_settings_json
    from core.settings import load_settings

    settings = load_settings()
    if fmt is StateFormat.json:
        emit_json(json.loads(effective_settings_json(settings)))
        return
    rows = effective_rows(settings)
    render(pa.table({"setting": [k for k, _ in rows], "value": [v for _, v in rows]}), "table", sys.stdout)


@app.command("docs")
def docs() -> None:
    """The reference of every setting (Markdown): key, environment variable, type, default, meaning."""
    from bkaudit.settings_docs import configuration_markdown

    sys.stdout.write(configuration_markdown())
