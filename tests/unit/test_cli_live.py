"""The live admin reads (`bkaudit metadata show`, `bkaudit bookies list`) when ZooKeeper is not there or the
command line is wrong: one line on stderr, exit 2, within the connect bound. (Against a running cluster:
tests/integration/test_admin_reads.py.)"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from connectors.process import free_port

Cli = Callable[..., Any]


@pytest.mark.parametrize("command", [("metadata", "show", "7"), ("bookies", "list")])
def test_an_unreachable_zookeeper_is_one_line_within_the_connect_timeout(
    cli: Cli, command: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BKAUDIT_ZOOKEEPER__CONNECT_TIMEOUT_S", "1")
    nobody = f"127.0.0.1:{free_port()}"

    started = time.monotonic()
    result = cli(*command, "--zookeeper", nobody)

    # Under kazoo's own 15 s start timeout, with room for a busy machine: the 1 s bound is the one used.
    assert time.monotonic() - started < 10
    assert result.exit_code == 2 and result.stdout == b""
    assert result.stderr == (
        f"bkaudit: ZooKeeper at {nobody}: no connection within 1 s; check zookeeper.connect "
        "(BKAUDIT_ZOOKEEPER__CONNECT), that ZooKeeper is up and reachable from this host\n"
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("metadata", "show"), "give the ledger id (positional or --ledger-id)"),
        (("metadata", "show", "x7"), "ledger id 'x7' is not a non-negative decimal integer"),
        (("metadata", "show", "7", "--manager", "ms"), "unknown ledger manager 'ms'"),
        (("bookies", "list", "--ledgers-root", "ledgers/"), "--ledgers-root: Value error, ledgers_root must"),
    ],
)
def test_bad_arguments_are_one_line_before_any_connection(cli: Cli, arguments: tuple[str, ...], message: str):
    result = cli(*arguments, "--zookeeper", f"127.0.0.1:{free_port()}")

    assert result.exit_code == 2
    assert result.stderr.startswith("bkaudit: ") and result.stderr.count("\n") == 1
    assert message in result.stderr
