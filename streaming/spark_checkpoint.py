"""A Spark query's checkpoint after a kill while it planned its first batch.

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


def _is_spark_temporary(name: str) -> bool:
    """A file Spark writes before renaming it into place (``.0.<uuid>.tmp``) or its checksum.

    Example:
        >>> [_is_spark_temporary(n) for n in [".0.ab.tmp", "..0.ab.tmp.crc", "0", ".0.crc", "notes.tmp"]]
        [True, True, False, False, False]
    """
    return name.startswith(".") and name.endswith((".tmp", ".tmp.crc"))
