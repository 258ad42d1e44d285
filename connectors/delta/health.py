"""Is a lakehouse whole? Damaged commits, missing data files and vanished tables, named on one line.

A Delta table is its ``_delta_log``: numbered JSON commits (one action per line) and Parquet checkpoints.
A disk that filled up or a hand that copied half a directory leaves a commit cut short, or a data file the
log still names; delta-rs then fails with a kernel error and a backtrace that names neither the table nor
the file. :func:`table_damage` finds the file; :func:`check_lakehouse` runs it on every table the job
created before, and also fails when such a table is gone, since recreating it empty would lose its
history without a word. Which tables the job created is recorded in ``_bkaudit_tables.json`` at the
lakehouse root (:func:`record_tables`), so a table added by a newer bkaudit is created, not reported.

Example:
    >>> import tempfile
    >>> from connectors.delta.tables import ensure_tables
    >>> root = tempfile.mkdtemp(); _ = ensure_tables(root)
    >>> check_lakehouse(root)  # whole: nothing raised
    >>> log = Path(root, "violations", "_delta_log", "00000000000000000000.json")
    >>> _ = log.write_text(log.read_text()[:40])
    >>> try:
    ...     check_lakehouse(root)
    ... except ServiceError as err:
    ...     print(str(err).split(":")[0])
    the Delta table 'violations' is damaged
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from connectors import storage
from core.errors import ServiceError

#: At the lakehouse root: the tables the job created there (a JSON list of names).
TABLES_RECORD = "_bkaudit_tables.json"
#: Where the repair of each kind of damage is described.
REPAIR_DOC = 'docs/troubleshooting.md, "A Delta table is damaged or gone"'
#: The tables ``bkaudit repair`` rebuilds, each from its source (every other table holds what nothing else
#: does: restore it from a backup).
REBUILT_FROM = {
    "ledgers": "ledger_changes",
    "ledger_bookies": "ledgers",
    "violations": "the alerts topic",
    "open_alerts": "violations",
}
_COMMITS_CHECKED = 200


def recorded_tables(root: str | Path) -> set[str]:
    """The tables the job created under ``root`` (empty when nothing was recorded).

    Example:
        >>> import tempfile
        >>> recorded_tables(tempfile.mkdtemp())
        set()
    """
    record = storage.join(root, TABLES_RECORD)
    try:
        return set(json.loads(storage.read_bytes(record).decode("utf-8")))
    except FileNotFoundError:
        return set()
    except (OSError, ValueError, pa.ArrowException) as err:
        raise ServiceError(f"cannot read {record}: {err}; {REPAIR_DOC}") from None


def record_tables(root: str | Path, names: set[str]) -> None:
    """Add ``names`` to the record of the tables the job created under ``root`` (atomically)."""
    known = recorded_tables(root)
    if names <= known:
        return
    storage.write_atomic(storage.join(root, TABLES_RECORD), json.dumps(sorted(known | names)).encode())


def table_damage(path: str | Path) -> str | None:
    """What is wrong with the Delta table at ``path``, naming the file; None when it opens and its files
    are there.

    Example:
        >>> import tempfile
        >>> from connectors.delta.tables import ensure_tables
        >>> root = tempfile.mkdtemp(); _ = ensure_tables(root)
        >>> table_damage(Path(root, "bookies")) is None
        True
    """
    log = storage.join(path, "_delta_log")
    broken = _unparsable_commit(log)
    if broken is not None:
        return broken
    try:
        table = DeltaTable(str(path))
        files = table.file_uris()
    except (DeltaError, OSError) as err:
        return f"its log cannot be read ({_first_line(err)})"
    if storage.is_remote(path):
        base = str(path).rstrip("/") + "/"
        present = set(storage.list_files(path, recursive=True))
        for uri in files:
            if uri.startswith(base) and unquote(uri.removeprefix(base)) not in present:
                return f"its log names {uri}, which is gone"
        return None
    for uri in files:
        local = Path(uri.removeprefix("file://"))
        if uri.startswith(("/", "file://")) and not local.exists():
            return f"its log names {local}, which is gone"
    return None


def check_lakehouse(root: str | Path) -> None:
    """Raise one :class:`ServiceError` line when a table the job created under ``root`` is damaged or gone.

    Runs before the job builds anything, so a damaged lakehouse stops it with exit 2 and the file's name
    instead of a traceback, and a deleted table is never recreated empty.
    """
    base = str(root)
    for name in sorted(recorded_tables(base)):
        path = storage.join(base, name)
        if not storage.is_dir(storage.join(path, "_delta_log")):
            raise ServiceError(
                f"the Delta table '{name}' is gone from {base}, where this job created it: recreating it "
                f"empty would lose its history; {what_to_do(name)}"
            )
        damage = unfinished_repair(base, name) or table_damage(path)
        if damage is not None:
            raise ServiceError(f"the Delta table '{name}' is damaged: {damage}; {what_to_do(name)}")


def repair_marker(root: str | Path, name: str) -> Path:
    """The file a rebuild of ``name`` leaves while it runs (a rebuild cut short leaves a table that looks
    whole and is not)."""
    return Path(root) / "_damaged" / f"{name}.repairing"


def unfinished_repair(root: str | Path, name: str) -> str | None:
    """What to say of a table whose rebuild did not finish (None: none was cut short).

    Example:
        >>> import tempfile
        >>> unfinished_repair(tempfile.mkdtemp(), "ledgers") is None
        True
    """
    marker = repair_marker(root, name)
    if marker.exists():
        return f"its rebuild did not finish ({marker} is still there)"
    return None


def what_to_do(name: str) -> str:
    """The way back for a damaged table: the repair command for a table it rebuilds, else a restore.

    Example:
        >>> what_to_do("open_alerts").split(" (")[0]
        'rebuild it from violations with `bkaudit repair`'
        >>> what_to_do("ledger_changes").startswith("it cannot be rebuilt")
        True
    """
    source = REBUILT_FROM.get(name)
    if source is not None:
        return f"rebuild it from {source} with `bkaudit repair` ({REPAIR_DOC})"
    return f"it cannot be rebuilt (nothing else holds its rows): restore it from a backup ({REPAIR_DOC})"


def _unparsable_commit(log: str) -> str | None:
    """The first commit file (newest first) with a line that is not JSON, among those a reader reads: the
    ones after the last checkpoint (at most ``_COMMITS_CHECKED``)."""
    try:
        names = [name for name in storage.list_files(log) if name.endswith(".json")]
    except (OSError, pa.ArrowException) as err:
        return f"{log} cannot be listed ({getattr(err, 'strerror', None) or err})"
    checkpoint = _last_checkpoint(log)
    for name in sorted(names, reverse=True)[:_COMMITS_CHECKED]:
        if checkpoint is not None and _version(name) <= checkpoint:
            break
        commit = storage.join(log, name)
        try:
            lines = storage.read_bytes(commit).decode("utf-8").splitlines()
        except (OSError, UnicodeDecodeError, pa.ArrowException) as err:
            return f"{commit} cannot be read ({err})"
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                json.loads(line)
            except ValueError:
                return f"{commit} is cut short or corrupt (line {number} is not JSON)"
    return None


def _last_checkpoint(log: str) -> int | None:
    try:
        return int(json.loads(storage.read_bytes(storage.join(log, "_last_checkpoint")))["version"])
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None


def _version(name: str) -> int:
    try:
        return int(name.removesuffix(".json"))
    except ValueError:
        return -1


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__


__all__ = [
    "REBUILT_FROM",
    "REPAIR_DOC",
    "TABLES_RECORD",
    "check_lakehouse",
    "record_tables",
    "recorded_tables",
    "repair_marker",
    "table_damage",
    "unfinished_repair",
    "what_to_do",
]
