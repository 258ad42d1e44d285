"""`bkaudit query ...` over the example lakehouse: formats, the lakehouse setting, and the error contract.

The example lakehouse (``connectors.delta.queries.write_example_lakehouse``): bookie-1 (/rack-0) lost, its
ledgers 1 and 2 under-replicated; ledger 1 also badly placed (bookie-1 and bookie-2 both in /rack-0).
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from connectors.delta.queries import write_example_lakehouse
from tests.conftest import CliResult

Cli = Callable[..., CliResult]


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_example_lakehouse(tmp_path_factory.mktemp("example-lakehouse")))


def query(cli: Cli, lakehouse: str, *args: str) -> CliResult:
    return cli("query", *args, "--lakehouse", lakehouse)


def one_error_line(result: CliResult) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert result.stdout == b""
    assert result.stderr.startswith("bkaudit: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


@pytest.mark.parametrize(
    ("args", "first_column"),
    [
        (("alerts",), "kind"),
        (("alerts", "--group-by", "kind"), "kind"),
        (("under-replicated",), "ledger_id"),
        (("under-replicated", "--group-by", "rack", "--group-by", "namespace"), "rack"),
        (("placement",), "rack"),
        (("placement", "--ledgers"), "ledger_id"),
        (("ledgers", "--bookie", "bookie-1"), "ledger_id"),
        (("history", "--ledger-id", "1"), "at"),
        (("bookies",), "bookie_id"),
        (("violations", "--group-by", "day"), "day"),
    ],
)
def test_every_command_prints_the_same_rows_as_json_csv_and_table(cli, example, args, first_column):
    as_json = query(cli, example, *args, "--format", "json")
    assert as_json.exit_code == 0, as_json.stderr
    rows = as_json.json()
    assert isinstance(rows, list) and rows and next(iter(rows[0])) == first_column
    as_csv = list(csv.DictReader(io.StringIO(query(cli, example, *args, "--format", "csv").text)))
    assert len(as_csv) == len(rows)
    assert [r[first_column] for r in as_csv] == [str(r[first_column]) for r in rows]
    table = query(cli, example, *args).text.splitlines()
    assert table[0].split()[0] == first_column and set(table[1]) <= {"-", " "}
    assert len(table) == len(rows) + 2


def test_the_dead_bookies_ledgers_and_why_they_are_at_risk(cli, example):
    rows = query(cli, example, "under-replicated", "--bookie", "bookie-1", "-f", "json").json()
    assert [(r["ledger_id"], r["lost_bookies"], r["since"]) for r in rows] == [
        (1, ["bookie-1"], "2024-05-01T12:10:00.000Z"),
        (2, ["bookie-1"], "2024-05-01T12:10:00.000Z"),
    ]
    by_rack = query(cli, example, "placement", "--ledgers", "-f", "json").json()
    assert by_rack[0]["racks"] == ["/rack-0", "/rack-0", "/rack-1"]


def test_the_lakehouse_comes_from_the_settings_when_not_given(cli, example, monkeypatch):
    monkeypatch.setenv("BKAUDIT_LAKEHOUSE_ROOT", example)
    result = cli("query", "bookies", "--lost", "-f", "json")
    assert result.exit_code == 0, result.stderr
    assert [r["bookie_id"] for r in result.json()] == ["bookie-1"]


def test_a_cut_listing_says_so_on_stderr_and_limit_0_prints_all(cli, example):
    cut = query(cli, example, "alerts", "--limit", "2", "-f", "json")
    assert cut.exit_code == 0 and len(cut.json()) == 2
    assert cut.stderr == "bkaudit: showing the first 2 rows; --limit 0 prints all\n"
    whole = query(cli, example, "alerts", "--limit", "0", "-f", "json")
    assert len(whole.json()) == 4 and whole.stderr == ""


def test_an_empty_answer_is_an_empty_array_a_header_or_no_rows(cli, example):
    assert query(cli, example, "ledgers", "--bookie", "nobody", "-f", "json").json() == []
    assert query(cli, example, "ledgers", "--bookie", "nobody", "-f", "csv").text.startswith(
        "ledger_id,state,"
    )
    assert query(cli, example, "ledgers", "--bookie", "nobody").text.endswith("(no rows)\n")


def test_a_missing_lakehouse_is_one_line_naming_it(cli, tmp_path):
    assert (
        one_error_line(query(cli, str(tmp_path / "none"), "alerts"))
        == f"bkaudit: no lakehouse at {tmp_path / 'none'}\n"
    )


def test_a_lakehouse_without_tables_points_at_the_demo_tables(cli, tmp_path):
    (tmp_path / "demo").mkdir()
    message = one_error_line(query(cli, str(tmp_path), "bookies"))
    assert "no Delta table 'bookies'" in message and str(tmp_path / "demo") in message


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("history", "--ledger-id", "abc"), "--ledger-id"),
        (("history", "--ledger-id", "1; DROP TABLE ledgers"), "--ledger-id"),
        (("history",), "--ledger-id"),
        (("history", "--ledger-id", "99"), "ledger 99 is not in the lakehouse"),
        (("history", "--ledger-id", "-3"), "ledger id -3 is outside"),
        (("history", "--ledger-id", str(2**64)), "is outside"),
        (("alerts", "--kind", "NOPE"), "unknown alert kind 'NOPE'"),
        (("alerts", "--group-by", "kind,rack"), "unknown group-by key 'kind,rack'"),
        (("alerts", "--format", "xml"), "--format"),
        (("alerts", "--limit", "-1"), "--limit must be 0 (all) or more"),
        (("ledgers", "--state", "closed"), "unknown ledger state 'closed'"),
        (("violations", "--since", "yesterday"), "--since must be an ISO date or time"),
    ],
)
def test_bad_arguments_are_exit_2_with_one_line(cli, example, args, expected):
    assert expected in one_error_line(query(cli, example, *args))


def test_an_injection_looking_filter_matches_nothing_and_changes_nothing(cli, example):
    hostile = "bookie-1' OR '1'='1"
    assert query(cli, example, "under-replicated", "--bookie", hostile, "-f", "json").json() == []
    assert query(cli, example, "ledgers", "--topic", "x'); DROP TABLE ledgers; --", "-f", "json").json() == []
    assert len(query(cli, example, "ledgers", "-f", "json").json()) == 3


def test_query_is_listed_in_help(cli):
    result = cli("query", "--help")
    assert result.exit_code == 0
    for command in ("alerts", "under-replicated", "placement", "ledgers", "history", "bookies", "violations"):
        assert command in result.text


def test_values_print_the_same_way_in_csv_json_and_the_text_table(cli, example):
    (as_json,) = query(
        cli, example, "under-replicated", "--bookie", "bookie-1", "--limit", "1", "-f", "json"
    ).json()
    (as_csv,) = csv.DictReader(
        io.StringIO(
            query(cli, example, "under-replicated", "--bookie", "bookie-1", "--limit", "1", "-f", "csv").text
        )
    )
    assert as_json["since"] == as_csv["since"] == "2024-05-01T12:10:00.000Z"
    assert as_json["lost_bookies"] == ["bookie-1"] and as_csv["lost_bookies"] == '["bookie-1"]'
    assert as_json["under_replication_marked"] is None and as_csv["under_replication_marked"] == ""
    assert as_json["ensemble_size"] == 3 and as_csv["ensemble_size"] == "3"
    text = query(cli, example, "under-replicated", "--bookie", "bookie-1", "--limit", "1").text.splitlines()[
        2
    ]
    assert "2024-05-01T12:10:00.000Z" in text and " bookie-1 " in text
    (bookie,) = query(cli, example, "bookies", "--lost", "-f", "csv").text.splitlines()[1:]
    assert bookie.startswith("bookie-1,GONE,true,")


def test_placement_plan_moves_a_replica_of_the_badly_placed_ledger_to_a_writable_bookie(cli, tmp_path):
    import pyarrow as pa

    from connectors.delta.tables import BOOKIES, BatchWriter

    lakehouse = write_example_lakehouse(tmp_path / "lh")
    # A fourth bookie, writable, in a third rack: ledger 1 (bookie-1 and bookie-2 in /rack-0) can move there.
    spare = {"bookie_id": "bookie-4", "status": "WRITABLE", "lost": False, "rack": "/rack-2"}
    BatchWriter(lakehouse, app_id="test", batch_id=0).upsert(
        "bookies", pa.Table.from_pylist([spare], schema=BOOKIES.schema)
    )
    result = query(cli, str(lakehouse), "placement", "--plan", "--format", "json")
    assert result.exit_code == 0, result.stderr
    (row,) = result.json()
    assert row["ledger_id"] == 1 and row["ensemble"] == "bookie-1,bookie-2,bookie-3"
    assert row["moves"] == "position 0: bookie-1 -> bookie-4"  # bookie-1 is lost: its replica moves first
    assert row["reason"] is None and row["planned_ensemble"] == "bookie-4,bookie-2,bookie-3"
    assert row["bytes_to_move"] == 70  # 100 bytes in 10 entries; E=3, WQ=2: position 0 holds 7 of them


def test_placement_plan_computed_from_the_tables_skips_an_unresponsive_bookie_and_totals_per_target(
    cli, tmp_path
):
    import pyarrow as pa

    from connectors.delta.tables import BOOKIES, OPEN_ALERTS, BatchWriter

    lakehouse = write_example_lakehouse(tmp_path / "lh")
    spares = [
        {"bookie_id": b, "status": "WRITABLE", "lost": False, "rack": "/rack-2"}
        for b in ("bookie-4", "bookie-5")
    ]
    silent = {
        "alert_id": "s",
        "kind": "BOOKIE_UNRESPONSIVE",
        "entity": "bookie/bookie-4",
        "bookies": ["bookie-4"],
    }
    writer = BatchWriter(lakehouse, app_id="test", batch_id=0)
    writer.upsert("bookies", pa.Table.from_pylist(spares, schema=BOOKIES.schema))
    writer.upsert("open_alerts", pa.Table.from_pylist([silent], schema=OPEN_ALERTS.schema))
    (row,) = query(cli, str(lakehouse), "placement", "--plan", "--format", "json").json()
    assert row["moves"] == "position 0: bookie-1 -> bookie-5"  # bookie-4 is lighter by id, but silent
    (target,) = query(cli, str(lakehouse), "placement", "--plan", "--by-target", "--format", "json").json()
    assert target == {
        "to_bookie": "bookie-5",
        "to_rack": "/rack-2",
        "moves": 1,
        "ledgers": 1,
        "bytes_to_move": 70,
    }
    assert "--by-target goes with --plan" in one_error_line(
        query(cli, str(lakehouse), "placement", "--by-target")
    )


def test_the_table_view_is_narrow_and_columns_chooses(cli, example):
    table = query(cli, example, "alerts").text.splitlines()
    assert table[0].split() == ["kind", "severity", "entity", "pulsar_topic", "since"]
    assert max(map(len, table)) <= 120  # was ~270 with every column
    every = query(cli, example, "alerts", "--columns", "all").text.splitlines()[0].split()
    assert every == list(query(cli, example, "alerts", "-f", "json").json()[0])  # json: every column
    assert query(cli, example, "alerts", "--columns", "entity, kind").text.splitlines()[0].split() == [
        "entity",
        "kind",
    ]
    (row,) = query(
        cli, example, "alerts", "--kind", "BOOKIE_LOST", "--columns", "entity", "-f", "json"
    ).json()
    assert row == {"entity": "bookie/bookie-1"}
    assert "no column nope" in one_error_line(query(cli, example, "alerts", "--columns", "kind,nope"))


def test_times_inside_the_detail_are_rfc3339_in_the_table_and_as_the_stream_has_them_in_json(cli, example):
    args = ("alerts", "--kind", "BOOKIE_LOST", "--columns", "entity,detail")
    text = query(cli, example, *args).text.splitlines()[2]
    assert '{"missing_since": "2024-05-01T12:09:00.000Z"}' in text, text
    (row,) = query(cli, example, *args, "-f", "json").json()
    assert json.loads(row["detail"]) == {"missing_since": 1714565340000}


#: Every `bkaudit query` subcommand, as a user would first try it.
EVERY_QUERY = (
    ("alerts",),
    ("alerts", "--group-by", "kind"),
    ("under-replicated",),
    ("placement",),
    ("placement", "--ledgers"),
    ("placement", "--plan"),
    ("ledgers",),
    ("history", "1"),
    ("bookies",),
    ("violations",),
)


def _damage(example: str, root: Path, case: str) -> Path:
    """A lakehouse path that is not a usable lakehouse, one way per ``case``."""
    target = root / case
    if case == "a file":
        target.write_text("not a lakehouse")
        return target
    if case == "a directory with files and no tables":  # `--lakehouse .` in a checkout
        target.mkdir()
        (target / "README.md").write_text("x")
        (target / "docs").mkdir()
        return target
    shutil.copytree(example, target)
    for table in [p for p in target.iterdir() if p.is_dir()]:
        log = table / "_delta_log"
        if case == "a damaged Delta log":
            for commit in log.glob("*.json"):
                commit.write_text("{not json")
        elif case == "a Delta log that is a file":
            shutil.rmtree(log)
            log.write_text("x")
        elif case == "tables that are files":
            shutil.rmtree(table)
            table.write_text("x")
    if case == "damaged Parquet files":
        for data in target.rglob("*.parquet"):
            data.write_bytes(b"not parquet")
    if case == "vanished Parquet files":
        for data in target.rglob("*.parquet"):
            data.unlink()
    return target


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("a file", "no lakehouse at "),
        ("a directory with files and no tables", "(it holds no Delta tables)"),
        ("tables that are files", "(it holds no Delta tables)"),
        ("a damaged Delta log", "cannot read the Delta table "),
        ("a Delta log that is a file", "cannot read the Delta table "),
        ("damaged Parquet files", "cannot read the tables under "),
        ("vanished Parquet files", "cannot read the tables under "),
    ],
)
def test_no_lakehouse_path_gives_a_traceback_to_any_query(cli, example, tmp_path, case, expected):
    lakehouse = _damage(example, tmp_path, case)
    for args in EVERY_QUERY:
        message = one_error_line(query(cli, str(lakehouse), *args))
        assert expected in message and str(lakehouse) in message, (args, message)
        assert "\x1b[" not in message, (args, message)  # no terminal colours of the Rust readers


def test_the_checkout_root_as_lakehouse_points_at_the_demo_tables(cli, tmp_path):
    (tmp_path / "lakehouse" / "demo").mkdir(parents=True)
    (tmp_path / "Makefile").write_text("demo:\n")
    message = one_error_line(query(cli, str(tmp_path), "alerts"))
    assert f"(the demo's tables are in {tmp_path / 'lakehouse' / 'demo'})" in message
