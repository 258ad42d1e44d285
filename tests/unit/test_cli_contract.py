"""The CLI's error contract: exit 2 and exactly one line on stderr for bad usage, never a traceback."""

from __future__ import annotations


def test_unknown_command_is_exit_2_with_one_line(cli):
    result = cli("no-such-command")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "no-such-command" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_option_is_exit_2_with_one_line(cli):
    result = cli("dev", "up", "--no-such-option")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1


def test_invalid_settings_are_exit_2_with_one_line(cli, monkeypatch):
    monkeypatch.setenv("BKAUDIT_DEV__ZOOKEEPER_PORT", "99999999")
    result = cli("dev", "status")
    assert result.exit_code == 2
    assert result.stderr.startswith("bkaudit: invalid settings: dev.zookeeper_port")
    assert result.stderr.count("\n") == 1


def test_help_lists_the_command_groups(cli):
    result = cli("--help")
    assert result.exit_code == 0
    for group in ("metadata", "availability", "check", "path", "dev", "demo"):
        assert group in result.text
