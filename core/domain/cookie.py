"""Bookie cookies (``<root>/cookies/<bookieId>`` and a bookie's ``current/VERSION`` file).

Layout version >= 4 (current: 5) is the version line, then the protobuf *text format* of ``CookieFormat``;
layout version 3 is four lines: version, bookie host, journal dirs, ledger dirs. ``ledgerDirs`` and
``indexDirs`` are encoded ``"<count>\\t<dir1>\\t<dir2>..."``, ``journalDir`` is comma-joined.

Decisions:

* Fields are kept *as encoded* (``ledger_dirs`` is the ``"<count>\\t..."`` string), so a parsed cookie
  re-encodes byte for byte; :func:`decode_dir_list` / :func:`encode_dir_list` convert.
* :func:`format_cookie` writes the cookie's own layout version. (BookKeeper's ``Cookie.toString`` always
  writes the *current* version number, even in front of a 4-line v3 body, which it could not read back.)
* Like BookKeeper's reader: the version line is trimmed and may carry a sign; lines end at ``\\n``, ``\\r``
  or ``\\r\\n``; a v3 cookie's lines after the fourth are ignored. Versions below 3 raise.
* An empty ``instanceId: ""`` is kept as ``""`` for byte-exactness (BookKeeper treats it as absent).

Example:
    >>> text = 'bookieHost: "10.0.0.1:3181"\\njournalDir: "/j"\\nledgerDirs: "1\\\\t/d"\\n'
    >>> cookie = parse_cookie("5\\n" + text)
    >>> cookie.bookie_id, decode_dir_list(cookie.ledger_dirs)
    ('10.0.0.1:3181', ('/d',))
    >>> format_cookie(cookie) == "5\\n" + text
    True
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from core.domain.textformat import java_trim, parse_message, print_message
from core.errors import FormatError
from core.pb import data_formats_pb2 as pb

CURRENT_COOKIE_LAYOUT_VERSION = 5
TEXT_FORMAT_MIN_VERSION = 4
OLDEST_READABLE_VERSION = 3
DIR_SEPARATOR = "\t"

_JAVA_INT = re.compile(r"[+-]?[0-9]+")
# BufferedReader.readLine line terminators.
_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Cookie:
    """A bookie cookie; ``ledger_dirs``/``index_dirs`` hold the ``"<count>\\t..."`` encoding.

    Example:
        >>> c = Cookie.create("bk1:3181", ["/j1", "/j2"], ["/d1"], instance_id="uuid-1")
        >>> c.journal_dirs, c.ledger_dirs
        ('/j1,/j2', '1\\t/d1')
    """

    layout_version: int
    bookie_id: str
    journal_dirs: str
    ledger_dirs: str
    instance_id: str | None = None
    index_dirs: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.layout_version, bool) or not isinstance(self.layout_version, int):
            raise FormatError("cookie: layout version must be an integer")
        if not OLDEST_READABLE_VERSION <= self.layout_version <= 2**31 - 1:
            raise FormatError(f"cookie: layout version {self.layout_version} not supported (>= 3)")
        for name in ("bookie_id", "journal_dirs", "ledger_dirs", "instance_id", "index_dirs"):
            value = getattr(self, name)
            if value is None and name in ("instance_id", "index_dirs"):
                continue
            if not isinstance(value, str):
                raise FormatError(f"cookie: {name} must be a string")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise FormatError(f"cookie: {name} has a lone surrogate and cannot be encoded") from None
        if self.layout_version < TEXT_FORMAT_MIN_VERSION:
            # Four-line format: a line break inside a field would shift the lines; v3 has no optional fields.
            if any(_LINE_END.search(v) for v in (self.bookie_id, self.journal_dirs, self.ledger_dirs)):
                raise FormatError("cookie: a layout 3 cookie's fields must not contain line breaks")
            if self.instance_id is not None or self.index_dirs is not None:
                raise FormatError("cookie: layout 3 has no instanceId or indexDirs")

    @classmethod
    def create(
        cls,
        bookie_id: str,
        journal_dirs: Sequence[str],
        ledger_dirs: Sequence[str],
        *,
        instance_id: str | None = None,
        index_dirs: Sequence[str] | None = None,
        layout_version: int = CURRENT_COOKIE_LAYOUT_VERSION,
    ) -> Cookie:
        """A cookie from directory lists, encoded the way BookKeeper encodes them.

        Example:
            >>> Cookie.create("b:1", ["/j"], ["/d1", "/d2"], index_dirs=["/i"]).index_dirs
            '1\\t/i'
        """
        return cls(
            layout_version,
            bookie_id,
            ",".join(journal_dirs),
            encode_dir_list(ledger_dirs),
            instance_id,
            encode_dir_list(index_dirs) if index_dirs is not None else None,
        )

    @property
    def journal_dir_list(self) -> tuple[str, ...]:
        """The journal directories (comma-separated in the cookie).

        Example:
            >>> Cookie(3, "b:1", "/j1,/j2", "0").journal_dir_list
            ('/j1', '/j2')
        """
        return tuple(self.journal_dirs.split(",")) if self.journal_dirs else ()


def encode_dir_list(dirs: Sequence[str]) -> str:
    """``"<count>\\t<dir1>\\t<dir2>..."`` (``Cookie.encodeDirPaths``); a tab inside a dir raises.

    Example:
        >>> encode_dir_list(["/a", "/b"])
        '2\\t/a\\t/b'
    """
    if any(DIR_SEPARATOR in d for d in dirs):
        raise FormatError("cookie: a directory name contains a tab")
    return "".join([str(len(dirs)), *(DIR_SEPARATOR + d for d in dirs)])


def decode_dir_list(encoded: str) -> tuple[str, ...]:
    """Directories of a ``"<count>\\t..."`` string; a count that does not match raises :class:`FormatError`.

    Example:
        >>> decode_dir_list("2\\t/a\\t/b")
        ('/a', '/b')
    """
    count_text, *dirs = encoded.split(DIR_SEPARATOR)
    if not (count_text.isascii() and count_text.isdigit()) or int(count_text) != len(dirs):
        raise FormatError(f"cookie: directory list {encoded[:120]!r} does not start with its count")
    return tuple(dirs)


def _decode_text(data: bytes | str) -> str:
    if isinstance(data, str):
        return data
    if not isinstance(data, bytes | bytearray | memoryview):
        raise FormatError(f"cookie: expected bytes or text, got {type(data).__name__}")
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as err:
        raise FormatError(f"cookie: not UTF-8 ({err.reason} at byte {err.start})") from None


def parse_cookie(data: bytes | str) -> Cookie:
    """Decode a cookie the way ``Cookie.parse`` reads it; anything it cannot read raises FormatError.

    Example:
        >>> parse_cookie("3\\n10.0.0.1:3181\\n/j\\n1\\t/d\\n").layout_version
        3
        >>> parse_cookie("2\\nx\\n")
        Traceback (most recent call last):
        ...
        core.errors.FormatError: cookie: layout version 2 not supported (>= 3)
    """
    text = _decode_text(data)
    if text == "":
        raise FormatError("cookie: empty")
    first_end = _LINE_END.search(text)
    version_line = text[: first_end.start()] if first_end else text
    rest = text[first_end.end() :] if first_end else ""
    trimmed = java_trim(version_line)
    if not _JAVA_INT.fullmatch(trimmed) or not -(2**31) <= int(trimmed) <= 2**31 - 1:
        raise FormatError(f"cookie: invalid layout version line {version_line[:40]!r}")
    version = int(trimmed)
    if version < OLDEST_READABLE_VERSION:
        raise FormatError(f"cookie: layout version {version} not supported (>= {OLDEST_READABLE_VERSION})")
    if version < TEXT_FORMAT_MIN_VERSION:
        pieces = _LINE_END.split(rest)
        # The piece after the last terminator is a line only if not empty (readLine returns null at EOF).
        lines = pieces[:-1] + ([pieces[-1]] if pieces[-1] else [])
        if len(lines) < 3:
            raise FormatError("cookie: layout 3 cookie needs bookie host, journal dirs and ledger dirs lines")
        return Cookie(version, lines[0], lines[1], lines[2])
    message = parse_message(rest, pb.CookieFormat, what="cookie")
    return Cookie(
        version,
        message.bookieHost,
        message.journalDir,
        message.ledgerDirs,
        message.instanceId if message.HasField("instanceId") else None,
        message.indexDirs if message.HasField("indexDirs") else None,
    )


def format_cookie(cookie: Cookie) -> str:
    """Encode a cookie as BookKeeper writes it, with the cookie's own layout version.

    Example:
        >>> format_cookie(Cookie(3, "10.0.0.1:3181", "/j", "1\\t/d"))
        '3\\n10.0.0.1:3181\\n/j\\n1\\t/d\\n'
        >>> format_cookie(Cookie.create("b:1", ["/j"], ["/d"], instance_id="i"))
        '5\\nbookieHost: "b:1"\\njournalDir: "/j"\\nledgerDirs: "1\\\\t/d"\\ninstanceId: "i"\\n'
    """
    if cookie.layout_version < TEXT_FORMAT_MIN_VERSION:
        return f"{cookie.layout_version}\n{cookie.bookie_id}\n{cookie.journal_dirs}\n{cookie.ledger_dirs}\n"
    message = pb.CookieFormat(
        bookieHost=cookie.bookie_id, journalDir=cookie.journal_dirs, ledgerDirs=cookie.ledger_dirs
    )
    if cookie.instance_id is not None:
        message.instanceId = cookie.instance_id
    if cookie.index_dirs is not None:
        message.indexDirs = cookie.index_dirs
    return f"{cookie.layout_version}\n{print_message(message)}"


def cookie_identity(czxid: int, sha256: str) -> str | None:
    """What tells one formatting of a bookie from the next: the cookie znode's creation zxid and the digest
    of its bytes (a cookie deleted and created again, or rewritten with a new instance id or directories,
    has another identity; the same cookie read again has the same one). None when the cookie was not read.

    Example:
        >>> cookie_identity(31, "f0b5c2c2211c8d67aa"), cookie_identity(0, "")
        ('31:f0b5c2c2211c8d67aa', None)
    """
    return f"{czxid}:{sha256}" if sha256 else None


def cookie_replaced(known: str | None, seen: str | None) -> bool:
    """Whether a bookie's cookie was replaced (the bookie reformatted under the same id): a cookie was
    known before and another one is seen now. A first sighting, a vanished cookie (``seen`` None) and the
    same cookie published again are not.

    Example:
        >>> cookie_replaced(None, "5:aa"), cookie_replaced("5:aa", "5:aa"), cookie_replaced("5:aa", None)
        (False, False, False)
        >>> cookie_replaced("5:aa", "9:bb")
        True
    """
    return bool(known) and bool(seen) and known != seen
