"""One CLI grammar: --version, the global --config and --set, `config show|docs`, ids spelled the same
way, bookies by id, state reports as tables or JSON, and help without type names or reST markup."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from bkaudit import __version__
from bkaudit.cli.main import app

# --config and --set act through the environment of the process: each test gets it back as it was.
pytestmark = pytest.mark.usefixtures("restored_environment")


def _every_command(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _every_command(sub, (*path, name))


def test_no_help_shows_a_python_type_or_rest_markup(cli: Any):
    paths = list(_every_command(typer.main.get_command(app)))
    assert len(paths) > 40
    noisy = {}
    for path in paths:
        result = cli(*path, "--help")
        assert result.exit_code == 0, (path, result.stderr)
        found = re.findall(r"<[a-z][a-z_\[\], ]*>|``|:(?:class|func|mod|meth):", result.text)
        if found:
            noisy[" ".join(path)] = found
    assert not noisy, noisy


def test_version(cli: Any):
    result = cli("--version")
    assert (result.exit_code, result.text) == (0, f"bkaudit {__version__}\n")


def test_set_and_config_reach_the_settings_and_config_show_masks_secrets(cli: Any, tmp_path: Path):
    config = tmp_path / "bkaudit.json"
    config.write_text(json.dumps({"stream": {"app_id": "from-file"}, "kafka": {"client_id": "file-id"}}))
    result = cli(
        "--config", str(config), "--set", "kafka.client_id=cli-id", "--set", "kafka.sasl_password=s3cret",
        "config", "show", "--format", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    shown = result.json()
    assert shown["stream"]["app_id"] == "from-file"  # the file
    assert shown["kafka"]["client_id"] == "cli-id"  # --set wins over the file
    assert shown["kafka"]["sasl_password"] == "**********" and "s3cret" not in result.text
    table = cli("--set", "kafka.sasl_password=s3cret", "config", "show")
    assert table.exit_code == 0 and "s3cret" not in table.text
    assert re.search(r"^kafka\.sasl_password +\*{10}$", table.text, re.M), table.text


def test_an_unknown_setting_or_a_bad_value_is_one_line(cli: Any):
    unknown = cli("--set", "kafka.bootstrap=k:1", "config", "show")
    assert unknown.exit_code == 2 and unknown.stderr.count("\n") == 1 and "no such setting" in unknown.stderr
    bad = cli("--set", "stream.watermark_delay_s=soon", "config", "show")
    assert bad.exit_code == 2 and bad.stderr.startswith("bkaudit: invalid settings: stream.watermark_delay_s")


def test_config_docs_is_the_reference():
    from bkaudit.settings_docs import DOC_PATH, configuration_markdown

    assert configuration_markdown() == DOC_PATH.read_text()


def test_config_docs_prints_it(cli: Any):
    result = cli("config", "docs")
    assert result.exit_code == 0 and result.text.startswith("# Configuration reference")


def test_a_ledger_id_is_positional_or_named_alike(cli: Any):
    assert cli("path", "ledger", "59").text == cli("path", "ledger", "--ledger-id", "59").text
    assert cli("path", "ledger", "59", "--ledgers-root", "/x").text == "/x/00/0000/L0059\n"
    assert cli("path", "ledger", "59", "--root", "/x").text == "/x/00/0000/L0059\n"  # the old spelling
    both = cli("path", "ledger", "59", "--ledger-id", "60")
    assert both.exit_code == 2 and "two different values" in both.stderr


def test_a_bookie_is_named_by_id_and_a_number_is_not_taken_for_a_place(cli: Any, tmp_path: Path):
    result = cli("sim", "kill-bookie", "1", "--state-dir", str(tmp_path))
    assert result.exit_code == 2 and "use --index 1" in result.stderr, result.stderr
    neither = cli("sim", "kill-bookie", "--state-dir", str(tmp_path))
    assert neither.exit_code == 2 and "--index" in neither.stderr


def test_dev_status_is_a_table_by_default_and_json_on_request(cli: Any, tmp_path: Path):
    state = ("--set", f"dev.state_dir={tmp_path}")
    table = cli(*state, "dev", "status")
    assert table.exit_code == 0 and table.text.splitlines()[0].split() == [
        "name",
        "running",
        "pid",
        "address",
        "log",
    ]
    document = cli(*state, "dev", "status", "--format", "json").json()
    assert document["zookeeper"]["running"] is False and document["state_dir"] == str(tmp_path)
    named = cli("dev", "status", "--state-dir", str(tmp_path / "other"), "--format", "json").json()
    assert named["state_dir"] == str(tmp_path / "other")  # --state-dir, as on `sim`
