"""`bkaudit check replicas | placement` (docs/reference.md, "Admin commands").

Both commands read one JSON object on stdin, validate it here (bad input → exit 2 with one
line on stderr) and apply the pure rules of :mod:`core.domain.rules.replicas` and
:mod:`core.domain.rules.placement`. Unknown keys are ignored, so the output of ``bkaudit metadata decode``
plus a ``"bookies"`` object is valid ``check replicas`` input.

``check replicas`` decisions: ``ack_quorum`` defaults to ``write_quorum`` (BookKeeper's reader rule) and
``last_entry_id`` to -1; an ensemble bookie absent from ``"bookies"`` is treated as ``"UNAVAILABLE"``;
output adds ``worst_entry_count`` (``worst_entries`` is capped at 1000 ids, ascending); ``unknown_bookies``
is sorted.

``check placement`` decisions: omitted parameters take BookKeeper's defaults, ``ack_quorum`` defaults to
``write_quorum``; an empty ensemble is FAIL (as in BookKeeper); a ``write_quorum`` above the ensemble size
is answered with wrapped write sets (``ensemble[(i + j) % E]``, as BookKeeper computes them), up to
:data:`MAX_WINDOW_MEMBERS` window members in all; ``racks`` values may be ``null`` (= not mapped). Output adds
``soft_write_sets`` and ``reason``.

``check placement --plan`` adds ``plan`` (:func:`core.domain.rules.relocation.plan_relocation`): the
moves (position, from, to) that make every write set meet the policy strictly, the planned ensemble, or the
reason there is none; targets come from ``candidates`` (bookie → ledger count, the least loaded first), by
default every bookie of ``racks`` outside the ensemble.

Example:
    $ echo '{"policy": "rackaware", "ensemble": ["b1", "b2"], "write_quorum": 2}' | bkaudit check placement
    {"adherence": "FAIL", "failing_write_sets": [["b1", "b2"]], "soft_write_sets": [], "reason": "..."}
"""

from __future__ import annotations

from typing import Any

import typer

from bkaudit.cli._io import emit_json, read_stdin_json
from bkaudit.cli.availability import json_entry_ids, json_field, json_int, json_kind, json_object
from core.domain.availability import MAX_ENTRY_ID, EntryAvailability
from core.domain.rules.evaluate import PlacementPolicyConfig
from core.domain.rules.placement import (
    DEFAULT_DESIRED_ZONES_PER_WRITE_QUORUM,
    DEFAULT_ENFORCE_MIN_RACKS_PER_WRITE_QUORUM,
    DEFAULT_MIN_RACKS_PER_WRITE_QUORUM,
    DEFAULT_MIN_REGIONS_FOR_DURABILITY,
    DEFAULT_MIN_ZONES_PER_WRITE_QUORUM,
    POLICIES,
    check_placement,
)
from core.domain.rules.relocation import plan_relocation
from core.domain.rules.replicas import LEDGER_STATES, BookieStatus, LedgerSegment, classify_replicas
from core.errors import FormatError

app = typer.Typer(help="Audit one ledger: replicas held by bookies, placement policy.", no_args_is_help=True)


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise FormatError(f"{what} must be a string, got {json_kind(value)}")
    return value


def _string_list(value: Any, what: str) -> list[str]:
    if not isinstance(value, list):
        raise FormatError(f"{what} must be an array of bookie ids, got {json_kind(value)}")
    return [_string(item, f"{what}[{index}]") for index, item in enumerate(value)]


MAX_WINDOW_MEMBERS = 10_000_000
"""Most write-set members (ensemble size × write quorum) ``check placement`` lays out: a bound on memory."""

_JAVA_INT_MAX = 2**31 - 1  # quorum sizes are Java ints in LedgerMetadataFormat


def _quorums(document: dict[str, Any], what: str, ensemble_size: int | None) -> tuple[int, int]:
    """``(write_quorum, ack_quorum)`` with 1 <= AQ <= WQ (<= ensemble_size unless it is None)."""
    write_quorum = json_int(
        json_field(document, "write_quorum", what), f"{what}: write_quorum", 1, _JAVA_INT_MAX
    )
    if ensemble_size is not None and write_quorum > ensemble_size:
        raise FormatError(f"{what}: write_quorum {write_quorum} exceeds the ensemble size {ensemble_size}")
    ack_quorum = json_int(document.get("ack_quorum", write_quorum), f"{what}: ack_quorum", 1)
    if ack_quorum > write_quorum:
        raise FormatError(f"{what}: ack_quorum {ack_quorum} exceeds write_quorum {write_quorum}")
    return write_quorum, ack_quorum


def _segments(value: Any, what: str, ensemble_size: int) -> list[LedgerSegment]:
    if not isinstance(value, list) or not value:
        raise FormatError(f"{what}: segments must be a non-empty array")
    segments: list[LedgerSegment] = []
    for index, raw in enumerate(value):
        where = f"{what}: segments[{index}]"
        item = json_object(raw, where)
        first = json_int(
            json_field(item, "first_entry_id", where), f"{where}.first_entry_id", 0, MAX_ENTRY_ID
        )
        ensemble = _string_list(json_field(item, "ensemble", where), f"{where}.ensemble")
        if len(ensemble) != ensemble_size:
            raise FormatError(
                f"{where}: ensemble has {len(ensemble)} bookies, ensemble_size is {ensemble_size}"
            )
        if segments and first < segments[-1].first_entry_id:
            raise FormatError(f"{where}: first_entry_id {first} is below the previous segment's")
        segments.append(LedgerSegment(first, tuple(ensemble)))
    return segments


def _answers(value: Any, what: str) -> dict[str, EntryAvailability | BookieStatus]:
    bookies = json_object(value, f"{what}: bookies")
    answers: dict[str, EntryAvailability | BookieStatus] = {}
    for bookie, raw in bookies.items():
        if isinstance(raw, str):
            if raw not in (BookieStatus.NO_LEDGER.value, BookieStatus.UNAVAILABLE.value):
                raise FormatError(
                    f"{what}: bookies[{bookie!r}] must be an array of entry ids, "
                    f'"NO_LEDGER" or "UNAVAILABLE", got {raw!r}'
                )
            answers[bookie] = BookieStatus(raw)
        else:
            ids = json_entry_ids(raw, f"{what}: bookies[{bookie!r}]")
            answers[bookie] = EntryAvailability.from_entry_ids(ids)
    return answers


@app.command("replicas")
def replicas_command() -> None:
    """stdin: one ledger and each bookie's answer; stdout: the replicas-check classification as JSON."""
    what = "check replicas"
    document = json_object(read_stdin_json(what), f"{what}: input")
    ensemble_size = json_int(json_field(document, "ensemble_size", what), f"{what}: ensemble_size", 1)
    write_quorum, ack_quorum = _quorums(document, what, ensemble_size)
    state = _string(json_field(document, "state", what), f"{what}: state")
    if state not in LEDGER_STATES:
        raise FormatError(f"{what}: state must be one of {', '.join(LEDGER_STATES)}, got {state!r}")
    last_entry_id = json_int(document.get("last_entry_id", -1), f"{what}: last_entry_id", -1, MAX_ENTRY_ID)
    segments = _segments(json_field(document, "segments", what), what, ensemble_size)
    answers = _answers(document.get("bookies", {}), what)
    try:
        verdict = classify_replicas(
            ensemble_size=ensemble_size,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            state=state,
            last_entry_id=last_entry_id,
            segments=segments,
            answers=answers,
        )
    except ValueError as err:  # the rule's own checks, should the CLI's above ever miss one
        raise FormatError(f"{what}: {err}") from None
    emit_json(verdict.to_json())


def _racks(value: Any, what: str) -> dict[str, str | None]:
    if value is None:
        return {}
    racks = json_object(value, f"{what}: racks")
    for bookie, location in racks.items():
        if location is not None and not isinstance(location, str):
            raise FormatError(f"{what}: racks[{bookie!r}] must be a string or null")
    return racks


@app.command("placement")
def placement_command(
    plan: bool = typer.Option(
        False,
        "--plan",
        help="add a BP-54 relocation plan: the fewest replica moves that make every write set meet the "
        "policy strictly (targets from the input's candidates, bookie -> ledger count; default: every "
        "bookie of racks outside the ensemble)",
    ),
) -> None:
    """stdin: policy, ensemble, quorums, rack map and policy settings; stdout: adherence as JSON."""
    what = "check placement"
    document = json_object(read_stdin_json(what), f"{what}: input")
    policy = _string(json_field(document, "policy", what), f"{what}: policy")
    if policy not in POLICIES:
        raise FormatError(f"{what}: unknown policy {policy!r} (expected one of {', '.join(POLICIES)})")
    ensemble = _string_list(json_field(document, "ensemble", what), f"{what}: ensemble")
    # An empty ensemble is a FAIL verdict (BookKeeper's answer), not bad input. A write quorum above the
    # ensemble size wraps its write sets, as BookKeeper's RoundRobinDistributionSchedule does.
    write_quorum, ack_quorum = _quorums(document, what, None)
    if len(ensemble) * write_quorum > MAX_WINDOW_MEMBERS:
        raise FormatError(
            f"{what}: {len(ensemble)} bookies x write_quorum {write_quorum} is more than the "
            f"{MAX_WINDOW_MEMBERS} write-set members this command evaluates"
        )
    racks = _racks(document.get("racks"), what)
    options = _policy_options(document, what)
    candidates = _candidates(document.get("candidates"), racks, ensemble, what) if plan else {}
    try:
        verdict = check_placement(policy, ensemble, write_quorum, ack_quorum, racks, **options)
        answer = verdict.to_json()
        if plan:
            relocation = plan_relocation(policy, ensemble, write_quorum, racks, candidates, **options)
            answer["plan"] = relocation.to_json()
    except ValueError as err:
        raise FormatError(f"{what}: {err}") from None
    emit_json(answer)


def _policy_options(document: dict[str, Any], what: str) -> dict[str, Any]:
    """The policy settings of a ``check placement`` input, BookKeeper's defaults where absent."""

    def setting(key: str, default: int) -> int:
        return json_int(document.get(key, default), f"{what}: {key}", 0)

    enforce = document.get("enforce_min_racks_per_write_quorum", DEFAULT_ENFORCE_MIN_RACKS_PER_WRITE_QUORUM)
    if not isinstance(enforce, bool):
        raise FormatError(f"{what}: enforce_min_racks_per_write_quorum must be true or false")
    config = PlacementPolicyConfig(
        min_racks_per_write_quorum=setting("min_racks_per_write_quorum", DEFAULT_MIN_RACKS_PER_WRITE_QUORUM),
        enforce_min_racks_per_write_quorum=enforce,
        min_zones_per_write_quorum=setting("min_zones_per_write_quorum", DEFAULT_MIN_ZONES_PER_WRITE_QUORUM),
        desired_zones_per_write_quorum=setting(
            "desired_zones_per_write_quorum", DEFAULT_DESIRED_ZONES_PER_WRITE_QUORUM
        ),
        min_regions_for_durability=setting("min_regions_for_durability", DEFAULT_MIN_REGIONS_FOR_DURABILITY),
    )
    return config.options()


def _candidates(value: Any, racks: dict[str, str | None], ensemble: list[str], what: str) -> dict[str, int]:
    """Bookies a plan may move replicas to, with their ledger counts (default: racks' bookies, 0 each)."""
    if value is None:
        return {bookie: 0 for bookie in racks if bookie not in ensemble}
    candidates = json_object(value, f"{what}: candidates")
    return {str(b): json_int(count, f"{what}: candidates[{b!r}]", 0) for b, count in candidates.items()}
