"""An asyncio bookie that speaks enough of BookKeeper's v3 wire protocol for the simulator and the tests.

Answers ``GET_LIST_OF_ENTRIES_OF_LEDGER`` from a pluggable
:class:`EntryStore` (byte-exact availability, one group per run as a real bookie sends) and plain
``READ_ENTRY`` (entry -1, ``LAST_ADD_CONFIRMED``, answers the last entry held, whose header carries the LAC
its writer had when it sent it: that entry's id - 1, every earlier entry having been acknowledged);
optional auth gate (``EUA`` until an ``AUTH`` with the right plugin name); ``START_TLS`` when given a
server ``ssl.SSLContext`` (``EOK``, then the TLS handshake on the same connection, as a real bookie; a
context that requires client certificates refuses a client without one or with one its CA did not sign, or
an expired one); ``authorized_roles``, BookKeeper's ``BookieAuthZFactory``: every request is answered
``EUA`` until a TLS handshake whose client certificate carries one of the roles (``OU=0:<role>``), and an
unauthorized handshake answers the ``START_TLS`` again, ``EIO``; ``EBADVERSION``
for a non-v3 header; ``EBADREQ`` for operations it does not implement. It does not speak the v2 binary
protocol: a frame that is not a v3 ``Request`` closes the connection (a real bookie would switch to v2).

Answers echo the request's version, txnId and operation, with the top-level status equal to the inner one.
Requests on one connection are answered independently, so with delays they complete out of order, as on a
real bookie.

``answers_entry_lists=False`` makes a DbLedgerStorage bookie (Pulsar's default storage): it reads
``GET_LIST_OF_ENTRIES_OF_LEDGER`` and never answers it (the real storage throws and the request processor
sends nothing), while it answers ``READ_ENTRY`` as any bookie does.

Faults, per server, changeable at runtime from any thread (each change swaps an immutable snapshot under a
lock): ``silent`` (read requests, never answer: a DbLedgerStorage bookie asked for its entry list),
``delay_s`` / ``delay_jitter_s`` (slow answers), ``enoledger_for`` (ledgers always answered ``ENOLEDGER``),
``fail_status`` (every request answered with that status, e.g. ``EIO``), ``refuse`` (close connections at
once).

Example:
    >>> store = InMemoryEntryStore()
    >>> store.add_entries(5, [0, 1, 2])
    >>> sorted(store.entries_of(5)), store.entries_of(6)
    ([0, 1, 2], None)
    >>> # I/O, from synchronous code:
    >>> # with BookieServer(store) as server:          # runs in a background thread
    >>> #     probe_ledger_entries_sync([(server.address, 5)])  -> [EntryList(...)]
    >>> #     server.silent = True                                -> later probes time out
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto as sslproto
import contextlib
import dataclasses
import logging
import random
import socket
import ssl
import threading
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Protocol

from connectors.bookie.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    LAST_ADD_CONFIRMED,
    VERSION_THREE,
    FrameDecoder,
    auth_response,
    encode_entry_header,
    encode_frame,
    list_entries_response,
    operation_name,
    parse_request,
    read_entry_response,
    start_tls_response,
    status_response,
)
from connectors.bookie.tls import certificate_roles
from core.domain.availability import encode_availability
from core.errors import FormatError, ServiceError
from core.pb import bookkeeper_protocol_pb2 as pb

logger = logging.getLogger(__name__)

DEFAULT_AUTH_PLUGIN_NAME = "BkauditSimAuthPlugin"
"""Plugin name the server expects in ``AUTH`` requests when ``require_auth`` is on."""

_READ_CHUNK = 256 * 1024
_ENCODED_CACHE_SIZE = 4096  # distinct entry sets whose availability bytes are kept


# ------------------------------------------------------------------------------------------------- stores


class EntryStore(Protocol):
    """What a bookie holds: the entry ids of a ledger, or None when it has no such ledger (``ENOLEDGER``).

    Called on the server's event loop thread; implementations shared with other threads must lock.

    Example:
        >>> class Fixed:
        ...     def entries_of(self, ledger_id: int) -> set[int] | None:
        ...         return {0, 1} if ledger_id == 1 else None
        >>> isinstance(Fixed().entries_of(1), set)
        True
    """

    def entries_of(self, ledger_id: int) -> AbstractSet[int] | None:
        """Entry ids held for ``ledger_id``, or None when the ledger is unknown to this bookie."""
        ...


class InMemoryEntryStore:
    """A thread-safe :class:`EntryStore` in a dict, for the simulator and tests.

    A ledger can exist with no entries (``create_ledger``): it answers ``EOK`` with an empty list, while an
    unknown ledger answers ``ENOLEDGER``.

    Example:
        >>> store = InMemoryEntryStore()
        >>> store.add_entries(7, range(5))
        >>> store.drop_entries(7, [1, 3])
        >>> sorted(store.entries_of(7))
        [0, 2, 4]
        >>> store.create_ledger(8)
        >>> store.entries_of(8), store.ledger_ids()
        (frozenset(), [7, 8])
        >>> store.drop_ledger(7), store.drop_ledger(7), store.entries_of(7)
        (True, False, None)
    """

    def __init__(self) -> None:
        self._ledgers: dict[int, set[int]] = {}
        # Frozen snapshots handed out until the ledger changes: the same object each time, so its hash is
        # computed once and the server's encoding cache hits (see BookieServer._availability_bytes).
        self._snapshots: dict[int, frozenset[int]] = {}
        self._lock = threading.Lock()

    def create_ledger(self, ledger_id: int) -> None:
        """Make ``ledger_id`` known (no entries yet); a no-op when it exists."""
        with self._lock:
            self._ledgers.setdefault(ledger_id, set())
            self._snapshots.pop(ledger_id, None)

    def add_entries(self, ledger_id: int, entry_ids: Iterable[int]) -> None:
        """Add ``entry_ids`` to ``ledger_id``, creating the ledger when needed."""
        ids = list(entry_ids)
        with self._lock:
            self._ledgers.setdefault(ledger_id, set()).update(ids)
            self._snapshots.pop(ledger_id, None)

    def drop_entries(self, ledger_id: int, entry_ids: Iterable[int]) -> None:
        """Forget ``entry_ids`` of ``ledger_id`` (the ledger stays known, possibly empty)."""
        ids = list(entry_ids)
        with self._lock:
            held = self._ledgers.get(ledger_id)
            if held is not None:
                held.difference_update(ids)
            self._snapshots.pop(ledger_id, None)

    def drop_ledger(self, ledger_id: int) -> bool:
        """Forget ``ledger_id`` entirely (it then answers ``ENOLEDGER``); True when it was there."""
        with self._lock:
            self._snapshots.pop(ledger_id, None)
            return self._ledgers.pop(ledger_id, None) is not None

    def entries_of(self, ledger_id: int) -> frozenset[int] | None:
        """A snapshot of the entries held for ``ledger_id``, or None when unknown."""
        with self._lock:
            snapshot = self._snapshots.get(ledger_id)
            if snapshot is None:
                held = self._ledgers.get(ledger_id)
                if held is None:
                    return None
                snapshot = self._snapshots[ledger_id] = frozenset(held)
            return snapshot

    def ledger_ids(self) -> list[int]:
        """Known ledger ids, ascending."""
        with self._lock:
            return sorted(self._ledgers)


# ---------------------------------------------------------------------------------------------------- TLS


class _AlertingSSLProtocol(sslproto.SSLProtocol):
    """asyncio's server-side TLS, except that a failed handshake still sends its alert (asyncio closes the
    socket with the alert unsent), as a real bookie's Netty does: clients learn why they were refused."""

    def _on_handshake_complete(self, handshake_exc: BaseException | None) -> None:
        if handshake_exc is not None:
            with contextlib.suppress(Exception):
                self._process_outgoing()  # type: ignore[attr-defined]
        super()._on_handshake_complete(handshake_exc)


async def _start_tls_server_side(writer: asyncio.StreamWriter, context: ssl.SSLContext) -> None:
    """``StreamWriter.start_tls`` on the server side with :class:`_AlertingSSLProtocol` (the body of
    ``loop.start_tls``, which has no protocol hook)."""
    await writer.drain()
    loop = asyncio.get_running_loop()
    transport: Any = writer.transport
    protocol: Any = writer._protocol  # type: ignore[attr-defined]
    waiter = loop.create_future()
    ssl_protocol = _AlertingSSLProtocol(
        loop, protocol, context, waiter, True, None, call_connection_made=False
    )
    transport.pause_reading()
    transport.set_protocol(ssl_protocol)
    made = loop.call_soon(ssl_protocol.connection_made, transport)
    resumed = loop.call_soon(transport.resume_reading)
    try:
        await waiter
    except BaseException:
        transport.close()
        made.cancel()
        resumed.cancel()
        raise
    writer._transport = ssl_protocol._app_transport  # type: ignore[attr-defined]
    protocol._replace_writer(writer)


# ------------------------------------------------------------------------------------------------- faults


@dataclass(frozen=True)
class BookieFaults:
    """How a simulated bookie misbehaves; immutable, swapped whole so readers never see half a change.

    Example:
        >>> BookieFaults(silent=True).silent, BookieFaults(enoledger_for=frozenset({5})).enoledger_for
        (True, frozenset({5}))
    """

    silent: bool = False
    #: Drop this many more requests, then answer again: a silence that ends by count, not by the clock.
    drop_next: int = 0
    delay_s: float = 0.0
    delay_jitter_s: float = 0.0
    enoledger_for: frozenset[int] = frozenset()
    fail_status: int | None = None
    refuse: bool = False


@dataclass
class ServerStats:
    """Counters of one server (updated on its loop thread; reading them from elsewhere is fine).

    Example:
        >>> ServerStats().requests_received
        0
    """

    connections_accepted: int = 0
    requests_received: int = 0
    responses_sent: int = 0
    requests_dropped: int = 0  # by ``drop_next``


def _fault_property(name: str, doc: str) -> property:
    def get(self: BookieServer) -> Any:
        return getattr(self.faults, name)

    def set_(self: BookieServer, value: Any) -> None:
        self.set_faults(**{name: value})

    return property(get, set_, doc=doc)


# ------------------------------------------------------------------------------------------------- server


class BookieServer:
    """A simulated bookie on ``host:port`` (``port=0``: pick a free one; kept across restarts).

    Async use: ``await server.start()`` / ``await server.stop()`` (or ``async with``). Sync use:
    ``with server:`` or ``start_background()`` / ``stop_background()``, which run it on a private loop in a
    daemon thread.

    Example:
        >>> server = BookieServer(InMemoryEntryStore(), require_auth=True)
        >>> server.enoledger_for = {5}
        >>> server.faults.enoledger_for, server.running
        (frozenset({5}), False)
        >>> # I/O:
        >>> # with BookieServer(store, port=0) as server:   # background thread
        >>> #     server.address                           -> '127.0.0.1:43121'
        >>> #     server.fail_status = frames.EIO          -> every request answered EIO
    """

    silent = _fault_property("silent", "Read requests but never answer (the DbLedgerStorage bookie).")
    drop_next = _fault_property("drop_next", "Read and drop this many more requests, then answer again.")
    delay_s = _fault_property("delay_s", "Seconds before every answer.")
    delay_jitter_s = _fault_property(
        "delay_jitter_s", "Extra uniform random delay in [0, jitter) per answer."
    )
    enoledger_for = _fault_property("enoledger_for", "Ledger ids always answered ENOLEDGER.")
    fail_status = _fault_property("fail_status", "When set, every request is answered with this status.")
    refuse = _fault_property(
        "refuse", "Close every connection at once (new ones and, on their next request, old ones)."
    )

    def __init__(
        self,
        store: EntryStore,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        require_auth: bool = False,
        auth_plugin_name: str = DEFAULT_AUTH_PLUGIN_NAME,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        answers_entry_lists: bool = True,
        tls: ssl.SSLContext | None = None,
        authorized_roles: Iterable[str] | None = None,
    ) -> None:
        self.store = store
        self.tls = tls
        self.authorized_roles = frozenset(authorized_roles) if authorized_roles is not None else None
        self.answers_entry_lists = answers_entry_lists
        self.host = host
        self.port = port
        self.require_auth = require_auth
        self.auth_plugin_name = auth_plugin_name
        self.max_frame_size = max_frame_size
        self.stats = ServerStats()
        self._faults = BookieFaults()
        self._faults_lock = threading.Lock()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._encoded: dict[frozenset[int], bytes] = {}
        self._outgoing: dict[asyncio.StreamWriter, list[bytes]] = {}
        self._reserved: socket.socket | None = None  # a stopped server's port, bound but not listening

    # ----------------------------------------------------------------------------------------- faults

    @property
    def faults(self) -> BookieFaults:
        """The current fault snapshot."""
        return self._faults

    def set_faults(self, **changes: Any) -> BookieFaults:
        """Change some faults atomically (any thread); returns the new snapshot.

        Example:
            >>> server = BookieServer(InMemoryEntryStore())
            >>> server.set_faults(delay_s=0.2, enoledger_for=[1, 2]).enoledger_for
            frozenset({1, 2})
        """
        if "enoledger_for" in changes:
            changes["enoledger_for"] = frozenset(changes["enoledger_for"] or ())
        with self._faults_lock:
            self._faults = dataclasses.replace(self._faults, **changes)
            return self._faults

    def clear_faults(self) -> None:
        """Back to a healthy bookie.

        Example:
            >>> server = BookieServer(InMemoryEntryStore())
            >>> server.silent = True
            >>> server.clear_faults(); server.silent
            False
        """
        with self._faults_lock:
            self._faults = BookieFaults()

    # ------------------------------------------------------------------------------------ lifecycle

    @property
    def running(self) -> bool:
        """True while listening."""
        return self._server is not None

    @property
    def address(self) -> str:
        """``host:port`` as a bookie id (the port is the bound one once started)."""
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        """Listen on ``host:port`` (the same port again after a :meth:`stop`)."""
        if self._server is not None:
            return
        reserved, self._reserved = self._reserved, None
        try:
            if reserved is not None:
                self._server = await asyncio.start_server(
                    self._serve_connection, sock=reserved, limit=_READ_CHUNK
                )
            else:
                self._server = await asyncio.start_server(
                    self._serve_connection, self.host, self.port, limit=_READ_CHUNK, reuse_address=True
                )
        except OSError as err:
            raise ServiceError(
                f"bookie server: cannot listen on {self.host}:{self.port}: {err.strerror}"
            ) from None
        self.port = int(self._server.sockets[0].getsockname()[1])
        logger.info("simulated bookie listening on %s", self.address)

    async def stop(self, *, keep_port: bool = True) -> None:
        """Stop listening and drop every connection (clients see them close, new ones are refused).

        With ``keep_port`` the port stays bound, not listening, until the next :meth:`start`: a connection
        is still refused, as by a dead bookie, and no other socket (another service, a client's ephemeral
        port) can take the port meanwhile, so the restart gets it back.
        """
        server, self._server = self._server, None
        if server is None:
            if not keep_port:
                self._release_port()
            return
        server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        self._outgoing.clear()
        with contextlib.suppress(Exception):
            await server.wait_closed()
        if keep_port:
            self._reserve_port()
        logger.info("simulated bookie %s stopped", self.address)

    def _reserve_port(self) -> None:
        reserved = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            reserved.bind((self.host, self.port))
        except OSError:  # taken in the moment since the close: the restart reports it
            reserved.close()
            return
        self._reserved = reserved

    def _release_port(self) -> None:
        reserved, self._reserved = self._reserved, None
        if reserved is not None:
            reserved.close()

    async def __aenter__(self) -> BookieServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop(keep_port=False)

    def start_background(self) -> BookieServer:
        """Start on a private event loop in a daemon thread; returns self once listening."""
        if self._thread is not None:
            return self
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=f"bookie-server-{self.port}", daemon=True)
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.start(), loop).result(timeout=10)
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            loop.close()
            raise
        self._loop, self._thread = loop, thread
        return self

    def stop_background(self, *, keep_port: bool = True) -> None:
        """Stop a server started with :meth:`start_background` (idempotent); it can be started again
        (``keep_port``: see :meth:`stop`)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self.stop(keep_port=keep_port), loop).result(timeout=10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            if not thread.is_alive():
                loop.close()
            self._loop = self._thread = None

    def __enter__(self) -> BookieServer:
        return self.start_background()

    def __exit__(self, *exc_info: object) -> None:
        self.stop_background(keep_port=False)

    # ------------------------------------------------------------------------------------ connections

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.connections_accepted += 1
        if self.faults.refuse:
            writer.transport.abort()
            return
        self._writers.add(writer)
        decoder = FrameDecoder(self.max_frame_size)
        authenticated = not self.require_auth and self.authorized_roles is None
        try:
            while True:
                data = await reader.read(_READ_CHUNK)
                if not data:
                    return
                try:
                    frames = decoder.feed(data)
                except FormatError as err:
                    logger.warning("simulated bookie %s: closing connection: %s", self.address, err)
                    return
                for frame in frames:
                    self.stats.requests_received += 1
                    if self.faults.refuse:
                        return
                    try:
                        request = parse_request(frame)
                    except FormatError as err:
                        # A real bookie would fall back to the v2 protocol here; we only speak v3.
                        logger.warning(
                            "simulated bookie %s: not a v3 request, closing: %s", self.address, err
                        )
                        return
                    if request.header.operation == pb.START_TLS and request.HasField("startTLSRequest"):
                        if not await self._start_tls(writer, request):
                            return
                        authenticated = authenticated or self._authorized(writer, request)
                        continue
                    if self.require_auth and request.header.operation == pb.AUTH:
                        authenticated = self._authenticate(writer, request) or authenticated
                        continue
                    if not authenticated:
                        # BookKeeper's AuthHandler: header echoed, status EUA, no inner answer.
                        self._send(writer, status_response(request.header, pb.EUA))
                        continue
                    self._dispatch(writer, request)
                await writer.drain()  # flow control: stop reading while the client is not reading answers
        except (OSError, asyncio.CancelledError):
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _start_tls(self, writer: asyncio.StreamWriter, request: pb.Request) -> bool:
        """Answer ``START_TLS`` and run the handshake; False when the connection must close."""
        if self.tls is None:  # BookieRequestProcessor: "Got StartTLS request but TLS not configured"
            self._send(writer, start_tls_response(request.header, pb.EBADREQ))
            return True
        self._flush(writer)  # answers queued before this one leave in plaintext, in order
        writer.write(encode_frame(start_tls_response(request.header, pb.EOK)))
        self.stats.responses_sent += 1
        try:
            await _start_tls_server_side(writer, self.tls)
        except (ssl.SSLError, OSError) as err:
            logger.info("simulated bookie %s: TLS handshake failed: %s", self.address, err)
            return False
        return True

    def _authorized(self, writer: asyncio.StreamWriter, request: pb.Request) -> bool:
        """BookieAuthZFactory after the handshake: authorized when the certificate's role is allowed."""
        if self.authorized_roles is None:
            return False
        roles = certificate_roles(writer.get_extra_info("peercert"))
        if roles and roles[0] in self.authorized_roles:
            return True
        logger.info("simulated bookie %s: AuthZ failed (roles %s)", self.address, roles)
        self._send(writer, status_response(request.header, pb.EIO))
        return False

    def _authenticate(self, writer: asyncio.StreamWriter, request: pb.Request) -> bool:
        """Accept any payload for the expected plugin name (enough to exercise the EUA path)."""
        plugin = request.authRequest.authPluginName
        if plugin != self.auth_plugin_name:
            self._send(writer, status_response(request.header, pb.EUA))
            return False
        self._send(writer, auth_response(request.header, pb.EOK, plugin, b""))
        return True

    def _dispatch(self, writer: asyncio.StreamWriter, request: pb.Request) -> None:
        faults = self.faults
        if faults.silent or self._unanswered(request) or self._dropped():
            return
        delay = faults.delay_s + (
            random.uniform(0.0, faults.delay_jitter_s) if faults.delay_jitter_s else 0.0
        )
        if delay <= 0:
            self._send(writer, self._answer(request, faults))
            return
        task = asyncio.get_running_loop().create_task(self._answer_later(writer, request, delay))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _dropped(self) -> bool:
        """Whether this request is one of the ``drop_next`` to drop (counted down atomically)."""
        with self._faults_lock:
            if self._faults.drop_next <= 0:
                return False
            self._faults = dataclasses.replace(self._faults, drop_next=self._faults.drop_next - 1)
        self.stats.requests_dropped += 1
        return True

    def _unanswered(self, request: pb.Request) -> bool:
        """A DbLedgerStorage bookie's silence: the entry-list request is read and dropped."""
        return not self.answers_entry_lists and request.header.operation == pb.GET_LIST_OF_ENTRIES_OF_LEDGER

    async def _answer_later(self, writer: asyncio.StreamWriter, request: pb.Request, delay: float) -> None:
        await asyncio.sleep(delay)
        faults = self.faults  # the faults at answering time: a bookie can go silent mid-request
        if not faults.silent and not writer.is_closing():
            self._send(writer, self._answer(request, faults))

    def _send(self, writer: asyncio.StreamWriter, response: pb.Response) -> None:
        if writer.is_closing():
            return
        # Answers produced in the same loop iteration leave in one send() (one syscall per frame is costly).
        outgoing = self._outgoing.setdefault(writer, [])
        outgoing.append(encode_frame(response))
        if len(outgoing) == 1:
            asyncio.get_running_loop().call_soon(self._flush, writer)
        self.stats.responses_sent += 1

    def _flush(self, writer: asyncio.StreamWriter) -> None:
        outgoing = self._outgoing.pop(writer, None)
        if outgoing and not writer.is_closing():
            writer.write(b"".join(outgoing))

    # ---------------------------------------------------------------------------------------- answers

    def _answer(self, request: pb.Request, faults: BookieFaults) -> pb.Response:
        header = request.header
        operation = header.operation
        if header.version != VERSION_THREE:
            return self._answer_with_status(request, pb.EBADVERSION)
        if faults.fail_status is not None:
            return self._answer_with_status(request, faults.fail_status)
        if operation == pb.GET_LIST_OF_ENTRIES_OF_LEDGER and request.HasField(
            "getListOfEntriesOfLedgerRequest"
        ):
            ledger_id = request.getListOfEntriesOfLedgerRequest.ledgerId
            held = None if ledger_id in faults.enoledger_for else self.store.entries_of(ledger_id)
            if held is None:
                return list_entries_response(header, ledger_id, pb.ENOLEDGER)
            return list_entries_response(header, ledger_id, pb.EOK, self._availability_bytes(held))
        if operation == pb.READ_ENTRY and request.HasField("readRequest"):
            ledger_id, entry_id = request.readRequest.ledgerId, request.readRequest.entryId
            held = None if ledger_id in faults.enoledger_for else self.store.entries_of(ledger_id)
            if held is None:
                return read_entry_response(header, ledger_id, entry_id, pb.ENOLEDGER)
            if entry_id == LAST_ADD_CONFIRMED:
                return self._last_entry(header, ledger_id, held)
            if entry_id not in held:
                return read_entry_response(header, ledger_id, entry_id, pb.ENOENTRY)
            # A stand-in body: a real entry carries BookKeeper's entry header and digest.
            body = f"bkaudit-sim ledger={ledger_id} entry={entry_id}".encode()
            return read_entry_response(header, ledger_id, entry_id, pb.EOK, body)
        logger.debug("simulated bookie %s: unsupported %s", self.address, operation_name(operation))
        return status_response(header, pb.EBADREQ)

    @staticmethod
    def _last_entry(header: pb.BKPacketHeader, ledger_id: int, held: AbstractSet[int]) -> pb.Response:
        """The answer to a read of entry -1: the last entry held, its header carrying LAC = its id - 1."""
        if not held:
            return read_entry_response(header, ledger_id, LAST_ADD_CONFIRMED, pb.ENOENTRY)
        last = max(held)
        payload = f"bkaudit-sim ledger={ledger_id} entry={last}".encode()
        body = encode_entry_header(ledger_id, last, last - 1, len(payload)) + payload
        return read_entry_response(header, ledger_id, LAST_ADD_CONFIRMED, pb.EOK, body)

    def _availability_bytes(self, held: AbstractSet[int]) -> bytes:
        """Encode an entry set, caching by frozen set: encoding is the costliest step of an answer."""
        if not isinstance(held, frozenset):
            return encode_availability(held)
        encoded = self._encoded.get(held)
        if encoded is None:
            if len(self._encoded) >= _ENCODED_CACHE_SIZE:
                self._encoded.pop(next(iter(self._encoded)))  # oldest first: dicts keep insertion order
            encoded = self._encoded[held] = encode_availability(held)
        return encoded

    @staticmethod
    def _answer_with_status(request: pb.Request, status: int) -> pb.Response:
        header = request.header
        if header.operation == pb.GET_LIST_OF_ENTRIES_OF_LEDGER and request.HasField(
            "getListOfEntriesOfLedgerRequest"
        ):
            return list_entries_response(header, request.getListOfEntriesOfLedgerRequest.ledgerId, status)
        if header.operation == pb.READ_ENTRY and request.HasField("readRequest"):
            read = request.readRequest
            return read_entry_response(header, read.ledgerId, read.entryId, status)
        return status_response(header, status)
