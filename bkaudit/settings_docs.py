"""The configuration reference (``docs/configuration.md``), generated from the :class:`Settings` model.

Every setting appears with its config-file key, its environment variable, its type and constraints, its
default and its meaning, so the reference cannot drift from the code: a unit test fails when the committed
file differs from what this module renders.

    python -m bkaudit.settings_docs              # rewrite docs/configuration.md
    python -m bkaudit.settings_docs --check      # exit 1 when docs/configuration.md is stale
    bkaudit config show                          # the settings this environment yields, secrets masked
    bkaudit config docs                          # this reference, on stdout

Example:
    >>> rows = {row.key: row for row in setting_docs()}
    >>> rows["kafka.sasl_password"].env_var, rows["kafka.sasl_password"].default
    ('BKAUDIT_KAFKA__SASL_PASSWORD', 'unset (secret)')
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from core.settings import CONFIG_FILE_ENV, Settings

DOC_PATH = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
MASK = "**********"

# Which processes read a section (the reader of the reference wants to know where to set it).
SECTION_USERS: dict[str, str] = {
    "": "`cluster`: both processes; the roots: `bkaudit stream`; `log_dir`: `demo`, `stream` and `watch`.",
    "dev": "only `bkaudit dev`, `bkaudit demo` and the tests (the embedded services); ignored in production.",
    "zookeeper": "`bkaudit watch` (and `bkaudit sim`).",
    "kafka": "Both processes, and the Spark executors that read the changes topic.",
    "spark": "`bkaudit stream`.",
    "watcher": "`bkaudit watch`.",
    "stream": "`bkaudit stream`.",
}


@dataclass(frozen=True)
class SettingDoc:
    """One leaf setting as the reference shows it."""

    key: str  # config-file key, dotted: "kafka.sasl_password"
    env_var: str  # "BKAUDIT_KAFKA__SASL_PASSWORD"
    type_text: str
    default: str  # rendered for humans; secrets masked
    env_default: str | None  # the default as an environment variable value; None when unset
    description: str
    secret: bool


def _is_model(annotation: Any) -> bool:
    return inspect.isclass(annotation) and issubclass(annotation, BaseModel)


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f"`{value}`" for value in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return " or ".join(_type_name(a) for a in members)
    if origin is dict:
        key, value = typing.get_args(annotation)
        return f"map of {_type_name(key)} to {_type_name(value)} (JSON in the environment)"
    if annotation is SecretStr:
        return "secret string"
    if annotation is Path:
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def _constraints(field: FieldInfo) -> str:
    bounds = (
        (annotated_types.Ge, "ge", "≥"),
        (annotated_types.Gt, "gt", ">"),
        (annotated_types.Le, "le", "≤"),
        (annotated_types.Lt, "lt", "<"),
    )
    parts = []
    for item in field.metadata:
        for kind, attribute, symbol in bounds:
            if isinstance(item, kind):
                parts.append(f"{symbol} {_plain(getattr(item, attribute))}")
    return ", ".join(parts)


def _plain(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, SecretStr):
        return MASK
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _leaf(path: tuple[str, ...], field: FieldInfo) -> SettingDoc:
    key = ".".join(path)
    annotation = field.annotation
    secret = SecretStr in (annotation, *typing.get_args(annotation))
    default = field.get_default(call_default_factory=True)
    description = field.description or ""
    type_text = _type_name(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in typing.get_args(
        annotation
    ):
        type_text += ", optional"
    if constraints := _constraints(field):
        type_text += f" ({constraints})"
    if default is None:
        shown = "unset (secret)" if secret else "unset"
    else:
        shown = f"`{_plain(default)}`" if _plain(default) else '`""`'
    return SettingDoc(
        key=key,
        env_var="BKAUDIT_" + "__".join(part.upper() for part in path),
        type_text=type_text,
        default=shown,
        env_default=None if default is None or secret else _plain(default),
        description=description,
        secret=secret,
    )


def setting_docs(model: type[BaseModel] = Settings) -> list[SettingDoc]:
    """Every leaf setting of ``model`` (nested models flattened), in declaration order.

    Example:
        >>> [row.env_var for row in setting_docs()][:2]
        ['BKAUDIT_CLUSTER', 'BKAUDIT_LAKEHOUSE_ROOT']
    """
    rows: list[SettingDoc] = []

    def walk(current: type[BaseModel], prefix: tuple[str, ...]) -> None:
        for name, field in current.model_fields.items():
            if _is_model(field.annotation):
                walk(field.annotation, (*prefix, name))  # type: ignore[arg-type]
            else:
                rows.append(_leaf((*prefix, name), field))

    walk(model, ())
    return rows


def _sections(model: type[BaseModel]) -> list[tuple[str, type[BaseModel]]]:
    nested = [(name, f.annotation) for name, f in model.model_fields.items() if _is_model(f.annotation)]
    return [("", model), *nested]  # type: ignore[list-item]


def _summary(model: type[BaseModel]) -> str:
    """The first paragraph of a model's docstring, on one line."""
    doc = (inspect.getdoc(model) or "").replace("``", "`")  # reST literals in docstrings → Markdown
    return " ".join(doc.split("\n\n")[0].split())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def configuration_markdown(model: type[BaseModel] = Settings) -> str:
    """The whole reference as Markdown: how settings are read, then one table per section.

    Example:
        >>> "| `stream.app_id` | `BKAUDIT_STREAM__APP_ID` |" in configuration_markdown()
        True
    """
    rows = setting_docs(model)
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m bkaudit.settings_docs` from `core/settings.py`; do not edit by",
        "     hand: tests/unit/test_settings_docs.py fails when this file is stale. -->",
        "",
        "Every bkaudit process reads the same settings, in this order of priority: keyword arguments "
        "(tests), `BKAUDIT_*` environment variables, the file named by "
        f"`{CONFIG_FILE_ENV}` (`.toml`, `.yaml`/`.yml` or `.json`), then the defaults below. "
        "Nested settings use `__` in environment variables (`BKAUDIT_KAFKA__BOOTSTRAP_SERVERS`) and a "
        "nested mapping in the file (`kafka: {bootstrap_servers: ...}`). `examples/bkaudit.toml` is a sample "
        "file.",
        "",
        "A key that is no setting (in any section of the file, in a nested `BKAUDIT_*__*` variable or in "
        "`--set`) is an error naming it, where it came from and the setting it most likely means, e.g. "
        "`bkaudit: invalid settings: kafka.bootstrap_server: no such setting; did you mean "
        "kafka.bootstrap_servers? (from config file bkaudit.toml)`; so is a malformed value, e.g. "
        "`kafka.extra_config: not JSON (Expecting value at column 1) (from --set)`. Both exit 2.",
        "",
        f"Secrets (`secret string`) print as `{MASK}` in every log, `repr` and JSON dump; pass them as "
        "environment variables from a secret store rather than in the config file. "
        "`bkaudit config show` prints the settings the current environment yields, secrets masked "
        "(`--format json` for scripts); `bkaudit --set key=value ...` overrides one setting for one command, "
        "above the environment, and `bkaudit --config FILE ...` names the file.",
        "",
        f"{len(rows)} settings.",
        "",
    ]
    for name, section in _sections(model):
        title = "Top level" if not name else f"`{name}`"
        lines += [f"## {title}", "", _summary(section), ""]
        if SECTION_USERS.get(name):
            lines += [f"Read by: {SECTION_USERS[name]}", ""]
        lines += [
            "| Setting | Environment variable | Type | Default | Meaning |",
            "|---|---|---|---|---|",
        ]
        prefix = f"{name}." if name else ""
        for row in rows:
            inside = row.key.startswith(prefix) and "." not in row.key[len(prefix) :]
            if inside:
                lines.append(
                    f"| `{row.key}` | `{row.env_var}` | {_cell(row.type_text)} | {_cell(row.default)} "
                    f"| {_cell(row.description)} |"
                )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def effective_settings_json(settings: Settings) -> str:
    """``settings`` as indented JSON with every secret masked (what a process would run with).

    Example:
        >>> text = effective_settings_json(Settings(kafka={"sasl_password": "s3cret"}))
        >>> "s3cret" in text, json.loads(text)["kafka"]["sasl_password"]
        (False, '**********')
    """
    return json.dumps(settings.model_dump(mode="json"), indent=2, sort_keys=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or ``--check``) the reference, or print the ``--effective`` settings; returns the exit code.

    Example:
        >>> # python -m bkaudit.settings_docs --check   → 0 when docs/configuration.md is current
    """
    parser = argparse.ArgumentParser(
        prog="python -m bkaudit.settings_docs", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("path", nargs="?", type=Path, default=DOC_PATH, help="the reference file to write")
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is stale, write nothing")
    parser.add_argument("--effective", action="store_true", help="print the settings this environment yields")
    args = parser.parse_args(argv)
    if args.effective:
        from core.settings import load_settings

        print(effective_settings_json(load_settings()))
        return 0
    text = configuration_markdown()
    if args.check:
        current = args.path.read_text() if args.path.exists() else ""
        if current != text:
            print(f"{args.path} is stale: run `python -m bkaudit.settings_docs`", file=sys.stderr)
            return 1
        return 0
    args.path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
