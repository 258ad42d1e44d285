"""The ``placement_plans`` table: a BP-54 relocation plan for every badly placed segment of a ledger with an
open ``PLACEMENT_NOT_ADHERING`` alert, kept current by the job.

- :func:`plan_rows` is the one computation of the table's rows, from the alerted ledgers, the bookies (rack
  map, status, lost), the open ``BOOKIE_UNRESPONSIVE`` alerts and the ledger counts per bookie, with
  :func:`~core.domain.rules.relocation.plan_relocation` (each plan verified by the placement rule). The
  job's :class:`PlacementPlanner` and :meth:`connectors.delta.queries.Lakehouse.placement_plans` (on a
  lakehouse the job has not written the table in yet) both use it.
- A target can take writes now (:func:`plan_targets`): registered ``WRITABLE``, not lost, without an open
  ``BOOKIE_UNRESPONSIVE`` alert, outside the ensemble. A member that is lost, ``GONE`` or not in the
  bookies table at all (:func:`members_to_replace`) is moved first, within the move budget.
- Each move carries ``bytes_to_move``: what it copies to its target, estimated from the ledger's length
  (:func:`~core.domain.rules.relocation.moved_bytes`); null for a ledger that is not closed.
- :class:`PlacementPlanner` runs in the job's fold thread after every ledger fold (and when the job stops):
  it rewrites the table when the alerted ledgers, their metadata versions, the bookies table or the
  unresponsive bookies changed; otherwise it reads two small tables and writes nothing. A plan leaves the
  table with its alert.

Example:
    >>> from core.domain.rules.evaluate import PlacementPolicyConfig
    >>> from datetime import UTC
    >>> at = datetime(2026, 1, 1, tzinfo=UTC)
    >>> ledger = {"ledger_id": 7, "cluster": "c", "write_quorum": 2, "pulsar_topic": None, "updated_at": at,
    ...           "state": "CLOSED", "last_entry_id": 9, "length": 1000,
    ...           "segments": [{"first_entry_id": 0, "ensemble": ["b1", "b2"]}]}
    >>> bookies = [{"bookie_id": b, "rack": r, "status": "WRITABLE", "lost": False, "updated_at": None}
    ...            for b, r in (("b1", "/r1"), ("b2", "/r1"), ("b3", "/r2"))]
    >>> row = plan_rows([ledger], bookies, {}, PlacementPolicyConfig()).to_pylist()[0]
    >>> row["from_bookie"], row["to_bookie"], row["to_rack"], row["planned_ensemble"], row["as_of"].year
    ('b1', 'b3', '/r2', ['b3', 'b2'], 2026)
    >>> row["bytes_to_move"]  # E = WQ = 2: position 0 holds every entry
    1000
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from connectors.delta.ledger_log import LedgerLog
from connectors.delta.scan import scan
from connectors.delta.tables import PLACEMENT_PLANS, table_path
from core.domain.alerts import AlertKind
from core.domain.rules.evaluate import PlacementPolicyConfig
from core.domain.rules.placement import PlacementAdherence, check_placement
from core.domain.rules.relocation import moved_bytes, plan_relocation

logger = logging.getLogger(__name__)

#: The ``ledgers`` columns a plan reads.
LEDGER_COLUMNS = (
    "ledger_id",
    "cluster",
    "state",
    "write_quorum",
    "last_entry_id",
    "length",
    "segments",
    "pulsar_topic",
    "updated_at",
)
#: The ``bookies`` columns a plan depends on.
BOOKIE_COLUMNS = ["bookie_id", "rack", "status", "lost", "updated_at"]
#: The ``open_alerts`` rows a plan depends on besides its ledger's: of this kind, with these columns.
UNRESPONSIVE = AlertKind.BOOKIE_UNRESPONSIVE.value
ALERT_COLUMNS = ["kind", "bookies", "detected_at"]


def unresponsive_bookies(alerts: Iterable[Mapping[str, Any]]) -> dict[str, datetime | None]:
    """The bookies named by open ``BOOKIE_UNRESPONSIVE`` alerts among ``alerts`` (rows with
    :data:`ALERT_COLUMNS`), each with when its alert was detected (other kinds are ignored).

    Example:
        >>> unresponsive_bookies([{"kind": "BOOKIE_UNRESPONSIVE", "bookies": ["b2"], "detected_at": None},
        ...                       {"kind": "BOOKIE_LOST", "bookies": ["b3"], "detected_at": None}])
        {'b2': None}
    """
    return {
        bookie: alert.get("detected_at")
        for alert in alerts
        if alert["kind"] == UNRESPONSIVE
        for bookie in alert["bookies"] or []
    }


def plan_targets(
    bookies: Iterable[Mapping[str, Any]],
    ledger_counts: Mapping[str, int],
    unresponsive: Collection[str] = (),
) -> dict[str, int]:
    """The bookies a replica may move to, each with the ledgers it holds: those that can take writes now
    (registered ``WRITABLE``, not lost, not ``unresponsive``).

    Example:
        >>> plan_targets([{"bookie_id": "b1", "status": "WRITABLE", "lost": False},
        ...               {"bookie_id": "b2", "status": "READ_ONLY", "lost": False},
        ...               {"bookie_id": "b3", "status": "WRITABLE", "lost": True},
        ...               {"bookie_id": "b4", "status": "WRITABLE", "lost": False}], {"b1": 4}, {"b4"})
        {'b1': 4}
    """
    return {
        b["bookie_id"]: int(ledger_counts.get(b["bookie_id"], 0))
        for b in bookies
        if b["status"] == "WRITABLE" and not b["lost"] and b["bookie_id"] not in unresponsive
    }


def members_to_replace(ensemble: Iterable[str], bookies: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The members of ``ensemble`` a plan moves first (``bookies``: rows by id): lost, ``GONE`` (not
    registered now) or unknown to the bookies table (never seen registered).

    Example:
        >>> members_to_replace(["b1", "b2", "b3", "b4"], {
        ...     "b1": {"status": "WRITABLE", "lost": False}, "b2": {"status": "GONE", "lost": True},
        ...     "b3": {"status": "READ_ONLY", "lost": False}})
        ['b2', 'b4']
    """
    return [
        bookie
        for bookie in ensemble
        if (row := bookies.get(bookie)) is None or row["lost"] or row["status"] == "GONE"
    ]


def plan_rows(
    ledgers: Iterable[Mapping[str, Any]],
    bookies: Iterable[Mapping[str, Any]],
    ledger_counts: Mapping[str, int],
    config: PlacementPolicyConfig,
    alerts: Iterable[Mapping[str, Any]] = (),
) -> pa.Table:
    """The ``placement_plans`` rows of ``ledgers`` (rows with :data:`LEDGER_COLUMNS`): one per move of the
    plan of every segment that fails the policy, one with the reason where a segment has no plan.
    ``bookies`` are the bookies table's rows (:data:`BOOKIE_COLUMNS`), ``alerts`` the open alerts that
    rule targets out (:func:`unresponsive_bookies`). Targets are spread by ``ledger_counts`` (raised as
    plans are made). A row's ``as_of`` is the event time of the newest input of its plan (the ledger's
    version, the last change of the bookies, the newest unresponsive alert), so the same state gives the
    same rows, whenever and however often it is computed. See the module docstring for an example."""
    bookies = list(bookies)
    unresponsive = unresponsive_bookies(alerts)
    context = _Context(
        racks={b["bookie_id"]: b["rack"] for b in bookies},
        by_id={b["bookie_id"]: b for b in bookies},
        targets=plan_targets(bookies, ledger_counts, unresponsive),
    )
    bookies_as_of = _newest([*(b.get("updated_at") for b in bookies), *unresponsive.values()])
    rows = [
        {**row, "policy": config.policy, "as_of": _newest((ledger.get("updated_at"), bookies_as_of))}
        for ledger in ledgers
        for row in _segment_rows(ledger, context, config)
    ]
    return pa.Table.from_pylist(rows, schema=PLACEMENT_PLANS.schema)


@dataclass(frozen=True)
class _Context:
    """What every segment's plan reads: the rack map, the bookies by id, the targets with their counts."""

    racks: dict[str, str | None]
    by_id: dict[str, Mapping[str, Any]]
    targets: dict[str, int]


def _newest(times: Iterable[datetime | None]) -> datetime | None:
    """The latest of ``times`` that are known (None when none is).

    Example:
        >>> from datetime import UTC
        >>> _newest([None, datetime(2026, 1, 2, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC)]).day
        2
    """
    known = [t for t in times if t is not None]
    return max(known) if known else None


def _segment_rows(
    ledger: Mapping[str, Any], context: _Context, config: PlacementPolicyConfig
) -> Iterator[dict[str, Any]]:
    options = config.options()
    wq = int(ledger["write_quorum"])
    segments = ledger["segments"] or []
    for index, segment in enumerate(segments):
        ensemble = list(segment["ensemble"])
        verdict = check_placement(config.policy, ensemble, wq, wq, context.racks, **options)
        if verdict.adherence is not PlacementAdherence.FAIL:
            continue
        plan = plan_relocation(
            config.policy,
            ensemble,
            wq,
            context.racks,
            context.targets,
            replace_first=members_to_replace(ensemble, context.by_id),
            **options,
        )
        common = {
            "cluster": ledger.get("cluster"),
            "ledger_id": ledger["ledger_id"],
            "segment": index,
            "first_entry_id": segment["first_entry_id"],
            "ensemble": ensemble,
            "planned_ensemble": list(plan.ensemble) if plan.valid else None,
            "reason": plan.reason,
            "pulsar_topic": ledger.get("pulsar_topic"),
        }
        if not plan.moves:
            yield common
        for order, move in enumerate(plan.moves):
            yield {
                **common,
                "move": order,
                "position": move.position,
                "from_bookie": move.from_bookie,
                "to_bookie": move.to_bookie,
                "to_rack": context.racks.get(move.to_bookie),
                "bytes_to_move": _bytes_to_move(ledger, segments, index, move.position),
            }


def _bytes_to_move(
    ledger: Mapping[str, Any], segments: list[Mapping[str, Any]], segment: int, position: int
) -> int | None:
    """:func:`~core.domain.rules.relocation.moved_bytes` of one move; None unless the ledger is closed
    (its length and last entry are known only then)."""
    if ledger.get("state") != "CLOSED" or ledger.get("length") is None or ledger.get("last_entry_id") is None:
        return None
    return moved_bytes(
        int(ledger["length"]),
        int(ledger["last_entry_id"]),
        [int(s["first_entry_id"]) for s in segments],
        segment,
        position,
        write_quorum=int(ledger["write_quorum"]),
        ensemble_size=len(segments[segment]["ensemble"]),
    )


class PlacementPlanner:
    """Keeps ``placement_plans`` current for the job: :meth:`refresh` after every fold of ``ledger_log``.

    Example:
        >>> import tempfile
        >>> from connectors.delta.tables import ensure_tables, read_table
        >>> root = tempfile.mkdtemp(); _ = ensure_tables(root)
        >>> log = LedgerLog(root, "doc"); log.open(0)
        >>> planner = PlacementPlanner(root, PlacementPolicyConfig(), log)
        >>> planner.refresh(), planner.refresh()  # written once; unchanged inputs write nothing
        (True, False)
        >>> read_table(root, "placement_plans").num_rows
        0
    """

    def __init__(self, root: str | Path, config: PlacementPolicyConfig, ledger_log: LedgerLog) -> None:
        self.root = str(root)
        self.config = config
        self.ledger_log = ledger_log
        self._written_for: str | None = None  # the inputs' fingerprint the table was last written for

    def refresh(self) -> bool:
        """Rewrite the table when its inputs changed since the last write; returns whether it wrote (never
        before the job has opened its ledger state: the table keeps the last job's plans until then)."""
        if not self.ledger_log.opened:
            return False
        alerts = self._open_alerts()
        alerted = _alerted_ledgers(alerts)
        unresponsive = alerts.filter(pc.equal(alerts.column("kind"), UNRESPONSIVE)).select(ALERT_COLUMNS)
        ledgers = self.ledger_log.take(alerted, [*LEDGER_COLUMNS, "mzxid"])
        bookies = DeltaTable(table_path(self.root, "bookies"))
        fingerprint = _fingerprint(ledgers, bookies.version(), unresponsive, self.config)
        if fingerprint == self._written_for:
            return False
        rows = plan_rows(
            ledgers.sort_by("ledger_id").to_pylist(),
            scan(bookies, columns=BOOKIE_COLUMNS).to_pylist(),
            self._ledger_counts(),
            self.config,
            unresponsive.to_pylist(),
        )
        write_deltalake(table_path(self.root, "placement_plans"), rows, mode="overwrite")
        self._written_for = fingerprint
        logger.debug("placement_plans: %d rows for %d ledgers", rows.num_rows, ledgers.num_rows)
        return True

    def _open_alerts(self) -> pa.Table:
        """The open alerts the plans read: the ledgers' placement alerts and the unresponsive bookies'."""
        open_alerts = DeltaTable(table_path(self.root, "open_alerts"))
        kinds = [("kind", "in", [AlertKind.PLACEMENT_NOT_ADHERING.value, UNRESPONSIVE])]
        return scan(open_alerts, kinds, ["ledger_id", *ALERT_COLUMNS])

    def _ledger_counts(self) -> dict[str, int]:
        """Live ledgers per bookie, from the job's current ledger rows, a few buckets at a time."""
        totals: dict[str, int] = {}
        for current in self.ledger_log.current_chunks(["ledger_id", "bookies", "deleted"]):
            live = current.filter(pc.invert(pc.fill_null(current.column("deleted"), False)))
            counts = pc.value_counts(pc.list_flatten(live.column("bookies")))
            for bookie, count in zip(
                counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True
            ):
                totals[bookie] = totals.get(bookie, 0) + count
        return totals


def _alerted_ledgers(alerts: pa.Table) -> np.ndarray:
    """The distinct ledger ids of the open ``PLACEMENT_NOT_ADHERING`` alerts among ``alerts``."""
    placement = alerts.filter(pc.equal(alerts.column("kind"), AlertKind.PLACEMENT_NOT_ADHERING.value))
    return np.unique(placement.column("ledger_id").drop_null().to_numpy())


def _fingerprint(
    ledgers: pa.Table, bookies_version: int, unresponsive: pa.Table, config: PlacementPolicyConfig
) -> str:
    """What the plans depend on besides the ledger counts: the alerted ledgers' versions, the bookies, the
    unresponsive bookies, the policy."""
    ordered = ledgers.sort_by("ledger_id")
    silent = sorted(unresponsive_bookies(unresponsive.to_pylist()).items(), key=lambda item: item[0])
    digest = hashlib.sha256(repr((bookies_version, silent, config)).encode())
    digest.update(ordered.column("ledger_id").to_numpy().tobytes())
    digest.update(pc.fill_null(ordered.column("mzxid"), -1).to_numpy().tobytes())
    return digest.hexdigest()
