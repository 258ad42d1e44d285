"""`bkaudit config show | docs | monitoring`: the settings in effect, their reference, the monitoring files.

Example:
    $ bkaudit --set kafka.bootstrap_servers=k1:9092 config show
    $ bkaudit config show --format json
    $ bkaudit config docs > configuration.md
    $ bkaudit config monitoring --docs-base-url https://git.example.com/bkaudit/-/blob/main --out monitoring/
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

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


_INFRA = Path(__file__).resolve().parents[2] / "infra"


@app.command("monitoring")
def monitoring(
    docs_base_url: Annotated[
        str,
        typer.Option(
            "--docs-base-url",
            help="where the docs are published, e.g. https://git.example.com/bkaudit/-/blob/main",
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="directory to write the two files to")],
    infra: Annotated[
        Path, typer.Option("--infra", help="the repository's infra/ directory (default: this checkout's)")
    ] = _INFRA,
) -> None:
    """Write bkaudit-rules.yaml and bkaudit-dashboard.json with runbook links under --docs-base-url, so
    Alertmanager and Grafana open them."""
    from bkaudit.monitoring import dashboard_with_docs_base, rules_with_docs_base
    from core.errors import InvalidArgumentError, NotFoundError

    rules_path = infra / "prometheus" / "bkaudit-rules.yaml"
    board_path = infra / "grafana" / "bkaudit-dashboard.json"
    for source in (rules_path, board_path):
        if not source.is_file():
            raise NotFoundError(f"{source}: no such file; pass --infra with the repository's infra/")
    rules = rules_with_docs_base(rules_path.read_text(encoding="utf-8"), docs_base_url)
    board = dashboard_with_docs_base(json.loads(board_path.read_text(encoding="utf-8")), docs_base_url)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / rules_path.name).write_text(rules, encoding="utf-8")
        board_text = json.dumps(board, indent=2, ensure_ascii=False) + "\n"
        (out / board_path.name).write_text(board_text, encoding="utf-8")
    except OSError as err:
        raise InvalidArgumentError(f"--out {out}: {err.strerror or err}") from None
    emit_json({"rules": str(out / rules_path.name), "dashboard": str(out / board_path.name)})
