"""One deterministic event history for the crash tests: every rule, a lost bookie, deletions, corrupt
znodes, and an under-replication mark whose grace timer fires in the timers query.

:func:`publish_history` writes it to a changes topic in four waves, 60 s of event time apart, at fixed
event times, so every run of the job (a reference and each crashed attempt) sees the very same history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.settings import KafkaSettings
from tests.integration.event_fixtures import Watcher

SEED = 20240611
PARTITIONS = 2
MAX_OFFSETS_PER_TRIGGER = 5
APP_ID = "bkaudit-crash-test"
JOB_TIMEOUT_S = 400.0

T0 = 1_700_000_000_000  # fixed event times: both runs and every attempt see the very same history
BOOKIES = [f"10.0.1.{i}:3181" for i in range(1, 7)]
RACKS = {b: f"/rack{i % 3}" for i, b in enumerate(BOOKIES)}  # b1,b4 → rack0; b2,b5 → rack1; b3,b6 → rack2
STREAM_SETTINGS = {
    "MAX_OFFSETS_PER_TRIGGER": str(MAX_OFFSETS_PER_TRIGGER),
    # Longer than the 60 s of event time between waves: when one partition runs a wave ahead of the other
    # in a rate-limited batch, the other's events are not dropped as late (checked on the reference).
    "WATERMARK_DELAY_S": "70",
    "DEFAULT_RECOVERY_DELAY_S": "0",
    "UNDER_REPLICATION_GRACE_S": "5",  # an event-time timer fires UNDER_REPLICATION_STUCK
}


# ------------------------------------------------------------------------------------------ the history


class SteppingClock:
    """Event time for the builder: +10 ms per event, jumped forward between waves."""

    def __init__(self, start_ms: int) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        self.now_ms += 10
        return self.now_ms

    def jump(self, at_ms: int) -> None:
        self.now_ms = max(self.now_ms, at_ms)


def ring_ensemble(first: int, size: int = 3) -> list[str]:
    """``size`` consecutive bookies from ``first``: consecutive bookies sit on distinct racks."""
    return [BOOKIES[(first + k) % len(BOOKIES)] for k in range(size)]


@dataclass
class History:
    """What was published, and the final state it implies (to prove the job dropped no event as late)."""

    events: int = 0
    ledger_mzxid: dict[int, int] = field(default_factory=dict)  # last upsert / corrupt znode version
    deleted: set[int] = field(default_factory=set)
    bookie_status: dict[str, str] = field(default_factory=dict)


def publish_history(kafka: KafkaSettings) -> History:
    """Publish the cluster's story in four waves, 60 s of event time apart (heartbeats on both partitions)."""
    clock = SteppingClock(T0)
    watcher = Watcher(kafka, clock)
    history = History()
    b1, b2, b3, b4, b5, b6 = BOOKIES

    def ledger(ledger_id: int, ensemble: list[str], **kw: Any) -> None:
        watcher.ledger(ledger_id, ensemble, **kw)
        history.ledger_mzxid[ledger_id] = watcher.mzxid
        history.deleted.discard(ledger_id)

    def corrupt(ledger_id: int) -> None:
        watcher.corrupt(ledger_id)
        history.ledger_mzxid[ledger_id] = watcher.mzxid

    def delete(ledger_id: int) -> None:
        watcher.delete(ledger_id)
        history.deleted.add(ledger_id)

    def bookie(bookie_id: str, status: str) -> None:
        watcher.bookie(bookie_id, status)
        history.bookie_status[bookie_id] = status

    # Wave 1: a healthy cluster with some badly placed, fragile, open and corrupt ledgers, and a urL mark
    # whose grace timer fires once wave 2's heartbeat moves the watermark past it.
    watcher.rack_map(RACKS)
    for bookie_id in BOOKIES:
        bookie(bookie_id, "WRITABLE")
    for ledger_id in range(1, 31):
        if ledger_id % 7 == 0:
            ledger(ledger_id, [b1, b4])  # both on rack0: PLACEMENT_NOT_ADHERING
        elif ledger_id % 5 == 0:
            ledger(ledger_id, ring_ensemble(ledger_id), wq=1, aq=1)  # one copy: a loss is data loss
        else:
            ledger(ledger_id, ring_ensemble(ledger_id), closed=ledger_id % 9 != 0)
    corrupt(41)
    watcher.mark_under_replicated(4, [b5], ctime_ms=clock.now_ms)
    watcher.heartbeat(T0 + 60_000, PARTITIONS)

    # Wave 2: ensemble changes and deletions, then b1 goes away (delay 0: lost at once).
    clock.jump(T0 + 60_000)
    for ledger_id in (3, 8, 13, 16):
        ensemble = ring_ensemble(ledger_id)
        replaced = [BOOKIES[(ledger_id + 3) % 6] if b == ensemble[0] else b for b in ensemble]
        ledger(ledger_id, ensemble, later_ensembles=[(50, replaced)])
    for ledger_id in (10, 20, 30):
        delete(ledger_id)
    bookie(b1, "GONE")
    watcher.heartbeat(T0 + 120_000, PARTITIONS)

    # Wave 3: b1 returns, b5 and b6 vanish together, b2 moves racks, the corrupt ledger is rewritten and
    # another one goes corrupt.
    clock.jump(T0 + 120_000)
    bookie(b1, "WRITABLE")
    bookie(b5, "GONE")
    bookie(b6, "GONE")
    watcher.rack_map({**RACKS, b2: "/rack0"})
    ledger(41, ring_ensemble(41))
    corrupt(12)
    watcher.heartbeat(T0 + 180_000, PARTITIONS)

    # Wave 4: b5 returns (b6 stays lost), new ledgers land on the lost b6, the urL mark clears, one deletion.
    clock.jump(T0 + 180_000)
    bookie(b5, "WRITABLE")
    for ledger_id in range(42, 46):
        ledger(ledger_id, [b6, b2, b3])
    watcher.clear_under_replicated(4)
    delete(1)
    watcher.heartbeat(T0 + 240_000, PARTITIONS)
    watcher.heartbeat(T0 + 300_000, PARTITIONS)
    watcher.close()
    history.events = watcher.sent
    return history
