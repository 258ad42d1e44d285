"""The sink's table upkeep after each batch, each on its own cadence: the index's append of new ledger
versions, the cleanup of old versions' index rows (which also compacts a fragmented partition), and the
periodic Delta maintenance (compaction of every table but ``ledgers``, which the folds rewrite; vacuum; the
history's retention). It runs in the sink's thread, between batch commits, so it never races the batch
writer; the folds and the membership lane are kept out by their locks."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from connectors.delta.ledger_log import LedgerLog
    from connectors.delta.tables import OpenTables
    from streaming.sink_config import SinkConfig

logger = logging.getLogger(__name__)

#: The index cleanup takes at most this share of the time since its last run (at least one partition).
INDEX_CLEANUP_SHARE = 0.2


class TableUpkeep:
    """Called once per finished batch (:meth:`after_batch`); does what is due.

    Example:
        >>> from core.settings import KafkaSettings
        >>> from streaming.sink_config import SinkConfig
        >>> config = SinkConfig(lakehouse_root="/tmp/lh", app_id="a", kafka=KafkaSettings())
        >>> import threading
        >>> upkeep = TableUpkeep(config, ledger_log=None, tables=None, membership_lock=threading.RLock())
        >>> upkeep.config.index_cleanup_interval_s
        5.0
    """

    def __init__(
        self,
        config: SinkConfig,
        ledger_log: LedgerLog,
        tables: OpenTables,
        membership_lock: AbstractContextManager[Any],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.ledger_log = ledger_log
        self.tables = tables
        self._membership_lock = membership_lock  # the loss owner's: its commits rewrite files too
        self._clock = clock  # seconds, for work done at most every so often rather than every batch
        self._index_cleaned_at = -math.inf
        self._index_appended_at = -math.inf

    def after_batch(self, batch_id: int) -> None:
        self._append_index()
        self._clean_index(batch_id)
        self._maintain(batch_id)

    def _append_index(self) -> None:
        """Append the index rows of the new ledger versions since the last append, at most every
        ``index_append_interval_s``: the append writes a file per bookie touched (~100), whatever the
        batches' size, and readers index the ledgers changed since by their current rows meanwhile. A
        failure fails the batch, as any write of it does (the fold waits for the index)."""
        now = self._clock()
        if now - self._index_appended_at < self.config.index_append_interval_s:
            return
        self.ledger_log.flush_index(self.tables)
        self._index_appended_at = now

    def _clean_index(self, batch_id: int) -> None:
        """Remove old versions' rows from a few ``ledger_bookies`` partitions (readers skip them anyway), at
        most every ``index_cleanup_interval_s``: one partition rewrite costs a small batch more than the
        batch's own work, and skipping it is safe (idempotent maintenance, nothing reads those rows).
        The pace is per second of wall time, not per batch (:func:`cleanup_pace`)."""
        now = self._clock()
        since = now - self._index_cleaned_at
        if since < self.config.index_cleanup_interval_s:
            return
        self._index_cleaned_at = now
        partitions, budget_s = cleanup_pace(
            since, self.config.index_cleanup_interval_s, self.config.index_cleanup_bookies_per_batch
        )
        try:
            self.ledger_log.clean_index(partitions, budget_s=budget_s)
            self.ledger_log.vacuum_index()  # once per fold round: the partitions' replaced files
        except Exception:  # an optimisation, like maintenance: never fail a batch for it
            logger.warning(
                "cleaning old index rows failed (batch %d); trying again later", batch_id, exc_info=True
            )

    def _maintain(self, batch_id: int) -> None:
        """Compact the small files streaming creates and vacuum old ones, every N batches."""
        every = self.config.maintenance_every_batches
        if every <= 0 or batch_id == 0 or batch_id % every:
            return
        from connectors.delta.tables import maintain

        started = time.monotonic()
        try:
            # Never beside a commit of the membership lane, nor beside a fold (both rewrite files).
            with self._membership_lock, self.ledger_log.fold_lock:
                self.ledger_log.expire_changes(self.config.ledger_changes_retention_hours)
                maintain(
                    self.config.lakehouse_root,
                    retention_hours=self.config.maintenance_retention_hours,
                    not_compacted=self.rewritten_elsewhere(),
                )
        except Exception:  # maintenance is an optimisation: never fail a batch for it
            logger.exception("Delta maintenance failed; the next run will try again")
        else:
            logger.info("Delta maintenance took %.1f s", time.monotonic() - started)

    def rewritten_elsewhere(self) -> list[str]:
        """The tables the job keeps compact without the maintenance: ``ledgers`` while it folds (each fold
        tick writes its buckets anew, and the job reads it by bucket, so a Z-order by ledger id buys
        nothing). Compacting and Z-ordering it again rewrote the whole table in the sink's thread.
        ``ledger_bookies`` is still compacted here: its cleanup visits a bookie's partition once per
        rotation (``bookies × index_cleanup_interval_s``), and between visits each index append adds a
        small file to every bookie it touches."""
        return ["ledgers"] if self.config.ledger_fold_interval_s > 0 else []


def cleanup_pace(since_s: float, interval_s: float, per_interval: int) -> tuple[int, float | None]:
    """How many index partitions a cleanup run may clean, ``since_s`` after the last run, and its time
    budget: ``per_interval`` for every ``interval_s`` elapsed, within a fifth of that time (no budget on
    the first run). Behind a backlog batches come every 30 s instead of 5 s; one partition per batch then
    let the index grow without bound.

    Example:
        >>> cleanup_pace(12.5, 5.0, 1), cleanup_pace(math.inf, 5.0, 2), cleanup_pace(0.5, 0.0, 1)
        ((2, 2.5), (2, None), (1, 0.1))
    """
    if not math.isfinite(since_s):
        return per_interval, None
    intervals = int(since_s // interval_s) if interval_s > 0 else 1
    return per_interval * max(1, intervals), INDEX_CLEANUP_SHARE * since_s
