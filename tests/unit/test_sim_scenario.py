"""Scenario files and actions of the simulator: validation, ordering, timing, errors (no services)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bkaudit.sim.actions import ACTIONS, validate_action
from bkaudit.sim.errors import SimulatorError
from bkaudit.sim.scenario import ClusterSpec, Scenario, load_scenario, parse_scenario, run_timeline
from core.errors import BkauditError, ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scenarios"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def run(scenario: Scenario, execute: Callable[[str, Any], Any]) -> tuple[list[dict[str, Any]], FakeClock]:
    fake = FakeClock()
    return run_timeline(scenario, execute, clock=fake.clock, sleep=fake.sleep), fake


# ------------------------------------------------------------------------------------------------ parse


def test_a_full_scenario_parses() -> None:
    scenario = parse_scenario(
        """
cluster: {bookies: 6, racks: 3, ledgers: 4, lost_bookie_recovery_delay_s: 2, id_style: legacy}
truth: {under_replication_grace_s: 60, probe_timeout_s: 1.5}
steps:
  - {at: 0, action: create_ledger, name: hot, entries: 50, close: false}
  - at: 1.0
    action: kill_bookie
    bookie: 1
    hard: true
  - {at: 2.5, action: add_entries, ledger: hot, count: 10}
  - {at: 3, action: mark_underreplicated, ledger: "#0", replicas: [bookie-01], age_s: 7200}
end_at: 8
"""
    )
    assert scenario.cluster.bookies == 6 and scenario.cluster.id_style == "legacy"
    assert scenario.truth.to_parameters().under_replication_grace_s == 60
    assert [step.action for step in scenario.ordered_steps()] == [
        "create_ledger",
        "kill_bookie",
        "add_entries",
        "mark_underreplicated",
    ]
    assert scenario.steps[1].args == {"bookie": 1, "hard": True}
    assert scenario.end_at == 8


def test_an_empty_document_is_an_empty_scenario() -> None:
    assert parse_scenario("").steps == []
    assert parse_scenario("steps: []").cluster == ClusterSpec()


def test_steps_with_equal_times_keep_file_order() -> None:
    scenario = parse_scenario(
        """
steps:
  - {at: 2, action: heal_bookie, bookie: 2}
  - {at: 1, action: heal_bookie, bookie: 1}
  - {at: 2, action: heal_bookie, bookie: 3}
"""
    )
    assert [step.args["bookie"] for step in scenario.ordered_steps()] == [1, 2, 3]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("steps: [{at: 1, action: nope}]", "step 1 (nope): unknown action 'nope'"),
        ("steps: [{at: 1, action: kill_bookie}]", "step 1 (kill_bookie): bookie: field required"),
        (
            "steps: [{at: 0, action: heal_bookie, bookie: 0},"
            " {at: 1, action: kill_bookie, bookie: 0, hardd: 1}]",
            "step 2 (kill_bookie): hardd: extra inputs are not permitted",
        ),
        ("steps: [{at: -1, action: heal_bookie, bookie: 0}]", "step 1: at: input should be greater than"),
        ("steps: [{action: heal_bookie, bookie: 0}]", "step 1: at: field required"),
        ("steps: [{at: 1, action: make_slow, bookie: 0, delay_s: -2}]", "delay_s: input should be greater"),
        ("steps: [{at: 1, action: corrupt_ledger_znode, ledger: 1, how: melt}]", "how: input should be"),
        ("cluster: {bookies: 3, zones: 2}", "cluster.zones: extra inputs are not permitted"),
        ("cluster: {storage: Ext4LedgerStorage}", "cluster.storage: input should be"),
        (
            "steps: [{at: 1, action: add_bookie, storage: db}]",
            "step 1 (add_bookie): storage: input should be",
        ),
        ("cluster: {ensemble_size: 2, write_quorum: 3}", "quorums must satisfy"),
        ("truth: {placement_policy: random}", "truth.placement_policy: input should be"),
        ("stepz: []", "stepz: extra inputs are not permitted"),
        ("- 1\n- 2", "the top level must be a mapping"),
        ("steps: [unclosed", "not valid YAML at line"),
    ],
)
def test_bad_scenarios_are_one_clear_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_scenario(text, source="scenario x.yaml")
    error = str(caught.value)
    assert error.startswith("scenario x.yaml: ")
    assert message.lower() in error.lower()
    assert "\n" not in error


def test_load_scenario_reads_files_and_reports_missing_ones(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("steps: [{at: 0, action: heal_bookie, bookie: 0}]\n", encoding="utf-8")
    assert load_scenario(path).steps[0].action == "heal_bookie"
    with pytest.raises(ConfigError, match="cannot read it"):
        load_scenario(tmp_path / "missing.yaml")
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_scenario(tmp_path / "bin.yaml")


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_the_example_scenarios_are_valid(path: Path) -> None:
    scenario = load_scenario(path)
    assert scenario.steps
    assert scenario.end_at is None or scenario.end_at >= max(step.at for step in scenario.steps)


def test_there_are_example_scenarios() -> None:
    assert len(list(EXAMPLES.glob("*.yaml"))) >= 1


# ---------------------------------------------------------------------------------------------- actions


def test_every_action_has_help_and_forbids_unknown_arguments() -> None:
    for name, spec in ACTIONS.items():
        assert spec.summary, name
        assert spec.args_model.model_config.get("extra") == "forbid", name
    with pytest.raises(SimulatorError, match="surely_not_an_argument: extra inputs are not permitted"):
        validate_action("heal_bookie", {"bookie": 0, "surely_not_an_argument": 1})


def test_bookie_and_ledger_references_accept_ids_and_orders() -> None:
    args = validate_action("lose_entries", {"bookie": "127.0.0.1:3181", "ledger": "#2", "entries": [1, 2]})
    assert args.bookie == "127.0.0.1:3181" and args.ledger == "#2"  # type: ignore[attr-defined]
    assert validate_action("kill_bookie", {"bookie": 3}).bookie == 3  # type: ignore[attr-defined]
    with pytest.raises(SimulatorError, match="entries"):
        validate_action("lose_entries", {"bookie": 0, "ledger": 1, "entries": []})
    with pytest.raises(SimulatorError, match="arguments must be an object"):
        validate_action("kill_bookie", ["bookie"])  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- timing


def test_the_timeline_runs_steps_at_their_times_and_waits_for_end_at() -> None:
    scenario = parse_scenario(
        """
steps:
  - {at: 0.5, action: heal_bookie, bookie: 0}
  - {at: 2.0, action: make_slow, bookie: 1, delay_s: 3}
  - {at: 2.0, action: heal_bookie, bookie: 1}
end_at: 10
"""
    )
    calls: list[tuple[str, dict[str, Any]]] = []

    def execute(name: str, args: dict[str, Any]) -> dict[str, Any]:
        calls.append((name, dict(args)))
        return {"action": name}

    log, fake = run(scenario, execute)
    assert calls == [
        ("heal_bookie", {"bookie": 0}),
        ("make_slow", {"bookie": 1, "delay_s": 3}),
        ("heal_bookie", {"bookie": 1}),
    ]
    assert [entry["started_s"] for entry in log] == [0.5, 2.0, 2.0]
    assert log[1]["result"] == {"action": "make_slow"}
    assert fake.now == pytest.approx(110.0)


def test_a_failing_step_stops_the_run_and_names_the_step() -> None:
    scenario = parse_scenario(
        """
steps:
  - {at: 0, action: heal_bookie, bookie: 0}
  - {at: 1, action: kill_bookie, bookie: 9}
  - {at: 2, action: heal_bookie, bookie: 0}
"""
    )
    calls: list[str] = []

    def execute(name: str, args: dict[str, Any]) -> None:
        calls.append(name)
        if name == "kill_bookie":
            raise SimulatorError("no bookie 9")

    with pytest.raises(BkauditError, match=r"scenario step 2 \(kill_bookie at 1 s\): no bookie 9"):
        run(scenario, execute)
    assert calls == ["heal_bookie", "kill_bookie"]


# ------------------------------------------------------------------------------------------------- CLI


def test_cli_sim_run_rejects_a_bad_scenario_before_touching_zookeeper(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("steps: [{at: 1, action: kill_bookie, bookie: 0, hardd: true}]\n", encoding="utf-8")
    result = cli("sim", "run", str(path), "--zookeeper", "127.0.0.1:1")
    assert result.exit_code == 2
    assert "step 1 (kill_bookie): hardd: extra inputs are not permitted" in result.stderr
    assert result.stdout == b""


def test_cli_sim_commands_without_a_simulator_exit_2_with_one_line(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    for args in (("truth",), ("status",), ("kill-bookie", "--index", "0", "--hard"), ("down",)):
        result = cli("sim", *args, "--state-dir", str(tmp_path))
        assert result.exit_code == 2, args
        assert result.stderr == "bkaudit: no simulator is running (start one with `bkaudit sim up`)\n"


def test_cli_sim_do_validates_before_connecting(cli: Callable[..., Any], tmp_path: Path) -> None:
    result = cli("sim", "do", "make_slow", "--args", '{"bookie": 0}', "--state-dir", str(tmp_path))
    assert result.exit_code == 2
    assert "make_slow: delay_s: field required" in result.stderr
    result = cli("sim", "do", "make_slow", "--args", "[1]", "--state-dir", str(tmp_path))
    assert result.exit_code == 2 and "JSON object" in result.stderr


def test_cli_sim_actions_lists_every_action(cli: Callable[..., Any]) -> None:
    table = cli("sim", "actions")
    assert table.exit_code == 0 and all(name in table.text for name in ACTIONS)
    result = cli("sim", "actions", "--format", "json")
    assert result.exit_code == 0
    listing = result.json()
    assert isinstance(listing, dict)
    assert set(listing) == set(ACTIONS)
    assert "hard" in listing["kill_bookie"]["args"]
