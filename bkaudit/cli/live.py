"""What the commands that talk to services share: where ZooKeeper and the broker are (``--dev`` for the
services of ``bkaudit dev up``), and one bounded read-only ZooKeeper session.

``--zookeeper`` and ``--ledgers-root`` override ``zookeeper.connect`` and ``zookeeper.ledgers_root`` (as for
``bkaudit watch``); credentials come from the ``zookeeper.auth_*`` settings only, so they never appear on a
command line. The session waits ``zookeeper.connect_timeout_s`` (default 10 s) for ZooKeeper, then exits 2.

Example:
    $ bkaudit bookies list --zookeeper zk1:2181/pulsar
"""

from __future__ import annotations

import os
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


DevOption = Annotated[
    bool,
    typer.Option("--dev", help="use the ZooKeeper and the broker of `bkaudit dev up` (dev.state_dir)"),
]

#: The settings ``--dev`` points at the services of ``bkaudit dev up``, as the variables that carry them.
DEV_VARIABLES = {"zookeeper": "BKAUDIT_ZOOKEEPER__CONNECT", "kafka": "BKAUDIT_KAFKA__BOOTSTRAP_SERVERS"}


def use_dev_services(dev: bool) -> dict[str, str]:
    """With ``--dev``: this process's ``zookeeper.connect`` and ``kafka.bootstrap_servers`` become the
    addresses of the services ``bkaudit dev up`` runs (set as ``BKAUDIT_*`` variables, so every part of
    the process and the Spark workers read them; a command's own ``--zookeeper`` still wins). When they
    are not running: one line naming them, exit 2. Returns the variables set.

    Example:
        >>> use_dev_services(False)
        {}
    """
    if not dev:
        return {}
    from connectors.devcluster import DevCluster
    from core.errors import ConfigError

    cluster = DevCluster(load_settings().dev)
    report = cluster.status()
    down = [name for name in DEV_VARIABLES if not report[name]["running"]]
    if down:
        raise ConfigError(
            f"--dev: the {' and the '.join(down)} of `bkaudit dev up` {'is' if len(down) == 1 else 'are'} "
            f"not running (state dir {report['state_dir']}); start them with `bkaudit dev up`"
        )
    addresses = cluster.addresses()
    variables = {variable: addresses[name] for name, variable in DEV_VARIABLES.items()}
    variables |= cluster.client_kafka_variables() | cluster.client_tls_variables()
    os.environ.update(variables)
    return variables


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
