"""Every simulator operation by name, with validated arguments: one table for scenarios, the control
channel and the CLI.

Pure validation plus one dispatch function that calls a
:class:`~bkaudit.sim.cluster.SimulatedCluster` method.

An action is a name (``kill_bookie``) and a JSON object of arguments (``{"bookie": 0, "hard": true}``),
checked by a pydantic model that forbids unknown keys. Bookies are referred to by id or add order (``0``,
``"#0"``), ledgers by id, alias or creation order (``"#0"``). :func:`validate_action` turns any problem into
one :class:`~bkaudit.sim.errors.SimulatorError` line; :func:`perform_action` runs it and returns a
JSON-serialisable result.

Example:
    >>> validate_action("kill_bookie", {"bookie": "bookie-01", "hard": True})
    KillBookieArgs(bookie='bookie-01', hard=True)
    >>> validate_action("kill_bookie", {"bookie": 1, "hardd": True})
    Traceback (most recent call last):
    ...
    bkaudit.sim.errors.SimulatorError: kill_bookie: hardd: extra inputs are not permitted
    >>> try:
    ...     validate_action("explode", {})
    ... except SimulatorError as err:
    ...     str(err)[:60]
    "unknown action 'explode' (known: add_bookie, add_entries, an"
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from bkaudit.sim.errors import SimulatorError

if TYPE_CHECKING:
    from bkaudit.sim.cluster import SimulatedCluster

__all__ = ["ACTIONS", "ActionSpec", "perform_action", "validate_action"]

BookieRef = StrictInt | str
LedgerRef = StrictInt | str


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AddBookieArgs(_Args):
    """Start a new bookie."""

    bookie_id: str | None = None
    rack: str | None = None
    legacy_id: bool = False
    storage: Literal["SortedLedgerStorage", "DbLedgerStorage"] = "SortedLedgerStorage"


class CreateLedgerArgs(_Args):
    """Create ``count`` ledgers like Pulsar's managed ledger (closed unless ``close`` is false)."""

    ensemble_size: int = Field(3, ge=1)
    write_quorum: int = Field(2, ge=1)
    ack_quorum: int = Field(2, ge=1)
    entries: int = Field(0, ge=0)
    close: bool = True
    format_version: Literal[1, 2, 3] = 3
    managed_ledger: str | None = None
    ensemble: list[BookieRef] | None = None
    name: str | None = None
    count: int = Field(1, ge=1, le=100_000)


class AddEntriesArgs(_Args):
    """Append entries to an open ledger (ensemble change first if a bookie of it is down or read-only)."""

    ledger: LedgerRef
    count: int = Field(1, ge=1)
    entry_size: int | None = Field(None, ge=0)


class LedgerArgs(_Args):
    """Arguments naming one ledger."""

    ledger: LedgerRef


class EnsembleChangeArgs(_Args):
    """Replace a bookie in an open ledger's ensemble from the next entry on."""

    ledger: LedgerRef
    bookie: BookieRef
    replacement: BookieRef | None = None


class RecoverArgs(_Args):
    """Recover an open ledger (IN_RECOVERY, then CLOSED unless ``complete`` is false)."""

    ledger: LedgerRef
    complete: bool = True


class DeleteLedgerArgs(_Args):
    """Delete a ledger's metadata (and its entries on the bookies when ``garbage_collect``)."""

    ledger: LedgerRef
    garbage_collect: bool = True


class BookieArgs(_Args):
    """Arguments naming one bookie."""

    bookie: BookieRef


class KillBookieArgs(_Args):
    """Stop a bookie, gracefully (znode gone at once) or hard (gone after the session timeout)."""

    bookie: BookieRef
    hard: bool = False


class FlapBookieArgs(_Args):
    """Kill a bookie and restart it after ``down_s`` seconds."""

    bookie: BookieRef
    down_s: float = Field(ge=0)
    hard: bool = False


class SetReadonlyArgs(_Args):
    """Move a bookie's registration to ``available/readonly/`` (or back with ``readonly: false``)."""

    bookie: BookieRef
    readonly: bool = True


class LoseEntriesArgs(_Args):
    """Make a bookie forget some entries of a ledger."""

    bookie: BookieRef
    ledger: LedgerRef
    entries: list[StrictInt] = Field(min_length=1)


class BookieLedgerArgs(_Args):
    """Arguments naming a bookie and a ledger."""

    bookie: BookieRef
    ledger: LedgerRef


class AnswerEnoledgerArgs(_Args):
    """Answer ENOLEDGER for a ledger the bookie holds (``enabled: false`` stops)."""

    bookie: BookieRef
    ledger: LedgerRef
    enabled: bool = True


class MakeSilentArgs(_Args):
    """Never answer protocol requests (a DbLedgerStorage bookie)."""

    bookie: BookieRef
    silent: bool = True


class MakeSlowArgs(_Args):
    """Answer every request after ``delay_s`` seconds."""

    bookie: BookieRef
    delay_s: float = Field(ge=0)


class FailWithStatusArgs(_Args):
    """Answer every request with a BookKeeper status code (e.g. 501 = EIO); null stops."""

    bookie: BookieRef
    status: int | None = Field(501, ge=0)


class MoveBookieRackArgs(_Args):
    """Put a bookie in another rack of Pulsar's rack map."""

    bookie: BookieRef
    rack: str = Field(min_length=1)


class PlaceLedgerBadlyArgs(_Args):
    """Create and close a ledger whose every write set sits in one rack."""

    rack: str | None = None
    ensemble_size: int = Field(3, ge=1)
    write_quorum: int = Field(2, ge=1)
    ack_quorum: int = Field(2, ge=1)
    entries: int = Field(10, ge=0)
    name: str | None = None
    managed_ledger: str | None = None


class CorruptLedgerArgs(_Args):
    """Overwrite a ledger's metadata znode with bytes that do not decode."""

    ledger: LedgerRef
    how: Literal["truncated", "garbage", "bad-version", "not-protobuf"] = "truncated"


class MarkUnderreplicatedArgs(_Args):
    """Write a ``urL`` mark; ``age_s`` back-dates its ctime (or give ``ctime_ms``)."""

    ledger: LedgerRef
    replicas: list[BookieRef] = Field(default_factory=list)
    ctime_ms: int | None = None
    age_s: float | None = Field(None, ge=0)


class SetLostBookieRecoveryDelayArgs(_Args):
    """Set ``underreplication/lostBookieRecoveryDelay`` (seconds)."""

    seconds: int = Field(ge=0, le=2**31 - 1)


class SetAutorecoveryArgs(_Args):
    """Switch AutoRecovery on or off (delete or create ``underreplication/disable``)."""

    enabled: bool


class SetAuditorArgs(_Args):
    """Run or stop the Auditor (its vote under ``underreplication/auditorelection``)."""

    running: bool


class SetCheckTimeArgs(_Args):
    """Mark one of the Auditor's periodic checks completed (its ``underreplication/<check>`` znode).

    At ``ctime_ms``, ``age_s`` ago, or now."""

    check: Literal["checkallledgersctime", "placementpolicycheckctime", "replicascheckctime"]
    ctime_ms: int | None = Field(None, ge=0, le=2**63 - 1)
    age_s: float | None = Field(None, ge=0)


def _set_check_time(sim: SimulatedCluster, args: SetCheckTimeArgs) -> dict[str, int]:
    if args.ctime_ms is not None and args.age_s is not None:
        raise SimulatorError("set_check_time: give ctime_ms or age_s, not both")
    ctime_ms = args.ctime_ms
    if args.age_s is not None:
        ctime_ms = int(time.time() * 1000 - args.age_s * 1000)
    return {"ctime_ms": sim.set_check_time(args.check, ctime_ms)}


class HoldLockArgs(_Args):
    """Hold a ledger's replication lock (``underreplication/locks/urL<id>``) until released."""

    ledger: LedgerRef
    holder: str = Field("replication-worker-0", min_length=1, max_length=255)


@dataclass(frozen=True)
class ActionSpec:
    """One action: its argument model and what it does to a cluster.

    Example:
        >>> ACTIONS["make_slow"].args_model.__name__
        'MakeSlowArgs'
    """

    args_model: type[_Args]
    run: Callable[[SimulatedCluster, Any], Any]
    help: str = ""  # for an argument model several actions share; otherwise its docstring says it

    @property
    def summary(self) -> str:
        """The action's help: its own, or the first line of its argument model's docstring."""
        return self.help or (self.args_model.__doc__ or "").strip().splitlines()[0]


def _create_ledgers(sim: SimulatedCluster, args: CreateLedgerArgs) -> dict[str, Any]:
    options = args.model_dump(exclude={"count", "name"})
    if args.count > 1 and args.name is not None:
        raise SimulatorError("create_ledger: a name can only be given to a single ledger (count 1)")
    ids = [sim.create_ledger(**options, name=args.name) for _ in range(args.count)]
    return {"ledger_ids": ids}


def _mark(sim: SimulatedCluster, args: MarkUnderreplicatedArgs) -> dict[str, Any]:
    if args.ctime_ms is not None and args.age_s is not None:
        raise SimulatorError("mark_underreplicated: give ctime_ms or age_s, not both")
    ctime = args.ctime_ms
    if args.age_s is not None:
        ctime = int(time.time() * 1000 - args.age_s * 1000)
    return {"path": sim.mark_underreplicated(args.ledger, args.replicas, ctime_ms=ctime)}


def _dump(args: _Args, *names: str) -> dict[str, Any]:
    return {name: getattr(args, name) for name in names}


ACTIONS: Mapping[str, ActionSpec] = {
    "add_bookie": ActionSpec(AddBookieArgs, lambda sim, a: {"bookie_id": sim.add_bookie(**a.model_dump())}),
    "create_ledger": ActionSpec(CreateLedgerArgs, _create_ledgers),
    "add_entries": ActionSpec(
        AddEntriesArgs,
        lambda sim, a: {"last_entry_id": sim.add_entries(a.ledger, a.count, entry_size=a.entry_size)},
    ),
    "close_ledger": ActionSpec(
        LedgerArgs, lambda sim, a: sim.close_ledger(a.ledger), "Close an open ledger at its last entry."
    ),
    "ensemble_change": ActionSpec(
        EnsembleChangeArgs,
        lambda sim, a: {"replacement": sim.ensemble_change(a.ledger, a.bookie, a.replacement)},
    ),
    "recover": ActionSpec(RecoverArgs, lambda sim, a: sim.recover(a.ledger, complete=a.complete)),
    "delete_ledger": ActionSpec(
        DeleteLedgerArgs, lambda sim, a: sim.delete_ledger(a.ledger, garbage_collect=a.garbage_collect)
    ),
    "kill_bookie": ActionSpec(KillBookieArgs, lambda sim, a: sim.kill_bookie(a.bookie, hard=a.hard)),
    "restart_bookie": ActionSpec(
        BookieArgs,
        lambda sim, a: sim.restart_bookie(a.bookie),
        "Start a down bookie again (same port, same data).",
    ),
    "flap_bookie": ActionSpec(
        FlapBookieArgs, lambda sim, a: sim.flap_bookie(a.bookie, a.down_s, hard=a.hard)
    ),
    "set_readonly": ActionSpec(SetReadonlyArgs, lambda sim, a: sim.set_readonly(a.bookie, a.readonly)),
    "lose_entries": ActionSpec(
        LoseEntriesArgs, lambda sim, a: sim.lose_entries(a.bookie, a.ledger, a.entries)
    ),
    "lose_ledger": ActionSpec(
        BookieLedgerArgs,
        lambda sim, a: sim.lose_ledger(a.bookie, a.ledger),
        "Make a bookie forget every entry of a ledger.",
    ),
    "reformat_bookie": ActionSpec(
        BookieArgs,
        lambda sim, a: {"cookie_czxid": sim.reformat_bookie(a.bookie)},
        "Format a bookie again under the same id: its entries wiped, its cookie created again.",
    ),
    "answer_enoledger": ActionSpec(
        AnswerEnoledgerArgs, lambda sim, a: sim.answer_enoledger(a.bookie, a.ledger, a.enabled)
    ),
    "make_silent": ActionSpec(MakeSilentArgs, lambda sim, a: sim.make_silent(a.bookie, a.silent)),
    "make_slow": ActionSpec(MakeSlowArgs, lambda sim, a: sim.make_slow(a.bookie, a.delay_s)),
    "fail_with_status": ActionSpec(
        FailWithStatusArgs, lambda sim, a: sim.fail_with_status(a.bookie, a.status)
    ),
    "heal_bookie": ActionSpec(
        BookieArgs,
        lambda sim, a: sim.heal_bookie(a.bookie),
        "Clear a bookie's protocol faults (silent, slow, ENOLEDGER, error status).",
    ),
    "move_bookie_rack": ActionSpec(MoveBookieRackArgs, lambda sim, a: sim.move_bookie_rack(a.bookie, a.rack)),
    "place_ledger_badly": ActionSpec(
        PlaceLedgerBadlyArgs, lambda sim, a: {"ledger_id": sim.place_ledger_badly(**a.model_dump())}
    ),
    "corrupt_ledger_znode": ActionSpec(
        CorruptLedgerArgs, lambda sim, a: sim.corrupt_ledger_znode(a.ledger, a.how)
    ),
    "mark_underreplicated": ActionSpec(MarkUnderreplicatedArgs, _mark),
    "clear_underreplicated": ActionSpec(
        LedgerArgs,
        lambda sim, a: sim.clear_underreplicated(a.ledger),
        "Remove a ledger's urL mark (the repair is done).",
    ),
    "set_lost_bookie_recovery_delay": ActionSpec(
        SetLostBookieRecoveryDelayArgs, lambda sim, a: sim.set_lost_bookie_recovery_delay(a.seconds)
    ),
    "set_autorecovery": ActionSpec(SetAutorecoveryArgs, lambda sim, a: sim.set_autorecovery(a.enabled)),
    "set_auditor": ActionSpec(SetAuditorArgs, lambda sim, a: sim.set_auditor(a.running)),
    "set_check_time": ActionSpec(SetCheckTimeArgs, _set_check_time),
    "hold_lock": ActionSpec(HoldLockArgs, lambda sim, a: {"path": sim.hold_lock(a.ledger, a.holder)}),
    "release_lock": ActionSpec(LedgerArgs, lambda sim, a: sim.release_lock(a.ledger)),
}


def _first_error(err: ValidationError) -> str:
    problem = err.errors(include_url=False)[0]
    where = ".".join(str(part) for part in problem["loc"])
    message = problem["msg"]
    message = message[0].lower() + message[1:] if message else "invalid"
    return f"{where}: {message}" if where else message


def validate_action(name: str, args: Mapping[str, Any] | None) -> _Args:
    """The validated arguments of action ``name``; any problem is one ``SimulatorError`` line.

    Example:
        >>> validate_action("make_slow", {"bookie": 2, "delay_s": 1.5}).delay_s
        1.5
    """
    spec = ACTIONS.get(name)
    if spec is None:
        raise SimulatorError(f"unknown action {name!r} (known: {', '.join(sorted(ACTIONS))})")
    if args is not None and not isinstance(args, Mapping):
        raise SimulatorError(f"{name}: arguments must be an object")
    try:
        return spec.args_model.model_validate(dict(args or {}))
    except ValidationError as err:
        raise SimulatorError(f"{name}: {_first_error(err)}") from None


def perform_action(sim: SimulatedCluster, name: str, args: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Validate and run one action on ``sim``; returns ``{"action": name, "result": ...}`` (JSON-ready).

    Example:
        >>> # perform_action(sim, "kill_bookie", {"bookie": 0, "hard": True})
        >>> # -> {"action": "kill_bookie", "result": None}
    """
    validated = validate_action(name, args)
    result = ACTIONS[name].run(sim, validated)
    return {"action": name, "result": result}
