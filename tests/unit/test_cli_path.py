"""`bkaudit path ledger|underreplicated` (docs/reference.md, "Admin commands"): one line on stdout, exit 2
on bad input."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import CliResult

Cli = Callable[..., CliResult]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("59",), "/ledgers/00/0000/L0059"),
        (("0",), "/ledgers/00/0000/L0000"),
        (("12345",), "/ledgers/00/0001/L2345"),
        (("1234567890",), "/ledgers/12/3456/L7890"),
        (("2147483646",), "/ledgers/21/4748/L3646"),
        (("2147483647",), "/ledgers/000/0000/0021/4748/L3647"),
        (("9223372036854775807",), "/ledgers/922/3372/0368/5477/L5807"),
        (("59", "--manager", "hierarchical"), "/ledgers/00/0000/L0059"),
        (("59", "--manager", "flat"), "/ledgers/L0000000059"),
        # FlatLedgerManager formats any long with L%010d: past 2^31-1, and longer than 10 digits.
        (("2147483647", "--manager", "flat"), "/ledgers/L2147483647"),
        (("9876543210", "--manager", "flat"), "/ledgers/L9876543210"),
        (("98765432101", "--manager", "flat"), "/ledgers/L98765432101"),
        (("9223372036854775807", "--manager", "flat"), "/ledgers/L9223372036854775807"),
        (("1234567890", "--manager", "longhierarchical"), "/ledgers/000/0000/0012/3456/L7890"),
        (("9999999999", "--manager", "legacyhierarchical"), "/ledgers/99/9999/L9999"),
        (("59", "--root", "/pulsar/ledgers"), "/pulsar/ledgers/00/0000/L0059"),
        (("--manager", "flat", "--root", "/bk", "59"), "/bk/L0000000059"),
        (("059",), "/ledgers/00/0000/L0059"),
    ],
)
def test_path_ledger(cli: Cli, args: tuple[str, ...], expected: str) -> None:
    result = cli("path", "ledger", *args)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (expected + "\n").encode()
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("59",), "/ledgers/underreplication/ledgers/0000/0000/0000/003b/urL0000000059"),
        (("0",), "/ledgers/underreplication/ledgers/0000/0000/0000/0000/urL0000000000"),
        (
            ("9223372036854775807",),
            "/ledgers/underreplication/ledgers/7fff/ffff/ffff/ffff/urL9223372036854775807",
        ),
        (("59", "--root", "/bk"), "/bk/underreplication/ledgers/0000/0000/0000/003b/urL0000000059"),
    ],
)
def test_path_underreplicated(cli: Cli, args: tuple[str, ...], expected: str) -> None:
    result = cli("path", "underreplicated", *args)
    assert result.exit_code == 0, result.stderr
    assert result.text == expected + "\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("ledger", "-5"), "negative"),
        (("ledger", "--", "-5"), "negative"),
        (("ledger", "abc"), "not a non-negative decimal integer"),
        (("ledger", "1.5"), "not a non-negative decimal integer"),
        (("ledger", "1e3"), "not a non-negative decimal integer"),
        (("ledger", "١٢"), "not a non-negative decimal integer"),
        (("ledger", ""), "not a non-negative decimal integer"),
        (("ledger", "9223372036854775808"), "out of range"),
        (("ledger", "9223372036854775808", "--manager", "flat"), "out of range"),
        (("ledger", "10000000000", "--manager", "legacyhierarchical"), "legacyhierarchical ledger manager"),
        (("ledger", "59", "--manager", "ms"), "unknown ledger manager"),
        (("ledger", "59", "--manager", "bogus"), "unknown ledger manager"),
        (("ledger", "59", "--root", "ledgers"), "must start with '/'"),
        (("ledger", "59", "--root", "/ledgers/"), "must not end with '/'"),
        (("ledger", "59", "--root", "/"), "must not be '/'"),
        (("ledger",), "give the ledger id"),
        (("underreplicated", "-1"), "negative"),
        (("underreplicated", "x"), "not a non-negative decimal integer"),
        (("underreplicated", "9223372036854775808"), "out of range"),
        (("underreplicated", "59", "--root", "//x"), "empty"),
    ],
)
def test_bad_input_exits_2_with_one_line(cli: Cli, args: tuple[str, ...], message: str) -> None:
    result = cli("path", *args)
    assert result.exit_code == 2
    assert result.stdout == b""
    assert result.stderr.endswith("\n")
    assert result.stderr.count("\n") == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_help_lists_both_commands(cli: Cli) -> None:
    result = cli("path", "--help")
    assert result.exit_code == 0
    assert "ledger" in result.text and "underreplicated" in result.text
