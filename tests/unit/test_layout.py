"""LAYOUT codec, ledger znode paths per manager, path classification and metadataServiceUri."""

from __future__ import annotations

import contextlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.layout import (
    DEFAULT_LEDGERS_ROOT,
    JAVA_INT_MAX,
    MAX_LEDGER_ID,
    LedgerIdRangeError,
    LedgerLayout,
    LedgerManagerType,
    LedgerTreeNode,
    ZnodeKind,
    classify_path,
    format_layout,
    is_special_znode,
    ledger_id_from_path,
    ledger_path,
    max_ledger_id,
    parse_layout,
    parse_metadata_service_uri,
    validate_root,
)
from core.errors import FormatError

FLAT = LedgerManagerType.FLAT
HIER = LedgerManagerType.HIERARCHICAL
LONG = LedgerManagerType.LONG_HIERARCHICAL
LEGACY = LedgerManagerType.LEGACY_HIERARCHICAL
MS = LedgerManagerType.MS
ZK_MANAGERS = (FLAT, HIER, LONG, LEGACY)

# BookKeeper's ledger path examples: id → (flat, hierarchical, long-hierarchical).
FACTS_PATHS = {
    0: ("/ledgers/L0000000000", "/ledgers/00/0000/L0000", "/ledgers/000/0000/0000/0000/L0000"),
    59: ("/ledgers/L0000000059", "/ledgers/00/0000/L0059", "/ledgers/000/0000/0000/0000/L0059"),
    12345: ("/ledgers/L0000012345", "/ledgers/00/0001/L2345", "/ledgers/000/0000/0000/0001/L2345"),
    1234567890: ("/ledgers/L1234567890", "/ledgers/12/3456/L7890", "/ledgers/000/0000/0012/3456/L7890"),
}

TYPICAL_LAYOUTS = {
    "2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1": HIER,
    "2\norg.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory:1": LONG,
    "2\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory:1": FLAT,
    "2\norg.apache.bookkeeper.meta.LegacyHierarchicalLedgerManagerFactory:1": LEGACY,
    "2\norg.apache.bookkeeper.meta.MSLedgerManagerFactory:1": MS,
    "1\nhierarchical:1": HIER,
    "1\nflat:1": FLAT,
}


def id_ranges(manager: LedgerManagerType) -> st.SearchStrategy[int]:
    limit = max_ledger_id(manager)
    assert limit is not None
    edges = [0, 1, JAVA_INT_MAX - 1, JAVA_INT_MAX, 10**10 - 1, 10**10, MAX_LEDGER_ID]
    return st.one_of(
        st.integers(0, limit),
        st.sampled_from([e for e in edges if e <= limit]),
        st.integers(0, min(2**40, limit)),
    )


# ---------------------------------------------------------------------------------------------------- paths


@pytest.mark.parametrize("ledger_id", sorted(FACTS_PATHS))
def test_facts_path_table(ledger_id: int) -> None:
    flat, hierarchical, long_hierarchical = FACTS_PATHS[ledger_id]
    assert ledger_path(ledger_id, FLAT) == flat
    assert ledger_path(ledger_id) == hierarchical
    assert ledger_path(ledger_id, HIER) == hierarchical
    assert ledger_path(ledger_id, LEGACY) == hierarchical  # legacy is 2-4-4 like the short hybrid form
    assert ledger_path(ledger_id, LONG) == long_hierarchical
    assert ledger_id_from_path(flat, FLAT) == ledger_id
    assert ledger_id_from_path(hierarchical) == ledger_id
    assert ledger_id_from_path(long_hierarchical, LONG) == ledger_id


def test_hybrid_boundary_is_strictly_below_int_max() -> None:
    assert ledger_path(2147483646) == "/ledgers/21/4748/L3646"
    assert ledger_path(2147483647) == "/ledgers/000/0000/0021/4748/L3647"
    assert ledger_path(2**32) == "/ledgers/000/0000/0042/9496/L7296"  # first LongZkLedgerIdGenerator id
    assert ledger_path(MAX_LEDGER_ID) == "/ledgers/922/3372/0368/5477/L5807"
    # The same boundary, inverted: a short path beyond it is not a ledger of the hybrid manager.
    assert classify_path("/ledgers/21/4748/L3647").kind is ZnodeKind.OTHER
    assert classify_path("/ledgers/000/0000/0021/4748/L3646").kind is ZnodeKind.OTHER


def test_limits_per_manager() -> None:
    assert ledger_path(JAVA_INT_MAX - 1, FLAT) == "/ledgers/L2147483646"
    assert ledger_path(MAX_LEDGER_ID, FLAT) == "/ledgers/L9223372036854775807"
    assert ledger_path(10**10 - 1, LEGACY) == "/ledgers/99/9999/L9999"
    with pytest.raises(LedgerIdRangeError, match="legacyhierarchical"):
        ledger_path(10**10, LEGACY)
    assert ledger_path(MAX_LEDGER_ID, LONG) == "/ledgers/922/3372/0368/5477/L5807"
    for manager in ZK_MANAGERS:
        with pytest.raises(LedgerIdRangeError):
            ledger_path(-1, manager)
        with pytest.raises(LedgerIdRangeError):
            ledger_path(MAX_LEDGER_ID + 1, manager)
    with pytest.raises(FormatError, match="outside ZooKeeper"):
        ledger_path(1, MS)
    assert max_ledger_id(MS) is None


@pytest.mark.parametrize("bad", [True, 1.0, "5", None])
def test_ledger_id_must_be_int(bad: object) -> None:
    with pytest.raises(LedgerIdRangeError):
        ledger_path(bad)  # type: ignore[arg-type]


def test_range_error_is_a_format_error_and_value_error() -> None:
    assert issubclass(LedgerIdRangeError, FormatError)
    assert issubclass(LedgerIdRangeError, ValueError)


@pytest.mark.parametrize("manager", ZK_MANAGERS, ids=lambda m: m.value)
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_path_id_round_trip(manager: LedgerManagerType, data: st.DataObject) -> None:
    ledger_id = data.draw(id_ranges(manager))
    root = data.draw(st.sampled_from([DEFAULT_LEDGERS_ROOT, "/pulsar/ledgers", "/a-b/c_d"]))
    path = ledger_path(ledger_id, manager, root)
    assert classify_path(path, manager, root) == LedgerTreeNode(ZnodeKind.LEDGER, ledger_id)
    assert ledger_id_from_path(path, manager, root) == ledger_id
    # Every ancestor below the root is a directory of the manager's tree.
    parts = path[len(root) + 1 :].split("/")
    for depth in range(1, len(parts)):
        ancestor = root + "/" + "/".join(parts[:depth])
        assert classify_path(ancestor, manager, root).kind is ZnodeKind.INTERMEDIATE
        assert ledger_id_from_path(ancestor, manager, root) is None


@pytest.mark.parametrize("manager", ZK_MANAGERS, ids=lambda m: m.value)
@pytest.mark.parametrize("ledger_id", [0, 2147483646, 2147483647, 10**10 - 1, MAX_LEDGER_ID])
def test_boundary_ids_for_every_manager(manager: LedgerManagerType, ledger_id: int) -> None:
    limit = max_ledger_id(manager)
    assert limit is not None
    if ledger_id > limit:
        with pytest.raises(LedgerIdRangeError):
            ledger_path(ledger_id, manager)
    else:
        assert ledger_id_from_path(ledger_path(ledger_id, manager), manager) == ledger_id


@settings(max_examples=300, deadline=None)
@given(st.integers(0, MAX_LEDGER_ID), st.integers(0, MAX_LEDGER_ID))
def test_distinct_ids_have_distinct_paths(a: int, b: int) -> None:
    if a != b:
        assert ledger_path(a) != ledger_path(b)
        assert ledger_path(a, LONG) != ledger_path(b, LONG)


def test_paths_from_different_managers_are_foreign() -> None:
    assert classify_path("/ledgers/L0000000059", HIER).kind is ZnodeKind.OTHER
    assert classify_path("/ledgers/00/0000/L0059", FLAT).kind is ZnodeKind.OTHER
    assert classify_path("/ledgers/000/0000/0000/0000/L0059", LEGACY).kind is ZnodeKind.OTHER
    assert classify_path("/ledgers/00/0000/L0059", LONG).kind is ZnodeKind.OTHER
    # The long form of a small id is not where the hybrid manager keeps it.
    assert classify_path("/ledgers/000/0000/0000/0000/L0059", HIER).kind is ZnodeKind.OTHER
    with pytest.raises(FormatError, match="not a ledger znode"):
        ledger_id_from_path("/ledgers/000/0000/0000/0000/L0059", HIER)


@pytest.mark.parametrize(
    "name",
    [
        "available",
        "cookies",
        "LAYOUT",
        "INSTANCEID",
        "underreplication",
        "idgen",
        "idgen-long",
        "ID-0000000001",
        "ID-",
    ],
)
def test_special_znodes(name: str) -> None:
    assert is_special_znode(name)
    for manager in (*ZK_MANAGERS, MS):
        assert classify_path(f"/ledgers/{name}", manager).kind is ZnodeKind.SPECIAL
        assert classify_path(f"/ledgers/{name}/child/grandchild", manager).kind is ZnodeKind.SPECIAL
        assert ledger_id_from_path(f"/ledgers/{name}", manager) is None


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/ledgers", ZnodeKind.ROOT),
        ("/ledgers/00", ZnodeKind.INTERMEDIATE),
        ("/ledgers/21/4748", ZnodeKind.INTERMEDIATE),
        ("/ledgers/000", ZnodeKind.INTERMEDIATE),
        ("/ledgers/922/3372/0368/5477", ZnodeKind.INTERMEDIATE),
        ("/ledgers/922/3372/0368/5478", ZnodeKind.OTHER),  # no 63-bit id lives below it
        ("/ledgers/923", ZnodeKind.OTHER),
        ("/ledgers/22", ZnodeKind.OTHER),  # short ids stop below 2147483647
        ("/ledgers/21/4749", ZnodeKind.OTHER),
        ("/ledgers/readonly", ZnodeKind.OTHER),
        ("/ledgers/00/0000/l0059", ZnodeKind.OTHER),
        ("/ledgers/00/0000/L059", ZnodeKind.OTHER),
        ("/ledgers/00/0000/L0059/extra", ZnodeKind.OTHER),
        ("/ledgers/0a/0000/L0059", ZnodeKind.OTHER),
        ("/ledgers/٠٠/0000/L0059", ZnodeKind.OTHER),  # non-ASCII digits
        ("/ledgers/", ZnodeKind.OTHER),
        ("/ledgers//00", ZnodeKind.OTHER),
        ("/ledgersX/00", ZnodeKind.OUTSIDE),
        ("/bookies", ZnodeKind.OUTSIDE),
        ("", ZnodeKind.OUTSIDE),
    ],
)
def test_classify_hybrid(path: str, kind: ZnodeKind) -> None:
    assert classify_path(path).kind is kind


def test_ledger_id_from_path_errors() -> None:
    assert ledger_id_from_path("/ledgers") is None
    with pytest.raises(FormatError, match="outside"):
        ledger_id_from_path("/other/00/0000/L0059")
    with pytest.raises(FormatError, match="not a ledger znode"):
        ledger_id_from_path("/ledgers/foo")


def test_flat_and_legacy_intermediates() -> None:
    assert classify_path("/ledgers/99", LEGACY).kind is ZnodeKind.INTERMEDIATE
    assert classify_path("/ledgers/99/9999/L9999", LEGACY) == LedgerTreeNode(ZnodeKind.LEDGER, 9999999999)
    assert classify_path("/ledgers/00", FLAT).kind is ZnodeKind.OTHER
    assert classify_path("/ledgers/L0000000000", FLAT) == LedgerTreeNode(ZnodeKind.LEDGER, 0)
    assert classify_path("/ledgers/L000000059", FLAT).kind is ZnodeKind.OTHER  # 9 digits: not %010d
    assert classify_path("/ledgers/00/0000/L0059", MS).kind is ZnodeKind.OTHER


@pytest.mark.parametrize("ledger_id", [JAVA_INT_MAX, 9876543210, 98765432101, 10**15, MAX_LEDGER_ID])
def test_flat_paths_of_any_long_round_trip(ledger_id: int) -> None:
    """FlatLedgerManager writes ``L%010d`` (longer ids print longer) and parses the digits back."""
    path = ledger_path(ledger_id, FLAT)
    assert path == f"/ledgers/L{ledger_id:010d}"
    assert ledger_id_from_path(path, FLAT) == ledger_id
    assert classify_path(path, FLAT) == LedgerTreeNode(ZnodeKind.LEDGER, ledger_id)


@pytest.mark.parametrize(
    "path",
    [
        "/ledgers/L098765432101",  # leading zero beyond the %010d width: not the canonical path of any id
        "/ledgers/L9223372036854775808",  # above 2^63-1
        "/ledgers/L99999999999999999999",
        "/ledgers/L12345678901x",
    ],
)
def test_flat_non_canonical_long_leaves_are_other(path: str) -> None:
    assert classify_path(path, FLAT).kind is ZnodeKind.OTHER


# ----------------------------------------------------------------------------------------------------- root


@pytest.mark.parametrize("root", ["/ledgers", "/pulsar/ledgers", "/a", "/x.y/z-1"])
def test_valid_roots(root: str) -> None:
    assert validate_root(root) == root


@pytest.mark.parametrize(
    "root",
    [
        "",
        "/",
        "ledgers",
        "/ledgers/",
        "//ledgers",
        "/a//b",
        "/a/./b",
        "/a/..",
        "/a\x00b",
        "/zookeeper",
        "/zookeeper/x",
    ],
)
def test_invalid_roots(root: str) -> None:
    with pytest.raises(FormatError):
        validate_root(root)
    with pytest.raises(FormatError):
        ledger_path(1, HIER, root)
    with pytest.raises(FormatError):
        classify_path("/ledgers/00", HIER, root)


def test_root_must_be_a_string() -> None:
    with pytest.raises(FormatError):
        validate_root(["/ledgers"])  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------- LAYOUT


@pytest.mark.parametrize("text", sorted(TYPICAL_LAYOUTS))
def test_typical_layouts_round_trip(text: str) -> None:
    layout = parse_layout(text.encode())
    assert layout.manager is TYPICAL_LAYOUTS[text]
    assert layout.manager_version == 1
    assert format_layout(layout) == text
    assert parse_layout(text) == layout


def test_default_layout_is_what_bookkeeper_writes() -> None:
    assert format_layout(LedgerLayout.for_manager(HIER)) == (
        "2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
    )
    for manager in LedgerManagerType:
        layout = LedgerLayout.for_manager(manager)
        assert parse_layout(format_layout(layout)) == layout
        assert layout.shade_prefix == ""


def test_shaded_class_names() -> None:
    text = "2\ndlshade.org.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory:1"
    layout = parse_layout(text)
    assert layout.manager is LONG
    assert layout.shade_prefix == "dlshade."
    assert format_layout(layout) == text
    assert parse_layout("2\na.b_c.$d.org.apache.bookkeeper.meta.FlatLedgerManagerFactory:1").manager is FLAT


def test_java_leniency() -> None:
    # String.split drops trailing empty strings; extra lines are ignored; parseInt takes a sign.
    assert parse_layout("2\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory:1\n").manager is FLAT
    assert parse_layout("2\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory:1\nextra").manager is FLAT
    assert (
        parse_layout(
            "+2\nflat:1".replace("flat", "org.apache.bookkeeper.meta.FlatLedgerManagerFactory")
        ).manager
        is FLAT
    )
    assert parse_layout("2\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory:1:").manager_version == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"\n\n", "empty"),
        (b"x\nflat:1", "not an integer"),
        (b" 2\nflat:1", "not an integer"),
        (b"0\nflat:1", "not supported"),
        (b"3\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory:1", "not supported"),
        (b"99999999999\nflat:1", "32-bit"),
        (b"2", "missing"),
        (b"2\n", "missing"),
        (b"2\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory", "<manager>:<version>"),
        (b"2\na:b:1", "<manager>:<version>"),
        (b"2\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory:x", "not an integer"),
        (b"2\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory:4294967296", "32-bit"),
        (b"2\norg.apache.bookkeeper.meta.NoSuchFactory:1", "unknown ledger manager factory"),
        (b"2\ncom.example.MyFactory:1", "unknown ledger manager factory"),
        (b"2\nhierarchical:1", "unknown ledger manager factory"),  # v2 needs a class
        (b"1\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory:1", "unknown ledger manager type"),
        (b"1\nlonghierarchical:1", "unknown ledger manager type"),  # v1 knew flat and hierarchical only
        (b"2\n\xff:1", "not UTF-8"),
    ],
)
def test_layout_errors(data: bytes, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        parse_layout(data)


def test_inconsistent_layout_model_is_refused() -> None:
    with pytest.raises(FormatError):
        LedgerLayout(2, FLAT, HIER.factory_class, 1)
    with pytest.raises(FormatError):
        LedgerLayout(3, FLAT, FLAT.factory_class, 1)
    with pytest.raises(FormatError):
        LedgerLayout(2, FLAT, FLAT.factory_class, 2**31)


@settings(max_examples=300, deadline=None)
@given(
    manager=st.sampled_from(list(LedgerManagerType)),
    prefix=st.sampled_from(["", "dlshade.", "a.b.", "x_1.$y."]),
    manager_version=st.integers(-(2**31), 2**31 - 1),
)
def test_layout_v2_round_trip(manager: LedgerManagerType, prefix: str, manager_version: int) -> None:
    layout = LedgerLayout(2, manager, prefix + manager.factory_class, manager_version)
    text = format_layout(layout)
    assert parse_layout(text) == layout
    assert format_layout(parse_layout(text.encode())) == text


def test_manager_names() -> None:
    assert LedgerManagerType.from_name("LegacyHierarchical") is LEGACY
    with pytest.raises(FormatError, match="unknown ledger manager"):
        LedgerManagerType.from_name("bogus")


# -------------------------------------------------------------------------------------- metadataServiceUri


def test_metadata_service_uri_from_facts() -> None:
    uri = parse_metadata_service_uri("zk+hierarchical://zk1:2181;zk2:2181/ledgers")
    assert uri.servers == ("zk1:2181", "zk2:2181")
    assert uri.ledgers_root == "/ledgers"
    assert uri.manager is HIER
    assert uri.zk_connect_string == "zk1:2181,zk2:2181"


@pytest.mark.parametrize(
    ("uri", "manager"),
    [
        ("zk+flat://h:2181/ledgers", FLAT),
        ("zk+longhierarchical://h:2181/ledgers", LONG),
        ("zk+ms://h:2181/ledgers", MS),
        ("zk+null://h:2181/ledgers", None),
        ("zk://h:2181/ledgers", None),
        ("ZK+Hierarchical://h:2181/ledgers", HIER),
    ],
)
def test_metadata_service_uri_managers(uri: str, manager: LedgerManagerType | None) -> None:
    assert parse_metadata_service_uri(uri).manager is manager


def test_metadata_service_uri_root_and_servers() -> None:
    uri = parse_metadata_service_uri("zk://a:1,b:2;c:3/pulsar/ledgers?x=1")
    assert uri.servers == ("a:1", "b:2", "c:3")
    assert uri.ledgers_root == "/pulsar/ledgers"


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "zk+hierarchical:/ledgers",
        "zk+hierarchical:///ledgers",
        "zk+hierarchical://h:2181",
        "zk+hierarchical://h:2181/",
        "zk+hierarchical://h:2181/ledgers/",
        "zk+legacyhierarchical://h:2181/ledgers",  # not a scheme BookKeeper knows
        "zk+bogus://h:2181/ledgers",
        "etcd://h:2379/ledgers",
        "zk://a;;b/ledgers",
        "zk://h/l%ff",
        "not a uri",
    ],
)
def test_metadata_service_uri_errors(uri: str) -> None:
    with pytest.raises(FormatError):
        parse_metadata_service_uri(uri)


# ----------------------------------------------------------------------------------------------------- fuzz


def _mutations(rng: random.Random, seed: bytes) -> bytes:
    data = bytearray(seed)
    choice = rng.randrange(6)
    if choice == 0 and data:
        return bytes(data[: rng.randrange(len(data))])
    if choice == 1 and data:
        index = rng.randrange(len(data))
        data[index] ^= 1 << rng.randrange(8)
        return bytes(data)
    if choice == 2:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
    if choice == 3:
        alphabet = b"0123456789:\n.-+ /Lorg.apache.bookkeeper.meta.FlatHierarchical"
        return bytes(rng.choice(alphabet) for _ in range(rng.randrange(64)))
    if choice == 4 and data:
        index = rng.randrange(len(data) + 1)
        data[index:index] = bytes([rng.randrange(256)])
        return bytes(data)
    return bytes(data) + bytes(data[: rng.randrange(len(data) + 1)])


def test_fuzz_layout_only_raises_format_error() -> None:
    rng = random.Random(20240611)
    seeds = [t.encode() for t in TYPICAL_LAYOUTS] + [
        b"2\ndlshade.org.apache.bookkeeper.meta.FlatLedgerManagerFactory:1"
    ]
    accepted = 0
    for _ in range(3000):
        data = _mutations(rng, rng.choice(seeds))
        try:
            layout = parse_layout(data)
        except FormatError:
            continue
        accepted += 1
        assert parse_layout(format_layout(layout)) == layout  # whatever parses re-encodes canonically
    assert accepted > 0


def test_fuzz_uri_and_paths() -> None:
    rng = random.Random(7)
    uri_seeds = [b"zk+hierarchical://zk1:2181;zk2:2181/ledgers", b"zk://h/pulsar/ledgers"]
    path_seeds = [ledger_path(i, m).encode() for i in (0, 59, 2147483647) for m in (HIER, LONG)]
    for _ in range(1500):
        text = _mutations(rng, rng.choice(uri_seeds)).decode("latin-1")
        with contextlib.suppress(FormatError):
            parse_metadata_service_uri(text)
    for _ in range(1500):
        path = _mutations(rng, rng.choice(path_seeds)).decode("latin-1")
        manager = rng.choice(ZK_MANAGERS)
        node = classify_path(path, manager)  # never raises for odd paths
        if node.kind is ZnodeKind.LEDGER:
            assert node.ledger_id is not None
            assert ledger_path(node.ledger_id, manager) == path
        try:
            ledger_id_from_path(path, manager)
        except FormatError:
            assert node.kind in (ZnodeKind.OTHER, ZnodeKind.OUTSIDE)
