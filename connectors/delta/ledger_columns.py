"""The ledger state's hot columns: what the job's hot paths read per ledger, in ~19 bytes, without its rows.

:class:`~connectors.delta.ledger_log.LedgerLog` keeps ``ledgers`` as of the fold watermark in memory as
these columns only; the whole rows stay in Delta and are read by bucket when a step needs them. Per ledger,
sorted by id: the id and ``mzxid`` (int64; -1 for null), and one byte each for ``state`` (null, OPEN,
IN_RECOVERY, CLOSED), ``deleted`` and ``under_replication_marked`` (null, false, true). The rare ledgers
with another value in those, or a value in the other carried columns (``under_replication_replicas``,
``under_replication_ctime_ms``: set only while an under-replication mark exists), keep them in a small
table beside (``sparse``). Every one of :data:`HOT_COLUMNS` is rebuilt exactly from them
(:meth:`LedgerColumns.rows`).

Example:
    >>> rows = pa.table({"ledger_id": [5, 2], "mzxid": [9, None], "state": ["CLOSED", "OPEN"],
    ...                  "deleted": [False, True]})
    >>> columns = LedgerColumns.of(rows)
    >>> columns.ids.tolist(), columns.mzxid.tolist(), columns.gone().tolist(), columns.closed().tolist()
    ([2, 5], [-1, 9], [True, False], [False, True])
    >>> columns.rows(np.array([5]), ["ledger_id", "state", "mzxid"]).to_pylist()
    [{'ledger_id': 5, 'state': 'CLOSED', 'mzxid': 9}]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["HOT_COLUMNS", "LedgerColumns"]

_NO_VERSION = -1
#: The values of each coded column, by code (code 0: null; a value not listed goes to ``sparse``).
CODES: dict[str, tuple[object, ...]] = {
    "state": (None, "OPEN", "IN_RECOVERY", "CLOSED"),
    "deleted": (None, False, True),
    "under_replication_marked": (None, False, True),
}
_TYPES = {"state": pa.string(), "deleted": pa.bool_(), "under_replication_marked": pa.bool_()}
#: Columns kept only for the ledgers where they are set (an under-replication mark's).
SPARSE_COLUMNS = ("under_replication_replicas", "under_replication_ctime_ms")
#: The ``ledgers`` columns these columns rebuild: what the hot paths read without a Delta read.
HOT_COLUMNS = ("ledger_id", "mzxid", *CODES, *SPARSE_COLUMNS)
_OTHER = 255  # the code of a value kept in ``sparse``


def _schema() -> pa.Schema:
    from connectors.delta.tables import LEDGERS

    return pa.schema([LEDGERS.schema.field(name) for name in ("ledger_id", *CODES, *SPARSE_COLUMNS)])


def _encode(values: pa.ChunkedArray | pa.Array, name: str) -> np.ndarray:
    """``values`` as codes of :data:`CODES` ``[name]`` (255: another value)."""
    known = CODES[name]
    codes = np.full(len(values), _OTHER, np.uint8)
    codes[pc.is_null(values).to_numpy(zero_copy_only=False)] = 0
    for code, value in enumerate(known[1:], start=1):
        hit = pc.fill_null(pc.equal(values, pa.scalar(value, _TYPES[name])), False)
        codes[hit.to_numpy(zero_copy_only=False)] = code
    return codes


def _column(rows: pa.Table, name: str) -> pa.ChunkedArray:
    from connectors.delta.tables import LEDGERS

    if name in rows.column_names:
        return rows.column(name)
    return pa.chunked_array([pa.nulls(rows.num_rows, LEDGERS.schema.field(name).type)])


@dataclass(frozen=True)
class LedgerColumns:
    """The hot columns of a set of ledgers (one entry per ledger, sorted by id)."""

    ids: np.ndarray
    mzxid: np.ndarray
    state: np.ndarray
    deleted: np.ndarray
    marked: np.ndarray
    sparse: pa.Table  # ledger_id, the coded columns (set where the code is 255) and SPARSE_COLUMNS

    @classmethod
    def empty(cls) -> LedgerColumns:
        """No ledger."""
        none = np.empty(0, np.uint8)
        return cls(np.empty(0, np.int64), np.empty(0, np.int64), none, none, none, _schema().empty_table())

    @classmethod
    def of(cls, rows: pa.Table) -> LedgerColumns:
        """The columns of ``rows`` (``ledgers`` rows, one per ledger, any order, any of its columns with
        ``ledger_id``; those absent are null)."""
        if not rows.num_rows:
            return cls.empty()
        ids = rows.column("ledger_id").to_numpy()
        order = np.argsort(ids, kind="stable")
        codes = {name: _encode(_column(rows, name), name) for name in CODES}
        rare = np.zeros(rows.num_rows, bool)
        for code in codes.values():
            rare |= code == _OTHER
        for name in SPARSE_COLUMNS:
            rare |= pc.is_valid(_column(rows, name)).to_numpy(zero_copy_only=False)
        picked = order[rare[order]]
        sparse_columns = [_column(rows, name).take(pa.array(picked)) for name in _schema().names]
        return cls(
            ids=ids[order],
            mzxid=pc.fill_null(rows.column("mzxid"), _NO_VERSION).to_numpy()[order]
            if "mzxid" in rows.column_names
            else np.full(rows.num_rows, _NO_VERSION, np.int64),
            state=codes["state"][order],
            deleted=codes["deleted"][order],
            marked=codes["under_replication_marked"][order],
            sparse=pa.Table.from_arrays(sparse_columns, schema=_schema()),
        )

    @classmethod
    def concat(cls, parts: Sequence[LedgerColumns]) -> LedgerColumns:
        """The columns of ``parts`` together (each ledger in one part only), sorted by id.

        Example:
            >>> one = LedgerColumns.of(pa.table({"ledger_id": [3], "mzxid": [1]}))
            >>> two = LedgerColumns.of(pa.table({"ledger_id": [1], "mzxid": [2]}))
            >>> LedgerColumns.concat([one, two]).ids.tolist()
            [1, 3]
        """
        if not parts:
            return cls.empty()
        ids = np.concatenate([part.ids for part in parts])
        order = np.argsort(ids, kind="stable")
        arrays = [np.concatenate([getattr(part, name) for part in parts])[order] for name in _ARRAYS]
        sparse = pa.concat_tables([part.sparse for part in parts])
        return _built(arrays, sparse)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in _ARRAYS) + self.sparse.nbytes

    def positions(self, ledger_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where each of ``ledger_ids`` sits, and whether it is here."""
        if not len(self.ids) or not len(ledger_ids):
            return np.zeros(len(ledger_ids), np.int64), np.zeros(len(ledger_ids), bool)
        at = np.searchsorted(self.ids, ledger_ids).clip(max=len(self.ids) - 1)
        return at, self.ids[at] == ledger_ids

    def gone(self) -> np.ndarray:
        """Per ledger: deleted."""
        return self.deleted == CODES["deleted"].index(True)

    def gone_at(self, at: np.ndarray) -> np.ndarray:
        """Whether the ledgers at positions ``at`` are deleted."""
        return self.deleted[at] == CODES["deleted"].index(True)

    def closed(self) -> np.ndarray:
        """Per ledger: CLOSED and not deleted."""
        return (self.state == CODES["state"].index("CLOSED")) & ~self.gone()

    def checked(self) -> np.ndarray:
        """Per ledger: CLOSED or OPEN and not deleted (what the replicas check walks)."""
        walked = (self.state == CODES["state"].index("CLOSED")) | (self.state == CODES["state"].index("OPEN"))
        return walked & ~self.gone()

    def merged(self, latest: pa.Table) -> LedgerColumns:
        """These columns with ``latest``'s rows (one per ledger) in place of their ledgers' or added.

        Example:
            >>> base = LedgerColumns.of(pa.table({"ledger_id": [1, 4], "mzxid": [1, 1]}))
            >>> merged = base.merged(pa.table({"ledger_id": [4, 2], "mzxid": [7, 7]}))
            >>> merged.ids.tolist(), merged.mzxid.tolist()
            ([1, 2, 4], [1, 7, 7])
        """
        new = LedgerColumns.of(latest)
        if not len(new):
            return self
        at, known = self.positions(new.ids)
        arrays = []
        for name in _ARRAYS:
            replaced = getattr(self, name).copy()
            replaced[at[known]] = getattr(new, name)[known]
            arrays.append(
                np.insert(replaced, np.searchsorted(self.ids, new.ids[~known]), getattr(new, name)[~known])
            )
        kept = self.sparse.filter(pa.array(~np.isin(self.sparse.column("ledger_id").to_numpy(), new.ids)))
        sparse = pa.concat_tables([kept, new.sparse])
        return _built(arrays, sparse)

    def rows(self, ledger_ids: np.ndarray, columns: Sequence[str]) -> pa.Table:
        """The ``columns`` (of :data:`HOT_COLUMNS`) of the ledgers ``ledger_ids`` (each one of these), in
        their order."""
        at, _ = self.positions(np.asarray(ledger_ids, np.int64))
        in_sparse, sparse_at = _sparse_positions(self.sparse, self.ids[at])
        taken = pa.array(sparse_at[in_sparse])
        arrays = []
        for name in columns:
            arrays.append(self._column(name, at, in_sparse, taken))
        from connectors.delta.tables import LEDGERS

        return pa.Table.from_arrays(arrays, schema=pa.schema([LEDGERS.schema.field(n) for n in columns]))

    def _column(self, name: str, at: np.ndarray, in_sparse: np.ndarray, taken: pa.Array) -> pa.Array:
        from connectors.delta.tables import LEDGERS

        kind = LEDGERS.schema.field(name).type
        if name == "ledger_id":
            return pa.array(self.ids[at], kind)
        if name == "mzxid":
            values = self.mzxid[at]
            return pa.array(values, kind, mask=values == _NO_VERSION)
        if name in CODES:
            codes = {"state": self.state, "deleted": self.deleted, "under_replication_marked": self.marked}[
                name
            ]
            dictionary = pa.array(list(CODES[name]) + [None] * (_OTHER + 1 - len(CODES[name])), kind)
            values = dictionary.take(pa.array(codes[at]))
        elif name in SPARSE_COLUMNS:
            values = pa.nulls(len(at), kind)
        else:
            raise KeyError(f"{name} is not a hot column")
        if not in_sparse.any():
            return values
        rare = self.sparse.column(name).combine_chunks().take(taken)
        places = np.flatnonzero(in_sparse)
        if name in CODES:  # only the rows coded 255 take the sparse value
            keep = codes[at][places] != _OTHER
            rare = pc.if_else(pa.array(keep), values.take(pa.array(places)), rare)
        return _scatter(values, places, rare)


_ARRAYS = ("ids", "mzxid", "state", "deleted", "marked")


def _built(arrays: list[np.ndarray], sparse: pa.Table) -> LedgerColumns:
    """Columns from ``arrays`` (in :data:`_ARRAYS` order) and ``sparse`` (sorted here)."""
    ids, mzxid, state, deleted, marked = arrays
    ordered = sparse.sort_by("ledger_id") if sparse.num_rows else sparse
    return LedgerColumns(ids, mzxid, state, deleted, marked, ordered)


def _sparse_positions(sparse: pa.Table, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which of ``ids`` have a row in ``sparse`` (sorted by id), and where."""
    sparse_ids = sparse.column("ledger_id").to_numpy()
    if not len(sparse_ids) or not len(ids):
        return np.zeros(len(ids), bool), np.zeros(len(ids), np.int64)
    at = np.searchsorted(sparse_ids, ids).clip(max=len(sparse_ids) - 1)
    return sparse_ids[at] == ids, at


def _scatter(values: pa.Array, places: np.ndarray, replacement: pa.Array) -> pa.Array:
    """``values`` with ``replacement[i]`` at ``places[i]``.

    Example:
        >>> _scatter(pa.array([1, 2, 3]), np.array([0, 2]), pa.array([7, 9])).to_pylist()
        [7, 2, 9]
    """
    source = np.arange(len(values))
    source[places] = len(values) + np.arange(len(places))
    return pa.concat_arrays([values, replacement.cast(values.type)]).take(pa.array(source))
