"""The background replicas check: a walk over every closed or open ledger, paced to finish within a pass time.

BookKeeper's Auditor runs its replicas check (off by default) from the first ledger at every run. bkaudit's
sink probes the next few ledgers each micro-batch (closed ones to their last entry, open ones to their last
add confirmed; the sink passes the ledger log's ``checked_after`` as the walk's ``closed_after``), in
ledger id order from a cursor that survives a restart (``<checkpoint>/sink/scrutiny.json``), at a pace
that walks them all within ``pass_s`` (a day by default: about 12 ledgers a second at 1 M ledgers; each
bookie's own pace is the prober's, ``stream.entry_reads_per_s_per_bookie``). A ledger that closes is
checked at once as well, ahead of the walk: its last entries are the ones a failed write leaves short. A
failing check starts the re-probe rounds like any other probe; a healthy one says nothing.

A completed pass is recorded (``last_full_pass_ms``), so a pass that takes far longer than planned (a stuck
or starved sink) is seen: the job's metrics say when the last pass ended and how long one should take.

Example:
    >>> walk = ScrutinyPass(pass_s=100.0, max_per_batch=10)
    >>> closed = [3, 5, 8]
    >>> after = lambda cursor, limit: [i for i in closed if i > cursor][:limit]
    >>> walk.picks(now_ms=0, closed_after=after, closed_count=3)  # the pace starts now
    []
    >>> walk.picks(now_ms=70_000, closed_after=after, closed_count=3)  # 3 ledgers per 100 s: 2 are due
    [3, 5]
    >>> walk.picks(now_ms=140_000, closed_after=after, closed_count=3), walk.last_full_pass_ms  # round
    ([8, 3], 140000)
    >>> walk.ledger_closed([9]); walk.picks(now_ms=141_000, closed_after=after, closed_count=4)
    [9]
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from connectors import storage

#: Ledgers that closed and wait for their check, at most (more are left to the walk).
CLOSED_QUEUE_LIMIT = 100_000
STATE_FILE = "scrutiny.json"


@dataclass
class ScrutinyPass:
    """Where the walk is, how fast it goes, and when it last went round.

    ``ledgers_per_s``: a fixed pace (None: every closed ledger within ``pass_s``; 0: no walk).
    """

    pass_s: float = 86_400.0
    max_per_batch: int = 1000
    ledgers_per_s: float | None = None
    on_close: bool = True
    cursor: int = -1
    pass_started_ms: int | None = None
    last_full_pass_ms: int | None = None
    last_pick_ms: int | None = None
    closed: deque[int] = field(default_factory=deque)

    def rate(self, closed_count: int) -> float:
        """Ledgers per second the walk goes at with ``closed_count`` closed ledgers.

        Example:
            >>> ScrutinyPass().rate(1_000_000) > 11.5, ScrutinyPass(ledgers_per_s=0).rate(10)
            (True, 0.0)
        """
        if self.ledgers_per_s is not None:
            return float(self.ledgers_per_s)
        return closed_count / self.pass_s if self.pass_s > 0 else 0.0

    def expected_pass_s(self, closed_count: int) -> float | None:
        """How long a pass over ``closed_count`` ledgers takes at the walk's pace (None: no walk).

        Example:
            >>> ScrutinyPass(ledgers_per_s=10).expected_pass_s(1000)
            100.0
        """
        rate = self.rate(closed_count)
        if rate <= 0:
            return None
        return max(closed_count / rate, 1.0)

    def ledger_closed(self, ledger_ids: Iterable[int]) -> None:
        """Ledgers that just closed: checked ahead of the walk (beyond the queue's limit, by the walk)."""
        if not self.on_close:
            return
        for ledger_id in ledger_ids:
            if len(self.closed) >= CLOSED_QUEUE_LIMIT:
                return
            self.closed.append(int(ledger_id))

    def check_soon(self, ledger_ids: Iterable[int]) -> None:
        """Ledgers to check ahead of the walk whatever ``on_close`` says (e.g. those of a bookie formatted
        again); beyond the queue's limit they are left to the walk.

        Example:
            >>> walk = ScrutinyPass(on_close=False); walk.check_soon([4, 7]); list(walk.closed)
            [4, 7]
        """
        room = max(CLOSED_QUEUE_LIMIT - len(self.closed), 0)
        self.closed.extend(itertools.islice((int(i) for i in ledger_ids), room))

    def picks(
        self, now_ms: int, closed_after: Callable[[int, int], list[int]], closed_count: int
    ) -> list[int]:
        """The ledgers to check in this batch: the closed queue first, then the walk's next ledgers due by
        ``now_ms`` (``closed_after(cursor, limit)`` lists closed ledgers above ``cursor``), at most
        ``max_per_batch`` in all."""
        queued = [self.closed.popleft() for _ in range(min(len(self.closed), self.max_per_batch))]
        return queued + self._walk(now_ms, closed_after, closed_count, self.max_per_batch - len(queued))

    def _walk(
        self, now_ms: int, closed_after: Callable[[int, int], list[int]], closed_count: int, room: int
    ) -> list[int]:
        rate = self.rate(closed_count)
        if rate <= 0 or self.last_pick_ms is None or now_ms < self.last_pick_ms:
            self.last_pick_ms = now_ms  # the pace starts (again) now
            return []
        due = int((now_ms - self.last_pick_ms) / 1000 * rate)
        budget = min(due, room)
        if budget <= 0:
            return []
        # Keep the fraction of a ledger not yet due, so the pace is the rate's; a backlog beyond the batch's
        # room (the job was stopped) is dropped rather than caught up in a burst.
        self.last_pick_ms = now_ms if due > room else self.last_pick_ms + int(budget * 1000 / rate)
        if self.pass_started_ms is None:
            self.pass_started_ms = now_ms
        picked = closed_after(self.cursor, budget + 1)
        if len(picked) > budget:
            self.cursor = picked[budget - 1]
            return picked[:budget]
        # The walk reached the last closed ledger: the pass is complete, and the next one starts over.
        self.last_full_pass_ms, self.pass_started_ms = now_ms, now_ms
        seen = set(picked)
        head = [i for i in closed_after(-1, budget - len(picked)) if i not in seen]
        self.cursor = head[-1] if head else -1
        return picked + head

    # -- persistence ----------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The walk's position and history (not the closed queue: the walk covers it after a restart)."""
        return {
            "cursor": self.cursor,
            "pass_started_ms": self.pass_started_ms,
            "last_full_pass_ms": self.last_full_pass_ms,
            "last_pick_ms": self.last_pick_ms,
        }

    def restore(self, document: dict[str, Any]) -> None:
        """Take up the walk where :meth:`to_json` left it.

        Example:
            >>> walk = ScrutinyPass()
            >>> walk.restore({"cursor": 41, "last_full_pass_ms": 7})
            >>> walk.cursor, walk.last_full_pass_ms, walk.pass_started_ms
            (41, 7, None)
        """
        self.cursor = int(document.get("cursor", -1))
        for name in ("pass_started_ms", "last_full_pass_ms", "last_pick_ms"):
            value = document.get(name)
            setattr(self, name, None if value is None else int(value))


class ScrutinyStore:
    """The walk's state in one small JSON file, replaced atomically after a batch that moved it.

    Example:
        >>> import tempfile
        >>> store = ScrutinyStore(Path(tempfile.mkdtemp()))
        >>> walk = ScrutinyPass(cursor=9)
        >>> store.save(walk); fresh = ScrutinyPass(); store.load(fresh); fresh.cursor
        9
    """

    def __init__(self, directory: str | Path) -> None:
        self.path = storage.join(directory, STATE_FILE)
        self._saved: dict[str, Any] | None = None

    def load(self, walk: ScrutinyPass) -> None:
        """Restore ``walk`` from the file, if there is one; a file that does not parse starts a new walk."""
        try:
            document = json.loads(storage.read_bytes(self.path))
        except FileNotFoundError:
            return
        except (OSError, ValueError, pa.ArrowException):
            return  # a torn write of a best-effort position: the walk starts over, nothing else is lost
        if isinstance(document, dict):
            walk.restore(document)
            self._saved = walk.to_json()

    def save(self, walk: ScrutinyPass) -> None:
        """Write the walk's state when it changed since the last save."""
        document = walk.to_json()
        if document == self._saved:
            return
        storage.write_atomic(self.path, json.dumps(document, sort_keys=True).encode())
        self._saved = document
