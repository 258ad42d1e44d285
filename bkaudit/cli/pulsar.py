"""`bkaudit pulsar ...`: Pulsar's view of BookKeeper, read live from the metadata store.

``topic TOPIC`` reads the topic's managed ledger (``/managed-ledgers/...``) and its cursors, and asks
BookKeeper for every ledger they list: a ledger Pulsar needs that BookKeeper no longer has (and that no
complete offload deleted) is why a topic fails to load. Exit 1 when one is missing, 2 for bad input or a
topic without a managed ledger.

Example:
    $ bkaudit pulsar topic persistent://public/default/orders
"""

from __future__ import annotations

from typing import Annotated

import typer

from bkaudit.cli.formats import StateFormat, StateFormatOption, emit_state
from bkaudit.cli.live import DevOption, LedgersRootOption, ZooKeeperOption, admin_reader, use_dev_services

app = typer.Typer(
    help="Pulsar's view of BookKeeper, read live from the metadata store.", no_args_is_help=True
)


@app.command("topic")
def topic(
    name: Annotated[str, typer.Argument(help="the topic, persistent://tenant/namespace/topic")],
    fmt: StateFormatOption = StateFormat.table,
    zookeeper: ZooKeeperOption = None,
    ledgers_root: LedgersRootOption = None,
    dev: DevOption = False,
) -> None:
    """The ledgers a topic and its cursors need, and whether BookKeeper still has each: MISSING, ok,
    offloaded. Exits 1 when one is missing (the topic cannot load)."""
    from core.domain.managed_ledger import managed_ledger_path, topic_ledger_rows

    managed_ledger_path(name)  # a name that is not a persistent topic is bad input before any connection
    use_dev_services(dev)
    with admin_reader(zookeeper, ledgers_root) as reader:
        znodes = reader.managed_ledger(name)
        wanted = {*znodes.info.ledger_ids, *(i for c in znodes.cursors.values() for i in c.ledger_ids)}
        in_bookkeeper = {ledger_id: reader.ledger_exists(ledger_id) for ledger_id in sorted(wanted)}
    rows = topic_ledger_rows(znodes.info, znodes.cursors, in_bookkeeper)
    missing = sorted({row["ledger_id"] for row in rows if row["state"] == "MISSING"})
    document = {
        "topic": name,
        "path": znodes.path,
        "terminated": znodes.info.terminated_at is not None,
        "missing": missing,
        "ledgers": rows,
    }
    emit_state(document, fmt)
    if missing:
        raise typer.Exit(1)
