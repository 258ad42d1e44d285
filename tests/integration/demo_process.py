"""``bkaudit demo`` in a process of its own, as a user runs it, with one change: the simulated cluster's
ledger password is the one given, so the tests can look for it in the tables.

    python -m tests.integration.demo_process PASSWORD REPORT_FILE [bkaudit arguments ...]

Writes ``{"clusters_with_known_password": n}`` to REPORT_FILE at the end and exits with the command's
exit code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import bkaudit.sim.cluster
from bkaudit.cli.main import run


def main(argv: list[str]) -> int:
    password, report, arguments = argv[0].encode(), Path(argv[1]), argv[2:]
    built: list[bytes | None] = []

    class KnownPasswordCluster(bkaudit.sim.cluster.SimulatedCluster):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("password", password)
            built.append(kwargs["password"])
            super().__init__(*args, **kwargs)

    bkaudit.sim.cluster.SimulatedCluster = KnownPasswordCluster  # type: ignore[misc]
    try:
        return run(arguments)
    finally:
        report.write_text(json.dumps({"clusters_with_known_password": built.count(password)}))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
