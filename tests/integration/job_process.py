"""``bkaudit stream`` as a real subprocess, for tests that kill it: start, SIGKILL, restart, compare.

Shared by the chaos suite (``tests/chaos``) and the real-bookie stack (``tests/realstack.py``). A
:class:`JobRun` is where one run of the job keeps its state (lakehouse, checkpoint, logs) and the topics it
reads and writes; each attempt is a process started in a new session, so the Python driver, its JVM and
the Python workers form one process group and a SIGKILL takes them together (:func:`kill_group`).

The ledger lane's batch logs tell where a kill landed: ``ledger-lane/offsets/`` (planned) and
``ledger-lane/state/`` (done), and :func:`planned_offsets` which changes-topic offsets each batch read.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from connectors import storage
from connectors.delta.tables import TABLES, read_table, table_path
from core.settings import KafkaSettings
from tests.integration.event_fixtures import alerts_on

DEFAULT_APP_ID = "bkaudit-crash-test"
DEFAULT_TIMEOUT_S = 400.0


@dataclass(frozen=True)
class JobRun:
    """Where one run of the job keeps its state, the topics it uses, and its ``BKAUDIT_STREAM__*`` knobs.

    ``extra_env`` holds any other ``BKAUDIT_*`` variables (e.g. a metrics port); ``partitions`` is the
    changes topic's partition count the job creates topics with; ``command_prefix`` runs the job (and
    :func:`tests.chaos.recovery.bkaudit`'s commands) through another command, e.g. into a private volume's
    namespace (:class:`tests.integration.full_volume.PrivateVolume`).
    """

    root: Path
    kafka: KafkaSettings
    stream_settings: Mapping[str, str] = field(default_factory=dict)
    app_id: str = DEFAULT_APP_ID
    partitions: int = 2
    extra_env: Mapping[str, str] = field(default_factory=dict)
    command_prefix: tuple[str, ...] = ()
    #: ``s3://…`` locations of the tables and of the checkpoint's files (``object_store.lakehouse_url`` and
    #: ``checkpoint_url``, set in ``extra_env``); None: under ``root``. The test process reads them through
    #: :mod:`connectors.storage` with its own ``AWS_*`` variables.
    lakehouse_url: str | None = None
    checkpoint_url: str | None = None

    @property
    def lakehouse(self) -> Path:
        return self.lakehouse_url or self.root / "lakehouse"  # type: ignore[return-value]  # str on S3

    @property
    def checkpoint(self) -> Path:
        if self.checkpoint_url:
            return storage.join(self.checkpoint_url, self.app_id)  # type: ignore[return-value]  # str on S3
        return self.root / "checkpoints" / self.app_id

    def log_path(self, attempt: int | str) -> Path:
        return self.root / f"attempt-{attempt}.log"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BKAUDIT_")}
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        env.update(
            {
                "TMPDIR": str(self.root / "tmp"),  # a killed JVM leaves its scratch files here, not in /tmp
                "BKAUDIT_LAKEHOUSE_ROOT": str(self.lakehouse),
                "BKAUDIT_CHECKPOINT_ROOT": str(self.root / "checkpoints"),
                "BKAUDIT_KAFKA__BOOTSTRAP_SERVERS": self.kafka.bootstrap_servers,
                "BKAUDIT_KAFKA__CHANGES_TOPIC": self.kafka.changes_topic,
                "BKAUDIT_KAFKA__ALERTS_TOPIC": self.kafka.alerts_topic,
                "BKAUDIT_KAFKA__FEEDBACK_TOPIC": self.kafka.feedback_topic,
                "BKAUDIT_KAFKA__TRACKED_TOPIC": self.kafka.tracked_topic,
                "BKAUDIT_KAFKA__DECISIONS_TOPIC": self.kafka.decisions_topic,
                "BKAUDIT_KAFKA__TOPIC_PARTITIONS": str(self.partitions),
                "BKAUDIT_SPARK__MASTER": "local[2]",
                "BKAUDIT_SPARK__SHUFFLE_PARTITIONS": "2",
                "BKAUDIT_SPARK__UI_ENABLED": "false",
                "BKAUDIT_SPARK__DRIVER_MEMORY": "1g",
                "BKAUDIT_SPARK__EXTRA_CONF": json.dumps({"spark.local.dir": str(self.root / "tmp")}),
                "BKAUDIT_STREAM__APP_ID": self.app_id,
                **{f"BKAUDIT_STREAM__{k}": v for k, v in self.stream_settings.items()},
                **self.extra_env,
            }
        )
        return env

    def start(self, attempt: int | str, *, available_now: bool = True) -> subprocess.Popen[bytes]:
        """Start ``bkaudit stream`` (``--available-now`` unless told otherwise); output to its attempt log."""
        self.root.mkdir(parents=True, exist_ok=True)
        log = self.log_path(attempt).open("wb")
        args = ["stream", "--available-now"] if available_now else ["stream"]
        # A new session: the JVM and the Python workers are in the driver's process group, killed together.
        return subprocess.Popen(
            [*self.command_prefix, sys.executable, "-m", "bkaudit.cli.main", *args],
            env=self.env(),
            cwd=self.root,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log_tail(self, attempt: int | str, lines: int = 40) -> str:
        path = self.log_path(attempt)
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def log_file(self, log: str, batch_id: int) -> Path:
        """One batch's file in the ledger lane's ``offsets`` (planned) or ``commits`` (done) log: the
        lane's offset log and saved states."""
        folder = "offsets" if log == "offsets" else "state"
        return storage.join(self.checkpoint, "ledger-lane", folder, f"{batch_id}.json")  # type: ignore[return-value]

    def batch_ids(self, log: str) -> list[int]:
        """Batch ids in the ledger lane's ``offsets`` (planned) or ``commits`` (done) log."""
        folder = storage.join(self.checkpoint, "ledger-lane", "offsets" if log == "offsets" else "state")
        return sorted(
            int(name.removesuffix(".json")) for name in storage.list_files(folder) if _batch_file(name)
        )

    def last(self, log: str) -> int:
        ids = self.batch_ids(log)
        return ids[-1] if ids else -1

    def planned_end(self, batch_id: int) -> dict[str, int] | None:
        """The changes-topic end offsets batch ``batch_id`` planned (``{"partition": offset}``); raises
        OSError or ValueError while the file is being written."""
        folder = storage.join(self.checkpoint, "ledger-lane", "offsets", f"{batch_id}.json")
        return json.loads(storage.read_bytes(folder))["end"].get(self.kafka.changes_topic)

    def queued_batches(self) -> list[int]:
        """Batches whose decisions wait in the checkpoint's sink queue (handed over, not applied yet)."""
        files = storage.list_files(storage.join(self.checkpoint, "sink-queue"))
        return sorted(int(name.removesuffix(".arrow")) for name in files if name.endswith(".arrow"))

    def tables_with_batch(self, batch_id: int) -> list[str]:
        """Tables that already committed ``batch_id`` (the sink had started writing when the job died)."""
        return sorted(
            name
            for name in TABLES
            if DeltaTable(table_path(self.lakehouse, name)).transaction_version(self.app_id) == batch_id
        )


def run_to_completion(run: JobRun, attempt: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> float:
    """Run one ``--available-now`` attempt to its end (exit 0 asserted); returns its seconds."""
    started = time.monotonic()
    process = run.start(attempt)
    try:
        code = process.wait(timeout=timeout_s)
    finally:
        if process.poll() is None:
            kill_group(process)
    assert code == 0, f"attempt {attempt} exited with {code}:\n{run.log_tail(attempt)}"
    return time.monotonic() - started


@dataclass(frozen=True)
class Kill:
    """Where one SIGKILL landed: the last batch planned and committed then (:meth:`JobRun.batch_ids`), and
    the batches the lane had handed to the sink that the sink had not applied (``sink-queue/``)."""

    mode: str
    after_s: float
    last_planned: int
    last_committed: int
    tables_already_written: tuple[str, ...]
    queued: tuple[int, ...] = ()

    @property
    def mid_batch(self) -> bool:
        return self.last_planned > self.last_committed or bool(self.queued)


def delta_commit_counts(lakehouse: Path) -> dict[str, int]:
    """Commit files per table the sink writes in its batches: a change means it has just committed one
    (``ledgers`` is left out: only the background fold writes it)."""
    counts = {}
    for name in TABLES:
        if name == "ledgers":
            continue
        log = storage.join(table_path(lakehouse, name), "_delta_log")
        counts[name] = sum(1 for f in storage.list_files(log) if f.endswith(".json"))
    return counts


def sink_committed_since(run: JobRun, before: dict[str, int]) -> bool:
    """Whether a table has committed a batch of the ledger lane's sink (its app transaction, ``run.app_id``)
    since ``before`` (:func:`delta_commit_counts`); the membership lane commits under an id of its own."""
    for name, count in delta_commit_counts(run.lakehouse).items():
        log = storage.join(table_path(run.lakehouse, name), "_delta_log")
        for version in range(before.get(name, 0), count):
            with contextlib.suppress(FileNotFoundError):  # counted files are versions 0..count-1
                text = storage.read_bytes(storage.join(log, f"{version:020d}.json")).decode()
                for line in text.splitlines():
                    if json.loads(line).get("txn", {}).get("appId") == run.app_id:
                        return True
    return False


def kill_during_batch(
    run: JobRun,
    attempt: int,
    after_commit: int,
    mode: str,
    phase_s: float,
    *,
    available_now: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Kill:
    """Start the job, wait until batch ``after_commit`` is committed and applied by the sink, then SIGKILL
    the process group:

    - ``random``: ``phase_s`` later, i.e. somewhere in the following micro-batch (or the gap before it);
    - ``sink``: as soon as the sink commits its first table of the following batch, so the batch is left
      half written to Delta (the replay must skip the tables that have it and write the others alike).
    """
    started = time.monotonic()
    process = run.start(attempt, available_now=available_now)
    deadline = started + timeout_s

    def wait_for(what: str, condition: Callable[[], bool]) -> None:
        while not condition():
            if process.poll() is not None:
                raise AssertionError(
                    f"attempt {attempt} ended (exit {process.returncode}) before its kill, while waiting "
                    f"for {what}:\n{run.log_tail(attempt)}"
                )
            if time.monotonic() > deadline:
                kill_group(process)
                raise AssertionError(
                    f"attempt {attempt}: no {what} within {timeout_s:.0f} s:\n{run.log_tail(attempt)}"
                )
            time.sleep(0.02)

    def applied(batch_id: int) -> bool:
        # Spark recorded it done, and the sink applied it (it is no longer queued for the sink).
        return run.last("commits") >= batch_id and not any(q <= batch_id for q in run.queued_batches())

    wait_for(f"commit of batch {after_commit}", lambda: applied(after_commit))
    if mode == "sink":
        before = delta_commit_counts(run.lakehouse)
        wait_for("the sink's Delta commit of the next batch", lambda: sink_committed_since(run, before))
    else:
        time.sleep(phase_s)
    kill_group(process)
    planned, committed = run.last("offsets"), run.last("commits")
    queued = run.queued_batches()
    unfinished = queued[0] if queued else planned if planned > committed else None
    written = run.tables_with_batch(unfinished) if unfinished is not None else []
    return Kill(mode, round(time.monotonic() - started, 1), planned, committed, tuple(written), tuple(queued))


def kill_group(process: subprocess.Popen[Any]) -> None:
    """SIGKILL ``process``'s process group (started with ``start_new_session``) and wait until it is gone."""
    with contextlib.suppress(ProcessLookupError):  # already gone: the leader was reaped, no member left
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    wait_until_group_gone(process.pid)


def _live_members(pgid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone while we looked
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            members.append(int(stat.parent.name))
    return members


def wait_until_group_gone(pgid: int, timeout_s: float = 15.0) -> None:
    # The restart must not race a dying JVM that still writes to the checkpoint or the tables.
    deadline = time.monotonic() + timeout_s
    while members := _live_members(pgid):
        assert time.monotonic() < deadline, f"process group {pgid} still alive after SIGKILL: {members}"
        time.sleep(0.05)


def _batch_file(name: str) -> bool:
    return name.removesuffix(".json").isdigit()


def table_rows(lakehouse: Path) -> dict[str, list[str]]:
    """Every table's rows, canonical and sorted (row order in Delta files is not part of the contract)."""
    return {
        name: sorted(
            json.dumps(row, sort_keys=True, default=str) for row in read_table(lakehouse, name).to_pylist()
        )
        for name in TABLES
    }


def alerts_by_id(kafka: KafkaSettings) -> tuple[dict[str, set[str]], Counter[str]]:
    """alert id → the distinct ``key + alert`` contents published for it, and how often each was published."""
    contents: dict[str, set[str]] = defaultdict(set)
    copies: Counter[str] = Counter()
    for key, alert in alerts_on(kafka):
        content = json.dumps({"key": key, **alert}, sort_keys=True)
        contents[alert["alert_id"]].add(content)
        copies[content] += 1
    return dict(contents), copies


def assert_same_alert_transitions(expected: dict[str, set[str]], kafka: KafkaSettings) -> Counter[str]:
    """Every alert id of ``expected`` (:func:`alerts_by_id`) and no other on ``kafka``'s alerts topic, each
    with the same transitions (a replayed batch may only add copies); returns the copies per content."""
    actual, copies = alerts_by_id(kafka)
    assert set(actual) == set(expected)  # no alert id lost, none invented
    for alert_id, contents in expected.items():
        assert actual[alert_id] == contents, alert_id
    return copies


def planned_offsets(run: JobRun) -> dict[int, dict[str, int] | None]:
    """batch id → the changes-topic end offsets it planned (``{"partition": offset}``), from its log."""
    plans: dict[int, dict[str, int] | None] = {}
    for batch_id in run.batch_ids("offsets"):
        try:
            plans[batch_id] = run.planned_end(batch_id)
        except (OSError, ValueError):
            continue  # being written right now
    return plans
