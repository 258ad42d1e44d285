"""The sink's probe stage: the processor's re-probes of suspect ledgers and the throttled replicas check
(:mod:`streaming.scrutiny`), over one bookie client (and the bookie-side agents' clients) kept between
batches. Its results are the feedback events the timers query reads back (re-probe rounds)."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

import numpy as np

from streaming.scrutiny import ScrutinyPass, ScrutinyStore
from streaming.sink_batch import SinkBatch, bookie_answers

if TYPE_CHECKING:
    from connectors.bookie.ledger_probe import LedgerProbeTarget
    from connectors.delta.ledger_log import LedgerLog
    from streaming.reports import BatchReport
    from streaming.sink_config import SinkConfig

#: A request and the probe target built from its ledger's row.
_Target = tuple[dict[str, Any], "LedgerProbeTarget"]


class ProbeStage:
    """Probe the ledgers a batch asks for, plus the replicas check's picks; returns the feedback events.

    Example:
        >>> from core.settings import KafkaSettings
        >>> from streaming.sink_config import SinkConfig
        >>> config = SinkConfig("/tmp/lh", "a", KafkaSettings(), scrutiny_on_close=True)
        >>> ProbeStage(config, ledger_log=None).scrutiny.on_close
        True
    """

    def __init__(self, config: SinkConfig, ledger_log: LedgerLog) -> None:
        self.config = config
        self.ledger_log = ledger_log
        self.scrutiny = ScrutinyPass(
            pass_s=config.scrutiny_pass_s,
            max_per_batch=config.scrutiny_max_per_batch,
            ledgers_per_s=config.scrutiny_ledgers_per_s,
            on_close=config.scrutiny_on_close,
        )
        self._store = (
            ScrutinyStore(config.scrutiny_state_dir) if config.scrutiny_state_dir is not None else None
        )
        if self._store is not None:
            self._store.load(self.scrutiny)
        self._client: Any = None
        self._agent_clients: dict[str, Any] | None = None

    def run(self, batch: SinkBatch, report: BatchReport) -> list[dict[str, Any]]:
        """The batch's probes; returns the feedback events (round results) and raises
        ``BOOKIE_UNRESPONSIVE`` in the batch's book for registered bookies that never answer."""
        requested = {r["ledger_id"] for r in batch.probe_requests}
        requests = list(batch.probe_requests) + self._scrutiny_picks(requested)
        targets = self._targets(batch, requests)
        if not targets:
            return []
        outcomes = self._probe_and_learn(batch, [t for _, t in targets], _addresses(batch.bookie_rows))
        report.probes = len(outcomes)
        report.probe_outcomes = dict(
            Counter(
                ("scrutiny" if request.get("scrutiny") else "reprobe", "failing" if o.failing else "healthy")
                for (request, _), o in zip(targets, outcomes, strict=True)
            )
        )
        return self._feedback(batch, targets, outcomes)

    def note(self, report: BatchReport) -> None:
        """Keep the walk's position (after the batch's tables: a crash before repeats a few probes) and
        report its passes."""
        if self._store is not None:
            self._store.save(self.scrutiny)
        report.scrutiny_pass_started_ms = self.scrutiny.pass_started_ms
        report.scrutiny_last_full_pass_ms = self.scrutiny.last_full_pass_ms
        report.scrutiny_expected_pass_s = self.scrutiny.expected_pass_s(self.ledger_log.checked_count())

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        for agent in (self._agent_clients or {}).values():
            agent.close()
        self._agent_clients = None

    # -- steps ---------------------------------------------------------------------------------------------
    def _scrutiny_picks(self, requested: set[int]) -> list[dict[str, Any]]:
        """The ledgers that just closed and the background walk's next ones (:mod:`streaming.scrutiny`)."""
        log = self.ledger_log
        picked = self.scrutiny.picks(int(time.time() * 1000), log.checked_after, log.checked_count())
        return [
            {"ledger_id": i, "round": 0, "scrutiny": True}
            for i in dict.fromkeys(picked)
            if i not in requested
        ]

    def _targets(self, batch: SinkBatch, requests: list[dict[str, Any]]) -> list[_Target]:
        """The requests whose ledger is live and known, each with its probe target (rows of ledgers the batch
        does not hold are read from the ledger log)."""
        from connectors.bookie.ledger_probe import LedgerProbeTarget

        ledgers = batch.ledgers
        if batch.versions is not None and requests:
            wanted = [r["ledger_id"] for r in requests]
            batch.versions_to_rows(np.isin(batch.versions.column("ledger_id").to_numpy(), wanted))
        ledgers.update(
            self.ledger_log.rows(r["ledger_id"] for r in requests if r["ledger_id"] not in ledgers)
        )
        targets: list[_Target] = []
        for request in requests:
            row = ledgers.get(request["ledger_id"])
            if row is None or row.get("deleted") or not row.get("state"):
                continue
            segments = tuple((s["first_entry_id"], tuple(s["ensemble"])) for s in row.get("segments") or [])
            target = LedgerProbeTarget(
                row["ledger_id"],
                row["ensemble_size"],
                row["write_quorum"],
                row["ack_quorum"],
                row["state"],
                row["last_entry_id"],
                segments,
            )
            targets.append((request, target))
        return targets

    def _feedback(
        self, batch: SinkBatch, targets: list[_Target], outcomes: list[Any]
    ) -> list[dict[str, Any]]:
        """Record what each bookie answered in the batch's book; returns a feedback event per re-probe and
        per failing replicas check (a healthy background check reports nothing)."""
        now_ms = int(time.time() * 1000)
        messages = []
        for (request, target), outcome in zip(targets, outcomes, strict=True):
            bookie_answers(batch.book, target.ledger_id, outcome.answers, outcome.refused, at_ms=now_ms)
            if request.get("scrutiny") and not outcome.failing:
                continue
            messages.append(
                {
                    "kind": "probe_result",
                    "cluster": batch.cluster,
                    "ledger_id": target.ledger_id,
                    # Wall clock: event time is the watcher's (wall) clock too, so feedback is never late.
                    "event_time_ms": now_ms,
                    "round": int(request.get("round", 0)),
                    "reason": request.get("reason") or ("scrutiny" if request.get("scrutiny") else "probe"),
                    "mzxid": (batch.ledgers.get(target.ledger_id) or {}).get("mzxid"),
                    "failing": outcome.failing,
                    "outcome": {
                        **outcome.verdict.to_json(),
                        "unresponsive": list(outcome.unresponsive),
                        "unresolved": list(outcome.unresolved),
                        "answers": outcome.answers,
                        "refused": outcome.refused,
                    },
                }
            )
        return messages

    def _probe_and_learn(self, batch: SinkBatch, targets: list[Any], addresses: dict[str, str]) -> list[Any]:
        """Probe each bookie the way it answers (entry lists or entry reads, see ``stream.entry_checks``);
        what the wave learned about a bookie goes to its ``bookies`` row."""
        from connectors.bookie.ledger_probe import probe_and_learn

        modes = dict(self.config.entry_checks_by_bookie)
        mode = {b: modes.get(b, self.config.entry_checks) for b in addresses}
        reads_on = {
            b
            for b, m in mode.items()
            if m == "entry_reads"
            or (m == "auto" and (batch.bookie_rows.get(b) or {}).get("answers_entry_lists") is False)
        }
        outcomes, learned = probe_and_learn(
            self._bookie_client(),
            targets,
            addresses,
            known=self._agent_answers(targets, addresses),
            entry_reads_on=reads_on,
            learn={b for b, m in mode.items() if m == "auto"},
            timeout=self.config.probe_timeout_s,
            concurrency=self.config.probe_concurrency,
            sample_percent=self.config.entry_read_sample_percent,
        )
        for bookie, answers in sorted(learned.items()):
            row = batch.bookie_rows.get(bookie)
            if row is not None and row.get("answers_entry_lists") is not answers:
                batch.bookie_rows[bookie] = {**row, "answers_entry_lists": answers}
                batch.bookies_changed.add(bookie)
        return outcomes

    def _agent_answers(self, targets: list[Any], addresses: dict[str, str]) -> dict[tuple[int, str], Any]:
        """What the configured bookie-side agents say of the closed ledgers' registered bookies."""
        if self.config.agents is None or not self.config.agents.addresses:
            return {}
        from connectors.agent.client import agent_answers

        if self._agent_clients is None:
            self._agent_clients = self.config.agents.clients()
        wanted: dict[str, list[int]] = defaultdict(list)
        for target in targets:
            if target.state == "CLOSED" and target.last_entry_id >= 0:
                for bookie in target.bookies & self._agent_clients.keys() & addresses.keys():
                    wanted[bookie].append(target.ledger_id)
        return agent_answers(self._agent_clients, wanted)

    def _bookie_client(self) -> Any:
        if self._client is None:
            from connectors.bookie.client import BlockingBookieClient

            self._client = BlockingBookieClient(
                timeout=self.config.probe_timeout_s,
                max_reads_per_s_per_bookie=self.config.entry_reads_per_s_per_bookie,
                tls=self.config.bookie_tls,
            )
        return self._client


def _addresses(bookie_rows: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Where to reach each writable or read-only bookie: its registered RPC address, else host:port.

    Example:
        >>> _addresses({"b1": {"status": "WRITABLE", "host": "h", "port": 3181}, "b2": {"status": "LOST"}})
        {'b1': 'h:3181'}
    """
    return {
        b: r["rpc_address"] if r.get("rpc_address") else f"{r['host']}:{r['port']}"
        for b, r in bookie_rows.items()
        if r.get("status") in ("WRITABLE", "READ_ONLY")
        and (r.get("rpc_address") or (r.get("host") and r.get("port")))
    }
