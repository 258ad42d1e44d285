"""Where BookKeeper keeps things in ZooKeeper: the LAYOUT znode, ledger znode paths, special znodes, URIs.

Covers the ZooKeeper-based ledger managers (flat, legacy hierarchical, long hierarchical and the
default hybrid hierarchical); the metastore manager (``MS``) is recognised but has no ZooKeeper ledger paths.
Pure code: no I/O.

* ``LAYOUT`` (``<root>/LAYOUT``): ``"<formatVersion>\\n<factoryClass>:<managerVersion>"``, UTF-8, no trailing
  newline. Format version 1 names a manager *type* (``flat``/``hierarchical``), version 2 a factory *class*,
  possibly carrying a shade prefix (``dlshade.org.apache...``). :func:`parse_layout` reads what BookKeeper's
  reader accepts; :func:`format_layout` writes what BookKeeper's writer writes, so anything BookKeeper wrote
  round-trips byte for byte.
* Ledger znodes: :func:`ledger_path` and its inverse :func:`ledger_id_from_path`; :func:`classify_path` tells
  a ZooKeeper watcher what a changed path under the ledgers root is (ledger, tree directory, special, other).
  Only the *canonical* path of an id counts as a ledger: BookKeeper reads and writes ledger N at exactly
  ``ledger_path(N)``, so e.g. the long-form path of a small id under the hybrid manager is ``OTHER``.
* ``metadataServiceUri``: :func:`parse_metadata_service_uri`.

Addressable ids per manager (decided here; BookKeeper itself does not check when formatting a path):

=================== ============================ ==========================================================
manager             ids                          why
=================== ============================ ==========================================================
flat                0 .. 2^63-1                  ``L%010d``: ids of more than 10 digits print longer, as
                                                 ``FlatLedgerManager`` formats and parses any long (its
                                                 generator stops below ``Integer.MAX_VALUE``, but a client
                                                 may create a ledger with a chosen id)
legacyhierarchical  0 .. 10^10-1                 ``%010d`` split 2-4-4; longer ids would be truncated
longhierarchical    0 .. 2^63-1                  ``%019d`` split 3-4-4-4-4
hierarchical        0 .. 2^63-1                  2-4-4 below ``Integer.MAX_VALUE`` (2147483647), else long
ms                  none                         metadata lives in a metastore, not in ZooKeeper
=================== ============================ ==========================================================

Example:
    >>> ledger_path(59)
    '/ledgers/00/0000/L0059'
    >>> ledger_id_from_path('/ledgers/00/0000/L0059')
    59
    >>> parse_layout(b"2\\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1").manager
    <LedgerManagerType.HIERARCHICAL: 'hierarchical'>
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass
from urllib.parse import unquote

from core.errors import FormatError

DEFAULT_LEDGERS_ROOT = "/ledgers"
LEDGER_NODE_PREFIX = "L"

# Special znodes directly under the ledgers root (``AbstractZkLedgerManager.isSpecialZnode``).
AVAILABLE_NODE = "available"
READONLY_NODE = "readonly"
COOKIES_NODE = "cookies"
LAYOUT_NODE = "LAYOUT"
INSTANCEID_NODE = "INSTANCEID"
UNDERREPLICATION_NODE = "underreplication"
IDGEN_NODE = "idgen"
IDGEN_LONG_NODE = "idgen-long"
ID_GENERATOR_PREFIX = "ID-"
DISABLE_HEALTH_CHECK_NODE = "disableHealthCheck"

SPECIAL_ZNODES = frozenset(
    {
        AVAILABLE_NODE,
        COOKIES_NODE,
        LAYOUT_NODE,
        INSTANCEID_NODE,
        UNDERREPLICATION_NODE,
        IDGEN_NODE,
        IDGEN_LONG_NODE,
    }
)

MAX_LEDGER_ID = 2**63 - 1
JAVA_INT_MAX = 2**31 - 1

LAYOUT_FORMAT_VERSION = 2
LAYOUT_MIN_COMPAT_VERSION = 1
MANAGER_FACTORY_PACKAGE = "org.apache.bookkeeper.meta."


class LedgerIdRangeError(FormatError):
    """A ledger id that the chosen ledger manager cannot address (or that is not a 63-bit id at all).

    Example:
        >>> try:
        ...     ledger_path(10**10, LedgerManagerType.LEGACY_HIERARCHICAL)
        ... except LedgerIdRangeError as err:
        ...     str(err)
        'ledger id 10000000000 is out of range for the legacyhierarchical ledger manager (0..9999999999)'
    """


class LedgerManagerType(enum.Enum):
    """BookKeeper's ledger managers; the value is the manager's short name (``metadataServiceUri``, CLI).

    Example:
        >>> LedgerManagerType.from_name("longhierarchical")
        <LedgerManagerType.LONG_HIERARCHICAL: 'longhierarchical'>
        >>> LedgerManagerType.FLAT.factory_class
        'org.apache.bookkeeper.meta.FlatLedgerManagerFactory'
    """

    FLAT = "flat"
    HIERARCHICAL = "hierarchical"
    LONG_HIERARCHICAL = "longhierarchical"
    LEGACY_HIERARCHICAL = "legacyhierarchical"
    MS = "ms"

    @property
    def factory_class(self) -> str:
        """Fully qualified name of the manager's factory class, as written in a v2 LAYOUT.

        Example:
            >>> LedgerManagerType.MS.factory_class
            'org.apache.bookkeeper.meta.MSLedgerManagerFactory'
        """
        return MANAGER_FACTORY_PACKAGE + _FACTORY_SIMPLE_NAMES[self]

    @classmethod
    def from_name(cls, name: str) -> LedgerManagerType:
        """The manager with short name ``name`` (case-insensitive); unknown names raise FormatError.

        Example:
            >>> LedgerManagerType.from_name("Flat")
            <LedgerManagerType.FLAT: 'flat'>
        """
        for manager in cls:
            if manager.value == name.lower():
                return manager
        known = ", ".join(m.value for m in cls)
        raise FormatError(f"unknown ledger manager {name!r} (known: {known})")


_FACTORY_SIMPLE_NAMES = {
    LedgerManagerType.FLAT: "FlatLedgerManagerFactory",
    LedgerManagerType.HIERARCHICAL: "HierarchicalLedgerManagerFactory",
    LedgerManagerType.LONG_HIERARCHICAL: "LongHierarchicalLedgerManagerFactory",
    LedgerManagerType.LEGACY_HIERARCHICAL: "LegacyHierarchicalLedgerManagerFactory",
    LedgerManagerType.MS: "MSLedgerManagerFactory",
}
_MANAGER_BY_SIMPLE_NAME = {simple: manager for manager, simple in _FACTORY_SIMPLE_NAMES.items()}
# Layout format v1 names a type; BookKeeper only ever knew these two (AbstractZkLedgerManagerFactory).
_V1_TYPE_NAMES = {"flat": LedgerManagerType.FLAT, "hierarchical": LedgerManagerType.HIERARCHICAL}
# A shade prefix is a dotted Java package prefix, e.g. "dlshade." (allowShadedLedgerManagerFactoryClass).
_SHADED_FACTORY = re.compile(r"((?:[A-Za-z_$][A-Za-z0-9_$]*\.)*)org\.apache\.bookkeeper\.meta\.([A-Za-z]+)")


# --------------------------------------------------------------------------------------------------------
# Java-compatible primitives (LedgerLayout uses String.split and Integer.parseInt)


def _java_split(text: str, separator: str) -> list[str]:
    """Java String.split, literal one-char separator: no match → [text], else trailing empties dropped."""
    parts = text.split(separator)
    if len(parts) == 1:
        return parts
    while parts and parts[-1] == "":
        parts.pop()
    return parts


_JAVA_INT = re.compile(r"[+-]?[0-9]+")


def _parse_java_int(text: str, what: str) -> int:
    """``Integer.parseInt`` restricted to ASCII digits: optional sign, 32-bit range."""
    if not _JAVA_INT.fullmatch(text):
        raise FormatError(f"{what}: {text[:40]!r} is not an integer")
    value = int(text)
    if not -(2**31) <= value <= JAVA_INT_MAX:
        raise FormatError(f"{what}: {text[:40]!r} does not fit a 32-bit integer")
    return value


def _decode_utf8(data: bytes | str, what: str) -> str:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FormatError(f"{what}: not UTF-8 ({err.reason} at byte {err.start})") from None


# --------------------------------------------------------------------------------------------------------
# LAYOUT


def manager_for_factory_class(
    factory_class: str, format_version: int = LAYOUT_FORMAT_VERSION
) -> LedgerManagerType:
    """The manager a LAYOUT's class (v2, shade prefix allowed) or type name (v1) designates.

    Example:
        >>> manager_for_factory_class("dlshade.org.apache.bookkeeper.meta.FlatLedgerManagerFactory")
        <LedgerManagerType.FLAT: 'flat'>
        >>> manager_for_factory_class("hierarchical", format_version=1)
        <LedgerManagerType.HIERARCHICAL: 'hierarchical'>
    """
    if format_version <= 1:
        manager = _V1_TYPE_NAMES.get(factory_class)
        if manager is None:
            raise FormatError(
                f"LAYOUT: unknown ledger manager type {factory_class[:80]!r} (v1 knows flat, hierarchical)"
            )
        return manager
    match = _SHADED_FACTORY.fullmatch(factory_class)
    manager = _MANAGER_BY_SIMPLE_NAME.get(match.group(2)) if match else None
    if manager is None:
        raise FormatError(f"LAYOUT: unknown ledger manager factory class {factory_class[:120]!r}")
    return manager


@dataclass(frozen=True)
class LedgerLayout:
    """Contents of ``<root>/LAYOUT``; ``manager_class`` is kept as written (type name, class, shaded class).

    Example:
        >>> layout = LedgerLayout.for_manager(LedgerManagerType.LONG_HIERARCHICAL)
        >>> format_layout(layout)
        '2\\norg.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory:1'
        >>> parse_layout("2\\ndlshade.org.apache.bookkeeper.meta.FlatLedgerManagerFactory:1").shade_prefix
        'dlshade.'
    """

    format_version: int
    manager: LedgerManagerType
    manager_class: str
    manager_version: int

    def __post_init__(self) -> None:
        # Keep the model consistent so that formatting never writes a LAYOUT BookKeeper would reject.
        if not LAYOUT_MIN_COMPAT_VERSION <= self.format_version <= LAYOUT_FORMAT_VERSION:
            raise FormatError(
                f"LAYOUT: format version {self.format_version} not supported "
                f"({LAYOUT_MIN_COMPAT_VERSION}..{LAYOUT_FORMAT_VERSION})"
            )
        if not -(2**31) <= self.manager_version <= JAVA_INT_MAX:
            raise FormatError(f"LAYOUT: manager version {self.manager_version} does not fit a 32-bit integer")
        if "\n" in self.manager_class or ":" in self.manager_class:
            raise FormatError("LAYOUT: manager class must not contain ':' or a newline")
        resolved = manager_for_factory_class(self.manager_class, self.format_version)
        if resolved is not self.manager:
            raise FormatError(
                f"LAYOUT: class {self.manager_class!r} is the {resolved.value} manager, "
                f"not {self.manager.value}"
            )

    @classmethod
    def for_manager(cls, manager: LedgerManagerType, manager_version: int = 1) -> LedgerLayout:
        """The v2 LAYOUT BookKeeper writes for ``manager`` (every factory's ``CUR_VERSION`` is 1).

        Example:
            >>> LedgerLayout.for_manager(LedgerManagerType.FLAT).manager_class
            'org.apache.bookkeeper.meta.FlatLedgerManagerFactory'
        """
        return cls(LAYOUT_FORMAT_VERSION, manager, manager.factory_class, manager_version)

    @property
    def shade_prefix(self) -> str:
        """The shade prefix of a v2 class name (``""`` when unshaded or for v1 type names).

        Example:
            >>> LedgerLayout.for_manager(LedgerManagerType.FLAT).shade_prefix
            ''
        """
        if self.format_version <= 1:
            return ""
        return self.manager_class[: -len(self.manager.factory_class)]


def parse_layout(data: bytes | str) -> LedgerLayout:
    """Parse a LAYOUT znode the way ``LedgerLayout.parseLayout`` (plus the factory lookup) does.

    Like BookKeeper: lines split on ``\\n`` with trailing empty lines ignored, extra lines ignored, integers
    may carry a sign. Anything BookKeeper rejects, or an unknown manager, raises :class:`FormatError`.

    Example:
        >>> layout = parse_layout("1\\nflat:1")
        >>> layout.format_version, layout.manager, layout.manager_class, layout.manager_version
        (1, <LedgerManagerType.FLAT: 'flat'>, 'flat', 1)
        >>> parse_layout(b"3\\nflat:1")
        Traceback (most recent call last):
        ...
        core.errors.FormatError: LAYOUT: format version 3 not supported (1..2)
    """
    text = _decode_utf8(data, "LAYOUT")
    lines = _java_split(text, "\n")
    if not lines or lines[0] == "":
        raise FormatError("LAYOUT: empty")
    format_version = _parse_java_int(lines[0], "LAYOUT format version")
    if not LAYOUT_MIN_COMPAT_VERSION <= format_version <= LAYOUT_FORMAT_VERSION:
        raise FormatError(
            f"LAYOUT: format version {format_version} not supported "
            f"({LAYOUT_MIN_COMPAT_VERSION}..{LAYOUT_FORMAT_VERSION})"
        )
    if len(lines) < 2:
        raise FormatError("LAYOUT: ledger manager and its version are missing")
    parts = _java_split(lines[1], ":")
    if len(parts) != 2:
        raise FormatError(f"LAYOUT: ledger manager line {lines[1][:120]!r} is not '<manager>:<version>'")
    manager_version = _parse_java_int(parts[1], "LAYOUT manager version")
    manager = manager_for_factory_class(parts[0], format_version)
    return LedgerLayout(format_version, manager, parts[0], manager_version)


def format_layout(layout: LedgerLayout) -> str:
    """LAYOUT text exactly as ``LedgerLayout.serialize`` writes it (no trailing newline).

    Example:
        >>> format_layout(LedgerLayout.for_manager(LedgerManagerType.HIERARCHICAL))
        '2\\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1'
    """
    return f"{layout.format_version}\n{layout.manager_class}:{layout.manager_version}"


# --------------------------------------------------------------------------------------------------------
# Ledgers root and root-level znodes

# ZooKeeper's PathUtils.validatePath refuses these characters in a path.
_ZK_FORBIDDEN_CHARS = re.compile("[\u0000-\u001f\u007f-\u009f\ud800-\uf8ff\ufff0-\uffff]")


def validate_root(root: str) -> str:
    """Return ``root`` if it is a usable ledgers root path, else raise :class:`FormatError`.

    It must be an absolute ZooKeeper path other than ``/``, without a trailing ``/``, empty, ``.`` or ``..``
    components, or characters ZooKeeper forbids.

    Example:
        >>> validate_root("/pulsar/ledgers")
        '/pulsar/ledgers'
        >>> validate_root("ledgers")
        Traceback (most recent call last):
        ...
        core.errors.FormatError: ledgers root 'ledgers' must start with '/'
    """
    if not isinstance(root, str):
        raise FormatError(f"ledgers root must be a string, got {type(root).__name__}")
    return _validate_root_text(root)


@functools.lru_cache(maxsize=64)  # called for every path built or classified; roots are few
def _validate_root_text(root: str) -> str:
    if not root.startswith("/"):
        raise FormatError(f"ledgers root {root[:80]!r} must start with '/'")
    if root == "/":
        raise FormatError("ledgers root must not be '/' (BookKeeper appends '/<child>' to it)")
    if root.endswith("/"):
        raise FormatError(f"ledgers root {root[:80]!r} must not end with '/'")
    for component in root[1:].split("/"):
        if component in ("", ".", ".."):
            raise FormatError(f"ledgers root {root[:80]!r} has an empty, '.' or '..' component")
    if _ZK_FORBIDDEN_CHARS.search(root):
        raise FormatError(f"ledgers root {root[:80]!r} contains a character ZooKeeper does not allow")
    if root == "/zookeeper" or root.startswith("/zookeeper/"):
        raise FormatError("ledgers root must not be under /zookeeper (reserved by ZooKeeper)")
    return root


def is_special_znode(name: str) -> bool:
    """True for a child of the ledgers root that is not part of the ledger tree (``isSpecialZnode``).

    Example:
        >>> [is_special_znode(n) for n in ("available", "ID-0000000001", "00", "readonly")]
        [True, True, False, False]
    """
    return name in SPECIAL_ZNODES or name.startswith(ID_GENERATOR_PREFIX)


def layout_path(root: str = DEFAULT_LEDGERS_ROOT) -> str:
    """``<root>/LAYOUT``.

    Example:
        >>> layout_path()
        '/ledgers/LAYOUT'
    """
    return f"{validate_root(root)}/{LAYOUT_NODE}"


def instance_id_path(root: str = DEFAULT_LEDGERS_ROOT) -> str:
    """``<root>/INSTANCEID`` (the cluster's UUID).

    Example:
        >>> instance_id_path("/bk")
        '/bk/INSTANCEID'
    """
    return f"{validate_root(root)}/{INSTANCEID_NODE}"


def available_path(root: str = DEFAULT_LEDGERS_ROOT) -> str:
    """``<root>/available``: parent of writable bookie registrations.

    Example:
        >>> available_path()
        '/ledgers/available'
    """
    return f"{validate_root(root)}/{AVAILABLE_NODE}"


def readonly_path(root: str = DEFAULT_LEDGERS_ROOT) -> str:
    """``<root>/available/readonly``: parent of read-only bookie registrations.

    Example:
        >>> readonly_path()
        '/ledgers/available/readonly'
    """
    return f"{validate_root(root)}/{AVAILABLE_NODE}/{READONLY_NODE}"


def cookies_path(root: str = DEFAULT_LEDGERS_ROOT) -> str:
    """``<root>/cookies``: one child per bookie ever formatted ("all bookies").

    Example:
        >>> cookies_path()
        '/ledgers/cookies'
    """
    return f"{validate_root(root)}/{COOKIES_NODE}"


def disable_health_check_path(root: str = DEFAULT_LEDGERS_ROOT) -> str:
    """``<root>/disableHealthCheck``: its presence disables the client health check.

    Example:
        >>> disable_health_check_path()
        '/ledgers/disableHealthCheck'
    """
    return f"{validate_root(root)}/{DISABLE_HEALTH_CHECK_NODE}"


# --------------------------------------------------------------------------------------------------------
# Ledger znode paths


@dataclass(frozen=True)
class _TreeForm:
    """One path shape: digit widths of each component (the last is the leaf, prefixed with ``L``)."""

    widths: tuple[int, ...]
    min_id: int
    max_id: int
    leaf_grows: bool = False  # the leaf's width is a minimum (flat's ``L%010d``), not a split

    @property
    def total_width(self) -> int:
        return sum(self.widths)

    def path(self, root: str, ledger_id: int) -> str:
        digits = f"{ledger_id:0{self.total_width}d}"
        parts: list[str] = []
        start = 0
        for width in self.widths:
            parts.append(digits[start : start + width])
            start += width
        if self.leaf_grows:
            parts[-1] += digits[start:]
        parts[-1] = LEDGER_NODE_PREFIX + parts[-1]
        return root + "/" + "/".join(parts)

    def prefix_reaches_range(self, digits: str) -> bool:
        """Whether some id in [min_id, max_id] has a zero-padded form starting with ``digits``."""
        scale = 10 ** (self.total_width - len(digits))
        low = int(digits) * scale
        high = low + scale - 1
        return low <= self.max_id and high >= self.min_id


_SHORT_WIDTHS = (2, 4, 4)
_LONG_WIDTHS = (3, 4, 4, 4, 4)
# BookKeeper's hybrid test is strictly ``id < Integer.MAX_VALUE``: 2147483647 itself uses the long form.
_FORMS: dict[LedgerManagerType, tuple[_TreeForm, ...]] = {
    LedgerManagerType.FLAT: (_TreeForm((10,), 0, MAX_LEDGER_ID, leaf_grows=True),),
    LedgerManagerType.LEGACY_HIERARCHICAL: (_TreeForm(_SHORT_WIDTHS, 0, 10**10 - 1),),
    LedgerManagerType.LONG_HIERARCHICAL: (_TreeForm(_LONG_WIDTHS, 0, MAX_LEDGER_ID),),
    LedgerManagerType.HIERARCHICAL: (
        _TreeForm(_SHORT_WIDTHS, 0, JAVA_INT_MAX - 1),
        _TreeForm(_LONG_WIDTHS, JAVA_INT_MAX, MAX_LEDGER_ID),
    ),
    LedgerManagerType.MS: (),
}


def check_ledger_id(ledger_id: int) -> int:
    """Return ``ledger_id`` if it is a BookKeeper ledger id (0..2^63-1), else raise LedgerIdRangeError.

    Example:
        >>> check_ledger_id(2**63 - 1)
        9223372036854775807
        >>> check_ledger_id(-1)
        Traceback (most recent call last):
        ...
        core.domain.layout.LedgerIdRangeError: ledger id -1 is out of range (0..9223372036854775807)
    """
    if isinstance(ledger_id, bool) or not isinstance(ledger_id, int):
        raise LedgerIdRangeError(f"ledger id must be an integer, got {type(ledger_id).__name__}")
    if not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise LedgerIdRangeError(f"ledger id {ledger_id} is out of range (0..{MAX_LEDGER_ID})")
    return ledger_id


def max_ledger_id(manager: LedgerManagerType) -> int | None:
    """Largest id ``manager`` can address in ZooKeeper (None for the metastore manager).

    Example:
        >>> max_ledger_id(LedgerManagerType.LEGACY_HIERARCHICAL)
        9999999999
    """
    forms = _FORMS[manager]
    return max(form.max_id for form in forms) if forms else None


def ledger_path(
    ledger_id: int,
    manager: LedgerManagerType = LedgerManagerType.HIERARCHICAL,
    root: str = DEFAULT_LEDGERS_ROOT,
) -> str:
    """The metadata znode of ``ledger_id`` under ``manager``.

    Raises :class:`LedgerIdRangeError` for ids the manager cannot address (see the module table) and
    :class:`FormatError` for a bad root or the metastore manager.

    Example:
        >>> ledger_path(12345)
        '/ledgers/00/0001/L2345'
        >>> ledger_path(2147483647)
        '/ledgers/000/0000/0021/4748/L3647'
        >>> ledger_path(59, LedgerManagerType.FLAT, "/bk")
        '/bk/L0000000059'
        >>> ledger_path(98765432101, LedgerManagerType.FLAT)  # L%010d: longer ids print longer
        '/ledgers/L98765432101'
    """
    validate_root(root)
    check_ledger_id(ledger_id)
    forms = _FORMS[manager]
    if not forms:
        raise FormatError(f"the {manager.value} ledger manager keeps ledger metadata outside ZooKeeper")
    for form in forms:
        if form.min_id <= ledger_id <= form.max_id:
            return form.path(root, ledger_id)
    limit = max(form.max_id for form in forms)
    raise LedgerIdRangeError(
        f"ledger id {ledger_id} is out of range for the {manager.value} ledger manager (0..{limit})"
    )


class ZnodeKind(enum.Enum):
    """What a path is, relative to a ledgers root and a ledger manager (see :func:`classify_path`).

    Example:
        >>> classify_path("/ledgers").kind, classify_path("/bookies").kind
        (<ZnodeKind.ROOT: 'root'>, <ZnodeKind.OUTSIDE: 'outside'>)
    """

    ROOT = "root"  # the ledgers root itself
    LEDGER = "ledger"  # a ledger metadata znode (canonical path of a valid id)
    INTERMEDIATE = (
        "intermediate"  # a directory of the manager's ledger tree (an ancestor of some ledger path)
    )
    SPECIAL = "special"  # a special znode (available, cookies, LAYOUT, ...) or anything below one
    OTHER = "other"  # under the root, but none of the above
    OUTSIDE = "outside"  # not under the root


@dataclass(frozen=True)
class LedgerTreeNode:
    """Result of :func:`classify_path`: the kind, and the ledger id for ``LEDGER``.

    Example:
        >>> classify_path("/ledgers/00/0000")
        LedgerTreeNode(kind=<ZnodeKind.INTERMEDIATE: 'intermediate'>, ledger_id=None)
    """

    kind: ZnodeKind
    ledger_id: int | None = None


def _is_digits(text: str, width: int) -> bool:
    # str.isdigit alone accepts non-ASCII digits; ZooKeeper names here are ASCII.
    return len(text) == width and text.isascii() and text.isdigit()


def _is_leaf_digits(text: str, form: _TreeForm) -> bool:
    """Whether ``text`` is the digits of a leaf as ``form`` writes them (growing leaves: no extra zeros)."""
    width = form.widths[-1]
    if not form.leaf_grows or len(text) <= width:
        return _is_digits(text, width)
    return _is_digits(text, len(text)) and not text.startswith("0")


def _classify_in_form(components: list[str], form: _TreeForm) -> LedgerTreeNode | None:
    depth = len(form.widths)
    if len(components) > depth:
        return None
    digits: list[str] = []
    for index, component in enumerate(components):
        width = form.widths[index]
        if index == depth - 1:
            if not component.startswith(LEDGER_NODE_PREFIX) or not _is_leaf_digits(component[1:], form):
                return None
            digits.append(component[1:])
        else:
            if not _is_digits(component, width):
                return None
            digits.append(component)
    joined = "".join(digits)
    if len(components) == depth:
        ledger_id = int(joined)
        if form.min_id <= ledger_id <= form.max_id:
            return LedgerTreeNode(ZnodeKind.LEDGER, ledger_id)
        return None
    if form.prefix_reaches_range(joined):
        return LedgerTreeNode(ZnodeKind.INTERMEDIATE)
    return None


def classify_path(
    path: str, manager: LedgerManagerType = LedgerManagerType.HIERARCHICAL, root: str = DEFAULT_LEDGERS_ROOT
) -> LedgerTreeNode:
    """Tell what ``path`` is for ``manager`` under ``root``; never raises for odd paths (only for a bad root).

    Used by the ZooKeeper watcher to route change notifications: ``LEDGER`` carries the id, ``INTERMEDIATE``
    directories hold more of the tree, ``SPECIAL`` subtrees are handled elsewhere (registration, cookies,
    under-replication), ``OTHER`` is foreign or non-canonical.

    Example:
        >>> classify_path("/ledgers/12/3456/L7890")
        LedgerTreeNode(kind=<ZnodeKind.LEDGER: 'ledger'>, ledger_id=1234567890)
        >>> classify_path("/ledgers/available/bk1:3181").kind
        <ZnodeKind.SPECIAL: 'special'>
        >>> classify_path("/ledgers/L0000000059").kind  # a flat path is foreign to the hybrid manager
        <ZnodeKind.OTHER: 'other'>
    """
    validate_root(root)
    if path == root:
        return LedgerTreeNode(ZnodeKind.ROOT)
    if not path.startswith(root + "/"):
        return LedgerTreeNode(ZnodeKind.OUTSIDE)
    components = path[len(root) + 1 :].split("/")
    if is_special_znode(components[0]):
        return LedgerTreeNode(ZnodeKind.SPECIAL)
    for form in _FORMS[manager]:
        node = _classify_in_form(components, form)
        if node is not None:
            return node
    return LedgerTreeNode(ZnodeKind.OTHER)


ZK_LEDGER_MANAGERS = tuple(manager for manager in LedgerManagerType if _FORMS[manager])
"""The ledger managers that keep ledger metadata in ZooKeeper (all but the metastore manager)."""


def managers_holding_path(path: str, root: str = DEFAULT_LEDGERS_ROOT) -> tuple[LedgerManagerType, ...]:
    """The ZooKeeper ledger managers whose ledger tree holds ``path`` (as a ledger znode or a directory).

    Tells a watcher why a znode under the root is no ledger of *its* manager: one that another manager would
    read points at a wrong manager setting (or a second cluster's tree) rather than at foreign data.

    Example:
        >>> [manager.value for manager in managers_holding_path("/ledgers/L0000000059")]
        ['flat']
        >>> managers_holding_path("/ledgers/backup")
        ()
    """
    return tuple(
        manager
        for manager in ZK_LEDGER_MANAGERS
        if classify_path(path, manager, root).kind in (ZnodeKind.LEDGER, ZnodeKind.INTERMEDIATE)
    )


def ledger_id_from_path(
    path: str, manager: LedgerManagerType = LedgerManagerType.HIERARCHICAL, root: str = DEFAULT_LEDGERS_ROOT
) -> int | None:
    """The ledger id of a ledger znode; None for the root, special znodes and tree directories.

    A path that is outside the root, foreign, or not the canonical path of a valid id raises
    :class:`FormatError`.

    Example:
        >>> ledger_id_from_path("/ledgers/000/0000/0021/4748/L3647")
        2147483647
        >>> ledger_id_from_path("/ledgers/idgen") is None
        True
        >>> ledger_id_from_path("/ledgers/L0000000059", LedgerManagerType.FLAT)
        59
    """
    node = classify_path(path, manager, root)
    if node.kind is ZnodeKind.LEDGER:
        return node.ledger_id
    if node.kind in (ZnodeKind.ROOT, ZnodeKind.SPECIAL, ZnodeKind.INTERMEDIATE):
        return None
    where = "outside" if node.kind is ZnodeKind.OUTSIDE else "not a ledger znode under"
    raise FormatError(f"path {path[:200]!r} is {where} {root} for the {manager.value} ledger manager")


# --------------------------------------------------------------------------------------------------------
# metadataServiceUri


@dataclass(frozen=True)
class MetadataServiceUri:
    """A parsed ``metadataServiceUri``; ``manager`` None means "read it from LAYOUT".

    Example:
        >>> uri = parse_metadata_service_uri("zk+hierarchical://zk1:2181;zk2:2181/ledgers")
        >>> uri.servers, uri.ledgers_root, uri.manager
        (('zk1:2181', 'zk2:2181'), '/ledgers', <LedgerManagerType.HIERARCHICAL: 'hierarchical'>)
        >>> uri.zk_connect_string
        'zk1:2181,zk2:2181'
    """

    servers: tuple[str, ...]
    ledgers_root: str
    manager: LedgerManagerType | None

    @property
    def zk_connect_string(self) -> str:
        """ZooKeeper connect string (BookKeeper replaces ``;`` with ``,``).

        Example:
            >>> parse_metadata_service_uri("zk://a:1;b:2/ledgers").zk_connect_string
            'a:1,b:2'
        """
        return ",".join(self.servers)


_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://([^/?#]*)([^?#]*)(?:\?[^#]*)?(?:#.*)?", re.DOTALL)
# Manager names the URI scheme may carry (ZKMetadataDriverBase.resolveLedgerManagerFactory); "null" = LAYOUT.
_URI_MANAGERS: dict[str, LedgerManagerType | None] = {
    "flat": LedgerManagerType.FLAT,
    "hierarchical": LedgerManagerType.HIERARCHICAL,
    "longhierarchical": LedgerManagerType.LONG_HIERARCHICAL,
    "ms": LedgerManagerType.MS,
    "null": None,
}


def parse_metadata_service_uri(uri: str) -> MetadataServiceUri:
    """Parse ``zk[+<manager>]://<server>[;<server>...]/<ledgers root>``.

    The scheme is case-insensitive; ``zk`` and ``zk+null`` leave the manager to LAYOUT. ZooKeeper servers are
    separated by ``;`` (``,`` is accepted too). A missing authority or ledgers root path, an unknown manager
    or another scheme raises :class:`FormatError`.

    Example:
        >>> parse_metadata_service_uri("zk://localhost:2181/pulsar/ledgers").manager is None
        True
        >>> parse_metadata_service_uri("zk+flat://h:2181").ledgers_root
        Traceback (most recent call last):
        ...
        core.errors.FormatError: metadataServiceUri 'zk+flat://h:2181' has no ledgers root path
    """
    shown = uri[:200]
    match = _URI.fullmatch(uri.strip())
    if match is None:
        raise FormatError(f"metadataServiceUri {shown!r} is not '<scheme>://<servers>/<ledgers root>'")
    scheme, authority, raw_path = match.groups()
    # commons-lang StringUtils.split: empty tokens are dropped.
    scheme_parts = [part for part in scheme.lower().split("+") if part]
    if not scheme_parts or scheme_parts[0] != "zk":
        raise FormatError(
            f"metadataServiceUri {shown!r}: unsupported scheme {scheme!r} (expected zk[+manager])"
        )
    manager: LedgerManagerType | None = None
    if len(scheme_parts) > 1:
        if scheme_parts[1] not in _URI_MANAGERS:
            raise FormatError(
                f"metadataServiceUri {shown!r}: unknown ledger manager type {scheme_parts[1]!r}"
            )
        manager = _URI_MANAGERS[scheme_parts[1]]
    servers = tuple(re.split(r"[;,]", authority))
    if authority == "" or any(server == "" for server in servers):
        raise FormatError(f"metadataServiceUri {shown!r} has no or an empty ZooKeeper server")
    try:
        path = unquote(raw_path, errors="strict")
    except UnicodeDecodeError:
        raise FormatError(f"metadataServiceUri {shown!r}: path is not UTF-8 after %-decoding") from None
    if path == "":
        raise FormatError(f"metadataServiceUri {shown!r} has no ledgers root path")
    try:
        validate_root(path)
    except FormatError as err:
        raise FormatError(f"metadataServiceUri {shown!r}: {err}") from None
    return MetadataServiceUri(servers, path, manager)
