"""What the ledger lane's sink and its stages are configured with (:class:`SinkConfig`), built by
:mod:`streaming.job` from the settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from core.domain.rules.evaluate import PlacementPolicyConfig
from core.settings import KafkaSettings
from streaming.topics import TopicsConfig

if TYPE_CHECKING:
    from connectors.agent.client import AgentConfig
    from connectors.bookie.tls import BookieTlsConfig


@dataclass(frozen=True)
class SinkConfig:
    """Everything the sink needs; built by ``streaming.job`` from the settings.

    Example:
        >>> config = SinkConfig(lakehouse_root="/data/lakehouse", app_id="bkaudit", kafka=KafkaSettings())
        >>> config.index_append_interval_s, config.scrutiny_on_close
        (5.0, False)
    """

    lakehouse_root: str | Path
    app_id: str
    kafka: KafkaSettings
    cluster_default: str = "unknown"
    placement: PlacementPolicyConfig = field(default_factory=PlacementPolicyConfig)
    probe_timeout_s: float = 5.0
    probe_concurrency: int = 64
    entry_checks: str = "auto"  # auto, entry_lists or entry_reads (core.settings.StreamSettings)
    entry_checks_by_bookie: tuple[tuple[str, str], ...] = ()
    entry_read_sample_percent: float = 0.0
    entry_reads_per_s_per_bookie: float | None = None
    scrutiny_ledgers_per_s: float | None = 0.0  # 0 = no background walk; None: the pace of scrutiny_pass_s
    scrutiny_pass_s: float = 86_400.0  # a walk over every closed ledger within this long
    scrutiny_on_close: bool = False  # check a ledger when it closes
    scrutiny_max_per_batch: int = 1000
    scrutiny_state_dir: str | Path | None = None  # where the walk's position is kept (None: not kept)
    maintenance_every_batches: int = 0  # compact + vacuum every N batches; 0 = never
    changes_partitions: int = 1  # partitions of the changes topic (snapshot reconciliation per partition)
    ledger_fold_interval_s: float = 0.0  # fold ledger_changes into ledgers this often; 0 = only at close()
    ledger_table_buckets: int = 256  # partitions of ledgers (core.settings.StreamSettings)
    ledger_fold_ticks: int = 1  # folds per interval, each rewriting at most 1/this of the buckets
    ledger_vacuum_rounds: int = 0  # ledgers files vacuumed after this many watermark advances; 0 = never
    ledger_changes_retention_hours: float = 168.0  # folded ledger_changes rows kept this long (maintenance)
    maintenance_retention_hours: int = 168  # unused files deleted by maintenance once this old
    index_cleanup_bookies_per_batch: int = 1  # ledger_bookies partitions cleaned per cleanup interval
    index_cleanup_interval_s: float = 5.0  # at least this long between two index cleanups; 0 = every batch
    index_append_interval_s: float = 5.0  # at least this long between two index appends; 0 = every batch
    agents: AgentConfig | None = None  # bookie-side agents asked first (core.settings.AgentSettings)
    bookie_tls: BookieTlsConfig | None = None  # TLS to the bookies (core.settings.BookieSettings)
    topics: TopicsConfig = field(default_factory=TopicsConfig)  # Pulsar's managed ledgers (settings.pulsar)
    topics_state_dir: str | Path | None = None  # the topics stage's state files (None: kept in memory)
