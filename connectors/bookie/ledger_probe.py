"""Probe whole ledgers: ask each bookie of a closed ledger for its entry list and classify the replicas.

This is the I/O half of BookKeeper's replicas check (facts §3.6) and of BP-34's re-probe: one
``GET_LIST_OF_ENTRIES_OF_LEDGER`` per distinct bookie per ledger, all ledgers of a round in one bounded,
concurrent wave, then the pure :func:`bkaudit.domain.rules.replicas.classify_replicas` on correct set
semantics.
A bookie that does not answer (timeout, refused, error) counts as *unknown*, never as missing data; one that
cannot be resolved to an address (not registered) is unknown too. The caller decides what unknown means
(``BOOKIE_UNRESPONSIVE`` for a bookie that stays registered but never answers).

Status: stable.

Example:
    >>> target = LedgerProbeTarget(ledger_id=7, ensemble_size=2, write_quorum=2, ack_quorum=2,
    ...                            state="CLOSED", last_entry_id=1, segments=((0, ("b1", "b2")),))
    >>> sorted(target.bookies)
    ['b1', 'b2']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bkaudit.domain.rules.replicas import BookieStatus, ReplicasResult, ReplicasVerdict, classify_replicas
from connectors.bookie.client import (
    BlockingBookieClient,
    NoLedger,
    ProbeRequest,
    ProbeResult,
    availability_of,
)


@dataclass(frozen=True)
class LedgerProbeTarget:
    """What a probe needs from a ledger's metadata (no password)."""

    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    state: str
    last_entry_id: int
    segments: tuple[tuple[int, tuple[str, ...]], ...]

    @property
    def bookies(self) -> frozenset[str]:
        return frozenset(b for _, ensemble in self.segments for b in ensemble)


@dataclass(frozen=True)
class LedgerProbeOutcome:
    """The classification of one ledger plus what each bookie answered."""

    ledger_id: int
    verdict: ReplicasVerdict
    answers: dict[str, str] = field(default_factory=dict)  # bookie → result kind (entry_list, timeout, ...)
    unresponsive: tuple[str, ...] = ()  # asked, did not answer conclusively
    unresolved: tuple[str, ...] = ()  # no address: not registered (or unknown to the rack of registrations)

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
) -> list[LedgerProbeOutcome]:
    """Probe every target (closed ledgers; others are classified SKIPPED without a request).

    ``addresses`` maps bookie id → ``host:port`` of its bookie-rpc endpoint (from the registrations).
    """
    requests: list[ProbeRequest] = []
    index: list[tuple[int, str]] = []
    for position, target in enumerate(targets):
        if target.state != "CLOSED" or target.last_entry_id < 0:
            continue
        for bookie in sorted(target.bookies):
            address = addresses.get(bookie)
            if address is not None:
                requests.append(ProbeRequest(address, target.ledger_id))
                index.append((position, bookie))
    results = client.probe_many(requests, concurrency=concurrency, timeout=timeout) if requests else []
    by_target: dict[int, dict[str, ProbeResult]] = {}
    for (position, bookie), result in zip(index, results, strict=True):
        by_target.setdefault(position, {})[bookie] = result
    return [
        _classify(target, by_target.get(position, {}), addresses) for position, target in enumerate(targets)
    ]


def _classify(
    target: LedgerProbeTarget, results: Mapping[str, ProbeResult], addresses: Mapping[str, str]
) -> LedgerProbeOutcome:
    answers: dict[str, object] = {}
    unresponsive: list[str] = []
    for bookie, result in results.items():
        available = availability_of(result)
        if available is None:
            answers[bookie] = BookieStatus.UNAVAILABLE
            unresponsive.append(bookie)
        else:
            answers[bookie] = BookieStatus.NO_LEDGER if isinstance(result, NoLedger) else available
    verdict = classify_replicas(
        ensemble_size=target.ensemble_size,
        write_quorum=target.write_quorum,
        ack_quorum=target.ack_quorum,
        state=target.state,
        last_entry_id=target.last_entry_id,
        segments=[(first, list(ensemble)) for first, ensemble in target.segments],
        answers=answers,  # type: ignore[arg-type]  # values are EntryAvailability | BookieStatus
    )
    skipped = verdict.result is ReplicasResult.SKIPPED
    unresolved = () if skipped else tuple(sorted(b for b in target.bookies if b not in addresses))
    return LedgerProbeOutcome(
        target.ledger_id,
        verdict,
        {bookie: result.kind for bookie, result in sorted(results.items())},
        tuple(sorted(unresponsive)),
        unresolved,
    )
