"""Ledger metadata znodes: BookKeeper's formats 1, 2 and 3, decoded into a typed model and encoded back.

A ledger znode starts with ``BookieMetadataFormatVersion\\t<n>\\n``; the body is line-oriented text (v1),
protobuf text format (v2) or a varint32-length-prefixed binary ``LedgerMetadataFormat`` (v3).
:func:`decode_ledger_metadata` turns the bytes into a :class:`LedgerMetadata` and
:func:`encode_ledger_metadata` writes it back exactly the way BookKeeper's writer does, so anything BookKeeper
wrote re-encodes byte for byte. Bad input of any kind raises :class:`~core.errors.FormatError` and nothing
else.

What the model holds:

- The values *BookKeeper's reader means*: ``ack_quorum`` falls back to ``write_quorum``; ``last_entry_id`` and
  ``length`` are ``-1`` and ``0`` unless the ledger is CLOSED (BookKeeper ignores the stored values then);
  ``digest_type`` is ``None`` unless a password is stored; v1's ``-102\\tCLOSED`` is IN_RECOVERY.
- Presence where it matters for the bytes: ``ctime`` and ``ctoken`` are ``None`` when absent (a stored ``-1``
  is kept), and :class:`WireLayout` records the rare ways a znode differs from what today's writer produces
  (fields older writers left out, values the reader ignores, v1's final newline). Its default means "as the
  writer writes it".
- The password only inside :class:`LedgerPassword`, whose repr never shows its bytes.

Validation (all of it raises :class:`FormatError`, on decode and on direct construction):

- ``1 <= ack_quorum <= write_quorum <= ensemble_size`` (BookKeeper's builder checks the ordering; zero or
  negative quorums would break striping);
- at least one segment, the first at entry 0, strictly ascending, each with exactly ``ensemble_size`` bookie
  ids valid under BookKeeper's ``BookieId`` rule;
- a CLOSED ledger's last entry ``>= -1`` and length ``>= 0``;
- enum numbers the schema does not define (a v3 ``state`` or ``digestType``; v2 text names): BookKeeper's own
  reader cannot open a ledger whose required ``state`` it does not know, and an unknown digest would have to
  be read as CRC32, which the writer did not mean; a known field number with a wire type it cannot have;
- custom-metadata entries without key or value, strings that are not UTF-8, v1 text that is not in the
  writer's canonical layout, unknown field names in v2 text (BookKeeper's text parser refuses them too);
- bytes after a complete record ("N trailing bytes after the metadata"): after v3's length-delimited message,
  or after the canonical v2 text. BookKeeper's reader ignores them, but no BookKeeper writer produces them,
  so a znode carrying them was not written by BookKeeper as it stands (a torn or hostile write) and must not
  pass as healthy.

Protobuf bodies that encode known fields non-canonically (other field order, padded varints, duplicates) are
accepted and re-encode canonically; no BookKeeper version writes them.

Field numbers the v3 schema does not define (at the top level, in a segment or in a custom-metadata entry) are
skipped, as BookKeeper's protobuf reader skips them: a newer writer may add fields, and its ledgers must stay
audited. They are named in :attr:`WireLayout.unknown_fields`, and :func:`encode_ledger_metadata` refuses such
a model, since it cannot write the znode back byte for byte.

Example:
    >>> blob = (b"BookieMetadataFormatVersion\\t1\\n2\\n3\\n0\\n"
    ...         b"0\\t10.0.0.1:3181\\t10.0.0.2:3181\\t10.0.0.3:3181\\n-102\\tCLOSED")
    >>> md = decode_ledger_metadata(blob)
    >>> md.state, md.write_quorum, md.ack_quorum, md.digest_type
    (<LedgerState.IN_RECOVERY: 'IN_RECOVERY'>, 2, 2, None)
    >>> encode_ledger_metadata(md) == blob
    True
"""

from __future__ import annotations

import base64
import binascii
import bisect
import heapq
import hmac
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple
from urllib.parse import unquote_to_bytes

from google.protobuf.message import DecodeError, EncodeError

from core.domain.striping import entries_striped_to_bookie, write_set
from core.domain.textformat import parse_message, print_message
from core.errors import FormatError
from core.pb.data_formats_pb2 import LedgerMetadataFormat as _Proto

__all__ = [
    "MAX_METADATA_BYTES",
    "DigestType",
    "LedgerMetadata",
    "LedgerPassword",
    "LedgerState",
    "Segment",
    "SegmentRange",
    "WireLayout",
    "decode_ledger_metadata",
    "encode_ledger_metadata",
    "is_valid_bookie_id",
    "metadata_from_json",
    "metadata_to_json",
    "pulsar_topic_from_managed_ledger",
]

HEADER_KEY = b"BookieMetadataFormatVersion\t"
_HEADER_BY_VERSION = {v: HEADER_KEY + str(v).encode() + b"\n" for v in (1, 2, 3)}
_V3_HEADER = _HEADER_BY_VERSION[3]
_HEADER_LEN = len(_V3_HEADER)
_MAX_VERSION_DIGITS = 10  # BookKeeper's readHeader gives up after 10 bytes without a newline

#: Larger inputs are refused outright. ZooKeeper's default jute.maxbuffer is just under 1 MiB, so a real
#: ledger znode is far smaller; the cap keeps a hostile blob from costing minutes of text-format parsing.
MAX_METADATA_BYTES = 16 * 1024 * 1024

_INT32_MAX = 2**31 - 1
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

_V1_CLOSED_TAG = "CLOSED"
_V1_IN_RECOVERY_ENTRY_ID = -102
_V1_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")

# BookieId.validateBookieId: "[a-zA-Z0-9:-_.\\-]+" (note ':-_' is the range 0x3A-0x5F) and not "readonly".
_BOOKIE_ID = re.compile(r"[a-zA-Z0-9:-_.\-]+")
# Ensembles already checked, each mapped to itself: a cluster reuses few distinct ensembles, so this saves the
# per-member checks on decode and lets decoded ledgers share one tuple per ensemble (less memory in state).
_valid_ensembles: dict[tuple[str, ...], tuple[str, ...]] = {}
_VALID_ENSEMBLE_CACHE_LIMIT = 100_000

PULSAR_MANAGED_LEDGER_KEY = "pulsar/managed-ledger"


class LedgerState(StrEnum):
    """State of a ledger as BookKeeper's reader sees it.

    Example:
        >>> LedgerState("CLOSED") is LedgerState.CLOSED
        True
    """

    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


class DigestType(StrEnum):
    """Entry digest of a ledger, by its protobuf name (BookKeeper's API calls HMAC ``MAC``).

    Example:
        >>> DigestType("CRC32C").value
        'CRC32C'
    """

    CRC32 = "CRC32"
    HMAC = "HMAC"
    CRC32C = "CRC32C"
    DUMMY = "DUMMY"


_STATE_BY_NUMBER = {1: LedgerState.OPEN, 2: LedgerState.IN_RECOVERY, 3: LedgerState.CLOSED}
_NUMBER_BY_STATE = {state: number for number, state in _STATE_BY_NUMBER.items()}
_DIGEST_BY_NUMBER = {1: DigestType.CRC32, 2: DigestType.HMAC, 3: DigestType.CRC32C, 4: DigestType.DUMMY}
_NUMBER_BY_DIGEST = {digest: number for number, digest in _DIGEST_BY_NUMBER.items()}
# proto2 default of an absent enum field is its first value; BookKeeper's reader uses it for digestType.
_DEFAULT_PROTO_DIGEST = DigestType.CRC32


class LedgerPassword:
    """A ledger's password; its bytes never show in ``repr``/``str``, only through :meth:`reveal`.

    Example:
        >>> pw = LedgerPassword(b"s3cret")
        >>> pw, str(pw), pw.nbytes
        (LedgerPassword(<6 bytes>), 'LedgerPassword(<6 bytes>)', 6)
        >>> pw.reveal()
        b's3cret'
    """

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, bytes):
            raise FormatError(f"ledger password must be bytes, not {type(secret).__name__}")
        self._secret = secret

    @property
    def nbytes(self) -> int:
        """Length of the password in bytes (an empty stored password is still a password).

        Example:
            >>> LedgerPassword(b"").nbytes
            0
        """
        return len(self._secret)

    def reveal(self) -> bytes:
        """The password bytes. Call only where the secret is really needed (encoding, --include-password).

        Example:
            >>> LedgerPassword(b"x").reveal()
            b'x'
        """
        return self._secret

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LedgerPassword):
            return NotImplemented
        return hmac.compare_digest(self._secret, other._secret)

    def __hash__(self) -> int:
        return hash(self._secret)

    def __repr__(self) -> str:
        return f"LedgerPassword(<{len(self._secret)} bytes>)"

    __str__ = __repr__

    def __getstate__(self) -> bytes:
        return self._secret

    def __setstate__(self, state: bytes) -> None:
        self._secret = state


def _new_password(secret: bytes) -> LedgerPassword:
    # Decode's constructor: the bytes come from protobuf, so the type check of __init__ is not needed.
    password: LedgerPassword = object.__new__(LedgerPassword)
    password._secret = secret
    return password


class Segment(NamedTuple):
    """One ensemble: the bookies (by ensemble index) that store entries from ``first_entry_id`` on.

    Example:
        >>> Segment(0, ("b1:3181", "b2:3181")).ensemble[1]
        'b2:3181'
    """

    first_entry_id: int
    ensemble: tuple[str, ...]


class SegmentRange(NamedTuple):
    """A segment with the entry range it covers.

    ``last_entry_id`` is ``None`` for the open-ended last segment of a ledger that is not closed. A range
    with ``last_entry_id < first_entry_id`` is empty (a closed ledger's last segment that starts after the
    last entry).

    Example:
        >>> r = SegmentRange(10, 9, ("b1:3181",))
        >>> r.is_empty, r.entry_count
        (True, 0)
        >>> SegmentRange(0, None, ("b1:3181",)).entry_count is None
        True
    """

    first_entry_id: int
    last_entry_id: int | None
    ensemble: tuple[str, ...]

    @property
    def is_open_ended(self) -> bool:
        """True for the last segment of a ledger that is not closed.

        Example:
            >>> SegmentRange(0, None, ("b1:3181",)).is_open_ended
            True
        """
        return self.last_entry_id is None

    @property
    def is_empty(self) -> bool:
        """True when the range holds no entry at all (an open-ended range is never empty).

        Example:
            >>> SegmentRange(0, 0, ("b1:3181",)).is_empty
            False
        """
        return self.last_entry_id is not None and self.last_entry_id < self.first_entry_id

    @property
    def entry_count(self) -> int | None:
        """Number of entries in the range, ``None`` when open-ended.

        Example:
            >>> SegmentRange(5, 9, ("b1:3181",)).entry_count
            5
        """
        if self.last_entry_id is None:
            return None
        return max(0, self.last_entry_id - self.first_entry_id + 1)


@dataclass(frozen=True, slots=True)
class WireLayout:
    """How a znode differs from what today's BookKeeper writer produces; the default means "no difference".

    Only needed to re-encode byte for byte what older writers (or hand edits) left behind:

    - ``has_last_entry_id`` / ``has_ack_quorum``: the optional field was present (the writer always sets them;
      BookKeeper 4.2 did not write ``ackQuorumSize``).
    - ``has_digest_type``: ``digestType`` was present next to a password (absent means CRC32 to the reader).
    - ``ignored_last_entry_id`` / ``ignored_length``: stored values of a non-closed ledger that the reader
      ignores (the writer stores ``-1`` and ``0``); ``None`` when they were the usual values.
    - ``ignored_digest_type``: a ``digestType`` stored without a password (the reader ignores it).
    - ``v1_final_newline``: a v1 OPEN ledger ends with a newline (today's writer) or not (BookKeeper 4.0).
    - ``unknown_fields``: v3 protobuf fields this schema does not define, skipped on decode (a newer writer's
      additions), e.g. ``("field 100", "field 3 in segment 0")``; at most five are named, then ``"N more"``
      counts the other unknown fields.
      Encoding refuses a model that has any: their bytes are not kept.

    Example:
        >>> WireLayout() == WireLayout(has_ack_quorum=True)
        True
        >>> WireLayout(has_ack_quorum=False).is_writer_layout
        False
    """

    has_last_entry_id: bool = True
    has_ack_quorum: bool = True
    has_digest_type: bool = True
    ignored_last_entry_id: int | None = None
    ignored_length: int | None = None
    ignored_digest_type: DigestType | None = None
    v1_final_newline: bool = True
    unknown_fields: tuple[str, ...] = ()

    @property
    def is_writer_layout(self) -> bool:
        """True when nothing differs from the writer's layout.

        Example:
            >>> WireLayout().is_writer_layout
            True
        """
        return self == _WRITER_LAYOUT


_WRITER_LAYOUT = WireLayout()


@dataclass(frozen=True, slots=True, init=False)
class LedgerMetadata:
    """Decoded ledger metadata (values as BookKeeper's reader means them; see the module docstring).

    Construct it directly (keyword arguments) or with :func:`decode_ledger_metadata`; either way the
    constructor validates and raises :class:`FormatError` for anything inconsistent. ``ledger_id`` and
    ``znode_ctime`` come from outside the znode data and are never encoded.

    Example:
        >>> md = LedgerMetadata(ensemble_size=2, write_quorum=2, ack_quorum=1,
        ...                     segments=(Segment(0, ("b1:3181", "b2:3181")),),
        ...                     digest_type=DigestType.CRC32C, password=LedgerPassword(b"pw"), ctoken=0)
        >>> md.state, md.last_entry_id, md.has_password
        (<LedgerState.OPEN: 'OPEN'>, -1, True)
        >>> "pw'" in repr(md)
        False
        >>> LedgerMetadata(ensemble_size=2, write_quorum=3, ack_quorum=1,
        ...                segments=(Segment(0, ("b1:3181", "b2:3181")),))
        Traceback (most recent call last):
        ...
        core.errors.FormatError: ledger metadata: quorums must satisfy ack (1) <= write (3) <= ensemble (2)
    """

    format_version: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    state: LedgerState
    last_entry_id: int
    length: int
    digest_type: DigestType | None
    password: LedgerPassword | None
    segments: tuple[Segment, ...]
    ctime: int | None
    ctoken: int | None
    custom_metadata: tuple[tuple[str, bytes], ...]
    wire: WireLayout
    ledger_id: int | None
    znode_ctime: int | None

    def __init__(
        self,
        *,
        format_version: int = 3,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        state: LedgerState = LedgerState.OPEN,
        last_entry_id: int = -1,
        length: int = 0,
        digest_type: DigestType | None = None,
        password: LedgerPassword | None = None,
        segments: tuple[Segment, ...],
        ctime: int | None = None,
        ctoken: int | None = None,
        custom_metadata: tuple[tuple[str, bytes], ...] = (),
        wire: WireLayout = _WRITER_LAYOUT,
        ledger_id: int | None = None,
        znode_ctime: int | None = None,
    ) -> None:
        # Hand-written (the dataclass one is twice as slow with 16 frozen fields): decode runs this per znode.
        _fill(
            self,
            format_version,
            ensemble_size,
            write_quorum,
            ack_quorum,
            state,
            last_entry_id,
            length,
            digest_type,
            password,
            segments,
            ctime,
            ctoken,
            custom_metadata,
            wire,
            ledger_id,
            znode_ctime,
        )

    # ----------------------------------------------------------------------------------------------- basics

    @property
    def is_closed(self) -> bool:
        """True when the ledger is CLOSED (its last entry and length are final).

        Example:
            >>> _doc_example().is_closed
            True
        """
        return self.state is LedgerState.CLOSED

    @property
    def has_password(self) -> bool:
        """True when the znode stores a password (and with it a digest type).

        Example:
            >>> _doc_example().has_password
            True
        """
        return self.password is not None

    @property
    def creation_time(self) -> int | None:
        """Creation time in ms: the stored ``ctime``, else the znode's ctime (BookKeeper's fallback).

        Example:
            >>> from dataclasses import replace
            >>> replace(_doc_example(), znode_ctime=1700000000000).creation_time
            1700000000000
        """
        return self.ctime if self.ctime is not None else self.znode_ctime

    def custom_value(self, key: str) -> bytes | None:
        """Value of a custom-metadata key; with duplicates the last one wins (BookKeeper reads into a map).

        Example:
            >>> _doc_example().custom_value("application")
            b'pulsar'
        """
        found: bytes | None = None
        for entry_key, value in self.custom_metadata:
            if entry_key == key:
                found = value
        return found

    @property
    def pulsar_topic(self) -> str | None:
        """The Pulsar topic owning this ledger, from custom metadata ``pulsar/managed-ledger``; else ``None``.

        Example:
            >>> _doc_example().pulsar_topic
            'persistent://public/default/my-topic'
        """
        value = self.custom_value(PULSAR_MANAGED_LEDGER_KEY)
        if value is None:
            return None
        try:
            name = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
        return pulsar_topic_from_managed_ledger(name)

    # ------------------------------------------------------------------------------------- derived striping

    @property
    def all_bookies(self) -> frozenset[str]:
        """Every bookie named in any segment, open or closed, empty or not.

        Example:
            >>> sorted(_doc_example().all_bookies)
            ['b1:3181', 'b2:3181', 'b3:3181', 'b4:3181']
        """
        return frozenset(bookie for segment in self.segments for bookie in segment.ensemble)

    def segment_ranges(self) -> tuple[SegmentRange, ...]:
        """Each segment with the entries it covers, in order.

        Segment *k* covers ``[first_k, first_{k+1} - 1]``; for a CLOSED ledger every range is also clipped to
        ``last_entry_id`` (entries past it do not exist), which makes a trailing segment that starts after the
        last entry empty. The last segment of a ledger that is not closed is open-ended.

        Example:
            >>> [(r.first_entry_id, r.last_entry_id) for r in _doc_example().segment_ranges()]
            [(0, 4), (5, 9)]
        """
        segments = self.segments
        closed = self.is_closed
        ranges: list[SegmentRange] = []
        for index, segment in enumerate(segments):
            last: int | None
            if index + 1 < len(segments):
                last = segments[index + 1].first_entry_id - 1
                if closed:
                    last = min(last, self.last_entry_id)
            else:
                last = self.last_entry_id if closed else None
            ranges.append(SegmentRange(segment.first_entry_id, last, segment.ensemble))
        return tuple(ranges)

    def segment_for_entry(self, entry_id: int) -> SegmentRange | None:
        """The segment that holds ``entry_id``, or ``None`` when the ledger has no such entry.

        Example:
            >>> _doc_example().segment_for_entry(7).first_entry_id
            5
            >>> _doc_example().segment_for_entry(10) is None
            True
        """
        if entry_id < 0 or (self.is_closed and entry_id > self.last_entry_id):
            return None
        firsts = [segment.first_entry_id for segment in self.segments]
        index = bisect.bisect_right(firsts, entry_id) - 1
        if index < 0:
            return None
        return self.segment_ranges()[index]

    def write_set_for_entry(self, entry_id: int) -> tuple[str, ...]:
        """Bookies that must store ``entry_id``, in BookKeeper's write-set order; empty if no such entry.

        Uses the absolute entry id (RoundRobinDistributionSchedule), not the offset in the segment.

        Example:
            >>> _doc_example().write_set_for_entry(5)
            ('b4:3181', 'b1:3181')
            >>> _doc_example().write_set_for_entry(4)
            ('b2:3181', 'b3:3181')
        """
        segment = self.segment_for_entry(entry_id)
        if segment is None:
            return ()
        indexes = write_set(entry_id, self.ensemble_size, self.write_quorum)
        return tuple(segment.ensemble[index] for index in indexes)

    def entries_on_bookie(self, bookie_id: str, *, up_to: int | None = None) -> Iterator[int]:
        """Entry ids ``bookie_id`` must store, ascending, lazily (never builds the whole list).

        ``up_to`` bounds the walk (inclusive). A ledger that is not closed has an open-ended last segment, so
        without ``up_to`` that segment cannot be walked: then this raises ``ValueError`` when it gets there.

        Example:
            >>> list(_doc_example().entries_on_bookie("b4:3181"))
            [5, 7, 8]
            >>> list(_doc_example().entries_on_bookie("b1:3181", up_to=6))
            [0, 2, 3, 5, 6]
        """
        for segment in self.segment_ranges():
            last = segment.last_entry_id
            if up_to is not None:
                last = up_to if last is None else min(last, up_to)
            if last is None:
                raise ValueError("the last segment of a ledger that is not closed is open-ended: pass up_to")
            if last < segment.first_entry_id:
                continue
            indexes = [i for i, member in enumerate(segment.ensemble) if member == bookie_id]
            walks = [
                entries_striped_to_bookie(
                    i, segment.first_entry_id, last, self.ensemble_size, self.write_quorum
                )
                for i in indexes
            ]
            previous = -1
            # A bookie listed twice in one ensemble (never written by BookKeeper, but readable) holds the
            # union of both positions' entries; merge and drop duplicates.
            for entry_id in heapq.merge(*walks) if len(walks) > 1 else (walks[0] if walks else ()):
                if entry_id != previous:
                    yield entry_id
                    previous = entry_id

    # ------------------------------------------------------------------------------------ recoverability

    def unrecoverable_entries(self, lost: Iterable[str], *, limit: int = 100) -> tuple[int, ...]:
        """Up to ``limit`` entry ids, ascending, whose whole write set is among the ``lost`` bookies.

        Work is per segment and per distinct write set (at most ``ensemble_size`` of them), never per entry.
        For the open-ended last segment of a ledger that is not closed the ids are *potential*: the segment
        may already hold them or receive them later, and none of their bookies survives.

        Example:
            >>> _doc_example().unrecoverable_entries({"b1:3181", "b2:3181"})
            (0, 3, 6, 9)
            >>> _doc_example().unrecoverable_entries({"b1:3181", "b2:3181"}, limit=2)
            (0, 3)
            >>> _doc_example().unrecoverable_entries({"b4:3181"})
            ()
        """
        if limit <= 0:
            return ()
        lost_set = _lost_set(lost)
        found: list[int] = []
        for segment in self.segment_ranges():
            if segment.is_empty:
                continue
            starts = _fully_lost_write_set_starts(segment.ensemble, lost_set, self.write_quorum)
            if not starts:
                continue
            size = self.ensemble_size
            base = segment.first_entry_id - segment.first_entry_id % size
            while len(found) < limit:
                for start in starts:
                    entry_id = base + start
                    if segment.last_entry_id is not None and entry_id > segment.last_entry_id:
                        break
                    if entry_id >= segment.first_entry_id:
                        found.append(entry_id)
                        if len(found) >= limit:
                            break
                else:
                    base += size
                    continue
                break
            if len(found) >= limit:
                break
        return tuple(found)

    def is_recoverable(self, lost: Iterable[str]) -> bool:
        """False when losing the ``lost`` bookies loses data (or, for a ledger not closed, may lose it).

        A closed or bounded segment is unrecoverable when some entry in it has its whole write set lost (for
        WQ=1 that is any entry on a lost bookie). A ledger that is not closed is judged conservatively: its
        open-ended last segment counts as holding every write set, and it is also unrecoverable when some
        write set of that segment lost ``ack_quorum`` or more bookies, because BookKeeper's recovery then can
        never establish the last entry (the coverage rule) and the ledger cannot be closed.

        Example:
            >>> _doc_example().is_recoverable({"b1:3181"})
            True
            >>> _doc_example().is_recoverable({"b1:3181", "b2:3181"})
            False
        """
        lost_set = _lost_set(lost)
        for segment in self.segment_ranges():
            if segment.is_empty:
                continue
            ensemble = segment.ensemble
            if segment.is_open_ended:
                worst = _max_lost_in_write_set(ensemble, lost_set, self.write_quorum)
                if worst >= self.ack_quorum:
                    return False
                continue
            starts = _fully_lost_write_set_starts(ensemble, lost_set, self.write_quorum)
            if not starts:
                continue
            count = segment.entry_count or 0
            if count >= self.ensemble_size:
                return False  # every write set occurs in the range
            size = self.ensemble_size
            for entry_id in range(segment.first_entry_id, segment.first_entry_id + count):
                if entry_id % size in starts:
                    return False
        return True

    def fewest_copies_left(self, lost: Iterable[str]) -> int | None:
        """The fewest copies any entry keeps when the ``lost`` bookies are gone (None: no entry at all).

        An entry's copies are the members of its write set that are not lost. A closed or bounded segment
        counts only the entries it holds; the open-ended last segment of a ledger that is not closed counts
        every write set (its next entries may land on any of them), as :meth:`is_recoverable` does. Below
        ``ack_quorum`` the ledger keeps fewer copies of some entry than its writer was promised.

        Example:
            >>> _doc_example().fewest_copies_left({"b1:3181"})
            1
            >>> _doc_example().fewest_copies_left({"b3:3181"})  # entries 0-4 lose one copy; 5-9 keep both
            1
            >>> _doc_example().fewest_copies_left(set())
            2
        """
        lost_set = _lost_set(lost)
        fewest: int | None = None
        for segment in self.segment_ranges():
            if segment.is_empty:
                continue
            counts = _write_set_loss_counts(segment.ensemble, lost_set, self.write_quorum)
            count = segment.entry_count
            if count is not None and count < self.ensemble_size:
                size = self.ensemble_size
                held = {
                    entry_id % size
                    for entry_id in range(segment.first_entry_id, segment.first_entry_id + count)
                }
                counts = [lost_count for start, lost_count in enumerate(counts) if start in held]
            left = self.write_quorum - max(counts)
            fewest = left if fewest is None else min(fewest, left)
        return fewest


# The slots' own setters (bypassing the frozen __setattr__), called unrolled: about twice as fast as the
# generated frozen __init__, which matters because decode builds one model per znode.
(
    _set_format_version,
    _set_ensemble_size,
    _set_write_quorum,
    _set_ack_quorum,
    _set_state,
    _set_last_entry_id,
    _set_length,
    _set_digest_type,
    _set_password,
    _set_segments,
    _set_ctime,
    _set_ctoken,
    _set_custom_metadata,
    _set_wire,
    _set_ledger_id,
    _set_znode_ctime,
) = (LedgerMetadata.__dict__[field].__set__ for field in LedgerMetadata.__dataclass_fields__)
assert len(LedgerMetadata.__dataclass_fields__) == 16, "update the setters above with the fields"


def _fill(
    md: LedgerMetadata,
    format_version: int,
    ensemble_size: int,
    write_quorum: int,
    ack_quorum: int,
    state: LedgerState,
    last_entry_id: int,
    length: int,
    digest_type: DigestType | None,
    password: LedgerPassword | None,
    segments: tuple[Segment, ...],
    ctime: int | None,
    ctoken: int | None,
    custom_metadata: tuple[tuple[str, bytes], ...],
    wire: WireLayout,
    ledger_id: int | None,
    znode_ctime: int | None,
) -> None:
    """Set every field of a new ``md`` (positionally, in declaration order) and validate it."""
    _set_format_version(md, format_version)
    _set_ensemble_size(md, ensemble_size)
    _set_write_quorum(md, write_quorum)
    _set_ack_quorum(md, ack_quorum)
    _set_state(md, state)
    _set_last_entry_id(md, last_entry_id)
    _set_length(md, length)
    _set_digest_type(md, digest_type)
    _set_password(md, password)
    _set_segments(md, segments)
    _set_ctime(md, ctime)
    _set_ctoken(md, ctoken)
    _set_custom_metadata(md, custom_metadata)
    _set_wire(md, wire)
    _set_ledger_id(md, ledger_id)
    _set_znode_ctime(md, znode_ctime)
    _validate(md)


def _lost_set(lost: Iterable[str]) -> frozenset[str]:
    # A bare string is iterable too; treating "b1:3181" as its characters would silently answer "recoverable".
    if isinstance(lost, str):
        raise TypeError("lost must be a collection of bookie ids, not a single string")
    return lost if isinstance(lost, frozenset) else frozenset(lost)


def _write_set_loss_counts(ensemble: tuple[str, ...], lost: frozenset[str], write_quorum: int) -> list[int]:
    """For each write-set start index s, how many of the bookies at ``s..s+WQ-1`` (mod E) are lost."""
    flags = [1 if member in lost else 0 for member in ensemble]
    size = len(flags)
    window = sum(flags[:write_quorum])
    counts = [window]
    # Sliding window around the ring: O(E), whatever the write quorum.
    for start in range(1, size):
        window += flags[(start + write_quorum - 1) % size] - flags[start - 1]
        counts.append(window)
    return counts


def _fully_lost_write_set_starts(
    ensemble: tuple[str, ...], lost: frozenset[str], write_quorum: int
) -> tuple[int, ...]:
    if lost.isdisjoint(ensemble):
        return ()
    counts = _write_set_loss_counts(ensemble, lost, write_quorum)
    return tuple(start for start, count in enumerate(counts) if count == write_quorum)


def _max_lost_in_write_set(ensemble: tuple[str, ...], lost: frozenset[str], write_quorum: int) -> int:
    if lost.isdisjoint(ensemble):
        return 0
    return max(_write_set_loss_counts(ensemble, lost, write_quorum))


def _doc_example() -> LedgerMetadata:
    """A closed Pulsar ledger used by the doctests: E=3, WQ=2, AQ=2, an ensemble change at entry 5."""
    return LedgerMetadata(
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        state=LedgerState.CLOSED,
        last_entry_id=9,
        length=1000,
        digest_type=DigestType.CRC32C,
        password=LedgerPassword(b""),
        segments=(
            Segment(0, ("b1:3181", "b2:3181", "b3:3181")),
            Segment(5, ("b1:3181", "b2:3181", "b4:3181")),
        ),
        ctoken=0,
        custom_metadata=(
            ("application", b"pulsar"),
            ("component", b"managed-ledger"),
            ("pulsar/managed-ledger", b"public/default/persistent/my-topic"),
        ),
    )


# ------------------------------------------------------------------------------------------------ validation


def _is_int(value: object) -> bool:
    return type(value) is int  # bool is an int subclass; JSON `true` must not pass as 1


def _check_int(value: object, what: str, low: int, high: int) -> None:
    if type(value) is not int:
        raise FormatError(f"ledger metadata: {what} must be an integer, not {type(value).__name__}")
    if not low <= value <= high:
        raise FormatError(f"ledger metadata: {what} {value} is out of range [{low}, {high}]")


def _check_optional_int64(value: object, what: str) -> None:
    if value is not None and (type(value) is not int or not _INT64_MIN <= value <= _INT64_MAX):
        _check_int(value, what, _INT64_MIN, _INT64_MAX)


def is_valid_bookie_id(member: str) -> bool:
    """Whether BookKeeper accepts ``member`` as a bookie id in an ensemble (``BookieId.validateBookieId``).

    Example:
        >>> is_valid_bookie_id("bk-1.example:3181"), is_valid_bookie_id("ReadOnly"), is_valid_bookie_id("a b")
        (True, False, False)
    """
    return _BOOKIE_ID.fullmatch(member) is not None and member.lower() != "readonly"


def _check_ensemble(ensemble: tuple[Any, ...]) -> None:
    for member in ensemble:
        if type(member) is not str:
            raise FormatError("ledger metadata: a bookie id is not valid UTF-8 text")
        if not is_valid_bookie_id(member):
            raise FormatError(f"ledger metadata: invalid bookie id {member[:80]!r}")
    if len(_valid_ensembles) >= _VALID_ENSEMBLE_CACHE_LIMIT:
        _valid_ensembles.clear()
    _valid_ensembles[ensemble] = ensemble


def _validate(md: LedgerMetadata) -> None:
    """Every rule of the module docstring; raises FormatError naming the first broken one.

    Runs on every decode, so the common case is a handful of cheap comparisons; the helpers it calls on a
    failure work out the precise message.
    """
    version = md.format_version
    if type(version) is not int or version not in (1, 2, 3):
        raise FormatError(f"ledger metadata: format version must be 1, 2 or 3, not {version!r}")
    ensemble_size, write_quorum, ack_quorum = md.ensemble_size, md.write_quorum, md.ack_quorum
    if (
        type(ensemble_size) is not int
        or type(write_quorum) is not int
        or type(ack_quorum) is not int
        or not 1 <= ack_quorum <= write_quorum <= ensemble_size <= _INT32_MAX
    ):
        _check_int(ensemble_size, "ensemble size", 1, _INT32_MAX)
        _check_int(write_quorum, "write quorum", 1, _INT32_MAX)
        _check_int(ack_quorum, "ack quorum", 1, _INT32_MAX)
        raise FormatError(
            f"ledger metadata: quorums must satisfy ack ({ack_quorum}) <= write ({write_quorum})"
            f" <= ensemble ({ensemble_size})"
        )
    state, last_entry_id, length = md.state, md.last_entry_id, md.length
    if type(last_entry_id) is not int or type(length) is not int:
        _check_int(last_entry_id, "last entry id", _INT64_MIN, _INT64_MAX)
        _check_int(length, "length", _INT64_MIN, _INT64_MAX)
    if state is LedgerState.CLOSED:
        if not -1 <= last_entry_id <= _INT64_MAX:
            _check_int(last_entry_id, "closed ledger's last entry id", -1, _INT64_MAX)
        if not 0 <= length <= _INT64_MAX:
            _check_int(length, "closed ledger's length", 0, _INT64_MAX)
    elif state is LedgerState.OPEN or state is LedgerState.IN_RECOVERY:
        if last_entry_id != -1 or length != 0:
            raise FormatError(
                "ledger metadata: a ledger that is not closed has last entry id -1 and length 0 "
                "(other stored values belong in wire.ignored_last_entry_id / ignored_length)"
            )
    else:
        raise FormatError(f"ledger metadata: state must be a LedgerState, not {type(state).__name__}")

    password, digest_type = md.password, md.digest_type
    if password is None:
        if digest_type is not None:
            raise FormatError("ledger metadata: a digest type without a password is ignored by BookKeeper")
    elif type(password) is not LedgerPassword:
        raise FormatError("ledger metadata: password must be a LedgerPassword")
    elif type(digest_type) is not DigestType:
        raise FormatError("ledger metadata: a ledger with a password needs a digest type")

    ctime, ctoken, ledger_id, znode_ctime = md.ctime, md.ctoken, md.ledger_id, md.znode_ctime
    if ctime is not None and (type(ctime) is not int or not _INT64_MIN <= ctime <= _INT64_MAX):
        _check_int(ctime, "ctime", _INT64_MIN, _INT64_MAX)
    if ctoken is not None and (type(ctoken) is not int or not _INT64_MIN <= ctoken <= _INT64_MAX):
        _check_int(ctoken, "ctoken", _INT64_MIN, _INT64_MAX)
    if ledger_id is not None:
        _check_int(ledger_id, "ledger id", 0, _INT64_MAX)
    if znode_ctime is not None:
        _check_int(znode_ctime, "znode ctime", _INT64_MIN, _INT64_MAX)

    _validate_segments(md.segments, ensemble_size)
    if md.custom_metadata:
        _validate_custom_metadata(md.custom_metadata)
    elif type(md.custom_metadata) is not tuple:
        raise FormatError("ledger metadata: custom_metadata must be a tuple of (key, value) pairs")
    if md.wire is not _WRITER_LAYOUT:
        _validate_wire(md)
    if version == 1:
        _validate_v1(md)


def _validate_wire(md: LedgerMetadata) -> None:
    wire = md.wire
    if type(wire) is not WireLayout:
        raise FormatError("ledger metadata: wire must be a WireLayout")
    for flag in (wire.has_last_entry_id, wire.has_ack_quorum, wire.has_digest_type, wire.v1_final_newline):
        if type(flag) is not bool:
            raise FormatError("ledger metadata: WireLayout flags must be booleans")
    if md.state is LedgerState.CLOSED:
        if wire.ignored_last_entry_id is not None or wire.ignored_length is not None:
            raise FormatError("ledger metadata: a closed ledger has no ignored last entry id or length")
        if not wire.has_last_entry_id and md.last_entry_id != 0:
            raise FormatError("ledger metadata: a closed ledger without stored lastEntryId reads as entry 0")
    else:
        _check_optional_int64(wire.ignored_last_entry_id, "ignored last entry id")
        _check_optional_int64(wire.ignored_length, "ignored length")
        if wire.ignored_last_entry_id == -1 or wire.ignored_length == 0:
            raise FormatError("ledger metadata: ignored values equal to the writer's (-1, 0) must be None")
        if not wire.has_last_entry_id and wire.ignored_last_entry_id is not None:
            raise FormatError("ledger metadata: an absent lastEntryId cannot have an ignored value")
    if md.password is None:
        if not wire.has_digest_type:
            raise FormatError("ledger metadata: wire.has_digest_type only applies with a password")
        if wire.ignored_digest_type is not None and type(wire.ignored_digest_type) is not DigestType:
            raise FormatError("ledger metadata: wire.ignored_digest_type must be a DigestType")
    else:
        if wire.ignored_digest_type is not None:
            raise FormatError("ledger metadata: wire.ignored_digest_type only applies without a password")
        if not wire.has_digest_type and md.digest_type is not _DEFAULT_PROTO_DIGEST:
            raise FormatError("ledger metadata: an absent digestType reads as CRC32")
    if not wire.has_ack_quorum and md.ack_quorum != md.write_quorum:
        raise FormatError("ledger metadata: an absent ackQuorumSize reads as the write quorum")
    if md.format_version != 1 and not wire.v1_final_newline:
        raise FormatError("ledger metadata: wire.v1_final_newline only applies to format version 1")
    if wire.unknown_fields:
        _validate_unknown_fields(wire.unknown_fields, md.format_version)
    elif type(wire.unknown_fields) is not tuple:
        raise FormatError("ledger metadata: wire.unknown_fields must be a tuple of strings")


def _validate_unknown_fields(unknown: object, version: int) -> None:
    """Unknown fields are named by non-empty strings, and only v3's binary protobuf can carry them."""
    if type(unknown) is not tuple or not all(type(name) is str and name for name in unknown):
        raise FormatError("ledger metadata: wire.unknown_fields must be a tuple of strings")
    if version != 3:
        raise FormatError("ledger metadata: wire.unknown_fields only applies to format version 3")


def _validate_segments(segments: object, ensemble_size: int) -> None:
    if type(segments) is not tuple:
        raise FormatError("ledger metadata: segments must be a tuple of Segment")
    if not segments:
        raise FormatError("ledger metadata: no segments (BookKeeper requires at least one ensemble)")
    previous = -1
    known_ensembles = _valid_ensembles
    for index, segment in enumerate(segments):
        if type(segment) is not Segment:
            raise FormatError("ledger metadata: segments must be a tuple of Segment")
        first, ensemble = segment
        if type(first) is not int or not previous < first <= _INT64_MAX or (index == 0 and first != 0):
            _check_int(first, f"segment {index} first entry id", 0, _INT64_MAX)
            if index == 0:
                raise FormatError(f"ledger metadata: the first segment starts at entry {first}, not 0")
            raise FormatError(
                f"ledger metadata: segment {index} starts at entry {first}, "
                f"not after the previous one ({previous})"
            )
        previous = first
        if type(ensemble) is not tuple or len(ensemble) != ensemble_size:
            if type(ensemble) is not tuple:
                raise FormatError(f"ledger metadata: segment {index} ensemble must be a tuple of bookie ids")
            raise FormatError(
                f"ledger metadata: segment {index} lists {len(ensemble)} bookies, "
                f"ensemble size is {ensemble_size}"
            )
        try:
            known = ensemble in known_ensembles
        except TypeError:  # an unhashable member; _check_ensemble names the problem
            known = False
        if not known:
            _check_ensemble(ensemble)


def _validate_custom_metadata(custom: object) -> None:
    if type(custom) is not tuple:
        raise FormatError("ledger metadata: custom_metadata must be a tuple of (key, value) pairs")
    for entry in custom:
        if type(entry) is not tuple or len(entry) != 2:
            raise FormatError("ledger metadata: custom_metadata must be a tuple of (key, value) pairs")
        key, value = entry
        if type(key) is not str:
            raise FormatError("ledger metadata: a custom metadata key is not valid UTF-8 text")
        if type(value) is not bytes:
            raise FormatError("ledger metadata: custom metadata values must be bytes")
        if not key.isascii():
            try:
                key.encode("utf-8")
            except UnicodeEncodeError:
                raise FormatError(
                    "ledger metadata: a custom metadata key is not encodable as UTF-8"
                ) from None


def _validate_v1(md: LedgerMetadata) -> None:
    wire = md.wire
    if md.password is not None or md.ctime is not None or md.ctoken is not None or md.custom_metadata:
        raise FormatError(
            "ledger metadata: format version 1 stores no password, ctime, ctoken or custom metadata"
        )
    if wire.ignored_digest_type is not None or not wire.has_ack_quorum or not wire.has_last_entry_id:
        raise FormatError("ledger metadata: format version 1 has no protobuf fields to leave out")
    if md.ack_quorum != md.write_quorum:
        raise FormatError(
            "ledger metadata: format version 1 stores no ack quorum (it equals the write quorum)"
        )
    if wire.ignored_last_entry_id is not None:
        raise FormatError("ledger metadata: format version 1 stores no last entry id unless closed")
    if not wire.v1_final_newline and md.state is not LedgerState.OPEN:
        raise FormatError("ledger metadata: only an OPEN v1 ledger can lack the final newline")
    for segment in md.segments:
        # The reader takes any line whose second field is CLOSED as the closing line.
        if segment.ensemble[0] == _V1_CLOSED_TAG:
            raise FormatError("ledger metadata: format version 1 cannot store a first bookie named CLOSED")


# ------------------------------------------------------------------------------------------------ decoding


def decode_ledger_metadata(
    data: bytes, *, znode_ctime: int | None = None, ledger_id: int | None = None
) -> LedgerMetadata:
    """Decode the bytes of a ledger metadata znode (format 1, 2 or 3).

    ``znode_ctime`` (the znode's ``stat.ctime``) stands in for the creation time when none is stored;
    ``ledger_id`` is carried along for callers. Raises :class:`FormatError`, and only that, for bad input.

    Example:
        >>> md = decode_ledger_metadata(encode_ledger_metadata(_doc_example()), znode_ctime=42)
        >>> md.format_version, md.ensemble_size, md.creation_time
        (3, 3, 42)
        >>> decode_ledger_metadata(b"BookieMetadataFormatVersion\\tfoobar\\nblahblah")
        Traceback (most recent call last):
        ...
        core.errors.FormatError: ledger metadata: format version is not a number: 'foobar'
    """
    if type(data) is not bytes:
        if isinstance(data, bytes | bytearray | memoryview):
            data = bytes(data)
        else:
            raise FormatError(f"ledger metadata: expected bytes, got {type(data).__name__}")
    if data.startswith(_V3_HEADER):  # the common case first
        version, body_start = 3, _HEADER_LEN
    else:
        version, body_start = _read_header(data)
    if len(data) > MAX_METADATA_BYTES:
        raise FormatError(
            f"ledger metadata: {len(data)} bytes is more than the {MAX_METADATA_BYTES} accepted"
        )
    try:
        if version == 3:
            return _decode_v3(data, body_start, znode_ctime, ledger_id)
        if version == 2:
            message = _parse_v2_text(data[body_start:])
            return _reject_v2_trailing_bytes(_from_proto(message, 2, znode_ctime, ledger_id), data)
        return _decode_v1(data[body_start:], znode_ctime, ledger_id)
    except FormatError:
        raise
    except RecursionError:
        raise FormatError(f"ledger metadata v{version}: input nested too deeply") from None
    except MemoryError:
        raise FormatError(f"ledger metadata v{version}: input too large to decode") from None
    except Exception as err:  # a parser surprise must still surface as bad input, never as a crash
        raise FormatError(f"ledger metadata v{version}: cannot decode ({type(err).__name__})") from None


def _read_header(data: bytes) -> tuple[int, int]:
    """Format version and the offset of the body, the way BookKeeper's readHeader reads them."""
    if not data:
        raise FormatError("ledger metadata: empty input")
    key_length = len(HEADER_KEY)
    if data[:key_length] != HEADER_KEY:
        index = next(
            (i for i in range(min(len(data), key_length)) if data[i] != HEADER_KEY[i]),
            min(len(data), key_length),
        )
        raise FormatError(
            f"ledger metadata: header corrupt at byte {index} (expected 'BookieMetadataFormatVersion\\t')"
        )
    newline = data.find(b"\n", key_length, key_length + _MAX_VERSION_DIGITS + 1)
    if newline < 0:
        raise FormatError(
            f"ledger metadata: no end of the format version within {_MAX_VERSION_DIGITS} digits "
            "(metadata corrupt)"
        )
    raw_version = data[key_length:newline]
    text = raw_version.decode("ascii", errors="replace")
    if re.fullmatch(r"[+-]?[0-9]+", text) is None:
        raise FormatError(f"ledger metadata: format version is not a number: {text!r}")
    version = int(text)
    if version not in (1, 2, 3):
        raise FormatError(f"ledger metadata: format version {version} is not supported (expected 1 to 3)")
    if text != str(version):
        raise FormatError(
            f"ledger metadata: format version written as {text!r}; BookKeeper writes '{version}'"
        )
    return version, newline + 1


def _decode_v3(data: bytes, start: int, znode_ctime: int | None, ledger_id: int | None) -> LedgerMetadata:
    # varint32 length prefix, as BookKeeper's readRawVarint32 reads it (at most 5 bytes).
    end = len(data)
    if start >= end:
        raise FormatError("ledger metadata v3: missing length prefix")
    byte = data[start]
    position = start + 1
    if byte < 0x80:
        size = byte
    else:
        size = byte & 0x7F
        shift = 7
        while True:
            if position >= end:
                raise FormatError("ledger metadata v3: truncated length prefix")
            byte = data[position]
            position += 1
            size |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
            if shift >= 35:
                raise FormatError(
                    "ledger metadata v3: malformed length prefix (varint32 longer than 5 bytes)"
                )
        if size > _INT32_MAX:
            raise FormatError(f"ledger metadata v3: length prefix {size} is out of range")
    if size > end - position:
        raise FormatError(
            f"ledger metadata v3: length prefix says {size} bytes but only {end - position} follow"
        )
    if size < end - position:  # BookKeeper's reader ignores them; its writer never leaves any
        raise FormatError(f"ledger metadata v3: {end - position - size} trailing bytes after the metadata")
    body = data[position:end]
    message = _Proto()
    try:
        message.ParseFromString(body)
    except DecodeError:
        raise FormatError("ledger metadata v3: body is not a valid LedgerMetadataFormat message") from None
    # Cheap test first: without unknown fields, the canonical size of the known fields is the body size.
    # (Only a negative int32 or enum has an encoding shorter than the canonical one, and validation refuses
    # negative sizes and quorums, so an accepted body with unknown fields never passes this test.) ByteSize
    # also refuses a message with a required field missing, which saves a separate IsInitialized walk.
    message.DiscardUnknownFields()
    try:
        canonical_size = message.ByteSize()
    except EncodeError:
        # An unknown state number also lands here (it is kept as an unknown field, so state is "missing"):
        # _unknown_fields names it.
        _unknown_fields(body)
        missing = ", ".join(_initialization_errors(message))
        raise FormatError(f"ledger metadata v3: missing required field(s): {missing}") from None
    unknown = _unknown_fields(body) if canonical_size != size else ()
    return _from_proto(message, 3, znode_ctime, ledger_id, unknown)


def _reject_v2_trailing_bytes(md: LedgerMetadata, data: bytes) -> LedgerMetadata:
    """``md`` unless ``data`` is its canonical text followed by more bytes (whitespace, comments, junk).

    Text format has no framing: the parser skips trailing whitespace and comments. The record ends where the
    writer's text ends, so anything past a canonical encoding is trailing. (Non-canonical bodies are accepted
    and re-encode canonically, as the module says; they carry no complete record to compare a tail with.)
    """
    canonical = encode_ledger_metadata(md)
    if len(data) > len(canonical) and data.startswith(canonical):
        raise FormatError(
            f"ledger metadata v2: {len(data) - len(canonical)} trailing bytes after the metadata"
        )
    return md


def _initialization_errors(message: Any) -> list[str]:
    # Not in the protobuf type stubs, but every backend has it.
    return list(message.FindInitializationErrors())


_VARINT_WIRE_TYPE = 0
_MAX_UNKNOWN_NAMED = 5


def _unknown_fields(body: bytes) -> tuple[str, ...]:
    """The field numbers of a v3 body that the schema does not define, named for :class:`WireLayout`.

    Such fields are skipped, as BookKeeper's protobuf reader skips them: a newer writer may add some. Two
    other things also land among protobuf's unknown fields and are not additions, so they raise FormatError:
    an enum number the schema does not define (BookKeeper cannot read an unknown ``state``, a required field;
    an unknown ``digestType`` would read as CRC32, which its writer did not mean) and a known field number
    with a wire type that field cannot have.
    """
    probe = _Proto()
    probe.ParseFromString(body)  # parsed fine once already
    found = _UnknownNames()
    _scan_unknown_fields(probe, "", found)
    for index, segment in enumerate(probe.segment):
        _scan_unknown_fields(segment, f" in segment {index}", found)
    for index, entry in enumerate(probe.customMetadata):
        _scan_unknown_fields(entry, f" in customMetadata {index}", found)
    return found.as_tuple()


class _UnknownNames:
    """The first few distinct unknown-field names of a body, then a count of the others (bounded memory).

    Example:
        >>> names = _UnknownNames()
        >>> for name in ["field 13", "field 13", *(f"field {n}" for n in range(100, 106))]:
        ...     names.add(name)
        >>> names.as_tuple()
        ('field 13', 'field 100', 'field 101', 'field 102', 'field 103', '2 more')
    """

    __slots__ = ("more", "names")

    def __init__(self) -> None:
        self.names: dict[str, None] = {}
        self.more = 0

    def add(self, name: str) -> None:
        """Record one unknown field by its name."""
        if name in self.names:
            return
        if len(self.names) < _MAX_UNKNOWN_NAMED:
            self.names[name] = None
        else:
            self.more += 1

    def as_tuple(self) -> tuple[str, ...]:
        """The names for :attr:`WireLayout.unknown_fields`."""
        return (*self.names, f"{self.more} more") if self.more else tuple(self.names)


def _scan_unknown_fields(message: Any, where: str, found: _UnknownNames) -> None:
    """Add ``field N<where>`` for each unknown field of ``message`` (not its children); raise for the rest."""
    from google.protobuf.unknown_fields import UnknownFieldSet

    known = message.DESCRIPTOR.fields_by_number
    unknown: Any = UnknownFieldSet(message)  # iterable at runtime; the stubs only declare __getitem__
    for item in unknown:
        number, wire_type = item.field_number, item.wire_type
        field = known.get(number)
        if field is None:
            found.add(f"field {number}{where}")
        elif field.enum_type is not None and wire_type == _VARINT_WIRE_TYPE:
            raise FormatError(f"ledger metadata v3: unknown {field.name} value {item.data}{where}")
        else:
            raise FormatError(
                f"ledger metadata v3: field {number} ({field.name}){where} has wire type {wire_type}, "
                "which that field cannot have"
            )


_TEXT_POSITION = re.compile(r"invalid text format: (\d+):(\d+)")
# Text-format parse errors quote the offending line; a damaged password line would be echoed. Report the
# position and a category only.
_TEXT_ERROR_KINDS = (
    ("has no field named", "unknown field"),
    ("should not have multiple", "field repeated"),
    ("has no value", "unknown enum value"),
    ("Enum type", "unknown enum value"),
    ("missing ending quote", "unterminated string"),
    ("Couldn't parse", "bad value"),
    ("Invalid escape", "bad escape sequence"),
    ("Expected", "syntax error"),
)


def _parse_v2_text(body: bytes) -> _Proto:
    try:
        return parse_message(body, _Proto, what="ledger metadata v2")
    except FormatError as err:
        message = str(err)
        position = _TEXT_POSITION.search(message)
        if position is None:
            if "invalid text format" in message:
                raise FormatError("ledger metadata v2: invalid text format") from None
            raise  # UTF-8 or missing-required-field messages quote no input
        kind = next((label for marker, label in _TEXT_ERROR_KINDS if marker in message), "syntax error")
        raise FormatError(
            f"ledger metadata v2: invalid text format at line {position[1]} column {position[2]}: {kind}"
        ) from None


def _from_proto(
    message: _Proto,
    version: int,
    znode_ctime: int | None,
    ledger_id: int | None,
    unknown_fields: tuple[str, ...] = (),
) -> LedgerMetadata:
    # This runs once per ledger znode, so it reads each field once, slices repeated fields (much faster than
    # iterating them with the upb backend) and skips presence checks that the common case makes needless.
    state = _STATE_BY_NUMBER.get(message.state)
    if state is None:
        raise FormatError(f"ledger metadata v{version}: unknown state {message.state}")
    has = message.HasField
    # An optional field holding something other than its default is present; only a default value needs
    # HasField to tell "absent" from "stored as the default".
    stored_last = message.lastEntryId
    has_last = stored_last != 0 or has("lastEntryId")
    write_quorum, stored_ack = message.quorumSize, message.ackQuorumSize
    has_ack = stored_ack != 0 or has("ackQuorumSize")
    digest_number = message.digestType
    has_digest = digest_number != 1 or has("digestType")
    stored_password = message.password
    stored_length = message.length
    ignored_last = ignored_length = None
    if state is LedgerState.CLOSED:
        last_entry_id, length = stored_last, stored_length
    else:
        # BookKeeper's reader takes lastEntryId/length only from CLOSED ledgers.
        last_entry_id, length = -1, 0
        if has_last and stored_last != -1:
            ignored_last = stored_last
        if stored_length != 0:
            ignored_length = stored_length
    password: LedgerPassword | None = None
    digest_type: DigestType | None = None
    ignored_digest: DigestType | None = None
    has_digest_field = True
    if stored_password or has("password"):
        password = _new_password(stored_password)
        digest_type = _DIGEST_BY_NUMBER[digest_number]  # unknown numbers were rejected by _unknown_fields
        has_digest_field = has_digest
    elif has_digest:
        ignored_digest = _DIGEST_BY_NUMBER[digest_number]
    ctime = message.ctime
    ctoken = message.cToken

    new_tuple, shared = tuple.__new__, _valid_ensembles.get
    segments = tuple(
        [
            new_tuple(Segment, (s.firstEntryId, shared(e := tuple(s.ensembleMember[:]), e)))
            for s in message.segment[:]
        ]
    )
    custom: tuple[tuple[str, bytes], ...] = ()
    if message.customMetadata:
        custom = tuple([(entry.key, entry.value) for entry in message.customMetadata[:]])
        # An absent key or value reads as empty; only then is presence worth asking about.
        if not all(map(all, custom)):
            for index, entry in enumerate(message.customMetadata):
                if not (entry.HasField("key") and entry.HasField("value")):
                    raise FormatError(
                        f"ledger metadata v{version}: custom metadata entry {index} lacks a key or value"
                    )

    if (
        has_last
        and has_ack
        and has_digest_field
        and ignored_last is None
        and ignored_length is None
        and not unknown_fields
    ):
        wire = _WRITER_LAYOUT if ignored_digest is None else WireLayout(ignored_digest_type=ignored_digest)
    else:
        wire = WireLayout(
            has_last_entry_id=has_last,
            has_ack_quorum=has_ack,
            has_digest_type=has_digest_field,
            ignored_last_entry_id=ignored_last,
            ignored_length=ignored_length,
            ignored_digest_type=ignored_digest,
            unknown_fields=unknown_fields,
        )
    md: LedgerMetadata = object.__new__(LedgerMetadata)
    _fill(
        md,
        version,
        message.ensembleSize,
        write_quorum,
        stored_ack if has_ack else write_quorum,
        state,
        last_entry_id,
        length,
        digest_type,
        password,
        segments,
        ctime if ctime != 0 or has("ctime") else None,
        ctoken if ctoken != 0 or has("cToken") else None,
        custom,
        wire,
        ledger_id,
        znode_ctime,
    )
    return md


def _v1_number(text: str, what: str, low: int, high: int) -> int:
    if _V1_INT.fullmatch(text) is None:
        raise FormatError(f"ledger metadata v1: {what} is not a canonical decimal number: {text[:40]!r}")
    value = int(text)
    if not low <= value <= high:
        raise FormatError(f"ledger metadata v1: {what} {value} is out of range")
    return value


def _decode_v1(body: bytes, znode_ctime: int | None, ledger_id: int | None) -> LedgerMetadata:
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError as err:
        raise FormatError(f"ledger metadata v1: non-ASCII byte at offset {err.start} of the body") from None
    lines = text.split("\n")
    if len(lines) < 4:
        raise FormatError(
            "ledger metadata v1: expected write quorum, ensemble size, length and at least one segment line"
        )
    write_quorum = _v1_number(lines[0], "write quorum", _INT64_MIN, _INT64_MAX)
    ensemble_size = _v1_number(lines[1], "ensemble size", _INT64_MIN, _INT64_MAX)
    stored_length = _v1_number(lines[2], "length", _INT64_MIN, _INT64_MAX)
    body_lines = lines[3:]
    state = LedgerState.OPEN
    last_entry_id = -1
    final_newline = True
    if body_lines[-1] == "":
        body_lines.pop()  # today's writer ends an OPEN ledger's text with a newline
    else:
        closing = body_lines[-1].split("\t")
        if len(closing) >= 2 and closing[1] == _V1_CLOSED_TAG:
            body_lines.pop()
            if len(closing) != 2:
                raise FormatError("ledger metadata v1: the CLOSED line has extra fields")
            closed_at = _v1_number(closing[0], "last entry id", _INT64_MIN, _INT64_MAX)
            if closed_at == _V1_IN_RECOVERY_ENTRY_ID:
                state = LedgerState.IN_RECOVERY
            else:
                state, last_entry_id = LedgerState.CLOSED, closed_at
        else:
            final_newline = False  # BookKeeper 4.0 wrote no newline after the last line
    segments = []
    for line_number, line in enumerate(body_lines, start=4):
        parts = line.split("\t")
        if len(parts) >= 2 and parts[1] == _V1_CLOSED_TAG:
            raise FormatError(f"ledger metadata v1: line {line_number}: CLOSED line is not the last line")
        first = _v1_number(parts[0], f"line {line_number} first entry id", _INT64_MIN, _INT64_MAX)
        segments.append(Segment(first, tuple(parts[1:])))
    closed = state is LedgerState.CLOSED
    return LedgerMetadata(
        format_version=1,
        ensemble_size=ensemble_size,
        write_quorum=write_quorum,
        ack_quorum=write_quorum,
        state=state,
        last_entry_id=last_entry_id,
        length=stored_length if closed else 0,
        segments=tuple(segments),
        wire=WireLayout(
            ignored_length=None if closed or stored_length == 0 else stored_length,
            v1_final_newline=final_newline,
        ),
        ledger_id=ledger_id,
        znode_ctime=znode_ctime,
    )


# ------------------------------------------------------------------------------------------------ encoding


def encode_ledger_metadata(md: LedgerMetadata) -> bytes:
    """The znode bytes BookKeeper's writer produces for ``md``, in ``md.format_version``.

    v2 and v3 set quorumSize, ackQuorumSize, ensembleSize, length, lastEntryId, state, digestType and password
    (empty when none), ctime and cToken only when present, custom metadata in the model's order; ``md.wire``
    reproduces the rare znodes older writers laid out differently. A model decoded from a znode with unknown
    protobuf fields (``md.wire.unknown_fields``) is refused: writing it would drop them.

    Example:
        >>> encode_ledger_metadata(_doc_example())[:30]
        b'BookieMetadataFormatVersion\\t3\\n'
    """
    if not isinstance(md, LedgerMetadata):
        raise FormatError(f"ledger metadata: cannot encode a {type(md).__name__}")
    if md.wire.unknown_fields:
        raise FormatError(
            "ledger metadata: cannot re-encode byte for byte: the znode had protobuf fields this schema does "
            f"not define ({', '.join(md.wire.unknown_fields)}), and writing it would drop them"
        )
    if md.format_version == 1:
        return _HEADER_BY_VERSION[1] + _encode_v1_text(md).encode("ascii")
    message = _to_proto(md)
    try:
        if md.format_version == 2:
            return _HEADER_BY_VERSION[2] + print_message(message).encode("utf-8")
        body = message.SerializeToString()
    except (
        EncodeError,
        ValueError,
        UnicodeError,
    ) as err:  # validation should have caught it; keep the contract
        raise FormatError(f"ledger metadata: cannot encode ({type(err).__name__})") from None
    return _V3_HEADER + _varint(len(body)) + body


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _to_proto(md: LedgerMetadata) -> _Proto:
    wire = md.wire
    message = _Proto(
        quorumSize=md.write_quorum,
        ensembleSize=md.ensemble_size,
        length=md.length if wire.ignored_length is None else wire.ignored_length,
        state=_NUMBER_BY_STATE[md.state],  # type: ignore[arg-type]
    )
    if wire.has_last_entry_id:
        message.lastEntryId = (
            md.last_entry_id if wire.ignored_last_entry_id is None else wire.ignored_last_entry_id
        )
    segment_field = message.segment
    for segment in md.segments:
        segment_field.add(ensembleMember=segment.ensemble, firstEntryId=segment.first_entry_id)
    if md.password is not None:
        if wire.has_digest_type:
            assert md.digest_type is not None
            message.digestType = _NUMBER_BY_DIGEST[md.digest_type]  # type: ignore[assignment]
        message.password = md.password.reveal()
    elif wire.ignored_digest_type is not None:
        message.digestType = _NUMBER_BY_DIGEST[wire.ignored_digest_type]  # type: ignore[assignment]
    if wire.has_ack_quorum:
        message.ackQuorumSize = md.ack_quorum
    if md.ctime is not None:
        message.ctime = md.ctime
    custom_field = message.customMetadata
    for key, value in md.custom_metadata:
        custom_field.add(key=key, value=value)
    if md.ctoken is not None:
        message.cToken = md.ctoken
    return message


def _encode_v1_text(md: LedgerMetadata) -> str:
    wire = md.wire
    length = md.length if wire.ignored_length is None else wire.ignored_length
    lines = [str(md.write_quorum), str(md.ensemble_size), str(length)]
    lines.extend("\t".join((str(segment.first_entry_id), *segment.ensemble)) for segment in md.segments)
    text = "\n".join(lines)
    if md.state is LedgerState.CLOSED:
        return f"{text}\n{md.last_entry_id}\t{_V1_CLOSED_TAG}"
    if md.state is LedgerState.IN_RECOVERY:
        return f"{text}\n{_V1_IN_RECOVERY_ENTRY_ID}\t{_V1_CLOSED_TAG}"
    return text + "\n" if wire.v1_final_newline else text


# ------------------------------------------------------------------------------------------------ Pulsar

_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_PULSAR_DOMAINS = ("persistent", "non-persistent")


def pulsar_topic_from_managed_ledger(name: str) -> str | None:
    """Pulsar topic for a managed-ledger name, or ``None`` when the name is not one.

    ``tenant/namespace/persistent/<url-encoded local name>`` gives ``persistent://tenant/namespace/<local>``;
    the pre-2.0 ``property/cluster/namespace/persistent/<local>`` form keeps its cluster.

    Example:
        >>> pulsar_topic_from_managed_ledger("public/default/persistent/my%20topic-partition-0")
        'persistent://public/default/my topic-partition-0'
        >>> pulsar_topic_from_managed_ledger("sample/us-west/ns1/persistent/t1")
        'persistent://sample/us-west/ns1/t1'
        >>> pulsar_topic_from_managed_ledger("not-a-topic") is None
        True
    """
    parts = name.split("/")
    if len(parts) not in (4, 5) or any(not part for part in parts):
        return None
    *prefix, domain, encoded_local = parts
    if domain not in _PULSAR_DOMAINS:
        return None
    # Pulsar encodes the local name with java.net.URLEncoder: '+' is a space, %XX are UTF-8 bytes.
    if _BAD_PERCENT.search(encoded_local):
        return None
    try:
        local = unquote_to_bytes(encoded_local.replace("+", " ")).decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not local:
        return None
    return f"{domain}://{'/'.join(prefix)}/{local}"


# ------------------------------------------------------------------------------------------------ JSON

_JSON_KEYS = (
    "format_version",
    "ensemble_size",
    "write_quorum",
    "ack_quorum",
    "state",
    "last_entry_id",
    "length",
    "digest_type",
    "segments",
    "ctime",
    "ctoken",
    "custom_metadata",
    "has_password",
)
# Keys `decode` may add that carry nothing for encoding.
_JSON_INFORMATIONAL_KEYS = frozenset({"ledger_id", "pulsar_topic"})
_WIRE_JSON_DEFAULTS: dict[str, Any] = {
    "has_last_entry_id": True,
    "has_ack_quorum": True,
    "has_digest_type": True,
    "ignored_last_entry_id": None,
    "ignored_length": None,
    "ignored_digest_type": None,
    "v1_final_newline": True,
    "unknown_fields": (),
}


def metadata_to_json(md: LedgerMetadata, *, include_password: bool = False) -> dict[str, Any]:
    """The JSON object of ``bkaudit metadata decode`` (interfaces.md §1), without ``ledger_id``.

    ``password_b64`` appears only with ``include_password`` (and a stored password). A ``wire`` object with
    the non-default :class:`WireLayout` fields appears only for znodes that differ from the writer's layout.

    Example:
        >>> doc = metadata_to_json(_doc_example())
        >>> doc["state"], doc["segments"][1], doc["has_password"], "password_b64" in doc
        ('CLOSED', {'first_entry_id': 5, 'ensemble': ['b1:3181', 'b2:3181', 'b4:3181']}, True, False)
    """
    doc: dict[str, Any] = {
        "format_version": md.format_version,
        "ensemble_size": md.ensemble_size,
        "write_quorum": md.write_quorum,
        "ack_quorum": md.ack_quorum,
        "state": md.state.value,
        "last_entry_id": md.last_entry_id,
        "length": md.length,
        "digest_type": md.digest_type.value if md.digest_type is not None else None,
        "segments": [
            {"first_entry_id": segment.first_entry_id, "ensemble": list(segment.ensemble)}
            for segment in md.segments
        ],
        "ctime": md.ctime,
        "ctoken": md.ctoken,
        "custom_metadata": [
            {"key": key, "value_b64": base64.b64encode(value).decode("ascii")}
            for key, value in md.custom_metadata
        ],
        "has_password": md.password is not None,
    }
    if include_password and md.password is not None:
        doc["password_b64"] = base64.b64encode(md.password.reveal()).decode("ascii")
    if not md.wire.is_writer_layout:
        wire_doc: dict[str, Any] = {}
        for name, default in _WIRE_JSON_DEFAULTS.items():
            value = getattr(md.wire, name)
            if value != default:
                wire_doc[name] = _wire_json_value(value)
        doc["wire"] = wire_doc
    return doc


def _wire_json_value(value: object) -> Any:
    """A :class:`WireLayout` value as JSON: a digest by name, the unknown-field names as a list."""
    if isinstance(value, DigestType):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    return value


def _wire_json_kind(name: str) -> str:
    """The JSON kind (see :func:`_json_field`) of the ``wire`` key ``name``."""
    if name == "unknown_fields":
        return "list"
    if name.startswith(("has_", "v1_")):
        return "bool"
    return "str?" if name.endswith("digest_type") else "int?"


def _json_field(doc: Mapping[str, Any], key: str, kind: str) -> Any:
    value = doc[key]
    ok = {
        "int": _is_int(value),
        "int?": value is None or _is_int(value),
        "str": isinstance(value, str),
        "str?": value is None or isinstance(value, str),
        "bool": isinstance(value, bool),
        "list": isinstance(value, list),
    }[kind]
    if not ok:
        expected = {"int?": "an integer or null", "str?": "a string or null", "list": "an array"}.get(
            kind, {"int": "an integer", "str": "a string", "bool": "true or false"}.get(kind, kind)
        )
        raise FormatError(f"ledger metadata JSON: {key!r} must be {expected}")
    return value


def _json_enum(value: str | None, enum_type: type[StrEnum], key: str) -> Any:
    if value is None:
        return None
    try:
        return enum_type(value)
    except ValueError:
        names = ", ".join(member.value for member in enum_type)
        raise FormatError(
            f"ledger metadata JSON: {key!r} must be one of {names}, not {value[:40]!r}"
        ) from None


def _b64(value: object, key: str) -> bytes:
    if not isinstance(value, str):
        raise FormatError(f"ledger metadata JSON: {key!r} must be a base64 string")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise FormatError(f"ledger metadata JSON: {key!r} is not valid base64") from None


def metadata_from_json(doc: object) -> LedgerMetadata:
    """Build a :class:`LedgerMetadata` from the JSON object :func:`metadata_to_json` produces.

    Every documented key is required (``password_b64`` exactly when ``has_password`` is true); ``ledger_id``
    and ``pulsar_topic`` are accepted and ignored; any other key is refused, so a typo cannot silently change
    what gets written. Raises :class:`FormatError` for anything wrong.

    Example:
        >>> md = _doc_example()
        >>> metadata_from_json(metadata_to_json(md, include_password=True)) == md
        True
        >>> metadata_from_json({"format_version": 3})
        Traceback (most recent call last):
        ...
        core.errors.FormatError: ledger metadata JSON: missing key(s): ensemble_size, write_quorum, ...
    """
    if not isinstance(doc, dict):
        raise FormatError("ledger metadata JSON: expected an object")
    missing = [key for key in _JSON_KEYS if key not in doc]
    if missing:
        shown = ", ".join(missing[:2]) + (", ..." if len(missing) > 2 else "")
        raise FormatError(f"ledger metadata JSON: missing key(s): {shown}")
    allowed = {*_JSON_KEYS, "password_b64", "wire", *_JSON_INFORMATIONAL_KEYS}
    extra = sorted(str(key) for key in doc if key not in allowed)
    if extra:
        raise FormatError(f"ledger metadata JSON: unknown key(s): {', '.join(k[:40] for k in extra[:5])}")

    has_password = _json_field(doc, "has_password", "bool")
    password: LedgerPassword | None = None
    if has_password:
        if "password_b64" not in doc:
            raise FormatError(
                "ledger metadata JSON: has_password is true but password_b64 is missing "
                "(decode with --include-password to re-encode)"
            )
        password = LedgerPassword(_b64(doc["password_b64"], "password_b64"))
    elif "password_b64" in doc:
        raise FormatError("ledger metadata JSON: password_b64 given but has_password is false")

    segments = []
    for index, item in enumerate(_json_field(doc, "segments", "list")):
        if not isinstance(item, dict) or set(item) != {"first_entry_id", "ensemble"}:
            raise FormatError(f"ledger metadata JSON: segment {index} must be {{first_entry_id, ensemble}}")
        first = _json_field(item, "first_entry_id", "int")
        ensemble = _json_field(item, "ensemble", "list")
        if not all(isinstance(member, str) for member in ensemble):
            raise FormatError(f"ledger metadata JSON: segment {index} ensemble must be a list of strings")
        segments.append(Segment(first, tuple(ensemble)))

    custom = []
    for index, item in enumerate(_json_field(doc, "custom_metadata", "list")):
        if not isinstance(item, dict) or set(item) != {"key", "value_b64"}:
            raise FormatError(f"ledger metadata JSON: custom_metadata {index} must be {{key, value_b64}}")
        key = _json_field(item, "key", "str")
        custom.append((key, _b64(item["value_b64"], f"custom_metadata {index} value_b64")))

    wire = _WRITER_LAYOUT
    if "wire" in doc:
        wire_doc = doc["wire"]
        if not isinstance(wire_doc, dict) or not set(wire_doc) <= set(_WIRE_JSON_DEFAULTS):
            raise FormatError(f"ledger metadata JSON: 'wire' may only hold {', '.join(_WIRE_JSON_DEFAULTS)}")
        values: dict[str, Any] = {}
        for name in wire_doc:
            values[name] = _json_field(wire_doc, name, _wire_json_kind(name))
        if "unknown_fields" in values:
            values["unknown_fields"] = tuple(values["unknown_fields"])  # _validate checks the items
        if "ignored_digest_type" in values:
            values["ignored_digest_type"] = _json_enum(
                values["ignored_digest_type"], DigestType, "ignored_digest_type"
            )
        wire = WireLayout(**values)

    return LedgerMetadata(
        format_version=_json_field(doc, "format_version", "int"),
        ensemble_size=_json_field(doc, "ensemble_size", "int"),
        write_quorum=_json_field(doc, "write_quorum", "int"),
        ack_quorum=_json_field(doc, "ack_quorum", "int"),
        state=_json_enum(_json_field(doc, "state", "str"), LedgerState, "state"),
        last_entry_id=_json_field(doc, "last_entry_id", "int"),
        length=_json_field(doc, "length", "int"),
        digest_type=_json_enum(_json_field(doc, "digest_type", "str?"), DigestType, "digest_type"),
        password=password,
        segments=tuple(segments),
        ctime=_json_field(doc, "ctime", "int?"),
        ctoken=_json_field(doc, "ctoken", "int?"),
        custom_metadata=tuple(custom),
        wire=wire,
    )
