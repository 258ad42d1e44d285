"""`bkaudit demo --bookkeeper real`: the demo's story on a real Apache BookKeeper 4.17 cluster.

Starts the embedded ZooKeeper and a real Apache Kafka broker (:func:`demo_services`), six real bookies
(DbLedgerStorage, 127.0.0.2-7) in three racks under a fresh ZooKeeper prefix, writes Pulsar-style ledgers
with BookKeeper's own Java client, starts the watcher and the auditor, then breaks the cluster step by step:

1. ``kill -9`` of a bookie (lostBookieRecoveryDelay 0): once its ZooKeeper session expires, BOOKIE_LOST and
   exactly the ledgers naming it under-replicated; the bookie is restarted and the alerts resolve;
2. the rack map znode is rewritten with two bookies moved into one rack → PLACEMENT_NOT_ADHERING;
3. lostBookieRecoveryDelay 30 s; a bookie is killed and restarted (a crash and a supervisor's restart): it
   is missing for a few seconds → no alert, the flap counted;
4. a bookie is SIGSTOPped while its ZooKeeper session lives on (that bookie's zkTimeout is 120 s): it stays
   registered but answers nothing → the background check's probes time out, re-probes, BOOKIE_UNRESPONSIVE.

The ground truth is read from the real cluster (:mod:`bkaudit.demo_truth`): the ledgers' metadata, the rack
map and the registrations in ZooKeeper, and the bookie processes' states. It ends with the same table as the
simulator's demo. The bookies are stopped and their data removed at the end; the Delta tables stay.

Example:
    $ bkaudit demo --bookkeeper real
"""

from __future__ import annotations

import shutil
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

from bkaudit.demo import (
    STEP_TIMEOUT_S,
    _AlertTail,
    _Printer,
    _wait,
    demo_run_settings,
    print_comparison,
    stop_pipeline,
    wait_for_timers,
)
from bkaudit.demo_truth import ClusterReader, lost_ledgers, naming, not_adhering, process_stopped
from core.settings import DevSettings, Settings

BOOKIES, RACKS = 6, 3
LEDGERS, OPEN_LEDGERS, ENTRIES = 18, 2, 30
#: Every bookie's ZooKeeper session timeout: how long a killed bookie stays registered.
SESSION_TIMEOUT_MS = 4000
#: The silenced bookie's: long enough for the re-probe rounds before its registration could go, also on a
#: busy machine (the most the embedded ZooKeeper grants, maxSessionTimeout = 240 ticks of 500 ms). It only
#: bounds the wait: on a quiet machine the alert comes in ~15 s.
SILENT_SESSION_TIMEOUT_MS = 120000
#: The timers query's micro-batch interval here (5 s by default): each re-probe round waits for one.
TIMERS_TRIGGER_INTERVAL_S = 1.0
#: Re-probes before an alert: the finding round and one re-probe, so that the silent bookie's alert comes
#: well inside its ZooKeeper session (the simulator's demo, with no session to outlive, re-probes twice).
REPROBE_ROUNDS = 1
DEAD, FLAPPER, SILENT = 1, 4, 6
MOVED = (2, 3)
#: Step 3's lostBookieRecoveryDelay: longer than a real bookie's restart also on a busy machine (a JVM start
#: took tens of seconds beside two CPU hogs); nothing waits for it to pass.
FLAP_DELAY_S = 120

Ids = dict[str, set[str]]


@dataclass
class _Run:
    """What a run of the story needs and keeps: the printer, the services, the readers, the findings."""

    printer: _Printer
    settings: Settings
    cluster: Any
    truth: ClusterReader
    timings: dict[str, float] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)
    queries: Any = None  # the job's handle (streaming.job.AuditQueries)

    def open_alerts(self) -> Ids:
        """kind → entity ids (``ledger/<id>`` → ``<id>``, ``bookie/<id>`` → ``<id>``) of open alerts."""
        from connectors.delta.tables import read_table

        found: Ids = defaultdict(set)
        for row in read_table(self.settings.lakehouse_root, "open_alerts").to_pylist():
            found[row["kind"]].add(row["entity"].split("/", 1)[-1])
        return found

    def bookie_id(self, index: int) -> str:
        return str(self.cluster.bookie(index).bookie_id)

    def wait(self, what: str, check: Any, timeout: float = STEP_TIMEOUT_S) -> bool:
        return _wait(what, check, self.printer, timeout)


def _as_ids(expected: dict[str, set[Any]]) -> Ids:
    return {kind: {str(i) for i in ids} for kind, ids in expected.items() if ids}


def _same(found: Ids, expected: Ids, kinds: tuple[str, ...]) -> bool:
    return all(found.get(k, set()) == expected.get(k, set()) for k in kinds)


def _start_cluster(run_dir: Any, zookeeper: str, prefix: str, tls: Any = None) -> Any:
    from connectors.bookkeeper import RealBookKeeperCluster

    cluster = RealBookKeeperCluster(
        run_dir, zookeeper, bookies=BOOKIES, racks=RACKS, prefix=prefix,
        bookie_conf={"zkTimeout": SESSION_TIMEOUT_MS}, tls=tls,
    )  # fmt: skip
    cluster.bookie(SILENT).extra_conf["zkTimeout"] = SILENT_SESSION_TIMEOUT_MS
    cluster.start()
    return cluster


@contextmanager
def _auditor(run: _Run) -> Iterator[_AlertTail]:
    """The watcher and the Structured Streaming auditor on the cluster, and the alert printer."""
    from connectors.kafka.topics import ensure_topic
    from connectors.zookeeper.watcher import ChangeWatcher
    from streaming import job
    from streaming.session import build_spark_session

    settings = run.settings
    ensure_topic(settings.kafka, settings.kafka.changes_topic, partitions=2)
    watcher = ChangeWatcher(settings)
    query = sink = tail = None
    try:
        watcher.start()
        watcher.wait_for_snapshots(1, timeout_s=60)
        run.printer.say(
            "watcher: snapshot of the cluster published; watching with one persistent recursive watch"
        )
        query, sink = job.start(build_spark_session(settings.spark), settings)
        run.queries = query
        tail = _AlertTail(settings, run.printer)
        tail.start()
        yield tail
    finally:
        stop_pipeline(tail, query, sink, watcher)


def _wait_ingested(run: _Run, ledger_ids: set[int]) -> None:
    from connectors.delta.tables import read_table

    started = time.monotonic()

    def ingested() -> bool:
        rows = read_table(run.settings.lakehouse_root, "ledgers").column("ledger_id").to_pylist()
        have = ledger_ids & set(rows)
        run.printer.progress(f"auditor: ingesting the snapshot, {len(have)}/{len(ledger_ids)} ledgers")
        return have == ledger_ids

    run.wait("the auditor to ingest the snapshot", ingested, timeout=180)
    run.timings["auditor_ready_s"] = round(time.monotonic() - started, 1)
    run.printer.say(
        f"auditor: {len(ledger_ids)} ledgers in Delta after {run.timings['auditor_ready_s']} s; "
        "cluster healthy"
    )


def _step_kill(run: _Run) -> None:
    """Step 1: kill -9, the alerts against the ledgers naming the bookie, the restart, the resolution."""
    victim = run.bookie_id(DEAD)
    run.printer.say(f"STEP 1: kill -9 of bookie {victim} (lostBookieRecoveryDelay = 0)")
    expected = _as_ids({"BOOKIE_LOST": {victim}, **lost_ledgers(run.truth.ledgers(), [victim])})
    kinds = ("BOOKIE_LOST", "LEDGER_UNDER_REPLICATED", "LEDGER_UNRECOVERABLE")
    step = time.monotonic()
    run.cluster.bookie(DEAD).kill()
    run.wait("BOOKIE_LOST and its ledgers", lambda: _same(run.open_alerts(), expected, kinds))
    run.timings["bookie_death_to_alerts_s"] = round(time.monotonic() - step, 1)
    found = run.open_alerts()
    same = _same(found, expected, kinds)
    run.printer.say(
        f"  ground truth from ZooKeeper: {len(expected.get('LEDGER_UNDER_REPLICATED', ()))} ledgers name "
        f"{victim}; auditor: {len(found.get('LEDGER_UNDER_REPLICATED', ()))} under-replicated, same ids: "
        f"{'yes' if same else 'NO'}"
    )
    run.checks["while_dead_bookie_was_lost"] = {
        "truth": {k: sorted(v) for k, v in expected.items()},
        "auditor": {k: sorted(found.get(k, set())) for k in kinds if found.get(k)},
        "matches": same,
    }
    run.printer.say(f"  ... {victim} is restarted: its alerts resolve")
    run.cluster.start_bookie(DEAD)
    run.wait("the alerts to resolve", lambda: not any(run.open_alerts().get(k) for k in kinds))


def _step_racks(run: _Run) -> None:
    """Step 2: two bookies moved into the first bookie's rack, by rewriting the rack map znode."""
    racks = run.truth.racks()
    target = racks[run.bookie_id(DEAD)]
    moved = [run.bookie_id(i) for i in MOVED]
    run.printer.say(
        f"STEP 2: the rack map znode is rewritten: bookies {', '.join(moved)} moved into rack {target}"
    )
    run.truth.write_racks({**racks, **dict.fromkeys(moved, target)})
    expected = not_adhering(run.truth.ledgers(), run.truth.racks())
    run.wait(
        "PLACEMENT_NOT_ADHERING",
        lambda: run.open_alerts().get("PLACEMENT_NOT_ADHERING", set()) == {str(i) for i in expected},
    )
    run.printer.say(f"  ground truth from the metadata and the new rack map: {len(expected)} ledgers")


def _flaps_of(run: _Run, bookie: str) -> int:
    from connectors.delta.tables import read_table

    rows = read_table(run.settings.lakehouse_root, "bookies").to_pylist()
    return next((r["flaps"] or 0 for r in rows if r["bookie_id"] == bookie), 0)


def _step_flap(run: _Run) -> None:
    """Step 3: delay 30 s; kill -9, the session expires, a restart: missing for a few seconds."""
    flapper = run.bookie_id(FLAPPER)
    run.printer.say(
        f"STEP 3: lostBookieRecoveryDelay = {FLAP_DELAY_S} s; bookie {flapper} crashes and restarts"
    )
    run.truth.set_recovery_delay(FLAP_DELAY_S)
    run.cluster.bookie(FLAPPER).kill()
    run.wait("its session to expire", lambda: flapper not in run.truth.registered())
    gone = time.monotonic()
    run.cluster.start_bookie(FLAPPER)
    missing_s = round(time.monotonic() - gone, 1)
    run.wait("the flap to be recorded", lambda: _flaps_of(run, flapper) >= 1)
    lost_now = len(run.open_alerts().get("BOOKIE_LOST", ()))
    run.checks["flap"] = {"bookie": flapper, "missing_s": missing_s, "flaps": _flaps_of(run, flapper)}
    run.printer.say(
        f"  missing {missing_s} s (< {FLAP_DELAY_S} s): no alert (bookies lost: {lost_now}); "
        f"flaps of {flapper}: {_flaps_of(run, flapper)}"
    )


def _step_silence(run: _Run) -> None:
    """Step 4: SIGSTOP; registered but silent until the background check's re-probes give up on it."""
    silent = run.bookie_id(SILENT)
    # Not inside the stopped bookie's ZooKeeper session: the timers query's first batch (minutes when busy).
    wait_for_timers(run.queries, run.printer)
    run.printer.say(
        f"STEP 4: bookie {silent} is stopped (SIGSTOP): registered (zkTimeout "
        f"{SILENT_SESSION_TIMEOUT_MS // 1000} s), it answers nothing"
    )
    run.cluster.bookie(SILENT).pause()
    stopped = time.monotonic()

    def decided() -> bool:
        return (
            silent in run.open_alerts().get("BOOKIE_UNRESPONSIVE", set())
            or silent not in run.truth.registered()
        )

    run.wait("BOOKIE_UNRESPONSIVE", decided, timeout=SILENT_SESSION_TIMEOUT_MS / 1000)
    run.timings["silent_step_s"] = round(time.monotonic() - stopped, 1)
    if silent not in run.truth.registered():
        run.printer.say(
            f"  its ZooKeeper session expired first ({run.timings['silent_step_s']} s): the auditor sees a "
            "missing bookie now; the re-probes came too late on this machine"
        )


def _final_truth(run: _Run) -> Ids:
    """The alerts that must be open now, from the cluster as it is."""
    ledgers, registered = run.truth.ledgers(), run.truth.registered()
    known = {run.bookie_id(b.index) for b in run.cluster.all_bookies()}
    # The story brings back every bookie it killed: one missing now is lost at once only with delay 0;
    # with a delay it is missing for an unknown time, and the story has failed (see missing_bookies).
    run.checks["missing_bookies"] = sorted(known - registered)
    lost = known - registered if run.truth.recovery_delay() == 0 else set()
    silent = {
        run.bookie_id(b.index)
        for b in run.cluster.all_bookies()
        if b.bookie_id in registered and process_stopped(b.pid())
    }
    closed = {i: md for i, md in ledgers.items() if md.state.value == "CLOSED"}
    return _as_ids(
        {
            "BOOKIE_LOST": lost,
            **lost_ledgers(ledgers, lost),
            "PLACEMENT_NOT_ADHERING": not_adhering(ledgers, run.truth.racks()),
            "BOOKIE_UNRESPONSIVE": {b for b in silent if naming(closed, [b])},
        }
    )


def _summary(run: _Run, truth: Ids, found: Ids) -> dict[str, Any]:
    rows = [(k, len(found.get(k, ())), len(truth.get(k, ()))) for k in sorted(set(found) | set(truth))]
    counts_match = print_comparison(run.printer, rows, "ground truth read from the real cluster")
    ids_match = all(found.get(k, set()) == truth.get(k, set()) for k in set(found) | set(truth))
    run.printer.say(f"  the same ledgers and bookies, id for id: {'yes' if ids_match else 'NO'}")
    if run.checks["missing_bookies"]:
        run.printer.say(
            f"  but the story did not finish: {', '.join(run.checks['missing_bookies'])} left the cluster"
        )
    return {
        "bookkeeper": "real",
        "open_alerts": {k: len(v) for k, v in found.items() if v},
        "ground_truth": {k: len(v) for k, v in truth.items() if v},
        "matches_ground_truth": counts_match
        and ids_match
        and run.checks["while_dead_bookie_was_lost"]["matches"]
        and not run.checks["missing_bookies"],
        "lakehouse": str(run.settings.lakehouse_root),
        "timings_s": run.timings,
        "story": {
            "dead_bookie": run.bookie_id(DEAD),
            "moved_bookies": [run.bookie_id(i) for i in MOVED],
            "flapping_bookie": run.bookie_id(FLAPPER),
            "silent_bookie": run.bookie_id(SILENT),
        },
        "ground_truth_ids": {k: sorted(v) for k, v in truth.items() if v},
        "open_alert_ids": {k: sorted(v) for k, v in found.items() if v},
        "checks": run.checks,
    }


def _story(run: _Run, ledger_ids: set[int]) -> dict[str, Any]:
    _wait_ingested(run, ledger_ids)
    _step_kill(run)
    _step_racks(run)
    _step_flap(run)
    _step_silence(run)
    summary = _summary(run, _final_truth(run), run.open_alerts())
    run.printer.say(
        f"Delta tables: {run.settings.lakehouse_root} "
        "(ledgers, bookies, open_alerts, violations, dead_letters)"
    )
    return summary


def demo_services(dev: DevSettings) -> DevSettings:
    """The embedded services of the real demo: a real Apache Kafka broker, unless ``dev.broker`` was set
    (then that one), or a Tansu broker that ``bkaudit dev up`` started in the same state directory is
    running (it is reused: the two listen on the same port).

    Example:
        >>> demo_services(DevSettings(state_dir="/tmp/bkaudit-doc-demo")).broker
        'kafka'
        >>> demo_services(DevSettings(state_dir="/tmp/bkaudit-doc-demo", broker="tansu")).broker
        'tansu'
    """
    from connectors.devcluster import DevCluster

    if "broker" in dev.model_fields_set or DevCluster(dev).broker.is_running():
        return dev
    return dev.model_copy(update={"broker": "kafka"})


def _secured(services: Any, settings: Settings, printer: _Printer) -> Settings:
    """With ``dev.tls``: the clients' TLS settings (also in the environment, for Spark's workers), and the
    plaintext listeners of ZooKeeper's and the broker's processes said (none)."""
    if services.tls is None:
        return settings
    import os

    os.environ.update(services.client_tls_variables())
    plaintext = [
        f"{name} {port}"
        for name, ports in services.listeners().items()
        for port, tls in ports.items()
        if not tls
    ]
    printer.say(
        f"TLS only, client certificates, CA in {services.tls.cafile.parent}; plaintext listeners: "
        f"{', '.join(plaintext) if plaintext else 'none'}; the bookies require TLS and a role in the "
        "client certificate (BookieAuthZFactory)"
    )
    return services.secured(settings)


def run_real_demo(
    settings: Settings, *, keep_running: bool = False, out: TextIO | None = None
) -> dict[str, Any]:
    """Run the story on real bookies; returns the summary (open alerts per kind, ground truth, timings)."""
    import sys

    from connectors.devcluster import DevCluster

    printer = _Printer(out or sys.stdout)
    started = time.monotonic()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dev = demo_services(settings.dev)
    services = DevCluster(dev)
    if services.tls is not None:
        from bkaudit.testing.tls import ensure_throwaway_ca

        ensure_throwaway_ca(services.tls.cafile.parent)
    addresses = services.up()
    broker = "Apache Kafka broker" if dev.broker == "kafka" else "Kafka-protocol broker (Tansu)"
    printer.say(f"embedded ZooKeeper {addresses['zookeeper']}, {broker} {addresses['kafka']}")
    settings = _secured(services, settings, printer)
    prefix = f"/bkaudit-demo-{stamp}"
    lakehouse = settings.lakehouse_root / "demo"
    shutil.rmtree(lakehouse, ignore_errors=True)
    run_settings = demo_run_settings(
        settings, lakehouse, f"{addresses['zookeeper']}{prefix}", addresses["kafka"], stamp
    )
    faster = {"timers_trigger_interval_s": TIMERS_TRIGGER_INTERVAL_S, "reprobe_rounds": REPROBE_ROUNDS}
    run_settings = run_settings.model_copy(update={"stream": run_settings.stream.model_copy(update=faster)})
    run_dir = settings.dev.state_dir.absolute() / "demo-bookkeeper" / stamp
    cluster = truth = None
    try:
        bookkeeper_tls = services.bookkeeper_tls()
        cluster = _start_cluster(run_dir, addresses["zookeeper"], prefix, bookkeeper_tls)
        zookeeper_tls = bookkeeper_tls.kazoo_options() if bookkeeper_tls is not None else None
        truth = ClusterReader(f"{addresses['zookeeper']}{prefix}", tls=zookeeper_tls)
        truth.set_recovery_delay(0)
        written = cluster.write_ledgers(
            LEDGERS + OPEN_LEDGERS, entries=ENTRIES, open_ledgers=OPEN_LEDGERS,
            topic_prefix="public/default/persistent/orders",
        )  # fmt: skip
        printer.say(
            f"real BookKeeper cluster: {BOOKIES} DbLedgerStorage bookies in {RACKS} racks, "
            f"{len(written['closed'])} closed and {len(written['open'])} open ledgers written by "
            f"BookKeeper's Java client (E=3, WQ=2, AQ=2), after {time.monotonic() - started:.0f} s"
        )
        run = _Run(printer, run_settings, cluster, truth)
        with _auditor(run):
            summary = _story(run, set(truth.ledgers()))
        summary["timings_s"]["total_s"] = round(time.monotonic() - started, 1)
        summary["broker"] = dev.broker
        return summary
    finally:
        if truth is not None:
            truth.close()
        if cluster is not None:
            cluster.stop()  # SIGCONT first for the stopped bookie
        shutil.rmtree(run_dir, ignore_errors=True)
        if not keep_running:
            services.down()
            printer.say(
                "embedded services and bookies stopped (use --keep-running to keep ZooKeeper and the broker)"
            )
