"""Hand-built watcher events on the real broker, shared by the streaming job's integration tests.

:class:`Watcher` publishes change events the way ``bkaudit watch`` does (one
:class:`~core.events.EventBuilder`, Kafka key = entity, heartbeats to every partition), so a test can
script a cluster's history without ZooKeeper.
:func:`alerts_on` reads back everything on an alerts topic. :func:`decision_table` builds what the sink
receives from the processor, for tests of the sink alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from bkaudit.testing.kafka_io import read_topic
from connectors.kafka.client_config import holds_tails, partition_count, producer_config
from connectors.kafka.publisher import partition_for_event
from connectors.kafka.tail_sender import TailSender
from core import events as ev
from core.domain.metadata import LedgerMetadata, LedgerState, Segment
from core.domain.rackmap import RackMap
from core.domain.registration import BookieServiceInfo, Endpoint
from core.domain.underreplication import UnderreplicatedLedger

# kazoo's ZnodeStat field names (what the event helpers read).
Stat = namedtuple("Stat", "czxid mzxid ctime mtime version dataLength")
_STATUS = {
    "WRITABLE": ev.BookieStatusValue.WRITABLE,
    "READ_ONLY": ev.BookieStatusValue.READ_ONLY,
    "GONE": ev.BookieStatusValue.GONE,
}


class Watcher:
    """Publishes events the way the watcher does (one builder, Kafka key = entity)."""

    def __init__(self, kafka: Any, clock: Callable[[], int], *, cluster: str = "cluster-1") -> None:
        self.kafka = kafka
        self.builder = ev.EventBuilder(cluster, "run-1", clock_ms=clock)
        self.producer = Producer(producer_config(kafka))
        # Batches with one-record tails, as the real publisher sends (exact high watermarks on Tansu).
        self.sender = TailSender(self.producer, hold_tails=holds_tails(kafka))
        self.mzxid = 100
        self.sent = 0
        self._partitions: dict[str, int] = {}

    def send(self, payload: Any, **kw: Any) -> None:
        event = self.builder.build(payload, **kw)
        key = ev.kafka_key(event)
        topic = self.kafka.changes_topic
        if topic not in self._partitions:
            self._partitions[topic] = partition_count(self.producer, topic, 30.0)
        partition = partition_for_event(event, self._partitions[topic])  # as the real watcher places it
        self.sender.send(topic, key=key, value=ev.encode_event(event), partition=partition)
        self.sent += 1

    def heartbeat(self, at_ms: int, partitions: int = 2) -> None:
        for p in range(partitions):
            event = self.builder.build(
                ev.heartbeat(at_ms, partition=p, partition_count=partitions), event_time_ms=at_ms
            )
            self.sender.send(
                self.kafka.changes_topic, key=ev.kafka_key(event), value=ev.encode_event(event), partition=p
            )
            self.sent += 1

    def bookie(self, bookie_id: str, status: str) -> None:
        host, port = bookie_id.rsplit(":", 1)
        info = BookieServiceInfo(endpoints=(Endpoint("bookie", int(port), host, "bookie-rpc"),))
        self.send(
            ev.bookie_status(
                bookie_id, _STATUS[status], info=info if status != "GONE" else None, has_cookie=True
            )
        )

    def ledger(
        self,
        ledger_id: int,
        ensemble: Sequence[str],
        *,
        wq: int = 2,
        aq: int = 2,
        closed: bool = True,
        later_ensembles: Sequence[tuple[int, Sequence[str]]] = (),
    ) -> None:
        """Upsert a ledger (a new znode version); ``later_ensembles``: ``(first entry, bookies)`` changes."""
        self.mzxid += 1
        segments = (
            Segment(0, tuple(ensemble)),
            *(Segment(first, tuple(bookies)) for first, bookies in later_ensembles),
        )
        md = LedgerMetadata(
            ensemble_size=len(ensemble),
            write_quorum=wq,
            ack_quorum=aq,
            state=LedgerState.CLOSED if closed else LedgerState.OPEN,
            last_entry_id=99 if closed else -1,
            length=1000 if closed else 0,
            segments=segments,
            custom_metadata=(("pulsar/managed-ledger", b"public/default/persistent/t1"),),
        )
        self.send(
            ev.ledger_upserted(
                ledger_id, md, Stat(self.mzxid, self.mzxid, 0, 0, 0, 100), f"/ledgers/L{ledger_id}"
            )
        )

    def delete(self, ledger_id: int) -> None:
        self.mzxid += 1
        self.send(ev.ledger_deleted(ledger_id, last_mzxid=self.mzxid))

    def corrupt(self, ledger_id: int, reason: str = "bad header") -> None:
        self.mzxid += 1
        stat = Stat(self.mzxid, self.mzxid, 0, 0, 0, 3)
        self.send(ev.ledger_undecodable(ledger_id, f"/ledgers/L{ledger_id}", stat, reason))

    def mark_under_replicated(self, ledger_id: int, replicas: Sequence[str], ctime_ms: int) -> None:
        self.mzxid += 1
        mark = UnderreplicatedLedger(tuple(replicas), ctime_ms)
        self.send(ev.underreplication_set(ledger_id, mark, Stat(self.mzxid, self.mzxid, 0, 0, 0, 9)))

    def clear_under_replicated(self, ledger_id: int) -> None:
        self.mzxid += 1
        self.send(ev.underreplication_cleared(ledger_id, last_mzxid=self.mzxid))

    def rack_map(self, racks: dict[str, str]) -> None:
        self.send(ev.rack_map_event("file:/racks.json", RackMap.from_racks(racks), present=True))

    def flush(self) -> None:
        self.sender.flush()

    def close(self) -> None:
        self.sender.flush()


def alerts_on(kafka: Any, timeout_s: float = 20.0) -> list[tuple[str, dict[str, Any]]]:
    """Every ``(key, alert)`` on ``kafka.alerts_topic``, all partitions, from the beginning."""
    records = read_topic(kafka, kafka.alerts_topic, timeout_s)
    return [((r.key or b"").decode(), json.loads(r.value)) for r in records]


def decision_table(*rows: tuple[str, int, int | None, str | None, dict[str, Any]]) -> Any:
    """Decisions ``(kind, event time ms, ledger id, bookie id, payload)`` as the Arrow table the sink gets."""
    from datetime import UTC, datetime

    import pyarrow as pa

    from streaming.sink import ARROW_DECISION_SCHEMA

    return pa.Table.from_pylist(
        [
            {
                "kind": kind,
                "event_time": datetime.fromtimestamp(t / 1000, tz=UTC),
                "cluster": "c1",
                "ledger_id": ledger_id,
                "bookie_id": bookie_id,
                "payload": json.dumps(payload),
            }
            for kind, t, ledger_id, bookie_id, payload in rows
        ],
        schema=ARROW_DECISION_SCHEMA,
    )


def closed_ledger_payload(ensemble: list[str], mzxid: int, snapshot_id: str | None = None) -> dict[str, Any]:
    """The decoded payload of a closed v3 ledger (10 entries, WQ = AQ = 2) on one segment, as the sink reads
    it in a ``ledger_state`` decision."""
    payload: dict[str, Any] = {
        "state": "CLOSED",
        "ensemble_size": len(ensemble),
        "write_quorum": 2,
        "ack_quorum": 2,
        "last_entry_id": 9,
        "length": 10,
        "segments": [{"first_entry_id": 0, "ensemble": ensemble}],
        "mzxid": mzxid,
        "version": 0,
        "format_version": 3,
        "has_password": True,
        "custom_metadata": [],
    }
    if snapshot_id is not None:
        payload["snapshot_id"] = snapshot_id
    return payload


def run_watch_once(
    zookeeper: str, bootstrap: str, topic: str, *options: str, env: Mapping[str, str], cwd: Path
) -> subprocess.CompletedProcess[bytes]:
    """``bkaudit watch --exit-after-snapshot --log-level DEBUG`` as its own process, its output captured:
    the tests that search every line it can log (for a secret, for its one-line refusal) run it so."""
    command = [sys.executable, "-m", "bkaudit.cli.main", "watch", "--zookeeper", zookeeper]
    command += ["--bootstrap", bootstrap, "--topic", topic, *options]
    command += ["--exit-after-snapshot", "--log-level", "DEBUG"]
    return subprocess.run(command, capture_output=True, timeout=180, env=dict(env), cwd=cwd)
