"""Protobuf text format exactly as BookKeeper's Java code prints it.

BookKeeper stores several znodes as protobuf *text format* (v2 ledger metadata, cookies, under-replication
marks, the rereplication LAYOUT, lock and vote data). Python's ``text_format`` differs from Java's
``TextFormat`` in how it escapes bytes (Java writes ``\\a \\b \\f \\v``, Python octal), so printing is done
here to be byte-exact; parsing reuses protobuf's parser, which understands both escape styles.

Java's printer: fields in field-number order, ``name: value`` per line, nested messages as ``name {`` …
``}`` indented two spaces, enums by name, strings and bytes quoted with ``escapeBytes``, a newline after
every field.

Example:
    >>> from core.pb import data_formats_pb2 as pb
    >>> mark = pb.UnderreplicatedLedgerFormat(replica=["10.0.0.5:3181"], ctime=1718000000000)
    >>> print_message(mark)
    'replica: "10.0.0.5:3181"\\nctime: 1718000000000\\n'
    >>> parse_message(print_message(mark), pb.UnderreplicatedLedgerFormat) == mark
    True
"""

from __future__ import annotations

import warnings
from typing import TypeVar

from google.protobuf import text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from core.errors import FormatError

M = TypeVar("M", bound=Message)

_SPECIAL_ESCAPES = {
    0x07: "\\a",
    0x08: "\\b",
    0x0C: "\\f",
    0x0A: "\\n",
    0x0D: "\\r",
    0x09: "\\t",
    0x0B: "\\v",
    0x5C: "\\\\",
    0x27: "\\'",
    0x22: '\\"',
}


# Java's String.trim strips every char <= U+0020 at both ends (built once: racks are trimmed per evaluation).
_JAVA_TRIMMED = "".join(chr(code) for code in range(0x21))


def java_trim(text: str) -> str:
    """``String.trim()`` as Java does it: every char ``<= U+0020`` removed at both ends (Python's
    ``str.strip()`` would also remove other Unicode whitespace and keep control characters).

    Example:
        >>> java_trim(chr(0) + " /rack" + chr(9)), java_trim(chr(0xA0) + "x") == chr(0xA0) + "x"
        ('/rack', True)
    """
    return text.strip(_JAVA_TRIMMED)


def escape_bytes(data: bytes) -> str:
    """Java ``TextFormat.escapeBytes``: printable ASCII as is, C escapes, everything else 3-digit octal.

    Example:
        >>> escape_bytes(b"a\\tb\\x07\\xff")
        'a\\\\tb\\\\a\\\\377'
    """
    out: list[str] = []
    for byte in data:
        special = _SPECIAL_ESCAPES.get(byte)
        if special is not None:
            out.append(special)
        elif 0x20 <= byte <= 0x7E:
            out.append(chr(byte))
        else:
            out.append(f"\\{byte:03o}")
    return "".join(out)


def _format_value(field: FieldDescriptor, value: object) -> str:
    if field.type == FieldDescriptor.TYPE_STRING:
        assert isinstance(value, str)
        return '"' + escape_bytes(value.encode("utf-8")) + '"'
    if field.type == FieldDescriptor.TYPE_BYTES:
        assert isinstance(value, bytes)
        return '"' + escape_bytes(value) + '"'
    if field.type == FieldDescriptor.TYPE_ENUM:
        assert isinstance(value, int)
        assert field.enum_type is not None
        enum_value = field.enum_type.values_by_number.get(value)
        return enum_value.name if enum_value is not None else str(value)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return "true" if value else "false"
    return str(value)


def _print(message: Message, indent: str, out: list[str]) -> None:
    fields: list[FieldDescriptor] = sorted(message.DESCRIPTOR.fields, key=lambda f: f.number)  # type: ignore[arg-type]
    for field in fields:
        is_repeated = field.is_repeated
        if is_repeated:
            values = list(getattr(message, field.name))
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                raise FormatError(f"text format: map field {field.name} is not printed by BookKeeper")
        elif message.HasField(field.name):
            values = [getattr(message, field.name)]
        else:
            continue
        for value in values:
            if field.type in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP):
                out.append(f"{indent}{field.name} {{\n")
                _print(value, indent + "  ", out)
                out.append(f"{indent}}}\n")
            else:
                out.append(f"{indent}{field.name}: {_format_value(field, value)}\n")


def print_message(message: Message) -> str:
    """Text format of ``message`` exactly as Java's ``TextFormat.printToString`` writes it.

    Example:
        >>> from core.pb import data_formats_pb2 as pb
        >>> print_message(pb.LockDataFormat(bookieId="host-1"))
        'bookieId: "host-1"\\n'
    """
    out: list[str] = []
    _print(message, "", out)
    return "".join(out)


def parse_message(text: str | bytes, message_type: type[M], *, what: str | None = None) -> M:
    """Parse text format into a new ``message_type``; any problem raises :class:`FormatError`.

    Required fields must be present (Java's builder refuses to build otherwise).

    Example:
        >>> from core.pb import data_formats_pb2 as pb
        >>> parse_message('bookieId: "b1"\\n', pb.AuditorVoteFormat).bookieId
        'b1'
    """
    label = what or message_type.DESCRIPTOR.name
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise FormatError(f"{label}: text is not UTF-8 ({err.reason} at byte {err.start})") from None
    message = message_type()
    try:
        with warnings.catch_warnings():
            # protobuf's unescaping warns on odd escapes in hostile input; the error below says enough.
            warnings.simplefilter("ignore", DeprecationWarning)
            text_format.Parse(text, message)
    except (text_format.ParseError, ValueError, UnicodeError, OverflowError) as err:
        first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise FormatError(f"{label}: invalid text format: {first_line}") from None
    if not message.IsInitialized():
        missing = ", ".join(message.FindInitializationErrors())  # type: ignore[attr-defined]
        raise FormatError(f"{label}: missing required field(s): {missing}")
    return message
