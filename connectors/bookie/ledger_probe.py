"""Probe whole ledgers: ask each bookie of a ledger what it holds and classify the replicas.

This is the I/O half of BookKeeper's replicas check and of BP-34's re-probe: one
``GET_LIST_OF_ENTRIES_OF_LEDGER`` per distinct bookie per ledger, all ledgers of a round in one bounded,
concurrent wave, then the pure :func:`core.domain.rules.replicas.classify_replicas` on correct set
semantics. Bookies that cannot list entries (DbLedgerStorage) are asked with ``READ_ENTRY`` instead, for
the entries :func:`core.domain.rules.entry_reads.entries_to_read` picks (each fragment's first and last
entry, plus a sample), in the same wave; their answers reach the same rule. What a bookie-side agent
already answered (``known``, see :mod:`connectors.agent.client`) is taken as that bookie's entry list and
nothing is sent to the bookie for that ledger.
An OPEN ledger is first asked for its last add confirmed (LAC): a ``READ_ENTRY`` of entry -1 to each bookie
of its last segment, as BookKeeper's ``readLastAddConfirmed`` does; the highest LAC answered bounds the check
(entries above it are never judged). A ledger whose LAC no bookie answers is SKIPPED with those bookies
unresponsive: unknown, not missing. A ledger IN_RECOVERY is SKIPPED (its recovery fences and closes it).
A bookie that does not answer (timeout, refused, error) counts as *unknown*, never as missing data, except
that ``EIO`` to a ``READ_ENTRY`` is an answer: the bookie cannot read that entry (a DbLedgerStorage bookie
whose entry log file is gone answers so while its index still lists the entry), so it counts as missing,
as in BookKeeper's LedgerChecker; ``EIO`` to an entry-list request stays unknown. One that
cannot be resolved to an address (not registered) is unknown too. The caller decides what unknown means
(``BOOKIE_UNRESPONSIVE`` for a bookie that stays registered but never answers).

Example:
    >>> target = LedgerProbeTarget(ledger_id=7, ensemble_size=2, write_quorum=2, ack_quorum=2,
    ...                            state="CLOSED", last_entry_id=1, segments=((0, ("b1", "b2")),))
    >>> sorted(target.bookies)
    ['b1', 'b2']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace

from connectors.bookie.client import (
    AGENT_KINDS,
    BlockingBookieClient,
    BookieError,
    EntryPresent,
    LastConfirmed,
    NoEntry,
    NoLedger,
    ProbeRequest,
    ProbeResult,
    availability_of,
    refusal_of_result,
)
from connectors.bookie.frames import EIO, LAST_ADD_CONFIRMED
from core.domain.rules.entry_reads import ReadAnswer, answers_from_reads, entries_to_read
from core.domain.rules.replicas import (
    BookieStatus,
    ReplicasResult,
    ReplicasVerdict,
    checked_through,
    classify_replicas,
    last_add_confirmed,
)

#: ``answers`` kind of a bookie asked with entry reads, when at least one read was answered.
ENTRY_READS = "entry_reads"
#: ``answers`` kinds of a bookie that answered (it is responsive, whatever it holds).
ANSWERED_KINDS = frozenset({"entry_list", "no_ledger", ENTRY_READS, LastConfirmed.kind, *AGENT_KINDS})


@dataclass(frozen=True)
class LedgerProbeTarget:
    """What a probe needs from a ledger's metadata (no password), and an open ledger's LAC once learned."""

    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    state: str
    last_entry_id: int
    segments: tuple[tuple[int, tuple[str, ...]], ...]
    last_add_confirmed: int | None = None

    @property
    def bookies(self) -> frozenset[str]:
        return frozenset(b for _, ensemble in self.segments for b in ensemble)

    @property
    def checked_through(self) -> int:
        """The last entry the check judges (-1: none): the last entry when closed, the LAC when open."""
        return checked_through(self.state, self.last_entry_id, self.last_add_confirmed)

    @property
    def needs_lac(self) -> bool:
        """An OPEN ledger whose LAC is still to be asked."""
        return self.state == "OPEN" and self.last_add_confirmed is None and bool(self.segments)


@dataclass(frozen=True)
class LedgerProbeOutcome:
    """The classification of one ledger plus what each bookie answered."""

    ledger_id: int
    verdict: ReplicasVerdict
    answers: dict[str, str] = field(default_factory=dict)  # bookie → result kind (entry_list, timeout, ...)
    unresponsive: tuple[str, ...] = ()  # asked, did not answer conclusively
    unresolved: tuple[str, ...] = ()  # no address: not registered (or unknown to the rack of registrations)
    refused: dict[str, str] = field(default_factory=dict)  # bookie → why it refused bkaudit (TLS, auth)

    @property
    def failing(self) -> bool:
        """True when data is short (NO_REPLICA, LESS_THAN_AQ/WQ) or some bookie was unknown."""
        short = self.verdict.result in (
            ReplicasResult.NO_REPLICA,
            ReplicasResult.LESS_THAN_AQ,
            ReplicasResult.LESS_THAN_WQ,
        )
        return short or bool(self.unresponsive) or bool(self.unresolved)


def probe_ledgers(
    client: BlockingBookieClient,
    targets: Sequence[LedgerProbeTarget],
    addresses: Mapping[str, str],
    *,
    timeout: float = 5.0,
    concurrency: int = 64,
    entry_reads_on: AbstractSet[str] = frozenset(),
    sample_percent: float = 0.0,
    known: Mapping[tuple[int, str], ProbeResult] | None = None,
) -> list[LedgerProbeOutcome]:
    """Probe every target: closed ledgers to their last entry, open ones to their LAC (asked first); others
    are classified SKIPPED without a request.

    ``addresses`` maps bookie id → ``host:port`` of its bookie-rpc endpoint (from the registrations).
    Bookies in ``entry_reads_on`` are asked with ``READ_ENTRY`` (each fragment's first and last entry plus
    ``sample_percent`` % of the others, the same ones on every round of a ledger); the others for their
    entry list. ``known`` holds answers already had, by (ledger id, bookie): those bookies are not asked.
    """
    known = known or {}
    targets, lac_answers = bound_by_lac(client, targets, addresses, timeout=timeout, concurrency=concurrency)
    requests: list[ProbeRequest] = []
    index: list[tuple[int, str, int | None]] = []
    lists: dict[int, dict[str, ProbeResult]] = {}
    for position, target in enumerate(targets):
        if target.checked_through < 0:
            continue
        planned = _planned_reads(target, entry_reads_on, sample_percent)
        for bookie in sorted(target.bookies):
            address = addresses.get(bookie)
            if address is None:
                continue
            given = known.get((target.ledger_id, bookie))
            if given is not None:
                lists.setdefault(position, {})[bookie] = given
                continue
            entries: list[int | None] = list(planned.get(bookie, [])) if bookie in entry_reads_on else [None]
            for entry_id in entries:
                requests.append(ProbeRequest(address, target.ledger_id, entry_id))
                index.append((position, bookie, entry_id))
    results = client.probe_many(requests, concurrency=concurrency, timeout=timeout) if requests else []
    reads: dict[int, dict[str, dict[int, ProbeResult]]] = {}
    for (position, bookie, entry_id), result in zip(index, results, strict=True):
        if entry_id is None:
            lists.setdefault(position, {})[bookie] = result
        else:
            reads.setdefault(position, {}).setdefault(bookie, {})[entry_id] = result
    return [
        _classify(
            target, lists.get(position, {}), reads.get(position, {}), addresses, lac_answers.get(position)
        )
        for position, target in enumerate(targets)
    ]


def bound_by_lac(
    client: BlockingBookieClient,
    targets: Sequence[LedgerProbeTarget],
    addresses: Mapping[str, str],
    *,
    timeout: float = 5.0,
    concurrency: int = 64,
) -> tuple[list[LedgerProbeTarget], dict[int, dict[str, ProbeResult]]]:
    """``targets`` with each open ledger's LAC filled in from its last segment's bookies, and what each of
    them answered (by the target's position). An open ledger no bookie answered keeps ``None``.

    Example:
        >>> # I/O: bound_by_lac(client, [open_target], {"b1": "127.0.0.1:3181"})
        >>> # ([LedgerProbeTarget(..., last_add_confirmed=41)], {0: {"b1": LastConfirmed(41, 42)}})
    """
    requests: list[ProbeRequest] = []
    index: list[tuple[int, str]] = []
    for position, target in enumerate(targets):
        if not target.needs_lac:
            continue
        for bookie in sorted(set(target.segments[-1][1]) & addresses.keys()):
            requests.append(ProbeRequest(addresses[bookie], target.ledger_id, LAST_ADD_CONFIRMED))
            index.append((position, bookie))
    results = client.probe_many(requests, concurrency=concurrency, timeout=timeout) if requests else []
    answers: dict[int, dict[str, ProbeResult]] = {}
    for (position, bookie), result in zip(index, results, strict=True):
        answers.setdefault(position, {})[bookie] = result
    bounded = list(targets)
    for position, by_bookie in answers.items():
        lac = last_add_confirmed(
            [lac_view(r) for r in by_bookie.values() if read_answered(r)], targets[position].segments[-1][0]
        )
        bounded[position] = replace(targets[position], last_add_confirmed=lac)
    return bounded, answers


def lac_view(result: ProbeResult) -> int:
    """One bookie's LAC from its answer to a read of entry -1 (-1 when it holds no entry of the ledger).

    Example:
        >>> lac_view(LastConfirmed(last_add_confirmed=41, last_entry_id=42)), lac_view(NoEntry())
        (41, -1)
    """
    return result.last_add_confirmed if isinstance(result, LastConfirmed) else -1


def _planned_reads(
    target: LedgerProbeTarget, entry_reads_on: AbstractSet[str], sample_percent: float
) -> dict[str, list[int]]:
    if not target.bookies & entry_reads_on:
        return {}
    return entries_to_read(
        target.segments,
        ensemble_size=target.ensemble_size,
        write_quorum=target.write_quorum,
        last_entry_id=target.checked_through,
        sample_percent=sample_percent,
        seed=target.ledger_id,
    )


def read_answer(result: ProbeResult) -> ReadAnswer:
    """What one ``READ_ENTRY`` probe says of its entry; ``EIO`` is UNREADABLE, anything else inconclusive is
    UNKNOWN.

    Example:
        >>> [read_answer(r).value for r in (EntryPresent(3), NoEntry(), NoLedger(), ProbeResult())]
        ['PRESENT', 'NO_ENTRY', 'NO_LEDGER', 'UNKNOWN']
        >>> read_answer(BookieError(EIO)).value, read_answer(BookieError(506)).value
        ('UNREADABLE', 'UNKNOWN')
    """
    if isinstance(result, EntryPresent | LastConfirmed):
        return ReadAnswer.PRESENT
    if isinstance(result, NoEntry):
        return ReadAnswer.NO_ENTRY
    if isinstance(result, NoLedger):
        return ReadAnswer.NO_LEDGER
    if isinstance(result, BookieError) and result.status == EIO:
        return ReadAnswer.UNREADABLE
    return ReadAnswer.UNKNOWN


def read_answered(result: ProbeResult) -> bool:
    """Whether a ``READ_ENTRY`` probe was answered by the bookie (any conclusive answer, or ``EIO``).

    Example:
        >>> read_answered(NoEntry()), read_answered(BookieError(EIO)), read_answered(ProbeResult())
        (True, True, False)
    """
    return read_answer(result) is not ReadAnswer.UNKNOWN


def _read_kind(results: Mapping[int, ProbeResult]) -> str:
    """A bookie's ``answers`` kind for its reads: ``entry_reads`` when one was answered, else the first
    read's own kind (timeout, connection_failed, ...)."""
    if any(read_answered(result) for result in results.values()):
        return ENTRY_READS
    return next(iter(results.values())).kind


def _classify(
    target: LedgerProbeTarget,
    lists: Mapping[str, ProbeResult],
    reads: Mapping[str, Mapping[int, ProbeResult]],
    addresses: Mapping[str, str],
    lac_answers: Mapping[str, ProbeResult] | None = None,
) -> LedgerProbeOutcome:
    if target.state == "OPEN" and target.last_add_confirmed is None:
        return _lac_unknown(target, lac_answers or {}, addresses)
    answers: dict[str, object] = {}
    unresponsive: list[str] = []
    for bookie, result in lists.items():
        available = availability_of(result)
        if available is None:
            answers[bookie] = BookieStatus.UNAVAILABLE
            unresponsive.append(bookie)
        else:
            answers[bookie] = BookieStatus.NO_LEDGER if isinstance(result, NoLedger) else available
    by_reads = answers_from_reads(
        {bookie: {e: read_answer(r) for e, r in results.items()} for bookie, results in reads.items()},
        target.checked_through,
    )
    for bookie, answer in by_reads.items():
        answers[bookie] = answer
        if answer is BookieStatus.UNAVAILABLE:
            unresponsive.append(bookie)
    verdict = classify_replicas(
        ensemble_size=target.ensemble_size,
        write_quorum=target.write_quorum,
        ack_quorum=target.ack_quorum,
        state=target.state,
        last_entry_id=target.last_entry_id,
        segments=[(first, list(ensemble)) for first, ensemble in target.segments],
        answers=answers,  # type: ignore[arg-type]  # values are EntryAvailability | BookieStatus
        last_add_confirmed=target.last_add_confirmed,
    )
    skipped = verdict.result is ReplicasResult.SKIPPED
    unresolved = () if skipped else tuple(sorted(b for b in target.bookies if b not in addresses))
    kinds = {bookie: result.kind for bookie, result in (lac_answers or {}).items()}
    kinds.update({bookie: result.kind for bookie, result in lists.items()})
    kinds.update({bookie: _read_kind(results) for bookie, results in reads.items()})
    everything = [*(lac_answers or {}).items(), *lists.items()]
    everything += [(bookie, result) for bookie, results in reads.items() for result in results.values()]
    return LedgerProbeOutcome(
        target.ledger_id,
        verdict,
        dict(sorted(kinds.items())),
        tuple(sorted(unresponsive)),
        unresolved,
        _refusals(everything, kinds),
    )


def _refusals(results: Sequence[tuple[str, ProbeResult]], kinds: Mapping[str, str]) -> dict[str, str]:
    """Why each bookie whose ``answers`` kind is a refusal refused bkaudit (its TLS, its credentials).

    Example:
        >>> from connectors.bookie.client import TlsRefused
        >>> kinds = {"b1": "tls_refused", "b2": "no_ledger"}
        >>> _refusals([("b1", TlsRefused("expired")), ("b2", NoLedger())], kinds)
        {'b1': 'expired'}
    """
    refused: dict[str, str] = {}
    for bookie, result in results:
        reason = refusal_of_result(result)
        if reason is not None and kinds.get(bookie) == result.kind:
            refused.setdefault(bookie, reason)
    return dict(sorted(refused.items()))


def _lac_unknown(
    target: LedgerProbeTarget, lac_answers: Mapping[str, ProbeResult], addresses: Mapping[str, str]
) -> LedgerProbeOutcome:
    """An open ledger whose LAC no bookie answered: SKIPPED, its last segment's bookies unknown."""
    last_ensemble = target.segments[-1][1] if target.segments else ()
    kinds = {bookie: result.kind for bookie, result in sorted(lac_answers.items())}
    return LedgerProbeOutcome(
        target.ledger_id,
        ReplicasVerdict(ReplicasResult.SKIPPED, None, (), 0, ()),
        kinds,
        tuple(sorted(lac_answers)),
        tuple(sorted(b for b in set(last_ensemble) if b not in addresses)),
        _refusals(list(lac_answers.items()), kinds),
    )


def probe_and_learn(
    client: BlockingBookieClient,
    targets: Sequence[LedgerProbeTarget],
    addresses: Mapping[str, str],
    *,
    entry_reads_on: AbstractSet[str] = frozenset(),
    learn: AbstractSet[str] = frozenset(),
    timeout: float = 5.0,
    concurrency: int = 64,
    sample_percent: float = 0.0,
    known: Mapping[tuple[int, str], ProbeResult] | None = None,
) -> tuple[list[LedgerProbeOutcome], dict[str, bool]]:
    """:func:`probe_ledgers`, learning which bookies of ``learn`` answer entry lists.

    A bookie of ``learn`` asked for a list that timed out is asked for one entry: if it answers that, it is
    silent to lists only (DbLedgerStorage's signature, not a dead bookie), and the ledgers it holds are
    probed again at once with entry reads on it. Returns the outcomes and ``bookie → answers entry lists``
    for every bookie of ``learn`` the wave told something about.
    """
    outcomes = probe_ledgers(
        client,
        targets,
        addresses,
        timeout=timeout,
        concurrency=concurrency,
        entry_reads_on=entry_reads_on,
        sample_percent=sample_percent,
        known=known,
    )
    learned: dict[str, bool] = {}
    silent: set[str] = set()
    for outcome in outcomes:
        for bookie, kind in outcome.answers.items():
            if bookie not in learn or bookie in entry_reads_on:
                continue
            if kind in ("entry_list", "no_ledger"):
                learned[bookie] = True
            elif kind == "timeout":
                silent.add(bookie)
    readers = _answering_reads(client, sorted(silent - set(learned)), targets, addresses, timeout)
    if not readers:
        return outcomes, learned
    learned.update(dict.fromkeys(readers, False))
    again = [i for i, target in enumerate(targets) if target.bookies & readers]
    redone = probe_ledgers(
        client,
        [targets[i] for i in again],
        addresses,
        timeout=timeout,
        concurrency=concurrency,
        entry_reads_on=set(entry_reads_on) | readers,
        sample_percent=sample_percent,
        known=known,
    )
    for index, outcome in zip(again, redone, strict=True):
        outcomes[index] = outcome
    return outcomes, learned


def _answering_reads(
    client: BlockingBookieClient,
    bookies: Sequence[str],
    targets: Sequence[LedgerProbeTarget],
    addresses: Mapping[str, str],
    timeout: float,
) -> set[str]:
    """Those of ``bookies`` that answer a ``READ_ENTRY`` (any conclusive answer, ENOENTRY and EIO too)."""
    requests: list[ProbeRequest] = []
    for bookie in bookies:
        target = next(t for t in targets if bookie in t.bookies)
        first = _planned_reads(target, {bookie}, 0.0).get(bookie, [0])[0]
        requests.append(ProbeRequest(addresses[bookie], target.ledger_id, first))
    results = client.probe_many(requests, timeout=timeout) if requests else []
    return {bookie for bookie, result in zip(bookies, results, strict=True) if read_answered(result)}
