"""Bulk loader: writes up to millions of closed ledgers into a real ZooKeeper, fast and deterministically.

Used by the benchmarks (1,000,000 ledgers over 100 bookies in 10 racks) and by tests that
need a populated ledger tree; it writes ledger znodes and their tree directories only (plus, on request,
``<root>/LAYOUT``). Bookie registration, cookies and faults belong to the cluster simulator.

What gets written (BookKeeper's ledger paths and metadata formats):

- one znode per ledger at :func:`~core.domain.layout.ledger_path` for the chosen ledger manager, holding
  metadata format v3 as :func:`~core.domain.metadata.encode_ledger_metadata` writes it: CLOSED, E/WQ/AQ
  3/2/2 by default, CRC32C with a password, ``cToken`` 0, Pulsar's three custom-metadata entries
  (``application``, ``component``, ``pulsar/managed-ledger``); about 1 % empty ledgers, 30 % rolled over at
  50,000 entries, 10 % with a second segment (one bookie replaced by another of the same rack, as after
  an ensemble change);
- ensembles rack-aware: every write set (cyclic window of WQ bookies) spans at least
  ``min(WQ, min_racks_per_write_quorum)`` racks, the rule of BookKeeper's rack-aware policy (§4.2); racks
  and bookies are drawn uniformly, so each of B bookies ends up in about N·E/B ledgers;
- everything follows from :class:`BulkLoadSpec` (seed included): :func:`plan_ledgers` regenerates the same
  ledgers, and :func:`bookie_ledger_index` the same bookie → ledger ids index, without ZooKeeper.

How it writes (:func:`bulk_load`):

- tree directories first: every ``DD/DDDD`` directory the ids need (about 100 for 1 M dense ids in the
  2-4-4 layout) is created once, pipelined; directories that already existed are listed once so that their
  ledgers are skipped (an idempotent re-run writes nothing and fails no request);
- ledgers in ZooKeeper multi-ops (``client.transaction()`` / ``commit_async()``) of ``batch_size`` creates
  and at most ``max_batch_bytes`` (a real server refuses requests above ``jute.maxbuffer``, ~1 MB), with at
  most ``max_in_flight`` multi-ops outstanding so the server is never flooded;
- a failed multi-op is retried: NodeExists (someone else wrote one of its ledgers, or a commit whose answer
  was lost) → list the directory, drop what exists, send the rest; NoNode → recreate the directories;
  connection loss / timeout → wait for the session, send again; ``max_attempts`` per batch, then
  :class:`BulkLoadError`;
- a one-line progress bar on stderr when stderr is a terminal; a summary with the throughput at the end.

Example:
    >>> spec = BulkLoadSpec(bookies=synthetic_bookies(6, racks=3), count=4, seed=1)
    >>> [ledger.ledger_id for ledger in plan_ledgers(spec)]
    [1, 2, 3, 4]
    >>> md = planned_metadata(next(iter(plan_ledgers(spec))), spec)
    >>> md.state, (md.ensemble_size, md.write_quorum, md.ack_quorum), md.digest_type
    (<LedgerState.CLOSED: 'CLOSED'>, (3, 2, 2), <DigestType.CRC32C: 'CRC32C'>)
    >>> # summary = bulk_load(kazoo_client, spec, root="/ledgers", ensure_layout=True)
"""

from __future__ import annotations

import logging
import random
import sys
import time
from array import array
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple, TextIO

from kazoo.exceptions import (
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
)

from core.domain.layout import (
    DEFAULT_LEDGERS_ROOT,
    LedgerLayout,
    LedgerManagerType,
    format_layout,
    layout_path,
    ledger_path,
    parse_layout,
    validate_root,
)
from core.domain.metadata import (
    PULSAR_MANAGED_LEDGER_KEY,
    DigestType,
    LedgerMetadata,
    LedgerPassword,
    LedgerState,
    Segment,
    encode_ledger_metadata,
)
from core.domain.registration import validate_bookie_id
from core.errors import ConfigError, ServiceError

__all__ = [
    "BookiePlacement",
    "BulkLoadError",
    "BulkLoadSpec",
    "BulkLoadSummary",
    "PlannedLedger",
    "bookie_ledger_index",
    "bulk_load",
    "ensure_layout",
    "managed_ledger_name",
    "plan_ledgers",
    "planned_metadata",
    "synthetic_bookies",
]

logger = logging.getLogger(__name__)

# Ledgers whose ids share id // 10**4 share a tree directory in every hierarchical layout (the leaf holds
# the last 4 digits); the flat layout has one directory. Used only to find the directories up front, each
# ledger's parent is still checked against the directories known to exist.
_LEAF_SPAN = 10_000
# Pulsar's managed ledgers stamp these on every ledger (LedgerMetadataUtils.buildBaseManagedLedgerMetadata).
_APPLICATION = ("application", b"pulsar")
_COMPONENT = ("component", b"managed-ledger")
_NAMESPACES = ("public/default", "acme/orders", "acme/payments", "analytics/events")
_PROGRESS_INTERVAL = 0.25  # seconds between two redraws of the progress line


class BulkLoadError(ServiceError):
    """ZooKeeper refused or kept failing a write of the bulk loader (after its retries)."""


class BookiePlacement(NamedTuple):
    """A bookie id and its rack (network location, e.g. ``/rack-03``).

    Example:
        >>> BookiePlacement("10.0.0.1:3181", "/rack-00").rack
        '/rack-00'
    """

    bookie_id: str
    rack: str


def synthetic_bookies(count: int = 100, racks: int = 10, *, port: int = 3181) -> tuple[BookiePlacement, ...]:
    """``count`` legacy ``host:port`` bookie ids spread round-robin over ``racks`` racks ``/rack-NN``.

    Bookie ``i`` is in rack ``i % racks``; its address encodes the rack
    (``10.<rack>.<n // 250>.<n % 250 + 1>``) so rack maps keyed by host resolve too.

    Example:
        >>> [f"{b.bookie_id} {b.rack}" for b in synthetic_bookies(3, racks=2)]
        ['10.0.0.1:3181 /rack-00', '10.1.0.1:3181 /rack-01', '10.0.0.2:3181 /rack-00']
    """
    if count < 1 or racks < 1 or racks > 256:
        raise ConfigError(f"synthetic bookies: need count >= 1 and 1 <= racks <= 256, got {count}, {racks}")
    placements = []
    for index in range(count):
        rack, number = index % racks, index // racks
        host = f"10.{rack}.{number // 250}.{number % 250 + 1}"
        placements.append(BookiePlacement(f"{host}:{port}", f"/rack-{rack:02d}"))
    return tuple(placements)


class PlannedLedger(NamedTuple):
    """One ledger of a plan: everything that varies between the ledgers a spec produces.

    Example:
        >>> ledger = next(iter(plan_ledgers(BulkLoadSpec(bookies=synthetic_bookies(6, racks=3), count=1))))
        >>> len(ledger.segments[0].ensemble), ledger.managed_ledger.split("/")[2]
        (3, 'persistent')
    """

    ledger_id: int
    segments: tuple[Segment, ...]
    last_entry_id: int
    length: int
    managed_ledger: str

    @property
    def bookies(self) -> frozenset[str]:
        """Every bookie of every segment.

        Example:
            >>> two = (Segment(0, ("a:1", "b:1")), Segment(5, ("a:1", "c:1")))
            >>> sorted(PlannedLedger(1, two, 9, 90, "x").bookies)
            ['a:1', 'b:1', 'c:1']
        """
        return frozenset(bookie for segment in self.segments for bookie in segment.ensemble)


@dataclass(frozen=True)
class BulkLoadSpec:
    """What to load: the bookies, the ledger ids and the shape of the metadata. Deterministic in ``seed``.

    ``bookies`` also accepts a mapping bookie id → rack or any iterable of ``(bookie id, rack)`` pairs; it is
    stored as a tuple of :class:`BookiePlacement` sorted by rack then id, so input order does not matter.

    Ids: ``count`` ids from ``first_id``; dense (``mean_gap=1``: ``first_id .. first_id + count - 1``) or
    sparse (``mean_gap=k``: ascending, gaps drawn uniformly from ``1 .. 2k-1``), like ids handed out by
    BookKeeper's generators, which skip values (§1.4). The default ``1..count`` stays in the 2-4-4 range of
    the hierarchical manager.

    Example:
        >>> spec = BulkLoadSpec(bookies={"b1:3181": "/r1", "b2:3181": "/r2", "b3:3181": "/r3"}, count=3)
        >>> list(spec.ledger_ids()), spec.bookies[0]
        ([1, 2, 3], BookiePlacement(bookie_id='b1:3181', rack='/r1'))
        >>> list(BulkLoadSpec(bookies=spec.bookies, count=4, mean_gap=10, seed=3).ledger_ids())
        [1, 2, 12, 18]
    """

    bookies: tuple[BookiePlacement, ...]
    count: int
    first_id: int = 1
    mean_gap: int = 1
    seed: int = 0
    ensemble_size: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    #: BookKeeper's ``minNumRacksPerWriteQuorum`` (default 2): every write set spans min(WQ, this) racks.
    min_racks_per_write_quorum: int = 2
    digest_type: DigestType = DigestType.CRC32C
    password: bytes = b"bkaudit-bulk"
    #: Pulsar rolls a managed ledger over at 50,000 entries (``managedLedgerMaxEntriesPerLedger``).
    max_entries: int = 50_000
    empty_fraction: float = 0.01
    full_fraction: float = 0.30
    two_segment_fraction: float = 0.10
    entry_size: tuple[int, int] = (100, 4_000)
    #: Number of managed ledgers (topics) the ledgers belong to; default one per 25 ledgers.
    topics: int | None = None
    _racks: tuple[tuple[str, tuple[str, ...]], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        raw: Any = self.bookies
        pairs = raw.items() if isinstance(raw, Mapping) else raw
        placements = sorted(
            (BookiePlacement(*pair) for pair in pairs),
            key=lambda placement: (placement.rack, placement.bookie_id),
        )
        object.__setattr__(self, "bookies", tuple(placements))
        if not placements:
            raise ConfigError("bulk load: no bookies given")
        ids = [placement.bookie_id for placement in placements]
        if len(set(ids)) != len(ids):
            raise ConfigError("bulk load: a bookie id is listed twice")
        for bookie_id in ids:
            validate_bookie_id(bookie_id)
        racks: dict[str, list[str]] = {}
        for placement in placements:
            if not placement.rack:
                raise ConfigError(f"bulk load: bookie {placement.bookie_id} has an empty rack")
            racks.setdefault(placement.rack, []).append(placement.bookie_id)
        object.__setattr__(self, "_racks", tuple((rack, tuple(members)) for rack, members in racks.items()))
        if self.count < 0 or self.first_id < 0 or self.mean_gap < 1:
            raise ConfigError("bulk load: need count >= 0, first_id >= 0 and mean_gap >= 1")
        if not 1 <= self.ack_quorum <= self.write_quorum <= self.ensemble_size:
            raise ConfigError(
                f"bulk load: quorums must satisfy 1 <= ack ({self.ack_quorum}) <= write ({self.write_quorum})"
                f" <= ensemble ({self.ensemble_size})"
            )
        if self.max_entries < 2 or not 1 <= self.entry_size[0] <= self.entry_size[1]:
            raise ConfigError("bulk load: need max_entries >= 2 and 1 <= entry_size[0] <= entry_size[1]")
        if self.topics is not None and self.topics < 1:
            raise ConfigError("bulk load: topics must be >= 1")
        self._check_placement_feasible()

    def _check_placement_feasible(self) -> None:
        # The rack pattern of an ensemble is perm[i % racks]; it is the same for every permutation, so one
        # check here means every ensemble drawn later adheres.
        racks = len(self._racks)
        pattern = [i % racks for i in range(self.ensemble_size)]
        needed = min(self.write_quorum, self.min_racks_per_write_quorum)
        for start in range(self.ensemble_size):
            window = {pattern[(start + j) % self.ensemble_size] for j in range(self.write_quorum)}
            if len(window) < needed:
                raise ConfigError(
                    f"bulk load: {racks} rack(s) cannot give every write set of E={self.ensemble_size}, "
                    f"WQ={self.write_quorum} {needed} racks"
                )
        per_rack = -(-self.ensemble_size // racks)
        small = [rack for rack, members in self._racks if len(members) < per_rack]
        if small:
            raise ConfigError(f"bulk load: racks {small[:5]} have fewer than {per_rack} bookies")

    def ledger_ids(self) -> Sequence[int]:
        """The ledger ids, ascending (a ``range`` when dense, an ``array('q')`` when sparse).

        Example:
            >>> BulkLoadSpec(bookies=synthetic_bookies(3, racks=3), count=3, first_id=7).ledger_ids()
            range(7, 10)
        """
        if self.mean_gap == 1:
            return range(self.first_id, self.first_id + self.count)
        rng = random.Random(f"bkaudit-bulk-ids-{self.seed}")
        ids = array("q")
        high = 2 * self.mean_gap - 1
        next_id = self.first_id
        for _ in range(self.count):
            ids.append(next_id)
            next_id += rng.randint(1, high)
        return ids

    @property
    def topic_count(self) -> int:
        """Number of managed ledgers the ledgers are spread over.

        Example:
            >>> BulkLoadSpec(bookies=synthetic_bookies(3, racks=3), count=1000).topic_count
            40
        """
        return self.topics if self.topics is not None else max(1, self.count // 25)

    @property
    def rack_count(self) -> int:
        """Number of distinct racks among the bookies.

        Example:
            >>> BulkLoadSpec(bookies=synthetic_bookies(10, racks=5), count=1).rack_count
            5
        """
        return len(self._racks)

    def racks_by_bookie(self) -> dict[str, str]:
        """Bookie id → rack.

        Example:
            >>> spec = BulkLoadSpec(bookies=synthetic_bookies(3, racks=3), count=1)
            >>> spec.racks_by_bookie()["10.1.0.1:3181"]
            '/rack-01'
        """
        return {placement.bookie_id: placement.rack for placement in self.bookies}


def managed_ledger_name(topic: int) -> str:
    """The Pulsar managed-ledger name of topic number ``topic`` (``tenant/ns/persistent/<local>``).

    Example:
        >>> managed_ledger_name(17)
        'acme/orders/persistent/topic-00001-partition-1'
    """
    return (
        f"{_NAMESPACES[topic % len(_NAMESPACES)]}/persistent/topic-{topic // 16:05d}-partition-{topic % 16}"
    )


class _Placer:
    """Draws rack-aware ensembles: racks by the spec's feasible pattern, bookies uniformly within a rack."""

    def __init__(self, spec: BulkLoadSpec, rng: random.Random) -> None:
        self._rng = rng
        self._members = [members for _, members in spec._racks]
        self._rack_of = {
            bookie: index for index, (_, members) in enumerate(spec._racks) for bookie in members
        }
        self._racks = range(len(self._members))
        self._size = spec.ensemble_size
        self._distinct = len(self._members) >= spec.ensemble_size

    def ensemble(self) -> tuple[str, ...]:
        rng = self._rng
        if self._distinct:  # the usual case: one bookie from each of E different racks
            return tuple(rng.choice(self._members[rack]) for rack in rng.sample(self._racks, self._size))
        order = rng.sample(self._racks, len(self._members))
        slots: dict[int, list[int]] = {}
        for position in range(self._size):
            slots.setdefault(order[position % len(order)], []).append(position)
        chosen = [""] * self._size
        for rack, positions in slots.items():
            for position, bookie in zip(
                positions, rng.sample(self._members[rack], len(positions)), strict=True
            ):
                chosen[position] = bookie
        return tuple(chosen)

    def replace_one(self, ensemble: tuple[str, ...]) -> tuple[str, ...]:
        """The ensemble after an ensemble change: one bookie swapped for another of the same rack.

        Keeping the rack keeps every write set's racks, so the new segment adheres like the first one; when
        the rack has no spare bookie a fresh ensemble is drawn instead.
        """
        position = self._rng.randrange(len(ensemble))
        spares = [b for b in self._members[self._rack_of[ensemble[position]]] if b not in ensemble]
        if not spares:
            return self.ensemble()
        replaced = list(ensemble)
        replaced[position] = self._rng.choice(spares)
        return tuple(replaced)


def plan_ledgers(spec: BulkLoadSpec) -> Iterator[PlannedLedger]:
    """The ledgers ``spec`` describes, in id order; the same spec always yields the same ledgers.

    Example:
        >>> spec = BulkLoadSpec(bookies=synthetic_bookies(20, racks=5), count=3, seed=9)
        >>> [len(ledger.segments[0].ensemble) for ledger in plan_ledgers(spec)]
        [3, 3, 3]
        >>> list(plan_ledgers(spec)) == list(plan_ledgers(spec))
        True
    """
    rng = random.Random(f"bkaudit-bulk-plan-{spec.seed}")
    placer = _Placer(spec, rng)
    random_unit, randrange, randint = rng.random, rng.randrange, rng.randint
    empty, full = spec.empty_fraction, spec.empty_fraction + spec.full_fraction
    last_full, two_segments = spec.max_entries - 1, spec.two_segment_fraction
    size_low, size_high = spec.entry_size
    topics = spec.topic_count
    names: dict[int, str] = {}
    for ledger_id in spec.ledger_ids():
        draw = random_unit()
        if draw < empty:
            last_entry_id = -1  # closed without entries: a managed ledger rolled over while idle
        elif draw < full:
            last_entry_id = last_full
        else:
            last_entry_id = randrange(last_full)
        length = (last_entry_id + 1) * randint(size_low, size_high)
        ensemble = placer.ensemble()
        if last_entry_id >= 1 and random_unit() < two_segments:
            segments: tuple[Segment, ...] = (
                Segment(0, ensemble),
                Segment(randint(1, last_entry_id), placer.replace_one(ensemble)),
            )
        else:
            segments = (Segment(0, ensemble),)
        topic = randrange(topics)
        name = names.get(topic)
        if name is None:
            name = names[topic] = managed_ledger_name(topic)
        yield PlannedLedger(ledger_id, segments, last_entry_id, length, name)


def planned_metadata(ledger: PlannedLedger, spec: BulkLoadSpec) -> LedgerMetadata:
    """The v3 metadata the loader writes for ``ledger`` (CLOSED, the spec's quorums, digest and password).

    Example:
        >>> spec = BulkLoadSpec(bookies=synthetic_bookies(6, racks=3), count=1)
        >>> md = planned_metadata(next(iter(plan_ledgers(spec))), spec)
        >>> md.format_version, md.pulsar_topic.startswith("persistent://"), md.ctoken
        (3, True, 0)
    """
    return LedgerMetadata(
        ensemble_size=spec.ensemble_size,
        write_quorum=spec.write_quorum,
        ack_quorum=spec.ack_quorum,
        state=LedgerState.CLOSED,
        last_entry_id=ledger.last_entry_id,
        length=ledger.length,
        digest_type=spec.digest_type,
        password=LedgerPassword(spec.password),
        segments=ledger.segments,
        ctoken=0,  # v3 writers always store cToken; 0 unless a conditional update set it
        custom_metadata=(
            _APPLICATION,
            _COMPONENT,
            (PULSAR_MANAGED_LEDGER_KEY, ledger.managed_ledger.encode()),
        ),
        ledger_id=ledger.ledger_id,
    )


def bookie_ledger_index(spec: BulkLoadSpec) -> dict[str, array[int]]:
    """Bookie id → ascending ids of the ledgers naming it (any segment), recomputed from ``spec``.

    This is what :func:`bulk_load` writes for ``spec``, without reading ZooKeeper (about 10 s per million
    ledgers); bookies in no ledger map to an empty array.

    Example:
        >>> spec = BulkLoadSpec(bookies=synthetic_bookies(3, racks=3), count=5)
        >>> {bookie: list(ids) for bookie, ids in bookie_ledger_index(spec).items()}["10.0.0.1:3181"]
        [1, 2, 3, 4, 5]
    """
    index: dict[str, array[int]] = {placement.bookie_id: array("q") for placement in spec.bookies}
    for ledger in plan_ledgers(spec):
        segments = ledger.segments
        members = segments[0].ensemble if len(segments) == 1 else ledger.bookies
        for bookie in members:
            index[bookie].append(ledger.ledger_id)
    return index


# --------------------------------------------------------------------------------------------- writing


@dataclass(frozen=True)
class BulkLoadSummary:
    """What :func:`bulk_load` did; ``ledgers_per_second`` counts created ledgers over the whole run.

    ``skipped_existing`` counts ledgers found in ZooKeeper instead of written: left by an earlier run or
    another writer, or committed by a multi-op whose answer was lost with the connection (its retry then
    finds them).

    Example:
        >>> s = BulkLoadSummary(requested=10, created=8, skipped_existing=2, first_id=1, last_id=10,
        ...                     seconds=2.0, bytes_written=1600, directories_created=3, batches=1, retries=0)
        >>> s.ledgers_per_second, s.to_dict()["ledgers_per_second"]
        (4.0, 4.0)
    """

    requested: int
    created: int
    skipped_existing: int
    first_id: int | None
    last_id: int | None
    seconds: float
    bytes_written: int
    directories_created: int
    batches: int
    retries: int

    @property
    def ledgers_per_second(self) -> float:
        """Created ledgers per wall-clock second (0 for an empty run)."""
        return self.created / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict, throughput included."""
        return {**asdict(self), "ledgers_per_second": round(self.ledgers_per_second, 1)}


def ensure_layout(client: Any, root: str, manager: LedgerManagerType, *, create: bool = True) -> bool:
    """Check that ``<root>/LAYOUT`` names ``manager``; with ``create``, write it when absent.

    Returns True when it was created. A LAYOUT naming another manager raises :class:`ConfigError`: ledgers
    written at this manager's paths would be invisible to BookKeeper.

    Example:
        >>> # ensure_layout(kazoo_client, "/ledgers", LedgerManagerType.HIERARCHICAL)  -> True on a fresh tree
    """
    path = layout_path(root)
    if create:
        text = format_layout(LedgerLayout.for_manager(manager)).encode("utf-8")
        try:
            client.create(path, text, makepath=True)
            return True
        except NodeExistsError:
            pass
    try:
        data, _ = client.get(path)
    except NoNodeError:
        return False
    found = parse_layout(data).manager
    if found is not manager:
        raise ConfigError(f"{path} names the {found.value} ledger manager, not {manager.value}")
    return False


class _ProgressLine:
    """A single self-overwriting stderr line, drawn only when the stream is a terminal."""

    def __init__(self, total: int, stream: TextIO, enabled: bool | None) -> None:
        self._total = max(total, 1)
        self._stream = stream
        self._enabled = stream.isatty() if enabled is None else enabled
        self._started = time.monotonic()
        self._last_draw = 0.0

    def update(self, done: int, created: int, *, force: bool = False) -> None:
        if not self._enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < _PROGRESS_INTERVAL:
            return
        self._last_draw = now
        elapsed = max(now - self._started, 1e-9)
        fraction = min(done / self._total, 1.0)
        filled = int(fraction * 30)
        rate = created / elapsed
        eta = (self._total - done) / (done / elapsed) if done else 0.0
        self._stream.write(
            f"\rbulk load [{'#' * filled}{'.' * (30 - filled)}] {fraction * 100:5.1f}% "
            f"{done:,}/{self._total:,}  {rate:,.0f} ledgers/s  ETA {eta:4.0f}s "
        )
        self._stream.flush()

    def close(self, done: int, created: int) -> None:
        if self._enabled:
            self.update(done, created, force=True)
            self._stream.write("\n")
            self._stream.flush()


@dataclass
class _Batch:
    ops: list[tuple[str, bytes]]
    attempts: int = 0
    result: Any = None


_TRANSIENT = (ConnectionLoss, SessionExpiredError, OperationTimeoutError)


class _Loader:
    """One run of :func:`bulk_load`: directory bookkeeping, the window of multi-ops, retries, counters."""

    def __init__(
        self,
        client: Any,
        spec: BulkLoadSpec,
        root: str,
        manager: LedgerManagerType,
        *,
        batch_size: int,
        max_batch_bytes: int,
        max_in_flight: int,
        max_attempts: int,
        request_timeout: float,
        progress: _ProgressLine,
    ) -> None:
        self.client = client
        self.spec = spec
        self.root = root
        self.manager = manager
        self.batch_size = batch_size
        self.max_batch_bytes = max_batch_bytes
        self.max_in_flight = max_in_flight
        self.max_attempts = max_attempts
        self.request_timeout = request_timeout
        self.progress = progress
        self.known_dirs: set[str] = set()
        # Children of directories that existed before this run: their ledgers are skipped, not rewritten.
        self.existing: dict[str, set[str]] = {}
        self.window: deque[_Batch] = deque()
        self.to_retry: deque[_Batch] = deque()
        self.created = self.skipped = self.bytes_written = 0
        self.dirs_created = self.batches = self.retries = 0

    # -- directories ------------------------------------------------------------------------------------
    def _parent(self, ledger_id: int) -> str:
        return ledger_path(ledger_id, self.manager, self.root).rpartition("/")[0]

    def prepare_directories(self, ids: Sequence[int]) -> None:
        """Create every tree directory the ids need (pipelined) and list the ones that already existed."""
        self.client.ensure_path(self.root)
        leaves: set[str] = set()
        previous = -1
        for ledger_id in ids:
            span = ledger_id // _LEAF_SPAN
            if span != previous:  # one path per 10,000-id span (a sparse run may touch many spans)
                leaves.add(self._parent(ledger_id))
                previous = span
        if ids:
            leaves.add(self._parent(ids[-1]))  # the hybrid layout switches form inside one span
        dirs: set[str] = set()
        prefix = len(self.root)
        for leaf in leaves:
            parts = leaf[prefix + 1 :].split("/") if leaf != self.root else []
            for depth in range(1, len(parts) + 1):
                dirs.add(self.root + "/" + "/".join(parts[:depth]))
        preexisting = {self.root}  # the root may already hold ledgers (flat layout)
        ordered = sorted(dirs, key=lambda path: (path.count("/"), path))  # parents before children
        pending: deque[tuple[str, Any]] = deque()

        def settle() -> None:
            path, result = pending.popleft()
            try:
                result.get(timeout=self.request_timeout)
                self.dirs_created += 1
            except NodeExistsError:
                preexisting.add(path)
            except Exception as err:  # any failure: fall back to the synchronous path
                logger.debug("bulk load: creating %s failed (%r); retrying synchronously", path, err)
                self._ensure_dir_sync(path)

        for path in ordered:
            pending.append((path, self.client.create_async(path, b"")))
            if len(pending) >= self.max_in_flight * 32:
                settle()
        while pending:
            settle()
        self.known_dirs.update(dirs)
        self.known_dirs.add(self.root)
        for leaf in sorted(leaves & preexisting):
            self._list_existing(leaf)

    def _list_existing(self, path: str) -> set[str]:
        try:
            children = set(self.client.get_children(path))
        except NoNodeError:
            children = set()
        self.existing[path] = children
        if children:
            logger.info(
                "bulk load: %s already has %d children; existing ledgers are skipped", path, len(children)
            )
        return children

    def _ensure_dir_sync(self, path: str) -> None:
        """Fallback for a directory the up-front pass missed or that vanished; lists it if it existed."""
        if self.client.exists(path):
            self._list_existing(path)
        else:
            self.client.ensure_path(path)
            self.dirs_created += 1
        self.known_dirs.add(path)

    # -- multi-ops --------------------------------------------------------------------------------------
    def submit(self, batch: _Batch) -> None:
        """Send ``batch``, then wait for the oldest multi-ops until at most ``max_in_flight`` are out."""
        self._send(batch)
        self._pump(self.max_in_flight)

    def drain(self) -> None:
        """Wait for every outstanding multi-op, retries included."""
        self._pump(0)

    def _send(self, batch: _Batch) -> None:
        transaction = self.client.transaction()
        for path, data in batch.ops:
            transaction.create(path, data)
        batch.attempts += 1
        batch.result = transaction.commit_async()
        self.batches += 1
        self.window.append(batch)

    def _pump(self, limit: int) -> None:
        # Retries wait in a queue and go out as room frees up: no recursion, and never more than
        # max_in_flight multi-ops outstanding.
        while len(self.window) > limit or self.to_retry:
            if self.to_retry and len(self.window) < self.max_in_flight:
                self._send(self.to_retry.popleft())
            else:
                self.settle_oldest()

    def settle_oldest(self) -> None:
        batch = self.window.popleft()
        timeout_error = self.client.handler.timeout_exception
        try:
            results = batch.result.get(timeout=self.request_timeout)
        except (*_TRANSIENT, timeout_error) as err:
            self._retry(batch, f"{type(err).__name__}", reconnect=True)
            return
        failure = None
        for result in results:
            if isinstance(result, Exception) and not isinstance(
                result, RolledBackError | RuntimeInconsistency
            ):
                failure = result
                break
        if failure is None and not any(isinstance(result, Exception) for result in results):
            self.created += len(batch.ops)
            self.bytes_written += sum(len(data) for _, data in batch.ops)
            return
        if isinstance(failure, NodeExistsError):
            self._drop_existing(batch)
        elif isinstance(failure, NoNodeError):
            for parent in {path.rpartition("/")[0] for path, _ in batch.ops}:
                self._ensure_dir_sync(parent)
            self._retry(batch, "NoNode")
        else:
            raise BulkLoadError(
                f"bulk load: ZooKeeper refused a multi-op of {len(batch.ops)} creates "
                f"(first {batch.ops[0][0]}): {failure!r}"
            )

    def _drop_existing(self, batch: _Batch) -> None:
        # Rare: another writer got there first, or a commit whose answer was lost. List afresh and send the
        # rest; the listing also filters ledgers still to come in these directories.
        parents = {path.rpartition("/")[0] for path, _ in batch.ops}
        listings = {parent: self._list_existing(parent) for parent in parents}
        remaining = [
            op for op in batch.ops if op[0].rpartition("/")[2] not in listings[op[0].rpartition("/")[0]]
        ]
        dropped = len(batch.ops) - len(remaining)
        self.skipped += dropped
        logger.info("bulk load: %d of %d ledgers in a batch already existed", dropped, len(batch.ops))
        if remaining:
            batch.ops = remaining
            self._retry(batch, "NodeExists")

    def _retry(self, batch: _Batch, why: str, *, reconnect: bool = False) -> None:
        if batch.attempts >= self.max_attempts:
            raise BulkLoadError(
                f"bulk load: a multi-op of {len(batch.ops)} creates (first {batch.ops[0][0]}) still fails "
                f"after {batch.attempts} attempts ({why})"
            )
        self.retries += 1
        logger.warning(
            "bulk load: retrying a batch of %d (%s, attempt %d)", len(batch.ops), why, batch.attempts
        )
        if reconnect:
            # Wait for the session to be back (kazoo reconnects by itself); back off only when the same
            # batch fails again, so a burst of batches lost with one connection is resent at once.
            deadline = time.monotonic() + self.request_timeout
            while not self.client.connected and time.monotonic() < deadline:
                time.sleep(0.05)
            if batch.attempts > 1:
                time.sleep(min(0.1 * 2 ** (batch.attempts - 1), 5.0))
        self.to_retry.append(batch)

    # -- the run ----------------------------------------------------------------------------------------
    def run(self) -> None:
        spec = self.spec
        encode, build = encode_ledger_metadata, planned_metadata
        known, existing, manager, root = self.known_dirs, self.existing, self.manager, self.root
        ops: list[tuple[str, bytes]] = []
        ops_bytes = 0
        for ledger in plan_ledgers(spec):
            path = ledger_path(ledger.ledger_id, manager, root)
            parent, _, name = path.rpartition("/")
            if parent not in known:
                self._ensure_dir_sync(parent)
            if existing:
                children = existing.get(parent)
                if children is not None and name in children:
                    self.skipped += 1
                    continue
            data = encode(build(ledger, spec))
            # Each create costs the path and data plus ~40 bytes of framing and ACL in the request.
            size = len(path) + len(data) + 48
            if ops and (len(ops) >= self.batch_size or ops_bytes + size > self.max_batch_bytes):
                self.submit(_Batch(ops))
                ops, ops_bytes = [], 0
                self.progress.update(self.created + self.skipped, self.created)
            ops.append((path, data))
            ops_bytes += size
        if ops:
            self.submit(_Batch(ops))
        self.drain()


def bulk_load(
    client: Any,
    spec: BulkLoadSpec,
    *,
    root: str = DEFAULT_LEDGERS_ROOT,
    manager: LedgerManagerType = LedgerManagerType.HIERARCHICAL,
    batch_size: int = 250,
    max_batch_bytes: int = 512 * 1024,
    max_in_flight: int = 8,
    create_layout: bool = False,
    max_attempts: int = 5,
    request_timeout: float = 60.0,
    progress: bool | None = None,
    progress_stream: TextIO | None = None,
) -> BulkLoadSummary:
    """Write the closed ledgers of ``spec`` under ``root`` for ``manager``; idempotent (keeps existing ones).

    ``client`` is a started kazoo client (it may be chrooted). ``batch_size`` creates (at most
    ``max_batch_bytes``) go in one multi-op, at most ``max_in_flight`` multi-ops are outstanding. A LAYOUT
    naming another manager is an error; with ``create_layout`` a missing LAYOUT is written. ``progress``:
    None draws the progress line when ``progress_stream`` (stderr) is a terminal, True/False force it.

    Example:
        >>> # client = KazooClient("127.0.0.1:2181/test"); client.start()
        >>> # spec = BulkLoadSpec(bookies=synthetic_bookies(100, racks=10), count=1_000_000)
        >>> # summary = bulk_load(client, spec, create_layout=True)
        >>> # summary.created, round(summary.ledgers_per_second)
    """
    validate_root(root)
    if manager is LedgerManagerType.MS:
        raise ConfigError("bulk load: the ms ledger manager keeps ledger metadata outside ZooKeeper")
    if batch_size < 1 or max_in_flight < 1 or max_attempts < 1 or max_batch_bytes < 1024:
        raise ConfigError(
            "bulk load: batch_size, max_in_flight, max_attempts >= 1 and max_batch_bytes >= 1024"
        )
    ids = spec.ledger_ids()
    if ids:
        ledger_path(ids[0], manager, root)  # ids ascend: both ends in range means all are
        ledger_path(ids[-1], manager, root)
    started = time.monotonic()
    client.ensure_path(root)
    ensure_layout(client, root, manager, create=create_layout)
    logger.info(
        "bulk load: %d ledgers into %s (%s) over %d bookies in %d racks, batches of %d, %d in flight",
        len(ids),
        root,
        manager.value,
        len(spec.bookies),
        spec.rack_count,
        batch_size,
        max_in_flight,
    )
    line = _ProgressLine(len(ids), progress_stream or sys.stderr, progress)
    loader = _Loader(
        client,
        spec,
        root,
        manager,
        batch_size=batch_size,
        max_batch_bytes=max_batch_bytes,
        max_in_flight=max_in_flight,
        max_attempts=max_attempts,
        request_timeout=request_timeout,
        progress=line,
    )
    loader.prepare_directories(ids)
    loader.run()
    line.close(loader.created + loader.skipped, loader.created)
    summary = BulkLoadSummary(
        requested=len(ids),
        created=loader.created,
        skipped_existing=loader.skipped,
        first_id=ids[0] if ids else None,
        last_id=ids[-1] if ids else None,
        seconds=round(time.monotonic() - started, 3),
        bytes_written=loader.bytes_written,
        directories_created=loader.dirs_created,
        batches=loader.batches,
        retries=loader.retries,
    )
    logger.info(
        "bulk load: %d created, %d already there, %d bytes of metadata in %.1f s (%.0f ledgers/s)",
        summary.created,
        summary.skipped_existing,
        summary.bytes_written,
        summary.seconds,
        summary.ledgers_per_second,
    )
    return summary
