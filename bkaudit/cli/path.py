"""`bkaudit path ...`: print the ZooKeeper znode path BookKeeper uses for a ledger (docs/reference.md,
"Admin commands").

    $ bkaudit path ledger 59
    /ledgers/00/0000/L0059
    $ bkaudit path ledger 59 --manager flat --root /bk
    /bk/L0000000059
    $ bkaudit path underreplicated 59
    /ledgers/underreplication/ledgers/0000/0000/0000/003b/urL0000000059

Bad input (non-numeric or negative id, an id the manager cannot address, a bad root or manager) exits 2
with one line on stderr: the commands raise :class:`core.errors.FormatError` and ``bkaudit.cli.main.run``
reports it.
"""

from __future__ import annotations

import typer

from bkaudit.cli._io import positional_or_named
from core.domain.layout import DEFAULT_LEDGERS_ROOT, LedgerManagerType, ledger_path
from core.domain.underreplication import urledger_path
from core.errors import FormatError

app = typer.Typer(
    help="Print the znode path of a ledger's metadata or under-replication mark.", no_args_is_help=True
)

# Managers with ZooKeeper ledger paths (the metastore manager has none).
_PATH_MANAGERS = ("hierarchical", "longhierarchical", "legacyhierarchical", "flat")


def parse_ledger_id(text: str) -> int:
    """A ledger id argument, strict ASCII decimal (``int()`` would also take "1_000", " 5", other digits).

    Example:
        >>> parse_ledger_id("59")
        59
    """
    if text.startswith("-") and text[1:].isascii() and text[1:].isdigit():
        raise FormatError(f"ledger id {text[:40]} is negative (ledger ids are 0..2^63-1)")
    if not (text.isascii() and text.isdigit()):
        raise FormatError(f"ledger id {text[:40]!r} is not a non-negative decimal integer")
    return int(text)


def parse_manager(name: str) -> LedgerManagerType:
    """A ``--manager`` value (case-insensitive) among the managers with ZooKeeper ledger paths.

    Example:
        >>> parse_manager("flat")
        <LedgerManagerType.FLAT: 'flat'>
    """
    if name.lower() not in _PATH_MANAGERS:
        raise FormatError(f"unknown ledger manager {name!r} (choose from {', '.join(_PATH_MANAGERS)})")
    return LedgerManagerType.from_name(name)


# --ledgers-root is the setting's name (zookeeper.ledgers_root); --root stays for the scripts that use it.
_ROOT_FLAGS = ("--ledgers-root", "--root")
_ROOT_HELP = "Ledgers root path (zkLedgersRootPath)."

# A negative id such as "-5" would otherwise be rejected as an unknown option; let our parser explain it.
ID_ARGUMENT_SETTINGS = {"ignore_unknown_options": True}


@app.command("ledger", context_settings=ID_ARGUMENT_SETTINGS)
def ledger(
    ledger_id: str | None = typer.Argument(
        None,
        metavar="LEDGER_ID",
        help="Ledger id, 0..2^63-1 (legacyhierarchical: < 10^10); or give --ledger-id.",
    ),
    manager: str = typer.Option(
        "hierarchical",
        "--manager",
        help="Ledger manager: hierarchical, longhierarchical, legacyhierarchical, flat.",
    ),
    root: str = typer.Option(DEFAULT_LEDGERS_ROOT, *_ROOT_FLAGS, help=_ROOT_HELP),
    named_id: str | None = typer.Option(None, "--ledger-id", help="the ledger id, as a named option"),
) -> None:
    """Print the metadata znode path of ledger LEDGER_ID."""
    chosen = positional_or_named(ledger_id, named_id, "--ledger-id")
    typer.echo(ledger_path(parse_ledger_id(chosen), parse_manager(manager), root))


@app.command("underreplicated", context_settings=ID_ARGUMENT_SETTINGS)
def underreplicated(
    ledger_id: str | None = typer.Argument(
        None, metavar="LEDGER_ID", help="Ledger id, 0..2^63-1; or give --ledger-id."
    ),
    root: str = typer.Option(DEFAULT_LEDGERS_ROOT, *_ROOT_FLAGS, help=_ROOT_HELP),
    named_id: str | None = typer.Option(None, "--ledger-id", help="the ledger id, as a named option"),
) -> None:
    """Print the under-replication mark znode path (urL...) of ledger LEDGER_ID."""
    typer.echo(urledger_path(parse_ledger_id(positional_or_named(ledger_id, named_id, "--ledger-id")), root))
