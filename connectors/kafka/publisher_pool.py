"""Large bursts of Kafka records sent from several worker processes.

kafka-python does its per-record work (the ``send`` call, batching, CRC) in Python under the GIL: one
process sends ~30,000 records/s to the embedded broker, and a lost bookie at 1 M ledgers on 100 bookies
has ~31,000 alerts to publish. :class:`PublisherPool` splits a burst by partition over N worker processes
(each partition always goes to the same worker, so per-partition order is kept), each with its own
producer configured exactly like the sink's (:func:`connectors.kafka.client_config.producer_config`) and
its own :class:`~connectors.kafka.tail_sender.TailSender`. A call returns when every record is
acknowledged or failed; the caller gets the number of failed records and decides (the sink fails the
batch, which is replayed).

Workers are ``python -m connectors.kafka.publisher_pool`` children started on first use; they receive the
Kafka settings (secrets included) over their stdin pipe, never on the command line, and answer on a
duplicate of their stdout (anything else they print goes to stderr). A worker that dies or does not answer
in time is killed and replaced on the next call; the call raises :class:`~bkaudit.errors.ServiceError`.

:func:`send_records` is the one send loop, used by the workers and by the sink's own process for smaller
bursts.

Status: new; used by the streaming sink for bursts of at least ``POOL_MIN_RECORDS`` records when
``stream.publish_processes > 1`` (the job starts the workers with the query).

Example:
    >>> # pool = PublisherPool(settings.kafka, processes=2)
    >>> # failed = pool.publish([("bkaudit.alerts", 3, b"c1/ledger/7", b"{...}")], timeout_s=120)
    >>> # pool.close()
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import subprocess
import sys
from collections.abc import Sequence
from typing import IO, Any

from bkaudit.errors import ServiceError
from bkaudit.settings import KafkaSettings

#: (topic, partition, key, value)
Record = tuple[str, int, bytes | None, bytes]

#: Below this many records a burst is sent in the caller's process (the hand-over costs more than it saves).
POOL_MIN_RECORDS = 2_000


def send_records(producer: Any, settings: KafkaSettings, records: Sequence[Record]) -> tuple[int, str | None]:
    """Send ``records`` through ``producer`` (one-record tails when the settings ask for them) and wait for
    every acknowledgement; returns (records that failed after the producer's retries, the first failure).

    The one send loop: the sink's own process uses it for small bursts, each pool worker for its share.

    Example:
        >>> # failed, first_failure = send_records(KafkaProducer(**producer_config(s)), s, records)
    """
    from connectors.kafka.client_config import holds_tails
    from connectors.kafka.tail_sender import TailSender

    failures: list[BaseException] = []
    sender = TailSender(producer, hold_tails=holds_tails(settings))
    for topic, partition, key, value in records:
        sender.send(topic, key=key, value=value, partition=partition, on_error=failures.append)
    sender.flush()
    return len(failures), (type(failures[0]).__name__ if failures else None)


class _Worker:
    def __init__(self, settings: KafkaSettings) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "connectors.kafka.publisher_pool"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.requests: IO[bytes] = self.process.stdin
        self.replies: IO[bytes] = self.process.stdout
        self._send(settings)

    def _send(self, message: Any) -> None:
        pickle.dump(message, self.requests, protocol=pickle.HIGHEST_PROTOCOL)
        self.requests.flush()

    def submit(self, records: list[Record]) -> None:
        self._send(("send", records))

    def result(self, timeout_s: float) -> tuple[int, str | None]:
        """(failed records, first failure) of the last submit; raises ServiceError when the worker is gone."""
        ready, _, _ = select.select([self.replies], [], [], timeout_s)
        if not ready:
            raise ServiceError(f"a Kafka publisher process did not answer within {timeout_s:.0f} s")
        try:
            reply = pickle.load(self.replies)
        except (EOFError, pickle.UnpicklingError) as err:
            raise ServiceError(
                f"a Kafka publisher process exited (code {self.process.poll()}): {type(err).__name__}"
            ) from None
        if reply[0] == "error":
            raise ServiceError(f"a Kafka publisher process failed: {reply[1]}")
        return int(reply[1]), reply[2]

    def close(self, *, kill: bool = False) -> None:
        if not kill and self.process.poll() is None:
            try:
                self._send(("close",))
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                kill = True
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        for stream in (self.requests, self.replies):
            with contextlib.suppress(OSError):
                stream.close()


class PublisherPool:
    """N worker processes sending records; one caller thread at a time (see the module doc).

    Example:
        >>> PublisherPool(KafkaSettings(), processes=2).workers_started
        0
    """

    def __init__(self, settings: KafkaSettings, processes: int) -> None:
        if processes < 1:
            raise ValueError("a publisher pool needs at least one process")
        self.settings = settings
        self.processes = processes
        self._workers: list[_Worker | None] = [None] * processes

    @property
    def workers_started(self) -> int:
        return sum(1 for w in self._workers if w is not None)

    def start(self) -> None:
        """Start every worker now (they connect in the background) instead of on the first burst."""
        for index in range(self.processes):
            self._worker(index)

    def _worker(self, index: int) -> _Worker:
        worker = self._workers[index]
        if worker is None or worker.process.poll() is not None:
            if worker is not None:
                worker.close(kill=True)
            worker = self._workers[index] = _Worker(self.settings)
        return worker

    def publish(self, records: Sequence[Record], timeout_s: float | None = None) -> tuple[int, str | None]:
        """Send ``records`` (each partition's in the given order) and wait for every acknowledgement.

        Returns (records that failed after the producer's retries, the first failure's type); raises
        :class:`~bkaudit.errors.ServiceError` when a worker died or did not answer within ``timeout_s``
        (default: a worker's bootstrap plus delivery timeouts and a minute; that worker is replaced on the
        next call).
        """
        if timeout_s is None:
            timeout_s = (
                self.settings.bootstrap_timeout_ms + self.settings.producer_delivery_timeout_ms
            ) / 1000
            timeout_s += 60
        shares: list[list[Record]] = [[] for _ in range(self.processes)]
        for record in records:
            shares[record[1] % self.processes].append(record)
        busy: list[int] = []
        try:
            for index, share in enumerate(shares):
                if share:
                    self._worker(index).submit(share)
                    busy.append(index)
            failed, first = 0, None
            for index in busy:
                worker = self._workers[index]
                assert worker is not None
                count, failure = worker.result(timeout_s)
                failed += count
                first = first or failure
            return failed, first
        except (ServiceError, OSError) as err:
            for index in busy:
                worker = self._workers[index]
                if worker is not None:
                    worker.close(kill=True)  # its state is unknown: start afresh next time
                    self._workers[index] = None
            if isinstance(err, ServiceError):
                raise
            raise ServiceError(f"a Kafka publisher process could not be reached: {err}") from None

    def close(self) -> None:
        for index, worker in enumerate(self._workers):
            if worker is not None:
                worker.close()
                self._workers[index] = None


def _serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """A worker's loop: settings first, then ``("send", records)`` until ``("close",)`` or end of input."""
    from kafka import KafkaProducer

    from connectors.kafka.client_config import producer_config

    settings: KafkaSettings = pickle.load(requests)
    producer: Any = None
    try:
        # Connect before the first burst arrives; a broker not reachable yet is retried at the first burst.
        with contextlib.suppress(Exception):
            producer = KafkaProducer(**producer_config(settings))
        while True:
            try:
                message = pickle.load(requests)
            except EOFError:
                return
            if message[0] == "close":
                return
            try:
                if producer is None:
                    producer = KafkaProducer(**producer_config(settings))
                reply: tuple[Any, ...] = ("done", *send_records(producer, settings, message[1]))
            except Exception as err:  # reported to the caller, which fails its batch
                reply = ("error", f"{type(err).__name__}: {err}")
            pickle.dump(reply, replies, protocol=pickle.HIGHEST_PROTOCOL)
            replies.flush()
    finally:
        if producer is not None:
            producer.close(timeout=10)


if __name__ == "__main__":
    # The protocol owns the original stdout; stray prints (and logging's default stream) go to stderr.
    protocol_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _serve(sys.stdin.buffer, protocol_out)
