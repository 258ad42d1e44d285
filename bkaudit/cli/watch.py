"""`bkaudit watch`: publish a BookKeeper cluster's ZooKeeper metadata changes to Kafka until SIGTERM/SIGINT.

Settings come from ``BKAUDIT_*`` variables or ``BKAUDIT_CONFIG_FILE`` (see ``core.settings``); the options
below override the most common ones. Logs go to stderr; credentials are never logged.

Example:
    $ bkaudit watch --zookeeper zk1:2181,zk2:2181/pulsar --bootstrap kafka:9092 --metrics-port 9464
    $ bkaudit watch --dev --exit-after-snapshot      # against `bkaudit dev up`, one snapshot, then exit

With ``--dev`` the rack map is Pulsar's ``/bookies`` znode on that ZooKeeper (where ``bkaudit sim up`` writes
it) unless ``--rack-map-znode``, ``--rack-map-file`` or a setting names another source.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import typer

from bkaudit.cli.live import DevOption, use_dev_services
from core.domain.rackmap import PULSAR_RACK_MAP_ZNODE
from core.errors import InvalidArgumentError
from core.settings import Settings, WatcherSettings, load_settings


def _overrides(**options: Any) -> dict[str, Any]:
    """Nested settings overrides from the command-line options that were given."""
    sections: dict[str, dict[str, Any]] = {"zookeeper": {}, "kafka": {}, "watcher": {}}
    for key, value in options.items():
        if value is None:
            continue
        section, _, name = key.partition("__")
        sections[section][name] = value
    return {section: values for section, values in sections.items() if values}


def dev_rack_map(watcher: WatcherSettings) -> WatcherSettings:
    """``--dev``'s rack map source: Pulsar's ``/bookies`` znode, where ``bkaudit sim up``, ``bkaudit dev up
    --bookkeeper real`` and the demos write theirs, unless a rack map source is configured. Without one every
    bookie sits in the default rack and every closed ledger fails placement. An absent znode is an empty map,
    published when it appears.

    Example:
        >>> dev_rack_map(WatcherSettings()).rack_map_znode
        '/bookies'
        >>> dev_rack_map(WatcherSettings(rack_map_file="racks.json")).rack_map_znode is None
        True
    """
    if watcher.rack_map_znode is not None or watcher.rack_map_file is not None:
        return watcher
    return watcher.model_copy(update={"rack_map_znode": PULSAR_RACK_MAP_ZNODE})


def _with_dev_rack_map(settings: Settings) -> Settings:
    return settings.model_copy(update={"watcher": dev_rack_map(settings.watcher)})


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _log_level(name: str) -> str:
    """``name`` as a logging level; anything else is bad input (exit 2), not a silent INFO."""
    if name.upper() not in LOG_LEVELS:
        raise InvalidArgumentError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {name!r}")
    return name.upper()


def watch(
    zookeeper: str | None = typer.Option(
        None, "--zookeeper", help="ZooKeeper connect string (chroot allowed)"
    ),
    ledgers_root: str | None = typer.Option(None, "--ledgers-root", help="BookKeeper's zkLedgersRootPath"),
    bootstrap: str | None = typer.Option(
        None, "--bootstrap-servers", "--bootstrap", help="Kafka bootstrap servers (kafka.bootstrap_servers)"
    ),
    topic: str | None = typer.Option(None, "--topic", help="change topic (default bkaudit.changes)"),
    partitions: int | None = typer.Option(
        None, "--partitions", min=1, help="partitions if the topic is created"
    ),
    heartbeat_interval: float | None = typer.Option(None, "--heartbeat-interval", help="seconds"),
    reconciliation_interval: float | None = typer.Option(
        None, "--reconciliation-interval", help="seconds between periodic reconciliation scans; 0 = off"
    ),
    snapshot_concurrency: int | None = typer.Option(
        None, "--snapshot-concurrency", min=1, help="ZooKeeper reads in flight during a snapshot"
    ),
    watch_mode: str | None = typer.Option(None, "--watch-mode", help="auto | persistent | fallback"),
    rack_map_znode: str | None = typer.Option(
        None, "--rack-map-znode", help="Pulsar's rack map znode (with --dev and no other source: /bookies)"
    ),
    rack_map_zookeeper: str | None = typer.Option(
        None, "--rack-map-zookeeper", help="ZooKeeper holding --rack-map-znode (default: --zookeeper)"
    ),
    rack_map_file: str | None = typer.Option(None, "--rack-map-file", help="rack map JSON file"),
    metrics_port: int | None = typer.Option(None, "--metrics-port", help="Prometheus port; 0 = off"),
    dev: DevOption = False,
    exit_after_snapshot: bool = typer.Option(
        False, "--exit-after-snapshot", help="publish the START snapshot, flush, exit"
    ),
    log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING, ERROR"),
    verbose: bool = typer.Option(
        False, "--verbose", help="show the logs of the Kafka and ZooKeeper clients here, not in the log file"
    ),
) -> None:
    """Watch BookKeeper's ZooKeeper and publish every change to Kafka (protobuf, keyed by entity)."""
    from core.logsetup import configure_command_logging, register_secrets

    configure_command_logging(
        "watch",
        load_settings().log_dir,
        level=_log_level(log_level),
        verbose=verbose,
        only_on_a_terminal=True,
    )
    logging.getLogger("kazoo.client").setLevel(logging.WARNING)
    use_dev_services(dev)  # --zookeeper and --bootstrap still win: they are applied on top below
    overrides = _overrides(
        zookeeper__connect=zookeeper,
        zookeeper__ledgers_root=ledgers_root,
        kafka__bootstrap_servers=bootstrap,
        kafka__changes_topic=topic,
        kafka__topic_partitions=partitions,
        watcher__heartbeat_interval_s=heartbeat_interval,
        watcher__reconciliation_interval_s=reconciliation_interval,
        watcher__snapshot_concurrency=snapshot_concurrency,
        watcher__watch_mode=watch_mode,
        watcher__rack_map_znode=rack_map_znode,
        watcher__rack_map_zookeeper=rack_map_zookeeper,
        watcher__rack_map_file=rack_map_file,
        watcher__metrics_port=metrics_port,
    )
    base = load_settings()
    # Merge field by field so that options override the environment/config file, not replace sections.
    merged = {
        section: {**getattr(base, section).model_dump(), **values} for section, values in overrides.items()
    }
    settings = load_settings(**merged) if merged else base
    if dev:
        settings = _with_dev_rack_map(settings)
    register_secrets(settings)  # before any client exists: none of its log records may carry them

    from connectors.zookeeper.watcher import ChangeWatcher

    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        logging.getLogger(__name__).info("signal %d: stopping (flushing Kafka)", signum)
        stop.set()

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = ChangeWatcher(settings).run(stop, exit_after_snapshot=exit_after_snapshot)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    raise typer.Exit(code)
