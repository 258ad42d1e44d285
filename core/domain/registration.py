"""Bookie registration: bookie ids, registration znode paths and ``BookieServiceInfoFormat``.

* Bookie ids follow ``BookieId.validateBookieId``: Java regex ``[a-zA-Z0-9:-_.\\-]+`` (``:-_`` is the *range*
  0x3A..0x5F, so ``;<=>?@[\\]^`` and upper case are allowed) and not ``readonly`` in any case.
* A bookie registers an ephemeral ``<root>/available/<id>`` (writable) or ``<root>/available/readonly/<id>``
  (read-only) whose data is ``BookieServiceInfoFormat``, binary, *not* length-delimited. Old bookies write
  nothing; BookKeeper then builds a "legacy" info from the id (``host:port``).
* Addresses resolve from the first endpoint whose protocol is ``bookie-rpc``.

Decisions:

* Legacy fallback for an id that is not ``host:port`` (a BP-41 id with no registration data): BookKeeper's
  reader fails and the bookie stays unresolvable. Here the decoder returns an info with **no endpoints**, so
  membership still decodes and :func:`bookie_rpc_address` answers None (unresolvable), the same outcome
  without an exception. ``host:port`` is split the way ``BookieSocketAddress`` does (first two ``:`` parts,
  port 0..65535).
* Properties keep the order they had on the wire (upb's map does not), so :func:`encode_bookie_service_info`
  reproduces BookKeeper's bytes exactly; each map entry is written with key and value, as protobuf-java does.

Example:
    >>> info = decode_bookie_service_info("10.0.0.1:3181", b"")
    >>> info.endpoints[0]
    Endpoint(id='10.0.0.1:3181', port=3181, host='10.0.0.1', protocol='bookie-rpc', auth=(), extensions=())
    >>> str(bookie_rpc_address(info))
    '10.0.0.1:3181'
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from core.domain.layout import (
    AVAILABLE_NODE,
    COOKIES_NODE,
    DEFAULT_LEDGERS_ROOT,
    READONLY_NODE,
    validate_root,
)
from core.errors import FormatError
from core.pb import data_formats_pb2 as pb

BOOKIE_RPC_PROTOCOL = "bookie-rpc"
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

# Same character class as BookKeeper's; in Python, too, ":-_" inside [...] is the range 0x3A..0x5F.
_BOOKIE_ID = re.compile(r"[a-zA-Z0-9:-_.\-]+")


# --------------------------------------------------------------------------------------------------------
# Bookie ids and registration paths


def is_valid_bookie_id(bookie_id: str) -> bool:
    """True when BookKeeper's ``BookieId`` accepts ``bookie_id``.

    Example:
        >>> [is_valid_bookie_id(s) for s in ("10.0.0.1:3181", "bk-1", "A@B[x]", "ReadOnly", "a/b", "")]
        [True, True, True, False, False, False]
    """
    return (
        isinstance(bookie_id, str)
        and _BOOKIE_ID.fullmatch(bookie_id) is not None
        and bookie_id.lower() != READONLY_NODE
    )


def validate_bookie_id(bookie_id: str) -> str:
    """Return ``bookie_id`` if valid, else raise :class:`FormatError` saying why.

    Example:
        >>> validate_bookie_id("readonly")
        Traceback (most recent call last):
        ...
        core.errors.FormatError: bookie id 'readonly' is reserved
    """
    if not isinstance(bookie_id, str):
        raise FormatError(f"bookie id must be a string, got {type(bookie_id).__name__}")
    if _BOOKIE_ID.fullmatch(bookie_id) is None:
        raise FormatError(f"bookie id {bookie_id[:120]!r} is not valid (allowed: a-z A-Z 0-9 : to _ . -)")
    if bookie_id.lower() == READONLY_NODE:
        raise FormatError(f"bookie id {bookie_id!r} is reserved")
    return bookie_id


class RegistrationKind(enum.Enum):
    """Which registration subtree a bookie znode is in.

    Example:
        >>> parse_registration_path("/ledgers/cookies/bk-1").kind
        <RegistrationKind.COOKIE: 'cookie'>
    """

    WRITABLE = "writable"  # <root>/available/<id>, ephemeral
    READONLY = "readonly"  # <root>/available/readonly/<id>, ephemeral
    COOKIE = "cookie"  # <root>/cookies/<id>, persistent


@dataclass(frozen=True)
class RegistrationPath:
    """A bookie znode: its kind and bookie id (see :func:`parse_registration_path`).

    Example:
        >>> parse_registration_path("/ledgers/available/readonly/bk1:3181")
        RegistrationPath(kind=<RegistrationKind.READONLY: 'readonly'>, bookie_id='bk1:3181')
    """

    kind: RegistrationKind
    bookie_id: str


def writable_bookie_path(bookie_id: str, root: str = DEFAULT_LEDGERS_ROOT) -> str:
    """``<root>/available/<id>``.

    Example:
        >>> writable_bookie_path("10.0.0.1:3181")
        '/ledgers/available/10.0.0.1:3181'
    """
    return f"{validate_root(root)}/{AVAILABLE_NODE}/{validate_bookie_id(bookie_id)}"


def readonly_bookie_path(bookie_id: str, root: str = DEFAULT_LEDGERS_ROOT) -> str:
    """``<root>/available/readonly/<id>``.

    Example:
        >>> readonly_bookie_path("bk-1")
        '/ledgers/available/readonly/bk-1'
    """
    return f"{validate_root(root)}/{AVAILABLE_NODE}/{READONLY_NODE}/{validate_bookie_id(bookie_id)}"


def cookie_path(bookie_id: str, root: str = DEFAULT_LEDGERS_ROOT) -> str:
    """``<root>/cookies/<id>``.

    Example:
        >>> cookie_path("bk-1", "/bk")
        '/bk/cookies/bk-1'
    """
    return f"{validate_root(root)}/{COOKIES_NODE}/{validate_bookie_id(bookie_id)}"


def parse_registration_path(path: str, root: str = DEFAULT_LEDGERS_ROOT) -> RegistrationPath | None:
    """The bookie a registration or cookie znode stands for; None for any other path (including parents).

    A child of ``available`` named ``readonly`` is the read-only parent, not a bookie; a child whose name is
    not a valid bookie id is ignored (None), as BookKeeper cannot have created it.

    Example:
        >>> parse_registration_path("/ledgers/available/10.0.0.1:3181")
        RegistrationPath(kind=<RegistrationKind.WRITABLE: 'writable'>, bookie_id='10.0.0.1:3181')
        >>> parse_registration_path("/ledgers/available/readonly") is None
        True
    """
    validate_root(root)
    if not path.startswith(root + "/"):
        return None
    components = path[len(root) + 1 :].split("/")
    if len(components) == 2 and components[0] == COOKIES_NODE:
        kind, name = RegistrationKind.COOKIE, components[1]
    elif len(components) == 2 and components[0] == AVAILABLE_NODE:
        kind, name = RegistrationKind.WRITABLE, components[1]
    elif len(components) == 3 and components[0] == AVAILABLE_NODE and components[1] == READONLY_NODE:
        kind, name = RegistrationKind.READONLY, components[2]
    else:
        return None
    if not is_valid_bookie_id(name):
        return None
    return RegistrationPath(kind, name)


# --------------------------------------------------------------------------------------------------------
# BookieServiceInfo


@dataclass(frozen=True)
class BookieAddress:
    """A resolved ``host:port`` (``BookieSocketAddress``).

    Example:
        >>> str(BookieAddress("bk1.example.com", 3181))
        'bk1.example.com:3181'
    """

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Endpoint:
    """One published endpoint (``BookieServiceInfoFormat.Endpoint``).

    Example:
        >>> Endpoint("httpserver", 8000, "bk1", "http").protocol
        'http'
    """

    id: str
    port: int
    host: str
    protocol: str
    auth: tuple[str, ...] = ()
    extensions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("id", "host", "protocol"):
            if not isinstance(getattr(self, name), str):
                raise FormatError(f"bookie endpoint: {name} must be a string")
        if (
            isinstance(self.port, bool)
            or not isinstance(self.port, int)
            or not INT32_MIN <= self.port <= INT32_MAX
        ):
            raise FormatError(f"bookie endpoint: port {self.port!r} is not a 32-bit integer")
        if not all(isinstance(item, str) for item in (*self.auth, *self.extensions)):
            raise FormatError("bookie endpoint: auth and extensions must be tuples of strings")
        _check_encodable((self.id, self.host, self.protocol, *self.auth, *self.extensions), "bookie endpoint")


@dataclass(frozen=True)
class BookieServiceInfo:
    """What a bookie publishes in its registration znode; ``properties`` in wire order, keys unique.

    Example:
        >>> info = BookieServiceInfo((Endpoint("bookie", 3181, "bk1", "bookie-rpc", extensions=("tls",)),))
        >>> decode_bookie_service_info("bk1", encode_bookie_service_info(info)) == info
        True
        >>> BookieServiceInfo((), (("zone", "a"),)).property("zone")
        'a'
    """

    endpoints: tuple[Endpoint, ...]
    properties: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        keys = [key for key, _ in self.properties]
        if len(set(keys)) != len(keys):
            raise FormatError("bookie service info: duplicate property key")
        if not all(isinstance(key, str) and isinstance(value, str) for key, value in self.properties):
            raise FormatError("bookie service info: properties must be string pairs")
        _check_encodable((s for pair in self.properties for s in pair), "bookie service info")

    def property(self, key: str) -> str | None:
        """The value of property ``key``, or None.

        Example:
            >>> BookieServiceInfo(()).property("zone") is None
            True
        """
        for name, value in self.properties:
            if name == key:
                return value
        return None


def parse_host_port(text: str) -> BookieAddress | None:
    """``host:port`` as ``BookieSocketAddress(String)`` splits it; None when it is not an address.

    Like BookKeeper, only the first two ``:``-separated parts count (so IPv6 literals are not addresses).

    Example:
        >>> parse_host_port("10.0.0.1:3181")
        BookieAddress(host='10.0.0.1', port=3181)
        >>> parse_host_port("bookie-7") is None
        True
    """
    parts = text.split(":")
    if len(parts) < 2 or parts[0] == "":
        return None
    port_text = parts[1]
    if not (port_text.isascii() and port_text.isdigit()) or len(port_text) > 5:
        return None
    port = int(port_text)
    if port > 65535:
        return None
    return BookieAddress(parts[0], port)


def legacy_bookie_service_info(bookie_id: str) -> BookieServiceInfo:
    """The info BookKeeper assumes for a bookie that registered no data (``buildLegacyBookieServiceInfo``).

    One ``bookie-rpc`` endpoint with id = the bookie id and host/port parsed from it; no endpoints when the id
    is not ``host:port`` (see the module's decisions).

    Example:
        >>> legacy_bookie_service_info("bookie-7")
        BookieServiceInfo(endpoints=(), properties=())
    """
    validate_bookie_id(bookie_id)
    address = parse_host_port(bookie_id)
    if address is None:
        return BookieServiceInfo(())
    return BookieServiceInfo((Endpoint(bookie_id, address.port, address.host, BOOKIE_RPC_PROTOCOL),))


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise FormatError("bookie service info: truncated or overlong varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos


def _skip_field(data: bytes, pos: int, wire_type: int, depth: int = 0) -> int:
    if wire_type == 0:
        return _read_varint(data, pos)[1]
    if wire_type == 1:
        end = pos + 8
    elif wire_type == 5:
        end = pos + 4
    elif wire_type == 2:
        length, pos = _read_varint(data, pos)
        end = pos + length
    elif wire_type == 3:  # start group: skip until the matching end group
        if depth > 64:
            raise FormatError("bookie service info: groups nested too deeply")
        while True:
            key, pos = _read_varint(data, pos)
            if key & 7 == 4:
                return pos
            pos = _skip_field(data, pos, key & 7, depth + 1)
    else:
        raise FormatError(f"bookie service info: invalid wire type {wire_type}")
    if end > len(data):
        raise FormatError("bookie service info: truncated field")
    return end


def _property_entries_in_wire_order(data: bytes) -> list[bytes]:
    """Raw bytes of each ``properties`` map entry (field 7), in the order they appear."""
    entries: list[bytes] = []
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        field_number, wire_type = key >> 3, key & 7
        if field_number == 7 and wire_type == 2:
            length, start = _read_varint(data, pos)
            pos = start + length
            if pos > len(data):
                raise FormatError("bookie service info: truncated property")
            entries.append(data[start:pos])
        else:
            pos = _skip_field(data, pos, wire_type)
    return entries


def _utf8(value: str | bytes, what: str) -> str:
    # upb hands back proto2 strings that are not valid UTF-8 as bytes.
    if isinstance(value, bytes):
        raise FormatError(f"{what}: a string field is not valid UTF-8")
    return value


def _check_encodable(values: Iterable[str], what: str) -> None:
    for value in values:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise FormatError(f"{what}: string with a lone surrogate cannot be encoded") from None


def decode_bookie_service_info(bookie_id: str, data: bytes | None) -> BookieServiceInfo:
    """Decode a registration znode's data the way ``ZKRegistrationClient.deserializeBookieServiceInfo`` does.

    Empty or None data gives :func:`legacy_bookie_service_info`. Bad protobuf, a missing required endpoint
    field, or an invalid bookie id raise :class:`FormatError`.

    Example:
        >>> blob = b'2\\x1c\\n\\x06bookie\\x10\\xed\\x18\\x1a\\x03bk1"\\nbookie-rpc'
        >>> decode_bookie_service_info("bk1", blob).endpoints[0]
        Endpoint(id='bookie', port=3181, host='bk1', protocol='bookie-rpc', auth=(), extensions=())
    """
    validate_bookie_id(bookie_id)
    if not data:
        return legacy_bookie_service_info(bookie_id)
    if not isinstance(data, bytes | bytearray | memoryview):
        raise FormatError(f"bookie service info: expected bytes, got {type(data).__name__}")
    raw = bytes(data)
    message = pb.BookieServiceInfoFormat()
    try:
        message.ParseFromString(raw)
    except (DecodeError, ValueError, RuntimeError) as err:
        first_line = str(err).splitlines()[0] if str(err) else "decode error"
        raise FormatError(f"bookie service info of {bookie_id}: invalid protobuf ({first_line})") from None
    # upb does not enforce proto2 "required" on parse; protobuf-java does.
    if not message.IsInitialized():
        raise FormatError(
            f"bookie service info of {bookie_id}: "
            "an endpoint lacks a required field (id, port, host, protocol)"
        )
    what = f"bookie service info of {bookie_id}"
    endpoints = tuple(
        Endpoint(
            _utf8(e.id, what),
            e.port,
            _utf8(e.host, what),
            _utf8(e.protocol, what),
            tuple(_utf8(a, what) for a in e.auth),
            tuple(_utf8(x, what) for x in e.extensions),
        )
        for e in message.endpoints
    )
    # Map order: first position of a key, last value wins (protobuf-java's LinkedHashMap behaviour).
    properties: dict[str, str] = {}
    for entry_bytes in _property_entries_in_wire_order(raw):
        entry = pb.BookieServiceInfoFormat.PropertiesEntry()
        try:
            entry.ParseFromString(entry_bytes)
        except (DecodeError, ValueError, RuntimeError):
            raise FormatError(f"bookie service info of {bookie_id}: invalid property entry") from None
        properties[_utf8(entry.key, what)] = _utf8(entry.value, what)
    return BookieServiceInfo(endpoints, tuple(properties.items()))


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _encode_string_field(field_number: int, text: str) -> bytes:
    raw = text.encode("utf-8")
    return _encode_varint(field_number << 3 | 2) + _encode_varint(len(raw)) + raw


def encode_bookie_service_info(info: BookieServiceInfo) -> bytes:
    """Registration data as a bookie writes it (``toByteArray``): endpoints, then properties in order.

    Example:
        >>> encode_bookie_service_info(BookieServiceInfo(()))
        b''
    """
    message = pb.BookieServiceInfoFormat()
    for endpoint in info.endpoints:
        message.endpoints.add(
            id=endpoint.id,
            port=endpoint.port,
            host=endpoint.host,
            protocol=endpoint.protocol,
            auth=list(endpoint.auth),
            extensions=list(endpoint.extensions),
        )
    out = bytearray(message.SerializeToString())
    # Map entries by hand: upb would reorder them; protobuf-java writes key and value even when empty.
    for key, value in info.properties:
        entry = _encode_string_field(1, key) + _encode_string_field(2, value)
        out += _encode_varint(7 << 3 | 2) + _encode_varint(len(entry)) + entry
    return bytes(out)


def bookie_rpc_address(info: BookieServiceInfo) -> BookieAddress | None:
    """Address of the first ``bookie-rpc`` endpoint (``DefaultBookieAddressResolver``); None if unresolvable.

    An endpoint with an empty host or a port outside 0..65535 cannot form a socket address: None.

    Example:
        >>> http = Endpoint("httpserver", 8000, "bk1", "http")
        >>> info = BookieServiceInfo((http, Endpoint("bookie", 3181, "bk1", "bookie-rpc")))
        >>> bookie_rpc_address(info)
        BookieAddress(host='bk1', port=3181)
    """
    for endpoint in info.endpoints:
        if endpoint.protocol == BOOKIE_RPC_PROTOCOL:
            if endpoint.host == "" or not 0 <= endpoint.port <= 65535:
                return None
            return BookieAddress(endpoint.host, endpoint.port)
    return None
