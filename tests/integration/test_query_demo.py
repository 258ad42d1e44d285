"""`bkaudit query ...` on the tables of a real demo run, compared with the simulator's ground truth.

The demo (``demo_run``): a bookie dies and comes back (its ledgers under-replicated, then resolved), two
bookies are moved into /rack-0 (placement violations), one flaps, one goes silent. The ground truth by id is
in the demo's summary: at the end, and while the first bookie was dead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import CliResult
from tests.integration.conftest import DemoRun

pytestmark = pytest.mark.integration

Cli = Callable[..., CliResult]
LEDGER_RISK = ("LEDGER_UNDER_REPLICATED", "LEDGER_UNRECOVERABLE")


def rows(cli: Cli, demo_run: DemoRun, *args: str) -> list[dict[str, Any]]:
    result = cli("query", *args, "--lakehouse", str(demo_run.lakehouse), "--format", "json")
    assert result.exit_code == 0, result.stderr
    answer = result.json()
    assert isinstance(answer, list)
    return answer


def dead_bookie_truth(demo_run: DemoRun) -> set[int]:
    while_dead = demo_run.summary["ground_truth_ids"]["while_dead_bookie_was_lost"]
    assert while_dead["BOOKIE_LOST"] == [demo_run.summary["story"]["dead_bookie"]], demo_run.narration
    return {int(i) for kind in LEDGER_RISK for i in while_dead.get(kind, [])}


def test_the_dead_bookies_ledgers_are_those_the_simulator_flagged_while_it_was_dead(cli, demo_run):
    dead = demo_run.summary["story"]["dead_bookie"]
    expected = dead_bookie_truth(demo_run)
    assert expected  # the story gave it ledgers
    on_bookie = rows(cli, demo_run, "ledgers", "--bookie", dead, "--limit", "0")
    assert {r["ledger_id"] for r in on_bookie} == expected
    assert all(dead in r["bookies"] for r in on_bookie)
    fired = rows(
        cli, demo_run, "violations", "--bookie", dead, "--kind", LEDGER_RISK[0], "--kind", LEDGER_RISK[1]
    )
    assert {r["ledger_id"] for r in fired if r["state"] == "firing"} == expected
    assert {r["ledger_id"] for r in fired if r["state"] == "resolved"} == expected  # it came back


def test_nothing_is_under_replicated_at_the_end_as_in_the_ground_truth(cli, demo_run):
    truth = demo_run.summary["ground_truth_ids"]["alerts"]
    expected = {int(i) for kind in LEDGER_RISK for i in truth.get(kind, [])}
    assert {r["ledger_id"] for r in rows(cli, demo_run, "under-replicated", "--limit", "0")} == expected
    by_kind = rows(cli, demo_run, "under-replicated", "--group-by", "kind")
    assert sum(r["ledgers"] for r in by_kind) == len(expected)


def test_open_alerts_per_kind_are_the_ground_truths(cli, demo_run):
    counts = {r["kind"]: r["alerts"] for r in rows(cli, demo_run, "alerts", "--group-by", "kind")}
    assert counts == demo_run.summary["ground_truth"]
    silent = rows(cli, demo_run, "alerts", "--kind", "BOOKIE_UNRESPONSIVE")
    assert [r["entity"] for r in silent] == [f"bookie/{demo_run.summary['story']['silent_bookie']}"]


def test_placement_violations_are_the_truths_ledgers_crowded_into_rack_0(cli, demo_run):
    truth = {int(i) for i in demo_run.summary["ground_truth_ids"]["alerts"]["PLACEMENT_NOT_ADHERING"]}
    listed = rows(cli, demo_run, "placement", "--ledgers", "--limit", "0")
    assert {r["ledger_id"] for r in listed} == truth
    assert all(r["racks"].count("/rack-0") >= 2 for r in listed)  # the two moved bookies' rack
    per_rack = {r["rack"]: r["not_adhering"] for r in rows(cli, demo_run, "placement")}
    assert per_rack["/rack-0"] == len(truth)


def test_bookies_show_the_story(cli, demo_run):
    story = demo_run.summary["story"]
    bookies = {r["bookie_id"]: r for r in rows(cli, demo_run, "bookies")}
    assert len(bookies) == 6
    dead = bookies[story["dead_bookie"]]
    assert (dead["status"], dead["lost"], dead["ledgers"]) == (
        "WRITABLE",
        False,
        len(dead_bookie_truth(demo_run)),
    )
    assert bookies[story["flapping_bookie"]]["flaps"] >= 1
    assert bookies[story["silent_bookie"]]["open_alerts"] == ["BOOKIE_UNRESPONSIVE"]
    assert all(bookies[b]["rack"] == "/rack-0" for b in story["moved_bookies"])


def test_the_history_of_a_dead_bookies_ledger_shows_it_created_flagged_and_resolved(cli, demo_run):
    ledger = min(dead_bookie_truth(demo_run))
    history = rows(cli, demo_run, "history", "--ledger-id", str(ledger))
    assert history[0]["event"] == "created" and history[0]["source"] == "ledgers"
    transitions = [(r["event"], r["kind"]) for r in history if r["source"] == "violations"]
    risk = [t for t in transitions if t[1] in LEDGER_RISK]
    assert [event for event, _ in risk] == ["firing", "resolved"], history
    assert [r["at"] for r in history] == sorted(r["at"] for r in history)


def test_the_history_of_a_ledger_the_demo_never_had_is_exit_2(cli, demo_run):
    unknown = max(int(r["ledger_id"]) for r in rows(cli, demo_run, "ledgers", "--limit", "0")) + 1000
    result = cli("query", "history", "--ledger-id", str(unknown), "--lakehouse", str(demo_run.lakehouse))
    assert (
        result.exit_code == 2
        and result.stderr == f"bkaudit: ledger {unknown} is not in the lakehouse at {demo_run.lakehouse}\n"
    )


def test_what_if_answers_the_ground_truth_for_every_pair_of_bookies(cli, demo_run):
    pairs = demo_run.summary["ground_truth_ids"]["what_if_pairs"]
    assert len(pairs) == 15  # six bookies
    assert any(truth["UNRECOVERABLE"] for truth in pairs.values())  # some pair is not safe to take down
    for pair, truth in pairs.items():
        down = [arg for bookie in pair.split(",") for arg in ("--down", bookie)]
        result = cli(
            "query", "what-if", *down, "--lakehouse", str(demo_run.lakehouse), "-f", "json", "--limit", "0"
        )
        answer = result.json()
        assert isinstance(answer, dict), result.stdout
        assert result.exit_code == (0 if answer["safe"] else 1), result.stderr
        assert answer["down"] == pair.split(",")
        assert answer["unavailable"] == []  # every bookie is registered at the end of the story
        graded = {
            verdict: [r["ledger_id"] for r in answer["ledgers"] if r["verdict"] == verdict]
            for verdict in truth
        }
        assert graded == truth, pair
        assert answer["safe"] is (not truth["UNRECOVERABLE"])
        assert answer["by_verdict"] == {verdict: len(ids) for verdict, ids in truth.items()}
        assert all(r["topic"] for r in answer["ledgers"])  # the demo's ledgers belong to Pulsar topics


def test_what_if_of_an_unknown_bookie_is_one_line_and_exit_2(cli, demo_run):
    result = cli("query", "what-if", "--down", "no-such-bookie:3181", "--lakehouse", str(demo_run.lakehouse))
    assert result.exit_code == 2
    assert result.stdout == b""
    assert result.stderr.count("\n") == 1 and "unknown bookie no-such-bookie:3181" in result.stderr


def test_drain_lists_every_ledger_that_still_names_the_bookie(cli, demo_run):
    bookie = demo_run.summary["story"]["moved_bookies"][0]
    drained = rows(cli, demo_run, "drain", bookie, "--limit", "0")
    named = rows(cli, demo_run, "ledgers", "--bookie", bookie, "--limit", "0")
    assert sorted(r["ledger_id"] for r in drained) == [r["ledger_id"] for r in named]
    # Nothing marks a healthy bookie's ledgers: each waits for BookKeeper to ask for a move.
    assert {r["reason"] for r in drained if r["state"] == "CLOSED"} == {"not_marked"}
