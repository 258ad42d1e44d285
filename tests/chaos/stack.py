"""The chaos suite's stack: simulator → real ZooKeeper → ``bkaudit watch`` → broker → ``bkaudit stream``.

One :class:`ChaosStack` per test module: a simulated cluster in a fresh chroot of the suite's own
ZooKeeper (a few bookies, a few hundred ledgers), the watcher and the job as real subprocesses (each in its
own session, so ``kill -9`` takes a process and all its children), private topics, lakehouse and
checkpoint. Faults are injected from the test; afterwards the checks say what a correct auditor must show:

- :meth:`ChaosStack.settle`: the Delta tables equal the simulator's ground truth (live and deleted ledgers,
  bookies and their loss, open alerts within ``alerts ∪ may_alert``); each settled truth is remembered;
- :meth:`ChaosStack.lost_alerts`: every alert a settled truth required appeared as ``firing`` on the alerts
  topic, and every transition in ``violations`` and every open alert is there too (duplicates allowed);
- :meth:`ChaosStack.wait_read_to_end` and :meth:`ChaosStack.kafka_dead_letters`: the job read every
  partition of the changes topic to its end, and records it rejected are dead letters with a reason.

Every wait is bounded and fails with a message naming what it waited for and what it saw last.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bkaudit.sim.cluster import SimulatedCluster
from bkaudit.sim.truth import ClusterSnapshot, TruthParameters, ground_truth
from bkaudit.testing.harness import ServiceHarness
from bkaudit.testing.kafka_io import end_offsets
from connectors.delta.tables import read_table
from connectors.kafka.topics import ensure_topic
from connectors.process import free_port
from core.settings import KafkaSettings, ObjectStoreSettings
from tests.integration.event_fixtures import alerts_on
from tests.integration.job_process import JobRun, kill_group, planned_offsets

PARTITIONS = 2
GRACE_S = 30
PROBE_TIMEOUT_S = 0.5
SETTLE_TIMEOUT_S = 180.0
#: Kinds every test compares with the truth (probe-driven kinds need scrutiny, which the suite leaves off).
ALWAYS = (
    "BOOKIE_LOST",
    "LEDGER_UNDER_REPLICATED",
    "LEDGER_UNRECOVERABLE",
    "PLACEMENT_NOT_ADHERING",
    "PLACEMENT_SOFT",
    "METADATA_CORRUPT",
    "UNDER_REPLICATION_STUCK",
)
#: Short event-time delays: a lost bookie is alerted within a second or two of its loss.
STREAM_SETTINGS = {
    "WATERMARK_DELAY_S": "2",
    "DEFAULT_RECOVERY_DELAY_S": "0",
    "PROBE_TIMEOUT_S": str(PROBE_TIMEOUT_S),
    "REPROBE_DELAY_S": "1",
    "REPROBE_ROUNDS": "2",
    "UNDER_REPLICATION_GRACE_S": str(GRACE_S),
}
WATCHER_SETTINGS = {
    "HEARTBEAT_INTERVAL_S": "0.5",
    "RACK_MAP_ZNODE": "/bookies",
    "PROGRESS": "off",
    "SHUTDOWN_TIMEOUT_S": "5",
}
REGISTRATION_STATUS = {"writable": "WRITABLE", "readonly": "READ_ONLY", "none": "GONE"}


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, *, every_s: float = 0.5) -> Any:
    """Poll ``check`` until it returns a truthy value (returned); fail naming ``what`` after ``timeout_s``.

    ``check`` may raise :class:`AssertionError` to stop at once (a process died, say).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


def tail(path: Path, lines: int = 30) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


def job_log_tail(text: str, lines: int = 15) -> str:
    """The job log's last lines without the py4j and Python-worker chatter that fills it."""
    noise = ("py4j.clientserver", "Python worker", "falling behind")
    kept = [line for line in text.splitlines() if line.strip() and not any(n in line for n in noise)]
    return "\n".join(kept[-lines:])


def last_line(path: Path) -> str:
    lines = [line for line in tail(path, 200).splitlines() if line.strip()]
    return lines[-1] if lines else ""


@dataclass
class WatcherProcess:
    """``bkaudit watch`` as a subprocess in its own session (its log is its stdout and stderr)."""

    root: Path
    env: Mapping[str, str]
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def log(self) -> Path:
        return self.root / f"watcher-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bkaudit.cli.main", "watch"],
                env=dict(self.env),
                cwd=self.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill9(self) -> None:
        if self.process is not None:
            kill_group(self.process)

    def stop(self) -> None:
        """SIGTERM (a clean stop flushes Kafka); SIGKILL if it is still there after 20 s."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            kill_group(self.process)

    def snapshots_started(self) -> int:
        return tail(self.log, 100_000).count(") started")


@dataclass
class JobProcess:
    """One running ``bkaudit stream`` (long-running mode) of a :class:`JobRun`."""

    run: JobRun
    attempt: int | str
    process: subprocess.Popen[bytes]

    def alive(self) -> bool:
        return self.process.poll() is None

    def exit_code(self) -> int | None:
        return self.process.poll()

    def log_tail(self, lines: int = 30) -> str:
        return self.run.log_tail(self.attempt, lines)

    def kill9(self) -> None:
        kill_group(self.process)

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            kill_group(self.process)


@dataclass
class ChaosStack:
    """Simulator, watcher and job of one scenario module, plus the truths it has settled on."""

    services: ServiceHarness
    root: Path
    cluster: SimulatedCluster
    kafka: KafkaSettings
    run: JobRun
    watcher: WatcherProcess
    metrics_port: int
    job: JobProcess | None = None
    job_starts: int = 0
    deleted: set[int] = field(default_factory=set)
    truths: list[dict[str, Any]] = field(default_factory=list)
    #: alert transitions published before the alerts topic lost its history (not expected on it any more)
    forgotten: set[tuple[str, str]] = field(default_factory=set)
    #: reads a table's rows where this process cannot open the lakehouse itself (a private volume's)
    read_rows: Callable[[str], list[dict[str, Any]]] | None = None

    # -- processes ----------------------------------------------------------------------------------------
    def base_env(self) -> dict[str, str]:
        """The settings both processes share (the BookKeeper cluster, Kafka), nothing from this process."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("BKAUDIT_")}
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        env.update(
            {
                "TMPDIR": str(self.root / "tmp"),
                "BKAUDIT_ZOOKEEPER__CONNECT": self.cluster.zk_hosts,
                "BKAUDIT_ZOOKEEPER__SESSION_TIMEOUT_S": "10",
                "BKAUDIT_KAFKA__BOOTSTRAP_SERVERS": self.kafka.bootstrap_servers,
                "BKAUDIT_KAFKA__CHANGES_TOPIC": self.kafka.changes_topic,
                "BKAUDIT_KAFKA__ALERTS_TOPIC": self.kafka.alerts_topic,
                "BKAUDIT_KAFKA__FEEDBACK_TOPIC": self.kafka.feedback_topic,
                "BKAUDIT_KAFKA__TOPIC_PARTITIONS": str(PARTITIONS),
                "BKAUDIT_KAFKA__REQUEST_TIMEOUT_MS": str(self.kafka.request_timeout_ms),
            }
        )
        return env

    def start_job(self) -> JobProcess:
        self.job_starts += 1
        self.job = JobProcess(self.run, self.job_starts, self.run.start(self.job_starts, available_now=False))
        return self.job

    def require_alive(self) -> None:
        """Fail at once (with the log's tail) when the job or the watcher has died."""
        if self.job is not None and not self.job.alive():
            log = job_log_tail(self.job.log_tail(400), 30)
            raise AssertionError(f"the job exited with {self.job.exit_code()}:\n{log}")
        if not self.watcher.alive():
            raise AssertionError(f"the watcher exited:\n{tail(self.watcher.log)}")

    def close(self) -> None:
        """Tear down (the job is killed: its checkpoint and tables are thrown away anyway)."""
        if self.job is not None and self.job.alive():
            self.job.kill9()
        self.watcher.stop()
        self.cluster.close()

    def restore_bookies(self) -> list[str]:
        """Restart every bookie an earlier scenario stopped (their alerts resolve); returns them."""
        down = [b for b, info in self.truth()["bookies"].items() if info["registration"] == "none"]
        for bookie_id in down:
            self.cluster.restart_bookie(bookie_id)
        return down

    def start_healthy(self, scenario: str) -> None:
        """A scenario's starting point: every bookie back, the tables equal to the truth."""
        returned = self.restore_bookies()
        self.settle(f"before {scenario}" + (f", {', '.join(returned)} restarted" if returned else ""))

    def describe(self) -> str:
        """Where to look when something fails: the processes' logs and the last batches."""
        job = (
            f"job attempt {self.job.attempt} ({'running' if self.job.alive() else self.job.exit_code()}):\n"
            f"{job_log_tail(self.job.log_tail(400))}"
            if self.job is not None
            else "no job"
        )
        return (
            f"{job}\nwatcher ({'running' if self.watcher.alive() else 'exited'}):\n"
            f"{tail(self.watcher.log, 10)}\ncheckpoint: planned {self.run.last('offsets')}, "
            f"committed {self.run.last('commits')}"
        )

    # -- the cluster --------------------------------------------------------------------------------------
    def truth(self, snapshot: ClusterSnapshot | None = None) -> dict[str, Any]:
        return ground_truth(
            snapshot or self.cluster.snapshot(),
            TruthParameters(probe_timeout_s=PROBE_TIMEOUT_S, under_replication_grace_s=GRACE_S),
        )

    def delete_ledger(self, ledger_id: int) -> None:
        self.cluster.delete_ledger(ledger_id)
        self.deleted.add(ledger_id)

    def churn_step(self, rng: random.Random) -> None:
        """One random metadata change of the kind a busy Pulsar cluster makes all the time."""
        ledgers = self.cluster.ledger_ids()
        choice = rng.random()
        if choice < 0.45 or len(ledgers) < 50:
            self.cluster.create_ledger(entries=2, close=rng.random() < 0.8)
        elif choice < 0.75:
            self.delete_ledger(rng.choice(ledgers))
        else:
            open_ledgers = [i for i in ledgers if self.cluster.ledger_metadata(i).state.value == "OPEN"]
            if open_ledgers:
                self.cluster.close_ledger(rng.choice(open_ledgers))
            else:
                self.cluster.create_ledger(entries=2, close=False)

    @contextlib.contextmanager
    def churning(self, rng: random.Random, every_s: float = 0.2) -> Iterator[None]:
        """Random metadata changes in the background while the block runs (seeded sequence of changes)."""
        stop = threading.Event()
        failures: list[BaseException] = []

        def loop() -> None:
            while not stop.wait(every_s):
                try:
                    self.churn_step(rng)
                except BaseException as err:  # reported by the test thread below
                    failures.append(err)
                    return

        thread = threading.Thread(target=loop, name="churn", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=30)
        assert not failures, f"the simulator's churn failed: {failures[0]!r}"

    def lose_bookie(self, rng: random.Random) -> str:
        """Stop a random bookie for good (recovery delay 0: lost at once); returns its id."""
        running = [b for b, info in self.truth()["bookies"].items() if info["registration"] != "none"]
        victim = rng.choice(sorted(running))
        self.cluster.kill_bookie(victim)
        return victim

    # -- the tables against the truth -------------------------------------------------------------------
    def table(self, name: str) -> list[dict[str, Any]]:
        """A table's rows (none before the job's first write); a read racing the job's vacuum is retried."""
        for attempt in range(3):
            try:
                if self.read_rows is not None:
                    return self.read_rows(name)
                return read_table(self.run.lakehouse, name).to_pylist()
            except OSError:
                if attempt == 2:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")

    def mismatch(self, snapshot: ClusterSnapshot) -> dict[str, Any]:
        """How the Delta tables differ from the cluster at ``snapshot`` (empty when they agree)."""
        problems: dict[str, Any] = {}
        truth = self.truth(snapshot)
        corrupt = snapshot.corrupt_ledgers
        live = set(snapshot.ledgers) | corrupt
        rows = {r["ledger_id"]: r for r in self.table("ledgers")}
        shown_live = {i for i, r in rows.items() if not r["deleted"]}
        if shown_live != live:
            problems["ledgers"] = {
                "absent": sorted(live - set(rows))[:20],
                "marked_deleted": sorted(live & set(rows) - shown_live)[:20],
                "not_marked_deleted": sorted(shown_live - live)[:20],
            }
        wrong = []
        for ledger_id in sorted(live & shown_live - corrupt):
            row, md = rows[ledger_id], snapshot.ledgers[ledger_id]
            if (row["state"], row["last_entry_id"], row["bookies"]) != (
                md.state.value,
                md.last_entry_id,
                sorted(md.all_bookies),
            ):
                wrong.append(ledger_id)
        if wrong:
            problems["ledger_rows"] = wrong[:20]
        bookies = {r["bookie_id"]: r for r in self.table("bookies")}
        for bookie_id, info in truth["bookies"].items():
            row = bookies.get(bookie_id)
            want = (REGISTRATION_STATUS[info["registration"]], info["lost"])
            have = None if row is None else (row["status"], bool(row["lost"]))
            if have != want:
                problems.setdefault("bookies", {})[bookie_id] = {"want": want, "have": have}
        found: dict[str, set[str]] = {}
        for row in self.table("open_alerts"):
            found.setdefault(row["kind"], set()).add(row["entity"].split("/", 1)[-1])
        for kind in ALWAYS:
            required = {str(i) for i in truth["alerts"].get(kind, [])}
            allowed = required | {str(i) for i in truth.get("may_alert", {}).get(kind, [])}
            have_ids = found.get(kind, set())
            if not required <= have_ids or not have_ids <= allowed:
                problems.setdefault("open_alerts", {})[kind] = {
                    "missing": sorted(required - have_ids)[:20],
                    "extra": sorted(have_ids - allowed)[:20],
                }
        return problems

    def settle(self, what: str, timeout_s: float = SETTLE_TIMEOUT_S, *, alive: bool = True) -> float:
        """Wait until the tables equal the ground truth; remember that truth. Returns the seconds waited.

        ``alive``: fail at once when the job or the watcher dies meanwhile.
        """
        started = time.monotonic()
        last: dict[str, Any] = {}

        def agrees() -> bool:
            nonlocal last
            if alive:
                self.require_alive()
            snapshot = self.cluster.snapshot()
            last = self.mismatch(snapshot)
            if not last:
                self.truths.append(self.truth(snapshot))
            return not last

        try:
            wait_for(f"the tables to equal the ground truth ({what})", agrees, timeout_s)
        except AssertionError as err:
            raise AssertionError(f"{err}\nlast difference: {last}\n{self.describe()}") from None
        return time.monotonic() - started

    # -- alerts, offsets, dead letters -------------------------------------------------------------------
    def lost_alerts(self) -> dict[str, Any]:
        """What the alerts topic lacks: settled truths' alerts, ``violations`` transitions, open alerts."""
        published: set[tuple[str, str]] = set()
        firing: set[tuple[str, str]] = set()
        for key, alert in alerts_on(self.kafka):
            published.add((alert["alert_id"], alert["state"]))
            if alert["state"] == "firing":
                firing.add((alert["kind"], key.split("/", 1)[1].split("/", 1)[-1]))
        lost: dict[str, Any] = {}
        for index, truth in enumerate(self.truths):
            for kind in ALWAYS:
                missing = sorted(
                    str(i) for i in truth["alerts"].get(kind, []) if (kind, str(i)) not in firing
                )
                if missing:
                    lost.setdefault(f"truth {index}", {})[kind] = missing[:20]
        transitions = {(r["alert_id"], r["state"]) for r in self.table("violations")} - self.forgotten
        if transitions - published:
            lost["violations"] = sorted(transitions - published)[:20]
        open_ids = {(r["alert_id"], "firing") for r in self.table("open_alerts")}
        if open_ids - published:
            lost["open_alerts"] = sorted(open_ids - published)[:20]
        return lost

    def forget_alert_history(self) -> None:
        """The alerts topic lost its history (the broker lost its data): what was published is gone."""
        self.truths.clear()
        self.forgotten |= {(r["alert_id"], r["state"]) for r in self.table("violations")}

    def assert_no_alert_lost(self, timeout_s: float = 60.0) -> None:
        """Every alert the tables and the truths hold is on the topic. Waited for: the topic and the two
        tables are read one after the other (on a busy machine seconds apart) while a last batch may still
        publish and record, so one reading can see a table ahead of the topic; an alert that is on the
        topic a moment later was not lost."""
        deadline = time.monotonic() + timeout_s
        lost = self.lost_alerts()
        while lost and time.monotonic() < deadline:
            time.sleep(1.0)
            lost = self.lost_alerts()
        assert not lost, f"alerts missing from {self.kafka.alerts_topic}: {lost}"

    def topic_end_offsets(self) -> dict[str, int]:
        ends = end_offsets(self.kafka, self.kafka.changes_topic)
        return {str(partition): offset for partition, offset in ends.items()}

    def wait_read_to_end(self, timeout_s: float = 120.0) -> None:
        """Every partition of the changes topic, as it is now, is read by a committed batch of the job."""
        ends = self.topic_end_offsets()

        def committed_offsets() -> dict[str, int] | None:
            return planned_offsets(self.run).get(self.run.last("commits"))

        def read() -> bool:
            self.require_alive()
            done = committed_offsets()
            return bool(done) and all(done.get(p, -1) >= end for p, end in ends.items())

        try:
            wait_for(
                f"the job to commit a batch reading {self.kafka.changes_topic} to {ends}", read, timeout_s
            )
        except AssertionError as err:
            raise AssertionError(f"{err}; last committed batch read to {committed_offsets()}") from None

    def kafka_dead_letters(self) -> list[dict[str, Any]]:
        return [r for r in self.table("dead_letters") if r["source"] != "znode"]

    def metric_sum(self, name: str) -> float:
        """The sum of a metric's samples over all labels, from the job's Prometheus endpoint."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        return sum(
            float(line.split()[-1]) for line in text.splitlines() if line.startswith((name + " ", name + "{"))
        )

    def assert_final(self, what: str) -> None:
        """The closing checks of every scenario: tables = truth, read to the end, no alert lost."""
        self.settle(what)
        self.wait_read_to_end()
        self.assert_no_alert_lost()


def build_cluster(hosts: str, seed: int, ledgers: int) -> SimulatedCluster:
    """6 bookies in 3 racks, ``ledgers`` closed and open ledgers, a few badly placed, a few with WQ=1."""
    cluster = SimulatedCluster(
        hosts, racks=3, bookie_session_timeout_s=2.0, lost_bookie_recovery_delay_s=0, seed=seed
    )
    cluster.init()
    for _ in range(6):
        cluster.add_bookie()
    for index in range(ledgers):
        if index % 40 == 7:
            cluster.place_ledger_badly(ensemble_size=2, entries=2)
        elif index % 25 == 3:
            cluster.create_ledger(ensemble_size=2, write_quorum=1, ack_quorum=1, entries=2)
        else:
            cluster.create_ledger(
                entries=2,
                close=index % 10 != 0,
                managed_ledger=f"public/default/persistent/topic-{index % 16}",
            )
    return cluster


def object_store_env(store: ObjectStoreSettings | None) -> dict[str, str]:
    """``BKAUDIT_OBJECT_STORE__*`` variables for the job's settings ``store`` (nothing for none)."""
    if store is None:
        return {}
    values = store.model_dump(exclude_none=True)
    if store.secret_access_key is not None:
        values["secret_access_key"] = store.secret_access_key.get_secret_value()
    return {
        f"BKAUDIT_OBJECT_STORE__{k.upper()}": str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in values.items()
    }


@contextlib.contextmanager
def chaos_stack(
    services: ServiceHarness,
    root: Path,
    seed: int,
    *,
    ledgers: int = 200,
    watcher_settings: Mapping[str, str] | None = None,
    stream_settings: Mapping[str, str] | None = None,
    kafka_request_timeout_ms: int | None = None,
    object_store: ObjectStoreSettings | None = None,
) -> Iterator[ChaosStack]:
    """Build the stack, start the watcher and the job, wait until the job has ingested the snapshot.

    ``object_store``: the job keeps its tables and checkpoint files there (``lakehouse_url`` and
    ``checkpoint_url`` set) and takes the ZooKeeper lease, which such a checkpoint needs."""
    chroot = services.new_chroot()
    cluster = build_cluster(services.zookeeper_hosts(chroot), seed, ledgers)
    kafka = services.kafka_settings(topic_partitions=PARTITIONS)
    if kafka_request_timeout_ms is not None:  # both processes give up on a request this soon
        kafka = kafka.model_copy(update={"request_timeout_ms": kafka_request_timeout_ms})
    ensure_topic(kafka, kafka.changes_topic, partitions=PARTITIONS)
    metrics_port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    stack = ChaosStack(
        services=services,
        root=root,
        cluster=cluster,
        kafka=kafka,
        run=JobRun(root / "job", kafka, {}, "bkaudit-chaos", PARTITIONS),
        watcher=WatcherProcess(root, {}),
        metrics_port=metrics_port,
    )
    env = stack.base_env()
    remote = object_store_env(object_store)
    stack.run = JobRun(
        root / "job",
        kafka,
        {
            **STREAM_SETTINGS,
            "METRICS_PORT": str(metrics_port),
            **({"LEASE": "zookeeper"} if object_store else {}),
            **(stream_settings or {}),
        },
        "bkaudit-chaos",
        PARTITIONS,
        extra_env={
            **{
                k: v
                for k, v in env.items()
                if k.startswith(("BKAUDIT_ZOOKEEPER", "BKAUDIT_KAFKA__REQUEST_TIMEOUT_MS"))
            },
            **remote,
        },
        lakehouse_url=object_store.lakehouse_url if object_store else None,
        checkpoint_url=object_store.checkpoint_url if object_store else None,
    )
    stack.watcher = WatcherProcess(
        root,
        {
            **env,
            **{
                f"BKAUDIT_WATCHER__{k}": v
                for k, v in {**WATCHER_SETTINGS, **(watcher_settings or {})}.items()
            },
        },
    )
    try:
        stack.watcher.start()
        stack.start_job()
        stack.settle("the job ingested the watcher's START snapshot", timeout_s=300)
        yield stack
    finally:
        stack.close()
