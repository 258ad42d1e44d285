"""Benchmark: the two embedded brokers side by side (Tansu and a real Kafka 4.1 node), alternating.

Per round and broker, on a fresh state directory:

- ``start_s``: from ``start()`` to the first answered metadata request (Kafka's includes formatting its
  storage); ``restart_s``: a stop and a start on the same data;
- ``rss_mb_started`` and ``rss_mb_after_load``: the broker's resident memory once ready and after the load;
- ``produce_s``: ``--records`` records of 300 bytes into 8 partitions, every one acknowledged (bkaudit's
  producer settings, held one-record tails on Tansu only, as bkaudit sends);
- ``consume_s``: reading them back from the beginning with one consumer.

Figures are p50 / min / max over ``--rounds``. The brokers alternate (tansu, kafka, tansu, ...) so a change of
the machine's load hits both. The run ends with one JSON line, ``uptime``'s load average beside the figures.

Run: ``python tests/benchmarks/bench_brokers.py [--rounds 3] [--records 20000]``, or through pytest
(``-m benchmark``) at a small count.

Example:
    >>> _summary([3.0, 1.0, 2.0])
    {'n': 3, 'p50': 2.0, 'min': 1.0, 'max': 3.0}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

BROKERS = ("tansu", "kafka")


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())


def _rss_mb(pid: int | None) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return round(int(status.split("VmRSS:")[1].split()[0]) / 1024, 1)


def _broker(kind: str, state_dir: Path) -> Any:
    from connectors.kafka.embedded import EmbeddedBroker
    from connectors.kafka.kafka_broker import KafkaBroker

    return KafkaBroker(state_dir) if kind == "kafka" else EmbeddedBroker(state_dir)


def _load(kind: str, bootstrap: str, records: int) -> tuple[float, float]:
    """Produce ``records`` (acked) into a new 8-partition topic, then read them back; both in seconds."""
    from confluent_kafka import Producer

    from bkaudit.testing.kafka_io import read_topic
    from connectors.kafka.client_config import producer_config
    from connectors.kafka.tail_sender import TailSender
    from connectors.kafka.topics import ensure_topic
    from core.settings import KafkaSettings

    settings = KafkaSettings(bootstrap_servers=bootstrap)
    topic = f"bench.brokers.{time.time_ns()}"
    ensure_topic(settings, topic, partitions=8)
    sender = TailSender(Producer(producer_config(settings)), hold_tails=kind == "tansu")
    started = time.monotonic()
    for index in range(records):
        sender.send(topic, key=b"ledger/%d" % index, value=b"v" * 300, partition=index % 8)
    sender.release()
    sender.flush()
    produced = time.monotonic() - started
    started = time.monotonic()
    got = len(read_topic(settings, topic, timeout_s=120))
    consumed = time.monotonic() - started
    assert got == records, f"{kind}: read {got} of {records} records"
    return produced, consumed


def _one(kind: str, work: Path, records: int) -> dict[str, Any]:
    broker = _broker(kind, work / kind)
    started = time.monotonic()
    broker.start(timeout=180)
    figures: dict[str, Any] = {"start_s": time.monotonic() - started, "rss_mb_started": _rss_mb(broker.pid())}
    try:
        figures["produce_s"], figures["consume_s"] = _load(kind, broker.bootstrap, records)
        figures["rss_mb_after_load"] = _rss_mb(broker.pid())
        broker.stop()
        started = time.monotonic()
        broker.start(timeout=180)
        figures["restart_s"] = time.monotonic() - started
    finally:
        broker.stop()
    return figures


def run(rounds: int, records: int) -> dict[str, Any]:
    """Alternate the brokers for ``rounds`` rounds; figures per broker."""
    work = Path(tempfile.mkdtemp(prefix="bkaudit-bench-brokers-"))
    results: dict[str, list[dict[str, Any]]] = {kind: [] for kind in BROKERS}
    uptime_at_start = _uptime()
    for index in range(rounds):
        for kind in BROKERS if index % 2 == 0 else tuple(reversed(BROKERS)):
            results[kind].append(_one(kind, work / f"round{index}", records))
    figures: dict[str, Any] = {"rounds": rounds, "records": records, "cpus": os.cpu_count()}
    for kind, runs in results.items():
        figures[kind] = {
            key: _summary([float(run[key]) for run in runs if run.get(key) is not None])
            for key in (
                "start_s",
                "restart_s",
                "rss_mb_started",
                "rss_mb_after_load",
                "produce_s",
                "consume_s",
            )
        }
    figures["uptime_at_start"] = uptime_at_start
    figures["uptime_at_end"] = _uptime()
    return figures


@pytest.mark.benchmark
def test_broker_figures():
    print(json.dumps(run(rounds=1, records=2000)))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=20_000)
    args = parser.parse_args()
    print(json.dumps(run(args.rounds, args.records)))


if __name__ == "__main__":
    main()
