"""The real-bookie demo's ground truth: read from the real cluster's ZooKeeper, computed here, simply.

Nothing here uses bkaudit's rules: the expected alerts come from the ledgers' metadata as BookKeeper wrote
it, the rack map as the demo wrote it, the registrations the bookies hold, and what the demo did to the
bookie processes.

- a lost bookie: every ledger whose metadata names it in any segment is under-replicated (unrecoverable
  when its write quorum is 1: no other copy of its entries exists);
- broken rack diversity: a closed ledger with a write set (``write_quorum`` consecutive ensemble members,
  wrapping) whose bookies all sit in one rack does not adhere to rack-aware placement;
- a stopped bookie: a bookie that is still registered, whose process is stopped, and that some closed
  ledger names (so the background check asks it) is unresponsive.

Example:
    >>> write_sets(("a", "b", "c"), 2)
    [('a', 'b'), ('b', 'c'), ('c', 'a')]
    >>> one_rack_write_set(("a", "b", "c"), 2, {"a": "/r1", "b": "/r1", "c": "/r2"})
    True
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from core.domain.layout import LedgerManagerType, ledger_id_from_path
from core.domain.metadata import LedgerMetadata, decode_ledger_metadata

LedgerMap = Mapping[int, LedgerMetadata]


def write_sets(ensemble: tuple[str, ...], write_quorum: int) -> list[tuple[str, ...]]:
    """Every write set of an ensemble: entry ``e`` goes to members ``e % E .. (e + WQ - 1) % E``.

    Example:
        >>> write_sets(("a", "b"), 2)
        [('a', 'b'), ('b', 'a')]
    """
    size = len(ensemble)
    return [tuple(ensemble[(first + k) % size] for k in range(write_quorum)) for first in range(size)]


def one_rack_write_set(ensemble: tuple[str, ...], write_quorum: int, racks: Mapping[str, str]) -> bool:
    """Whether some write set of ``ensemble`` has all its bookies in one rack (absent: the default rack).

    Example:
        >>> one_rack_write_set(("a", "b", "c"), 2, {"a": "/r1", "b": "/r2", "c": "/r3"})
        False
    """
    return any(
        len({racks.get(b, "/default-rack") for b in quorum}) == 1
        for quorum in write_sets(ensemble, write_quorum)
    )


def naming(ledgers: LedgerMap, bookies: Iterable[str]) -> set[int]:
    """The ledgers whose metadata names any of ``bookies`` in any segment, open or closed.

    Example:
        >>> naming({}, ["b1"])
        set()
    """
    wanted = set(bookies)
    return {i for i, md in ledgers.items() if any(wanted & set(s.ensemble) for s in md.segments)}


def lost_ledgers(ledgers: LedgerMap, lost: Iterable[str]) -> dict[str, set[int]]:
    """``LEDGER_UNDER_REPLICATED`` / ``LEDGER_UNRECOVERABLE`` ids for the bookies ``lost``."""
    named = naming(ledgers, lost)
    alone = {i for i in named if ledgers[i].write_quorum == 1}
    return {"LEDGER_UNDER_REPLICATED": named - alone, "LEDGER_UNRECOVERABLE": alone}


def not_adhering(ledgers: LedgerMap, racks: Mapping[str, str]) -> set[int]:
    """Closed ledgers with a write set in a single rack, in any segment."""
    return {
        i
        for i, md in ledgers.items()
        if md.state.value == "CLOSED"
        and any(one_rack_write_set(tuple(s.ensemble), md.write_quorum, racks) for s in md.segments)
    }


def process_stopped(pid: int | None) -> bool:
    """Whether process ``pid`` is stopped by a signal (state ``T`` in ``/proc/<pid>/stat``)."""
    if pid is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] == "T"


class ClusterReader:
    """The real cluster's metadata, read with a ZooKeeper client chrooted at the cluster's prefix."""

    def __init__(
        self,
        hosts: str,
        ledgers_root: str = "/ledgers",
        rack_map_znode: str = "/bookies",
        tls: dict[str, Any] | None = None,
    ) -> None:
        self.root, self.rack_map_znode = ledgers_root, rack_map_znode
        self.client = KazooClient(
            hosts=hosts, timeout=10.0, **(tls or {})
        )  # tls: KazooClient's TLS arguments
        self.client.start(timeout=15.0)

    def close(self) -> None:
        self.client.stop()
        self.client.close()

    def _ledger_paths(self, path: str) -> Iterator[str]:
        try:
            children = self.client.get_children(path)
        except NoNodeError:
            return
        for child in children:
            full = f"{path}/{child}"
            if ledger_id_from_path(full, LedgerManagerType.HIERARCHICAL, self.root) is not None:
                yield full
            elif child.isdigit():  # a level of the hierarchical tree
                yield from self._ledger_paths(full)

    def ledgers(self) -> dict[int, LedgerMetadata]:
        """Every ledger znode under the root, decoded (the password stays inside the metadata object)."""
        found = {}
        for path in self._ledger_paths(self.root):
            ledger_id = ledger_id_from_path(path, LedgerManagerType.HIERARCHICAL, self.root)
            try:
                data, _ = self.client.get(path)
            except NoNodeError:
                continue
            if ledger_id is not None:
                found[ledger_id] = decode_ledger_metadata(data, ledger_id=ledger_id)
        return found

    def registered(self) -> set[str]:
        """Bookie ids registered now, writable or read-only."""
        writable = set(self.client.get_children(f"{self.root}/available")) - {"readonly"}
        readonly = set(self.client.get_children(f"{self.root}/available/readonly"))
        return writable | readonly

    def racks(self) -> dict[str, str]:
        """bookie id → rack, from the rack map znode (Pulsar's JSON, every group)."""
        data, _ = self.client.get(self.rack_map_znode)
        return {bookie: info["rack"] for group in json.loads(data).values() for bookie, info in group.items()}

    def write_racks(self, racks: Mapping[str, str]) -> None:
        """Rewrite the rack map znode with ``racks`` (group ``default``), as an operator's tool would."""
        group = {bookie: {"rack": rack, "hostname": bookie.split(":")[0]} for bookie, rack in racks.items()}
        self.client.set(self.rack_map_znode, json.dumps({"default": group}, separators=(",", ":")).encode())

    def recovery_delay(self) -> int:
        """``underreplication/lostBookieRecoveryDelay`` (0 when absent, BookKeeper's default)."""
        try:
            data, _ = self.client.get(f"{self.root}/underreplication/lostBookieRecoveryDelay")
        except NoNodeError:
            return 0
        return int(data)

    def set_recovery_delay(self, seconds: int) -> None:
        """Write ``underreplication/lostBookieRecoveryDelay`` as BookKeeper's shell does."""
        path, data = f"{self.root}/underreplication/lostBookieRecoveryDelay", str(seconds).encode()
        if self.client.exists(path):
            self.client.set(path, data)
        else:
            self.client.create(path, data, makepath=True)
