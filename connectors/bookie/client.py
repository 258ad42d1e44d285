"""Asyncio client that asks bookies which entries they hold (BookKeeper's v3 wire protocol).

Probing only: ``GET_LIST_OF_ENTRIES_OF_LEDGER`` and plain ``READ_ENTRY``; no writes, no fencing. With a
:class:`~connectors.bookie.tls.BookieTlsConfig` every connection is upgraded as BookKeeper's client does it
(``START_TLS``, then the TLS handshake on the same socket, with a client certificate when one is given:
what a bookie with ``BookieAuthZFactory`` authenticates). A bookie that refuses, or wants what bkaudit was
not given, is a :class:`TlsRefused` or :class:`AuthRequired` whose reason names the credential: an answer
of a live bookie, never a silent one. No ``AUTH`` plugin exchange (SASL) is spoken.

How it talks (BookKeeper's v3 protocol): one TCP connection per bookie address, reused and pipelined; every
request gets a fresh ``txnId`` and the answer is matched on ``(txnId, operation)`` as BookKeeper's
``PerChannelBookieClient`` does. An answer nobody waits for any more (late, or foreign) is logged and dropped.
In-flight requests are bounded per bookie and globally; requests issued in the same loop iteration leave in
one ``send()``. A dropped connection fails its in-flight requests at once with :class:`ConnectionFailed`
(they never hang) and the next request reconnects.

Every probe returns a :class:`ProbeResult`, never raises for anything the network or the bookie did:

================  =============================================  =============================================
result            when                                           what the Auditor makes of it
================  =============================================  =============================================
EntryList         ``EOK`` + availability bytes                   the entries the bookie holds
NoLedger          ``ENOLEDGER``                                  holds nothing of the ledger
EntryPresent      ``READ_ENTRY`` ``EOK``                         holds that entry
NoEntry           ``READ_ENTRY`` ``ENOENTRY``                    does not hold that entry
LastConfirmed     ``READ_ENTRY`` of entry -1, ``EOK``            its last entry and the LAC that entry carries
AuthRequired      ``EUA`` (or ``EIO`` to ``START_TLS``)          unknown: the bookie wants other credentials
TlsRefused        ``START_TLS`` refused, TLS handshake failed    unknown: the reason names the credential
Timeout           no answer in time (DbLedgerStorage bookies!)   unknown, never "missing"
ConnectionFailed  refused, reset, unreachable, bad address       unknown
BookieError       any other status (``EIO``, ``EBADVERSION`` …)  unknown
BadResponse       undecodable or inconsistent answer             unknown
================  =============================================  =============================================

Spark's ``foreachBatch`` code is synchronous, so :class:`BlockingBookieClient` runs a client on a private
event loop in a daemon thread (connections survive between batches), and :func:`probe_ledger_entries_sync` is
the one-shot form.

Example:
    >>> result = EntryList(EntryAvailability.from_entry_ids([0, 1, 2]))
    >>> result.kind, result.conclusive, 2 in result.availability
    ('entry_list', True, True)
    >>> availability_of(NoLedger()).count, availability_of(Timeout(5.0)) is None
    (0, True)
    >>> # I/O, against a running bookie:
    >>> # async with BookieClient() as client:
    >>> #     result = await client.list_entries("bookie-1:3181", ledger_id=5, timeout=5.0)
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import ssl
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, cast

from connectors.bookie.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    LAST_ADD_CONFIRMED,
    MAX_TXN_ID,
    FrameDecoder,
    decode_entry_header,
    encode_frame,
    list_entries_request,
    operation_name,
    parse_response,
    peek_header,
    read_entry_request,
    start_tls_request,
    status_name,
)
from connectors.bookie.tls import BookieTlsConfig, auth_required_reason, refusal_of
from core.domain.availability import EntryAvailability, decode_availability
from core.errors import BkauditError, FormatError
from core.pb import bookkeeper_protocol_pb2 as pb

logger = logging.getLogger(__name__)

DEFAULT_PROBE_TIMEOUT_S = 5.0
"""BookKeeper's ``readEntryTimeoutSec`` default: how long the Auditor waits for a bookie's answer."""

DEFAULT_CONNECT_TIMEOUT_S = 5.0
"""TCP connect timeout (BookKeeper's client uses 10 s; a probe that cannot connect is re-tried next round)."""

DEFAULT_MAX_IN_FLIGHT_PER_BOOKIE = 100
"""The Auditor's ``MAX_CONCURRENT_REPLICAS_CHECK_LEDGER_REQUESTS``."""

DEFAULT_MAX_IN_FLIGHT = 1000
"""Requests in flight across all bookies of one client."""

_READ_CHUNK = 256 * 1024
_CLOSE_WAIT_S = 1.0  # how long a close waits for the bookie's side of it
_REASON_WAIT_S = 1.0  # after a failed write, how long the reader may take to tell why the connection died
_EXPIRED_MEMORY = 4096  # txnIds remembered after a timeout, so their late answers log quietly
_CLOSED_AFTER_HANDSHAKE = (
    "the bookie closed the TLS connection before any answer, without saying why: it may refuse bkaudit's "
    "client certificate (bookie.tls_cert_file: missing, expired, or signed by a CA it does not trust)"
)

Address = tuple[str, int]
_Key = tuple[int, int]  # (txnId, operation): what a response is matched on
T = TypeVar("T")


# ------------------------------------------------------------------------------------------------ results


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """Base of every probe outcome; ``kind`` names it, ``conclusive`` says the bookie told what it holds.

    Example:
        >>> [cls().kind for cls in (NoLedger, NoEntry, AuthRequired)]
        ['no_ledger', 'no_entry', 'auth_required']
    """

    kind: ClassVar[str] = "unknown"
    conclusive: ClassVar[bool] = False


@dataclass(frozen=True, slots=True)
class EntryList(ProbeResult):
    """``EOK`` to ``GET_LIST_OF_ENTRIES_OF_LEDGER``: the entries the bookie holds.

    Example:
        >>> EntryList(EntryAvailability.from_entry_ids([4, 5])).availability.count
        2
    """

    availability: EntryAvailability
    kind: ClassVar[str] = "entry_list"
    conclusive: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class NoLedger(ProbeResult):
    """``ENOLEDGER``: the bookie holds nothing of the ledger (the Auditor reads it as an empty list).

    Example:
        >>> NoLedger().conclusive
        True
    """

    kind: ClassVar[str] = "no_ledger"
    conclusive: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class AgentEntryList(EntryList):
    """The entries an agent read from the bookie's index (classified like an entry list)."""

    kind: ClassVar[str] = "agent_list"


@dataclass(frozen=True, slots=True)
class AgentNoLedger(NoLedger):
    """An agent found no such ledger in the bookie's index (the bookie would answer ``ENOLEDGER``)."""

    kind: ClassVar[str] = "agent_no_ledger"


#: ``answers`` kinds of a bookie whose agent answered.
AGENT_KINDS = frozenset({AgentEntryList.kind, AgentNoLedger.kind})


@dataclass(frozen=True, slots=True)
class EntryPresent(ProbeResult):
    """``EOK`` to ``READ_ENTRY``: the bookie holds the entry (``body_size`` bytes; the body is not kept).

    Example:
        >>> EntryPresent(body_size=12).kind
        'entry_present'
    """

    body_size: int = 0
    kind: ClassVar[str] = "entry_present"
    conclusive: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class NoEntry(ProbeResult):
    """``ENOENTRY`` to ``READ_ENTRY``: the bookie knows the ledger but not that entry.

    Example:
        >>> NoEntry().kind
        'no_entry'
    """

    kind: ClassVar[str] = "no_entry"
    conclusive: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class LastConfirmed(ProbeResult):
    """``EOK`` to ``READ_ENTRY`` of entry -1: the bookie's last entry and the LAC that entry carries.

    Example:
        >>> LastConfirmed(last_add_confirmed=6, last_entry_id=7).kind
        'last_confirmed'
    """

    last_add_confirmed: int
    last_entry_id: int
    kind: ClassVar[str] = "last_confirmed"
    conclusive: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class AuthRequired(ProbeResult):
    """``EUA``: the bookie has an auth plugin configured and did not authenticate us; ``reason`` names the
    credential (see :func:`connectors.bookie.tls.auth_required_reason`).

    Example:
        >>> AuthRequired().conclusive, AuthRequired("no client certificate").reason
        (False, 'no client certificate')
    """

    reason: str = "the bookie requires authentication"
    kind: ClassVar[str] = "auth_required"


@dataclass(frozen=True, slots=True)
class TlsRefused(ProbeResult):
    """``START_TLS`` refused or the TLS handshake failed: a live bookie we could not talk to securely.

    Example:
        >>> TlsRefused("the bookie requires a client certificate").kind
        'tls_refused'
    """

    reason: str
    kind: ClassVar[str] = "tls_refused"


#: Result kinds of a live bookie that refused bkaudit's credentials (or wants ones it was not given).
REFUSED_KINDS = frozenset({AuthRequired.kind, TlsRefused.kind})


def refusal_of_result(result: ProbeResult) -> str | None:
    """The reason of a refusal (:class:`AuthRequired`, :class:`TlsRefused`), else None.

    Example:
        >>> refusal_of_result(TlsRefused("expired")), refusal_of_result(NoLedger())
        ('expired', None)
    """
    if isinstance(result, AuthRequired | TlsRefused):
        return result.reason
    return None


@dataclass(frozen=True, slots=True)
class Timeout(ProbeResult):
    """No answer within ``timeout_s``: unknown, not missing (DbLedgerStorage bookies never answer the list).

    Example:
        >>> Timeout(0.3).timeout_s
        0.3
    """

    timeout_s: float
    kind: ClassVar[str] = "timeout"


@dataclass(frozen=True, slots=True)
class ConnectionFailed(ProbeResult):
    """Could not connect, or the connection dropped before the answer (refused, reset, bad address).

    Example:
        >>> ConnectionFailed("connection refused").reason
        'connection refused'
    """

    reason: str
    kind: ClassVar[str] = "connection_failed"


@dataclass(frozen=True, slots=True)
class BookieError(ProbeResult):
    """Any other status the bookie answered with (``EIO``, ``EBADVERSION``, ``ETOOMANYREQUESTS`` …).

    Example:
        >>> BookieError(501).status_name
        'EIO'
    """

    status: int
    kind: ClassVar[str] = "bookie_error"

    @property
    def status_name(self) -> str:
        """Symbolic name of :attr:`status`."""
        return status_name(self.status)


@dataclass(frozen=True, slots=True)
class BadResponse(ProbeResult):
    """An answer that could not be decoded or does not fit the request (wrong ledger, no availability bytes).

    Example:
        >>> BadResponse("availability: truncated header: 3 bytes, need 64").kind
        'bad_response'
    """

    reason: str
    kind: ClassVar[str] = "bad_response"


def availability_of(result: ProbeResult) -> EntryAvailability | None:
    """The entries a list probe says the bookie holds, as the Auditor reads it; None when unknown.

    ``ENOLEDGER`` counts as the empty set; every non-conclusive result is None, so a silent or
    failing bookie is never mistaken for one that lost data.

    Example:
        >>> availability_of(EntryList(EntryAvailability.from_entry_ids([7]))).count
        1
        >>> availability_of(NoLedger()) == EntryAvailability.empty(), availability_of(BookieError(501))
        (True, None)
    """
    if isinstance(result, EntryList):
        return result.availability
    if isinstance(result, NoLedger):
        return EntryAvailability.empty()
    return None


def _consume_outcome(task: asyncio.Task[Any]) -> None:
    """Mark a shared task's exception as retrieved even when every waiter has gone away."""
    if not task.cancelled():
        task.exception()


class BookieConnectionError(BkauditError):
    """A connection to a bookie failed or dropped; in-flight requests on it end with this (internally)."""


class BookieRefusedError(BookieConnectionError):
    """The bookie refused the TLS upgrade or bkaudit's certificate; ``reason`` names the credential."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"{address}: {reason}")
        self.reason = reason


# ------------------------------------------------------------------------------------------ classification


def _effective_status(response: pb.Response, inner_field: str) -> tuple[int, Any | None]:
    # BookKeeper's completions use the inner status when the top-level one is EOK, else the top-level one.
    inner = getattr(response, inner_field) if response.HasField(inner_field) else None
    if response.status == pb.EOK and inner is not None:
        return int(inner.status), inner
    return int(response.status), inner


def _status_result(status: int) -> ProbeResult:
    if status == pb.EUA:
        return AuthRequired()
    return BookieError(status)


def classify_list_entries_response(response: pb.Response, ledger_id: int) -> ProbeResult:
    """Turn a parsed answer to ``GET_LIST_OF_ENTRIES_OF_LEDGER`` into a :class:`ProbeResult`.

    Example:
        >>> from connectors.bookie import frames
        >>> header = frames.list_entries_request(5, 1).header
        >>> classify_list_entries_response(frames.list_entries_response(header, 5, frames.ENOLEDGER), 5)
        NoLedger()
        >>> empty_list = frames.list_entries_response(header, 5, frames.EOK, bytes(64))
        >>> classify_list_entries_response(empty_list, 5).kind
        'entry_list'
        >>> classify_list_entries_response(frames.status_response(header, frames.EIO), 5)
        BookieError(status=501)
    """
    status, inner = _effective_status(response, "getListOfEntriesOfLedgerResponse")
    if status == pb.ENOLEDGER:
        return NoLedger()
    if status != pb.EOK:
        return _status_result(status)
    if inner is None:
        return BadResponse("EOK without a getListOfEntriesOfLedgerResponse")
    if inner.ledgerId != ledger_id:
        return BadResponse(f"answer is for ledger {inner.ledgerId}, asked for {ledger_id}")
    if not inner.HasField("availabilityOfEntriesOfLedger"):
        return BadResponse("EOK without availability bytes")
    try:
        return EntryList(decode_availability(inner.availabilityOfEntriesOfLedger))
    except FormatError as err:
        return BadResponse(str(err))


def _read_response(response: pb.Response) -> Any:
    """The ``readResponse`` of an ``EOK`` answer, or what any other answer to a read means (``NoLedger``,
    ``NoEntry``, a status, ``BadResponse``): the part every read's classification shares."""
    status, inner = _effective_status(response, "readResponse")
    if status == pb.ENOLEDGER:
        return NoLedger()
    if status == pb.ENOENTRY:
        return NoEntry()
    if status != pb.EOK:
        return _status_result(status)
    if inner is None:
        return BadResponse("EOK without a readResponse")
    return inner


def classify_read_entry_response(response: pb.Response, ledger_id: int, entry_id: int) -> ProbeResult:
    """Turn a parsed answer to ``READ_ENTRY`` into a :class:`ProbeResult`.

    Example:
        >>> from connectors.bookie import frames
        >>> header = frames.read_entry_request(5, 7, 2).header
        >>> classify_read_entry_response(frames.read_entry_response(header, 5, 7, frames.EOK, b"abc"), 5, 7)
        EntryPresent(body_size=3)
        >>> classify_read_entry_response(frames.read_entry_response(header, 5, 7, frames.ENOENTRY), 5, 7)
        NoEntry()
    """
    inner = _read_response(response)
    if isinstance(inner, ProbeResult):
        return inner
    if (inner.ledgerId, inner.entryId) != (ledger_id, entry_id):
        return BadResponse(
            f"answer is for entry {inner.ledgerId}:{inner.entryId}, asked for {ledger_id}:{entry_id}"
        )
    return EntryPresent(body_size=len(inner.body))


def classify_last_entry_response(response: pb.Response, ledger_id: int) -> ProbeResult:
    """Turn the answer to ``READ_ENTRY`` of :data:`LAST_ADD_CONFIRMED` into a :class:`LastConfirmed` (the
    LAC read from the last entry's header); ``ENOENTRY`` (no entry held) and ``ENOLEDGER`` as for any read.

    Example:
        >>> from connectors.bookie import frames
        >>> header = frames.read_entry_request(5, LAST_ADD_CONFIRMED, 2).header
        >>> body = frames.encode_entry_header(5, 7, 6, 1) + b"x"
        >>> classify_last_entry_response(frames.read_entry_response(header, 5, -1, frames.EOK, body), 5)
        LastConfirmed(last_add_confirmed=6, last_entry_id=7)
        >>> classify_last_entry_response(frames.read_entry_response(header, 5, -1, frames.EOK, b"x"), 5).kind
        'bad_response'
    """
    inner = _read_response(response)
    if isinstance(inner, ProbeResult):
        return inner
    try:
        held_ledger, entry_id, lac, _ = decode_entry_header(inner.body)
    except FormatError as err:
        return BadResponse(str(err))
    if held_ledger != ledger_id:
        return BadResponse(f"last entry is of ledger {held_ledger}, asked for {ledger_id}")
    return LastConfirmed(last_add_confirmed=lac, last_entry_id=entry_id)


def parse_bookie_address(address: str) -> Address:
    """``"host:port"`` (a BookKeeper bookie id, ``[v6]:port`` allowed) → ``(host, port)``; FormatError if bad.

    Example:
        >>> parse_bookie_address("bookie-1.bk:3181"), parse_bookie_address("[::1]:3181")
        (('bookie-1.bk', 3181), ('::1', 3181))
        >>> parse_bookie_address("bookie-1")
        Traceback (most recent call last):
        ...
        core.errors.FormatError: bookie address 'bookie-1': expected host:port
    """
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise FormatError(f"bookie address {address!r}: expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = int(port_text)
    if not 0 < port < 65536:
        raise FormatError(f"bookie address {address!r}: port out of range")
    return host, port


@dataclass(frozen=True, slots=True)
class ProbeRequest:
    """One probe: the entry list of ``ledger_id`` (``entry_id`` None) or whether ``entry_id`` is there.

    Example:
        >>> ProbeRequest("bookie-1:3181", 5), ProbeRequest("bookie-1:3181", 5, entry_id=7).operation
        (ProbeRequest(address='bookie-1:3181', ledger_id=5, entry_id=None), 'READ_ENTRY')
    """

    address: str
    ledger_id: int
    entry_id: int | None = None

    @property
    def operation(self) -> str:
        """The BookKeeper operation this probe sends."""
        return "GET_LIST_OF_ENTRIES_OF_LEDGER" if self.entry_id is None else "READ_ENTRY"


# ---------------------------------------------------------------------------------------------- connection


class _Connection:
    """One TCP connection to one bookie: pipelined requests, answers matched on (txnId, operation)."""

    def __init__(
        self,
        address: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_frame_size: int,
        *,
        tls: BookieTlsConfig | None = None,
        start_tls_key: _Key | None = None,
    ) -> None:
        self.address = address
        self._tls = tls
        self._start_tls_key = start_tls_key  # a bookie that does not authorize us answers it again, EIO
        self._reader = reader
        self._writer = writer
        self._decoder = FrameDecoder(max_frame_size)
        self._pending: dict[_Key, asyncio.Future[pb.Response]] = {}
        self._expired: collections.OrderedDict[_Key, None] = collections.OrderedDict()
        self.closed = False
        self._failure: Exception | None = None
        self._answered = False  # anything received after the upgrade
        self._outgoing: list[bytes] = []
        self._loop = asyncio.get_running_loop()
        self._reader_task = self._loop.create_task(self._read_loop())

    async def round_trip(self, key: _Key, frame: bytes, timeout: float) -> pb.Response:
        """Send one frame and wait for its answer. Raises TimeoutError, BookieConnectionError, FormatError."""
        if self.closed:  # closed since it was handed out (a bookie that refused us right after the handshake)
            raise self._failure or BookieConnectionError(f"{self.address}: connection closed")
        future: asyncio.Future[pb.Response] = self._loop.create_future()
        self._pending[key] = future
        try:
            async with asyncio.timeout(timeout):
                self._queue_write(frame)
                await self._writer.drain()
                return await future
        except TimeoutError:
            self._remember_expired(key)
            raise
        except OSError as err:  # from drain(): the socket died under us
            # The reason may be a TLS alert the reader is about to see (TLS 1.3 refuses a client
            # certificate after the handshake): that is the failure to report.
            await asyncio.wait({self._reader_task}, timeout=_REASON_WAIT_S)
            if isinstance(self._failure, BookieRefusedError):
                raise self._failure from None
            raise BookieConnectionError(f"{self.address}: write failed: {err}") from None
        finally:
            if self._pending.get(key) is future:
                del self._pending[key]
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: the connection's failure may have reached it meanwhile

    def _queue_write(self, frame: bytes) -> None:
        # Requests issued in the same loop iteration leave in one send(): one syscall per frame was the
        # largest cost of a probe.
        self._outgoing.append(frame)
        if len(self._outgoing) == 1:
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        if self._outgoing and not self.closed:
            self._writer.write(b"".join(self._outgoing))
        self._outgoing.clear()

    def _remember_expired(self, key: _Key) -> None:
        self._expired[key] = None
        if len(self._expired) > _EXPIRED_MEMORY:
            self._expired.popitem(last=False)

    async def _read_loop(self) -> None:
        failure: Exception = BookieConnectionError(f"{self.address}: connection closed by the bookie")
        try:
            while True:
                data = await self._reader.read(_READ_CHUNK)
                if not data:
                    if self._start_tls_key is not None and not self._answered:
                        failure = BookieRefusedError(self.address, _CLOSED_AFTER_HANDSHAKE)
                    break
                self._answered = True
                try:
                    frames = self._decoder.feed(data)
                except FormatError as err:
                    # No frame markers: after a bad length the stream cannot be re-synchronised.
                    logger.warning("bookie %s: closing connection: %s", self.address, err)
                    failure = err
                    break
                for frame in frames:
                    problem = self._dispatch(frame)
                    if problem is not None:
                        failure = problem
                        return
        except asyncio.CancelledError:
            failure = BookieConnectionError(f"{self.address}: client closed")
            raise
        except ssl.SSLError as err:
            # TLS 1.3: the bookie's verdict on our client certificate comes after our side of the handshake.
            has_cert = self._tls is not None and self._tls.has_client_cert
            failure = BookieRefusedError(self.address, refusal_of(err, has_client_cert=has_cert))
        except OSError as err:
            failure = BookieConnectionError(f"{self.address}: connection lost: {err}")
        finally:
            self._shut(failure)

    def _dispatch(self, frame: bytes) -> BkauditError | None:
        """Deliver one answer; returns an error when the connection must be dropped (unroutable garbage)."""
        try:
            response = parse_response(frame)
        except FormatError as err:
            key = peek_header(frame)
            future = self._pending.pop(key, None) if key is not None else None
            if future is not None:
                if not future.done():
                    future.set_exception(err)
                return None
            if key is not None:
                logger.warning(
                    "bookie %s: dropped an undecodable answer for unknown txnId %d", self.address, key[0]
                )
                return None
            # We cannot tell whose answer this was; waiting would turn it into a misleading Timeout.
            logger.warning("bookie %s: undecodable answer, closing connection: %s", self.address, err)
            return err
        key = (response.header.txnId, int(response.header.operation))
        if key == self._start_tls_key and response.status != pb.EOK:
            # BookieRequestProcessor: a handshake the auth provider did not authorize answers START_TLS again.
            logger.warning("bookie %s: did not authorize the TLS connection", self.address)
            return BookieRefusedError(self.address, auth_required_reason(self._tls))
        future = self._pending.pop(key, None)
        if future is None:
            if key in self._expired:
                del self._expired[key]
                logger.debug("bookie %s: late answer for txnId %d after its timeout", self.address, key[0])
            else:
                logger.warning(
                    "bookie %s: dropped an answer for unknown txnId %d (%s)",
                    self.address,
                    key[0],
                    operation_name(key[1]),
                )
        elif not future.done():
            future.set_result(response)
        return None

    def _shut(self, failure: Exception) -> None:
        if self.closed:
            return
        self.closed = True
        self._failure = failure
        pending = list(self._pending.values())
        self._pending.clear()
        if pending:
            logger.info(
                "bookie %s: connection closed with %d request(s) in flight", self.address, len(pending)
            )
        for future in pending:
            if not future.done():
                future.set_exception(failure)
        self._writer.close()

    async def close(self) -> None:
        self._reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader_task
        self._shut(BookieConnectionError(f"{self.address}: client closed"))
        try:
            # A TLS close waits for the bookie's close_notify, which a real bookie never sends.
            async with asyncio.timeout(_CLOSE_WAIT_S):
                await self._writer.wait_closed()
        except TimeoutError:
            self._writer.transport.abort()
        except Exception:  # closing a dead connection: nothing more to do
            logger.debug("bookie %s: close", self.address, exc_info=True)


# ------------------------------------------------------------------------------------------------ client


class _Pacer:
    """Spaces calls at least ``1 / per_s`` apart on one event loop (no burst; waiting is the caller's)."""

    def __init__(self, per_s: float) -> None:
        self.interval = 1.0 / per_s
        self.next_at = 0.0

    async def wait(self) -> None:
        now = asyncio.get_running_loop().time()
        at = max(now, self.next_at)
        self.next_at = at + self.interval
        if at > now:
            await asyncio.sleep(at - now)


class BookieClient:
    """Probes bookies over their v3 protocol; one pipelined connection per bookie, bounded concurrency.

    Use inside one event loop; ``close()`` (or ``async with``) releases the connections. ``timeout`` is the
    answer timeout per request (counted from sending it; waiting for a concurrency permit is not counted, so
    our own queueing never turns into a false :class:`Timeout`). ``max_reads_per_s_per_bookie`` paces
    ``READ_ENTRY`` requests to each bookie (entry reads of many ledgers must not flood one bookie); waiting
    for the pace is not counted either.

    Example:
        >>> client = BookieClient(max_in_flight_per_bookie=8)
        >>> client.max_in_flight_per_bookie, client.connection_count
        (8, 0)
        >>> # I/O:
        >>> # async with BookieClient() as client:
        >>> #     await client.list_entries("127.0.0.1:3181", 5)        -> EntryList | NoLedger | Timeout ...
        >>> #     await client.read_entry_exists("127.0.0.1:3181", 5, 0) -> EntryPresent | NoEntry | ...
    """

    def __init__(
        self,
        *,
        timeout: float = DEFAULT_PROBE_TIMEOUT_S,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        max_in_flight_per_bookie: int = DEFAULT_MAX_IN_FLIGHT_PER_BOOKIE,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_reads_per_s_per_bookie: float | None = None,
        tls: BookieTlsConfig | None = None,
    ) -> None:
        if max_in_flight_per_bookie < 1 or max_in_flight < 1:
            raise ValueError("in-flight limits must be at least 1")
        if max_reads_per_s_per_bookie is not None and max_reads_per_s_per_bookie <= 0:
            raise ValueError("the read rate per bookie must be positive (None: unpaced)")
        self.max_reads_per_s_per_bookie = max_reads_per_s_per_bookie
        self._read_pacers: dict[Address, _Pacer] = {}
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_in_flight_per_bookie = max_in_flight_per_bookie
        self.max_in_flight = max_in_flight
        self.max_frame_size = max_frame_size
        self.tls = tls
        self._ssl_context = tls.context() if tls is not None else None  # ConfigError at once when unusable
        self._auth_reason = auth_required_reason(tls)
        self._txn_ids = itertools.count(1)
        self._connections: dict[Address, _Connection] = {}
        self._connecting: dict[Address, asyncio.Task[_Connection]] = {}
        self._bookie_permits: dict[Address, asyncio.Semaphore] = {}
        self._global_permits = asyncio.Semaphore(max_in_flight)
        self._closed = False

    @property
    def connection_count(self) -> int:
        """Open connections (at most one per bookie address)."""
        return sum(1 for connection in self._connections.values() if not connection.closed)

    def _next_txn_id(self) -> int:
        return next(self._txn_ids) & MAX_TXN_ID

    async def __aenter__(self) -> BookieClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every connection; requests still in flight end with :class:`ConnectionFailed`."""
        self._closed = True
        for attempt in self._connecting.values():
            attempt.cancel()
        connections = list(self._connections.values())
        self._connections.clear()
        await asyncio.gather(*(connection.close() for connection in connections))

    # -------------------------------------------------------------------------------------- public probes

    async def list_entries(self, address: str, ledger_id: int, timeout: float | None = None) -> ProbeResult:
        """``GET_LIST_OF_ENTRIES_OF_LEDGER``: which entries of ``ledger_id`` the bookie at ``address`` holds.

        Example:
            >>> # I/O: await client.list_entries("127.0.0.1:3181", 5, timeout=5.0)
            >>> # EntryList(availability=...) | NoLedger() | Timeout(timeout_s=5.0) | ConnectionFailed(...)
        """

        def build(txn_id: int) -> pb.Request:
            return list_entries_request(ledger_id, txn_id)

        def classify(response: pb.Response) -> ProbeResult:
            return classify_list_entries_response(response, ledger_id)

        return await self._probe(address, pb.GET_LIST_OF_ENTRIES_OF_LEDGER, build, classify, timeout)

    async def read_entry_exists(
        self, address: str, ledger_id: int, entry_id: int, timeout: float | None = None
    ) -> ProbeResult:
        """Plain ``READ_ENTRY`` (no master key, no fencing): does the bookie hold ``ledger_id:entry_id``?

        Example:
            >>> # I/O: await client.read_entry_exists("127.0.0.1:3181", 5, 0)
            >>> # EntryPresent(body_size=...) | NoEntry() | NoLedger() | Timeout(...) ...
        """

        def build(txn_id: int) -> pb.Request:
            return read_entry_request(ledger_id, entry_id, txn_id)

        def classify(response: pb.Response) -> ProbeResult:
            if entry_id == LAST_ADD_CONFIRMED:
                return classify_last_entry_response(response, ledger_id)
            return classify_read_entry_response(response, ledger_id, entry_id)

        return await self._probe(address, pb.READ_ENTRY, build, classify, timeout)

    async def probe(self, request: ProbeRequest, timeout: float | None = None) -> ProbeResult:
        """Run one :class:`ProbeRequest`.

        Example:
            >>> # I/O: await client.probe(ProbeRequest("127.0.0.1:3181", 5))
        """
        if request.entry_id is None:
            return await self.list_entries(request.address, request.ledger_id, timeout)
        return await self.read_entry_exists(request.address, request.ledger_id, request.entry_id, timeout)

    async def probe_many(
        self, requests: Iterable[ProbeRequest], concurrency: int = 64, timeout: float | None = None
    ) -> list[ProbeResult]:
        """Run many probes, ``concurrency`` at a time (within the client's limits); results in input order.

        Example:
            >>> # I/O: await client.probe_many([ProbeRequest("b1:3181", 5), ProbeRequest("b2:3181", 5)])
            >>> # [EntryList(...), Timeout(timeout_s=5.0)]
        """
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        work = list(requests)
        results: list[ProbeResult | None] = [None] * len(work)
        queue = iter(enumerate(work))  # shared by the workers; safe, since they run on one thread

        async def worker() -> None:
            for index, request in queue:
                results[index] = await self.probe(request, timeout)

        async with asyncio.TaskGroup() as group:
            for _ in range(min(concurrency, len(work))):
                group.create_task(worker())
        return cast(list[ProbeResult], results)  # every slot was filled, or the TaskGroup raised

    # -------------------------------------------------------------------------------------------- internals

    async def _probe(
        self,
        address: str,
        operation: int,
        build: Callable[[int], pb.Request],
        classify: Callable[[pb.Response], ProbeResult],
        timeout: float | None,
    ) -> ProbeResult:
        if self._closed:
            return ConnectionFailed("client closed")
        wait = self.timeout if timeout is None else timeout
        try:
            target = parse_bookie_address(address)
        except FormatError as err:
            return ConnectionFailed(str(err))
        if operation == pb.READ_ENTRY and self.max_reads_per_s_per_bookie is not None:
            pacer = self._read_pacers.get(target)
            if pacer is None:
                pacer = self._read_pacers[target] = _Pacer(self.max_reads_per_s_per_bookie)
            await pacer.wait()
        permits = self._bookie_permits.get(target)
        if permits is None:
            permits = self._bookie_permits[target] = asyncio.Semaphore(self.max_in_flight_per_bookie)
        # Per-bookie first: requests queued behind a silent bookie must not hold global permits.
        async with permits, self._global_permits:
            txn_id = self._next_txn_id()
            frame = encode_frame(build(txn_id))
            try:
                response = await self._round_trip(address, target, (txn_id, operation), frame, wait)
            except TimeoutError:
                return Timeout(wait)
            except BookieRefusedError as err:
                return TlsRefused(err.reason)
            except BookieConnectionError as err:
                return ConnectionFailed(str(err))
            except FormatError as err:
                return BadResponse(str(err))
        result = classify(response)
        return AuthRequired(self._auth_reason) if isinstance(result, AuthRequired) else result

    async def _round_trip(
        self, address: str, target: Address, key: _Key, frame: bytes, wait: float
    ) -> pb.Response:
        connection = await self._connection(address, target)
        return await connection.round_trip(key, frame, wait)

    async def _connection(self, address: str, target: Address) -> _Connection:
        connection = self._connections.get(target)
        if connection is not None and not connection.closed:
            return connection
        attempt = self._connecting.get(target)
        if attempt is None:
            # One connect attempt per bookie, shared by everyone waiting: a black-holed host costs one
            # connect timeout, not one per queued request. A task of its own, so a cancelled caller
            # cannot strand the others.
            attempt = asyncio.get_running_loop().create_task(self._open_and_register(address, target))
            attempt.add_done_callback(_consume_outcome)
            self._connecting[target] = attempt
        return await asyncio.shield(attempt)

    async def _open_and_register(self, address: str, target: Address) -> _Connection:
        try:
            connection = await self._open(address, target)
            self._connections[target] = connection
            return connection
        finally:
            self._connecting.pop(target, None)

    async def _open(self, address: str, target: Address) -> _Connection:
        host, port = target
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(host, port, limit=_READ_CHUNK)
        except TimeoutError:
            raise BookieConnectionError(
                f"{address}: connect timed out after {self.connect_timeout:g} s"
            ) from None
        except OSError as err:
            raise BookieConnectionError(f"{address}: cannot connect: {err.strerror or err}") from None
        logger.debug("bookie %s: connected", address)
        if self._ssl_context is None:
            return _Connection(address, reader, writer, self.max_frame_size)
        try:
            key = await self._start_tls(address, host, reader, writer, self._ssl_context)
        except BaseException:
            writer.close()
            raise
        return _Connection(address, reader, writer, self.max_frame_size, tls=self.tls, start_tls_key=key)

    async def _start_tls(
        self,
        address: str,
        host: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        context: ssl.SSLContext,
    ) -> _Key:
        """``START_TLS``, then the TLS handshake on the same connection; returns the request's key."""
        txn_id = self._next_txn_id()
        key = (txn_id, int(pb.START_TLS))
        has_cert = self.tls is not None and self.tls.has_client_cert
        try:
            async with asyncio.timeout(self.connect_timeout):
                writer.write(encode_frame(start_tls_request(txn_id)))
                await writer.drain()
                response = await self._first_answer(address, reader)
                if (response.header.txnId, int(response.header.operation)) != key:
                    raise BookieConnectionError(
                        f"{address}: answered START_TLS with another request's answer"
                    )
                if response.status != pb.EOK:
                    raise BookieRefusedError(
                        address,
                        f"the bookie does not offer TLS (START_TLS answered {status_name(response.status)}): "
                        "it has no tlsProviderFactoryClass, while bookie.tls is on",
                    )
                await writer.start_tls(context, server_hostname=host)
        except TimeoutError:
            raise BookieConnectionError(
                f"{address}: START_TLS and TLS handshake unfinished after {self.connect_timeout:g} s"
            ) from None
        except ssl.SSLError as err:
            raise BookieRefusedError(address, refusal_of(err, has_client_cert=has_cert)) from None
        except OSError as err:
            raise BookieConnectionError(f"{address}: connection lost at START_TLS: {err}") from None
        except FormatError as err:
            raise BookieConnectionError(f"{address}: undecodable answer to START_TLS: {err}") from None
        logger.debug("bookie %s: TLS established", address)
        return key

    async def _first_answer(self, address: str, reader: asyncio.StreamReader) -> pb.Response:
        decoder = FrameDecoder(self.max_frame_size)
        while True:
            data = await reader.read(_READ_CHUNK)
            if not data:
                raise BookieConnectionError(f"{address}: closed the connection at START_TLS")
            frames = decoder.feed(data)
            if frames:
                return parse_response(frames[0])


# ----------------------------------------------------------------------------------------- sync callers


class BlockingBookieClient:
    """A :class:`BookieClient` for synchronous code (Spark ``foreachBatch``), on a private loop in a thread.

    Connections persist between calls, so consecutive micro-batches reuse them. Works even when the caller's
    thread already runs an event loop. Keyword options are those of :class:`BookieClient`.

    Example:
        >>> with BlockingBookieClient(timeout=0.5) as client:
        ...     client.probe_many([])
        []
        >>> # I/O: client.list_entries("127.0.0.1:3181", 5) -> EntryList(...)
    """

    def __init__(self, **client_options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="bookie-client", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self._client: BookieClient = self._call(self._make_client(client_options))
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _make_client(options: dict[str, Any]) -> BookieClient:
        return BookieClient(**options)  # created on the loop's thread, where it will be used

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def list_entries(self, address: str, ledger_id: int, timeout: float | None = None) -> ProbeResult:
        """Blocking :meth:`BookieClient.list_entries`."""
        return self._call(self._client.list_entries(address, ledger_id, timeout))

    def read_entry_exists(
        self, address: str, ledger_id: int, entry_id: int, timeout: float | None = None
    ) -> ProbeResult:
        """Blocking :meth:`BookieClient.read_entry_exists`."""
        return self._call(self._client.read_entry_exists(address, ledger_id, entry_id, timeout))

    def probe_many(
        self, requests: Iterable[ProbeRequest], concurrency: int = 64, timeout: float | None = None
    ) -> list[ProbeResult]:
        """Blocking :meth:`BookieClient.probe_many`."""
        return self._call(self._client.probe_many(list(requests), concurrency, timeout))

    def close(self) -> None:
        """Close the connections and stop the private loop (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._client.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5.0)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> BlockingBookieClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def probe_ledger_entries_sync(
    targets: Iterable[tuple[str, int]] | Sequence[ProbeRequest],
    *,
    timeout: float = DEFAULT_PROBE_TIMEOUT_S,
    concurrency: int = 64,
    **client_options: Any,
) -> list[ProbeResult]:
    """One-shot, blocking ``GET_LIST_OF_ENTRIES_OF_LEDGER`` for each ``(address, ledger_id)``, in order.

    :class:`ProbeRequest` items are accepted too (with ``entry_id`` they become ``READ_ENTRY``). For repeated
    calls prefer one long-lived :class:`BlockingBookieClient`, which keeps its connections.

    Example:
        >>> probe_ledger_entries_sync([])
        []
        >>> # I/O: probe_ledger_entries_sync([("127.0.0.1:3181", 5)], timeout=2.0) -> [EntryList(...)]
    """
    requests = [
        item if isinstance(item, ProbeRequest) else ProbeRequest(item[0], item[1]) for item in targets
    ]
    with BlockingBookieClient(timeout=timeout, **client_options) as client:
        return client.probe_many(requests, concurrency)
