"""Benchmark: ledger metadata v3 decodes per second on one core (target: at least 50,000/s).

Builds realistic v3 znodes (what a Pulsar cluster's bookies hold: mostly closed ledgers,
E=3/WQ=2/AQ=2 or E=5/WQ=3/AQ=2, one to three segments drawn from a pool of 30 bookies, an empty or short
password, Pulsar's three custom-metadata entries, ``cToken``, sometimes a ``ctime``), then decodes them one
after another in a single thread and prints the rate. 10,000 distinct blobs are cycled through so memory stays
small while the decoder still sees many different ledgers.

Run as a script for the full figure, or through pytest (``-m benchmark``) for a shorter run::

    python tests/benchmarks/bench_metadata_decode.py            # 1,000,000 decodes
    python tests/benchmarks/bench_metadata_decode.py 200000     # any count
    pytest tests/benchmarks/bench_metadata_decode.py -m benchmark -s

Example:
    >>> blobs = realistic_v3_blobs(3)
    >>> [blob[:30] for blob in blobs] == [b"BookieMetadataFormatVersion\\t3\\n"] * 3
    True
"""

from __future__ import annotations

import random
import sys
import time

import pytest

from core.domain.metadata import (
    DigestType,
    LedgerMetadata,
    LedgerPassword,
    LedgerState,
    Segment,
    decode_ledger_metadata,
    encode_ledger_metadata,
)

DISTINCT_BLOBS = 10_000
FULL_COUNT = 1_000_000
PYTEST_COUNT = 100_000
TARGET_PER_SECOND = 50_000


def realistic_v3_blobs(count: int, *, seed: int = 7) -> list[bytes]:
    """``count`` distinct v3 ledger znodes shaped like a Pulsar cluster's.

    Example:
        >>> len(realistic_v3_blobs(2)) == 2
        True
    """
    rng = random.Random(seed)
    bookies = [f"10.20.{rack}.{host}:3181" for rack in range(3) for host in range(10, 20)]
    blobs = []
    for ledger_id in range(count):
        ensemble_size, write_quorum = rng.choice([(3, 2), (3, 2), (3, 2), (5, 3)])
        firsts = [0]
        for _ in range(rng.choice([0, 0, 0, 1, 2])):  # most ledgers never change ensemble
            firsts.append(firsts[-1] + rng.randint(1, 50_000))
        segments = tuple(Segment(first, tuple(rng.sample(bookies, ensemble_size))) for first in firsts)
        closed = rng.random() < 0.9
        last_entry_id = firsts[-1] + rng.randint(0, 50_000) if closed else -1
        tenant, namespace = f"tenant-{ledger_id % 7}", f"ns-{ledger_id % 3}"
        topic = f"{tenant}/{namespace}/persistent/topic-{ledger_id // 16}-partition-{ledger_id % 16}"
        md = LedgerMetadata(
            ensemble_size=ensemble_size,
            write_quorum=write_quorum,
            ack_quorum=2,
            state=LedgerState.CLOSED if closed else LedgerState.OPEN,
            last_entry_id=last_entry_id,
            length=(last_entry_id + 1) * rng.randint(100, 2000) if closed else 0,
            digest_type=DigestType.CRC32C,
            password=LedgerPassword(rng.choice([b"", b"", b"pulsar-secret"])),
            segments=segments,
            ctime=1_700_000_000_000 + ledger_id if rng.random() < 0.3 else None,
            ctoken=0,
            custom_metadata=(
                ("application", b"pulsar"),
                ("component", b"managed-ledger"),
                ("pulsar/managed-ledger", topic.encode()),
            ),
        )
        blobs.append(encode_ledger_metadata(md))
    return blobs


def measure(total: int, blobs: list[bytes]) -> tuple[float, float]:
    """Decode ``total`` blobs (cycling through ``blobs``); return (decodes per wall second, per CPU second).

    Example:
        >>> wall, cpu = measure(10, realistic_v3_blobs(5))
        >>> wall > 0 and cpu > 0
        True
    """
    decode = decode_ledger_metadata
    distinct = len(blobs)
    rounds, rest = divmod(total, distinct)
    wall_started, cpu_started = time.perf_counter(), time.process_time()
    for _ in range(rounds):
        for blob in blobs:
            decode(blob)
    for blob in blobs[:rest]:
        decode(blob)
    wall, cpu = time.perf_counter() - wall_started, time.process_time() - cpu_started
    return total / wall, total / max(cpu, 1e-9)


def report(total: int) -> float:
    """Run the benchmark and print one line; returns decodes per wall-clock second.

    Example:
        >>> report(20) > 0  # doctest: +ELLIPSIS
        ledger metadata v3 decode: 20 decodes ...
        True
    """
    blobs = realistic_v3_blobs(min(DISTINCT_BLOBS, total))
    measure(min(total, 2_000), blobs)  # warm caches (the validated-ensemble cache, the allocator)
    per_wall, per_cpu = measure(total, blobs)
    print(
        f"ledger metadata v3 decode: {total} decodes of {len(blobs)} distinct blobs "
        f"({sum(map(len, blobs)) / len(blobs):.0f} bytes avg): {per_wall:,.0f}/s wall, {per_cpu:,.0f}/s CPU, "
        f"one thread (target {TARGET_PER_SECOND:,}/s)"
    )
    return per_wall


@pytest.mark.benchmark
def test_metadata_decode_rate() -> None:
    """Prints the figure for a shorter run; no timing assertion (machines differ)."""
    assert report(PYTEST_COUNT) > 0


if __name__ == "__main__":
    report(int(sys.argv[1]) if len(sys.argv) > 1 else FULL_COUNT)
