"""Rebuilding a derived Delta table in place from its source (``bkaudit repair``).

Four tables hold nothing their source does not: ``ledgers`` is the fold of ``ledger_changes``,
``ledger_bookies`` the index of ``ledgers``, ``open_alerts`` the open conditions of ``violations``, and
``violations`` the transitions the job published on the alerts topic. A damaged one is set aside under
``<lakehouse>/_damaged/`` (never deleted: the operator deletes it once satisfied), created empty and filled
from its source with the job's own functions (the fold is :class:`~connectors.delta.ledger_log.LedgerLog`'s).
The app transactions of its log, as far as its files can still be read (else those of the table written in
the same batches), are recorded again, so a batch the job replays after the repair is not written twice.

Example:
    >>> import tempfile
    >>> from connectors.delta.tables import ensure_tables
    >>> root = tempfile.mkdtemp(); _ = ensure_tables(root)
    >>> damaged_tables(root)
    {}
    >>> _ = set_aside(root, "open_alerts")
    >>> damaged_tables(root)["open_alerts"]
    'it is gone'
    >>> rebuild_open_alerts(root).rows
    0
    >>> damaged_tables(root)
    {}
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from connectors.delta.health import recorded_tables, repair_marker, table_damage, unfinished_repair
from connectors.delta.ledger_log import LedgerLog
from connectors.delta.tables import (
    APP_METADATA_KEY,
    BATCH_METADATA_KEY,
    LEDGER_BUCKETS,
    OPEN_ALERTS,
    TABLES,
    VIOLATIONS,
    conform_to,
    create_table,
    index_rows_on,
    read_current_ledgers,
    table_path,
)
from core.domain.alerts import AlertKind, alert_id_of

logger = logging.getLogger(__name__)

#: Under the lakehouse root: the damaged tables a repair set aside, as ``<table>-<UTC time>``.
DAMAGED_ASIDE = "_damaged"
#: Where a table written in the same batches as another keeps the same app transactions.
_SAME_BATCHES = {"violations": "open_alerts", "open_alerts": "violations", "ledger_bookies": "ledger_changes"}
_GONE = "it is gone"


@dataclass(frozen=True)
class Rebuilt:
    """One table rebuilt: from what, its rows now, and what the operator should know."""

    table: str
    source: str
    rows: int
    note: str = ""


def damaged_tables(root: str | Path) -> dict[str, str]:
    """The tables the job created under ``root`` that are damaged or gone, with what is wrong."""
    found = {}
    for name in sorted(recorded_tables(root)):
        path = Path(root) / name
        damage = unfinished_repair(root, name) or (
            _GONE if not (path / "_delta_log").is_dir() else table_damage(path)
        )
        if damage is not None:
            found[name] = damage
    return found


def set_aside(root: str | Path, name: str) -> Path | None:
    """Move the table ``name`` to ``<root>/_damaged/<name>-<UTC time>`` (None: it was not there)."""
    path = Path(root) / name
    if not path.exists():
        return None
    aside = Path(root) / DAMAGED_ASIDE
    aside.mkdir(exist_ok=True)
    target = aside / f"{name}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%fZ')}"
    path.rename(target)
    return target


def logged_transactions(path: str | Path) -> dict[str, int]:
    """The app transactions (app id → last batch) a table's log records, read from whatever of its
    commits and last checkpoint still parse: a damaged log still tells which batches were written.

    Example:
        >>> import tempfile
        >>> from connectors.delta.tables import BatchWriter, ensure_tables
        >>> root = tempfile.mkdtemp(); _ = ensure_tables(root)
        >>> BatchWriter(root, "doc", 4).append("bookies", pa.table({"bookie_id": ["b1"]}))
        True
        >>> logged_transactions(Path(root, "bookies"))
        {'doc': 4}
    """
    log = Path(path) / "_delta_log"
    found: dict[str, int] = {}
    for app, version in [*_checkpoint_transactions(log), *_commit_transactions(log)]:
        found[app] = max(version, found.get(app, version))
    return found


def _commit_transactions(log: Path) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    for commit in sorted(log.glob("*.json")):
        try:
            lines = commit.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                txn = json.loads(line).get("txn")
                found.append((str(txn["appId"]), int(txn["version"])))
            except (ValueError, AttributeError, KeyError, TypeError):
                continue
    return found


def _checkpoint_transactions(log: Path) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    for part in sorted(log.glob("*.checkpoint*.parquet"))[-1:]:
        try:
            txns = pq.read_table(part, columns=["txn"]).column("txn").to_pylist()
        except (OSError, pa.ArrowException, KeyError):
            continue
        found.extend((str(t["appId"]), int(t["version"])) for t in txns if t and t.get("appId"))
    return found


def recreate(root: str | Path, name: str) -> dict[str, int]:
    """Set the table aside (when there) and create it empty, its rebuild marked as unfinished; returns the
    app transactions its log and the table written in the same batches record."""
    txns = logged_transactions(Path(root) / name)
    partner = _SAME_BATCHES.get(name)
    if partner is not None:
        for app, version in logged_transactions(Path(root) / partner).items():
            txns[app] = max(version, txns.get(app, version))
    marker = repair_marker(root, name)
    marker.parent.mkdir(exist_ok=True)
    marker.touch()
    aside = set_aside(root, name)
    if aside is not None:
        logger.warning("the damaged Delta table '%s' was moved to %s", name, aside)
    create_table(root, TABLES[name])
    return txns


def _finish(root: str | Path, name: str, txns: Mapping[str, int]) -> None:
    """Record ``txns`` again (one empty commit per app transaction, with the batch metadata the job's own
    commits carry: a batch replayed after the repair finds itself written, and the table as it was before
    it: the repair), then remove the rebuild's marker."""
    empty = TABLES[name].schema.empty_table()
    for app, version in sorted(txns.items()):
        write_deltalake(
            table_path(root, name),
            empty,
            mode="append",
            commit_properties=CommitProperties(
                custom_metadata={BATCH_METADATA_KEY: str(version), APP_METADATA_KEY: app},
                app_transactions=[Transaction(app, version)],
            ),
        )
    repair_marker(root, name).unlink(missing_ok=True)


# -- ledgers and their index ---------------------------------------------------------------------------------
def rebuild_ledgers(root: str | Path, app_id: str, buckets: int = LEDGER_BUCKETS) -> Rebuilt:
    """``ledgers`` folded again from ``ledger_changes`` by the job's own fold (through the last batch of
    ``app_id``), in ``buckets`` partitions (``stream.ledger_table_buckets``). Changes older than the change
    log's retention are gone from it: their ledgers come back with the watcher's next FULL snapshot."""
    recreate(root, "ledgers")  # the fold's own transaction is the only one ``ledgers`` has
    log = LedgerLog(root, app_id, buckets=buckets)
    log.ensure_open()
    last = DeltaTable(table_path(root, "ledger_changes")).transaction_version(app_id)
    if last is not None:
        log.flush_index()  # a fold never passes the index's last append
        log.fold(through=int(last))
    log.stop_folding(fold_all=False)
    _finish(root, "ledgers", {})
    rows = DeltaTable(table_path(root, "ledgers")).to_pyarrow_table(columns=["ledger_id"]).num_rows
    note = (
        "ledgers whose last change is older than stream.ledger_changes_retention_hours are no longer in "
        "ledger_changes: restart `bkaudit watch` (its FULL snapshot publishes every ledger again)"
    )
    return Rebuilt("ledgers", "ledger_changes", rows, note)


def ledgers_in_changes(root: str | Path) -> int:
    """How many ledgers ``ledger_changes`` holds a row of (what a rebuild of ``ledgers`` gives back).

    Example:
        >>> import tempfile
        >>> from connectors.delta.tables import ensure_tables
        >>> root = tempfile.mkdtemp(); _ = ensure_tables(root)
        >>> ledgers_in_changes(root)
        0
    """
    ids = DeltaTable(table_path(root, "ledger_changes")).to_pyarrow_table(columns=["ledger_id"])
    return len(pc.unique(ids.column("ledger_id")))


def rebuild_index(root: str | Path, recreated: Mapping[str, int] | None = None) -> Rebuilt:
    """``ledger_bookies`` written again from every ledger's current row (one commit). ``recreated``: the
    transactions :func:`recreate` returned when it was recreated already (the fold of a ``ledgers``
    rebuild appends to the index, so a damaged one is replaced first)."""
    txns = recreate(root, "ledger_bookies") if recreated is None else dict(recreated)
    rows = index_rows_on(read_current_ledgers(root), None)
    rows = conform_to(rows, TABLES["ledger_bookies"].schema)
    write_deltalake(table_path(root, "ledger_bookies"), rows, mode="overwrite")
    _finish(root, "ledger_bookies", txns)
    return Rebuilt("ledger_bookies", "ledgers", rows.num_rows)


# -- alerts ------------------------------------------------------------------------------------------
def rebuild_open_alerts(root: str | Path) -> Rebuilt:
    """``open_alerts`` written again from ``violations``: each alert whose last transition fires."""
    txns = recreate(root, "open_alerts")
    violations = DeltaTable(table_path(root, "violations")).to_pyarrow_table()
    rows, unverified = open_alert_rows(violations)
    if rows.num_rows:
        write_deltalake(table_path(root, "open_alerts"), rows, mode="append")
    _finish(root, "open_alerts", txns)
    note = ""
    if unverified:
        note = (
            f"{unverified} open alerts have no start time in violations (rows rebuilt from the alerts topic "
            "or written by an older bkaudit): their resolution will carry a new alert_id"
        )
    return Rebuilt("open_alerts", "violations", rows.num_rows, note)


def open_alert_rows(violations: pa.Table) -> tuple[pa.Table, int]:
    """The ``open_alerts`` rows of a ``violations`` table: per alert id its last transition (by time, a
    resolution after a firing of the same instant), kept when it fires; and how many of them lack a
    start time that their id confirms (the first firing's time is then taken).

    Example:
        >>> from datetime import datetime, UTC
        >>> at = lambda s: datetime.fromtimestamp(s, tz=UTC)
        >>> rows = pa.Table.from_pylist([
        ...     {"alert_id": "a", "kind": "BOOKIE_LOST", "state": "firing", "detected_at": at(1),
        ...      "entity": "bookie/b1", "started_at": at(1)},
        ...     {"alert_id": "a", "kind": "BOOKIE_LOST", "state": "resolved", "detected_at": at(1)},
        ...     {"alert_id": "b", "kind": "BOOKIE_LOST", "state": "firing", "detected_at": at(2),
        ...      "entity": "bookie/b2", "started_at": at(2)}], schema=VIOLATIONS.schema)
        >>> open_alert_rows(rows)[0].column("alert_id").to_pylist()
        ['b']
    """
    if violations.num_rows == 0:
        return OPEN_ALERTS.schema.empty_table(), 0
    ids = violations.column("alert_id").to_numpy(zero_copy_only=False)
    detected = pc.fill_null(violations.column("detected_at").cast(pa.int64()), 0).to_numpy()
    resolved = pc.equal(violations.column("state"), "resolved").to_numpy(zero_copy_only=False)
    order = np.lexsort((np.arange(len(ids)), resolved, detected, ids))
    last = order[np.r_[ids[order][1:] != ids[order][:-1], True]]
    newest = violations.take(pa.array(last, pa.int64()))
    firing = newest.filter(pc.equal(newest.column("state"), "firing"))
    started, unverified = _start_times(firing, violations)
    columns = {name: firing.column(name) for name in OPEN_ALERTS.schema.names if name in firing.column_names}
    columns["entity"] = pa.array([_entity_of(row) for row in firing.to_pylist()], pa.string())
    columns["started_at"] = started
    rows = conform_to(pa.table(columns), OPEN_ALERTS.schema)
    return rows.sort_by("alert_id"), unverified


def _entity_of(row: Mapping[str, Any]) -> str | None:
    """The row's entity, or the one its kind implies (rows written before violations kept it)."""
    if row.get("entity"):
        return str(row["entity"])
    try:
        kind = AlertKind(row["kind"])
    except ValueError:
        return None
    if kind.is_cluster_kind:
        return kind.cluster_entity
    if kind.is_bookie_kind and row.get("bookies"):
        return f"bookie/{row['bookies'][0]}"
    if row.get("ledger_id") is not None:
        return f"ledger/{row['ledger_id']}"
    return None


def _start_times(firing: pa.Table, violations: pa.Table) -> tuple[pa.Array, int]:
    """Each open alert's start time: its own, or the time of one of its transitions that its id confirms
    (else its first firing's), and how many were not confirmed."""
    unknown = firing.filter(pc.is_null(firing.column("started_at"))).column("alert_id")
    theirs = violations.filter(pc.is_in(violations.column("alert_id"), unknown.combine_chunks()))
    times: dict[str, list[datetime]] = {}  # the transition times of the alerts without a start time
    for alert_id, at in zip(
        theirs.column("alert_id").to_pylist(), theirs.column("detected_at").to_pylist(), strict=True
    ):
        if at is not None:
            times.setdefault(alert_id, []).append(at)
    started, unverified = [], 0
    for row in firing.to_pylist():
        if row.get("started_at") is not None:
            started.append(row["started_at"])
            continue
        candidates = sorted(times.get(row["alert_id"], []))
        entity = _entity_of(row)
        confirmed = [
            at
            for at in candidates
            if entity is not None
            and alert_id_of(row["cluster"] or "", row["kind"], entity, int(at.timestamp() * 1000))
            == row["alert_id"]
        ]
        unverified += not confirmed
        started.append((confirmed or candidates or [row["detected_at"]])[0])
    return pa.array(started, OPEN_ALERTS.schema.field("started_at").type), unverified


def violation_rows(records: Iterable[tuple[str | None, Mapping[str, Any]]]) -> pa.Table:
    """``violations`` rows of alert objects as published (with their Kafka key ``<cluster>/<entity>``),
    oldest first; a record sent twice (a replayed batch, ``bkaudit alerts republish``) is one row. The
    topic does not carry ``batch_id`` or ``started_at``: they are null.

    Example:
        >>> body = {"alert_id": "a", "cluster": "c", "kind": "BOOKIE_LOST", "state": "firing",
        ...         "severity": "warning", "bookies": ["b1"], "detected_at": "2026-11-29T10:00:00.000Z",
        ...         "detail": {"z": 1, "a": 2}}
        >>> rows = violation_rows([("c/bookie/b1", body), ("c/bookie/b1", body)])
        >>> rows.num_rows, rows.column("entity").to_pylist(), rows.column("detail").to_pylist()
        (1, ['bookie/b1'], ['{"a":2,"z":1}'])
    """
    seen: set[str] = set()
    rows = []
    for key, body in records:
        identity = json.dumps([key, body], sort_keys=True, default=str)
        if identity in seen:
            continue
        seen.add(identity)
        detected = _parse_time(body.get("detected_at"))
        cluster = body.get("cluster")
        entity = key[len(cluster) + 1 :] if key and cluster and key.startswith(f"{cluster}/") else None
        rows.append(
            {
                **{name: body.get(name) for name in ("alert_id", "cluster", "kind", "state", "severity")},
                **{name: body.get(name) for name in ("ledger_id", "bookies", "pulsar_topic")},
                "detected_at": detected,
                "detected_date": detected.date() if detected else None,
                "detail": json.dumps(body.get("detail") or {}, separators=(",", ":"), sort_keys=True),
                "entity": entity,
            }
        )
    rows.sort(key=lambda r: r["detected_at"] or datetime.min.replace(tzinfo=UTC))
    return pa.Table.from_pylist(rows, schema=VIOLATIONS.schema)


def _parse_time(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def rebuild_violations(root: str | Path, records: Iterable[tuple[str | None, Mapping[str, Any]]]) -> Rebuilt:
    """``violations`` written again from the alerts topic's records (:func:`violation_rows`)."""
    txns = recreate(root, "violations")
    rows = violation_rows(records)
    if rows.num_rows:
        write_deltalake(table_path(root, "violations"), rows, mode="append")
    _finish(root, "violations", txns)
    return Rebuilt("violations", "the alerts topic", rows.num_rows)


__all__ = [
    "DAMAGED_ASIDE",
    "Rebuilt",
    "damaged_tables",
    "ledgers_in_changes",
    "logged_transactions",
    "open_alert_rows",
    "rebuild_index",
    "rebuild_ledgers",
    "rebuild_open_alerts",
    "rebuild_violations",
    "recreate",
    "set_aside",
    "violation_rows",
]
