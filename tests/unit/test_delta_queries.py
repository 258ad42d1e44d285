"""The SRE query module (``connectors.delta.queries``) on small hand-built Delta tables (deltalake only).

The tables are written through the real table code (``ensure_tables`` + ``BatchWriter``), so they have the
schemas, partitioning and change data feed the auditor's tables have. Each test states the cluster it
builds; expected answers are derived from that cluster, not from the implementation.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from connectors.delta.queries import HISTORY_SCHEMA, Lakehouse
from connectors.delta.tables import LEDGER_BUCKETS, TABLES, BatchWriter, ensure_tables
from core.errors import InvalidArgumentError, NotFoundError

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
SECRET = "pulsar-ledger-secret-5f1c"

# The cluster: five bookies; b5 has no rack in the rack map (BookKeeper's default rack), "ghost" is named
# by ledger 6's metadata but never registered.
RACKS = {"b1": "/r1", "b2": "/r1", "b3": "/r2", "b4": "/r3", "b5": None}
# Ledgers: id → (ensemble, topic). Topic namespaces: public/default (v2), sample/us-west/ns1 (v1, four parts).
LEDGERS: dict[int, tuple[list[str], str | None]] = {
    1: (["b1", "b3", "b4"], "persistent://public/default/orders"),
    2: (["b1", "b2", "b3"], "persistent://public/default/payments"),  # b1 and b2 share /r1: bad placement
    3: (["b3", "b4", "b5"], "persistent://sample/us-west/ns1/legacy"),
    4: (["b1", "b4"], None),  # not a Pulsar ledger
    5: (["b2", "b4"], "persistent://public/default/orders"),  # WQ=1: unrecoverable when b2 and b4 are lost
    6: (["b3", "ghost", "b4"], "persistent://public/default/clicks"),
}


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def ledger_row(ledger_id: int, **changes: Any) -> dict[str, Any]:
    ensemble, topic = LEDGERS[ledger_id]
    row = {
        "ledger_id": ledger_id,
        "ledger_bucket": ledger_id % LEDGER_BUCKETS,
        "cluster": "c1",
        "state": "CLOSED",
        "ensemble_size": len(ensemble),
        "write_quorum": 1 if ledger_id == 5 else 2,
        "ack_quorum": 1 if ledger_id == 5 else 2,
        "last_entry_id": 99,
        "length": 9_900,
        "segments": [{"first_entry_id": 0, "ensemble": ensemble}],
        "bookies": sorted(ensemble),
        "ctime_ms": int(T0.timestamp() * 1000),
        "pulsar_topic": topic,
        "custom_metadata": [{"key": "pulsar/managed-ledger", "value": SECRET.encode()}],
        "has_password": True,
        "znode_version": 1,
        "mzxid": 1,  # the index rows carry the version they were derived from
        "placement": "FAIL" if ledger_id == 2 else "MEETS_STRICT",
        "under_replication_marked": False,
        "deleted": False,
        "updated_at": at(0),
    }
    row.update(changes)
    return row


def alert(
    kind: str,
    minutes: float,
    *,
    ledger: int | None = None,
    bookies: list[str],
    state: str = "firing",
    started: float | None = None,
    detail: dict[str, Any] | None = None,
) -> dict[str, Any]:
    entity = f"ledger/{ledger}" if ledger is not None else f"bookie/{bookies[0]}"
    severity = {"LEDGER_UNRECOVERABLE": "critical", "PLACEMENT_SOFT": "info"}.get(kind, "warning")
    return {
        "alert_id": f"{kind}:{entity}:{started if started is not None else minutes}",
        "cluster": "c1",
        "kind": kind,
        "state": state,
        "entity": entity,
        "severity": severity,
        "ledger_id": ledger,
        "bookies": bookies,
        "pulsar_topic": LEDGERS[ledger][1] if ledger is not None else None,
        "started_at": at(started if started is not None else minutes),
        "detected_at": at(minutes),
        "detected_date": at(minutes).date(),
        "detail": json.dumps(detail or {}),
    }


def write(root: Path, table: str, batch: int, rows: list[dict[str, Any]], *, append: bool = False) -> None:
    data = pa.Table.from_pylist(rows, schema=TABLES[table].schema)
    writer = BatchWriter(root, "test", batch)
    assert writer.append(table, data) if append else writer.upsert(table, data)


def build_incident(root: Path) -> Path:
    """Ledger 2 is badly placed from the start (alert at 12:01); at 12:10 b1 is lost (ledgers 1, 2 and 4
    under-replicated); at 12:15 ledger 2 changes ensemble; at 12:20 b2 is lost too: ledger 2 misses two
    bookies of one write set and ledger 5 (WQ=1) one, both unrecoverable; at 12:30 ledger 4 is deleted (its
    alert resolves, its index rows go)."""
    ensure_tables(root)
    write(root, "ledgers", 0, [ledger_row(i) for i in LEDGERS])
    index = [
        {"bookie": b, "ledger_id": i, "mzxid": 1} for i, (ensemble, _) in LEDGERS.items() for b in ensemble
    ]
    write(root, "ledger_bookies", 0, index, append=True)
    bookies: list[dict[str, Any]] = [
        {"bookie_id": b, "cluster": "c1", "status": "WRITABLE", "lost": False, "rack": r, "flaps": 0}
        for b, r in RACKS.items()
    ]
    bookies[0].update(status="GONE", lost=True, missing_since=at(9))
    bookies[1].update(status="GONE", lost=True, missing_since=at(19), flaps=2)
    write(root, "bookies", 0, bookies)
    history = [
        alert("PLACEMENT_NOT_ADHERING", 1, ledger=2, bookies=["b1", "b2", "b3"]),
        alert("BOOKIE_LOST", 10, bookies=["b1"]),
        alert("LEDGER_UNDER_REPLICATED", 10, ledger=1, bookies=["b1"]),
        alert("LEDGER_UNDER_REPLICATED", 10, ledger=2, bookies=["b1"]),
        alert("LEDGER_UNDER_REPLICATED", 10, ledger=4, bookies=["b1"]),
        alert("BOOKIE_LOST", 20, bookies=["b2"]),
        alert("LEDGER_UNDER_REPLICATED", 20, ledger=2, bookies=["b1"], state="resolved", started=10),
        alert("LEDGER_UNRECOVERABLE", 20, ledger=2, bookies=["b1", "b2"]),
        alert("LEDGER_UNRECOVERABLE", 20, ledger=5, bookies=["b2"]),
        alert("LEDGER_UNDER_REPLICATED", 30, ledger=4, bookies=["b1"], state="resolved", started=10),
    ]
    write(root, "violations", 1, history, append=True)
    resolved = {r["alert_id"] for r in history if r["state"] == "resolved"}
    open_rows = [r for r in history if r["state"] == "firing" and r["alert_id"] not in resolved]
    write(root, "open_alerts", 1, open_rows, append=True)
    # Ledger 2 gets an ensemble change at 12:15 (b1 replaced by b4 from entry 50), ledger 4 is deleted.
    second = {"first_entry_id": 50, "ensemble": ["b4", "b2", "b3"]}
    write(
        root,
        "ledgers",
        1,
        [
            ledger_row(
                2,
                segments=[{"first_entry_id": 0, "ensemble": ["b1", "b2", "b3"]}, second],
                bookies=["b1", "b2", "b3", "b4"],
                znode_version=2,
                mzxid=2,
                updated_at=at(15),
            ),
            ledger_row(4, deleted=True, updated_at=at(30)),
        ],
    )
    rows = [{"bookie": b, "ledger_id": 2, "mzxid": 2} for b in ("b1", "b2", "b3", "b4")]
    assert BatchWriter(root, "test", 1).replace_keys(
        "ledger_bookies",
        "ledger_id",
        [2, 4],
        pa.Table.from_pylist(rows, schema=TABLES["ledger_bookies"].schema),
    )
    return root


@pytest.fixture(scope="module")
def incident(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The incident's tables, written once: the tests given ``lakehouse`` only read them."""
    return build_incident(tmp_path_factory.mktemp("incident") / "lakehouse")


@pytest.fixture
def lakehouse(incident: Path) -> Lakehouse:
    return Lakehouse(incident)


# --- what is missing ---------------------------------------------------------------------------------


def test_a_missing_lakehouse_is_not_found_naming_the_path(tmp_path):
    with pytest.raises(NotFoundError, match=f"no lakehouse at {tmp_path / 'nope'}$"):
        Lakehouse(tmp_path / "nope")


def test_a_missing_table_is_not_found_naming_it_and_pointing_at_the_demo_tables(tmp_path):
    (tmp_path / "demo").mkdir()
    with pytest.raises(NotFoundError, match=r"no Delta table 'open_alerts' under .*demo's tables are in"):
        Lakehouse(tmp_path).open_alerts()


def test_empty_tables_answer_every_query_with_no_rows_and_the_documented_columns(tmp_path):
    ensure_tables(tmp_path)
    lakehouse = Lakehouse(tmp_path)
    answers = {
        "open_alerts": lakehouse.open_alerts(),
        "under_replicated": lakehouse.under_replicated(),
        "placement": lakehouse.placement(),
        "ledgers": lakehouse.ledgers(bookie="b1"),
        "bookies": lakehouse.bookies(),
        "violations": lakehouse.violations(),
        "over_time": lakehouse.open_alerts_over_time(),
    }
    assert {name: table.num_rows for name, table in answers.items()} == dict.fromkeys(answers, 0)
    assert answers["under_replicated"].column_names[:3] == ["ledger_id", "kind", "severity"]
    assert answers["placement"].column_names == ["rack", "not_adhering", "soft", "bookies"]
    assert "open_alerts" in answers["ledgers"].column_names
    with pytest.raises(NotFoundError, match="ledger 7 is not in the lakehouse"):
        lakehouse.ledger_history(7)


# --- what is at risk now --------------------------------------------------------------------------------


def test_under_replicated_lists_the_open_ledger_alerts_with_their_lost_bookies_racks_and_topic(lakehouse):
    rows = {r["ledger_id"]: r for r in lakehouse.under_replicated().to_pylist()}
    assert sorted(rows) == [1, 2, 5]  # ledger 4 was deleted: its alert resolved
    assert rows[2]["lost_bookies"] == ["b1", "b2"] and rows[2]["racks"] == ["/r1"]
    assert [rows[i]["kind"] for i in (1, 2, 5)] == ["LEDGER_UNDER_REPLICATED", *["LEDGER_UNRECOVERABLE"] * 2]
    assert rows[5]["severity"] == "critical"
    assert rows[1]["namespace"] == "public/default" and rows[1]["state"] == "CLOSED"
    assert rows[2]["since"] == at(20)  # the unrecoverable condition started when b2 was lost


def test_under_replicated_filters_by_lost_bookie_rack_topic_namespace_and_unrecoverable(lakehouse):
    def ids(**filters: Any) -> list[int]:
        return lakehouse.under_replicated(**filters).column("ledger_id").to_pylist()

    assert ids(bookie="b2") == [2, 5]
    assert ids(bookie="b3") == []  # b3 is named by ledgers 1 and 2, but it is not lost
    assert ids(rack="/r1") == [1, 2, 5]
    assert ids(topic="persistent://public/default/orders") == [1, 5]
    assert ids(namespace="public/default") == [1, 2, 5]
    assert ids(namespace="sample/us-west/ns1") == []
    assert ids(unrecoverable_only=True) == [2, 5]


def test_under_replicated_groups_count_a_ledger_once_per_lost_bookie(lakehouse):
    by_bookie = {
        r["bookie"]: r["ledgers"] for r in lakehouse.under_replicated(group_by=["bookie"]).to_pylist()
    }
    assert by_bookie == {"b1": 2, "b2": 2}
    by_rack = lakehouse.under_replicated(group_by="rack").to_pylist()
    assert [(r["rack"], r["ledgers"], r["unrecoverable"]) for r in by_rack] == [("/r1", 3, 2)]
    by_topic = {r["topic"]: r["ledgers"] for r in lakehouse.under_replicated(group_by=["topic"]).to_pylist()}
    assert by_topic == {"persistent://public/default/orders": 2, "persistent://public/default/payments": 1}
    both = lakehouse.under_replicated(group_by=["namespace", "kind"]).to_pylist()
    assert {(r["namespace"], r["kind"]): r["ledgers"] for r in both} == {
        ("public/default", "LEDGER_UNDER_REPLICATED"): 1,
        ("public/default", "LEDGER_UNRECOVERABLE"): 2,
    }


def test_open_alerts_list_oldest_first_and_count_by_kind(lakehouse):
    rows = lakehouse.open_alerts().to_pylist()
    assert [r["kind"] for r in rows][:2] == ["PLACEMENT_NOT_ADHERING", "BOOKIE_LOST"]
    assert {r["entity"] for r in rows if r["kind"] == "BOOKIE_LOST"} == {"bookie/b1", "bookie/b2"}
    counts = {r["kind"]: r["alerts"] for r in lakehouse.open_alerts(group_by=["kind"]).to_pylist()}
    assert counts == {
        "BOOKIE_LOST": 2,
        "LEDGER_UNDER_REPLICATED": 1,
        "LEDGER_UNRECOVERABLE": 2,
        "PLACEMENT_NOT_ADHERING": 1,
    }
    assert lakehouse.open_alerts(severity="critical").column("ledger_id").to_pylist() == [2, 5]
    assert lakehouse.open_alerts(ledger_id=2, kinds=["PLACEMENT_NOT_ADHERING"]).num_rows == 1
    assert lakehouse.open_alerts(rack="/r2").column("ledger_id").to_pylist() == [2]  # b3's rack


def test_placement_counts_violations_per_rack_and_lists_each_members_rack(lakehouse):
    per_rack = lakehouse.placement().to_pylist()
    assert [(r["rack"], r["not_adhering"], r["bookies"]) for r in per_rack] == [("/r1", 1, 2), ("/r2", 1, 1)]
    (row,) = lakehouse.placement(by_ledger=True).to_pylist()
    assert (row["ledger_id"], row["bookies"], row["racks"]) == (2, ["b1", "b2", "b3"], ["/r1", "/r1", "/r2"])
    assert lakehouse.placement(rack="/r3").num_rows == 0
    assert lakehouse.placement(kinds=["PLACEMENT_SOFT"], by_ledger=True).num_rows == 0


def test_ledgers_of_a_bookie_come_from_the_index_with_their_open_alerts(lakehouse):
    rows = lakehouse.ledgers(bookie="b1").to_pylist()
    assert [r["ledger_id"] for r in rows] == [1, 2]  # 4 named b1, but it is deleted (out of the index)
    assert rows[1]["open_alerts"] == ["LEDGER_UNRECOVERABLE", "PLACEMENT_NOT_ADHERING"]
    assert lakehouse.ledgers(bookie="b4").column("ledger_id").to_pylist() == [1, 2, 3, 5, 6]  # 2: new segment
    assert lakehouse.ledgers().column("ledger_id").to_pylist() == [1, 2, 3, 5, 6]
    assert lakehouse.ledgers(include_deleted=True).column("ledger_id").to_pylist() == [1, 2, 3, 4, 5, 6]
    # b5 has no rack and "ghost" is not a known bookie: both are in BookKeeper's default rack.
    assert lakehouse.ledgers(rack="/default-rack").column("ledger_id").to_pylist() == [3, 6]
    assert lakehouse.ledgers(namespace="sample/us-west/ns1").column("ledger_id").to_pylist() == [3]
    assert lakehouse.ledgers(placement="FAIL").column("ledger_id").to_pylist() == [2]
    assert lakehouse.ledgers(limit=2).column("ledger_id").to_pylist() == [1, 2]
    assert lakehouse.ledgers(bookie="nobody").num_rows == 0


def test_bookies_show_status_rack_ledger_counts_and_what_is_open(lakehouse):
    rows = {r["bookie_id"]: r for r in lakehouse.bookies().to_pylist()}
    assert (rows["b1"]["status"], rows["b1"]["ledgers"], rows["b1"]["at_risk_ledgers"]) == ("GONE", 2, 2)
    assert rows["b1"]["open_alerts"] == ["BOOKIE_LOST"]
    assert rows["b2"]["flaps"] == 2 and rows["b2"]["at_risk_ledgers"] == 2
    assert rows["b5"]["rack"] == "/default-rack"
    assert (rows["ghost"]["status"], rows["ghost"]["ledgers"]) == ("UNKNOWN", 1)
    assert lakehouse.bookies(lost=True).column("bookie_id").to_pylist() == ["b1", "b2"]
    assert lakehouse.bookies(rack="/r3").column("bookie_id").to_pylist() == ["b4"]


# --- since when ----------------------------------------------------------------------------------------


def test_violations_are_the_transitions_in_time_order_with_time_bounds_and_groups(lakehouse):
    rows = lakehouse.violations().to_pylist()
    assert len(rows) == 10 and rows[0]["kind"] == "PLACEMENT_NOT_ADHERING"
    assert [r["detected_at"] for r in rows] == sorted(r["detected_at"] for r in rows)
    window = lakehouse.violations(since=at(10), until=at(20))
    assert window.num_rows == 4 and set(window.column("detected_at").to_pylist()) == {at(10)}
    naive = lakehouse.violations(since=datetime(2024, 5, 1, 12, 25))  # naive times are UTC
    assert naive.column("state").to_pylist() == ["resolved"]
    by_state = {r["state"]: r["transitions"] for r in lakehouse.violations(group_by=["state"]).to_pylist()}
    assert by_state == {"firing": 8, "resolved": 2}
    assert lakehouse.violations(bookie="b2", kinds=["BOOKIE_LOST"]).column("entity").to_pylist() == [
        "bookie/b2"
    ]


def test_cluster_level_alerts_are_named_by_their_entity_in_the_violations(tmp_path):
    root = tmp_path / "lakehouse"
    ensure_tables(root)
    entities = {
        "RACK_MAP_INVALID": "rackmap",
        "AUTORECOVERY_DISABLED": "autorecovery",
        "AUDITOR_MISSING": "auditor",
    }
    cluster_alerts = [
        {**alert(kind, minute, bookies=["unused"]), "entity": entity, "bookies": []}
        for minute, (kind, entity) in enumerate(entities.items())
    ]
    write(root, "violations", 0, cluster_alerts, append=True)
    rows = Lakehouse(root).violations().to_pylist()
    assert [(r["kind"], r["entity"], r["ledger_id"]) for r in rows] == [
        (k, e, None) for k, e in entities.items()
    ]


def test_open_alerts_over_time_is_a_step_function_of_firing_and_resolved(lakehouse):
    steps = lakehouse.open_alerts_over_time(kinds=["LEDGER_UNDER_REPLICATED"]).to_pylist()
    # 12:10 three fire; 12:20 ledger 2's resolves (it became unrecoverable); 12:30 ledger 4's resolves.
    assert [(r["detected_at"], r["open_alerts"]) for r in steps] == [(at(10), 3), (at(20), 2), (at(30), 1)]
    every = lakehouse.open_alerts_over_time(kinds=None)
    assert set(every.column("kind").to_pylist()) >= {"BOOKIE_LOST", "PLACEMENT_NOT_ADHERING"}


def test_ledger_history_merges_metadata_versions_and_alert_transitions_in_time_order(lakehouse):
    history = lakehouse.ledger_history(2)
    assert history.schema == HISTORY_SCHEMA
    events = [(r["at"], r["event"], r["kind"]) for r in history.to_pylist()]
    assert events == [
        (at(0), "created", None),
        (at(1), "firing", "PLACEMENT_NOT_ADHERING"),
        (at(10), "firing", "LEDGER_UNDER_REPLICATED"),
        (at(15), "changed", None),
        (at(20), "resolved", "LEDGER_UNDER_REPLICATED"),
        (at(20), "firing", "LEDGER_UNRECOVERABLE"),
    ]
    change = history.column("change").to_pylist()[3]
    assert change == "segments: 0: b1,b2,b3 → 0: b1,b2,b3 | 50: b4,b2,b3; znode_version: 1 → 2"
    deleted = [r for r in lakehouse.ledger_history(4).to_pylist() if r["source"] == "ledgers"]
    assert [(r["event"], r["change"]) for r in deleted][-1] == ("deleted", "deleted: false → true")


def test_ledger_history_says_when_old_versions_were_vacuumed(tmp_path):
    ensure_tables(tmp_path)
    write(tmp_path, "ledgers", 0, [ledger_row(1)], append=True)  # read back from its data file only
    write(tmp_path, "ledgers", 1, [ledger_row(1, state="CLOSED", placement="FAIL", updated_at=at(5))])
    write(tmp_path, "ledgers", 2, [ledger_row(1, placement="MEETS_STRICT", updated_at=at(9))])
    DeltaTable(str(tmp_path / "ledgers")).vacuum(
        retention_hours=0, dry_run=False, enforce_retention_duration=False
    )
    rows = Lakehouse(tmp_path).ledger_history(1).to_pylist()
    assert rows[0]["event"] == "note" and rows[0]["table_version"] == 2
    # The first readable version as it was then, and what changed after it.
    assert [(r["event"], r["table_version"]) for r in rows[1:]] == [("as_of", 2), ("changed", 3)]
    assert "placement FAIL" in rows[1]["change"] and rows[2]["change"] == "placement: FAIL → MEETS_STRICT"


# --- hostile and wrong input -----------------------------------------------------------------------------


@pytest.mark.parametrize("ledger_id", ["abc", "12; DROP TABLE ledgers", "-1", -5, 2**63, True, 1.5])
def test_a_ledger_id_that_is_not_an_int64_is_an_invalid_argument(lakehouse, ledger_id):
    with pytest.raises(InvalidArgumentError):
        lakehouse.ledger_history(ledger_id)
    with pytest.raises(InvalidArgumentError):
        lakehouse.open_alerts(ledger_id=ledger_id)


def test_a_numeric_string_ledger_id_is_accepted(lakehouse):
    assert lakehouse.ledger_history("2").num_rows == 6


@pytest.mark.parametrize(
    "value",
    ["b1' OR '1'='1", "'; DROP TABLE ledgers; --", '") OR 1=1 --', "$bookie", "b1\x00", "%", "*"],
)
def test_filter_values_are_bound_parameters_never_sql(lakehouse, value):
    assert lakehouse.ledgers(bookie=value).num_rows == 0
    assert lakehouse.under_replicated(bookie=value, topic=value, namespace=value).num_rows == 0
    assert lakehouse.open_alerts(bookie=value).num_rows == 0
    assert lakehouse.bookies(rack=value).num_rows == 0
    assert lakehouse.ledgers().num_rows == 5  # nothing was dropped or changed


def test_a_bookie_id_with_quotes_and_a_lakehouse_path_with_quotes_work(tmp_path):
    root = tmp_path / "it's a lake\"house"
    ensure_tables(root)
    write(root, "ledger_bookies", 0, [{"bookie": "o'brien:3181", "ledger_id": 1, "mzxid": 1}], append=True)
    write(root, "ledgers", 0, [ledger_row(1)])
    assert Lakehouse(root).ledgers(bookie="o'brien:3181").column("ledger_id").to_pylist() == [1]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda lh: lh.open_alerts(kinds=["NOPE"]), "unknown alert kind 'NOPE'"),
        (lambda lh: lh.open_alerts(group_by=["kind; DROP TABLE x"]), "unknown group-by key"),
        (lambda lh: lh.under_replicated(group_by=["severity"]), "unknown group-by key 'severity'"),
        (lambda lh: lh.ledgers(state="closed"), "unknown ledger state 'closed'"),
        (lambda lh: lh.bookies(status="DEAD"), "unknown bookie status"),
        (lambda lh: lh.violations(state="open"), "unknown alert state"),
        (lambda lh: lh.ledgers(limit=-1), "limit must be a non-negative integer"),
        (lambda lh: lh.violations(since="yesterday"), "since must be a datetime"),
    ],
)
def test_arguments_outside_the_accepted_values_are_invalid(lakehouse, call, message):
    with pytest.raises(InvalidArgumentError, match=message):
        call(lakehouse)


def test_no_query_returns_custom_metadata_or_anything_of_the_password(lakehouse):
    answers = [
        lakehouse.open_alerts(),
        lakehouse.under_replicated(),
        lakehouse.placement(by_ledger=True),
        lakehouse.ledgers(include_deleted=True),
        lakehouse.bookies(),
        lakehouse.violations(),
        *(lakehouse.ledger_history(i) for i in LEDGERS),
    ]
    for table in answers:
        assert "custom_metadata" not in table.column_names and "has_password" not in table.column_names
        assert SECRET not in repr(table.to_pylist())


TOPICS = {
    "persistent://public/default/orders": "public/default",
    "non-persistent://t/ns/x-partition-3": "t/ns",
    "persistent://sample/us-west/ns1/legacy": "sample/us-west/ns1",  # v1: property/cluster/namespace
    "persistent://public/default": None,  # no local name: not a topic
    "not a topic": None,
}


def test_the_namespace_of_a_topic_is_what_pulsar_parses(tmp_path):
    ensure_tables(tmp_path)
    rows = [
        {**ledger_row(1), "ledger_id": i, "ledger_bucket": i % LEDGER_BUCKETS, "pulsar_topic": topic}
        for i, topic in enumerate([*TOPICS, None], start=1)
    ]
    write(tmp_path, "ledgers", 0, rows)
    found = {r["pulsar_topic"]: r["namespace"] for r in Lakehouse(tmp_path).ledgers().to_pylist()}
    assert found == {**TOPICS, None: None}


def test_tables_duckdb_cannot_read_alone_go_through_deltalakes_dataset_with_the_same_answers(
    lakehouse, monkeypatch
):
    direct = {
        "under_replicated": lakehouse.under_replicated().to_pylist(),
        "ledgers": lakehouse.ledgers(bookie="b4").to_pylist(),
        "bookies": lakehouse.bookies().to_pylist(),
    }
    real_protocol = DeltaTable.protocol
    datasets = []

    def needs_reader_features(table):  # e.g. deletion vectors or column mapping
        return real_protocol(table)._replace(min_reader_version=3)

    def counted(table, *args, **kwargs):
        datasets.append(table.table_uri)
        return real_dataset(table, *args, **kwargs)

    real_dataset = DeltaTable.to_pyarrow_dataset
    monkeypatch.setattr(DeltaTable, "protocol", needs_reader_features)
    monkeypatch.setattr(DeltaTable, "to_pyarrow_dataset", counted)
    through_dataset = {
        "under_replicated": lakehouse.under_replicated().to_pylist(),
        "ledgers": lakehouse.ledgers(bookie="b4").to_pylist(),
        "bookies": lakehouse.bookies().to_pylist(),
    }
    assert datasets  # the fallback was taken
    assert through_dataset == direct
