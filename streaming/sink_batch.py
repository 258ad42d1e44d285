"""One micro-batch inside the sink: its working state and the steps that apply its decisions (no I/O).

:class:`SinkBatch` holds what the sink read as of before the batch (bookies, open alerts, the ledgers the
batch touches) and what the batch changes (ledger rows, index entries, alert transitions, dead letters,
snapshot sightings). :func:`apply_decisions` applies the processor's decisions to it in event-time order,
one small handler per decision kind; :func:`evaluate_ledgers` then evaluates the affected ledgers'
placement and bookie isolation. The sink (:mod:`streaming.sink`) reads the state, runs the steps and
writes the result.

Example:
    >>> from core.domain.alert_book import AlertBook
    >>> batch = SinkBatch(batch_id=0, cluster="c", book=AlertBook("c"), bookie_rows={}, changes_partitions=1)
    >>> apply_decisions(batch, [{"kind": "ledger_deleted", "ledger_id": 7, "payload": {}, "at_ms": 5}])
    >>> batch.ledgers[7]["deleted"], sorted(batch.changed_ledgers), batch.index_replace
    (True, [7], {7: []})
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.tables import LEDGER_BUCKETS
from connectors.kafka.publisher import partition_for_key
from core.domain.alert_book import AlertBook
from core.domain.alerts import RACK_MAP_ENTITY, AlertKind
from core.domain.isolation import IsolationConfig, isolation_config_of
from core.domain.rules.evaluate import (
    PlacementPolicyConfig,
    placement_column,
    placement_condition,
)
from core.domain.rules.isolation import isolation_screen, isolation_verdict
from core.domain.rules.placement_batch import rackaware_screen
from streaming.loss import MEMBERSHIP_DECISIONS, utc_from_ms
from streaming.sink_versions import adhering_versions, isolation_violating_versions

REPLICAS_KINDS = {
    "NO_REPLICA": AlertKind.REPLICAS_NO_REPLICA,
    "LESS_THAN_AQ": AlertKind.REPLICAS_LESS_THAN_AQ,
    "LESS_THAN_WQ": AlertKind.REPLICAS_LESS_THAN_WQ,
}
PLACEMENT_KINDS = (AlertKind.PLACEMENT_NOT_ADHERING, AlertKind.PLACEMENT_SOFT)

Row = dict[str, Any]


@dataclass
class SinkBatch:
    """A micro-batch's state in the sink: read as of before it, then changed by its decisions."""

    batch_id: int
    cluster: str
    book: AlertBook  # open alerts of the ledger lane's kinds, and this batch's transitions
    bookie_rows: dict[str, Row]  # bookies table rows, with this batch's registrations and racks
    changes_partitions: int
    ledgers: dict[int, Row] = field(default_factory=dict)  # whole rows: read, then changed
    known: dict[int, Row] = field(default_factory=dict)  # version (mzxid, deleted, kept columns) of others
    racks: dict[str, str | None] = field(default_factory=dict)
    groups: dict[str, str | None] = field(default_factory=dict)  # bookie → affinity group (rack map)
    rack_map_invalid: bool = False
    rack_map_recovered_ms: int | None = None
    moved: dict[str, int] = field(default_factory=dict)  # bookie → when the rack map moved it (rack, group)
    changed_ledgers: set[int] = field(default_factory=set)  # rows to write
    trigger_ms: dict[int, int] = field(default_factory=dict)  # ledgers to evaluate, at this event time
    index_replace: dict[int, list[str]] = field(default_factory=dict)  # new versions: their bookies
    bookies_changed: set[str] = field(default_factory=set)
    membership: list[Row] = field(default_factory=list)  # for the loss owner, after the index write
    dead_letters: list[Row] = field(default_factory=list)
    snapshot_seen: list[Row] = field(default_factory=list)
    snapshots_complete: list[Row] = field(default_factory=list)
    probe_requests: list[Row] = field(default_factory=list)
    # Ledger id → event time of the latest event showing its znode exists (applied or not): a complete
    # snapshot that began at or before it cannot have seen the ledger vanish.
    exists_at_ms: dict[int, int] = field(default_factory=dict)
    # New versions kept as columns (streaming.sink_versions): ``ledgers`` rows no per-ledger row holds, with
    # each one's change time and the time of its ledger's first applied version in the batch.
    versions: pa.Table | None = None
    versions_at_ms: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    versions_first_at_ms: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    snapshot_seen_tables: list[pa.Table] = field(default_factory=list)
    topic_rows: list[Row] = field(default_factory=list)  # changed managed ledgers (streaming.topics)

    def current_of(self, ledger_id: int) -> Mapping[str, Any] | None:
        """The ledger's row as this batch knows it (whole, or only its version)."""
        return self.ledgers.get(ledger_id) or self.known.get(ledger_id)

    def row_or_new(self, ledger_id: int, **extra: Any) -> Row:
        return self.ledgers.get(ledger_id) or {
            "ledger_id": ledger_id,
            "ledger_bucket": ledger_id % LEDGER_BUCKETS,
            **extra,
        }

    def touch(self, ledger_id: int, at_ms: int) -> None:
        """A ledger whose row changed at ``at_ms``: written, and evaluated at that time."""
        self.changed_ledgers.add(ledger_id)
        self.trigger_ms[ledger_id] = max(self.trigger_ms.get(ledger_id, at_ms), at_ms)

    def evaluate_at(self, ledger_id: int, at_ms: int) -> None:
        self.trigger_ms[ledger_id] = max(self.trigger_ms.get(ledger_id, at_ms), at_ms)

    def seen(self, ledger_id: int, snapshot_id: str | None, at_ms: int) -> None:
        """The ledger's znode exists at ``at_ms`` (reported by snapshot ``snapshot_id``, if any)."""
        self.exists_at_ms[ledger_id] = max(self.exists_at_ms.get(ledger_id, at_ms), at_ms)
        if snapshot_id:
            partition = partition_for_key(f"ledger/{ledger_id}".encode(), self.changes_partitions)
            self.snapshot_seen.append(
                {"snapshot_id": snapshot_id, "kafka_partition": partition, "ledger_id": ledger_id}
            )

    def versions_to_rows(self, chosen: np.ndarray | None = None) -> None:
        """Move new versions (all, or the ``chosen`` ones) from the columns to per-ledger rows, as the
        ``ledger_state`` handler would have left them."""
        if self.versions is None or not self.versions.num_rows:
            return
        chosen = np.ones(self.versions.num_rows, bool) if chosen is None else chosen
        moved = self.versions.filter(pa.array(chosen))
        at_ms, first_ms = self.versions_at_ms[chosen].tolist(), self.versions_first_at_ms[chosen].tolist()
        for row, at, first in zip(moved.to_pylist(), at_ms, first_ms, strict=True):
            ledger_id = row["ledger_id"]
            self.ledgers[ledger_id] = row
            self.index_replace[ledger_id] = row["bookies"]
            self.touch(ledger_id, at)
            self.book.set_ledger_condition(AlertKind.METADATA_CORRUPT, ledger_id, False, at_ms=first)
        kept = ~chosen
        self.versions = self.versions.filter(pa.array(kept))
        self.versions_at_ms, self.versions_first_at_ms = (
            self.versions_at_ms[kept],
            self.versions_first_at_ms[kept],
        )

    def needs_rows(self) -> bool:
        """Whether a stage after the decisions reads every new version as a row: a rack move, a rack map
        valid again or invalid, a completed snapshot."""
        return bool(
            self.moved
            or self.rack_map_recovered_ms is not None
            or self.rack_map_invalid
            or self.snapshots_complete
        )

    def dead_letter(self, at_ms: int, **fields: Any) -> None:
        received = utc_from_ms(at_ms)
        assert received is not None
        self.dead_letters.append(
            {**fields, "received_at": received, "received_date": received.date(), "batch_id": self.batch_id}
        )


# -- the decisions, one handler per kind --------------------------------------------------------------------
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


def segment_pairs(segments: Iterable[Any]) -> list[tuple[int, list[str]]]:
    """A payload's segments as ``(first entry id, ensemble)`` pairs, from either payload shape: objects with
    the ``ledgers`` field names, or the ``[first, ensemble]`` pairs of decisions queued by older versions.

    Example:
        >>> segment_pairs([{"first_entry_id": 0, "ensemble": ["b1"]}]), segment_pairs([[5, ["b2"]]])
        ([(0, ['b1'])], [(5, ['b2'])])
    """
    return [
        (s["first_entry_id"], list(s["ensemble"])) if isinstance(s, Mapping) else (s[0], list(s[1]))
        for s in segments
    ]


def _custom_metadata(entries: Iterable[Any]) -> list[Row]:
    """A payload's custom metadata as ``ledgers`` rows (either payload shape, values in base64)."""
    pairs = ((e["key"], e["value_b64"]) if isinstance(e, Mapping) else (e[0], e[1]) for e in entries or [])
    return [{"key": key, "value": binascii.a2b_base64(value)} for key, value in pairs]


#: Columns a new metadata version leaves as they were: the urL mark is a znode of its own.
CARRIED_COLUMNS = ("under_replication_marked", "under_replication_replicas", "under_replication_ctime_ms")


def ledger_row(
    ledger_id: int,
    payload: Mapping[str, Any],
    cluster: str,
    at_ms: int,
    before: Mapping[str, Any] | None = None,
) -> Row:
    """A ``ledgers`` row from a ``ledger_state`` decision's payload (the urL mark's columns kept from the
    row ``before`` it)."""
    segments = segment_pairs(payload["segments"])
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
        "segments": [{"first_entry_id": first, "ensemble": ensemble} for first, ensemble in segments],
        "bookies": sorted({bookie for _, ensemble in segments for bookie in ensemble}),
        "ctime_ms": payload.get("ctime_ms"),
        "pulsar_topic": payload.get("pulsar_topic"),
        "custom_metadata": _custom_metadata(payload.get("custom_metadata") or []),
        "has_password": payload.get("has_password"),
        "znode_version": payload.get("version"),
        "mzxid": payload.get("mzxid"),
        "znode_ctime_ms": payload.get("znode_ctime_ms"),
        "znode_mtime_ms": payload.get("znode_mtime_ms"),
        "undecodable_reason": None,
        **{column: (before or {}).get(column) for column in CARRIED_COLUMNS},
        "deleted": False,
        "updated_at": utc_from_ms(at_ms),
    }


def _ledger_state(batch: SinkBatch, row: Row) -> None:
    ledger_id, payload, at_ms = row["ledger_id"], row["payload"], row["at_ms"]
    if _is_stale(batch.current_of(ledger_id), payload.get("mzxid")):
        # A duplicate or an older version (the processor tracks only suspect ledgers): a snapshot still
        # learns the ledger exists.
        if not (batch.current_of(ledger_id) or {}).get("deleted"):
            batch.seen(ledger_id, payload.get("snapshot_id"), at_ms)
        return
    before = batch.current_of(ledger_id)
    batch.ledgers[ledger_id] = new_row = ledger_row(ledger_id, payload, batch.cluster, at_ms, before)
    batch.index_replace[ledger_id] = new_row["bookies"]
    batch.touch(ledger_id, at_ms)
    batch.seen(ledger_id, payload.get("snapshot_id"), at_ms)
    batch.book.set_ledger_condition(AlertKind.METADATA_CORRUPT, ledger_id, False, at_ms=at_ms)


def _ledger_seen(batch: SinkBatch, row: Row) -> None:
    if not (batch.current_of(row["ledger_id"]) or {}).get("deleted"):
        batch.seen(row["ledger_id"], row["payload"].get("snapshot_id"), row["at_ms"])


def _ledger_deleted(batch: SinkBatch, row: Row) -> None:
    ledger_id, at_ms = row["ledger_id"], row["at_ms"]
    existing = batch.row_or_new(ledger_id)
    if existing.get("deleted"):
        return  # a duplicate delete
    batch.ledgers[ledger_id] = {
        **existing,
        "deleted": True,
        "cluster": batch.cluster,
        "updated_at": utc_from_ms(at_ms),
    }
    batch.index_replace[ledger_id] = []
    batch.touch(ledger_id, at_ms)


def _ledger_corrupt(batch: SinkBatch, row: Row) -> None:
    ledger_id, payload, at_ms = row["ledger_id"], row["payload"], row["at_ms"]
    existing = batch.row_or_new(ledger_id)
    if _is_stale_corrupt(existing, payload.get("mzxid")):
        # The same corrupt version again (a snapshot re-reading it, a replay): the znode exists and still
        # does not decode, so its METADATA_CORRUPT stays open.
        if not existing.get("deleted"):
            batch.seen(ledger_id, payload.get("snapshot_id"), at_ms)
        return
    batch.ledgers[ledger_id] = {
        **existing,
        "cluster": batch.cluster,
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
    batch.index_replace[ledger_id] = []
    batch.touch(ledger_id, at_ms)
    batch.seen(ledger_id, payload.get("snapshot_id"), at_ms)
    detail = {"reason": payload.get("reason"), "path": payload.get("path")}
    batch.book.set_ledger_condition(AlertKind.METADATA_CORRUPT, ledger_id, True, at_ms=at_ms, detail=detail)
    batch.dead_letter(
        at_ms, source="znode", ledger_id=ledger_id, path=payload.get("path"), reason=payload.get("reason")
    )


def _under_replication(batch: SinkBatch, row: Row) -> None:
    ledger_id, payload, at_ms = row["ledger_id"], row["payload"], row["at_ms"]
    marked = payload.get("state") == "SET"
    batch.ledgers[ledger_id] = {
        **batch.row_or_new(ledger_id, cluster=batch.cluster),
        "under_replication_marked": marked,
        "under_replication_replicas": payload.get("replicas") if marked else [],
        "under_replication_ctime_ms": payload.get("mark_ctime_ms") if marked else None,
        "updated_at": utc_from_ms(at_ms),
    }
    batch.changed_ledgers.add(ledger_id)
    if not marked:
        batch.book.set_ledger_condition(AlertKind.UNDER_REPLICATION_STUCK, ledger_id, False, at_ms=at_ms)


def _under_replication_stuck(batch: SinkBatch, row: Row) -> None:
    ledger_id, payload = row["ledger_id"], row["payload"]
    batch.book.set_ledger_condition(
        AlertKind.UNDER_REPLICATION_STUCK,
        ledger_id,
        True,
        at_ms=row["at_ms"],
        bookies=payload.get("replicas") or [],
        pulsar_topic=(batch.ledgers.get(ledger_id) or {}).get("pulsar_topic"),
        detail=payload,
    )


def _membership(batch: SinkBatch, row: Row) -> None:
    batch.membership.append(row)
    if row["kind"] == "bookie_state":  # this batch's probes see the registration
        bookie_id, payload = row["bookie_id"], row["payload"]
        existing = batch.bookie_rows.get(bookie_id, {"bookie_id": bookie_id})
        registration = {k: payload.get(k) for k in ("status", "host", "port", "rpc_address")}
        batch.bookie_rows[bookie_id] = {**existing, **registration}


def _rack_map(batch: SinkBatch, row: Row) -> None:
    payload, at_ms = row["payload"], row["at_ms"]
    book = batch.book
    if payload.get("error"):
        detail = {"reason": payload["error"]}
        book.set_cluster_condition(AlertKind.RACK_MAP_INVALID, True, at_ms=at_ms, detail=detail)
        batch.rack_map_invalid, batch.rack_map_recovered_ms = True, None
        return
    if batch.rack_map_invalid:
        book.set_cluster_condition(AlertKind.RACK_MAP_INVALID, False, at_ms=at_ms)
        batch.rack_map_invalid, batch.rack_map_recovered_ms = False, at_ms
    for bookie in payload.get("moved") or []:
        batch.moved[bookie] = at_ms
    batch.racks = {**dict.fromkeys(batch.racks), **(payload.get("racks") or {})}
    groups = {**dict.fromkeys(batch.groups), **dict.fromkeys(batch.racks), **(payload.get("groups") or {})}
    for bookie, group in groups.items():
        if batch.groups.get(bookie) != group:  # its isolated ledgers are judged again
            batch.moved[bookie] = at_ms
    batch.groups = groups
    for bookie, rack in batch.racks.items():
        existing = batch.bookie_rows.get(bookie, {"bookie_id": bookie, "cluster": batch.cluster})
        group = groups.get(bookie)
        if (
            existing.get("rack") != rack
            or existing.get("rack_group") != group
            or bookie not in batch.bookie_rows
        ):
            changed = {"rack": rack, "rack_group": group, "updated_at": utc_from_ms(at_ms)}
            batch.bookie_rows[bookie] = {**existing, **changed}
            batch.bookies_changed.add(bookie)


def _snapshot_complete(batch: SinkBatch, row: Row) -> None:
    batch.snapshots_complete.append({**row["payload"], "at_ms": row["at_ms"]})


def _probe_request(batch: SinkBatch, row: Row) -> None:
    batch.probe_requests.append({"ledger_id": row["ledger_id"], "at_ms": row["at_ms"], **row["payload"]})


def _replicas_confirmed(batch: SinkBatch, row: Row) -> None:
    ledger_id, payload, at_ms = row["ledger_id"], row["payload"], row["at_ms"]
    found = (payload.get("outcome") or {}).get("outcome") or {}
    desired = REPLICAS_KINDS.get(str(found.get("result")))
    row_now = batch.ledgers.get(ledger_id) or {}
    for kind in REPLICAS_KINDS.values():
        batch.book.set_ledger_condition(
            kind,
            ledger_id,
            kind is desired,
            at_ms=at_ms,
            bookies=row_now.get("bookies") or [],
            pulsar_topic=row_now.get("pulsar_topic"),
            detail={"round": payload.get("round"), **found},
        )
    refused = found.get("refused") or {}  # alive but refusing bkaudit: BOOKIE_AUTH_REFUSED, at the probe
    for silent in found.get("unresponsive") or []:
        if silent in refused:
            continue
        if (batch.bookie_rows.get(silent) or {}).get("status") in ("WRITABLE", "READ_ONLY"):
            batch.book.set_bookie_condition(
                AlertKind.BOOKIE_UNRESPONSIVE,
                silent,
                True,
                at_ms=at_ms,
                detail={"ledger_id": ledger_id, "rounds": payload.get("round")},
            )


def bookie_answers(
    book: AlertBook, ledger_id: int, answers: Mapping[str, str], refused: Mapping[str, str], *, at_ms: int
) -> None:
    """What one ledger's probe tells of its bookies: an answer resolves ``BOOKIE_UNRESPONSIVE`` and
    ``BOOKIE_AUTH_REFUSED``; a refusal (a live bookie refusing bkaudit's TLS or credentials) resolves the
    first and fires the second at once, with the reason (``refused``) naming the credential.

    Example:
        >>> book = AlertBook("c1")
        >>> bookie_answers(book, 7, {"b1": "tls_refused", "b2": "entry_list"}, {"b1": "expired"}, at_ms=1)
        >>> [(alert.entity, alert.kind.value, alert.detail["reason"]) for alert in book.open.values()]
        [('bookie/b1', 'BOOKIE_AUTH_REFUSED', 'expired')]
    """
    from connectors.bookie.client import REFUSED_KINDS
    from connectors.bookie.ledger_probe import ANSWERED_KINDS

    for bookie, kind in answers.items():
        if kind in ANSWERED_KINDS or kind in REFUSED_KINDS:  # alive, whatever else it said
            book.set_bookie_condition(AlertKind.BOOKIE_UNRESPONSIVE, bookie, False, at_ms=at_ms)
        if kind in ANSWERED_KINDS:
            book.set_bookie_condition(AlertKind.BOOKIE_AUTH_REFUSED, bookie, False, at_ms=at_ms)
        elif kind in REFUSED_KINDS:
            detail = {"answer": kind, "ledger_id": ledger_id, "reason": refused.get(bookie, kind)}
            book.set_bookie_condition(AlertKind.BOOKIE_AUTH_REFUSED, bookie, True, at_ms=at_ms, detail=detail)


def _replicas_cleared(batch: SinkBatch, row: Row) -> None:
    for kind in REPLICAS_KINDS.values():
        batch.book.set_ledger_condition(kind, row["ledger_id"], False, at_ms=row["at_ms"])


def _b64_bytes(text: str | None) -> bytes | None:
    """A dead letter's key or value bytes as the decoder kept them (absent when withheld)."""
    return None if text is None else base64.b64decode(text)


def _dead_letter(batch: SinkBatch, row: Row) -> None:
    payload = row["payload"]
    batch.dead_letter(
        row["at_ms"],
        source=payload.get("source") or "kafka",
        topic=row.get("topic"),
        partition=row.get("partition"),
        offset=row.get("offset"),
        key=_b64_bytes(payload.get("key_b64")),
        value=_b64_bytes(payload.get("value_b64")),
        reason=payload.get("reason"),
    )


_HANDLERS: dict[str, Callable[[SinkBatch, Row], None]] = {
    "ledger_state": _ledger_state,
    "ledger_seen": _ledger_seen,
    "ledger_deleted": _ledger_deleted,
    "ledger_corrupt": _ledger_corrupt,
    "under_replication": _under_replication,
    "under_replication_stuck": _under_replication_stuck,
    **dict.fromkeys(MEMBERSHIP_DECISIONS, _membership),
    "rack_map": _rack_map,
    "snapshot_complete": _snapshot_complete,
    "probe_request": _probe_request,
    "replicas_confirmed": _replicas_confirmed,
    "replicas_cleared": _replicas_cleared,
    "dead_letter": _dead_letter,
}

#: Decisions that need only the ledger's version (not its whole row) before they are applied.
VERSION_ONLY_KINDS = frozenset({"ledger_state", "ledger_seen"})


def apply_decisions(batch: SinkBatch, rows: Iterable[Row]) -> None:
    """Apply decisions (with ``at_ms`` and a parsed ``payload``) in the order given: event-time order."""
    for row in rows:
        handler = _HANDLERS.get(row["kind"])
        if handler is not None:
            handler(batch, row)


# -- evaluation ---------------------------------------------------------------------------------------------
def as_payload(row: Mapping[str, Any]) -> Row:
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


def _adhering_by_screen(batch: SinkBatch, policy: PlacementPolicyConfig) -> set[int]:
    """The closed ledgers to evaluate that the batch screen finds placed well (rack-aware only: the other
    policies are judged per ledger)."""
    if policy.policy != "rackaware" or batch.rack_map_invalid:
        return set()
    candidates = [
        row
        for ledger_id in batch.trigger_ms
        if (row := batch.ledgers.get(ledger_id)) is not None
        and not row.get("deleted")
        and row.get("state") == "CLOSED"
    ]
    if not candidates:
        return set()
    passed = rackaware_screen(
        [[s["ensemble"] for s in row.get("segments") or []] for row in candidates],
        [int(row["write_quorum"]) for row in candidates],
        batch.racks,
        min_racks_per_write_quorum=policy.min_racks_per_write_quorum,
        enforce_min_racks_per_write_quorum=policy.enforce_min_racks_per_write_quorum,
    )
    return {row["ledger_id"] for row, ok in zip(candidates, passed.tolist(), strict=True) if ok}


#: The ledger alerts a new version's evaluation may fire or resolve.
VERSION_ALERT_KINDS = (*PLACEMENT_KINDS, AlertKind.PLACEMENT_ISOLATION_VIOLATED, AlertKind.METADATA_CORRUPT)


def writable_bookies(batch: SinkBatch) -> set[str]:
    """The bookies registered writable as this batch knows them (Pulsar counts those in a group)."""
    return {bookie for bookie, row in batch.bookie_rows.items() if row.get("status") == "WRITABLE"}


def _isolation_of(row: Mapping[str, Any]) -> IsolationConfig:
    return isolation_config_of((e["key"], e["value"]) for e in row.get("custom_metadata") or [])


def _ensembles(row: Mapping[str, Any]) -> list[list[str]]:
    return [list(s["ensemble"]) for s in row.get("segments") or []]


def evaluate_isolation(batch: SinkBatch, ledgers: list[tuple[int, Row, int]]) -> None:
    """``PLACEMENT_ISOLATION_VIOLATED`` of ``(ledger id, row, event time)`` (decodable, not deleted, the
    rack map valid): screened over the batch, the detail built only for the ledgers it flags. A ledger
    whose isolation config does not decode is not judged (as a bad ``pulsar/managed-ledger`` value is no
    topic); an open alert of it resolves, saying why."""
    if not ledgers:
        return
    configs = [_isolation_of(row) for _, row, _ in ledgers]
    writable = writable_bookies(batch)
    flagged = isolation_screen(
        [
            (_ensembles(row), int(row.get("ensemble_size") or 0), c.groups)
            for (_, row, _), c in zip(ledgers, configs, strict=True)
        ],
        batch.groups,
        writable,
    )
    for (ledger_id, row, at_ms), config, violated in zip(ledgers, configs, flagged.tolist(), strict=True):
        detail: dict[str, Any] | None = None
        if violated and config.groups is not None:
            verdict = isolation_verdict(
                _ensembles(row), int(row.get("ensemble_size") or 0), config.groups, batch.groups, writable
            )
            detail = verdict.detail(config.groups)
        elif config.error is not None:
            detail = {"resolution": f"isolation config not judged: {config.error}"}
        batch.book.set_ledger_condition(
            AlertKind.PLACEMENT_ISOLATION_VIOLATED,
            ledger_id,
            violated,
            at_ms=at_ms,
            bookies=row.get("bookies") or [],
            pulsar_topic=row.get("pulsar_topic"),
            detail=detail,
        )


def _settle_versions(batch: SinkBatch, policy: PlacementPolicyConfig) -> None:
    """New versions kept as columns: those a per-ledger look could change an alert for (a closed ledger
    the screen does not pass, a ledger with an open placement or corrupt alert) become rows; the rest
    adhere, and their ``placement`` column is set here (MEETS_STRICT when closed, else null)."""
    versions = batch.versions
    if versions is None or not versions.num_rows:
        return
    alerted = [  # a METADATA_CORRUPT may be a topic's (``topic/<name>``): ledgers' only
        int(e[len("ledger/") :])
        for e, k in batch.book.open
        if k in VERSION_ALERT_KINDS and e.startswith("ledger/")
    ]
    ids = versions.column("ledger_id").to_numpy()
    adhering = adhering_versions(versions, batch.racks, policy)
    violating = isolation_violating_versions(versions, batch.groups, writable_bookies(batch))
    batch.versions_to_rows(~adhering | violating | np.isin(ids, alerted))
    versions = batch.versions
    assert versions is not None
    closed = pc.equal(versions.column("state"), "CLOSED")
    placement = pc.if_else(closed, pa.scalar("MEETS_STRICT"), pa.scalar(None, pa.string()))
    batch.versions = versions.set_column(versions.schema.get_field_index("placement"), "placement", placement)


def evaluate_ledgers(batch: SinkBatch, policy: PlacementPolicyConfig) -> None:
    """Placement of every affected ledger (the lost-bookie rule is the loss owner's): alerts and the
    ``placement`` column; a deleted ledger's alerts resolve, an undecodable one has no placement. New
    versions kept as columns are settled in bulk first; ledgers the batch screen passes adhere; the others
    are judged one by one (which write sets fail)."""
    _settle_versions(batch, policy)
    book = batch.book
    adhering = _adhering_by_screen(batch, policy)
    isolated: list[tuple[int, Row, int]] = []
    for ledger_id in sorted(batch.trigger_ms):
        row_now = batch.ledgers.get(ledger_id)
        if row_now is None:
            continue
        at_ms = batch.trigger_ms[ledger_id]
        if row_now.get("deleted"):
            book.resolve_entity(f"ledger/{ledger_id}", at_ms, "ledger deleted")
            continue
        if not row_now.get("state"):  # undecodable: nothing else can be evaluated
            for kind in (*PLACEMENT_KINDS, AlertKind.PLACEMENT_ISOLATION_VIOLATED):
                book.set_ledger_condition(kind, ledger_id, False, at_ms=at_ms)
            continue
        if batch.rack_map_invalid:
            # Unknown: no placement alert fires or resolves; a closed ledger's column is null until the next
            # valid map re-checks it.
            if row_now.get("placement") is not None and row_now.get("state") == "CLOSED":
                batch.ledgers[ledger_id] = {**row_now, "placement": None}
                batch.changed_ledgers.add(ledger_id)
            continue
        isolated.append((ledger_id, row_now, at_ms))
        payload = as_payload(row_now)
        placement = None if ledger_id in adhering else placement_condition(payload, batch.racks, policy)
        for kind in PLACEMENT_KINDS:
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
            batch.ledgers[ledger_id] = {**row_now, "placement": new_placement}
            batch.changed_ledgers.add(ledger_id)
    evaluate_isolation(batch, isolated)


def rack_map_is_invalid(book: AlertBook) -> bool:
    """Placement is unknown while the current rack map is invalid (the open alert is that state)."""
    return book.is_open(RACK_MAP_ENTITY, AlertKind.RACK_MAP_INVALID)
