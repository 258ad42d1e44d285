"""Frame codec for BookKeeper's v3 wire protocol: length-prefixed protobuf ``Request``/``Response`` messages.

Covers what the auditor and the simulator need (GET_LIST_OF_ENTRIES_OF_LEDGER, READ_ENTRY,
START_TLS, AUTH and status-only answers). Pure code: no sockets, no event loop, no clock.

On the wire every message is a 4-byte big-endian length followed by that many bytes
of serialized protobuf; there is no magic number and no version byte outside the protobuf. BookKeeper reads it
with Netty's ``LengthFieldBasedFrameDecoder(maxFrameSize, 0, 4, 0, 4)``, whose limit applies to the length
field *plus* the 4 prefix bytes, with ``nettyMaxFrameSizeBytes`` = 5 MB by default; :class:`FrameDecoder`
applies the same rule.

Everything that reads bytes from a peer raises :class:`~core.errors.FormatError` (and nothing else) for
bad input, with a one-line reason.

Example:
    >>> request = list_entries_request(ledger_id=5, txn_id=1)
    >>> encode_frame(request).hex(" ")
    '00 00 00 0d 0a 06 08 03 10 0b 18 01 e2 06 02 08 05'
    >>> decoder = FrameDecoder()
    >>> frames = decoder.feed(encode_frame(request) + b"\\x00\\x00")  # one frame and 2 bytes of the next
    >>> parse_request(frames[0]).getListOfEntriesOfLedgerRequest.ledgerId, decoder.buffered
    (5, 2)
"""

from __future__ import annotations

import struct
from typing import TypeVar

from google.protobuf import message as protobuf_message
from google.protobuf import unknown_fields

from core.errors import FormatError
from core.pb import bookkeeper_protocol_pb2 as pb

LENGTH_PREFIX_SIZE = 4
"""Bytes of the big-endian length field in front of every message."""

DEFAULT_MAX_FRAME_SIZE = 5 * 1024 * 1024
"""BookKeeper's ``nettyMaxFrameSizeBytes`` default (5 MB); counts the 4 prefix bytes, like Netty does."""

VERSION_THREE = pb.VERSION_THREE
"""The only protocol version a v3 request may carry; anything else is answered ``EBADVERSION``."""

MAX_TXN_ID = 2**64 - 1
"""``txnId`` is a uint64."""

_LENGTH = struct.Struct(">i")  # signed on purpose: Java reads an int, and a negative length is an error

LAST_ADD_CONFIRMED = -1
"""BookieProtocol's entry id of a ``READ_ENTRY`` for the bookie's last entry (``readLastAddConfirmed``)."""

ENTRY_HEADER_SIZE = 32
"""An entry as stored and read starts with ledger id, entry id, last add confirmed and length (int64 each)."""

_ENTRY_HEADER = struct.Struct(">qqqq")

Message = TypeVar("Message", pb.Request, pb.Response)


def status_name(status: int) -> str:
    """The symbolic name of a BookKeeper status code, or ``"status <n>"`` for a code this build does not know.

    Example:
        >>> status_name(402), status_name(0), status_name(999)
        ('ENOLEDGER', 'EOK', 'status 999')
    """
    try:
        return pb.StatusCode.Name(status)
    except ValueError:
        return f"status {status}"


def operation_name(operation: int) -> str:
    """The symbolic name of an operation type, or ``"operation <n>"`` when unknown.

    Example:
        >>> operation_name(11), operation_name(1), operation_name(77)
        ('GET_LIST_OF_ENTRIES_OF_LEDGER', 'READ_ENTRY', 'operation 77')
    """
    try:
        return pb.OperationType.Name(operation)
    except ValueError:
        return f"operation {operation}"


# --------------------------------------------------------------------------------------------------- framing


def encode_frame(message: pb.Request | pb.Response | bytes) -> bytes:
    """The bytes to write on the socket: 4-byte big-endian length, then the serialized message.

    Example:
        >>> encode_frame(b"\\x01\\x02").hex()
        '000000020102'
    """
    body = message if isinstance(message, bytes) else message.SerializeToString()
    return _LENGTH.pack(len(body)) + body


class FrameDecoder:
    """Incremental splitter of a byte stream into frame bodies (length prefix removed).

    Feed it whatever the socket returned; it returns every frame completed so far and keeps the rest. A bad
    length (negative, or over ``max_frame_size`` counting the prefix) raises :class:`FormatError`; the stream
    cannot be re-synchronised after that (there are no frame markers), so the decoder stays failed and every
    later :meth:`feed` raises the same error: close the connection.

    Example:
        >>> decoder = FrameDecoder(max_frame_size=16)
        >>> decoder.feed(b"\\x00\\x00"), decoder.feed(b"\\x00\\x01A\\x00"), decoder.buffered
        ([], [b'A'], 1)
        >>> decoder.feed(b"\\x00\\x00\\x20")
        Traceback (most recent call last):
        ...
        core.errors.FormatError: frame: length 32 (+4 prefix bytes) exceeds the maximum frame size 16
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < LENGTH_PREFIX_SIZE:
            raise ValueError(f"max_frame_size must be at least {LENGTH_PREFIX_SIZE}, got {max_frame_size}")
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()
        self._error: FormatError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received that do not yet form a complete frame."""
        return len(self._buffer)

    @property
    def failed(self) -> bool:
        """True once a bad length was seen; the stream is unusable from then on."""
        return self._error is not None

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Append ``data`` and return the bodies of all frames now complete, in order."""
        if self._error is not None:
            raise self._error
        self._buffer += data
        frames: list[bytes] = []
        offset = 0
        buffer = self._buffer
        while len(buffer) - offset >= LENGTH_PREFIX_SIZE:
            (length,) = _LENGTH.unpack_from(buffer, offset)
            if length < 0:
                self._error = FormatError(f"frame: negative length {length}")
            elif length + LENGTH_PREFIX_SIZE > self.max_frame_size:
                self._error = FormatError(
                    f"frame: length {length} (+{LENGTH_PREFIX_SIZE} prefix bytes) exceeds the maximum frame "
                    f"size {self.max_frame_size}"
                )
            if self._error is not None:
                self._buffer = bytearray()
                raise self._error
            end = offset + LENGTH_PREFIX_SIZE + length
            if end > len(buffer):
                break
            frames.append(bytes(buffer[offset + LENGTH_PREFIX_SIZE : end]))
            offset = end
        if offset:
            # One slice deletion per feed, not per frame: keeps pipelined bursts linear.
            del buffer[:offset]
        return frames


# ------------------------------------------------------------------------------------------ request builders


def _header(operation: int, txn_id: int, version: int = VERSION_THREE) -> pb.BKPacketHeader:
    if not 0 <= txn_id <= MAX_TXN_ID:
        raise ValueError(f"txn_id must be a uint64, got {txn_id}")
    return pb.BKPacketHeader(version=version, operation=operation, txnId=txn_id)  # type: ignore[arg-type]


def list_entries_request(ledger_id: int, txn_id: int, version: int = VERSION_THREE) -> pb.Request:
    """A ``GET_LIST_OF_ENTRIES_OF_LEDGER`` (op 11) request, as BookKeeper's client builds it (no priority).

    Example:
        >>> list_entries_request(5, 1).SerializeToString().hex(" ")
        '0a 06 08 03 10 0b 18 01 e2 06 02 08 05'
    """
    request = pb.Request(header=_header(pb.GET_LIST_OF_ENTRIES_OF_LEDGER, txn_id, version))
    request.getListOfEntriesOfLedgerRequest.ledgerId = ledger_id
    return request


def read_entry_request(
    ledger_id: int, entry_id: int, txn_id: int, version: int = VERSION_THREE
) -> pb.Request:
    """A plain ``READ_ENTRY`` (op 1) request: no fencing flag and no master key (a plain read needs none).

    Example:
        >>> request = read_entry_request(5, 7, txn_id=2)
        >>> read = request.readRequest
        >>> request.header.operation == READ_ENTRY, read.entryId, read.HasField("masterKey")
        (True, 7, False)
    """
    request = pb.Request(header=_header(pb.READ_ENTRY, txn_id, version))
    request.readRequest.ledgerId = ledger_id
    request.readRequest.entryId = entry_id
    return request


def auth_request(plugin_name: str, payload: bytes, txn_id: int) -> pb.Request:
    """An ``AUTH`` (op 5) request carrying one message of the named auth plugin's exchange.

    Example:
        >>> auth_request("AuthDisabledPlugin", b"", 3).authRequest.authPluginName
        'AuthDisabledPlugin'
    """
    request = pb.Request(header=_header(pb.AUTH, txn_id))
    request.authRequest.authPluginName = plugin_name
    request.authRequest.payload = payload
    return request


def start_tls_request(txn_id: int) -> pb.Request:
    """A ``START_TLS`` (op 9) request: after its ``EOK`` answer both ends run the TLS handshake on the same
    connection (BookKeeper's ``PerChannelBookieClient.initiateTLS``).

    Example:
        >>> start_tls_request(4).SerializeToString().hex(" ")
        '0a 06 08 03 10 09 18 04 d2 06 00'
    """
    request = pb.Request(header=_header(pb.START_TLS, txn_id))
    request.startTLSRequest.SetInParent()
    return request


# ----------------------------------------------------------------------------------------- response builders


def _response_header(request_header: pb.BKPacketHeader) -> pb.BKPacketHeader:
    # BookKeeper echoes the request's version, operation and txnId (PacketProcessorBaseV3.getHeader).
    return pb.BKPacketHeader(
        version=request_header.version, operation=request_header.operation, txnId=request_header.txnId
    )


def status_response(request_header: pb.BKPacketHeader, status: int) -> pb.Response:
    """A response carrying only a top-level status, as BookKeeper's AuthHandler sends ``EUA``.

    Example:
        >>> header = list_entries_request(5, 1).header
        >>> response = status_response(header, EUA)
        >>> response.status == EUA, response.header.txnId, response.HasField("readResponse")
        (True, 1, False)
    """
    return pb.Response(header=_response_header(request_header), status=status)  # type: ignore[arg-type]


def list_entries_response(
    request_header: pb.BKPacketHeader, ledger_id: int, status: int, availability: bytes | None = None
) -> pb.Response:
    """A ``GET_LIST_OF_ENTRIES_OF_LEDGER`` answer; top-level status equals the inner one, as in BookKeeper.

    ``availability`` (the §5.1 bytes) goes with ``EOK``; ``ENOLEDGER``, ``EIO``, ``EBADVERSION`` carry none.

    Example:
        >>> header = list_entries_request(5, 1).header
        >>> list_entries_response(header, 5, ENOLEDGER).SerializeToString().hex(" ")
        '0a 06 08 03 10 0b 18 01 10 92 03 e2 06 05 08 92 03 10 05'
    """
    response = status_response(request_header, status)
    inner = response.getListOfEntriesOfLedgerResponse
    inner.status = status  # type: ignore[assignment]
    inner.ledgerId = ledger_id
    if availability is not None:
        inner.availabilityOfEntriesOfLedger = availability
    return response


def read_entry_response(
    request_header: pb.BKPacketHeader, ledger_id: int, entry_id: int, status: int, body: bytes | None = None
) -> pb.Response:
    """A ``READ_ENTRY`` answer: ``EOK`` with ``body``, or ``ENOENTRY`` / ``ENOLEDGER`` / an error without one.

    Example:
        >>> header = read_entry_request(5, 7, txn_id=2).header
        >>> response = read_entry_response(header, 5, 7, ENOENTRY)
        >>> status_name(response.status), response.readResponse.entryId
        ('ENOENTRY', 7)
    """
    response = status_response(request_header, status)
    inner = response.readResponse
    inner.status = status  # type: ignore[assignment]
    inner.ledgerId = ledger_id
    inner.entryId = entry_id
    if body is not None:
        inner.body = body
    return response


def start_tls_response(request_header: pb.BKPacketHeader, status: int) -> pb.Response:
    """The answer to ``START_TLS``: ``EOK`` with an empty ``startTLSResponse`` (the handshake follows), or
    ``EBADREQ`` from a bookie without TLS (``BookieRequestProcessor.processStartTLSRequestV3``).

    Example:
        >>> header = start_tls_request(4).header
        >>> start_tls_response(header, EOK).HasField("startTLSResponse")
        True
    """
    response = status_response(request_header, status)
    if status == pb.EOK:
        response.startTLSResponse.SetInParent()
    return response


def auth_response(
    request_header: pb.BKPacketHeader, status: int, plugin_name: str, payload: bytes
) -> pb.Response:
    """An ``AUTH`` answer carrying the server side of the plugin exchange.

    Example:
        >>> header = auth_request("P", b"hi", 3).header
        >>> auth_response(header, EOK, "P", b"ok").authResponse.payload
        b'ok'
    """
    response = status_response(request_header, status)
    response.authResponse.authPluginName = plugin_name
    response.authResponse.payload = payload
    return response


# ---------------------------------------------------------------------------------------------- entry bodies


def encode_entry_header(ledger_id: int, entry_id: int, last_add_confirmed: int, length: int) -> bytes:
    """The 32 bytes an entry body starts with (before its digest and payload), as BookKeeper's
    DigestManager writes them: the writer's LAC when it sent the entry rides in every entry.

    Example:
        >>> encode_entry_header(5, 7, 6, 70).hex(" ")[-23:]
        '00 00 00 00 00 00 00 46'
    """
    return _ENTRY_HEADER.pack(ledger_id, entry_id, last_add_confirmed, length)


def decode_entry_header(body: bytes) -> tuple[int, int, int, int]:
    """``(ledger id, entry id, last add confirmed, length)`` of an entry body; FormatError when too short.

    Example:
        >>> decode_entry_header(encode_entry_header(5, 7, 6, 70) + b"payload")
        (5, 7, 6, 70)
    """
    if len(body) < ENTRY_HEADER_SIZE:
        raise FormatError(f"entry: {len(body)} bytes, its header needs {ENTRY_HEADER_SIZE}")
    ledger_id, entry_id, lac, length = _ENTRY_HEADER.unpack_from(body)
    return ledger_id, entry_id, lac, length


# ------------------------------------------------------------------------------------------------ parsing


def _unknown_varints(message: protobuf_message.Message) -> dict[int, int]:
    """Varint fields the schema did not accept: in proto2 an enum value we do not know lands here."""
    try:
        field_set = unknown_fields.UnknownFieldSet(message)
        fields = [field_set[index] for index in range(len(field_set))]
        return {field.field_number: int(field.data) for field in fields if field.wire_type == 0}
    except Exception:  # the unknown-field view is best effort; it only improves an error message
        return {}


def _explain_missing(message: pb.Request | pb.Response, missing: list[str]) -> str:
    """Turn ``['status']`` into a reason that names an unknown enum value when that is the cause."""
    reasons = []
    top_unknown = _unknown_varints(message)
    header_unknown = _unknown_varints(message.header) if message.HasField("header") else {}
    for path in missing:
        if path == "status" and 2 in top_unknown:
            reasons.append(f"unknown status code {top_unknown[2]}")
        elif path == "header.operation" and 2 in header_unknown:
            reasons.append(f"unknown operation {header_unknown[2]}")
        elif path == "header.version" and 1 in header_unknown:
            reasons.append(f"unknown protocol version {header_unknown[1]}")
        else:
            reasons.append(f"missing required field {path}")
    return "; ".join(reasons)


def _parse(message_type: type[Message], frame: bytes, what: str) -> Message:
    message = message_type()
    try:
        message.ParseFromString(frame)
    except protobuf_message.DecodeError as err:
        raise FormatError(f"{what}: undecodable protobuf ({len(frame)} bytes): {err}") from None
    except Exception as err:  # the C parser's contract is DecodeError; anything else is still bad input
        raise FormatError(
            f"{what}: undecodable protobuf ({len(frame)} bytes): {type(err).__name__}"
        ) from None
    # upb's ParseFromString does not check proto2 `required` fields; do it here with a readable reason.
    missing: list[str] = message.FindInitializationErrors()  # type: ignore[attr-defined]  # not in the stubs
    if missing:
        raise FormatError(f"{what}: {_explain_missing(message, missing)}")
    return message


def parse_response(frame: bytes) -> pb.Response:
    """Decode one frame body (prefix removed) as a ``Response``; :class:`FormatError` when it is not one.

    Every proto2 required field must be present, including inside the operation-specific answer.

    Example:
        >>> parse_response(bytes.fromhex("0a060803100b1801109203e206050892031005")).status
        402
        >>> parse_response(bytes.fromhex("0a060803100b1801"))
        Traceback (most recent call last):
        ...
        core.errors.FormatError: response: missing required field status
        >>> parse_response(b"\\xff\\xff")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        core.errors.FormatError: response: undecodable protobuf (2 bytes): ... Wire format was corrupt
    """
    return _parse(pb.Response, frame, "response")


def parse_request(frame: bytes) -> pb.Request:
    """Decode one frame body as a ``Request`` (the server side); :class:`FormatError` when it is not one.

    Example:
        >>> parse_request(list_entries_request(9, 4).SerializeToString()).header.txnId
        4
    """
    return _parse(pb.Request, frame, "request")


def peek_header(frame: bytes) -> tuple[int, int] | None:
    """``(txnId, operation)`` of a frame whose header is readable even if the rest is not, else None.

    Lets a client route "your answer was garbage" to the one request it belongs to instead of dropping it.

    Example:
        >>> peek_header(bytes.fromhex("0a060803100b1801"))  # header only: not a valid Response, but routable
        (1, 11)
        >>> peek_header(b"junk") is None
        True
    """
    message = pb.Response()
    try:
        message.ParseFromString(frame)
    except Exception:  # unreadable is exactly the None case
        return None
    header = message.header
    if message.HasField("header") and header.HasField("txnId") and header.HasField("operation"):
        return header.txnId, header.operation
    return None


# Re-exported so callers need only this module for the codes they compare against.
EOK = pb.EOK
ENOLEDGER = pb.ENOLEDGER
ENOENTRY = pb.ENOENTRY
EBADREQ = pb.EBADREQ
EIO = pb.EIO
EUA = pb.EUA
EBADVERSION = pb.EBADVERSION
READ_ENTRY = pb.READ_ENTRY
AUTH = pb.AUTH
START_TLS = pb.START_TLS
GET_LIST_OF_ENTRIES_OF_LEDGER = pb.GET_LIST_OF_ENTRIES_OF_LEDGER
