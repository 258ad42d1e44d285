"""Filtered reads of a Delta table's current files: the one place a filter meets the Parquet files.

A table's files need not share physical types: delta-rs writes the files of a MERGE with ``string_view``
columns, while appends keep ``string``. A filter bound to the table's logical schema (``state == 'CLOSED'``)
then fails on the MERGE-written files (``Function 'equal' has no kernel matching input types (string,
string_view)``), during row-group pruning as much as during filtering. :func:`scan` compares every text
column as the table's logical type, so each file is read whatever its physical type, and integer, boolean
and timestamp conditions keep their statistics pruning.

Conditions are ``(column, op, value)`` triples, all of which must hold, with the operators of delta-rs's
own filters: ``=``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``in`` and ``not in``, plus ``is null`` and
``is not null`` (whose value is ignored).

Example:
    >>> import tempfile, pyarrow as pa
    >>> from deltalake import DeltaTable, write_deltalake
    >>> path = tempfile.mkdtemp()
    >>> write_deltalake(path, pa.table({"id": [1, 2, 3], "state": ["OPEN", "CLOSED", "CLOSED"]}))
    >>> scan(DeltaTable(path), [("state", "=", "CLOSED"), ("id", ">", 2)], ["id"]).to_pylist()
    [{'id': 3}]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable

Condition = tuple[str, str, Any]

_COMPARISONS = {
    "=": lambda f, v: f == v,
    "==": lambda f, v: f == v,
    "!=": lambda f, v: f != v,
    "<": lambda f, v: f < v,
    "<=": lambda f, v: f <= v,
    ">": lambda f, v: f > v,
    ">=": lambda f, v: f >= v,
    "in": lambda f, v: f.isin(list(v)),
    "not in": lambda f, v: ~f.isin(list(v)),
    "is null": lambda f, _: f.is_null(),
    "is not null": lambda f, _: f.is_valid(),
}


def _is_text(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_string_view(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_binary_view(kind)
    )


def _column(name: str, schema: pa.Schema) -> pc.Expression:
    """The column as the table's logical type: text columns are cast, so files of either physical type
    match."""
    kind = schema.field(name).type
    return pc.field(name).cast(kind) if _is_text(kind) else pc.field(name)


def filter_expression(conditions: Sequence[Condition], schema: pa.Schema) -> pc.Expression | None:
    """The conjunction of ``conditions`` over ``schema`` (None when there are none).

    Example:
        >>> schema = pa.schema([("state", pa.string()), ("id", pa.int64())])
        >>> str(filter_expression([("id", "in", [1, 2])], schema))
        'is_in(id, {value_set=int64:[\\n  1,\\n  2\\n], null_matching_behavior=MATCH})'
    """
    expression: pc.Expression | None = None
    for name, op, value in conditions:
        if op not in _COMPARISONS:
            raise ValueError(
                f"unsupported filter operator {op!r} on {name!r} (one of {sorted(_COMPARISONS)})"
            )
        term = _COMPARISONS[op](_column(name, schema), value)
        expression = term if expression is None else expression & term
    return expression


def scan(
    table: DeltaTable,
    where: Sequence[Condition] = (),
    columns: Sequence[str] | None = None,
    *,
    prune_partitions: bool = False,
) -> pa.Table:
    """The rows of ``table`` matching every condition of ``where``, with ``columns`` (all when None).

    With ``prune_partitions``, conditions on the table's partition columns also select the files from the
    Delta log, so files of other partitions are never opened.

    Example:
        >>> import tempfile
        >>> from deltalake import write_deltalake
        >>> path = tempfile.mkdtemp()
        >>> index = pa.table({"bookie": ["b1", "b2"], "ledger_id": [7, 8]})
        >>> write_deltalake(path, index, partition_by=["bookie"])
        >>> on_b2 = [("bookie", "in", ["b2"])]
        >>> scan(DeltaTable(path), on_b2, ["ledger_id"], prune_partitions=True).to_pylist()
        [{'ledger_id': 8}]
    """
    pruning = None
    if prune_partitions:
        partitions = set(table.metadata().partition_columns)
        pruning = [(name, op, value) for name, op, value in where if name in partitions] or None
    dataset = table.to_pyarrow_dataset(file_pruning_predicate=pruning)
    expression = filter_expression(where, dataset.schema)
    return dataset.to_table(filter=expression, columns=list(columns) if columns is not None else None)


def view_typed_dataset(table: DeltaTable) -> Any:
    """The table's current files as an Arrow dataset whose text columns are ``string_view``, for engines
    (DuckDB) that push their own filters into the scan: those filters then match files of either physical
    type, where the table's ``string`` schema fails on the files a MERGE wrote.

    Example:
        >>> import tempfile
        >>> from deltalake import write_deltalake
        >>> path = tempfile.mkdtemp()
        >>> write_deltalake(path, pa.table({"state": ["OPEN"]}))
        >>> view_typed_dataset(DeltaTable(path)).schema.field("state").type
        DataType(string_view)
    """
    logical = table.to_pyarrow_dataset().schema
    viewed = pa.schema(
        [f.with_type(pa.string_view()) if pa.types.is_string(f.type) else f for f in logical],
        metadata=logical.metadata,
    )
    return table.to_pyarrow_dataset(schema=viewed)


def scan_partitions(
    table: DeltaTable, column: str, values: Sequence[Any], columns: Sequence[str] | None = None
) -> pa.Table:
    """The rows of the partitions whose partition column ``column`` is one of ``values``, with ``columns``
    (all when None), in no particular order.

    Equal to ``scan(table, [(column, "in", values)], columns, prune_partitions=True)``, at a cost that
    depends on those partitions only: a local table's files are listed from the log per partition and read
    directly, one thread, where an Arrow dataset of the table first builds an expression of statistics for
    every file and reads through a Python file system (0.39 s against 0.06 s for one ``ledger_bookies``
    partition of 80 files among 8,000 on two loaded cores). Tables elsewhere, or with reader features,
    take :func:`scan`.

    Example:
        >>> import tempfile
        >>> from deltalake import write_deltalake
        >>> path = tempfile.mkdtemp()
        >>> index = pa.table({"bookie": ["b1", "b2", "b2"], "ledger_id": [7, 8, 9]})
        >>> write_deltalake(path, index, partition_by=["bookie"])
        >>> scan_partitions(DeltaTable(path), "bookie", ["b2"], ["ledger_id", "bookie"]).to_pylist()
        [{'ledger_id': 8, 'bookie': 'b2'}, {'ledger_id': 9, 'bookie': 'b2'}]
    """
    wanted = list(dict.fromkeys(values))
    root = _local_root(table)
    if root is None or table.protocol().min_reader_version > 1 or not wanted:
        return scan(table, [(column, "in", wanted)], columns, prune_partitions=True)
    schema = pa.schema(table.schema().to_arrow())
    names = list(columns) if columns is not None else schema.names
    in_files = pa.schema([f for f in schema if f.name not in table.metadata().partition_columns])
    read = [name for name in names if name != column]
    parts = []
    for value in wanted:
        files = [_local_path(uri) for uri in table.file_uris(file_pruning_predicate=[(column, "=", value)])]
        rows = ds.dataset(files, schema=in_files, format="parquet").to_table(columns=read, use_threads=False)
        constant = pa.array([value] * rows.num_rows, schema.field(column).type)
        parts.append(rows.append_column(schema.field(column), constant))
    empty = pa.schema([schema.field(name) for name in names]).empty_table()
    return pa.concat_tables([part.select(names) for part in parts]).combine_chunks() if parts else empty


def _local_root(table: DeltaTable) -> str | None:
    """The table's directory when it is on the local file system, else None."""
    parsed = urlparse(table.table_uri)
    if parsed.scheme in ("", "file"):
        return unquote(parsed.path) if parsed.scheme else table.table_uri
    return None if len(parsed.scheme) > 1 else table.table_uri  # "C:" is a drive, not a scheme


def _local_path(uri: str) -> str:
    return unquote(urlparse(uri).path) if uri.startswith("file://") else uri


class BucketReader:
    """Reads the rows of some partitions of a table partitioned by an integer column (``ledgers`` by
    ``ledger_bucket``), with its files listed once: a local table's files are read directly (as in
    :func:`scan_partitions`), a table elsewhere through :func:`scan` with its partitions pruned.

    Example:
        >>> import tempfile
        >>> from deltalake import write_deltalake
        >>> path = tempfile.mkdtemp()
        >>> rows = pa.table({"ledger_id": [1, 2, 5], "ledger_bucket": pa.array([1, 2, 1], pa.int32())})
        >>> write_deltalake(path, rows, partition_by=["ledger_bucket"])
        >>> reader = BucketReader(DeltaTable(path), "ledger_bucket")
        >>> reader.values()
        [1, 2]
        >>> sorted(reader.read([1], ["ledger_id"]).column("ledger_id").to_pylist())
        [1, 5]
        >>> reader.read([2], ["ledger_id", "ledger_bucket"]).to_pylist()
        [{'ledger_id': 2, 'ledger_bucket': 2}]
    """

    def __init__(self, table: DeltaTable, column: str) -> None:
        self.table = table
        self.column = column
        self._root = _local_root(table)
        if table.protocol().min_reader_version > 1:
            self._root = None
        self._files: dict[int, list[str]] = {}
        if self._root is not None:
            marker = f"{column}="
            for uri in table.file_uris():
                path = _local_path(uri)
                part = next((p for p in path.split("/") if p.startswith(marker)), None)
                value = (
                    -1
                    if part is None or part == f"{marker}__HIVE_DEFAULT_PARTITION__"
                    else int(part[len(marker) :])
                )
                self._files.setdefault(value, []).append(path)
            self._values = sorted(self._files)
        else:
            found = {p.get(column) for p in table.partitions()}
            self._values = sorted(int(v) for v in found if v is not None)
        self._schema = pa.schema(table.schema().to_arrow())
        partitions = table.metadata().partition_columns
        self._in_files = pa.schema([f for f in self._schema if f.name not in partitions])

    @property
    def local(self) -> bool:
        """Whether the files are read directly (else through delta-rs)."""
        return self._root is not None

    def values(self) -> list[int]:
        """The partition values the table has files in, ascending."""
        return list(self._values)

    def read(self, values: Sequence[int], columns: Sequence[str]) -> pa.Table:
        """The rows of the partitions ``values`` with ``columns`` (the partition column among them or not),
        in no particular order."""
        names = list(columns)
        if self._root is None:
            wanted = [str(v) for v in values]
            return scan(self.table, [(self.column, "in", wanted)], names, prune_partitions=True)
        files = [path for value in values for path in self._files.get(int(value), [])]
        if not files:
            return self._schema.empty_table().select(names)
        partitioning = ds.partitioning(pa.schema([self._schema.field(self.column)]), flavor="hive")
        dataset = ds.dataset(
            files,
            schema=pa.schema([*self._in_files, self._schema.field(self.column)]),
            format="parquet",
            partitioning=partitioning,
            partition_base_dir=self._root,
        )
        return dataset.to_table(columns=names, use_threads=False)
