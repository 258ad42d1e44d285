"""Delta tables through ``deltalake`` (delta-rs), written idempotently per streaming micro-batch.

Structured Streaming may run a ``foreachBatch`` function again for the same batch id after a crash. Each
write here carries a Delta *app transaction* ``(app_id, batch_id)``; before writing we read the table's
last committed version for ``app_id`` and skip batches already applied, so a replay never duplicates rows.
Never read these directories with ``spark.read.parquet``: it would include files Delta has removed.

Example:
    >>> import pyarrow as pa, tempfile
    >>> path = tempfile.mkdtemp()
    >>> append_batch(path, pa.table({"x": [1]}), app_id="demo", batch_id=0)
    True
    >>> append_batch(path, pa.table({"x": [1]}), app_id="demo", batch_id=0)  # a replay is skipped
    False
    >>> read_table(path).num_rows
    1
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError


def applied_batch(path: str | Path, app_id: str) -> int | None:
    """The last batch id committed to the table at ``path`` by ``app_id`` (None: none, or no table).

    Example:
        >>> applied_batch("/nonexistent/table", "demo") is None
        True
    """
    try:
        return DeltaTable(str(path)).transaction_version(app_id)
    except TableNotFoundError:
        return None


def append_batch(
    path: str | Path,
    data: pa.Table,
    *,
    app_id: str,
    batch_id: int,
    partition_by: list[str] | None = None,
) -> bool:
    """Append ``data`` unless batch ``batch_id`` of ``app_id`` is already in the table; True when written.

    Example:
        >>> import pyarrow as pa, tempfile
        >>> append_batch(tempfile.mkdtemp(), pa.table({"x": [1, 2]}), app_id="a", batch_id=7)
        True
    """
    done = applied_batch(path, app_id)
    if done is not None and done >= batch_id:
        return False
    write_deltalake(
        str(path),
        data,
        mode="append",
        partition_by=partition_by,
        commit_properties=CommitProperties(app_transactions=[Transaction(app_id, batch_id)]),
    )
    return True


def read_table(path: str | Path) -> pa.Table:
    """The current version of the Delta table at ``path`` as an Arrow table.

    Example:
        >>> import pyarrow as pa, tempfile
        >>> p = tempfile.mkdtemp(); _ = append_batch(p, pa.table({"x": [3]}), app_id="a", batch_id=0)
        >>> read_table(p).column("x").to_pylist()
        [3]
    """
    return DeltaTable(str(path)).to_pyarrow_table()
