"""BookKeeper's under-replication tree (``<root>/underreplication``): paths and every znode's format.

Pure code: no I/O. Formats are byte-exact with what BookKeeper writes
(``ZkLedgerUnderreplicationManager``, ``ZkLedgerAuditorManager``):

* ``ledgers/<h1>/<h2>/<h3>/<h4>/urL%010d``: one mark per under-replicated ledger, text format of
  ``UnderreplicatedLedgerFormat`` (replica list, optional ctime). ``hN``: the id's 16-bit chunks, ``%04x``.
* ``locks/urL%010d``: a ReplicationWorker's lock, text ``LockDataFormat`` (``bookieId`` optional).
* ``LAYOUT``: text ``LedgerRereplicationLayoutFormat``, must be ``BASIC`` version 1.
* ``lostBookieRecoveryDelay``: ASCII decimal seconds.
* ``checkallledgersctime`` / ``placementpolicycheckctime`` / ``replicascheckctime``: *binary* protobuf, one
  optional int64 (ms epoch).
* ``auditorelection`` and its ``V_%010d`` votes: text ``AuditorVoteFormat``.

Text decoders accept ``bytes`` (the znode content) or ``str``; text encoders return ``str`` (encode as UTF-8
to write a znode); binary codecs take and return ``bytes``. Every decoder raises only :class:`FormatError`.

Example:
    >>> urledger_path(59)
    '/ledgers/underreplication/ledgers/0000/0000/0000/003b/urL0000000059'
    >>> parse_underreplicated_ledger(b'replica: "10.0.0.5:3181"\\nctime: 1718000000000\\n')
    UnderreplicatedLedger(replicas=('10.0.0.5:3181',), ctime=1718000000000)
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.message import DecodeError, Message

from core.domain.layout import DEFAULT_LEDGERS_ROOT, UNDERREPLICATION_NODE, check_ledger_id, validate_root
from core.domain.textformat import parse_message, print_message
from core.errors import FormatError
from core.pb import data_formats_pb2 as pb

URLEDGERS_NODE = "ledgers"
LOCKS_NODE = "locks"
LAYOUT_NODE = "LAYOUT"
DISABLE_NODE = "disable"
LOST_BOOKIE_RECOVERY_DELAY_NODE = "lostBookieRecoveryDelay"
AUDITOR_ELECTION_NODE = "auditorelection"
VOTE_PREFIX = "V_"
URLEDGER_PREFIX = "urL"

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1


def _check_encodable(values: tuple[str, ...] | list[str], what: str) -> None:
    # A lone surrogate cannot be written as UTF-8; refuse it in the model, not deep inside an encoder.
    for value in values:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise FormatError(f"{what}: string with a lone surrogate cannot be encoded") from None


# --------------------------------------------------------------------------------------------------------
# Paths


def _urledger_name(ledger_id: int) -> str:
    return f"{URLEDGER_PREFIX}{ledger_id:010d}"


def _hex_chunks(ledger_id: int) -> str:
    # Four 16-bit chunks, most significant first, as ZkLedgerUnderreplicationManager.getParentZnodePath.
    return "/".join(f"{(ledger_id >> shift) & 0xFFFF:04x}" for shift in (48, 32, 16, 0))


@dataclass(frozen=True)
class UnderreplicationPaths:
    """Every znode path of the under-replication tree for one ledgers root.

    Example:
        >>> paths = UnderreplicationPaths("/ledgers")
        >>> paths.lost_bookie_recovery_delay
        '/ledgers/underreplication/lostBookieRecoveryDelay'
        >>> paths.lock(59)
        '/ledgers/underreplication/locks/urL0000000059'
    """

    root: str = DEFAULT_LEDGERS_ROOT

    def __post_init__(self) -> None:
        validate_root(self.root)

    @property
    def base(self) -> str:
        """``<root>/underreplication``.

        Example:
            >>> UnderreplicationPaths("/bk").base
            '/bk/underreplication'
        """
        return f"{self.root}/{UNDERREPLICATION_NODE}"

    @property
    def urledgers(self) -> str:
        """Parent of the ``urL`` marks (BookKeeper appends the constant ``/ledgers``, not the root)."""
        return f"{self.base}/{URLEDGERS_NODE}"

    @property
    def locks(self) -> str:
        """Parent of the replication locks."""
        return f"{self.base}/{LOCKS_NODE}"

    @property
    def layout(self) -> str:
        """The rereplication LAYOUT znode."""
        return f"{self.base}/{LAYOUT_NODE}"

    @property
    def disable(self) -> str:
        """Present when auto-recovery is disabled."""
        return f"{self.base}/{DISABLE_NODE}"

    @property
    def lost_bookie_recovery_delay(self) -> str:
        """Authoritative lost-bookie recovery delay (seconds)."""
        return f"{self.base}/{LOST_BOOKIE_RECOVERY_DELAY_NODE}"

    @property
    def auditor_election(self) -> str:
        """Parent of the auditor votes; its own data is the winner's vote."""
        return f"{self.base}/{AUDITOR_ELECTION_NODE}"

    def ctime(self, kind: CtimeZnode) -> str:
        """Path of one of the three binary ctime znodes.

        Example:
            >>> UnderreplicationPaths().ctime(CtimeZnode.CHECK_ALL_LEDGERS)
            '/ledgers/underreplication/checkallledgersctime'
        """
        return f"{self.base}/{kind.value}"

    def urledger(self, ledger_id: int) -> str:
        """The under-replication mark of ``ledger_id``.

        Example:
            >>> UnderreplicationPaths("/bk").urledger(65536)
            '/bk/underreplication/ledgers/0000/0000/0001/0000/urL0000065536'
        """
        check_ledger_id(ledger_id)
        return f"{self.urledgers}/{_hex_chunks(ledger_id)}/{_urledger_name(ledger_id)}"

    def lock(self, ledger_id: int) -> str:
        """The replication lock of ``ledger_id``.

        Example:
            >>> UnderreplicationPaths().lock(7)
            '/ledgers/underreplication/locks/urL0000000007'
        """
        check_ledger_id(ledger_id)
        return f"{self.locks}/{_urledger_name(ledger_id)}"


def urledger_path(ledger_id: int, root: str = DEFAULT_LEDGERS_ROOT) -> str:
    """The under-replication mark znode of ``ledger_id`` (0..2^63-1, else FormatError).

    Example:
        >>> urledger_path(2**63 - 1)
        '/ledgers/underreplication/ledgers/7fff/ffff/ffff/ffff/urL9223372036854775807'
    """
    return UnderreplicationPaths(root).urledger(ledger_id)


def urledger_lock_path(ledger_id: int, root: str = DEFAULT_LEDGERS_ROOT) -> str:
    """The replication lock znode of ``ledger_id``.

    Example:
        >>> urledger_lock_path(59, "/bk")
        '/bk/underreplication/locks/urL0000000059'
    """
    return UnderreplicationPaths(root).lock(ledger_id)


# BookKeeper's pattern is ``urL(\\d+)$``; Java's \\d is ASCII and ``$`` may precede a final line terminator.
_URL_ID = re.compile(r"urL([0-9]+)(?:\r\n|[\n\r\u0085\u2028\u2029])?\Z")


def ledger_id_from_urledger_path(path: str) -> int:
    """The ledger id in a mark or lock path, as BookKeeper extracts it (regex ``urL(\\d+)$``).

    No match, or a number beyond a Java long, raises :class:`FormatError`.

    Example:
        >>> ledger_id_from_urledger_path("/ledgers/underreplication/locks/urL0000000059")
        59
    """
    match = _URL_ID.search(path)
    if match is None:
        raise FormatError(f"no ledger id (urL<digits>) at the end of {path[:200]!r}")
    ledger_id = int(match.group(1))
    if ledger_id > INT64_MAX:
        raise FormatError(f"ledger id {match.group(1)[:40]} in {path[:200]!r} does not fit a Java long")
    return ledger_id


def parse_urledger_path(path: str, root: str = DEFAULT_LEDGERS_ROOT) -> int | None:
    """The ledger id if ``path`` is exactly the canonical mark path of that id under ``root``, else None.

    Stricter than :func:`ledger_id_from_urledger_path`: the watcher uses it to route notifications.

    Example:
        >>> parse_urledger_path("/ledgers/underreplication/ledgers/0000/0000/0000/003b/urL0000000059")
        59
        >>> parse_urledger_path("/ledgers/underreplication/ledgers/0000/0000/0000/003b") is None
        True
    """
    paths = UnderreplicationPaths(root)
    if not path.startswith(paths.urledgers + "/"):
        return None
    match = _URL_ID.search(path)
    if match is None or match.end(1) != len(path):
        return None
    ledger_id = int(match.group(1))
    if ledger_id > INT64_MAX or paths.urledger(ledger_id) != path:
        return None
    return ledger_id


# --------------------------------------------------------------------------------------------------------
# Under-replication mark


@dataclass(frozen=True)
class UnderreplicatedLedger:
    """Content of a ``urL`` mark: bookies believed missing (may be empty) and the mark time in ms, if stored.

    Example:
        >>> format_underreplicated_ledger(UnderreplicatedLedger(("b1:3181", "b2:3181"), None))
        'replica: "b1:3181"\\nreplica: "b2:3181"\\n'
    """

    replicas: tuple[str, ...]
    ctime: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.replicas, tuple) or not all(isinstance(r, str) for r in self.replicas):
            raise FormatError("under-replication mark: replicas must be a tuple of strings")
        _check_encodable(self.replicas, "under-replication mark")
        if self.ctime is not None and (
            isinstance(self.ctime, bool)
            or not isinstance(self.ctime, int)
            or not INT64_MIN <= self.ctime <= INT64_MAX
        ):
            raise FormatError(f"under-replication mark: ctime {self.ctime!r} is not a 64-bit integer")


def parse_underreplicated_ledger(data: bytes | str) -> UnderreplicatedLedger:
    """Decode a ``urL`` mark (text ``UnderreplicatedLedgerFormat``); empty content is a mark with no replicas.

    Example:
        >>> parse_underreplicated_ledger(b"")
        UnderreplicatedLedger(replicas=(), ctime=None)
    """
    message = parse_message(data, pb.UnderreplicatedLedgerFormat, what="under-replication mark")
    ctime = message.ctime if message.HasField("ctime") else None
    return UnderreplicatedLedger(tuple(message.replica), ctime)


def format_underreplicated_ledger(mark: UnderreplicatedLedger) -> str:
    """Encode a ``urL`` mark exactly as BookKeeper's ``TextFormat`` printer writes it.

    Example:
        >>> format_underreplicated_ledger(UnderreplicatedLedger(("10.0.0.5:3181",), 1718000000000))
        'replica: "10.0.0.5:3181"\\nctime: 1718000000000\\n'
    """
    message = pb.UnderreplicatedLedgerFormat(replica=list(mark.replicas))
    if mark.ctime is not None:
        message.ctime = mark.ctime
    return print_message(message)


# --------------------------------------------------------------------------------------------------------
# Rereplication LAYOUT


@dataclass(frozen=True)
class RereplicationLayout:
    """Content of ``underreplication/LAYOUT``; BookKeeper only accepts ``BASIC`` version 1.

    Example:
        >>> REREPLICATION_LAYOUT
        RereplicationLayout(type='BASIC', version=1)
    """

    type: str
    version: int


REREPLICATION_LAYOUT = RereplicationLayout("BASIC", 1)


def parse_rereplication_layout(data: bytes | str, *, require_compatible: bool = True) -> RereplicationLayout:
    """Decode ``underreplication/LAYOUT``; by default anything but BASIC/1 raises (BookKeeper's check).

    Example:
        >>> parse_rereplication_layout(b'type: "BASIC"\\nversion: 1\\n')
        RereplicationLayout(type='BASIC', version=1)
        >>> parse_rereplication_layout('type: "BASIC"\\nversion: 2\\n')
        Traceback (most recent call last):
        ...
        core.errors.FormatError: rereplication LAYOUT: incompatible layout BASIC:2 (expected BASIC:1)
    """
    message = parse_message(data, pb.LedgerRereplicationLayoutFormat, what="rereplication LAYOUT")
    layout = RereplicationLayout(message.type, message.version)
    if require_compatible and layout != REREPLICATION_LAYOUT:
        raise FormatError(
            f"rereplication LAYOUT: incompatible layout {layout.type[:40]}:{layout.version} "
            f"(expected {REREPLICATION_LAYOUT.type}:{REREPLICATION_LAYOUT.version})"
        )
    return layout


def format_rereplication_layout(layout: RereplicationLayout = REREPLICATION_LAYOUT) -> str:
    """Encode ``underreplication/LAYOUT`` as BookKeeper writes it.

    Example:
        >>> format_rereplication_layout()
        'type: "BASIC"\\nversion: 1\\n'
    """
    _check_encodable([layout.type], "rereplication LAYOUT")
    if not -(2**31) <= layout.version <= INT32_MAX:
        raise FormatError(f"rereplication LAYOUT: version {layout.version} does not fit a 32-bit integer")
    return print_message(pb.LedgerRereplicationLayoutFormat(type=layout.type, version=layout.version))


# --------------------------------------------------------------------------------------------------------
# lostBookieRecoveryDelay

# Integer.parseInt syntax (optional sign, ASCII digits); the value must then be 0..Integer.MAX_VALUE.
_JAVA_INT = re.compile(r"[+-]?[0-9]+")


def parse_lost_bookie_recovery_delay(data: bytes | str) -> int:
    """Seconds stored in ``lostBookieRecoveryDelay`` (ASCII decimal, as ``Integer.parseInt`` reads it).

    Whitespace, garbage, negative values and values beyond a Java int raise :class:`FormatError`.

    Example:
        >>> parse_lost_bookie_recovery_delay(b"30")
        30
        >>> parse_lost_bookie_recovery_delay(b"-5")
        Traceback (most recent call last):
        ...
        core.errors.FormatError: lostBookieRecoveryDelay: -5 is negative
    """
    if isinstance(data, bytes | bytearray | memoryview):
        try:
            text = bytes(data).decode("ascii")
        except UnicodeDecodeError:
            raise FormatError(f"lostBookieRecoveryDelay: {bytes(data)[:40]!r} is not ASCII decimal") from None
    else:
        text = data
    if not _JAVA_INT.fullmatch(text):
        raise FormatError(f"lostBookieRecoveryDelay: {text[:40]!r} is not a decimal integer")
    value = int(text)
    if value < 0:
        raise FormatError(f"lostBookieRecoveryDelay: {text[:40]} is negative")
    if value > INT32_MAX:
        raise FormatError(f"lostBookieRecoveryDelay: {text[:40]} does not fit a 32-bit integer")
    return value


def format_lost_bookie_recovery_delay(seconds: int) -> str:
    """Encode the delay as BookKeeper writes it (``Integer.toString``).

    Example:
        >>> format_lost_bookie_recovery_delay(0)
        '0'
    """
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 0 <= seconds <= INT32_MAX:
        raise FormatError(f"lostBookieRecoveryDelay: {seconds!r} is not an integer in 0..{INT32_MAX}")
    return str(seconds)


# --------------------------------------------------------------------------------------------------------
# Binary ctime znodes


class CtimeZnode(enum.Enum):
    """The three binary "last run" znodes; the value is the znode name.

    Example:
        >>> CtimeZnode.REPLICAS_CHECK.value
        'replicascheckctime'
    """

    CHECK_ALL_LEDGERS = "checkallledgersctime"
    PLACEMENT_POLICY_CHECK = "placementpolicycheckctime"
    REPLICAS_CHECK = "replicascheckctime"


_CTIME_MESSAGES: dict[CtimeZnode, tuple[type[Message], str]] = {
    CtimeZnode.CHECK_ALL_LEDGERS: (pb.CheckAllLedgersFormat, "checkAllLedgersCTime"),
    CtimeZnode.PLACEMENT_POLICY_CHECK: (pb.PlacementPolicyCheckFormat, "placementPolicyCheckCTime"),
    CtimeZnode.REPLICAS_CHECK: (pb.ReplicasCheckFormat, "replicasCheckCTime"),
}


def parse_ctime(kind: CtimeZnode, data: bytes) -> int | None:
    """The ms-epoch time in a binary ctime znode; None when the field is absent (BookKeeper reports -1).

    Example:
        >>> parse_ctime(CtimeZnode.CHECK_ALL_LEDGERS, b"\\x08\\xe8\\x07")
        1000
        >>> parse_ctime(CtimeZnode.REPLICAS_CHECK, b"") is None
        True
    """
    message_type, field = _CTIME_MESSAGES[kind]
    if not isinstance(data, bytes | bytearray | memoryview):
        raise FormatError(f"{kind.value}: expected bytes, got {type(data).__name__}")
    message = message_type()
    try:
        message.ParseFromString(bytes(data))
    except (DecodeError, ValueError, RuntimeError) as err:
        raise FormatError(
            f"{kind.value}: invalid protobuf ({str(err).splitlines()[0] if str(err) else 'decode error'})"
        ) from None
    if not message.HasField(field):
        return None
    value: int = getattr(message, field)
    return value


def parse_check_times(
    contents: Mapping[CtimeZnode, bytes | None],
) -> tuple[dict[CtimeZnode, int], list[str]]:
    """When each of the Auditor's periodic checks last completed, from the content of its ctime znode
    (None: the znode does not exist): the times of those that hold one, and why the others that exist do
    not decode (one message per znode, naming it, never its bytes). A check missing from the times never
    ran as far as ZooKeeper tells.

    Example:
        >>> times, errors = parse_check_times({CtimeZnode.CHECK_ALL_LEDGERS: b"\\x08\\xe8\\x07",
        ...     CtimeZnode.PLACEMENT_POLICY_CHECK: None, CtimeZnode.REPLICAS_CHECK: b"\\xff"})
        >>> times
        {<CtimeZnode.CHECK_ALL_LEDGERS: 'checkallledgersctime'>: 1000}
        >>> errors[0].startswith("replicascheckctime: invalid protobuf")
        True
    """
    times: dict[CtimeZnode, int] = {}
    errors: list[str] = []
    for kind in CtimeZnode:
        data = contents.get(kind)
        if data is None:
            continue
        try:
            ctime = parse_ctime(kind, data)
        except FormatError as err:
            errors.append(str(err))
            continue
        if ctime is not None:
            times[kind] = ctime
    return times, errors


def format_ctime(kind: CtimeZnode, ctime_ms: int | None) -> bytes:
    """Encode a binary ctime znode as BookKeeper writes it (``toByteArray``).

    Example:
        >>> format_ctime(CtimeZnode.PLACEMENT_POLICY_CHECK, 1000)
        b'\\x08\\xe8\\x07'
    """
    message_type, field = _CTIME_MESSAGES[kind]
    message = message_type()
    if ctime_ms is not None:
        if (
            isinstance(ctime_ms, bool)
            or not isinstance(ctime_ms, int)
            or not INT64_MIN <= ctime_ms <= INT64_MAX
        ):
            raise FormatError(f"{kind.value}: {ctime_ms!r} is not a 64-bit integer")
        setattr(message, field, ctime_ms)
    return message.SerializeToString()


# --------------------------------------------------------------------------------------------------------
# Lock data and auditor votes (text, one optional string)


def parse_lock_data(data: bytes | str) -> str | None:
    """The ``bookieId`` (host name) in a replication lock; None when the worker could not tell it.

    Example:
        >>> parse_lock_data(b'bookieId: "worker-1"\\n')
        'worker-1'
    """
    message = parse_message(data, pb.LockDataFormat, what="replication lock")
    return message.bookieId if message.HasField("bookieId") else None


def format_lock_data(bookie_id: str | None) -> str:
    """Encode replication lock data as BookKeeper writes it (empty when the host name is unknown).

    Example:
        >>> format_lock_data("worker-1")
        'bookieId: "worker-1"\\n'
        >>> format_lock_data(None)
        ''
    """
    message = pb.LockDataFormat()
    if bookie_id is not None:
        _check_encodable([bookie_id], "replication lock")
        message.bookieId = bookie_id
    return print_message(message)


def parse_auditor_vote(data: bytes | str) -> str | None:
    """The bookie id in an auditor vote (``auditorelection/V_...`` or ``auditorelection`` itself).

    Example:
        >>> parse_auditor_vote('bookieId: "10.0.0.1:3181"\\n')
        '10.0.0.1:3181'
    """
    message = parse_message(data, pb.AuditorVoteFormat, what="auditor vote")
    return message.bookieId if message.HasField("bookieId") else None


def format_auditor_vote(bookie_id: str | None) -> str:
    """Encode an auditor vote as BookKeeper writes it.

    Example:
        >>> format_auditor_vote("10.0.0.1:3181")
        'bookieId: "10.0.0.1:3181"\\n'
    """
    message = pb.AuditorVoteFormat()
    if bookie_id is not None:
        _check_encodable([bookie_id], "auditor vote")
        message.bookieId = bookie_id
    return print_message(message)


_VOTE_NAME = re.compile(r"V_(-?[0-9]{1,10})")


def vote_sequence(name: str) -> int:
    """Sequence number of a vote znode name ``V_%010d``; the lowest one is the Auditor.

    Example:
        >>> sorted(["V_0000000012", "V_0000000003"], key=vote_sequence)[0]
        'V_0000000003'
    """
    match = _VOTE_NAME.fullmatch(name.rsplit("/", 1)[-1])
    if match is None:
        raise FormatError(f"auditor vote name {name[:80]!r} is not V_<sequence>")
    return int(match.group(1))
