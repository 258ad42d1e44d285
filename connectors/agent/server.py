"""The agent's gRPC server: ``bkaudit.agent.BookieAgent`` over a :class:`DbStorageIndexReader`.

Every call must carry ``authorization: Bearer <token>`` (compared in constant time; a missing or wrong
token is ``UNAUTHENTICATED`` and the call never reaches the index). Requests are parsed by the service
itself so that any malformed or hostile request gets a clear status: ``INVALID_ARGUMENT`` for bytes that
are not the request message, a ledger id outside [0, 2^63 - 1], more ids than the per-call limit or a
negative page size; ``RESOURCE_EXHAUSTED`` (from gRPC) for a message above the size limit; ``DATA_LOSS``
for an index value that is not BookKeeper's layout; ``UNAVAILABLE`` when the index cannot be opened.
Answers hold entry ids, ledger ids and the fenced flag only: never entry data, a password or a master key.
TLS is on unless the caller explicitly asks for plaintext (loopback tests).

Example:
    >>> import tempfile
    >>> from connectors.agent.index import DbStorageIndexWriter
    >>> root = Path(tempfile.mkdtemp())
    >>> writer = DbStorageIndexWriter(root); writer.add_entries(4, [0, 1], master_key=b"k" * 20)
    >>> agent = start_agent_server(DbStorageIndexReader([root], refresh_s=0), "127.0.0.1:0", token="t0k",
    ...                            tls=None)
    >>> from connectors.agent.client import AgentClient
    >>> client = AgentClient(f"127.0.0.1:{agent.port}", token="t0k", insecure=True)
    >>> client.list_entries([4, 5])[4].availability.count, client.list_entries([5])[5].kind
    (2, 'agent_no_ledger')
    >>> client.close(); agent.stop(); writer.close()
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from connectors.agent.index import DbStorageIndexReader
from core.domain.dbstorage import checked_ledger_id, entry_runs
from core.errors import FormatError, ServiceError
from core.pb import bookie_agent_pb2 as pb

logger = logging.getLogger(__name__)

SERVICE_NAME = "bkaudit.agent.BookieAgent"
#: Ledger ids one ``ListEntries`` call may ask for.
MAX_LEDGERS_PER_CALL = 10_000
#: Ledger ids one ``ListLedgers`` page holds at most (and by default).
MAX_PAGE = 100_000
#: Largest request the server reads (ids are 1-10 bytes each: 10,000 of them fit easily).
MAX_REQUEST_BYTES = 256 * 1024
#: Largest answer (runs of a fragmented ledger can be long).
MAX_RESPONSE_BYTES = 64 * 1024 * 1024


class _Abort(Exception):
    """A request the service refuses, with the status and message the caller gets."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _parse(message_type: type[Message], data: bytes) -> Any:
    request = message_type()
    try:
        request.ParseFromString(data)
    except DecodeError:
        raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"request is not a {message_type.__name__}") from None
    return request


def _ledger_id(value: int) -> int:
    try:
        return checked_ledger_id(value)
    except FormatError as err:
        raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(err)) from None


class AgentService:
    """The two calls, on raw request bytes; raises :class:`_Abort` for what it refuses.

    Example:
        >>> AgentService.__name__
        'AgentService'
    """

    def __init__(self, reader: DbStorageIndexReader, *, max_ledgers_per_call: int = MAX_LEDGERS_PER_CALL):
        self.reader = reader
        self.max_ledgers_per_call = max_ledgers_per_call

    def list_entries(self, data: bytes) -> pb.ListEntriesResponse:
        request = _parse(pb.ListEntriesRequest, data)
        if len(request.ledger_ids) > self.max_ledgers_per_call:
            raise _Abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{len(request.ledger_ids)} ledger ids in one call; at most {self.max_ledgers_per_call}",
            )
        ids = [_ledger_id(value) for value in request.ledger_ids]
        return pb.ListEntriesResponse(ledgers=[self._entries(ledger_id) for ledger_id in ids])

    def _entries(self, ledger_id: int) -> pb.LedgerEntries:
        flags = self.reader.flags_of(ledger_id)
        if flags is None:
            return pb.LedgerEntries(ledger_id=ledger_id, holding=pb.LedgerEntries.NO_LEDGER)
        if flags.limbo:
            return pb.LedgerEntries(
                ledger_id=ledger_id, holding=pb.LedgerEntries.IN_LIMBO, fenced=flags.fenced
            )
        firsts, lasts = entry_runs(self.reader.entries_of(ledger_id))
        return pb.LedgerEntries(
            ledger_id=ledger_id,
            holding=pb.LedgerEntries.HOLDS,
            first=firsts.tolist(),
            last=lasts.tolist(),
            fenced=flags.fenced,
        )

    def list_ledgers(self, data: bytes) -> pb.ListLedgersResponse:
        request = _parse(pb.ListLedgersRequest, data)
        if request.limit < 0:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit must be >= 0, got {request.limit}")
        limit = min(request.limit or MAX_PAGE, MAX_PAGE)
        ids, more = self.reader.ledger_ids(max(request.after_ledger_id, -1), limit)
        return pb.ListLedgersResponse(ledger_ids=ids.tolist(), more=more)


def _bearer_token(context: grpc.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :]
    return None


def _unary(method: Callable[[bytes], Message], name: str, token: bytes) -> grpc.RpcMethodHandler:
    def handle(data: bytes, context: grpc.ServicerContext) -> bytes:
        given = _bearer_token(context)
        if given is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing bearer token (authorization metadata)")
        if not hmac.compare_digest((given or "").encode("utf-8"), token):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad bearer token")
        try:
            answer = method(data)
        except _Abort as err:
            context.abort(err.code, str(err))
        except FormatError as err:
            logger.error("%s: index value not in BookKeeper's layout: %s", name, err)
            context.abort(grpc.StatusCode.DATA_LOSS, f"index not in BookKeeper's layout: {err}")
        except ServiceError as err:
            logger.error("%s: %s", name, err)
            context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        logger.debug("%s from %s: %d bytes in, %d out", name, context.peer(), len(data), answer.ByteSize())
        return answer.SerializeToString()

    return grpc.unary_unary_rpc_method_handler(handle)  # raw bytes in and out: parsed in ``method``


@dataclass
class RunningAgent:
    """A started agent server: its bound port; :meth:`stop` ends it and closes the index."""

    server: grpc.Server
    port: int
    reader: DbStorageIndexReader

    def stop(self, grace_s: float = 1.0) -> None:
        self.server.stop(grace_s).wait()
        self.reader.close()

    def wait(self) -> None:
        self.server.wait_for_termination()


def start_agent_server(
    reader: DbStorageIndexReader,
    listen: str,
    *,
    token: str,
    tls: tuple[bytes, bytes] | None,
    max_workers: int = 4,
    max_ledgers_per_call: int = MAX_LEDGERS_PER_CALL,
) -> RunningAgent:
    """Serve ``reader`` on ``listen`` (``host:port``; port 0 picks one) with the bearer ``token``.

    ``tls`` is (certificate chain PEM, private key PEM); None serves plaintext, for loopback tests only.
    """
    if not token:
        raise ServiceError("the agent needs a non-empty bearer token")
    service = AgentService(reader, max_ledgers_per_call=max_ledgers_per_call)
    secret = token.encode("utf-8")
    handlers = {
        "ListEntries": _unary(service.list_entries, "ListEntries", secret),
        "ListLedgers": _unary(service.list_ledgers, "ListLedgers", secret),
    }
    server = grpc.server(
        ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="bkaudit-agent"),
        handlers=[grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)],
        options=[
            ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
            ("grpc.max_send_message_length", MAX_RESPONSE_BYTES),
        ],
    )
    if tls is None:
        port = server.add_insecure_port(listen)
    else:
        chain, key = tls
        port = server.add_secure_port(listen, grpc.ssl_server_credentials([(key, chain)]))
    if port == 0:
        raise ServiceError(f"agent: cannot listen on {listen}")
    server.start()
    logger.info("agent listening on %s (port %d, %s)", listen, port, "TLS" if tls else "plaintext")
    return RunningAgent(server, port, reader)


def read_token_file(path: Path) -> str:
    """The bearer token in ``path`` (surrounding whitespace removed); an empty file is an error.

    Example:
        >>> import tempfile
        >>> token_file = Path(tempfile.mkdtemp()) / "token"; _ = token_file.write_text("s3cret\\n")
        >>> read_token_file(token_file)
        's3cret'
    """
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as err:
        raise ServiceError(f"token file {path}: {err.strerror}") from None
    if not token:
        raise ServiceError(f"token file {path} is empty")
    return token
