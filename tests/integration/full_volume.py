"""Fill real volumes with the job's own writers, in a private mount namespace (run by test_full_volume.py).

``python -m tests.integration.full_volume DIR`` mounts two small tmpfs volumes under ``DIR`` (the lakehouse
and the checkpoint; this needs root or ``unshare -Urm``), writes ledger batches until the lakehouse is full
and driver-lane offsets until the checkpoint is full, grows both, checks the lakehouse and removes the
leftovers as the job's start does, and writes one more batch; prints one JSON object of what it saw.
The mounts end with the namespace.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SMALL = "size=640k"
APP = "full-volume"


def _mount(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)


def _hidden_temporaries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*.tmp"))


def ledger(ledger_id: int, mzxid: int) -> dict[str, Any]:
    """A closed ledger's row, as the sink records it."""
    from datetime import UTC, datetime

    bookies = [f"bookie-{n}" for n in range(ledger_id % 5, ledger_id % 5 + 3)]
    return {
        "ledger_id": ledger_id,
        "ledger_bucket": ledger_id % 16,
        "state": "CLOSED",
        "segments": [{"first_entry_id": 0, "ensemble": bookies}],
        "bookies": bookies,
        "mzxid": mzxid,
        "deleted": False,
        "updated_at": datetime.fromtimestamp(mzxid % 10**9, tz=UTC),
    }


def main(base: Path) -> dict[str, Any]:
    from connectors.delta.health import check_lakehouse
    from connectors.delta.ledger_log import LedgerLog
    from connectors.delta.tables import BatchWriter, ensure_tables, read_current_ledgers
    from core.errors import ServiceError
    from streaming.disk_space import full_disk_failure
    from streaming.driver_batches import OffsetLog
    from streaming.spark_checkpoint import discard_temporary_files

    lake_volume, checkpoint_volume = base / "lake", base / "checkpoints"
    _mount(lake_volume, SMALL)
    _mount(checkpoint_volume, SMALL)
    lakehouse, checkpoint = lake_volume / "lakehouse", checkpoint_volume / APP
    directories = {"lakehouse_root": lakehouse, "checkpoint_root": checkpoint_volume}
    found: dict[str, Any] = {}
    ensure_tables(lakehouse)
    log = LedgerLog(lakehouse, APP)
    log.open(0)
    batch = 0
    try:
        while batch < 2000:
            log.batch_started(batch)
            log.record(
                BatchWriter(lakehouse, APP, batch), [ledger(i, 10_000 * batch + i) for i in range(1, 2000)]
            )
            log.flush_index()
            batch += 1
        found["lakehouse_line"] = "never full"
    except Exception as err:
        found["lakehouse_line"] = str(full_disk_failure(err, directories))
    _grow(lake_volume)
    offsets = OffsetLog(checkpoint / "ledger-lane" / "offsets", keep=10_000)
    try:
        for lane_batch in range(100_000):
            offsets.write(lane_batch, {"p": lane_batch}, {"p": lane_batch + 1, "pad": "x" * 4000}, 0)
        found["checkpoint_line"] = "never full"
    except OSError as err:
        found["checkpoint_line"] = str(full_disk_failure(err, directories))
    found["left_in_checkpoint"] = _hidden_temporaries(checkpoint_volume)
    _grow(checkpoint_volume)
    try:
        check_lakehouse(lakehouse)
        found["damaged"] = None
    except ServiceError as err:
        found["damaged"] = str(err)
    found["removed_at_start"] = [str(p.relative_to(checkpoint)) for p in discard_temporary_files(checkpoint)]
    found["left_after_start"] = _hidden_temporaries(checkpoint_volume)
    log = LedgerLog(lakehouse, APP)
    log.ensure_open()
    log.record(BatchWriter(lakehouse, APP, batch), [ledger(i, 10**12 + i) for i in range(1, 200)])
    current = read_current_ledgers(lakehouse)
    found["ledgers"] = current.num_rows
    found["newest_versions"] = sum(m >= 10**12 for m in current.column("mzxid").to_pylist())
    return found


def _grow(volume: Path) -> None:
    """Room again: the volume grown to 64 MiB."""
    subprocess.run(["mount", "-o", "remount,size=64m", str(volume)], check=True)


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))), flush=True)
    # After an ENOSPC, delta-rs's runtime may abort at interpreter teardown (SIGABRT, "terminate called
    # without an active exception", about one exit in four here): what was to be seen is printed.
    sys.stderr.flush()
    os._exit(0)
