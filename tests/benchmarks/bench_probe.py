"""Benchmark: GET_LIST_OF_ENTRIES_OF_LEDGER probes/s of the bookie client against one simulated bookie.

Run: ``python tests/benchmarks/bench_probe.py [--probes 20000] [--concurrency 64]`` (prints JSON), or
``make bench`` (pytest, smaller). The server runs in a background thread of the same process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import pytest

from connectors.bookie.client import BookieClient, EntryList, ProbeRequest
from connectors.bookie.server import BookieServer, InMemoryEntryStore


def _store(ledgers: int = 100) -> InMemoryEntryStore:
    store = InMemoryEntryStore()
    for ledger in range(ledgers):
        store.add_entries(ledger, [e for e in range(200) if e % 50 != 7])  # 5 runs: a realistic stripe
    return store


async def _measure(address: str, probes: int, concurrency: int) -> float:
    async with BookieClient(max_in_flight_per_bookie=concurrency) as client:
        await client.probe_many([ProbeRequest(address, 1)] * 200, concurrency)  # warm-up: connect
        requests = [ProbeRequest(address, i % 100) for i in range(probes)]
        started = time.perf_counter()
        results = await client.probe_many(requests, concurrency)
        elapsed = time.perf_counter() - started
    if not all(isinstance(r, EntryList) for r in results):
        raise AssertionError({r.kind for r in results})
    return probes / elapsed


def run(probes: int, concurrency: int) -> dict[str, float]:
    with BookieServer(_store()) as server:
        rate = asyncio.run(_measure(server.address, probes, concurrency))
    return {"probes": probes, "concurrency": concurrency, "probes_per_s": round(rate)}


@pytest.mark.benchmark
def test_probe_throughput_figure():
    print(json.dumps(run(5_000, 64)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--probes", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    print(json.dumps(run(args.probes, args.concurrency)))
