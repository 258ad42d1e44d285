"""Taking bookies away: what would happen (``what-if``) and what still holds a bookie back (``drain``).

The answers are assembled here from rows the :class:`~connectors.delta.queries.Lakehouse` read; the grading
is the lost-bookie rule itself (:func:`core.domain.rules.lost_ledgers.what_if_verdicts`), so a what-if
answers exactly what the job would alert if those bookies were lost now.

Example:
    >>> import tempfile
    >>> from connectors.delta.queries import Lakehouse, write_example_lakehouse
    >>> answer = Lakehouse(write_example_lakehouse(tempfile.mkdtemp())).what_if(["bookie-2"])
    >>> answer.safe, answer.unavailable, answer.by_verdict["UNRECOVERABLE"]
    (False, ['bookie-1'], 1)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.domain.rules.lost_ledgers import WHAT_IF_VERDICTS, what_if_verdicts
from core.errors import InvalidArgumentError

#: Membership statuses of a bookie that holds no readable copy now: deregistered (lost or not yet), or
#: named by ledger metadata without ever having registered.
UNAVAILABLE_STATUSES = ("GONE", "UNKNOWN")
#: Why a ledger still names a bookie that is being drained, most pressing first.
DRAIN_REASONS = ("unrecoverable", "stalled", "stuck", "open", "marked", "not_marked")


@dataclass(frozen=True)
class WhatIf:
    """The answer to "what if these bookies went away now?".

    ``down``: the bookies asked about; ``unavailable``: other bookies already gone (their copies count as
    lost too); ``safe``: no ledger would lose every copy of an entry; ``by_verdict``: ledgers per verdict
    (every verdict present); ``ledgers``: one row per ledger naming a ``down`` bookie, worst first.
    """

    down: list[str]
    unavailable: list[str]
    safe: bool
    by_verdict: dict[str, int]
    ledgers: pa.Table

    def to_document(self) -> dict[str, Any]:
        """The answer as one JSON-ready object (``bkaudit query what-if --format json``).

        Example:
            >>> import pyarrow as pa
            >>> answer = WhatIf(["b1"], [], True, {"UNRECOVERABLE": 0}, pa.table({"ledger_id": [1]}))
            >>> answer.to_document()["ledgers"]
            [{'ledger_id': 1}]
        """
        return {
            "down": self.down,
            "unavailable": self.unavailable,
            "safe": self.safe,
            "by_verdict": self.by_verdict,
            "ledgers": self.ledgers.to_pylist(),
        }


def checked_bookies(asked: Sequence[str], membership: pa.Table, option: str) -> list[str]:
    """The asked bookie ids, sorted and once each; an id neither registered nor named by any ledger is bad
    input (a typo must not answer "safe").

    Example:
        >>> membership = pa.table({"bookie_id": ["b1", "b2"], "status": ["WRITABLE", "GONE"]})
        >>> checked_bookies(["b2", "b1", "b2"], membership, "--down")
        ['b1', 'b2']
        >>> try:
        ...     checked_bookies(["b9"], membership, "--down")
        ... except InvalidArgumentError as err:
        ...     print(err)
        --down: unknown bookie b9 (known: b1, b2)
    """
    wanted = sorted(set(asked))
    if not wanted:
        raise InvalidArgumentError(f"{option}: name at least one bookie")
    known = membership.column("bookie_id").to_pylist()
    unknown = [bookie for bookie in wanted if bookie not in set(known)]
    if unknown:
        shown = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
        plural = "s" if len(unknown) > 1 else ""
        raise InvalidArgumentError(
            f"{option}: unknown bookie{plural} {', '.join(unknown)} (known: {shown or 'none'})"
        )
    return wanted


def membership_with(registered: pa.Table, ledgers: pa.Table) -> pa.Table:
    """The ``bookies`` rows (``bookie_id``, ``status``) and, as ``UNKNOWN``, the bookies ``ledgers`` name
    (their ``segments`` or ``bookies`` column) that have none: named, never registered.

    Example:
        >>> registered = pa.table({"bookie_id": ["b1"], "status": ["WRITABLE"]})
        >>> ledgers = pa.table({"bookies": [["b1", "b7"]]})
        >>> membership_with(registered, ledgers).to_pylist()[1]
        {'bookie_id': 'b7', 'status': 'UNKNOWN'}
    """
    if "segments" in ledgers.column_names:
        members = pc.list_flatten(pc.struct_field(pc.list_flatten(ledgers.column("segments")), "ensemble"))
    else:
        members = pc.list_flatten(ledgers.column("bookies"))
    named = set(pc.unique(members).drop_null().to_pylist()) if len(members) else set()
    extra = sorted(named - set(registered.column("bookie_id").to_pylist()))
    unknown = pa.table(
        {"bookie_id": pa.array(extra, pa.string()), "status": pa.array(["UNKNOWN"] * len(extra), pa.string())}
    )
    return pa.concat_tables([registered.select(["bookie_id", "status"]).cast(unknown.schema), unknown])


def unavailable_bookies(membership: pa.Table, besides: Sequence[str]) -> list[str]:
    """Bookies without a readable copy now (:data:`UNAVAILABLE_STATUSES`), other than ``besides``."""
    gone = pc.is_in(membership.column("status"), value_set=pa.array(UNAVAILABLE_STATUSES))
    return sorted(set(membership.filter(gone).column("bookie_id").to_pylist()) - set(besides))


def what_if_answer(down: list[str], unavailable: list[str], ledgers: pa.Table) -> WhatIf:
    """Grade ``ledgers`` (the rule's input columns plus ``topic``; each names a ``down`` bookie) with
    ``down`` and ``unavailable`` gone."""
    graded = what_if_verdicts(ledgers, set(down) | set(unavailable))
    rank = pc.index_in(graded.column("verdict"), value_set=pa.array(WHAT_IF_VERDICTS))
    rows = pa.table(
        {
            "ledger_id": graded.column("ledger_id"),
            "topic": ledgers.column("topic"),
            "verdict": graded.column("verdict"),
            "state": ledgers.column("state"),
            "lost_bookies": graded.column("lost_bookies"),
            "fewest_copies_left": graded.column("fewest_copies_left"),
            "write_quorum": ledgers.column("write_quorum"),
            "ack_quorum": ledgers.column("ack_quorum"),
            "unrecoverable_entries_sample": graded.column("unrecoverable_entries_sample"),
            "_rank": rank,
        }
    )
    rows = rows.sort_by([("_rank", "ascending"), ("ledger_id", "ascending")]).drop_columns(["_rank"])
    counts = _counts(rows.column("verdict"))
    by_verdict = {verdict: counts.get(verdict, 0) for verdict in WHAT_IF_VERDICTS}
    return WhatIf(down, unavailable, by_verdict["UNRECOVERABLE"] == 0, by_verdict, rows)


def drain_reasons(rows: pa.Table) -> pa.Table:
    """Add ``reason`` (the most pressing of :data:`DRAIN_REASONS`) and ``reasons`` (all that hold) to
    ledger rows with ``state``, ``under_replication_marked`` and ``open_alerts``.

    ``unrecoverable``: an entry has no copy on any other bookie (nothing can move it); ``stalled``: a
    ReplicationWorker has held its lock for longer than the grace (``REPLICATION_STALLED``); ``stuck``: marked
    for longer than the grace (``UNDER_REPLICATION_STUCK``); ``open``: the writer still owns the ledger (its
    last segment moves only once it is closed or recovered); ``marked``: waiting for a ReplicationWorker;
    ``not_marked``: BookKeeper has not asked for a move (the bookie is still registered, or the Auditor has
    not run).

    Example:
        >>> rows = pa.Table.from_pylist([
        ...     {"state": "CLOSED", "under_replication_marked": True, "open_alerts": []},
        ...     {"state": "OPEN", "under_replication_marked": False, "open_alerts": []}])
        >>> drain_reasons(rows).select(["reason", "reasons"]).to_pylist()
        [{'reason': 'marked', 'reasons': ['marked']}, {'reason': 'open', 'reasons': ['open', 'not_marked']}]
    """
    alerts = rows.column("open_alerts").combine_chunks()
    marked = pc.fill_null(rows.column("under_replication_marked"), False).to_numpy(zero_copy_only=False)
    flags = np.column_stack(
        [
            _names_alert(alerts, "LEDGER_UNRECOVERABLE"),
            _names_alert(alerts, "REPLICATION_STALLED"),
            _names_alert(alerts, "UNDER_REPLICATION_STUCK"),
            pc.fill_null(pc.not_equal(rows.column("state"), "CLOSED"), True).to_numpy(zero_copy_only=False),
            marked,
            ~marked,
        ]
    ).reshape(rows.num_rows, len(DRAIN_REASONS))
    names = pa.array(DRAIN_REASONS, pa.string())
    _, reason_index = np.nonzero(flags)
    offsets = np.concatenate(([0], np.cumsum(flags.sum(axis=1)))).astype(np.int32)
    reasons = pa.ListArray.from_arrays(pa.array(offsets), names.take(pa.array(reason_index, pa.int64())))
    first = names.take(
        pa.array(np.argmax(flags, axis=1), pa.int64())
    )  # "marked" or "not_marked" always holds
    return rows.append_column("reason", first).append_column("reasons", reasons)


def drain_answer(rows: pa.Table) -> pa.Table:
    """Ledger rows with their drain reasons (:func:`drain_reasons`), most pressing first, then by id."""
    rows = drain_reasons(rows)
    rank = pc.index_in(rows.column("reason"), value_set=pa.array(DRAIN_REASONS))
    keys = pa.table({"rank": rank, "ledger_id": rows.column("ledger_id")})
    order = pc.sort_indices(keys, sort_keys=[("rank", "ascending"), ("ledger_id", "ascending")])
    first = ["ledger_id", "reason", "reasons"]
    return rows.take(order).select([*first, *(c for c in rows.column_names if c not in first)])


def _names_alert(alerts: pa.Array, kind: str) -> np.ndarray:
    """Per row of a list-of-kinds column, whether it holds ``kind``."""
    hits = pc.fill_null(pc.equal(pc.list_flatten(alerts), kind), False).to_numpy(zero_copy_only=False)
    owner = np.asarray(pc.list_parent_indices(alerts), dtype=np.int64)
    return np.bincount(owner[hits], minlength=len(alerts)) > 0


def _counts(values: pa.ChunkedArray) -> Mapping[str, int]:
    return {row["values"]: row["counts"] for row in pc.value_counts(values).to_pylist()}
