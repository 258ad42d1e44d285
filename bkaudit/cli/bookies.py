"""`bkaudit bookies list [--rw|--ro]`: the bookies registered in the cluster's ZooKeeper now.

Like ``bookkeeper shell listbookies -rw/-ro``: writable bookies (``available/``) and read-only ones
(``available/readonly/``), each with the address its registration publishes. A table by default, one JSON
object with ``--format json``. Without ``--rw`` or ``--ro`` both kinds are listed.

Example:
    $ bkaudit bookies list --ro
    read_only: 1
    bookies:
    bookie_id  state      address
    ---------  ---------  ---------------
    bookie-02  read-only  127.0.0.1:41877
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from bkaudit.cli.formats import StateFormat, StateFormatOption, emit_state
from bkaudit.cli.live import DevOption, LedgersRootOption, ZooKeeperOption, admin_reader, use_dev_services
from core.domain.registration import bookie_rpc_address, decode_bookie_service_info
from core.errors import FormatError

if TYPE_CHECKING:
    from connectors.zookeeper.admin_reads import RegisteredBookie

app = typer.Typer(help="Bookies registered in the cluster's ZooKeeper now.", no_args_is_help=True)

WRITABLE, READ_ONLY = "writable", "read-only"


def bookie_row(bookie: RegisteredBookie) -> dict[str, Any]:
    """One table row: id, state and the published bookie-rpc address (a ``problem`` when undecodable).

    Example:
        >>> from connectors.zookeeper.admin_reads import RegisteredBookie
        >>> bookie_row(RegisteredBookie("10.0.0.5:3181", read_only=False, data=b""))
        {'bookie_id': '10.0.0.5:3181', 'state': 'writable', 'address': '10.0.0.5:3181'}
    """
    row: dict[str, Any] = {
        "bookie_id": bookie.bookie_id,
        "state": READ_ONLY if bookie.read_only else WRITABLE,
    }
    try:
        address = bookie_rpc_address(decode_bookie_service_info(bookie.bookie_id, bookie.data))
    except FormatError as err:
        return {**row, "address": None, "problem": str(err)}
    return {**row, "address": None if address is None else str(address)}


@app.command("list")
def list_command(
    writable: Annotated[bool, typer.Option("--rw", "--writable", help="list the writable bookies")] = False,
    read_only: Annotated[bool, typer.Option("--ro", "--readonly", help="list the read-only bookies")] = False,
    fmt: StateFormatOption = StateFormat.table,
    zookeeper: ZooKeeperOption = None,
    ledgers_root: LedgersRootOption = None,
    dev: DevOption = False,
) -> None:
    """List the writable and read-only bookies registered now (like `bookkeeper shell listbookies`).

    Example:
        $ bkaudit bookies list --rw --format json
    """
    use_dev_services(dev)
    wanted = {WRITABLE: writable or not read_only, READ_ONLY: read_only or not writable}
    with admin_reader(zookeeper, ledgers_root) as reader:
        registered = reader.registered_bookies()
    rows = [row for row in map(bookie_row, registered) if wanted[row["state"]]]
    counts = {"writable": WRITABLE, "read_only": READ_ONLY}
    document: dict[str, Any] = {
        key: sum(row["state"] == state for row in rows) for key, state in counts.items() if wanted[state]
    }
    document["bookies"] = rows
    emit_state(document, fmt)
