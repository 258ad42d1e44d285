"""docs/configuration.md is generated from the Settings model, and what it says is what the model reads."""

from __future__ import annotations

import doctest
import json
import os
import typing
from functools import reduce
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field, SecretStr

import bkaudit.settings_docs as settings_docs
from bkaudit.settings_docs import (
    DOC_PATH,
    MASK,
    SettingDoc,
    configuration_markdown,
    effective_settings_json,
    main,
    setting_docs,
)
from core.settings import Settings

ROWS = setting_docs()


def test_committed_reference_is_current():
    assert DOC_PATH.read_text() == configuration_markdown(), (
        "docs/configuration.md is stale: run `python -m bkaudit.settings_docs`"
    )


def test_every_leaf_setting_is_listed_once_with_a_meaning():
    def leaves(model: type[BaseModel], prefix: str = "") -> list[str]:
        out = []
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                out += leaves(annotation, f"{prefix}{name}.")
            else:
                out.append(prefix + name)
        return out

    assert [row.key for row in ROWS] == leaves(Settings)
    undocumented = [row.key for row in ROWS if not row.description.strip()]
    assert not undocumented, f"give these settings a Field(description=...): {undocumented}"


def test_the_models_field_descriptions_are_the_only_source():
    import bkaudit.settings_docs as module

    assert not [name for name in vars(module) if "DESCRIPTION" in name.upper()]
    for row in ROWS:
        model: Any = Settings
        *sections, name = row.key.split(".")
        for section in sections:
            model = model.model_fields[section].annotation
        assert row.description == model.model_fields[name].description, row.key


# Settings validated as service addresses (host[:port] lists): a path is not one.
_ADDRESSES = {
    "zookeeper.connect": "zk.example:2181/alternative",
    "kafka.bootstrap_servers": "kafka.example:9093",
    "watcher.rack_map_zookeeper": "zk2.example:2181",
    "object_store.lakehouse_url": "s3://bucket/alternative",
    "object_store.checkpoint_url": "s3://bucket/checkpoints",
}


def _alternative(row: SettingDoc) -> Any:
    """A valid value that differs from the default, as Python (for kwargs) — proves the name is read."""
    if row.key in _ADDRESSES:
        return _ADDRESSES[row.key]
    field: Any = Settings
    *sections, name = row.key.split(".")
    for section in sections:
        field = field.model_fields[section].annotation
    info = field.model_fields[name]
    annotation = info.annotation
    default = info.get_default(call_default_factory=True)
    choices = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = choices[0] if typing.get_origin(annotation) in (typing.Union, type(int | None)) else annotation
    if typing.get_origin(base) is Literal:
        options = [v for v in typing.get_args(base) if v != default]
        return options[0]
    if base is bool:
        return not default
    if base is int:
        upper = next((m.le for m in info.metadata if hasattr(m, "le")), None)
        value = (default or 0) + 1
        return value if upper is None or value <= upper else default - 1
    if base is float:
        return (default or 0.0) + 0.5
    if typing.get_origin(base) is dict:
        _key_type, value_type = typing.get_args(base)
        if typing.get_origin(value_type) is Literal:  # a map to choices: the last choice
            return {"bkaudit-test": typing.get_args(value_type)[-1]}
        return {"spark.bkaudit.test": "yes"}
    if typing.get_origin(base) is list:
        return ["/alternative"]
    if base is SecretStr:
        return "s3cret-value"
    return "/alternative"  # str and Path; absolute, so path-shaped validators accept it


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


@pytest.mark.parametrize("row", ROWS, ids=[row.key for row in ROWS])
def test_the_documented_environment_variable_sets_the_documented_setting(row, monkeypatch):
    for name in list(os.environ):
        if name.startswith("BKAUDIT_"):
            monkeypatch.delenv(name)
    value = _alternative(row)
    monkeypatch.setenv(row.env_var, _env_text(value))
    path = row.key.split(".")
    from_env = reduce(getattr, path, Settings())
    nested: dict[str, Any] = {path[-1]: value}
    for section in reversed(path[:-1]):
        nested = {section: nested}
    expected = reduce(getattr, path, Settings(**nested))
    monkeypatch.delenv(row.env_var)
    default = reduce(getattr, path, Settings())
    assert from_env == expected != default


def test_documented_defaults_are_the_model_defaults():
    settings = Settings()
    for row in ROWS:
        actual = reduce(getattr, row.key.split("."), settings)
        if row.env_default is None:
            assert actual is None, row.key
        elif isinstance(actual, bool):
            assert row.env_default == ("true" if actual else "false"), row.key
        elif isinstance(actual, dict):
            assert json.loads(row.env_default) == actual, row.key
        else:
            assert row.env_default == str(actual), row.key
        assert row.default == "unset" or row.default.startswith(("`", "unset (secret)")), row.key


def test_secrets_are_masked_in_the_reference_and_in_the_effective_settings(monkeypatch):
    class WithSecret(BaseModel):
        """A model whose secret has a default (bkaudit's secrets default to unset)."""

        token: SecretStr = Field(SecretStr("hunter2"), description="an API token")
        level: int = Field(3, description="a number")

    text = configuration_markdown(WithSecret)
    assert f"`{MASK}`" in text and "hunter2" not in text
    assert "| `token` | `BKAUDIT_TOKEN` | secret string |" in text
    monkeypatch.setenv("BKAUDIT_KAFKA__SASL_PASSWORD", "pa55word")
    monkeypatch.setenv("BKAUDIT_ZOOKEEPER__AUTH_PASSWORD", "zk-pa55")
    effective = effective_settings_json(Settings())
    assert "pa55word" not in effective and "zk-pa55" not in effective
    assert json.loads(effective)["kafka"]["sasl_password"] == MASK


def test_check_mode_fails_on_a_stale_file_and_write_mode_fixes_it(tmp_path, capsys):
    target = tmp_path / "configuration.md"
    target.write_text("# out of date\n")
    assert main([str(target), "--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert main([str(target)]) == 0
    assert main([str(target), "--check"]) == 0
    assert target.read_text() == configuration_markdown()


def test_module_examples():
    result = doctest.testmod(settings_docs)
    assert result.attempted > 0 and result.failed == 0
