"""What the live admin commands share: where ZooKeeper is, and one bounded read-only session on it.

``--zookeeper`` and ``--ledgers-root`` override ``zookeeper.connect`` and ``zookeeper.ledgers_root`` (as for
``bkaudit watch``); credentials come from the ``zookeeper.auth_*`` settings only, so they never appear on a
command line. The session waits ``zookeeper.connect_timeout_s`` (default 10 s) for ZooKeeper, then exits 2.

Example:
    $ bkaudit bookies list --zookeeper zk1:2181/pulsar
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from core.settings import load_settings

if TYPE_CHECKING:
    from connectors.zookeeper.admin_reads import AdminReader
    from core.domain.layout import LedgerManagerType

ZooKeeperOption = Annotated[
    str | None,
    typer.Option("--zookeeper", help="ZooKeeper connect string, chroot allowed (zookeeper.connect)"),
]
LedgersRootOption = Annotated[
    str | None,
    typer.Option("--ledgers-root", help="BookKeeper's zkLedgersRootPath (zookeeper.ledgers_root)"),
]


def admin_reader(
    zookeeper: str | None, ledgers_root: str | None, manager: LedgerManagerType | None = None
) -> AdminReader:
    """A not yet connected :class:`AdminReader` for the settings with the command's overrides applied.

    Example:
        >>> admin_reader("zk1:2181/bk", "/ledgers").settings.connect
        'zk1:2181/bk'
    """
    from pydantic import ValidationError

    from connectors.zookeeper.admin_reads import AdminReader
    from core.errors import ConfigError
    from core.settings import ZooKeeperSettings

    settings = load_settings().zookeeper
    given = {
        key: value
        for key, value in (("connect", zookeeper), ("ledgers_root", ledgers_root))
        if value is not None
    }
    try:  # validated like the settings themselves: a bad connect string or root is one line, exit 2
        settings = ZooKeeperSettings.model_validate({**dict(settings), **given})
    except ValidationError as err:
        problem = err.errors()[0]
        flag = "--zookeeper" if problem["loc"][0] == "connect" else "--ledgers-root"
        raise ConfigError(f"{flag}: {problem['msg']}") from None
    return AdminReader(settings, manager=manager)
