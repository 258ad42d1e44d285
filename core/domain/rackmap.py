"""Bookie rack maps: Pulsar's ``/bookies`` JSON znode, a flat config-file form, and rack resolution.

Two accepted JSON shapes (top level must be an object):

* **Pulsar** (``BookiesRackConfiguration``), the ``/bookies`` znode at the Pulsar metadata root::

      {"group1": {"127.0.0.1:3181": {"rack": "/rack0", "hostname": "bookie1.example.com"}}}

  ``BookieInfo`` fields other than ``rack`` and ``hostname`` are ignored; a ``null`` BookieInfo means no rack.
* **Flat config file** (this project's own form, for clusters without Pulsar): bookie id → rack::

      {"10.0.0.1:3181": "/rack-a", "bk-2": "rack-b", "bk-3": null}

Racks are normalized like Pulsar does: a missing leading ``/`` is added; null, empty or ``"/"`` (after Java's
trim) means "no rack", i.e. the placement policy's default (``/default-rack`` for rack-aware).

Resolution (:meth:`RackMap.rack_of`) follows BookKeeper + Pulsar: BookKeeper asks for a bookie's host
*without the port* (IP or host name), and Pulsar indexes every entry under its address's host and its
hostname. Here: first the exact bookie id, then the host of the id (``host:port``) or of its registered
address (BP-41 ids), matched against entry keys' hosts and ``hostname`` fields. When several entries share a
host, the one Pulsar would see last wins (groups in Java string order, entries in JSON order). Unlike Pulsar,
the exact-id step lets two bookies on one host keep different racks.

Bad input (not JSON, not an object, wrong types, invalid bookie ids, deep nesting) raises
:class:`FormatError`.

Example:
    >>> rack_map = parse_rack_map(b'{"g": {"10.0.0.1:3181": {"rack": "r1", "hostname": "bk1.example.com"}}}')
    >>> rack_map.rack_of("10.0.0.1:3181"), rack_map.rack_of("bk1.example.com:4000"), rack_map.rack_of("x:1")
    ('/r1', '/r1', None)
    >>> rack_map.rack_for("x:1")
    '/default-rack'
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.domain.registration import is_valid_bookie_id, parse_host_port
from core.domain.textformat import java_trim
from core.errors import FormatError

#: Where Pulsar keeps its rack map, at its metadata root (``BookieRackAffinityMapping``); the simulator, the
#: real dev cluster and the demos write it there too.
PULSAR_RACK_MAP_ZNODE = "/bookies"

# net/NetworkTopology.java
DEFAULT_RACK = "/default-rack"
DEFAULT_REGION = "/default-region"
DEFAULT_REGION_AND_RACK = "/default-region/default-rack"
DEFAULT_ZONE = "/default-zone"
DEFAULT_UPGRADEDOMAIN = "/default-upgradedomain"


def normalize_rack(rack: str | None) -> str | None:
    """A rack as Pulsar hands it to BookKeeper: leading ``/`` added; None/empty/``"/"`` → None (default).

    Example:
        >>> normalize_rack("rack0"), normalize_rack("/r/x"), normalize_rack(" / "), normalize_rack("")
        ('/rack0', '/r/x', None, None)
    """
    if rack is None or rack == "" or java_trim(rack) == "/":
        return None
    return rack if rack.startswith("/") else "/" + rack


@dataclass(frozen=True)
class BookieRackInfo:
    """One bookie's entry: normalized rack (None = default), hostname and group (None in the flat form).

    Example:
        >>> BookieRackInfo("/rack0", "bk1.example.com", "group1").rack
        '/rack0'
    """

    rack: str | None
    hostname: str | None = None
    group: str | None = None


@dataclass(frozen=True)
class RackMap:
    """Bookie id → :class:`BookieRackInfo`, with the host index BookKeeper's lookups go through.

    Example:
        >>> m = RackMap.from_racks({"10.0.0.1:3181": "/a", "bk-2": "b"})
        >>> m.rack_of("10.0.0.1:3999"), m.rack_of("bk-2"), len(m)
        ('/a', '/b', 2)
    """

    entries: tuple[tuple[str, BookieRackInfo], ...] = ()
    _by_id: dict[str, BookieRackInfo] = field(init=False, repr=False, compare=False)
    _by_host: dict[str, BookieRackInfo] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_id: dict[str, BookieRackInfo] = {}
        by_host: dict[str, BookieRackInfo] = {}
        for bookie_id, info in self.entries:
            if bookie_id in by_id:
                raise FormatError(f"rack map: bookie {bookie_id!r} listed twice")
            by_id[bookie_id] = info
            # Pulsar puts the hostname, then the IP, for each entry in turn: later entries overwrite.
            if info.hostname:
                by_host[info.hostname] = info
            address = parse_host_port(bookie_id)
            if address is not None:
                by_host[address.host] = info
        object.__setattr__(self, "_by_id", by_id)
        object.__setattr__(self, "_by_host", by_host)

    @classmethod
    def from_racks(cls, racks: Mapping[str, str | None]) -> RackMap:
        """A map from bookie id → rack (the flat form); ids are validated, racks normalized.

        Example:
            >>> RackMap.from_racks({"b:1": "r"}).get("b:1")
            BookieRackInfo(rack='/r', hostname=None, group=None)
        """
        entries = []
        for bookie_id, rack in racks.items():
            _check_key(bookie_id)
            entries.append((bookie_id, BookieRackInfo(normalize_rack(rack))))
        return cls(tuple(entries))

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, bookie_id: object) -> bool:
        return bookie_id in self._by_id

    def get(self, bookie_id: str) -> BookieRackInfo | None:
        """The entry keyed exactly by ``bookie_id``, or None.

        Example:
            >>> RackMap.from_racks({"b:1": "/r"}).get("b:2") is None
            True
        """
        return self._by_id.get(bookie_id)

    def rack_of(self, bookie_id: str, *, resolved_host: str | None = None) -> str | None:
        """The bookie's rack, or None when the map gives none (the caller's policy default applies).

        ``resolved_host`` is the host of the bookie's registered ``bookie-rpc`` address, needed for BP-41 ids
        that are not ``host:port``.

        Example:
            >>> m = parse_rack_map('{"g": {"10.0.0.7:3181": {"rack": "/r7", "hostname": "bk7"}}}')
            >>> m.rack_of("bookie-7", resolved_host="10.0.0.7")
            '/r7'
        """
        info = self._by_id.get(bookie_id)
        if info is not None:
            return info.rack
        address = parse_host_port(bookie_id)
        for host in (resolved_host, address.host if address else None):
            if host:
                info = self._by_host.get(host)
                if info is not None:
                    return info.rack
        return None

    def rack_for(
        self, bookie_id: str, *, resolved_host: str | None = None, default: str = DEFAULT_RACK
    ) -> str:
        """:meth:`rack_of`, with ``default`` (rack-aware: ``/default-rack``) when the map gives no rack.

        Example:
            >>> RackMap().rack_for("b:1", default=DEFAULT_REGION_AND_RACK)
            '/default-region/default-rack'
        """
        rack = self.rack_of(bookie_id, resolved_host=resolved_host)
        return rack if rack is not None else default

    def racks_for(
        self,
        bookie_ids: Iterable[str],
        *,
        resolved_hosts: Mapping[str, str] | None = None,
        default: str = DEFAULT_RACK,
    ) -> dict[str, str]:
        """``{bookie id: rack}`` for several bookies (the shape ``bkaudit check placement`` takes).

        Example:
            >>> RackMap.from_racks({"a:1": "/r1"}).racks_for(["a:1", "b:1"])
            {'a:1': '/r1', 'b:1': '/default-rack'}
        """
        hosts = resolved_hosts or {}
        return {b: self.rack_for(b, resolved_host=hosts.get(b), default=default) for b in bookie_ids}


def _check_key(bookie_id: object) -> str:
    if not isinstance(bookie_id, str) or not is_valid_bookie_id(bookie_id):
        raise FormatError(f"rack map: {str(bookie_id)[:120]!r} is not a valid bookie id")
    return bookie_id


def _optional_string(value: object, what: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise FormatError(f"rack map: {what} must be a string or null, got {type(value).__name__}")


def _java_string_order(text: str) -> bytes:
    # Java's TreeMap<String> orders by UTF-16 code units.
    return text.encode("utf-16-be", errors="surrogatepass")


def _load_json(data: bytes | str) -> Any:
    if isinstance(data, bytes | bytearray | memoryview):
        try:
            text = bytes(data).decode("utf-8-sig")  # Jackson skips a UTF-8 BOM
        except UnicodeDecodeError as err:
            raise FormatError(f"rack map: not UTF-8 ({err.reason} at byte {err.start})") from None
    elif isinstance(data, str):
        text = data
    else:
        raise FormatError(f"rack map: expected bytes or text, got {type(data).__name__}")
    if text.strip() == "":
        raise FormatError("rack map: empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise FormatError(
            f"rack map: invalid JSON ({err.msg} at line {err.lineno} column {err.colno})"
        ) from None
    except RecursionError:
        raise FormatError("rack map: JSON nested too deeply") from None
    except ValueError as err:  # e.g. an integer literal with too many digits
        raise FormatError(f"rack map: invalid JSON ({str(err)[:120]})") from None


def parse_rack_map(data: bytes | str) -> RackMap:
    """Parse Pulsar's ``/bookies`` JSON or the flat ``{"bookie-id": "/rack"}`` form (see module doc).

    Example:
        >>> parse_rack_map('{"bk-1": "/r1"}').rack_of("bk-1")
        '/r1'
        >>> parse_rack_map('[1]')
        Traceback (most recent call last):
        ...
        core.errors.FormatError: rack map: top level must be a JSON object, got list
    """
    document = _load_json(data)
    if not isinstance(document, dict):
        raise FormatError(f"rack map: top level must be a JSON object, got {type(document).__name__}")
    values = list(document.values())
    if all(isinstance(v, dict) for v in values):
        return _parse_pulsar_form(document)
    if all(v is None or isinstance(v, str) for v in values):
        return RackMap.from_racks(document)
    raise FormatError("rack map: values must be all group objects (Pulsar form) or all racks (flat form)")


def _parse_pulsar_form(document: dict[str, Any]) -> RackMap:
    # Later groups (Java order) override earlier ones for a bookie listed in several groups.
    entries: dict[str, BookieRackInfo] = {}
    for group in sorted(document, key=_java_string_order):
        bookies = document[group]
        for bookie_id, raw_info in bookies.items():
            _check_key(bookie_id)
            if raw_info is None:
                info = BookieRackInfo(None, None, group)
            elif isinstance(raw_info, dict):
                rack = _optional_string(raw_info.get("rack"), f"rack of {bookie_id}")
                hostname = _optional_string(raw_info.get("hostname"), f"hostname of {bookie_id}")
                info = BookieRackInfo(normalize_rack(rack), hostname, group)
            else:
                raise FormatError(
                    f"rack map: entry of {bookie_id!r} must be an object, got {type(raw_info).__name__}"
                )
            entries.pop(bookie_id, None)
            entries[bookie_id] = info
    return RackMap(tuple(entries.items()))
