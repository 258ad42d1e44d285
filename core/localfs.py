"""Local directories the processes write (checkpoint, lakehouse, the embedded services' state).

An operator error there (no permission, a read-only volume, a file in the way) must be one line naming the
setting, found before anything starts, not an ``OSError`` traceback from deep inside Spark or a service.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from core.errors import ConfigError


def writable_directory(path: Path, setting: str) -> None:
    """Create ``path`` if needed and prove it writable, or raise one :class:`ConfigError` naming ``setting``.

    Example:
        >>> import tempfile
        >>> blocker = Path(tempfile.mkdtemp()) / "a-file"; _ = blocker.write_text("")
        >>> try:
        ...     writable_directory(blocker / "checkpoints", "checkpoint_root")
        ... except ConfigError as err:
        ...     print(str(err).split(":")[0])
        checkpoint_root (BKAUDIT_CHECKPOINT_ROOT) is not a writable directory
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        variable = "BKAUDIT_" + setting.upper().replace(".", "__")
        raise ConfigError(
            f"{setting} ({variable}) is not a writable directory: {path}: {err.strerror or err}"
        ) from None
