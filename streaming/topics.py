"""The sink's topics stage: Pulsar's managed ledgers (from the change stream) against BookKeeper's ledgers.

Per batch, after the ledgers' decisions are applied (:mod:`streaming.sink_batch`) and before anything is
published, :meth:`TopicsStage.apply`

1. applies the batch's ``managed_ledger_changed`` / ``managed_ledger_deleted`` decisions to the managed
   ledgers' state (their ledgers with the offload state, their cursors' ledgers), newest ``mzxid`` wins; a
   znode that does not decode is a dead letter and a ``METADATA_CORRUPT`` of its topic (resolved when it
   decodes again or is deleted);
2. takes a managed ledger that a complete FULL snapshot of its partition did not report, and about which
   nothing happened since the snapshot's begin, for deleted (the ledgers' own rule);
3. once a complete FULL snapshot has been read on every partition (before that, BookKeeper's ledgers are
   not all known), runs :mod:`core.domain.rules.topics`: ``TOPIC_LEDGER_MISSING`` for a listed ledger absent
   for ``pulsar.missing_grace_s`` of event time, ``LEDGER_ORPHANED`` for a ledger its topic no longer lists
   (every ``ORPHAN_CHECK_EVERY_MS`` of event time, and when a managed ledger changed);
4. hands the changed managed ledgers' ``topics`` rows to the sink, which writes them with the batch.

State: one small JSON file per batch that changed it (:class:`~streaming.driver_batches.LaneStates` under
``<checkpoint>/sink/topics/``), written after the batch's tables; a replayed batch starts from the state of
the newest batch before it, and its event-time clock (the batch's newest decision) is the same, so it decides
the same alerts with the same ids.

Example:
    >>> import tempfile
    >>> stage = TopicsStage(TopicsConfig(), Path(tempfile.mkdtemp()), changes_partitions=1)
    >>> stage.state_before(0)["managed"]
    {}
"""

from __future__ import annotations

import base64
import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.kafka.publisher import partition_for_key
from core.domain.alerts import AlertKind
from core.domain.managed_ledger import TopicLedger
from core.domain.metadata import pulsar_topic_from_managed_ledger
from core.domain.rules.topics import (
    Listing,
    component_column,
    due,
    listed_table,
    missing_pairs,
    orphaned_ledgers,
)
from core.events import managed_ledger_key
from streaming.driver_batches import LaneStates

if TYPE_CHECKING:
    from connectors.delta.ledger_log import LedgerLog
    from streaming.sink_batch import SinkBatch

logger = logging.getLogger(__name__)

#: How often (event time) the orphan rule reads every ledger when no managed ledger changed (at most a
#: quarter of ``pulsar.orphan_grace_s``, at least a second).
ORPHAN_CHECK_EVERY_MS = 30_000
TOPIC_DECISIONS = frozenset({"managed_ledger_changed", "managed_ledger_deleted", "topics_clock"})


@dataclass(frozen=True)
class TopicsConfig:
    """The topics stage's settings (``core.settings.PulsarSettings``)."""

    enabled: bool = True
    managed_ledgers_path: str = "/managed-ledgers"
    missing_grace_s: float = 60.0
    orphan_grace_s: float = 86_400.0


def _empty_state() -> dict[str, Any]:
    return {
        "managed": {},
        "missing_since": {},
        "orphan_since": {},
        "full_partitions": [],
        "clock_ms": 0,
        "orphans_at_ms": None,
    }


def _pair_key(name: str, ledger_id: int) -> str:
    return f"{name}\x1f{ledger_id}"


class TopicsStage:
    """See the module docstring; one per sink."""

    def __init__(
        self, config: TopicsConfig, state_dir: str | Path | None, *, changes_partitions: int
    ) -> None:
        self.config = config
        self.partitions = changes_partitions
        self._store = LaneStates(state_dir) if state_dir is not None else None
        self._memory: dict[int, dict[str, Any]] = {}  # without a state directory (tests)
        self._pending: tuple[int, dict[str, Any]] | None = None
        # The state this process last committed (the newest before any later batch it runs: batches run in
        # order, and a failed one stops the job), so a batch does not read its file again.
        self._last: tuple[int, dict[str, Any]] | None = None

    # -- state ---------------------------------------------------------------------------------------------
    def state_before(self, batch_id: int) -> dict[str, Any]:
        """The state the newest batch before ``batch_id`` left (empty at first)."""
        if self._last is not None and self._last[0] < batch_id:
            return copy.deepcopy(self._last[1])
        if self._store is not None:
            found = self._store.before(batch_id)
        else:
            older = [b for b in self._memory if b < batch_id]
            found = copy.deepcopy(self._memory[max(older)]) if older else None
        return found if found is not None else _empty_state()

    def commit(self) -> None:
        """Save the state of the batch :meth:`apply` ran (after the batch's tables are written)."""
        if self._pending is None:
            return
        batch_id, state = self._pending
        self._pending = None
        self._last = (batch_id, copy.deepcopy(state))
        if self._store is not None:
            self._store.save(batch_id, state)
        else:
            self._memory[batch_id] = copy.deepcopy(state)

    # -- the batch -----------------------------------------------------------------------------------------
    def apply(self, batch: SinkBatch, rows: list[dict[str, Any]], log: LedgerLog) -> None:
        """Steps 1 to 4 of the module docstring for one batch (``rows``: its decisions, in event-time
        order, with ``at_ms`` and parsed payloads)."""
        mine = [r for r in rows if r["kind"] in TOPIC_DECISIONS]
        if not self.config.enabled or (not mine and not batch.snapshots_complete):
            return
        state = self.state_before(batch.batch_id)
        before = copy.deepcopy(state)
        changed: set[str] = set()
        for row in mine:
            state["clock_ms"] = max(state["clock_ms"], int(row["at_ms"]))
            if row["kind"] == "managed_ledger_changed":
                self._changed(batch, state, row, changed)
            elif row["kind"] == "managed_ledger_deleted":
                self._deleted(batch, state, row["payload"], int(row["at_ms"]), changed)
        self._reconcile(batch, state, changed)
        judging = set(range(self.partitions)) <= set(state["full_partitions"]) and state["clock_ms"]
        if judging:
            # The listings against the ledgers only when either side may have changed, or a grace runs.
            opened = not set(range(self.partitions)) <= set(before["full_partitions"])
            ledgers_gone = any(r.get("deleted") for r in batch.ledgers.values())
            if changed or opened or ledgers_gone or state["missing_since"]:
                self._missing(batch, state, _existing(batch, log, state))
            self._orphans(batch, state, log, force=bool(changed))
        batch.topic_rows.extend(_topic_row(batch.cluster, name, state) for name in sorted(changed))
        state.pop("gone", None)  # only this batch's rows need when a managed ledger was deleted
        if state != before:
            self._pending = (batch.batch_id, state)

    def _changed(
        self, batch: SinkBatch, state: dict[str, Any], row: dict[str, Any], changed: set[str]
    ) -> None:
        payload, at_ms = row["payload"], int(row["at_ms"])
        name, cursor = payload["name"], payload.get("cursor") or ""
        entry = state["managed"].setdefault(name, _new_entry())
        entry["seen_ms"] = max(entry.get("seen_ms", 0), at_ms)
        known = entry["cursor_mzxid"].get(cursor) if cursor else entry.get("mzxid")
        if known is not None and int(payload.get("mzxid") or 0) <= known:
            if cursor:
                entry["cursor_seen_ms"][cursor] = at_ms
            return  # the same version again (a snapshot, a duplicate) or an older one
        changed.add(name)
        if cursor:
            entry["cursor_mzxid"][cursor] = payload.get("mzxid")
            entry["cursor_seen_ms"][cursor] = at_ms
        else:
            entry["mzxid"], entry["version"] = payload.get("mzxid"), payload.get("version")
        entry["updated_ms"] = at_ms
        error = payload.get("error")
        if error:
            entry["errors"][cursor] = error
            path = f"{self.config.managed_ledgers_path}/{name}" + (f"/{cursor}" if cursor else "")
            data = payload.get("data_b64")
            batch.dead_letter(
                at_ms,
                source="managed_ledger",
                path=path,
                reason=error,
                value=base64.b64decode(data) if data else None,
            )
        else:
            entry["errors"].pop(cursor, None)
            if cursor:
                entry["cursors"][cursor] = payload.get("cursor_ledger")
            else:
                entry["ledgers"] = payload.get("ledgers") or []
        _corrupt_condition(batch, name, entry, at_ms)

    def _deleted(
        self, batch: SinkBatch, state: dict[str, Any], payload: dict[str, Any], at_ms: int, changed: set[str]
    ) -> None:
        name, cursor = payload["name"], payload.get("cursor") or ""
        entry = state["managed"].get(name)
        if entry is None:
            return
        changed.add(name)
        entry["updated_ms"] = at_ms
        if cursor:
            for part in ("cursors", "cursor_mzxid", "cursor_seen_ms", "errors"):
                entry[part].pop(cursor, None)
            _corrupt_condition(batch, name, entry, at_ms)
            return
        del state["managed"][name]
        state.setdefault("gone", {})[name] = at_ms
        batch.book.set_topic_condition(AlertKind.METADATA_CORRUPT, name, False, at_ms=at_ms)

    def _reconcile(self, batch: SinkBatch, state: dict[str, Any], changed: set[str]) -> None:
        """Step 2: managed ledgers (and cursors) a complete FULL snapshot of their partition did not show."""
        for done in batch.snapshots_complete:
            partition, begin_ms, at_ms = int(done["partition"]), done.get("begin_ms"), int(done["at_ms"])
            state["clock_ms"] = max(state["clock_ms"], at_ms)
            if begin_ms is None:
                continue  # its begin was not read by this job: the next complete snapshot does it
            partitions = int(done.get("partition_count") or self.partitions)
            for name in sorted(state["managed"]):
                if partition_for_key(managed_ledger_key(name).encode(), partitions) != partition:
                    continue
                entry = state["managed"][name]
                if entry.get("seen_ms", 0) < begin_ms:
                    self._deleted(batch, state, {"name": name}, at_ms, changed)
                    continue
                for cursor in [c for c, seen in entry["cursor_seen_ms"].items() if seen < begin_ms]:
                    self._deleted(batch, state, {"name": name, "cursor": cursor}, at_ms, changed)
            state["full_partitions"] = sorted({*state["full_partitions"], partition})

    def _missing(self, batch: SinkBatch, state: dict[str, Any], existing: np.ndarray) -> None:
        """Step 3: ``TOPIC_LEDGER_MISSING`` after its grace, resolved as soon as the ledger is not missing."""
        now_ms, grace_ms = state["clock_ms"], int(self.config.missing_grace_s * 1000)
        missing = missing_pairs(listed_table(_listings(state)), existing)
        names, ids = missing.column("managed_ledger").to_pylist(), missing.column("ledger_id").to_pylist()
        keys = [_pair_key(n, i) for n, i in zip(names, ids, strict=True)]
        since = state["missing_since"] = {k: state["missing_since"].get(k, now_ms) for k in keys}
        ready = due(np.array([since[k] for k in keys], np.int64), now_ms, grace_ms).tolist()
        book = batch.book
        for name, ledger_id, key, is_due in zip(names, ids, keys, ready, strict=True):
            if is_due:
                book.set_topic_condition(
                    AlertKind.TOPIC_LEDGER_MISSING,
                    name,
                    True,
                    at_ms=now_ms,
                    ledger_id=ledger_id,
                    pulsar_topic=pulsar_topic_from_managed_ledger(name),
                    detail={
                        "managed_ledger": name,
                        "missing_since_ms": since[key],
                        "grace_s": self.config.missing_grace_s,
                    },
                )
        still = set(keys)
        for entity, kind in list(book.open):
            if kind is AlertKind.TOPIC_LEDGER_MISSING:
                name, _, ledger = entity.removeprefix("topic/").rpartition("/ledger/")
                if _pair_key(name, int(ledger)) not in still:
                    book.set_topic_condition(kind, name, False, at_ms=now_ms, ledger_id=int(ledger))

    def _orphans(self, batch: SinkBatch, state: dict[str, Any], log: LedgerLog, *, force: bool) -> None:
        """Step 3: ``LEDGER_ORPHANED`` (only while at least one managed ledger is known: a cluster whose
        Pulsar metadata the watcher does not see would have every ledger orphaned)."""
        now_ms, last = state["clock_ms"], state.get("orphans_at_ms")
        every_ms = min(ORPHAN_CHECK_EVERY_MS, max(1_000, int(self.config.orphan_grace_s * 250)))
        if not force and last is not None and now_ms - last < every_ms:
            return
        state["orphans_at_ms"] = now_ms
        book = batch.book
        orphans: dict[int, dict[str, Any]] = {}
        if state["managed"]:
            listed, grace_ms = listed_table(_listings(state)), int(self.config.orphan_grace_s * 1000)
            for ledgers in _live_ledgers(batch, log):  # the rule judges each ledger on its own
                found = orphaned_ledgers(ledgers, listed, now_ms, grace_ms)
                orphans.update((row["ledger_id"], row) for row in found.to_pylist())
        # Orphaned for the missing grace too: Pulsar unlists a ledger before it deletes it.
        since = state["orphan_since"] = {
            str(i): state.get("orphan_since", {}).get(str(i), now_ms) for i in orphans
        }
        grace_ms = int(self.config.missing_grace_s * 1000)
        known = {pulsar_topic_from_managed_ledger(name) for name in state["managed"]}
        for ledger_id, row in sorted(orphans.items()):
            if not due(np.array([since[str(ledger_id)]]), now_ms, grace_ms)[0]:
                continue
            book.set_ledger_condition(
                AlertKind.LEDGER_ORPHANED,
                ledger_id,
                True,
                at_ms=now_ms,
                pulsar_topic=row["pulsar_topic"],
                detail={
                    "size": row["length"],
                    "ctime_ms": row["ctime_ms"],
                    "managed_ledger_exists": row["pulsar_topic"] in known,
                },
            )
        for entity, kind in list(book.open):
            if kind is AlertKind.LEDGER_ORPHANED and int(entity.removeprefix("ledger/")) not in orphans:
                book.set_ledger_condition(kind, int(entity.removeprefix("ledger/")), False, at_ms=now_ms)


def _new_entry() -> dict[str, Any]:
    return {
        "mzxid": None,
        "version": None,
        "ledgers": [],
        "cursors": {},
        "cursor_mzxid": {},
        "cursor_seen_ms": {},
        "errors": {},
        "seen_ms": 0,
        "updated_ms": 0,
    }


def _corrupt_condition(batch: SinkBatch, name: str, entry: dict[str, Any], at_ms: int) -> None:
    errors = entry["errors"]
    detail = {"reasons": {c or "(managed ledger)": r for c, r in sorted(errors.items())}} if errors else None
    batch.book.set_topic_condition(
        AlertKind.METADATA_CORRUPT,
        name,
        bool(errors),
        at_ms=at_ms,
        pulsar_topic=pulsar_topic_from_managed_ledger(name),
        detail=detail,
    )


def _listings(state: dict[str, Any]) -> dict[str, Listing]:
    return {
        name: Listing(
            tuple(TopicLedger(i, e, s, None, bool(o), bool(d)) for i, e, s, o, d in entry["ledgers"]),
            dict(entry["cursors"]),
        )
        for name, entry in state["managed"].items()
    }


def _existing(batch: SinkBatch, log: LedgerLog, state: dict[str, Any]) -> np.ndarray:
    """The live ledgers among those the managed ledgers list, with this batch's changes."""
    ids = np.unique(
        np.asarray(
            [t[0] for e in state["managed"].values() for t in e["ledgers"]]
            + [c for e in state["managed"].values() for c in e["cursors"].values() if c is not None],
            dtype=np.int64,
        )
    )
    mzxid, gone = log.versions(ids)
    live = set(ids[(mzxid >= 0) & ~gone].tolist())
    if batch.versions is not None and batch.versions.num_rows:
        live.update(batch.versions.column("ledger_id").to_pylist())
    for ledger_id, row in batch.ledgers.items():
        if row.get("deleted"):
            live.discard(ledger_id)
        elif row.get("mzxid") is not None:
            live.add(ledger_id)
    return np.fromiter(live, np.int64, len(live))


def _live_ledgers(batch: SinkBatch, log: LedgerLog) -> Iterator[pa.Table]:
    """Every live ledger with a Pulsar topic, with the orphan rule's columns (as of this batch), a few
    buckets of the ledger state at a time (each ledger in one chunk)."""
    columns = ["ledger_id", "deleted", "pulsar_topic", "ctime_ms", "length", "custom_metadata"]
    gone = pa.array([i for i, r in batch.ledgers.items() if r.get("deleted")], pa.int64())
    for rows in log.current_chunks(columns):
        live = pc.and_(
            pc.invert(pc.fill_null(rows.column("deleted"), False)), pc.is_valid(rows.column("pulsar_topic"))
        )
        rows = rows.filter(live)
        if len(gone):
            rows = rows.filter(pc.invert(pc.is_in(rows.column("ledger_id"), gone)))
        yield rows.append_column("component", component_column(rows.column("custom_metadata")))


def _topic_row(cluster: str, name: str, state: dict[str, Any]) -> dict[str, Any]:
    """The ``topics`` row of one managed ledger as the state now holds it (deleted: a tombstone row)."""
    entry = state["managed"].get(name)
    if entry is None:
        at_ms = (state.get("gone") or {}).get(name, state["clock_ms"])
        return {
            "managed_ledger": name,
            "topic": pulsar_topic_from_managed_ledger(name),
            "cluster": cluster,
            "deleted": True,
            "updated_at": datetime.fromtimestamp(at_ms / 1000, tz=UTC),
        }
    ledgers = entry["ledgers"]
    return {
        "managed_ledger": name,
        "topic": pulsar_topic_from_managed_ledger(name),
        "cluster": cluster,
        "ledger_ids": [t[0] for t in ledgers],
        "offloaded_ids": [t[0] for t in ledgers if t[3]],
        "bookkeeper_deleted_ids": [t[0] for t in ledgers if t[3] and t[4]],
        "cursors": [{"name": c, "ledger_id": i} for c, i in sorted(entry["cursors"].items())],
        "mzxid": entry["mzxid"],
        "version": entry["version"],
        "undecodable_reason": "; ".join(
            f"{c or 'managed ledger'}: {r}" for c, r in sorted(entry["errors"].items())
        )
        or None,
        "deleted": False,
        "updated_at": datetime.fromtimestamp(entry["updated_ms"] / 1000, tz=UTC),
    }
