"""Kafka's default partition of a keyed record: the vectorised rule agrees with kafka-python's murmur2.

The sink places each alert on the partition Kafka's default partitioner would pick (so the newest record of
each partition can be held back, connectors/kafka/tail_sender.py); a wrong hash would split one entity's
alerts over partitions and break their order for consumers.
"""

from __future__ import annotations

import random

import pytest
from kafka.partitioner.default import murmur2

from connectors.kafka.publisher import partition_for_key, partitions_for_keys


def _reference(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@pytest.mark.parametrize("partitions", [1, 3, 8, 16, 1000, 2**31 - 1])
def test_vectorised_partitions_match_kafka_python_for_random_keys(partitions: int) -> None:
    rng = random.Random(partitions)
    keys = [rng.randbytes(rng.randrange(0, 64)) for _ in range(3000)]
    assert partitions_for_keys(keys, partitions) == [_reference(k, partitions) for k in keys]


def test_alert_keys_of_one_length_and_every_tail_length() -> None:
    # Every key length modulo 4 (the tail bytes are mixed separately), high bytes included.
    keys = [b"c1/ledger/%d" % i for i in range(5000)] + [bytes([255] * n) for n in range(12)]
    assert partitions_for_keys(keys, 8) == [partition_for_key(k, 8) for k in keys]


def test_order_is_the_input_order_whatever_the_lengths() -> None:
    keys = [b"a", b"bbbb", b"cc", b"a", b""]
    assert partitions_for_keys(keys, 1000) == [_reference(k, 1000) for k in keys]
    assert partitions_for_keys([], 8) == []
