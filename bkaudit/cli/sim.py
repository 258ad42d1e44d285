"""`bkaudit sim ...`: the simulated BookKeeper cluster (docs/simulator.md).

- ``sim up``: build a simulated cluster in ZooKeeper (the embedded dev cluster unless ``--zookeeper``), print
  one JSON object (zookeeper, root, control address, bookies, ledgers) and keep running until SIGINT/SIGTERM
  or ``sim down``.
- ``sim run scenario.yaml``: run a scenario's timeline against a new simulator (or, with ``--attach`` /
  ``--control``, against the running one) and print the ground truth at the end.
- ``sim <action> ...`` (``kill-bookie``, ``flap-bookie``, ``make-silent``, ``create-ledger`` …): one action
  against the running simulator, through its control channel; ``sim do ACTION --args JSON`` runs any action.
- ``sim truth``, ``sim status``, ``sim down``, ``sim actions``.

Bookies are given by id (or ``--index N``, their add order), ledgers by id, alias or creation order
(``#0``). Without a running simulator every command that needs one exits 2 with one line.

Example:
    $ bkaudit sim up --bookies 6 --racks 3 --ledgers 20 &
    $ bkaudit sim kill-bookie bookie-01 --hard
    $ bkaudit sim truth
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import signal
import threading
from pathlib import Path
from typing import Annotated, Any

import typer

from bkaudit.cli._io import emit_json
from bkaudit.cli.formats import StateFormat, StateFormatOption, emit_state
from core.errors import ConfigError, InvalidArgumentError

app = typer.Typer(
    help="The simulated BookKeeper cluster: up, faults, scenarios, ground truth.", no_args_is_help=True
)

_STATE_DIR_HELP = "state directory holding sim.json (default: the dev state directory, .bkaudit)"
_CONTROL_HELP = "control address host:port of a running simulator (default: from the state file)"

StateDirOption = Annotated[Path | None, typer.Option("--state-dir", help=_STATE_DIR_HELP)]
ControlOption = Annotated[str | None, typer.Option("--control", help=_CONTROL_HELP)]
ZooKeeperOption = Annotated[
    str | None,
    typer.Option("--zookeeper", help="ZooKeeper hosts[/chroot] (default: the embedded dev cluster)"),
]
_BOOKIE_HELP = "bookie id, e.g. bookie-01 (`bkaudit sim status` lists them)"
BookieArgument = Annotated[str, typer.Argument(help=_BOOKIE_HELP)]
OneBookieArgument = Annotated[str | None, typer.Argument(help=_BOOKIE_HELP)]
IndexOption = Annotated[
    int | None, typer.Option("--index", min=0, help="the bookie added in this place instead (0 = the first)")
]
LedgerArgument = Annotated[str, typer.Argument(help="ledger id, alias or creation order (#0)")]


# ============================================================================================== helpers


def _state_dir(state_dir: Path | None) -> Path:
    if state_dir is not None:
        return state_dir
    from core.settings import load_settings

    return load_settings().dev.state_dir


def _zookeeper(zookeeper: str | None) -> str:
    """The given hosts string, or the embedded dev cluster's ZooKeeper (started when needed)."""
    if zookeeper:
        return zookeeper
    from connectors.devcluster import DevCluster
    from core.settings import load_settings

    return DevCluster(load_settings().dev).up()["zookeeper"]


def _client(state_dir: Path | None, control: str | None) -> Any:
    from bkaudit.sim.control import find_simulator

    return find_simulator(_state_dir(state_dir), control)


def _ref(value: str) -> str | int:
    """A bookie reference from the command line: digits mean add order, anything else is an id."""
    return int(value) if value.isdigit() else value


def _bookie(bookie: str | None, index: int | None = None) -> str | int:
    """The bookie a command names: its id, or with ``--index`` its place in the add order.

    A number where an id belongs is refused rather than read as a place: ``kill-bookie 1`` meaning the
    second bookie added, not ``bookie-01``, surprised users.

    Example:
        >>> _bookie("bookie-01"), _bookie(None, 1)
        ('bookie-01', 1)
    """
    if (bookie is None) == (index is None):
        raise InvalidArgumentError("name the bookie by its id, or give --index N (not both)")
    if index is not None:
        return index
    assert bookie is not None
    if bookie.isdigit():
        raise InvalidArgumentError(
            f"{bookie!r} is not a bookie id; use --index {bookie} for the bookie added in that place, or "
            "an id from `bkaudit sim status`"
        )
    return bookie


def _do(action: str, args: dict[str, Any], state_dir: Path | None, control: str | None) -> None:
    emit_json(_client(state_dir, control).action(action, {k: v for k, v in args.items() if v is not None}))


def _truth_parameters(**options: Any) -> dict[str, Any]:
    return {key: value for key, value in options.items() if value is not None}


def _wait_for_stop(stop: threading.Event) -> None:
    """Block until SIGINT/SIGTERM or a ``sim down`` (``stop`` set)."""
    previous: dict[signal.Signals, Any] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        # Outside the main thread (embedded use) signals cannot be caught: `sim down` still works.
        with contextlib.suppress(ValueError):
            previous[signum] = signal.signal(signum, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _serve(sim: Any, state_dir: Path, port: int, summary: dict[str, Any]) -> None:
    """Run the control channel for ``sim``, print ``summary`` + where, wait for the stop, clean up."""
    from bkaudit.sim.control import ControlServer, SimulatorState, remove_state, write_state

    stop = threading.Event()
    server = ControlServer(sim, port=port, on_shutdown=stop.set).start()
    pid = os.getpid()
    try:
        state_path = write_state(state_dir, SimulatorState(server.address, pid, sim.zk_hosts, sim.root))
        emit_json({**summary, "control": server.address, "pid": pid, "state_file": str(state_path)})
        _wait_for_stop(stop)
    finally:
        server.stop()
        sim.close()
        remove_state(state_dir, pid)


def _refuse_second_simulator(state_dir: Path) -> None:
    from bkaudit.sim.control import ControlClient, read_state
    from bkaudit.sim.errors import SimulatorError

    state = read_state(state_dir)
    if state is None:
        return
    try:
        ControlClient(state.control, timeout_s=5.0).status()
    except SimulatorError:
        return  # a stale state file: that simulator is gone
    raise ConfigError(
        f"a simulator is already running at {state.control} (pid {state.pid}); "
        "stop it with `bkaudit sim down`"
    )


def _summary(sim: Any) -> dict[str, Any]:
    status = sim.status()
    return {
        "zookeeper": status["zookeeper"],
        "root": status["root"],
        "manager": status["manager"],
        "instance_id": status["instance_id"],
        "rack_map_path": status["rack_map_path"],
        "bookies": [
            {key: bookie[key] for key in ("bookie_id", "address", "rack", "mode", "storage", "ledger_dir")}
            for bookie in status["bookies"]
        ],
        "ledgers": [ledger["ledger_id"] for ledger in status["ledgers"]],
    }


# ============================================================================================ lifecycle


@app.command("up")
def up(
    zookeeper: ZooKeeperOption = None,
    root: Annotated[str, typer.Option("--root", help="BookKeeper ledgers root")] = "/ledgers",
    bookies: Annotated[int, typer.Option("--bookies", min=0, help="bookies to start")] = 5,
    racks: Annotated[int, typer.Option("--racks", min=1, help="racks the bookies are spread over")] = 3,
    ledgers: Annotated[int, typer.Option("--ledgers", min=0, help="closed ledgers to create")] = 10,
    open_ledgers: Annotated[int, typer.Option("--open-ledgers", min=0, help="open ledgers to create")] = 0,
    entries: Annotated[int, typer.Option("--entries", min=0, help="entries per ledger")] = 20,
    ensemble_size: Annotated[int, typer.Option("--ensemble-size", min=1)] = 3,
    write_quorum: Annotated[int, typer.Option("--write-quorum", min=1)] = 2,
    ack_quorum: Annotated[int, typer.Option("--ack-quorum", min=1)] = 2,
    id_style: Annotated[str, typer.Option("--id-style", help="bookie ids: bp41, legacy or mixed")] = "mixed",
    storage: Annotated[
        str,
        typer.Option(
            "--storage",
            help="ledger storage of the bookies: SortedLedgerStorage, DbLedgerStorage (Pulsar's default: no "
            "answer to entry-list requests) or mixed",
        ),
    ] = "SortedLedgerStorage",
    manager: Annotated[
        str, typer.Option("--manager", help="hierarchical, longhierarchical, legacyhierarchical, flat")
    ] = "hierarchical",
    lost_bookie_recovery_delay: Annotated[
        int, typer.Option("--lost-bookie-recovery-delay", min=0, help="seconds, written to underreplication/")
    ] = 0,
    bookie_session_timeout: Annotated[
        float,
        typer.Option(
            "--bookie-session-timeout", min=0.5, help="seconds; a hard-killed bookie stays this long"
        ),
    ] = 10.0,
    reset: Annotated[
        bool, typer.Option("--reset", help="delete an existing root and rack map first")
    ] = False,
    seed: Annotated[int | None, typer.Option("--seed", help="random seed for ensemble choices")] = None,
    index_root: Annotated[
        str | None,
        typer.Option(
            "--index-root",
            help="directory where DbLedgerStorage bookies write their RocksDB indexes (for `bkaudit agent`)",
        ),
    ] = None,
    port: Annotated[
        int,
        typer.Option("--port", min=0, max=65535, help="control channel port on 127.0.0.1 (0: any free one)"),
    ] = 0,
    state_dir: StateDirOption = None,
) -> None:
    """Start a simulated cluster and keep it running (SIGINT/SIGTERM or `sim down` stops it)."""
    from bkaudit.sim.scenario import ClusterSpec, build_cluster

    directory = _state_dir(state_dir)
    _refuse_second_simulator(directory)
    spec = _validated_spec(
        bookies=bookies,
        racks=racks,
        ledgers=ledgers,
        open_ledgers=open_ledgers,
        entries=entries,
        ensemble_size=ensemble_size,
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        id_style=id_style,
        storage=storage,
        manager=manager,
        root=root,
        lost_bookie_recovery_delay_s=lost_bookie_recovery_delay,
        bookie_session_timeout_s=bookie_session_timeout,
        seed=seed,
        index_root=index_root,
    )
    assert isinstance(spec, ClusterSpec)
    sim = build_cluster(spec, _zookeeper(zookeeper), reset=reset)
    _serve(sim, directory, port, _summary(sim))


def _validated_spec(**values: Any) -> Any:
    from pydantic import ValidationError

    from bkaudit.sim.scenario import ClusterSpec

    try:
        return ClusterSpec.model_validate(values)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ConfigError(f"sim up: {where + ': ' if where else ''}{first['msg']}") from None


@app.command("down")
def down(
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Stop the running simulator (its bookies' sessions are closed; the znodes it wrote stay)."""
    emit_json(_client(state_dir, control).shutdown())


@app.command("status")
def status(
    state_dir: StateDirOption = None,
    control: ControlOption = None,
    fmt: StateFormatOption = StateFormat.table,
) -> None:
    """Bookies (address, rack, mode, faults) and ledgers of the running simulator."""
    emit_state(_client(state_dir, control).status(), fmt)


@app.command("truth")
def truth(
    grace_s: Annotated[
        float | None, typer.Option("--grace-s", help="under-replication grace period, seconds (default 600)")
    ] = None,
    probe_timeout_s: Annotated[
        float | None,
        typer.Option("--probe-timeout-s", help="the auditor's probe timeout, seconds (default 5)"),
    ] = None,
    placement_policy: Annotated[
        str | None, typer.Option("--placement-policy", help="rackaware, regionaware or zoneaware")
    ] = None,
    state_dir: StateDirOption = None,
    control: ControlOption = None,
    fmt: StateFormatOption = StateFormat.table,
) -> None:
    """What a correct auditor must flag right now, per alert kind."""
    parameters = _truth_parameters(
        under_replication_grace_s=grace_s, probe_timeout_s=probe_timeout_s, placement_policy=placement_policy
    )
    emit_state(_client(state_dir, control).truth(parameters), fmt)


@app.command("run")
def run(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file")],
    zookeeper: ZooKeeperOption = None,
    reset: Annotated[
        bool, typer.Option("--reset", help="delete an existing root and rack map first")
    ] = False,
    attach: Annotated[
        bool, typer.Option("--attach", help="run against the running simulator instead")
    ] = False,
    keep_running: Annotated[
        bool, typer.Option("--keep-running", help="keep the new simulator up afterwards")
    ] = False,
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="control port with --keep-running")
    ] = 0,
    state_dir: StateDirOption = None,
    control: Annotated[
        str | None, typer.Option("--control", help=_CONTROL_HELP + "; implies --attach")
    ] = None,
) -> None:
    """Run a scenario's timeline and print the ground truth at the end (plus a `scenario` log)."""
    from bkaudit.sim.actions import perform_action
    from bkaudit.sim.scenario import build_cluster, load_scenario, run_timeline

    plan = load_scenario(scenario)
    if attach or control:
        if keep_running:
            raise ConfigError("--keep-running only applies to a new simulator, not with --attach/--control")
        client = _client(state_dir, control)
        log = run_timeline(plan, client.action)
        result = client.truth(plan.truth.model_dump())
        emit_json({**result, "scenario": {"file": str(scenario), "steps": log}})
        return
    directory = _state_dir(state_dir)
    if keep_running:
        _refuse_second_simulator(directory)
    sim = build_cluster(plan.cluster, _zookeeper(zookeeper), reset=reset, truth=plan.truth)
    try:
        log = run_timeline(plan, lambda name, args: perform_action(sim, name, args))
        result = {**sim.ground_truth(), "scenario": {"file": str(scenario), "steps": log}}
    except BaseException:
        sim.close()
        raise
    if not keep_running:
        sim.close()
        emit_json(result)
        return
    _serve(sim, directory, port, result)


@app.command("actions")
def actions(fmt: StateFormatOption = StateFormat.table) -> None:
    """Every action name with its arguments (for scenarios and `sim do`)."""
    from bkaudit.sim.actions import ACTIONS

    listed = {
        name: {"help": spec.summary, "args": sorted(spec.args_model.model_fields)}
        for name, spec in sorted(ACTIONS.items())
    }
    if fmt is StateFormat.json:
        emit_json(listed)
    else:
        emit_state({"actions": [{"action": name, **entry} for name, entry in listed.items()]}, fmt)


@app.command("do")
def do(
    action: Annotated[str, typer.Argument(help="action name (see `bkaudit sim actions`)")],
    args: Annotated[
        str, typer.Option("--args", help="arguments as a JSON object, e.g. '{\"bookie\": 0}'")
    ] = "{}",
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Run any action against the running simulator."""
    from bkaudit.sim.actions import validate_action
    from core.errors import FormatError

    try:
        parsed = json.loads(args)
    except ValueError:
        raise FormatError("sim do: --args is not valid JSON") from None
    if not isinstance(parsed, dict):
        raise FormatError("sim do: --args must be a JSON object")
    validate_action(action, parsed)  # fail before contacting the simulator
    emit_json(_client(state_dir, control).action(action, parsed))


# =============================================================================================== faults


@app.command("kill-bookie")
def kill_bookie(
    bookie: OneBookieArgument = None,
    index: IndexOption = None,
    hard: Annotated[
        bool, typer.Option("--hard", help="no closeSession: the znode stays until the session expires")
    ] = False,
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Stop a bookie (graceful: its znode goes at once; --hard: after the session timeout)."""
    _do("kill_bookie", {"bookie": _bookie(bookie, index), "hard": hard}, state_dir, control)


@app.command("restart-bookie")
def restart_bookie(
    bookie: OneBookieArgument = None,
    index: IndexOption = None,
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Start a down bookie again (same port, same data)."""
    _do("restart_bookie", {"bookie": _bookie(bookie, index)}, state_dir, control)


@app.command("flap-bookie")
def flap_bookie(
    down_s: Annotated[float, typer.Option("--down-s", min=0, help="seconds before it comes back")],
    bookie: OneBookieArgument = None,
    index: IndexOption = None,
    hard: Annotated[bool, typer.Option("--hard")] = False,
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Kill a bookie and bring it back after --down-s seconds."""
    _do("flap_bookie", {"bookie": _bookie(bookie, index), "down_s": down_s, "hard": hard}, state_dir, control)


@app.command("set-readonly")
def set_readonly(
    bookie: OneBookieArgument = None,
    index: IndexOption = None,
    writable: Annotated[bool, typer.Option("--writable", help="go back to writable instead")] = False,
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Move a bookie's registration to available/readonly/ (or back with --writable)."""
    _do("set_readonly", {"bookie": _bookie(bookie, index), "readonly": not writable}, state_dir, control)


@app.command("make-silent")
def make_silent(
    bookie: OneBookieArgument = None,
    index: IndexOption = None,
    off: Annotated[bool, typer.Option("--off", help="answer again")] = False,
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Never answer protocol requests (a DbLedgerStorage bookie)."""
    _do("make_silent", {"bookie": _bookie(bookie, index), "silent": not off}, state_dir, control)


@app.command("make-slow")
def make_slow(
    delay_s: Annotated[
        float, typer.Option("--delay-s", min=0, help="seconds before every answer (0: fast again)")
    ],
    bookie: OneBookieArgument = None,
    index: IndexOption = None,
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Answer every request late."""
    _do("make_slow", {"bookie": _bookie(bookie, index), "delay_s": delay_s}, state_dir, control)


@app.command("heal-bookie")
def heal_bookie(
    bookie: OneBookieArgument = None,
    index: IndexOption = None,
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Clear a bookie's protocol faults (silent, slow, ENOLEDGER, error status)."""
    _do("heal_bookie", {"bookie": _bookie(bookie, index)}, state_dir, control)


@app.command("lose-entries")
def lose_entries(
    bookie: BookieArgument,
    ledger: LedgerArgument,
    entries: Annotated[list[int], typer.Argument(help="entry ids to forget")],
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Make a bookie forget some entries of a ledger."""
    _do("lose_entries", {"bookie": _bookie(bookie), "ledger": ledger, "entries": entries}, state_dir, control)


@app.command("lose-ledger")
def lose_ledger(
    bookie: BookieArgument,
    ledger: LedgerArgument,
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Make a bookie forget a whole ledger."""
    _do("lose_ledger", {"bookie": _bookie(bookie), "ledger": ledger}, state_dir, control)


@app.command("answer-enoledger")
def answer_enoledger(
    bookie: BookieArgument,
    ledger: LedgerArgument,
    off: Annotated[bool, typer.Option("--off", help="stop")] = False,
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Answer ENOLEDGER for a ledger the bookie holds."""
    _do(
        "answer_enoledger",
        {"bookie": _bookie(bookie), "ledger": ledger, "enabled": not off},
        state_dir,
        control,
    )


@app.command("move-bookie-rack")
def move_bookie_rack(
    bookie: BookieArgument,
    rack: Annotated[str, typer.Argument(help="the new rack, e.g. /rack-2")],
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Put a bookie in another rack of Pulsar's /bookies rack map."""
    _do("move_bookie_rack", {"bookie": _bookie(bookie), "rack": rack}, state_dir, control)


@app.command("place-ledger-badly")
def place_ledger_badly(
    rack: Annotated[
        str | None, typer.Option("--rack", help="the rack (default: the one with most bookies)")
    ] = None,
    ensemble_size: Annotated[int, typer.Option("--ensemble-size", min=1)] = 3,
    write_quorum: Annotated[int, typer.Option("--write-quorum", min=1)] = 2,
    ack_quorum: Annotated[int, typer.Option("--ack-quorum", min=1)] = 2,
    entries: Annotated[int, typer.Option("--entries", min=0)] = 10,
    name: Annotated[str | None, typer.Option("--name", help="alias for later references")] = None,
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Create and close a ledger whose write sets all sit in one rack."""
    args = {
        "rack": rack,
        "ensemble_size": ensemble_size,
        "write_quorum": write_quorum,
        "ack_quorum": ack_quorum,
        "entries": entries,
        "name": name,
    }
    _do("place_ledger_badly", args, state_dir, control)


@app.command("corrupt-ledger")
def corrupt_ledger(
    ledger: LedgerArgument,
    how: Annotated[
        str, typer.Option("--how", help="truncated, garbage, bad-version or not-protobuf")
    ] = "truncated",
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Overwrite a ledger's metadata znode with bytes that do not decode."""
    _do("corrupt_ledger_znode", {"ledger": ledger, "how": how}, state_dir, control)


@app.command("mark-underreplicated")
def mark_underreplicated(
    ledger: LedgerArgument,
    replica: Annotated[
        list[str] | None, typer.Option("--replica", help="bookie believed missing (repeatable)")
    ] = None,
    age_s: Annotated[
        float | None, typer.Option("--age-s", min=0, help="back-date the mark's ctime by this much")
    ] = None,
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Write a urL under-replication mark for a ledger."""
    replicas = [_ref(value) for value in replica or []]
    _do("mark_underreplicated", {"ledger": ledger, "replicas": replicas, "age_s": age_s}, state_dir, control)


@app.command("set-lost-bookie-recovery-delay")
def set_lost_bookie_recovery_delay(
    seconds: Annotated[int, typer.Argument(min=0)],
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Set underreplication/lostBookieRecoveryDelay."""
    _do("set_lost_bookie_recovery_delay", {"seconds": seconds}, state_dir, control)


class Switch(enum.StrEnum):
    """An on/off argument."""

    ON = "on"
    OFF = "off"


@app.command("autorecovery")
def autorecovery(
    switch: Annotated[Switch, typer.Argument(help="on or off (off creates underreplication/disable)")],
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Switch AutoRecovery on or off."""
    _do("set_autorecovery", {"enabled": switch is Switch.ON}, state_dir, control)


@app.command("auditor")
def auditor(
    switch: Annotated[Switch, typer.Argument(help="on (run the Auditor) or off (drop its election vote)")],
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Run or drop the Auditor."""
    _do("set_auditor", {"running": switch is Switch.ON}, state_dir, control)


class AuditorCheck(enum.StrEnum):
    """One of the Auditor's periodic checks, by its ctime znode."""

    CHECK_ALL_LEDGERS = "checkallledgersctime"
    PLACEMENT_POLICY_CHECK = "placementpolicycheckctime"
    REPLICAS_CHECK = "replicascheckctime"


@app.command("check-time")
def check_time(
    check: Annotated[AuditorCheck, typer.Argument(help="the check's znode under underreplication/")],
    age_s: Annotated[
        float | None, typer.Option("--age-s", min=0, help="completed this many seconds ago (default now)")
    ] = None,
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Mark one of the Auditor's periodic checks completed (writes its ctime znode)."""
    _do("set_check_time", {"check": check.value, "age_s": age_s}, state_dir, control)


@app.command("hold-lock")
def hold_lock(
    ledger: LedgerArgument,
    holder: Annotated[str, typer.Option("--holder", help="the worker's host name")] = "replication-worker-0",
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Hold a ledger's replication lock (underreplication/locks/urL + its id) until release-lock."""
    _do("hold_lock", {"ledger": ledger, "holder": holder}, state_dir, control)


@app.command("release-lock")
def release_lock(
    ledger: LedgerArgument, state_dir: StateDirOption = None, control: ControlOption = None
) -> None:
    """Release a ledger's replication lock."""
    _do("release_lock", {"ledger": ledger}, state_dir, control)


# ============================================================================================== ledgers


@app.command("add-bookie")
def add_bookie(
    bookie_id: Annotated[str | None, typer.Option("--bookie-id", help="BP-41 id (default bookie-NN)")] = None,
    rack: Annotated[str | None, typer.Option("--rack", help="rack (default: round robin)")] = None,
    legacy_id: Annotated[
        bool, typer.Option("--legacy-id", help="name it by its address, 127.0.0.1:PORT")
    ] = False,
    storage: Annotated[
        str, typer.Option("--storage", help="SortedLedgerStorage or DbLedgerStorage")
    ] = "SortedLedgerStorage",
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Start one more bookie."""
    arguments = {"bookie_id": bookie_id, "rack": rack, "legacy_id": legacy_id, "storage": storage}
    _do("add_bookie", arguments, state_dir, control)


@app.command("create-ledger")
def create_ledger(
    ensemble_size: Annotated[int, typer.Option("--ensemble-size", min=1)] = 3,
    write_quorum: Annotated[int, typer.Option("--write-quorum", min=1)] = 2,
    ack_quorum: Annotated[int, typer.Option("--ack-quorum", min=1)] = 2,
    entries: Annotated[int, typer.Option("--entries", min=0)] = 0,
    open_: Annotated[bool, typer.Option("--open", help="leave it open")] = False,
    format_version: Annotated[int, typer.Option("--format-version", min=1, max=3)] = 3,
    managed_ledger: Annotated[
        str | None, typer.Option("--managed-ledger", help="Pulsar managed-ledger name")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="alias for later references")] = None,
    count: Annotated[int, typer.Option("--count", min=1)] = 1,
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Create ledgers like Pulsar's managed ledger (closed unless --open)."""
    args = {
        "ensemble_size": ensemble_size,
        "write_quorum": write_quorum,
        "ack_quorum": ack_quorum,
        "entries": entries,
        "close": not open_,
        "format_version": format_version,
        "managed_ledger": managed_ledger,
        "name": name,
        "count": count,
    }
    _do("create_ledger", args, state_dir, control)


@app.command("add-entries")
def add_entries(
    ledger: LedgerArgument,
    count: Annotated[int, typer.Option("--count", min=1)] = 1,
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Append entries to an open ledger (with an ensemble change if a bookie of it is down)."""
    _do("add_entries", {"ledger": ledger, "count": count}, state_dir, control)


@app.command("close-ledger")
def close_ledger(
    ledger: LedgerArgument, state_dir: StateDirOption = None, control: ControlOption = None
) -> None:
    """Close an open ledger."""
    _do("close_ledger", {"ledger": ledger}, state_dir, control)


@app.command("ensemble-change")
def ensemble_change(
    ledger: LedgerArgument,
    bookie: Annotated[str, typer.Argument(help="the bookie to replace")],
    replacement: Annotated[
        str | None, typer.Option("--replacement", help="the new bookie (default: chosen rack-aware)")
    ] = None,
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Replace a bookie in an open ledger's ensemble (new segment)."""
    args = {
        "ledger": ledger,
        "bookie": _ref(bookie),
        "replacement": _ref(replacement) if replacement else None,
    }
    _do("ensemble_change", args, state_dir, control)


@app.command("recover")
def recover(
    ledger: LedgerArgument,
    incomplete: Annotated[bool, typer.Option("--incomplete", help="stop at IN_RECOVERY")] = False,
    state_dir: StateDirOption = None,
    control: ControlOption = None,
) -> None:
    """Recover an open ledger (IN_RECOVERY, then CLOSED)."""
    _do("recover", {"ledger": ledger, "complete": not incomplete}, state_dir, control)


@app.command("delete-ledger")
def delete_ledger(
    ledger: LedgerArgument, state_dir: StateDirOption = None, control: ControlOption = None
) -> None:
    """Delete a ledger (metadata and, on the bookies, its entries)."""
    _do("delete_ledger", {"ledger": ledger}, state_dir, control)
