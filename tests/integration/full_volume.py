"""Real volumes that fill up, in private mount namespaces (``unshare -Urm``: no root needed).

``python -m tests.integration.full_volume DIR`` (run by test_full_volume.py) mounts two small tmpfs volumes
under ``DIR`` (the lakehouse and the checkpoint), writes ledger batches until the lakehouse is full and
driver-lane offsets until the checkpoint is full, grows both, checks the lakehouse and removes the
leftovers as the job's start does, and writes one more batch; prints one JSON object of what it saw.
The mounts end with the namespace.

:class:`PrivateVolume` puts directories of a running test on one small tmpfs that only processes started
through :attr:`PrivateVolume.enter` see (the chaos suite runs ``bkaudit stream`` there): the test reaches
its files through :meth:`PrivateVolume.seen` (``/proc/<pid>/root/...``), fills and frees it, and reads
Delta tables through a reader inside the namespace (delta-rs resolves a ``/proc/<pid>/root`` path to the
host's directory, so it cannot read them from outside).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

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


class PrivateVolume:
    """A tmpfs of ``size`` (``64m``) at ``mount_point`` in a mount namespace of its own, holding copies of
    ``moved`` (each bind-mounted over its own path there); it lives until :meth:`close`.

    Processes started with :attr:`enter` before their command see the volume at the usual paths; this
    process sees it under :meth:`seen`. The copies are taken at the start, so what is moved must not be
    written meanwhile (stop the job first).
    """

    def __init__(self, mount_point: Path, size: str, moved: Sequence[Path]) -> None:
        self.mount_point = mount_point
        self.size = size
        self.moved = list(moved)
        self.holder: subprocess.Popen[str] | None = None
        self.reader: subprocess.Popen[str] | None = None

    def __enter__(self) -> PrivateVolume:
        self.mount_point.mkdir(parents=True, exist_ok=True)
        copies = " && ".join(
            f"cp -a {path} {self.mount_point}/ && mount --bind {self.mount_point}/{path.name} {path}"
            for path in self.moved
        )
        script = (
            f"mount -t tmpfs -o size={self.size} tmpfs {self.mount_point} && {copies} && echo ready "
            "&& exec cat >/dev/null"
        )
        # The holder keeps the namespace (and so the volume) until its stdin closes, this process' end too.
        self.holder = subprocess.Popen(
            ["unshare", "-Urm", "sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.holder.stdout is not None
        ready = self.holder.stdout.readline().strip()
        assert ready == "ready", f"the private volume did not mount (exit {self.holder.wait()})"
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    @property
    def pid(self) -> int:
        assert self.holder is not None, "the volume is not mounted"
        return self.holder.pid

    @property
    def enter(self) -> tuple[str, ...]:
        """The command prefix that runs a command in the volume's namespace."""
        return ("nsenter", f"--target={self.pid}", "--user", "--mount", "--preserve-credentials")

    def seen(self, path: Path) -> Path:
        """``path`` as this process reaches it inside the namespace (plain file operations only)."""
        return Path(f"/proc/{self.pid}/root") / path.relative_to("/")

    def free_bytes(self) -> int:
        found = os.statvfs(self.seen(self.mount_point))
        return found.f_bavail * found.f_frsize

    def fill(self, leave_bytes: int) -> int:
        """Take all but ``leave_bytes`` of the free space (a file ``filler``); returns the bytes taken."""
        taken = max(self.free_bytes() - leave_bytes, 0)
        fd = os.open(self.seen(self.mount_point / "filler"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, taken)
        finally:
            os.close(fd)
        return taken

    def make_room(self) -> None:
        """Remove what :meth:`fill` took."""
        self.seen(self.mount_point / "filler").unlink(missing_ok=True)

    def table_rows(self, lakehouse: Path, name: str) -> list[dict[str, Any]]:
        """A Delta table's rows under ``lakehouse`` inside the namespace (values as JSON gives them)."""
        reader = self._reader()
        assert reader.stdin is not None and reader.stdout is not None
        reader.stdin.write(json.dumps({"lakehouse": str(lakehouse), "table": name}) + "\n")
        reader.stdin.flush()
        answer = json.loads(reader.stdout.readline() or '{"error": "the reader ended"}')
        if "error" in answer:
            raise OSError(f"reading {name} in the private volume: {answer['error']}")
        rows: list[dict[str, Any]] = answer["rows"]
        return rows

    def _reader(self) -> subprocess.Popen[str]:
        if self.reader is None or self.reader.poll() is not None:
            repo = Path(__file__).resolve().parents[2]
            env = {**os.environ, "PYTHONPATH": str(repo)}
            self.reader = subprocess.Popen(
                [*self.enter, sys.executable, "-m", "tests.integration.full_volume", "--rows"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=repo,
                env=env,
                text=True,
            )
        return self.reader

    def close(self) -> None:
        for process in (self.reader, self.holder):
            if process is not None and process.poll() is None:
                _close(process.stdin)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.reader = self.holder = None


def _close(stream: IO[str] | None) -> None:
    if stream is not None:
        stream.close()


def serve_rows() -> None:
    """Answer ``{"lakehouse", "table"}`` lines on stdin with the table's rows as one JSON line each."""
    from connectors.delta.tables import read_table

    for line in sys.stdin:
        request = json.loads(line)
        try:
            rows = read_table(request["lakehouse"], request["table"]).to_pylist()
            answer = json.dumps({"rows": rows}, default=str)
        except Exception as err:  # the asking test decides (it retries an OSError)
            answer = json.dumps({"error": f"{type(err).__name__}: {err}"})
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()


if __name__ == "__main__" and sys.argv[1:] == ["--rows"]:
    serve_rows()
elif __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))), flush=True)
    # After an ENOSPC, delta-rs's runtime may abort at interpreter teardown (SIGABRT, "terminate called
    # without an active exception", about one exit in four here): what was to be seen is printed.
    sys.stderr.flush()
    os._exit(0)
