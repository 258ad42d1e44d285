"""`bkaudit demo`: the whole product on the embedded default cluster, with a short scripted story.

Starts the embedded ZooKeeper and broker, a simulated BookKeeper cluster (6 bookies in 3 racks, Pulsar-style
ledgers), the ZooKeeper watcher and the Structured Streaming auditor, then breaks the cluster step by step
and prints every alert as it arrives on the alerts topic:

1. a bookie dies (lostBookieRecoveryDelay 0) → BOOKIE_LOST and exactly its ledgers under-replicated;
2. a rack loses its diversity (two bookies moved into one rack) → PLACEMENT_NOT_ADHERING;
3. a bookie flaps for 2 s under a 30 s delay → no alert, the flap is counted;
4. a bookie goes silent (a DbLedgerStorage bookie) → re-probed, then BOOKIE_UNRESPONSIVE, not a data alert.

It ends with a table of open alerts per kind next to the simulator's ground truth. The Delta tables stay
under ``<lakehouse_root>/demo`` for querying afterwards. The same story on real bookies is
:mod:`bkaudit.demo_real` (``bkaudit demo --bookkeeper real``).

Example:
    $ bkaudit demo
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from itertools import combinations
from pathlib import Path
from typing import Any, TextIO

from core.domain.rackmap import PULSAR_RACK_MAP_ZNODE
from core.settings import Settings

STEP_TIMEOUT_S = 90.0
#: The longest wait for the silent bookie's alert (it comes in under a minute on a quiet machine).
SILENT_STEP_TIMEOUT_S = 300.0
#: How long a demo waits for the timers query's first batch with input before the silent-bookie step: the
#: re-probe rounds go through that query, and its first batch (a Python worker, a state store) takes
#: seconds on a quiet machine and minutes on a busy one (116 s beside two CPU hogs).
TIMERS_WARM_TIMEOUT_S = 300.0
#: The demo's Spark JVM lives for minutes: C1 alone compiles enough, at ~40% less start-up CPU than C2 too.
DEMO_SPARK_CONF = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}


class _Printer:
    """Narration and alerts on one stream, timestamped from the demo's start, and a progress line for the
    long phases: rewritten in place on a terminal, otherwise a line when it changed, at most every 5 s."""

    PROGRESS_EVERY_S = 5.0

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.terminal = out.isatty()
        self._progress_shown = False  # a terminal's progress line waits to be replaced
        self._last_progress: tuple[float, str] = (0.0, "")

    def _stamp(self, text: str) -> str:
        return f"[{time.monotonic() - self.started:6.1f}s] {text}"

    def say(self, text: str) -> None:
        with self.lock:
            if self._progress_shown:
                self.out.write("\r\033[K")
                self._progress_shown = False
            self.out.write(self._stamp(text) + "\n")
            self.out.flush()

    def progress(self, text: str) -> None:
        with self.lock:
            if self.terminal:
                self.out.write("\r\033[K" + self._stamp(text))
                self._progress_shown = True
            else:
                at, last = self._last_progress
                if text == last or time.monotonic() - at < self.PROGRESS_EVERY_S:
                    return
                self.out.write(self._stamp(text) + "\n")
                self._last_progress = (time.monotonic(), text)
            self.out.flush()


class _AlertTail(threading.Thread):
    """Follows the alerts topic and prints each transition as it arrives."""

    def __init__(self, settings: Settings, printer: _Printer) -> None:
        super().__init__(name="demo-alerts", daemon=True)
        self.settings, self.printer = settings, printer
        self.stop_requested = threading.Event()
        self.seen: list[dict[str, Any]] = []

    def run(self) -> None:
        from confluent_kafka import Consumer

        from connectors.kafka.client_config import assign_from_beginning, consumer_config

        consumer = Consumer(consumer_config(self.settings.kafka, None))
        try:
            assign_from_beginning(consumer, self.settings.kafka.alerts_topic, 30.0)
            while not self.stop_requested.is_set():
                for record in consumer.consume(num_messages=500, timeout=0.3):
                    value = record.value() if record.error() is None else None
                    if value:
                        alert = json.loads(value)
                        self.seen.append(alert)
                        entity = (
                            f"ledger {alert['ledger_id']}"
                            if alert["ledger_id"] is not None
                            else (alert["bookies"] or ["the rack map"])[0]
                        )
                        topic = f"  ({alert['pulsar_topic']})" if alert.get("pulsar_topic") else ""
                        self.printer.say(
                            f"  ALERT {alert['state']:8} {alert['severity']:8} {alert['kind']:24} "
                            f"{entity}{topic}"
                        )
        finally:
            consumer.close()


def _wait(what: str, check: Callable[[], bool], printer: _Printer, timeout: float = STEP_TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.5)
    printer.say(f"  (gave up waiting for {what} after {timeout:.0f} s)")
    return False


def timers_warm(queries: Any) -> bool:
    """Whether the job's timers query finished a batch that had input (its Python worker and state store
    are up), so that a re-probe round costs one micro-batch, not the query's start-up."""
    timers = getattr(queries, "timers", None)
    if timers is None:
        return True
    return any((p.get("numInputRows") or 0) > 0 for p in timers.recentProgress)


def wait_for_timers(queries: Any, printer: _Printer) -> None:
    """Before a step that needs re-probes: wait (and say so) until the timers query is warm."""
    if not timers_warm(queries):
        printer.say(
            "  (before step 4: the auditor's timers query finishes its first batch; re-probes go through it)"
        )
        _wait("the timers query's first batch", lambda: timers_warm(queries), printer, TIMERS_WARM_TIMEOUT_S)


def demo_run_settings(settings: Settings, lakehouse: Path, hosts: str, kafka: str, stamp: str) -> Settings:
    """The demo's settings: its own tables, checkpoint, topics and ZooKeeper chroot, and short delays."""
    return settings.model_copy(
        update={
            "lakehouse_root": lakehouse,
            "checkpoint_root": settings.checkpoint_root / f"demo-{stamp}",
            "zookeeper": settings.zookeeper.model_copy(update={"connect": hosts}),
            "spark": settings.spark.model_copy(
                update={"extra_conf": {**DEMO_SPARK_CONF, **settings.spark.extra_conf}}
            ),
            "kafka": settings.kafka.model_copy(
                update={
                    "bootstrap_servers": kafka,
                    "changes_topic": f"bkaudit.demo.{stamp}.changes",
                    "alerts_topic": f"bkaudit.demo.{stamp}.alerts",
                    "feedback_topic": f"bkaudit.demo.{stamp}.feedback",
                    "topic_partitions": 2,
                }
            ),
            "watcher": settings.watcher.model_copy(
                update={
                    "heartbeat_interval_s": 0.5,
                    "rack_map_znode": PULSAR_RACK_MAP_ZNODE,
                    "progress": "auto",
                }
            ),
            "stream": settings.stream.model_copy(
                update={
                    "app_id": f"bkaudit-demo-{stamp}",
                    "watermark_delay_s": 1.0,
                    "probe_timeout_s": 0.5,
                    "reprobe_delay_s": 1.0,
                    "reprobe_rounds": 2,
                    "scrutiny_ledgers_per_s": 20.0,
                }
            ),
        }
    )


def stop_pipeline(tail: Any, query: Any, sink: Any, watcher: Any) -> None:
    """Stop what a demo started, in order, whichever parts did start (None: not started): the alert tail,
    the job (gracefully, then its sink) and the watcher."""
    from streaming import job

    if tail is not None:
        tail.stop_requested.set()
    if query is not None:
        job.stop_gracefully(query, sink, timeout_s=30)
    if sink is not None:
        sink.close()
    if watcher is not None:
        watcher.stop()


def say_what_if(printer: _Printer, lakehouse: Path, truth: dict[str, dict[str, list[int]]]) -> None:
    """Ask the tables what losing the worst pair of bookies would do, as an SRE would before maintenance."""
    from connectors.delta.queries import Lakehouse

    pair = max(truth, key=lambda key: (len(truth[key]["UNRECOVERABLE"]), key))
    down = pair.split(",")
    with Lakehouse(lakehouse) as tables:
        answer = tables.what_if(down)
    counts = ", ".join(f"{count} {verdict}" for verdict, count in answer.by_verdict.items())
    printer.say(f"WHAT IF {' and '.join(down)} went down now? ({counts})")
    printer.say(
        f"  safe: {'yes' if answer.safe else 'no'}; see bkaudit query what-if --down {' --down '.join(down)}"
    )


def print_comparison(printer: _Printer, rows: list[tuple[str, int, int]], truth_name: str) -> bool:
    """The closing table: open alerts per kind beside the ground truth; True when every row agrees."""
    printer.say(f"SUMMARY: open alerts per kind (auditor vs {truth_name})")
    printer.say(f"  {'kind':28} {'auditor':>8} {'truth':>6}")
    for kind, have, want in rows:
        printer.say(f"  {kind:28} {have:>8} {want:>6}")
    matches = all(have == want for _, have, want in rows)
    printer.say(f"  auditor matches the ground truth: {'yes' if matches else 'NO'}")
    return matches


def _bookie_server_tls(cluster_services: Any) -> dict[str, Any]:
    """With ``dev.tls``: the simulated bookies' TLS (``START_TLS`` with the throwaway CA's server pair,
    client certificates required) and authorization (BookieAuthZFactory: every request refused until a
    handshake whose certificate carries the dev role), as the bookies of a secured cluster; none without."""
    if cluster_services.tls is None:
        return {}
    from connectors.bookie.tls import server_tls_context
    from connectors.tls import BOOKIE_ROLE

    files = cluster_services.tls
    context = server_tls_context(
        files.keystore, files.keystore, ca_file=files.cafile, require_client_cert=True
    )
    return {"bookie_tls": context, "bookie_authorized_roles": [BOOKIE_ROLE]}


def run_demo(settings: Settings, *, keep_running: bool = False, out: TextIO | None = None) -> dict[str, Any]:
    """Run the story; returns the summary (open alerts per kind, ground truth, timings)."""
    from kazoo.client import KazooClient

    from bkaudit.sim.cluster import DB_STORAGE, SimulatedCluster
    from bkaudit.sim.truth import TruthParameters
    from connectors.delta.tables import read_table
    from connectors.devcluster import DevCluster
    from connectors.kafka.topics import ensure_topic
    from connectors.zookeeper.client import kazoo_tls_options
    from connectors.zookeeper.watcher import ChangeWatcher
    from streaming import job
    from streaming.session import build_spark_session

    printer = _Printer(out or sys.stdout)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    cluster_services = DevCluster(settings.dev)
    if cluster_services.tls is not None:
        from bkaudit.testing.tls import ensure_throwaway_ca

        ensure_throwaway_ca(cluster_services.tls.cafile.parent)
    addresses = cluster_services.up()
    printer.say(f"embedded ZooKeeper {addresses['zookeeper']}, Kafka-protocol broker {addresses['kafka']}")
    if cluster_services.tls is not None:
        settings = cluster_services.secured(settings)
        # The Spark workers' Kafka source reads its settings from the environment.
        os.environ.update(cluster_services.client_tls_variables())
        listeners = cluster_services.listeners()
        plaintext = [
            f"{name} {port}" for name, ports in listeners.items() for port, tls in ports.items() if not tls
        ]
        open_ports = ", ".join(plaintext) if plaintext else "none"
        printer.say(
            f"TLS only, client certificates, CA in {addresses['tls']}; plaintext listeners: {open_ports}; "
            "the simulated bookies speak START_TLS, require client certificates and authorize their role"
        )
    zookeeper_tls = kazoo_tls_options(settings.zookeeper)

    chroot = f"/bkaudit-demo-{stamp}"
    hosts = f"{addresses['zookeeper']}{chroot}"
    lakehouse = settings.lakehouse_root / "demo"
    shutil.rmtree(lakehouse, ignore_errors=True)
    demo_settings = demo_run_settings(settings, lakehouse, hosts, addresses["kafka"], stamp)
    root_client = KazooClient(hosts=addresses["zookeeper"], **zookeeper_tls)
    root_client.start(timeout=15)
    root_client.ensure_path(chroot)
    root_client.stop()
    root_client.close()

    sim = SimulatedCluster(
        hosts,
        racks=3,
        bookie_session_timeout_s=2.0,
        lost_bookie_recovery_delay_s=0,
        seed=42,
        zookeeper_tls=zookeeper_tls,
        **_bookie_server_tls(cluster_services),
    )
    watcher: ChangeWatcher | None = None
    query = sink = tail = None
    timings: dict[str, float] = {}
    try:
        sim.init()
        for _ in range(6):
            sim.add_bookie(storage=DB_STORAGE)  # Pulsar's default: no entry lists, entry reads only
        topics = ["orders", "payments", "clicks", "audit-log", "inventory"]
        for index in range(20):
            sim.create_ledger(
                entries=30, managed_ledger=f"public/default/persistent/{topics[index % len(topics)]}"
            )
        printer.say(
            "simulated BookKeeper cluster: 6 DbLedgerStorage bookies in 3 racks, 20 Pulsar ledgers "
            "(E=3, WQ=2, AQ=2)"
        )

        ensure_topic(demo_settings.kafka, demo_settings.kafka.changes_topic, partitions=2)
        watcher = ChangeWatcher(demo_settings)
        watcher.start()
        watcher.wait_for_snapshots(1, timeout_s=60)
        printer.say(
            "watcher: snapshot of the cluster published; watching with one persistent recursive watch"
        )

        started = time.monotonic()
        spark = build_spark_session(demo_settings.spark)
        query, sink = job.start(spark, demo_settings)
        tail = _AlertTail(demo_settings, printer)
        tail.start()
        ledgers_expected = set(sim.ledger_ids())

        def ingested() -> bool:
            have = ledgers_expected & set(read_table(lakehouse, "ledgers").column("ledger_id").to_pylist())
            printer.progress(f"auditor: ingesting the snapshot, {len(have)}/{len(ledgers_expected)} ledgers")
            return have == ledgers_expected

        _wait("the auditor to ingest the snapshot", ingested, printer, timeout=180)
        timings["auditor_ready_s"] = round(time.monotonic() - started, 1)
        printer.say(
            f"auditor: {len(ledgers_expected)} ledgers in Delta after {timings['auditor_ready_s']} s; "
            "cluster healthy"
        )

        def open_kinds() -> Counter[str]:
            return Counter(read_table(lakehouse, "open_alerts").column("kind").to_pylist())

        victim = sim.bookie_ids()[0]
        printer.say(f"STEP 1: bookie {victim} dies (lostBookieRecoveryDelay = 0)")
        step = time.monotonic()
        sim.kill_bookie(victim)
        _wait("BOOKIE_LOST", lambda: open_kinds()["BOOKIE_LOST"] >= 1, printer)
        timings["bookie_death_to_alerts_s"] = round(time.monotonic() - step, 1)
        # What the auditor had to flag while the bookie was dead (the tables keep it in `violations`).
        death_truth = sim.ground_truth(
            params=TruthParameters(probe_timeout_s=0.5, under_replication_grace_s=3600)
        )
        printer.say(f"  ... {victim} is restarted: its alerts resolve")
        sim.restart_bookie(victim)
        _wait("the alerts to resolve", lambda: open_kinds()["BOOKIE_LOST"] == 0, printer)

        moved = sim.bookie_ids()[1:3]
        printer.say(
            f"STEP 2: bookies {', '.join(moved)} are moved into rack /rack-0: write sets lose rack diversity"
        )
        for bookie in moved:
            sim.move_bookie_rack(bookie, "/rack-0")
        _wait("PLACEMENT_NOT_ADHERING", lambda: open_kinds()["PLACEMENT_NOT_ADHERING"] >= 1, printer)

        flapper = sim.bookie_ids()[3]
        printer.say(f"STEP 3: lostBookieRecoveryDelay = 30 s; bookie {flapper} flaps for 2 s")
        sim.set_lost_bookie_recovery_delay(30)
        sim.flap_bookie(flapper, down_s=2.0)

        def flaps_of(bookie: str) -> int:
            rows = read_table(lakehouse, "bookies").to_pylist()
            return next((r["flaps"] or 0 for r in rows if r["bookie_id"] == bookie), 0)

        _wait("the flap to be recorded", lambda: flaps_of(flapper) >= 1, printer)
        lost_now = open_kinds()["BOOKIE_LOST"]
        printer.say(
            f"  no alert for the flap (bookies lost: {lost_now}); flaps of {flapper}: {flaps_of(flapper)}"
        )

        silent = sim.bookie_ids()[5]
        wait_for_timers(query, printer)
        printer.say(
            f"STEP 4: bookie {silent} goes silent: registered, but never answers "
            "GET_LIST_OF_ENTRIES_OF_LEDGER"
        )
        sim.make_silent(silent)
        # Each re-probe round is three Kafka hops and a timers batch: tens of seconds apiece on a busy host
        # (minutes in all beside a real Kafka broker at load 30-40). The simulated bookie stays registered.
        _wait(
            "BOOKIE_UNRESPONSIVE",
            lambda: open_kinds()["BOOKIE_UNRESPONSIVE"] >= 1,
            printer,
            timeout=SILENT_STEP_TIMEOUT_S,
        )

        truth = sim.ground_truth(params=TruthParameters(probe_timeout_s=0.5, under_replication_grace_s=3600))
        found = open_kinds()
        rows = []
        for kind in sorted(set(found) | {k for k, v in truth["alerts"].items() if v}):
            rows.append((kind, found.get(kind, 0), len(truth["alerts"].get(kind, []))))
        matches = print_comparison(printer, rows, "simulator ground truth")
        what_if = {",".join(pair): sim.what_if_truth(pair) for pair in combinations(sim.bookie_ids(), 2)}
        say_what_if(printer, lakehouse, what_if)
        printer.say(f"Delta tables: {lakehouse} (ledgers, bookies, open_alerts, violations, dead_letters)")
        return {
            "open_alerts": dict(found),
            "ground_truth": {k: len(v) for k, v in truth["alerts"].items() if v},
            "matches_ground_truth": matches,
            "alert_transitions": len(tail.seen),
            "lakehouse": str(lakehouse),
            "timings_s": timings,
            # Who played which part, and the simulator's ground truth by id (at the end, and while the
            # first bookie was dead), for checking the tables afterwards.
            "story": {
                "dead_bookie": victim,
                "moved_bookies": list(moved),
                "flapping_bookie": flapper,
                "silent_bookie": silent,
            },
            "ground_truth_ids": {
                "alerts": {k: v for k, v in truth["alerts"].items() if v},
                "may_alert": {k: v for k, v in truth.get("may_alert", {}).items() if v},
                # Per pair of bookies "a,b": what `bkaudit query what-if --down a --down b` must answer.
                "what_if_pairs": what_if,
                "while_dead_bookie_was_lost": {
                    k: v
                    for k, v in death_truth["alerts"].items()
                    if v and k in ("BOOKIE_LOST", "LEDGER_UNDER_REPLICATED", "LEDGER_UNRECOVERABLE")
                },
            },
        }
    finally:
        stop_pipeline(tail, query, sink, watcher)
        sim.close()
        if not keep_running:
            cluster_services.down()
            printer.say("embedded services stopped (use --keep-running to keep them)")
