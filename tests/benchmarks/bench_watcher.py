"""Benchmark: ``bkaudit watch`` snapshot of N ledgers to the broker, and change → Kafka latency.

Starts its own embedded ZooKeeper and broker (:class:`~bkaudit.testing.ServiceHarness`) in a
temporary directory, bulk-loads N closed ledgers (:func:`bkaudit.sim.bulk.bulk_load`, hierarchical layout),
then prints one JSON document:

- ``snapshot``: ``bkaudit watch --exit-after-snapshot`` run as a child process on the loaded tree — the
  START snapshot's duration (from its SnapshotEnd on Kafka), the process wall time including the final
  flush, ZooKeeper reads per second, events per second, and the watcher's peak RSS (``ru_maxrss`` of the
  finished child) next to the peak of the same command on an empty cluster, giving bytes per ledger;
- ``topic``: every record read back — count, decoded without error, ledger upserts == N, and no record
  containing the ledgers' password bytes;
- ``latency``: a watcher kept running (in this process) while ``--changes`` ledger znodes are rewritten at
  ``--rate`` per second; for each change, the time from just before ``zk.set`` to the moment a consumer
  (fetch wait 5 ms) receives the matching upsert: p50 / p90 / p99 / max in ms, plus the watcher's own
  change → ack and emit → broker-ack histograms. ``--skip-consumer`` leaves the consumer out (at 1 M
  ledgers the embedded broker's fetch path scans its in-memory log and starves the other processes).

Targets (issue): snapshot ≤ 5 min for 1 M ledgers, change → Kafka p99 ≤ 200 ms, ≤ 200 B of watcher memory
per ledger.

Run as a script for the full figure, or through pytest (``-m benchmark``) for a small count::

    python tests/benchmarks/bench_watcher.py --ledgers 1000000 --partitions 16
    python tests/benchmarks/bench_watcher.py --ledgers 1000000 --skip-snapshot --skip-consumer
    pytest tests/benchmarks/bench_watcher.py -m benchmark -s -o addopts=""

Example:
    >>> _parse_args(["--ledgers", "10"]).ledgers
    10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

if __package__ in (None, ""):  # run as a script: the repository root last, after any PYTHONPATH variant
    sys.path.append(str(Path(__file__).resolve().parents[2]))
from tests.benchmarks.machine_probe import machine_probe_ms

PYTEST_LEDGERS = 5_000
PYTEST_CHANGES = 200
INSTANCE_ID = "bench-0000-4000-8000-000000000001"


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ledgers", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=16, help="partitions of the change topic")
    parser.add_argument("--concurrency", type=int, default=1000, help="snapshot reads in flight")
    parser.add_argument(
        "--producer",
        default="0:0",
        help="comma-separated batch_size:linger_ms producer settings to measure the snapshot with "
        "(0:0 is the embedded broker's default; e.g. 65536:5 as on real Kafka)",
    )
    parser.add_argument("--changes", type=int, default=2_000, help="znode changes for the latency figure")
    parser.add_argument(
        "--latency-producer",
        default="default",
        help="batch_size:linger_ms for the latency run; default: the settings' (batching, one-record tails)",
    )
    parser.add_argument("--rate", type=float, default=200.0, help="changes per second")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=VALUE[,NAME=VALUE...]",
        help="measure the latency run once per variant, on the same services one after the other, with "
        "these environment settings for the watcher (e.g. BKAUDIT_WATCHER__CHANGE_BATCH_MS=0); repeatable",
    )
    parser.add_argument("--idle-s", type=float, default=3.0, help="watcher CPU measured idle this long first")
    parser.add_argument("--heap", default="3g", help="ZooKeeper JVM heap")
    parser.add_argument("--skip-snapshot", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument(
        "--skip-consumer",
        action="store_true",
        help="latency: no consumer in this process, only the watcher's own change -> ack histogram (the "
        "embedded broker's fetch path gets slow and CPU-hungry on a topic holding a million records)",
    )
    return parser.parse_args(argv)


def _producer_configs(text: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in (item.split(":") for item in text.split(",") if item)]


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def _watch_command(harness: Any, chroot: str, topic: str, args: argparse.Namespace) -> tuple[list[str], dict]:
    command = [
        sys.executable,
        "-m",
        "bkaudit.cli.main",
        "watch",
        "--zookeeper",
        harness.zookeeper_hosts(chroot),
        "--bootstrap",
        harness.kafka_bootstrap,
        "--topic",
        topic,
        "--partitions",
        str(args.partitions),
        "--snapshot-concurrency",
        str(args.concurrency),
        "--exit-after-snapshot",
        "--log-level",
        "WARNING",
    ]
    env = {
        **os.environ,
        "BKAUDIT_WATCHER__PROGRESS": "off",
        "BKAUDIT_ZOOKEEPER__SESSION_TIMEOUT_S": "30",
    }
    return command, env


def _run_watch_once(
    harness: Any, chroot: str, topic: str, args: argparse.Namespace, producer: tuple[int, int]
) -> dict[str, Any]:
    """Run ``bkaudit watch --exit-after-snapshot`` as a child: wall time, CPU time, its peak RSS."""
    command, env = _watch_command(harness, chroot, topic, args)
    env["BKAUDIT_KAFKA__PRODUCER_BATCH_SIZE"] = str(producer[0])
    env["BKAUDIT_KAFKA__PRODUCER_LINGER_MS"] = str(producer[1])
    started = time.monotonic()
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert child.stderr is not None
    stderr = child.stderr.read()  # until the child closes it (exits)
    _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage (ru_maxrss in KiB on Linux)
    child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - started
    if child.returncode != 0:
        raise RuntimeError(f"bkaudit watch failed ({child.returncode}): {stderr[-2000:]}")
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
    }


def _read_topic(settings: Any, topic: str, password: bytes) -> dict[str, Any]:
    from bkaudit.testing.kafka_io import TopicTail
    from core.events import decode_event

    tail = TopicTail(settings, topic)
    try:
        end = tail.end_offsets()
        counts: dict[str, int] = {}
        records = 0
        leaked = 0
        last_end: Any = None
        started = time.monotonic()
        while any(tail.positions[p] < end[p] for p in end):
            for record in tail.poll(1.0):
                records += 1
                if password in record.value:
                    leaked += 1
                event = decode_event(record.value)
                kind = event.WhichOneof("payload") or ""
                counts[kind] = counts.get(kind, 0) + 1
                if kind == "snapshot_end":
                    last_end = event.snapshot_end
        return {
            "records": records,
            "by_type": counts,
            "records_with_password_bytes": leaked,
            "read_seconds": round(time.monotonic() - started, 1),
            "snapshot_end": None
            if last_end is None
            else {
                "complete": last_end.complete,
                "duration_ms": last_end.duration_ms,
                "ledgers_scanned": last_end.ledgers_scanned,
                "ledgers_published": last_end.ledgers_published,
            },
        }
    finally:
        tail.close()


def _scrape(port: int, histogram: str) -> dict[str, float]:
    """A histogram's cumulative buckets from the watcher's metrics endpoint."""
    import urllib.request

    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    buckets: dict[str, float] = {}
    for line in body.splitlines():
        if line.startswith(histogram + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[le] = float(line.rsplit(" ", 1)[1])
    return buckets


def _scrape_value(port: int, name: str) -> float:
    """Sum of a metric's samples on the watcher's endpoint (0 while it is not up yet)."""
    import urllib.error
    import urllib.request

    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    except (urllib.error.URLError, OSError):
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def _bucket_percentile(buckets: dict[str, float], fraction: float) -> float | None:
    """Upper bound (ms) of the histogram bucket holding the ``fraction`` quantile (None if empty)."""
    total = buckets.get("+Inf", 0.0)
    if total <= 0:
        return None
    bounds = sorted((float(le), count) for le, count in buckets.items() if le != "+Inf")
    for bound, count in bounds:
        if count >= fraction * total:
            return round(bound * 1000, 1)
    return float("inf")


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a live process has used so far, from ``/proc/<pid>/stat``.

    Example:
        >>> process_cpu_s(os.getpid()) > 0
        True
    """
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
    return ticks / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of a live process's threads so far, summed per thread name (``comm``: librdkafka names
    its threads ``rdk:...``; Python's threads carry the process's name).

    Example:
        >>> sum(thread_cpu_s(os.getpid()).values()) > 0
        True
    """
    totals: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            name, fields = task.joinpath("stat").read_text().split(" (", 1)[1].rsplit(") ", 1)
            values = fields.split()
            ticks = int(values[11]) + int(values[12])
            totals[name] = totals.get(name, 0.0) + ticks / os.sysconf("SC_CLK_TCK")
    return totals


def context_switches(pid: int) -> int:
    """Context switches (voluntary and not) of all a live process's threads so far: about its wake-ups.

    Example:
        >>> context_switches(os.getpid()) > 0
        True
    """
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for line in task.joinpath("status").read_text().splitlines():
                if "ctxt_switches:" in line:
                    total += int(line.split()[-1])
    return total


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _variant_env(text: str) -> dict[str, str]:
    """``NAME=VALUE,NAME=VALUE`` as a dict.

    Example:
        >>> _variant_env("A=1,B=x")
        {'A': '1', 'B': 'x'}
    """
    return dict(item.split("=", 1) for item in text.split(",") if item)


def _latency(
    harness: Any, chroot: str, spec: Any, args: argparse.Namespace, variant: str = ""
) -> dict[str, Any]:
    """Rewrite ledger znodes at a fixed rate under a running watcher (a child process, as in production);
    time each change from just before ``zk.set`` to a consumer receiving its upsert."""
    from confluent_kafka import OFFSET_END, Consumer, TopicPartition

    from connectors.kafka.client_config import consumer_config, partition_count
    from core.domain.layout import ledger_path
    from core.events import decode_event

    topic = harness.unique_topic("latency")
    command, env = _watch_command(harness, chroot, topic, args)
    env.update(_variant_env(variant))
    command.remove("--exit-after-snapshot")
    if args.latency_producer != "default":
        batch_size, linger_ms = _producer_configs(args.latency_producer)[0]
        env["BKAUDIT_KAFKA__PRODUCER_BATCH_SIZE"] = str(batch_size)
        env["BKAUDIT_KAFKA__PRODUCER_LINGER_MS"] = str(linger_ms)
    port = _free_port()
    command += ["--metrics-port", str(port)]
    env["BKAUDIT_WATCHER__METRICS_HOST"] = "127.0.0.1"
    watcher = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    kafka = harness.kafka_settings()
    writer = harness.kazoo_client(chroot, timeout=30)
    # fetch.wait.max.ms: the consumer's own wait would otherwise dominate what is measured.
    consumer = Consumer({**consumer_config(kafka, None), "fetch.wait.max.ms": 5})
    try:
        deadline = time.monotonic() + 3600
        partitions: list[Any] = []
        while not partitions and time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # the topic does not exist yet
                count = partition_count(consumer, topic, 5.0)
                partitions = [TopicPartition(topic, p, OFFSET_END) for p in range(count)]
            time.sleep(0.2)
        # The START snapshot is out and acknowledged: live changes would otherwise queue behind it.
        while (
            _scrape_value(port, "bkaudit_watcher_snapshots_total") < 1
            or _scrape_value(port, "bkaudit_watcher_unacked_events") > 0
        ):
            if watcher.poll() is not None:
                raise RuntimeError("the watcher exited")
            time.sleep(0.5)
        consumer.assign(partitions)
        consumer.consume(num_messages=1, timeout=1.0)  # resolve the end offsets now, before the first change
        # The watcher's CPU while idle (heartbeats, delivery polling), to tell it from the changes' cost.
        idle_started, idle_cpu = time.monotonic(), process_cpu_s(watcher.pid)
        time.sleep(args.idle_s)
        idle_rate = (process_cpu_s(watcher.pid) - idle_cpu) / (time.monotonic() - idle_started)
        load_before = [round(x, 2) for x in os.getloadavg()]
        changes_started, changes_cpu = time.monotonic(), process_cpu_s(watcher.pid)
        threads_before = thread_cpu_s(watcher.pid)
        switches_before = context_switches(watcher.pid)
        lag_before = _scrape(port, "bkaudit_watcher_publish_lag_seconds")
        change_before = _scrape(port, "bkaudit_watcher_change_to_kafka_seconds")
        sent: dict[tuple[int, int], float] = {}
        received: dict[tuple[int, int], float] = {}
        emitted: dict[tuple[int, int], float] = {}  # the event's own time: when the watcher emitted it
        done = threading.Event()

        def consume() -> None:
            while not done.is_set():
                messages = consumer.consume(num_messages=1000, timeout=0.05)
                now = time.time()
                for record in messages:
                    if record.error() is None:
                        event = decode_event(record.value())
                        if event.HasField("ledger_upserted") and not event.snapshot_id:
                            key = (event.ledger_upserted.ledger_id, event.ledger_upserted.znode.version)
                            received.setdefault(key, now)
                            emitted.setdefault(key, event.event_time_ms / 1000)

        reader = threading.Thread(target=consume, daemon=True)
        if not args.skip_consumer:
            reader.start()
        ids = spec.ledger_ids()
        interval = 1.0 / args.rate
        next_at = time.monotonic()
        for i in range(args.changes):
            ledger_id = ids[(i * 7919) % len(ids)]
            path = ledger_path(ledger_id)
            data, stat = writer.get(path)
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            started = time.time()  # wall clock: compared with the watcher's event time (same host)
            new_stat = writer.set(path, data, version=stat.version)
            sent[(ledger_id, new_stat.version)] = started
        wait_until = time.monotonic() + 60
        # Every change acknowledged: the watcher's work for them is done (also with a consumer).
        while _scrape_value(port, "bkaudit_watcher_unacked_events") > 0 and time.monotonic() < wait_until:
            time.sleep(0.05)
        changes_cpu_s = process_cpu_s(watcher.pid) - changes_cpu
        threads_after = thread_cpu_s(watcher.pid)
        switches = context_switches(watcher.pid) - switches_before
        changes_window_s = time.monotonic() - changes_started
        while (
            not args.skip_consumer
            and len(received.keys() & sent.keys()) < len(sent)
            and time.monotonic() < wait_until
        ):
            time.sleep(0.1)
        done.set()
        if reader.is_alive():
            reader.join(5)
        lag_after = _scrape(port, "bkaudit_watcher_publish_lag_seconds")
        change_after = _scrape(port, "bkaudit_watcher_change_to_kafka_seconds")
        change_buckets = {le: change_after[le] - change_before.get(le, 0.0) for le in change_after}
        latencies = [(received[k] - sent[k]) * 1000 for k in sent if k in received]
        to_emit = [(emitted[k] - sent[k]) * 1000 for k in sent if k in emitted]
        to_consumer = [(received[k] - emitted[k]) * 1000 for k in sent if k in emitted]
        return {
            "variant": variant,
            "changes": len(sent),
            "rate_per_s": args.rate,
            # The watcher process's CPU per change (user + system, /proc), and net of its idle rate over the
            # same window; target <= 150 us.
            "watcher_cpu_us_per_change": round(changes_cpu_s * 1e6 / max(len(sent), 1)),
            "watcher_cpu_us_per_change_net_of_idle": round(
                max(changes_cpu_s - idle_rate * changes_window_s, 0.0) * 1e6 / max(len(sent), 1)
            ),
            "watcher_idle_cpu_percent": round(idle_rate * 100, 2),
            "watcher_context_switches_per_change": round(switches / max(len(sent), 1), 1),
            # The same per thread name (Python's threads vs librdkafka's rdk:*), µs per change.
            "watcher_cpu_us_per_change_by_thread": {
                name: round((seconds - threads_before.get(name, 0.0)) * 1e6 / max(len(sent), 1))
                for name, seconds in sorted(threads_after.items())
            },
            "load_average_before_changes": load_before,
            "producer": args.latency_producer,
            # Primary figure: znode mtime (ZooKeeper's clock) -> Kafka ack, measured by the watcher for every
            # live ledger change; percentiles are bucket upper bounds of its histogram.
            "change_to_kafka_ack_p50_ms": _bucket_percentile(change_buckets, 0.50),
            "change_to_kafka_ack_p99_ms": _bucket_percentile(change_buckets, 0.99),
            "change_to_kafka_ack_buckets": change_buckets,
            # Secondary: as seen by a consumer in this process (adds the broker's fetch path).
            "received": len(latencies),
            "p50_ms": round(statistics.median(latencies), 1) if latencies else None,
            "p90_ms": round(_percentile(latencies, 0.90), 1) if latencies else None,
            "p99_ms": round(_percentile(latencies, 0.99), 1) if latencies else None,
            "max_ms": round(max(latencies), 1) if latencies else None,
            # Split: change -> watcher emits the event (notification, read, decode), and emit -> consumer.
            "change_to_emit_p50_ms": round(statistics.median(to_emit), 1) if to_emit else None,
            "change_to_emit_p99_ms": round(_percentile(to_emit, 0.99), 1) if to_emit else None,
            "emit_to_consumer_p50_ms": round(statistics.median(to_consumer), 1) if to_consumer else None,
            "emit_to_consumer_p99_ms": round(_percentile(to_consumer, 0.99), 1) if to_consumer else None,
            # The watcher's own view during the changes: emit -> broker ack, cumulative counts per bucket.
            "watcher_emit_to_ack_buckets": {le: lag_after[le] - lag_before.get(le, 0.0) for le in lag_after},
        }
    finally:
        consumer.close()
        writer.stop()
        writer.close()
        watcher.terminate()
        try:
            watcher.wait(60)
        except subprocess.TimeoutExpired:
            watcher.kill()


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Start the services, load, measure; returns the figures (see the module docstring)."""
    from bkaudit.sim.bulk import BulkLoadSpec, bulk_load, synthetic_bookies
    from bkaudit.testing.harness import ServiceHarness
    from core.domain.layout import instance_id_path

    state_dir = Path(tempfile.mkdtemp(prefix="bkaudit-bench-watch-"))
    harness = ServiceHarness(state_dir, zookeeper_heap=args.heap)
    harness.start()
    figures: dict[str, Any] = {
        "ledgers": args.ledgers,
        "partitions": args.partitions,
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "machine_probe_ms_at_start": machine_probe_ms(),
    }
    try:
        chroot = harness.new_chroot()
        empty = harness.new_chroot()
        loader = harness.kazoo_client(chroot, timeout=60)
        try:
            spec = BulkLoadSpec(bookies=synthetic_bookies(100, racks=10), count=args.ledgers, seed=1)
            started = time.monotonic()
            summary = bulk_load(loader, spec, create_layout=True, progress=False)
            loader.create(instance_id_path("/ledgers"), INSTANCE_ID.encode())
            figures["load_seconds"] = round(time.monotonic() - started, 1)
            figures["loaded"] = summary.created
        finally:
            loader.stop()
            loader.close()
        empty_client = harness.kazoo_client(empty)
        try:
            bulk_load(
                empty_client, BulkLoadSpec(bookies=spec.bookies, count=0), create_layout=True, progress=False
            )
            empty_client.create(instance_id_path("/ledgers"), INSTANCE_ID.encode())
        finally:
            empty_client.stop()
            empty_client.close()
        if not args.skip_snapshot:
            baseline = _run_watch_once(harness, empty, harness.unique_topic("bench"), args, (0, 0))
            figures["empty_cluster_watcher"] = baseline
            figures["snapshot"] = []
            for producer in _producer_configs(args.producer):
                topic = harness.unique_topic("bench")
                run = _run_watch_once(harness, chroot, topic, args, producer)
                topic_figures = _read_topic(harness.kafka_settings(), topic, spec.password)
                end = topic_figures.get("snapshot_end") or {}
                duration_s = (end.get("duration_ms") or 0) / 1000
                figures["snapshot"].append(
                    {
                        "producer_batch_size": producer[0],
                        "producer_linger_ms": producer[1],
                        "duration_s": round(duration_s, 1),
                        "process_wall_s": run["wall_s"],
                        "process_cpu_s": run["cpu_s"],
                        "cpu_us_per_ledger": round(run["cpu_s"] * 1e6 / args.ledgers)
                        if args.ledgers
                        else None,
                        "zookeeper_reads_per_s": round(args.ledgers / duration_s) if duration_s else None,
                        "events_per_s": round(topic_figures["records"] / duration_s) if duration_s else None,
                        "peak_rss_mib": run["peak_rss_mib"],
                        "bytes_per_ledger": round(
                            (run["peak_rss_mib"] - baseline["peak_rss_mib"]) * 2**20 / args.ledgers, 1
                        )
                        if args.ledgers
                        else None,
                        "topic": topic_figures,
                    }
                )
        if not args.skip_latency and args.changes:
            runs = [_latency(harness, chroot, spec, args, variant) for variant in args.variant or [""]]
            figures["latency"] = runs[0]
            if len(runs) > 1:
                figures["latency_variants"] = runs
        return figures
    finally:
        harness.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


@pytest.mark.benchmark
def test_watcher_figures() -> None:
    """Prints the figures for a small load; asserts counts only (no timing: machines differ)."""
    args = _parse_args(
        [
            "--ledgers",
            str(PYTEST_LEDGERS),
            "--changes",
            str(PYTEST_CHANGES),
            "--heap",
            "1g",
            "--partitions",
            "4",
        ]
    )
    figures = run_benchmark(args)
    print(json.dumps(figures, indent=2))
    snapshot = figures["snapshot"][0]
    assert snapshot["topic"]["by_type"]["ledger_upserted"] == PYTEST_LEDGERS
    assert snapshot["topic"]["records_with_password_bytes"] == 0
    assert snapshot["duration_s"] >= 0
    assert figures["latency"]["received"] == PYTEST_CHANGES
    assert figures["latency"]["change_to_kafka_ack_buckets"]["+Inf"] >= PYTEST_CHANGES


def summary_line(figures: dict[str, Any]) -> dict[str, Any]:
    """The named figures for the one JSON line the script ends with.

    Example:
        >>> line = summary_line({"ledgers": 5, "latency": {"watcher_cpu_us_per_change": 310}})
        >>> line["watcher_cpu_us_per_change"]
        310
    """
    snapshot = (figures.get("snapshot") or [{}])[0]
    latency = figures.get("latency") or {}
    return {
        "ledgers": figures.get("ledgers"),
        "snapshot_s": snapshot.get("duration_s"),
        "snapshot_cpu_us_per_ledger": snapshot.get("cpu_us_per_ledger"),
        "change_to_kafka_ack_p50_ms": latency.get("change_to_kafka_ack_p50_ms"),
        "change_to_kafka_ack_p99_ms": latency.get("change_to_kafka_ack_p99_ms"),
        "consumer_p99_ms": latency.get("p99_ms"),
        "watcher_cpu_us_per_change": latency.get("watcher_cpu_us_per_change"),
        "watcher_cpu_us_per_change_net_of_idle": latency.get("watcher_cpu_us_per_change_net_of_idle"),
        "watcher_cpu_us_per_change_by_thread": latency.get("watcher_cpu_us_per_change_by_thread"),
        "watcher_context_switches_per_change": latency.get("watcher_context_switches_per_change"),
        "changes_per_s": latency.get("rate_per_s"),
        "variant": latency.get("variant"),
        "load_avg_before_changes": latency.get("load_average_before_changes"),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "machine_probe_ms": {"start": figures.get("machine_probe_ms_at_start"), "end": machine_probe_ms()},
    }


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    results = run_benchmark(_parse_args(sys.argv[1:]))
    print(json.dumps(results, indent=2))
    print(json.dumps(summary_line(results)))
