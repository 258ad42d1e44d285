"""Kafka's default partition of a keyed record: librdkafka's murmur2 gives what Java's partitioner gives.

The sink and the watcher place each record on the partition Kafka's default partitioner would pick (so the
newest record of each partition can be held back, connectors/kafka/tail_sender.py, and the watcher knows
where each event lands); a wrong hash would split one entity's records over partitions and break their
order for consumers.

The vectors below are Java's: the (key, partition count) → partition table was generated with
kafka-python's ``murmur2`` (a port of Java's ``Utils.murmur2``, ``toPositive(h) % n``) before that client
was removed; the hashes are the published ones of Kafka's ``UtilsTest.testMurmur2``.
"""

from __future__ import annotations

import pytest

from connectors.kafka.client_config import producer_config
from connectors.kafka.publisher import partition_for_key, partitions_for_keys

#: (key, partition count, partition Java's default partitioner picks)
JAVA_PARTITIONS: list[tuple[bytes, int, int]] = [
    (b"", 1, 0),
    (b"", 3, 0),
    (b"a", 3, 1),
    (b"a", 16, 12),
    (b"ab", 4, 2),
    (b"ab", 2147483647, 316155434),
    (b"abc", 8, 3),
    (b"abc", 4, 3),
    (b"abcd", 16, 4),
    (b"abcd", 100, 0),
    (b"abcde", 100, 41),
    (b"abcde", 1, 0),
    (b"cluster", 1000, 314),
    (b"cluster", 8, 2),
    (b"bookie/127.0.0.1:3181", 2147483647, 1261364436),
    (b"bookie/127.0.0.1:3181", 1000, 436),
    (b"ledger/0", 1, 0),
    (b"ledger/0", 3, 2),
    (b"ledger/59", 3, 1),
    (b"ledger/59", 16, 11),
    (b"ledger/1234567", 4, 1),
    (b"ledger/1234567", 2147483647, 231385177),
    (b"c1/ledger/7", 8, 4),
    (b"c1/ledger/7", 4, 0),
    (b"c1/ledger/123456", 16, 9),
    (b"c1/ledger/123456", 100, 1),
    (b"c1/bookie/bk-3.example:3181", 100, 61),
    (b"c1/bookie/bk-3.example:3181", 1, 0),
    (b"rackmap", 1000, 760),
    (b"rackmap", 8, 0),
    (b"\x00\x01\x02\x03\x04\x05\x06\x07\x08\t\n\x0b\x0c", 2147483647, 521152807),
    (b"\x00\x01\x02\x03\x04\x05\x06\x07\x08\t\n\x0b\x0c", 1000, 807),
    (b"\xff\xff\xff\xff\xff\xff\xff", 1, 0),
    (b"\xff\xff\xff\xff\xff\xff\xff", 3, 1),
    (b"\x80\x7f\xff\x00\x01", 3, 0),
    (b"\x80\x7f\xff\x00\x01", 16, 4),
    (b"\xc3\xbcn\xc3\xafcode/ledger/42", 4, 1),
    (b"\xc3\xbcn\xc3\xafcode/ledger/42", 2147483647, 743924421),
]

#: Kafka's published murmur2 test vectors (signed 32-bit hashes, clients/.../UtilsTest.java).
KAFKA_MURMUR2: dict[bytes, int] = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("key", "partitions", "expected"), JAVA_PARTITIONS)
def test_keys_land_where_javas_default_partitioner_puts_them(key: bytes, partitions: int, expected: int):
    assert partition_for_key(key, partitions) == expected


@pytest.mark.parametrize(("key", "java_hash"), sorted(KAFKA_MURMUR2.items()))
@pytest.mark.parametrize("partitions", [1, 7, 8, 1000, 2**31 - 1])
def test_kafkas_published_murmur2_vectors(key: bytes, java_hash: int, partitions: int):
    assert partition_for_key(key, partitions) == (java_hash & 0x7FFFFFFF) % partitions


def test_many_keys_at_once_in_the_input_order():
    keys = [key for key, _, _ in JAVA_PARTITIONS]
    assert partitions_for_keys(keys, 1000) == [partition_for_key(k, 1000) for k in keys]
    assert partitions_for_keys([], 8) == []


def test_producers_partition_unplaced_keyed_records_the_same_way():
    # Records sent without an explicit partition go through librdkafka's partitioner: Java-compatible.
    from core.settings import KafkaSettings

    assert producer_config(KafkaSettings())["partitioner"] == "murmur2_random"
