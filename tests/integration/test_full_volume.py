"""Volumes that really fill: a small tmpfs as the lakehouse and another as the checkpoint, in a private
mount namespace (``unshare -Urm``: no root needed, and the mounts end with the child).

The job's own writers fill them (ledger batches into Delta, driver-lane offsets into the checkpoint): each
failure is one line naming the full directory, delta-rs leaves no damaged table, no temporary file stays
once the job's start has cleaned up, and once there is room the writes go on
(:mod:`tests.integration.full_volume` does the filling).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_full_lakehouse_and_checkpoint_volumes_stop_in_one_line_and_recover(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("BKAUDIT_")}, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        ["unshare", "-Urm", sys.executable, "-m", "tests.integration.full_volume", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-3000:]}"
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert (
        found["lakehouse_line"].startswith(
            f"no space left on the device of lakehouse_root {tmp_path}/lake/lakehouse: "
        )
        and "free of 640 KiB" in found["lakehouse_line"]
    )
    assert found["checkpoint_line"].startswith(
        f"no space left on the device of checkpoint_root {tmp_path}/checkpoints: 0 KiB free of 640 KiB"
    )
    assert found["damaged"] is None  # delta-rs wrote no commit it could not finish
    # The lane's write removes its own partial file when the disk refuses it; whatever a writer still
    # left (Spark's, a killed process') is removed by the next start, and only that.
    left = [Path(p) for p in found["left_in_checkpoint"]]
    assert found["removed_at_start"] == [str(p.relative_to("full-volume")) for p in left]
    assert found["left_after_start"] == []
    assert (found["ledgers"], found["newest_versions"]) == (1999, 199)  # writes go on from where they were
