"""`bkaudit check replicas | placement` through the real CLI entry point."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

Cli = Callable[..., Any]

LEDGER = {
    "ensemble_size": 4,
    "write_quorum": 3,
    "ack_quorum": 2,
    "state": "CLOSED",
    "last_entry_id": 3,
    "segments": [{"first_entry_id": 0, "ensemble": ["b0", "b1", "b2", "b3"]}],
}


def replicas(cli: Cli, **overrides: Any) -> Any:
    return cli("check", "replicas", stdin=json.dumps({**LEDGER, **overrides}))


# --- check replicas -------------------------------------------------------------------------------


def test_replicas_interfaces_example(cli: Cli) -> None:
    r = replicas(cli, bookies={"b0": [0], "b1": [0, 1, 3], "b2": "NO_LEDGER", "b3": "UNAVAILABLE"})
    assert r.exit_code == 0, r.stderr
    assert r.json() == {
        "result": "LESS_THAN_AQ",
        "min_replicas": 1,
        "worst_entries": [2],
        "worst_entry_count": 1,
        "unknown_bookies": ["b3"],
    }


def test_replicas_aq1_and_wq1(cli: Cli) -> None:
    aq1 = replicas(cli, bookies={"b0": [0], "b1": [0, 1, 3], "b2": [0, 1], "b3": [1, 2, 3]}).json()
    assert (aq1["result"], aq1["min_replicas"], aq1["worst_entries"]) == ("LESS_THAN_AQ", 1, [2])
    wq1 = replicas(cli, bookies={"b0": [0, 2], "b1": [0, 1, 3], "b2": [0, 1], "b3": [1, 2, 3]}).json()
    assert (wq1["result"], wq1["min_replicas"], wq1["worst_entries"]) == ("LESS_THAN_WQ", 2, [2, 3])


def test_replicas_nr1(cli: Cli) -> None:
    ensemble = [f"b{i}" for i in range(5)]
    r = cli(
        "check",
        "replicas",
        stdin=json.dumps(
            {
                "ensemble_size": 5,
                "write_quorum": 4,
                "ack_quorum": 2,
                "state": "CLOSED",
                "last_entry_id": 100,
                "segments": [{"first_entry_id": 0, "ensemble": ensemble}],
                "bookies": {b: "NO_LEDGER" if i % 2 else [] for i, b in enumerate(ensemble)},
            }
        ),
    )
    out = r.json()
    assert (
        out["result"] == "NO_REPLICA"
        and out["min_replicas"] == 0
        and out["worst_entries"] == list(range(101))
    )


def test_replicas_es1_and_open_ledgers_are_skipped(cli: Cli) -> None:
    skipped: dict[str, Any] = {
        "result": "SKIPPED",
        "min_replicas": None,
        "worst_entries": [],
        "worst_entry_count": 0,
    }
    for overrides in (
        {"last_entry_id": -1},
        {"state": "OPEN"},
        {"state": "IN_RECOVERY", "last_entry_id": -1},
    ):
        out = replicas(cli, bookies={}, **overrides).json()
        assert out == {**skipped, "unknown_bookies": []}, overrides


def test_replicas_es2_empty_last_segment(cli: Cli) -> None:
    segments = [
        {"first_entry_id": 0, "ensemble": ["b0", "b1", "b2", "b3"]},
        {"first_entry_id": 3, "ensemble": ["b1", "b2", "b3", "b4"]},
    ]
    bookies = {"b0": [0, 2], "b1": [0, 1], "b2": [0, 1, 2], "b3": [1, 2]}
    out = replicas(cli, last_entry_id=2, segments=segments, bookies=bookies).json()
    assert out["result"] == "OK" and out["min_replicas"] == 3 and out["unknown_bookies"] == []


def test_replicas_absent_bookie_is_unavailable(cli: Cli) -> None:
    out = replicas(cli, bookies={"b0": [0, 1, 2, 3], "b1": [0, 1, 2, 3]}).json()
    assert out["result"] == "OK" and out["unknown_bookies"] == ["b2", "b3"]


def test_replicas_defaults_and_extra_keys(cli: Cli) -> None:
    # Output of `metadata decode` plus "bookies" is valid input; ack_quorum defaults to write_quorum.
    document = {k: v for k, v in LEDGER.items() if k != "ack_quorum"}
    document.update({"format_version": 3, "digest_type": "CRC32", "ctime": None, "bookies": {"b0": [0, 2]}})
    r = cli("check", "replicas", stdin=json.dumps(document))
    assert r.exit_code == 0, r.stderr
    # Only b0 answered: it lacks entry 3, so 2 replicas remain, below the default AQ (= WQ = 3).
    assert r.json()["result"] == "LESS_THAN_AQ"


def test_replicas_early_exit_bug_not_reproduced(cli: Cli) -> None:
    ensemble = [f"b{i}" for i in range(5)]
    stripes = {b: [e for e in range(20) if (i - e) % 5 < 2] for i, b in enumerate(ensemble)}
    document = {
        "ensemble_size": 5,
        "write_quorum": 2,
        "ack_quorum": 2,
        "state": "CLOSED",
        "last_entry_id": 19,
        "segments": [{"first_entry_id": 0, "ensemble": ensemble}],
        "bookies": stripes,
    }
    assert cli("check", "replicas", stdin=json.dumps(document)).json()["result"] == "OK"


REPLICAS_BAD = [
    ("not json", "not valid JSON"),
    ("[]", "must be a JSON object"),
    (json.dumps({**LEDGER, "write_quorum": 5}), "exceeds the ensemble size"),
    (json.dumps({**LEDGER, "ack_quorum": 4}), "ack_quorum 4 exceeds write_quorum 3"),
    (json.dumps({**LEDGER, "ack_quorum": 0}), "at least 1"),
    (json.dumps({**LEDGER, "ensemble_size": True}), "got a boolean"),
    (json.dumps({**LEDGER, "write_quorum": "3"}), "got a string"),
    (json.dumps({**LEDGER, "state": "closed"}), "state must be one of"),
    (json.dumps({**LEDGER, "last_entry_id": -2}), "at least -1"),
    (json.dumps({**LEDGER, "segments": []}), "non-empty array"),
    (
        json.dumps({**LEDGER, "segments": [{"first_entry_id": 0, "ensemble": ["b0"]}]}),
        "ensemble has 1 bookies",
    ),
    (
        json.dumps({**LEDGER, "segments": [{"first_entry_id": -1, "ensemble": ["a", "b", "c", "d"]}]}),
        "at least 0",
    ),
    (
        json.dumps({**LEDGER, "segments": [{"ensemble": ["a", "b", "c", "d"]}]}),
        "missing field 'first_entry_id'",
    ),
    (
        json.dumps({**LEDGER, "segments": [{"first_entry_id": 0, "ensemble": ["a", "b", "c", 4]}]}),
        "must be a string",
    ),
    (
        json.dumps(
            {
                **LEDGER,
                "segments": [
                    {"first_entry_id": 5, "ensemble": ["a", "b", "c", "d"]},
                    {"first_entry_id": 2, "ensemble": ["a", "b", "c", "d"]},
                ],
            }
        ),
        "below the previous segment",
    ),
    (json.dumps({**LEDGER, "bookies": {"b0": [-1]}}), "at least 0"),
    (json.dumps({**LEDGER, "bookies": {"b0": [False]}}), "got a boolean"),
    (json.dumps({**LEDGER, "bookies": {"b0": "GONE"}}), '"NO_LEDGER" or "UNAVAILABLE"'),
    (json.dumps({**LEDGER, "bookies": {"b0": 3}}), "must be an array"),
    (json.dumps({**LEDGER, "bookies": []}), "bookies must be a JSON object"),
    (json.dumps({k: v for k, v in LEDGER.items() if k != "state"}), "missing field 'state'"),
]


@pytest.mark.parametrize(("stdin", "message"), REPLICAS_BAD)
def test_replicas_bad_input_exits_2(cli: Cli, stdin: str, message: str) -> None:
    r = cli("check", "replicas", stdin=stdin)
    assert r.exit_code == 2
    assert r.stdout == b""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert message in r.stderr


# --- check placement ------------------------------------------------------------------------------


def placement(cli: Cli, **document: Any) -> Any:
    return cli("check", "placement", stdin=json.dumps(document))


def test_placement_interfaces_example(cli: Cli) -> None:
    r = placement(
        cli,
        policy="rackaware",
        ensemble=["b1", "b2", "b3"],
        write_quorum=3,
        ack_quorum=2,
        racks={"b1": "/r1", "b2": "/r2"},
        min_racks_per_write_quorum=2,
        enforce_min_racks_per_write_quorum=False,
        min_zones_per_write_quorum=2,
        desired_zones_per_write_quorum=3,
        min_regions_for_durability=2,
    )
    assert r.exit_code == 0, r.stderr
    assert r.json() == {
        "adherence": "MEETS_STRICT",
        "failing_write_sets": [],
        "soft_write_sets": [],
        "reason": None,
    }


def test_placement_rackaware_defaults(cli: Cli) -> None:
    out = placement(cli, policy="rackaware", ensemble=["b1", "b2", "b3"], write_quorum=2, ack_quorum=2).json()
    assert out["adherence"] == "FAIL"
    assert out["failing_write_sets"] == [["b1", "b2"], ["b2", "b3"], ["b3", "b1"]]
    enforced = placement(
        cli,
        policy="rackaware",
        ensemble=["b1", "b2", "b3"],
        write_quorum=3,
        racks={"b1": "/r1", "b2": "/r2"},
        enforce_min_racks_per_write_quorum=True,
    ).json()
    assert enforced["adherence"] == "FAIL" and enforced["failing_write_sets"] == [["b1", "b2", "b3"]]


def test_placement_ensemble_smaller_than_write_quorum_wraps(cli: Cli) -> None:
    """BookKeeper answers with wrapped write sets ``ensemble[(i + j) % E]``; so does the CLI."""
    passes = placement(
        cli,
        policy="rackaware",
        ensemble=["b1", "b2"],
        write_quorum=3,
        ack_quorum=2,
        racks={"b1": "/r1", "b2": "/r2"},
    )
    assert passes.exit_code == 0, passes.stderr
    assert passes.json()["adherence"] == "MEETS_STRICT"
    fails = placement(cli, policy="rackaware", ensemble=["b1", "b2"], write_quorum=3, racks={})
    assert fails.exit_code == 0, fails.stderr
    assert fails.json() == {
        "adherence": "FAIL",
        "failing_write_sets": [["b1", "b2", "b1"], ["b2", "b1", "b2"]],
        "soft_write_sets": [],
        "reason": "write set [b1, b2, b1]: spans 1 rack(s), needs 2",
    }
    single = placement(cli, policy="rackaware", ensemble=["b1"], write_quorum=2, racks={"b1": "/r1"})
    assert single.json()["failing_write_sets"] == [["b1", "b1"]]


def test_placement_zoneaware(cli: Cli) -> None:
    racks = {"a": "/z1/u1", "b": "/z2/u1", "c": "/z1/u2"}
    out = placement(
        cli, policy="zoneaware", ensemble=["a", "b", "c"], write_quorum=3, ack_quorum=2, racks=racks
    )
    assert out.json()["adherence"] == "MEETS_SOFT"
    bad = placement(cli, policy="zoneaware", ensemble=["a", "b", "c"], write_quorum=2, racks=racks).json()
    assert bad["adherence"] == "FAIL" and bad["failing_write_sets"] == [] and "multiple" in bad["reason"]


def test_placement_regionaware(cli: Cli) -> None:
    racks = {"a": "/eu/r1", "b": "/us/r1", "c": "/eu/r2", "d": "/eu/r1"}
    assert (
        placement(cli, policy="regionaware", ensemble=["a", "b"], write_quorum=2, racks=racks).json()[
            "adherence"
        ]
        == "MEETS_STRICT"
    )
    fail = placement(cli, policy="regionaware", ensemble=["a", "c", "b"], write_quorum=2, racks=racks).json()
    assert fail["adherence"] == "FAIL" and fail["failing_write_sets"] == [["a", "c"]]
    soft = placement(cli, policy="regionaware", ensemble=["a", "d", "b"], write_quorum=3, racks=racks).json()
    assert soft["adherence"] == "MEETS_SOFT" and soft["failing_write_sets"] == []


def test_placement_empty_ensemble_is_fail_not_bad_input(cli: Cli) -> None:
    r = placement(cli, policy="rackaware", ensemble=[], write_quorum=2, ack_quorum=2)
    assert r.exit_code == 0
    assert r.json() == {
        "adherence": "FAIL",
        "failing_write_sets": [],
        "soft_write_sets": [],
        "reason": "empty ensemble",
    }


def test_placement_null_rack_means_unmapped(cli: Cli) -> None:
    out = placement(
        cli, policy="rackaware", ensemble=["a", "b"], write_quorum=2, racks={"a": None, "b": "/r1"}
    )
    assert out.json()["adherence"] == "MEETS_STRICT"  # /default-rack and /r1


BASE = {"policy": "rackaware", "ensemble": ["a", "b", "c"], "write_quorum": 2, "ack_quorum": 2}

PLACEMENT_BAD = [
    ("{", "not valid JSON"),
    ("[1]", "must be a JSON object"),
    (json.dumps({**BASE, "policy": "random"}), "unknown policy 'random'"),
    (json.dumps({k: v for k, v in BASE.items() if k != "policy"}), "missing field 'policy'"),
    (json.dumps({**BASE, "write_quorum": 2**31}), "at most 2147483647"),
    (json.dumps({**BASE, "write_quorum": 2**31 - 1}), "write-set members this command evaluates"),
    (json.dumps({**BASE, "write_quorum": 0}), "at least 1"),
    (json.dumps({**BASE, "ack_quorum": 3}), "ack_quorum 3 exceeds write_quorum 2"),
    (json.dumps({**BASE, "write_quorum": True}), "got a boolean"),
    (json.dumps({**BASE, "ensemble": "a,b"}), "must be an array"),
    (json.dumps({**BASE, "ensemble": ["a", 1]}), "must be a string"),
    (json.dumps({**BASE, "racks": ["a"]}), "racks must be a JSON object"),
    (json.dumps({**BASE, "racks": {"a": 1}}), "must be a string or null"),
    (json.dumps({**BASE, "min_racks_per_write_quorum": -1}), "at least 0"),
    (json.dumps({**BASE, "min_regions_for_durability": 1.5}), "got a number"),
    (json.dumps({**BASE, "enforce_min_racks_per_write_quorum": "yes"}), "true or false"),
    (json.dumps({**BASE, "desired_zones_per_write_quorum": False}), "got a boolean"),
]


@pytest.mark.parametrize(("stdin", "message"), PLACEMENT_BAD)
def test_placement_bad_input_exits_2(cli: Cli, stdin: str, message: str) -> None:
    r = cli("check", "placement", stdin=stdin)
    assert r.exit_code == 2
    assert r.stdout == b""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert message in r.stderr


def test_placement_plan_moves_a_failing_member_to_a_rack_that_fixes_every_write_set(cli: Cli) -> None:
    document = {
        "policy": "rackaware",
        "ensemble": ["b1", "b2", "b3"],
        "write_quorum": 2,
        "racks": {"b1": "/r1", "b2": "/r1", "b3": "/r2", "b4": "/r3", "b5": "/r2"},
        "candidates": {"b4": 7, "b5": 3},  # b5 is lighter, but /r2 would fail the write set [b3, b5]
    }
    r = cli("check", "placement", "--plan", stdin=json.dumps(document))
    assert r.exit_code == 0, r.stderr
    assert r.json()["plan"] == {
        "moves": [{"position": 0, "from_bookie": "b1", "to_bookie": "b4"}],
        "ensemble": ["b4", "b2", "b3"],
        "reason": None,
    }
    assert "plan" not in placement(cli, **document).json()  # only when asked


def test_placement_plan_without_a_target_says_why_and_bad_candidates_are_refused(cli: Cli) -> None:
    document = {"policy": "rackaware", "ensemble": ["b1", "b2"], "write_quorum": 2}
    out = cli("check", "placement", "--plan", stdin=json.dumps(document)).json()
    assert out["plan"]["moves"] == [] and "no writable bookie" in out["plan"]["reason"]
    bad = cli("check", "placement", "--plan", stdin=json.dumps({**document, "candidates": {"b3": "x"}}))
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1
    assert "candidates['b3'] must be an integer" in bad.stderr


PLAN = {"policy": "rackaware", "ensemble": ["a", "b"], "write_quorum": 2}


@pytest.mark.parametrize(
    ("candidates", "message"),
    [
        (["c"], "candidates must be a JSON object"),
        ({"c": -1}, "at least 0"),
        ({"c": True}, "got a boolean"),
        ({"c": 1.5}, "got a number"),
        ({"c": None}, "must be an integer"),
    ],
)
def test_placement_plan_refuses_bad_candidates_with_one_line(cli: Cli, candidates: Any, message: str) -> None:
    r = cli("check", "placement", "--plan", stdin=json.dumps({**PLAN, "candidates": candidates}))
    assert r.exit_code == 2 and r.stdout == b""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert message in r.stderr
