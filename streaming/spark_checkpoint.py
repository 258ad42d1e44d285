"""Spark's and the job's temporary files in a checkpoint after a kill or a full disk.

Spark writes a batch's offsets to a hidden temporary file (``.0.<uuid>.tmp``, with a ``.crc`` beside it on a
local disk) and then renames it into place. A kill before the rename leaves the temporary file and no batch.
On the next start Spark (4.1 and later) takes the query for a new one, finds its ``offsets`` folder not
empty and refuses to run (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``): the job would fail at every restart
until a person deleted the file. No batch was planned, so nothing was read or written for it, and those
leftovers are removed before the query starts. Anything else stays for Spark to judge: a batch file means
the query is not new, and a file Spark does not write is not ours to delete.

Example:
    >>> import tempfile
    >>> location = Path(tempfile.mkdtemp())
    >>> (location / "offsets").mkdir()
    >>> (location / "offsets" / ".0.5f1d.tmp").touch()
    >>> [p.name for p in discard_unplanned_first_batch(location)]
    ['.0.5f1d.tmp']
    >>> sorted(p.name for p in (location / "offsets").iterdir())
    []
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

logger = logging.getLogger(__name__)

#: The folders of a Spark query's checkpoint whose leftovers make Spark refuse a new query.
_BATCH_LOGS = ("offsets", "commits")


def discard_unplanned_first_batch(location: Path) -> list[Path]:
    """Remove Spark's temporary batch files from the query checkpoint at ``location`` when no batch was
    ever planned there (its ``offsets`` log holds no batch); returns what was removed."""
    offsets = location / "offsets"
    if not offsets.is_dir() or any(path.name.isdigit() for path in offsets.iterdir()):
        return []
    removed = [
        path
        for name in _BATCH_LOGS
        if (location / name).is_dir()
        for path in sorted((location / name).iterdir())
        if _is_spark_temporary(path.name)
    ]
    for path in removed:
        path.unlink()
    if removed:
        logger.info(
            "%s: no batch was planned; removed the temporary files of an interrupted first batch: %s",
            location,
            ", ".join(path.name for path in removed),
        )
    return removed


#: Files a writer of the job's own leaves when it dies between writing and renaming (the status file of
#: the Kafka source is written as ``<name>.tmp``; every other one as a hidden ``.<name>.tmp``).
_OWN_TEMPORARIES = ("bkaudit-source-status.tmp",)


def discard_temporary_files(
    checkpoint: Path, fold_scratch: Path | None = None, app_id: str = ""
) -> list[Path]:
    """Remove the temporary files a stopped job left in its checkpoint ``checkpoint`` (Spark's
    ``.<name>.<uuid>.tmp`` and their ``.crc`` anywhere in the timers query's checkpoint, the driver
    lanes' ``.<id>.json.tmp``) and, under ``fold_scratch``, the fold's files of ``app_id``; returns them.

    Called while the job holds the checkpoint's lock and before anything of it starts: no writer of
    these files is alive then (each is written only by the job holding the lock). A stop on a full disk
    leaves them; they hold space and nothing any reader reads.

    Example:
        >>> import tempfile
        >>> checkpoint = Path(tempfile.mkdtemp())
        >>> (checkpoint / "timers" / "state" / "0" / "1").mkdir(parents=True)
        >>> for name in ["timers/state/0/1/.5.zip.3f.tmp", "timers/state/0/1/5.zip", "bkaudit.lock"]:
        ...     (checkpoint / name).touch()
        >>> [p.name for p in discard_temporary_files(checkpoint)]
        ['.5.zip.3f.tmp']
        >>> sorted(p.name for p in checkpoint.rglob("*") if p.is_file())
        ['5.zip', 'bkaudit.lock']
    """
    found = [
        Path(folder) / name
        for folder, _dirs, names in os.walk(checkpoint)
        for name in names
        if _is_spark_temporary(name) or name in _OWN_TEMPORARIES
    ]
    if fold_scratch is not None and app_id and fold_scratch.is_dir():
        fold_file = re.compile(rf"{re.escape(app_id)}-\d+\.(arrow|request\.json)")
        found += [p for p in fold_scratch.iterdir() if fold_file.fullmatch(p.name)]
    removed = []
    for path in sorted(found):
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(path)
        logger.info("removed %s (%d bytes), left by a job that stopped while writing it", path, size)
    return removed


def _is_spark_temporary(name: str) -> bool:
    """A file Spark writes before renaming it into place (``.0.<uuid>.tmp``) or its checksum.

    Example:
        >>> [_is_spark_temporary(n) for n in [".0.ab.tmp", "..0.ab.tmp.crc", "0", ".0.crc", "notes.tmp"]]
        [True, True, False, False, False]
    """
    return name.startswith(".") and name.endswith((".tmp", ".tmp.crc"))
