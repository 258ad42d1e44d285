"""Stage 3 of the job: the ``foreachBatch`` sink — tables, fan-out, probes, alerts, feedback.

For one micro-batch of decisions (:data:`streaming.schemas.DECISION_SCHEMA`) the sink

1. reads what it needs *as of before the batch* (bookies, open alerts, the touched ledgers, and the
   bookie → ledger index for bookies that were lost, returned or moved racks) — so a replay decides alike;
2. applies the decisions in event-time order, then evaluates exactly the affected ledgers with the pure
   rules (:mod:`bkaudit.domain.rules`): lost-bookie (through the index, never a scan of all ledgers, and
   vectorised over all affected ledgers at once), placement, corrupt metadata, stuck repairs, confirmed
   replicas failures;
3. runs the re-probes the processor asked for and the throttled scrutiny pass, and turns their outcomes into
   feedback events (round results) and ``BOOKIE_UNRESPONSIVE`` for registered bookies that never answer;
4. publishes alert transitions and feedback to Kafka, then
5. writes every table with the batch's app transaction (see :mod:`connectors.delta.tables`).

Status: first version (streaming auditor issue).
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from bkaudit.domain.alert_book import AlertBook
from bkaudit.domain.alerts import RACK_MAP_ENTITY, AlertKind, AlertState
from bkaudit.domain.rules.evaluate import (
    PlacementPolicyConfig,
    ledger_bookies,
    placement_column,
    placement_condition,
)
from bkaudit.settings import KafkaSettings
from connectors.delta.scan import scan
from connectors.delta.tables import (
    APP_METADATA_KEY,
    BOOKIES,
    DEAD_LETTERS,
    LEDGER_BOOKIES,
    LEDGER_BUCKETS,
    LEDGERS,
    SNAPSHOT_SEEN,
    BatchWriter,
    ensure_tables,
    latest_version,
    ledger_index_rows,
    table_before_batch,
)
from streaming.decode import ARROW_CHANGE_SCHEMA
from streaming.loss import (
    LOSS_ALERT_KINDS,
    MEMBERSHIP_DECISIONS,
    LossAuditor,
    loss_app,
    membership_app,
    record_transitions,
    utc_from_ms,
)
from streaming.processor import DECISION_COLUMNS
from streaming.publish import publish
from streaming.reports import REPORTS_KEPT, BatchReport, keep_recent

if TYPE_CHECKING:
    from streaming.metrics import StreamMetrics

logger = logging.getLogger(__name__)

_REPLICAS_KINDS = {
    "NO_REPLICA": AlertKind.REPLICAS_NO_REPLICA,
    "LESS_THAN_AQ": AlertKind.REPLICAS_LESS_THAN_AQ,
    "LESS_THAN_WQ": AlertKind.REPLICAS_LESS_THAN_WQ,
}
_PLACEMENT_KINDS = (AlertKind.PLACEMENT_NOT_ADHERING, AlertKind.PLACEMENT_SOFT)


@dataclass(frozen=True)
class SinkConfig:
    """Everything the sink needs; built by ``streaming.job`` from the settings."""

    lakehouse_root: Path
    app_id: str
    kafka: KafkaSettings
    cluster_default: str = "unknown"
    placement: PlacementPolicyConfig = field(default_factory=PlacementPolicyConfig)
    probe_timeout_s: float = 5.0
    probe_concurrency: int = 64
    scrutiny_ledgers_per_s: float = 0.0  # 0 = no background replicas check
    scrutiny_max_per_batch: int = 1000
    maintenance_every_batches: int = 0  # compact + vacuum every N batches; 0 = never
    changes_partitions: int = 1  # partitions of the changes topic (snapshot reconciliation per partition)


#: What the sink receives per batch (:data:`streaming.schemas.DECISION_SCHEMA` as Arrow): the processor's
#: decision columns, typed as the decoder types them; tests and benchmarks build decision tables with it.
ARROW_DECISION_SCHEMA = pa.schema(
    [pa.field(name, ARROW_CHANGE_SCHEMA.field(name).type) for name in DECISION_COLUMNS]
)


def kafka_partition(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key`` (Java client's murmur2, librdkafka's).

    Example:
        >>> kafka_partition("ledger/1", 1)
        0
    """
    from connectors.kafka.publisher import partition_for_key

    return partition_for_key(key.encode("utf-8"), partitions)  # the watcher's own rule: one implementation


def _b64_bytes(text: str | None) -> bytes | None:
    """A dead letter's key or value bytes as the decoder kept them (absent when withheld)."""
    return None if text is None else base64.b64decode(text)


def _read_filtered(
    table: Any,
    column: str,
    values: Iterable[Any],
    columns: Sequence[str] | None = None,
    *,
    partition_column: bool = False,
) -> list[dict[str, Any]]:
    """Rows whose ``column`` is in ``values`` (``columns`` of them, or all). For the table's partition column,
    files of other partitions are never opened."""
    wanted = sorted(set(values))
    if not wanted:
        return []
    return scan(table, [(column, "in", wanted)], columns, prune_partitions=partition_column).to_pylist()


def _read_unknown_placement(ledgers_table: Any) -> list[dict[str, Any]]:
    """Live closed ledgers whose ``placement`` is null: not evaluated while the rack map was invalid."""
    rows = scan(ledgers_table, [("placement", "is null", None), ("state", "=", "CLOSED")]).to_pylist()
    return [row for row in rows if not row.get("deleted")]


#: The ``bookies`` columns the ledger lane writes: the rack map's (membership is :mod:`streaming.loss`'s).
RACK_COLUMNS = ("bookie_id", "cluster", "rack", "updated_at")


def _only_loss_owner_committed(table: Any, since_version: int, app_id: str) -> bool:
    """Whether every commit of ``table`` after ``since_version`` is the loss owner's (its kinds are left out
    of the ledger lane's cached open alerts, which therefore still hold)."""
    newer = table.version() - since_version
    if newer <= 0:
        return newer == 0
    owners = {loss_app(app_id), membership_app(app_id)}
    history = table.history(newer)
    return len(history) == newer and all(c.get(APP_METADATA_KEY) in owners for c in history)


def _compact_json(message: Mapping[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def _ledger_row(ledger_id: int, payload: Mapping[str, Any], cluster: str, at_ms: int) -> dict[str, Any]:
    return {
        "ledger_id": ledger_id,
        "ledger_bucket": ledger_id % LEDGER_BUCKETS,
        "cluster": cluster,
        "state": payload["state"],
        "format_version": payload.get("format_version"),
        "ensemble_size": payload["ensemble_size"],
        "write_quorum": payload["write_quorum"],
        "ack_quorum": payload["ack_quorum"],
        "last_entry_id": payload["last_entry_id"],
        "length": payload.get("length"),
        "digest_type": payload.get("digest_type"),
        "segments": [{"first_entry_id": first, "ensemble": list(ens)} for first, ens in payload["segments"]],
        "bookies": sorted(ledger_bookies(payload)),
        "ctime_ms": payload.get("ctime_ms"),
        "pulsar_topic": payload.get("pulsar_topic"),
        "custom_metadata": [
            {"key": key, "value": base64.b64decode(value)}
            for key, value in payload.get("custom_metadata") or []
        ],
        "has_password": payload.get("has_password"),
        "znode_version": payload.get("version"),
        "mzxid": payload.get("mzxid"),
        "znode_ctime_ms": payload.get("znode_ctime_ms"),
        "znode_mtime_ms": payload.get("znode_mtime_ms"),
        "undecodable_reason": None,
        "deleted": False,
        "updated_at": utc_from_ms(at_ms),
    }


def _is_stale(row: Mapping[str, Any] | None, mzxid: int | None) -> bool:
    """Whether a ledger event of version ``mzxid`` is not newer than the ledger's row (znode versions only
    grow; a deleted row keeps the delete's version).

    Example:
        >>> _is_stale({"mzxid": 7}, 7), _is_stale({"mzxid": 7}, 8), _is_stale(None, 1)
        (True, False, False)
    """
    if row is None or mzxid is None or row.get("mzxid") is None:
        return False
    return bool(mzxid <= row["mzxid"])


def _is_stale_corrupt(row: Mapping[str, Any] | None, mzxid: int | None) -> bool:
    """Whether an undecodable read of version ``mzxid`` adds nothing to the ledger's row: the row is that
    version (or a newer one) already undecodable, or a strictly newer version. The same version read as
    undecodable after it decoded is applied (a decoder that now rejects it is the newer verdict).

    Example:
        >>> corrupt = {"mzxid": 7, "undecodable_reason": "bad"}
        >>> _is_stale_corrupt(corrupt, 7), _is_stale_corrupt({"mzxid": 7}, 7)
        (True, False)
        >>> _is_stale_corrupt({"mzxid": 7}, 6), _is_stale_corrupt(None, 6)
        (True, False)
    """
    if row is None or mzxid is None or row.get("mzxid") is None:
        return False
    if row.get("undecodable_reason") is not None:
        return _is_stale(row, mzxid)
    return bool(mzxid < row["mzxid"])


def _ms(value: datetime | None, *, default: int) -> int:
    """Milliseconds since the epoch of a table timestamp (``default`` when null)."""
    return default if value is None else int(value.timestamp() * 1000)


def _as_payload(row: Mapping[str, Any]) -> dict[str, Any]:
    """A ``ledgers`` row back into the evaluation shape."""
    return {
        "state": row.get("state"),
        "ensemble_size": row.get("ensemble_size"),
        "write_quorum": row.get("write_quorum"),
        "ack_quorum": row.get("ack_quorum"),
        "last_entry_id": row.get("last_entry_id"),
        "length": row.get("length"),
        "format_version": row.get("format_version"),
        "segments": [[s["first_entry_id"], list(s["ensemble"])] for s in row.get("segments") or []],
        "pulsar_topic": row.get("pulsar_topic"),
    }


class SinkStopping(RuntimeError):
    """Raised for a batch that arrives after a graceful stop began (Spark replays it on restart)."""


class AuditSink:
    """The ``foreachBatch`` function (``sink(batch_df, batch_id)``); keeps its Kafka and bookie clients."""

    def __init__(self, config: SinkConfig, metrics: StreamMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics
        # Held while a batch runs; a graceful stop takes it so the query is never interrupted mid-call.
        self.busy = threading.Lock()
        self.stopping = threading.Event()
        self._producer: Any = None
        self._probe_client: Any = None
        self._scrutiny_cursor = -1
        self._scrutiny_last_ms: int | None = None
        self.reports: list[BatchReport] = []
        # The open alerts after the last batch, with the open_alerts table version they match: the next batch
        # reuses them when the table is still at that version instead of re-reading every open alert (a lost
        # bookie leaves thousands open, and every later batch would pay for them).
        self._open_alerts_cache: tuple[int, dict[Any, Any]] | None = None
        ensure_tables(config.lakehouse_root)
        # The loss alerts' one owner, shared with the membership lane (one producer for both lanes).
        self.loss = LossAuditor(config.lakehouse_root, config.kafka, self._kafka)

    # -- clients ------------------------------------------------------------------------------------------
    def _kafka(self) -> Any:
        if self._producer is None:
            from confluent_kafka import Producer

            from connectors.kafka.client_config import producer_config

            self._producer = Producer(producer_config(self.config.kafka))
        return self._producer

    def _prober(self) -> Any:
        if self._probe_client is None:
            from connectors.bookie.client import BlockingBookieClient

            self._probe_client = BlockingBookieClient(timeout=self.config.probe_timeout_s)
        return self._probe_client

    def start_producer(self) -> None:
        """Open the alert producer now (it connects in the background), not at the first burst."""
        self._kafka()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.config.kafka.producer_delivery_timeout_ms / 1000)
            self._producer = None
        if self._probe_client is not None:
            self._probe_client.close()
            self._probe_client = None

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        if self.stopping.is_set():
            # Fail the batch (it is replayed after a restart); returning would mark it done unprocessed.
            raise SinkStopping(f"batch {batch_id} arrived while the job is stopping; it will be replayed")
        with self.busy:
            self.process(batch_df.toArrow(), batch_id)

    # -- the batch -----------------------------------------------------------------------------------------
    def process(self, decisions: pa.Table, batch_id: int) -> BatchReport:
        started = time.monotonic()
        report = BatchReport(batch_id, decisions=decisions.num_rows)
        rows = decisions.to_pylist()
        for row in rows:
            row["payload"] = json.loads(row["payload"]) if row.get("payload") else {}
            when = row["event_time"]
            row["at_ms"] = int(when.timestamp() * 1000) if isinstance(when, datetime) else int(when or 0)
        rows.sort(key=lambda r: r["at_ms"])
        cluster = next((r["cluster"] for r in rows if r.get("cluster")), None) or self.config.cluster_default
        root, app = self.config.lakehouse_root, self.config.app_id

        # 1. state as of before this batch ------------------------------------------------------------------
        bookie_rows = {
            r["bookie_id"]: r
            for r in table_before_batch(root, "bookies", app, batch_id).to_pyarrow_table().to_pylist()
        }
        open_table = table_before_batch(root, "open_alerts", app, batch_id)
        cached, self._open_alerts_cache = self._open_alerts_cache, None  # valid again only if all goes well
        if cached is not None and _only_loss_owner_committed(open_table, cached[0], app):
            book = AlertBook(cluster, open=dict(cached[1]))
        else:
            # The loss kinds are streaming.loss's: this lane neither fires nor resolves them.
            open_rows = open_table.to_pyarrow_table().to_pylist()
            book = AlertBook.from_rows(
                cluster, (r for r in open_rows if AlertKind(r["kind"]) not in LOSS_ALERT_KINDS)
            )
        ledgers_table = table_before_batch(root, "ledgers", app, batch_id)
        index_table = table_before_batch(root, "ledger_bookies", app, batch_id)

        # 2a. apply decisions in event-time order ----------------------------------------------------------
        ledger_ids = {r["ledger_id"] for r in rows if r.get("ledger_id") is not None}
        ledgers: dict[int, dict[str, Any]] = {
            r["ledger_id"]: r for r in _read_filtered(ledgers_table, "ledger_id", ledger_ids)
        }
        changed_ledgers: set[int] = set()
        trigger_ms: dict[int, int] = {}
        index_replace: dict[int, list[str]] = {}
        bookies_changed: set[str] = set()
        membership: list[dict[str, Any]] = []  # handed to the loss owner after this batch's index write
        moved: dict[str, int] = {}
        racks = {b: r.get("rack") for b, r in bookie_rows.items()}
        # Placement is unknown while the current rack map is invalid (the open alert is that state).
        rack_map_invalid = book.is_open(RACK_MAP_ENTITY, AlertKind.RACK_MAP_INVALID)
        rack_map_recovered_ms: int | None = None
        dead_letters: list[dict[str, Any]] = []
        snapshot_seen: list[dict[str, Any]] = []
        snapshots_complete: list[dict[str, Any]] = []
        probe_requests: list[dict[str, Any]] = []
        feedback: list[dict[str, Any]] = []

        def touch(ledger_id: int, at_ms: int) -> None:
            changed_ledgers.add(ledger_id)
            trigger_ms[ledger_id] = max(trigger_ms.get(ledger_id, at_ms), at_ms)

        # Ledger id -> event time of the latest event in this batch showing the znode exists (applied or not):
        # a complete snapshot that began at or before it cannot have seen the ledger vanish.
        exists_at_ms: dict[int, int] = {}

        def seen(ledger_id: int, snapshot_id: str | None, at_ms: int) -> None:
            exists_at_ms[ledger_id] = max(exists_at_ms.get(ledger_id, at_ms), at_ms)
            if snapshot_id:
                key = f"ledger/{ledger_id}"
                snapshot_seen.append(
                    {
                        "snapshot_id": snapshot_id,
                        "kafka_partition": kafka_partition(key, self.config.changes_partitions),
                        "ledger_id": ledger_id,
                    }
                )

        for row in rows:
            kind, payload, at_ms = row["kind"], row["payload"], row["at_ms"]
            ledger_id, bookie_id = row.get("ledger_id"), row.get("bookie_id")
            if kind == "ledger_state":
                if _is_stale(ledgers.get(ledger_id), payload.get("mzxid")):
                    # A duplicate or an older version (the processor tracks only suspect ledgers): a
                    # snapshot still learns the ledger exists.
                    if not (ledgers.get(ledger_id) or {}).get("deleted"):
                        seen(ledger_id, payload.get("snapshot_id"), at_ms)
                    continue
                ledgers[ledger_id] = _ledger_row(ledger_id, payload, cluster, at_ms)
                index_replace[ledger_id] = sorted(ledger_bookies(payload))
                touch(ledger_id, at_ms)
                seen(ledger_id, payload.get("snapshot_id"), at_ms)
                book.set_ledger_condition(AlertKind.METADATA_CORRUPT, ledger_id, False, at_ms=at_ms)
            elif kind == "ledger_seen":
                if not (ledgers.get(ledger_id) or {}).get("deleted"):
                    seen(ledger_id, payload.get("snapshot_id"), at_ms)
            elif kind == "ledger_deleted":
                existing = ledgers.get(ledger_id) or {
                    "ledger_id": ledger_id,
                    "ledger_bucket": ledger_id % LEDGER_BUCKETS,
                }
                if existing.get("deleted"):
                    continue  # a duplicate delete
                ledgers[ledger_id] = {
                    **existing,
                    "deleted": True,
                    "cluster": cluster,
                    "updated_at": utc_from_ms(at_ms),
                }
                index_replace[ledger_id] = []
                touch(ledger_id, at_ms)
            elif kind == "ledger_corrupt":
                existing = ledgers.get(ledger_id) or {
                    "ledger_id": ledger_id,
                    "ledger_bucket": ledger_id % LEDGER_BUCKETS,
                }
                if _is_stale_corrupt(existing, payload.get("mzxid")):
                    # The same corrupt version again (a snapshot re-reading it, a replay): the znode exists
                    # and still does not decode, so its METADATA_CORRUPT stays open.
                    if not existing.get("deleted"):
                        seen(ledger_id, payload.get("snapshot_id"), at_ms)
                    continue
                ledgers[ledger_id] = {
                    **existing,
                    "cluster": cluster,
                    "state": None,
                    "segments": [],
                    "bookies": [],
                    "undecodable_reason": payload.get("reason"),
                    "placement": None,  # nothing about an undecodable ledger can be evaluated
                    "mzxid": payload.get("mzxid"),
                    "znode_version": payload.get("version"),
                    "deleted": False,
                    "updated_at": utc_from_ms(at_ms),
                }
                index_replace[ledger_id] = []
                touch(ledger_id, at_ms)
                seen(ledger_id, payload.get("snapshot_id"), at_ms)
                book.set_ledger_condition(
                    AlertKind.METADATA_CORRUPT,
                    ledger_id,
                    True,
                    at_ms=at_ms,
                    detail={"reason": payload.get("reason"), "path": payload.get("path")},
                )
                dead_letters.append(
                    {
                        "source": "znode",
                        "ledger_id": ledger_id,
                        "path": payload.get("path"),
                        "reason": payload.get("reason"),
                        "received_at": utc_from_ms(at_ms),
                        "received_date": utc_from_ms(at_ms).date(),  # type: ignore[union-attr]
                        "batch_id": batch_id,
                    }
                )
            elif kind == "under_replication":
                existing = ledgers.get(ledger_id) or {
                    "ledger_id": ledger_id,
                    "ledger_bucket": ledger_id % LEDGER_BUCKETS,
                    "cluster": cluster,
                }
                marked = payload.get("state") == "SET"
                ledgers[ledger_id] = {
                    **existing,
                    "under_replication_marked": marked,
                    "under_replication_replicas": payload.get("replicas") if marked else [],
                    "under_replication_ctime_ms": payload.get("mark_ctime_ms") if marked else None,
                    "updated_at": utc_from_ms(at_ms),
                }
                changed_ledgers.add(ledger_id)
                if not marked:
                    book.set_ledger_condition(
                        AlertKind.UNDER_REPLICATION_STUCK, ledger_id, False, at_ms=at_ms
                    )
            elif kind == "under_replication_stuck":
                row_now = ledgers.get(ledger_id) or {}
                book.set_ledger_condition(
                    AlertKind.UNDER_REPLICATION_STUCK,
                    ledger_id,
                    True,
                    at_ms=at_ms,
                    bookies=payload.get("replicas") or [],
                    pulsar_topic=row_now.get("pulsar_topic"),
                    detail=payload,
                )
            elif kind in MEMBERSHIP_DECISIONS:
                membership.append(row)
                if kind == "bookie_state":  # this batch's probes see the registration
                    existing = bookie_rows.get(bookie_id, {"bookie_id": bookie_id})
                    bookie_rows[bookie_id] = {
                        **existing,
                        **{k: payload.get(k) for k in ("status", "host", "port", "rpc_address")},
                    }
            elif kind == "rack_map" and payload.get("error"):
                detail = {"reason": payload["error"]}
                book.set_cluster_condition(AlertKind.RACK_MAP_INVALID, True, at_ms=at_ms, detail=detail)
                rack_map_invalid, rack_map_recovered_ms = True, None
            elif kind == "rack_map":
                if rack_map_invalid:
                    book.set_cluster_condition(AlertKind.RACK_MAP_INVALID, False, at_ms=at_ms)
                    rack_map_invalid, rack_map_recovered_ms = False, at_ms
                new_racks = payload.get("racks") or {}
                for bookie in payload.get("moved") or []:
                    moved[bookie] = at_ms
                racks = {**{b: None for b in racks}, **new_racks}
                for bookie, rack in racks.items():
                    existing = bookie_rows.get(bookie, {"bookie_id": bookie, "cluster": cluster})
                    if existing.get("rack") != rack or bookie not in bookie_rows:
                        bookie_rows[bookie] = {**existing, "rack": rack, "updated_at": utc_from_ms(at_ms)}
                        bookies_changed.add(bookie)
            elif kind == "snapshot_complete":
                snapshots_complete.append({**payload, "at_ms": at_ms})
            elif kind == "probe_request":
                probe_requests.append({"ledger_id": ledger_id, "at_ms": at_ms, **payload})
            elif kind == "replicas_confirmed":
                outcome = payload.get("outcome") or {}
                result = (outcome.get("outcome") or {}).get("result")
                desired = _REPLICAS_KINDS.get(str(result))
                row_now = ledgers.get(ledger_id) or {}
                for replicas_kind in _REPLICAS_KINDS.values():
                    book.set_ledger_condition(
                        replicas_kind,
                        ledger_id,
                        replicas_kind is desired,
                        at_ms=at_ms,
                        bookies=row_now.get("bookies") or [],
                        pulsar_topic=row_now.get("pulsar_topic"),
                        detail={"round": payload.get("round"), **(outcome.get("outcome") or {})},
                    )
                for silent in (outcome.get("outcome") or {}).get("unresponsive") or []:
                    if (bookie_rows.get(silent) or {}).get("status") in ("WRITABLE", "READ_ONLY"):
                        book.set_bookie_condition(
                            AlertKind.BOOKIE_UNRESPONSIVE,
                            silent,
                            True,
                            at_ms=at_ms,
                            detail={"ledger_id": ledger_id, "rounds": payload.get("round")},
                        )
            elif kind == "replicas_cleared":
                for replicas_kind in _REPLICAS_KINDS.values():
                    book.set_ledger_condition(replicas_kind, ledger_id, False, at_ms=at_ms)
            elif kind == "dead_letter":
                dead_letters.append(
                    {
                        "source": payload.get("source") or "kafka",
                        "topic": row.get("topic"),
                        "partition": row.get("partition"),
                        "offset": row.get("offset"),
                        "key": _b64_bytes(payload.get("key_b64")),
                        "value": _b64_bytes(payload.get("value_b64")),
                        "reason": payload.get("reason"),
                        "received_at": utc_from_ms(at_ms),
                        "received_date": utc_from_ms(at_ms).date(),  # type: ignore[union-attr]
                        "batch_id": batch_id,
                    }
                )

        # 2b. the ledgers on bookies whose rack moved: placement re-checked (losses are streaming.loss's) ----
        if moved:
            indexed = scan(
                index_table, [("bookie", "in", sorted(moved))], ["bookie", "ledger_id"], prune_partitions=True
            ).to_pylist()
            affected: dict[int, int] = {}
            for entry in indexed:
                if entry["ledger_id"] not in index_replace:  # replaced in this batch: its new bookies below
                    when = moved[entry["bookie"]]
                    affected[entry["ledger_id"]] = max(affected.get(entry["ledger_id"], when), when)
            for ledger_id, bookies_now in index_replace.items():
                hits = [moved[b] for b in bookies_now if b in moved]
                if hits:
                    affected[ledger_id] = max(affected.get(ledger_id, 0), *hits)
            missing_rows = [i for i in affected if i not in ledgers]
            for found in _read_filtered(ledgers_table, "ledger_id", missing_rows):
                ledgers[found["ledger_id"]] = found
            for ledger_id, when in affected.items():
                trigger_ms[ledger_id] = max(trigger_ms.get(ledger_id, when), when)

        # A valid rack map again: besides the ledgers on moved bookies (above), re-check the closed ledgers
        # whose placement became unknown while the map was invalid.
        if rack_map_recovered_ms is not None:
            for found in _read_unknown_placement(ledgers_table):
                ledgers.setdefault(found["ledger_id"], found)
                ledger_id = found["ledger_id"]
                trigger_ms[ledger_id] = max(trigger_ms.get(ledger_id, 0), rack_map_recovered_ms)

        # 2c. snapshot reconciliation: ledgers absent from a complete FULL snapshot are gone --------------
        for done in snapshots_complete:
            vanished = self._vanished(
                ledgers_table, root, app, batch_id, done, snapshot_seen, ledgers, exists_at_ms
            )
            for ledger_id in vanished:
                existing = ledgers.get(ledger_id) or {
                    "ledger_id": ledger_id,
                    "ledger_bucket": ledger_id % LEDGER_BUCKETS,
                }
                ledgers[ledger_id] = {**existing, "deleted": True, "updated_at": utc_from_ms(done["at_ms"])}
                index_replace[ledger_id] = []
                touch(ledger_id, done["at_ms"])

        # 2d. evaluate the affected ledgers (placement; the lost-bookie rule is streaming.loss's) -----------
        for ledger_id in sorted(trigger_ms):
            if ledger_id not in ledgers:
                continue
            row_now = ledgers[ledger_id]
            at_ms = trigger_ms[ledger_id]
            entity = f"ledger/{ledger_id}"
            if row_now.get("deleted"):
                book.resolve_entity(entity, at_ms, "ledger deleted")
                continue
            if not row_now.get("state"):  # undecodable: nothing else can be evaluated
                for kind in _PLACEMENT_KINDS:
                    book.set_ledger_condition(kind, ledger_id, False, at_ms=at_ms)
                continue
            payload = _as_payload(row_now)
            if rack_map_invalid:
                # Unknown: no placement alert fires or resolves; a closed ledger's column is null until the
                # next valid map re-checks it (_read_unknown_placement).
                if row_now.get("placement") is not None and row_now.get("state") == "CLOSED":
                    ledgers[ledger_id] = {**row_now, "placement": None}
                    changed_ledgers.add(ledger_id)
                continue
            placement = placement_condition(payload, racks, self.config.placement)
            for kind in _PLACEMENT_KINDS:
                holds = placement is not None and placement[0] == kind.value
                book.set_ledger_condition(
                    kind,
                    ledger_id,
                    holds,
                    at_ms=at_ms,
                    bookies=row_now.get("bookies") or [],
                    pulsar_topic=row_now.get("pulsar_topic"),
                    detail=placement[1] if holds and placement else None,
                )
            # The column comes from the condition evaluated above (one placement evaluation per ledger).
            new_placement = placement_column(payload, placement)
            if row_now.get("placement") != new_placement:
                ledgers[ledger_id] = {**row_now, "placement": new_placement}
                changed_ledgers.add(ledger_id)

        # 3. probes: the processor's re-probes and the scrutiny pass ----------------------------------------
        feedback.extend(
            self._probe(probe_requests, ledgers, ledgers_table, bookie_rows, book, cluster, report)
        )
        report.feedback = len(feedback)

        # 4. publish (before the tables: a crash in between replays the same alert ids) ----------------------
        report.alerts = self._publish(book, feedback)

        # 5. tables -----------------------------------------------------------------------------------------
        writer = BatchWriter(root, app, batch_id)
        written = []
        if changed_ledgers:
            ledger_rows = [ledgers[i] for i in sorted(changed_ledgers)]
            written.append(writer.upsert("ledgers", pa.Table.from_pylist(ledger_rows, schema=LEDGERS.schema)))
            report.ledgers_written = len(ledger_rows)
        if index_replace:
            index_rows = [
                row
                for ledger_id, names in sorted(index_replace.items())
                for row in ledger_index_rows(ledgers.get(ledger_id) or {"ledger_id": ledger_id}, names)
            ]
            written.append(
                writer.replace_keys(
                    "ledger_bookies",
                    "ledger_id",
                    index_replace,
                    pa.Table.from_pylist(index_rows, schema=LEDGER_BOOKIES.schema),
                )
            )
        open_alerts_version: int | None = open_table.version()  # unchanged unless written below
        with self.loss.lock:  # tables the loss owner writes too: one commit at a time
            if bookies_changed:
                rows_out = [bookie_rows[b] for b in sorted(bookies_changed)]
                written.append(
                    writer.upsert(
                        "bookies", pa.Table.from_pylist(rows_out, schema=BOOKIES.schema), columns=RACK_COLUMNS
                    )
                )
            if book.transitions:
                open_written, violations_written = record_transitions(writer, book)
                written.extend([open_written, violations_written])
                # Written now: the table's new version. Skipped (a replay found it done): unknown, no cache.
                open_alerts_version = latest_version(root, "open_alerts") if open_written else None
        if dead_letters:
            written.append(
                writer.append("dead_letters", pa.Table.from_pylist(dead_letters, schema=DEAD_LETTERS.schema))
            )
        if snapshot_seen:
            written.append(
                writer.append(
                    "snapshot_seen", pa.Table.from_pylist(snapshot_seen, schema=SNAPSHOT_SEEN.schema)
                )
            )
        report.skipped_replay_tables = sum(1 for w in written if not w)
        if open_alerts_version is not None:
            self._open_alerts_cache = (open_alerts_version, dict(book.open))

        # 6. the loss alerts: membership decisions, and this batch's changed ledgers against the lost set
        # (after their index rows are written: see streaming.loss for why no ledger falls between the lanes)
        loss = self.loss.apply(
            app_id=loss_app(app),
            batch_id=batch_id,
            cluster=cluster,
            membership=membership,
            changed_rows={i: ledgers[i] for i in index_replace if i in ledgers},
            changed_at_ms={i: trigger_ms.get(i, 0) for i in index_replace},
        )
        report.alerts.extend(loss.alerts)
        report.skipped_replay_tables += loss.skipped_replay_tables
        report.dead_letters = dict(Counter(row["source"] for row in dead_letters))
        open_counts = Counter(kind.value for _, kind in book.open) + Counter(self.loss.open_counts())
        report.open_alerts = dict(sorted(open_counts.items()))
        self._maintain(batch_id)
        report.seconds = round(time.monotonic() - started, 3)
        if self.metrics is not None:
            self.metrics.on_batch(report)  # the one place the sink's metrics are updated
        keep_recent(self.reports, report, REPORTS_KEPT)
        return report

    def _maintain(self, batch_id: int) -> None:
        """Compact the small files streaming creates and vacuum old ones, every N batches (in the sink's
        thread, between batch commits, so it never races the batch writer)."""
        every = self.config.maintenance_every_batches
        if every <= 0 or batch_id == 0 or batch_id % every:
            return
        from connectors.delta.tables import maintain

        started = time.monotonic()
        try:
            with self.loss.lock:  # never beside a commit of the membership lane
                maintain(self.config.lakehouse_root)
        except Exception:  # maintenance is an optimisation: never fail a batch for it
            logger.exception("Delta maintenance failed; the next run will try again")
        else:
            logger.info("Delta maintenance took %.1f s", time.monotonic() - started)

    # -- helpers -------------------------------------------------------------------------------------------
    def _vanished(
        self,
        ledgers_table: Any,
        root: Path,
        app: str,
        batch_id: int,
        done: dict[str, Any],
        seen_now: list[dict[str, Any]],
        ledgers: dict[int, dict[str, Any]],
        exists_at_ms: dict[int, int],
    ) -> list[int]:
        """The ledgers of partition p that a complete FULL snapshot of p shows gone.

        A ledger vanished only if the tables hold it as not deleted, the snapshot did not report it, and
        nothing about it happened at or after the snapshot's begin: the watcher's event time never goes
        back within a run, so an event at or after the begin's time (a live create during or after the
        scan, in this batch or an earlier one) proves the znode was there (docs/design.md, "Vanished
        ledgers"). A snapshot whose begin the job did not see is not used.
        """
        snapshot_id, partition = done["snapshot_id"], int(done["partition"])
        begin_ms = done.get("begin_ms")
        if begin_ms is None:
            logger.warning(
                "snapshot %s on partition %d: its begin was not read by this job; no vanished-ledger "
                "reconciliation from it (the next complete FULL snapshot does it)",
                snapshot_id,
                partition,
            )
            return []
        partitions = int(done.get("partition_count") or self.config.changes_partitions)
        seen_table = table_before_batch(root, "snapshot_seen", app, batch_id)
        seen_ids = set(
            scan(seen_table, [("snapshot_id", "=", snapshot_id)], ["ledger_id"])
            .column("ledger_id")
            .to_pylist()
        )
        seen_ids |= {r["ledger_id"] for r in seen_now if r["snapshot_id"] == snapshot_id}
        # Known before the begin: rows not deleted whose last change is older (this batch's rows supersede).
        begin = pa.scalar(utc_from_ms(begin_ms), type=LEDGERS.schema.field("updated_at").type)
        rows = scan(ledgers_table, columns=["ledger_id", "deleted", "updated_at"])
        not_deleted = pc.or_(pc.is_null(rows["deleted"]), pc.invert(pc.fill_null(rows["deleted"], True)))
        older = pc.or_(pc.is_null(rows["updated_at"]), pc.less(rows["updated_at"], begin))
        known = rows.filter(pc.and_(not_deleted, older))
        candidates = {i for i in known.column("ledger_id").to_pylist() if i not in ledgers}
        candidates |= {
            i
            for i, r in ledgers.items()
            if not r.get("deleted") and _ms(r.get("updated_at"), default=-1) < begin_ms
        }
        return sorted(
            i
            for i in candidates
            if i not in seen_ids
            and exists_at_ms.get(i, -1) < begin_ms
            and kafka_partition(f"ledger/{i}", partitions) == partition
        )

    def _probe(
        self,
        requests: list[dict[str, Any]],
        ledgers: dict[int, dict[str, Any]],
        ledgers_table: Any,
        bookie_rows: dict[str, dict[str, Any]],
        book: AlertBook,
        cluster: str,
        report: BatchReport,
    ) -> list[dict[str, Any]]:
        from connectors.bookie.ledger_probe import LedgerProbeTarget, probe_ledgers

        targets: list[tuple[dict[str, Any], LedgerProbeTarget]] = []
        requested = {r["ledger_id"] for r in requests}
        requests = list(requests) + self._scrutiny_picks(ledgers_table, requests, requested)
        missing = [r["ledger_id"] for r in requests if r["ledger_id"] not in ledgers]
        for found in _read_filtered(ledgers_table, "ledger_id", missing):
            ledgers[found["ledger_id"]] = found
        for request in requests:
            row = ledgers.get(request["ledger_id"])
            if row is None or row.get("deleted") or not row.get("state"):
                continue
            segments = tuple((s["first_entry_id"], tuple(s["ensemble"])) for s in row.get("segments") or [])
            targets.append(
                (
                    request,
                    LedgerProbeTarget(
                        row["ledger_id"],
                        row["ensemble_size"],
                        row["write_quorum"],
                        row["ack_quorum"],
                        row["state"],
                        row["last_entry_id"],
                        segments,
                    ),
                )
            )
        if not targets:
            return []
        addresses = {
            b: r["rpc_address"] if r.get("rpc_address") else f"{r['host']}:{r['port']}"
            for b, r in bookie_rows.items()
            if r.get("status") in ("WRITABLE", "READ_ONLY")
            and (r.get("rpc_address") or (r.get("host") and r.get("port")))
        }
        outcomes = probe_ledgers(
            self._prober(),
            [t for _, t in targets],
            addresses,
            timeout=self.config.probe_timeout_s,
            concurrency=self.config.probe_concurrency,
        )
        report.probes = len(outcomes)
        report.probe_outcomes = dict(
            Counter(
                (
                    "scrutiny" if request.get("scrutiny") else "reprobe",
                    "failing" if outcome.failing else "healthy",
                )
                for (request, _), outcome in zip(targets, outcomes, strict=True)
            )
        )
        now_ms = int(time.time() * 1000)
        messages = []
        for (request, target), outcome in zip(targets, outcomes, strict=True):
            for bookie, kind in outcome.answers.items():
                if kind in ("entry_list", "no_ledger"):
                    book.set_bookie_condition(AlertKind.BOOKIE_UNRESPONSIVE, bookie, False, at_ms=now_ms)
            if request.get("scrutiny") and not outcome.failing:
                continue  # healthy background check: nothing to report
            messages.append(
                {
                    "kind": "probe_result",
                    "cluster": cluster,
                    "ledger_id": target.ledger_id,
                    # Wall clock: event time is the watcher's (wall) clock too, so feedback is never late.
                    "event_time_ms": now_ms,
                    "round": int(request.get("round", 0)),
                    "reason": request.get("reason") or ("scrutiny" if request.get("scrutiny") else "probe"),
                    "mzxid": (ledgers.get(target.ledger_id) or {}).get("mzxid"),
                    "failing": outcome.failing,
                    "outcome": {
                        **outcome.verdict.to_json(),
                        "unresponsive": list(outcome.unresponsive),
                        "unresolved": list(outcome.unresolved),
                        "answers": outcome.answers,
                    },
                }
            )
        return messages

    def _scrutiny_picks(
        self, ledgers_table: Any, requests: list[dict[str, Any]], requested: set[int]
    ) -> list[dict[str, Any]]:
        """The next closed ledgers of the background replicas check, at the configured rate."""
        rate = self.config.scrutiny_ledgers_per_s
        if rate <= 0:
            return []
        now_ms = int(time.time() * 1000)
        last = self._scrutiny_last_ms if self._scrutiny_last_ms is not None else now_ms - 1000
        budget = min(int((now_ms - last) / 1000 * rate), self.config.scrutiny_max_per_batch)
        if budget <= 0:
            return []
        self._scrutiny_last_ms = now_ms
        closed_after_cursor = [
            ("state", "=", "CLOSED"),
            ("deleted", "=", False),
            ("ledger_id", ">", self._scrutiny_cursor),
        ]
        candidates = scan(ledgers_table, closed_after_cursor, ["ledger_id"]).column("ledger_id").to_pylist()
        if not candidates:
            self._scrutiny_cursor = -1  # a full pass is done: start over
            return []
        picked = sorted(candidates)[:budget]
        self._scrutiny_cursor = picked[-1]
        return [{"ledger_id": i, "round": 0, "scrutiny": True} for i in picked if i not in requested]

    def _publish(self, book: AlertBook, feedback: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send the batch's alert transitions and feedback; returns the alerts as published (JSON objects)."""
        if not book.transitions and not feedback:
            return []
        return publish(self._kafka(), self.config.kafka, book.transitions, feedback)


def open_alert_counts(root: str | Path) -> dict[str, int]:
    """Current number of open alerts per kind (for the audit gauges).

    Example:
        >>> import tempfile; open_alert_counts(tempfile.mkdtemp())
        {}
    """
    from connectors.delta.tables import read_table

    counts: dict[str, int] = defaultdict(int)
    for kind in read_table(root, "open_alerts").column("kind").to_pylist():
        counts[kind] += 1
    return dict(counts)


__all__ = ["AlertState", "AuditSink", "BatchReport", "SinkConfig", "kafka_partition", "open_alert_counts"]
