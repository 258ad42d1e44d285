"""The auditor's side of ``bkaudit agent``: ask bookie-side agents which entries their bookies hold.

:class:`AgentClient` talks to one agent (TLS by default, the bearer token on every call);
:func:`agent_answers` asks every configured agent, in parallel, about the ledgers a probe wave needs and
returns their answers as probe results, so the replicas rule classifies them exactly like entry lists. An
agent that cannot answer (unreachable, refused, a ledger in limbo) leaves its bookie to the next way of
checking it: the entry-list request, then entry reads (:mod:`connectors.bookie.ledger_probe`).

Example:
    >>> AgentEntryList(EntryAvailability.from_entry_ids([0, 1])).kind, AgentNoLedger().conclusive
    ('agent_list', True)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc

from connectors.bookie.client import AgentEntryList, AgentNoLedger, ProbeResult
from core.domain.availability import EntryAvailability
from core.errors import ServiceError
from core.pb import bookie_agent_pb2 as pb

logger = logging.getLogger(__name__)

_SERVICE = "/bkaudit.agent.BookieAgent/"
#: Ledger ids per ``ListEntries`` call (the server accepts up to 10,000).
LEDGERS_PER_CALL = 1_000


class AgentError(ServiceError):
    """A call an agent refused or did not answer; ``code`` is the gRPC status name."""

    def __init__(self, address: str, code: str, details: str) -> None:
        super().__init__(f"agent {address}: {code}: {details}")
        self.code = code


def _result(entries: pb.LedgerEntries) -> ProbeResult | None:
    if entries.holding == pb.LedgerEntries.NO_LEDGER:
        return AgentNoLedger()
    if entries.holding == pb.LedgerEntries.HOLDS:
        if len(entries.first) != len(entries.last):
            return None
        return AgentEntryList(EntryAvailability.from_runs(zip(entries.first, entries.last, strict=True)))
    return None  # in limbo (or unknown): the agent cannot tell, the bookie is asked another way


class AgentClient:
    """One agent's channel. ``ca_pem`` verifies the agent's certificate (None: the system's roots);
    ``server_name`` overrides the name checked against it; ``insecure`` uses plaintext (tests only)."""

    def __init__(
        self,
        address: str,
        *,
        token: str,
        ca_pem: bytes | None = None,
        server_name: str | None = None,
        insecure: bool = False,
        timeout_s: float = 10.0,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._metadata = (("authorization", f"Bearer {token}"),)
        options: list[tuple[str, str | int]] = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        if insecure:
            self._channel = grpc.insecure_channel(address, options=options)
        else:
            credentials = grpc.ssl_channel_credentials(root_certificates=ca_pem)
            self._channel = grpc.secure_channel(address, credentials, options=options)
        self._list_entries = self._channel.unary_unary(
            _SERVICE + "ListEntries",
            request_serializer=pb.ListEntriesRequest.SerializeToString,
            response_deserializer=pb.ListEntriesResponse.FromString,
        )
        self._list_ledgers = self._channel.unary_unary(
            _SERVICE + "ListLedgers",
            request_serializer=pb.ListLedgersRequest.SerializeToString,
            response_deserializer=pb.ListLedgersResponse.FromString,
        )

    def _call(self, method: grpc.UnaryUnaryMultiCallable, request: object) -> object:
        try:
            return method(request, timeout=self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as err:
            raise AgentError(self.address, err.code().name, err.details() or "") from None

    def list_entries(self, ledger_ids: Sequence[int]) -> dict[int, ProbeResult]:
        """What the bookie holds of each ledger; ledgers the agent cannot tell about are left out."""
        answers: dict[int, ProbeResult] = {}
        for start in range(0, len(ledger_ids), LEDGERS_PER_CALL):
            chunk = list(ledger_ids[start : start + LEDGERS_PER_CALL])
            response = self._call(self._list_entries, pb.ListEntriesRequest(ledger_ids=chunk))
            for entries in response.ledgers:  # type: ignore[attr-defined]
                result = _result(entries)
                if result is not None:
                    answers[entries.ledger_id] = result
        return answers

    def list_ledgers(self, after: int = -1, limit: int = 0) -> tuple[list[int], bool]:
        """A page of the ledger ids the bookie holds (ascending, above ``after``); whether more remain."""
        response = self._call(self._list_ledgers, pb.ListLedgersRequest(after_ledger_id=after, limit=limit))
        return list(response.ledger_ids), bool(response.more)  # type: ignore[attr-defined]

    def close(self) -> None:
        self._channel.close()


@dataclass(frozen=True)
class AgentConfig:
    """How the job reaches its agents (from ``core.settings.AgentSettings``); no secret in ``repr``."""

    addresses: tuple[tuple[str, str], ...] = ()  # bookie id -> host:port
    token: str = ""
    ca_file: Path | None = None
    server_name: str | None = None
    insecure: bool = False
    timeout_s: float = 10.0

    def __repr__(self) -> str:
        return f"AgentConfig(addresses={dict(self.addresses)!r}, insecure={self.insecure})"

    def clients(self) -> dict[str, AgentClient]:
        """A client per configured bookie."""
        ca_pem = self.ca_file.read_bytes() if self.ca_file is not None else None
        return {
            bookie: AgentClient(
                address,
                token=self.token,
                ca_pem=ca_pem,
                server_name=self.server_name,
                insecure=self.insecure,
                timeout_s=self.timeout_s,
            )
            for bookie, address in self.addresses
        }


def agent_answers(
    clients: Mapping[str, AgentClient], wanted: Mapping[str, Sequence[int]]
) -> dict[tuple[int, str], ProbeResult]:
    """Ask each bookie's agent about ``wanted[bookie]`` ledgers, all agents at once.

    Returns ``(ledger id, bookie) -> result`` for every answer an agent gave; an agent that failed is
    logged and contributes nothing (its bookie is then checked the usual way).
    """
    asked = [(bookie, clients[bookie], ids) for bookie, ids in wanted.items() if bookie in clients and ids]
    if not asked:
        return {}

    def ask(item: tuple[str, AgentClient, Sequence[int]]) -> dict[int, ProbeResult]:
        bookie, client, ids = item
        try:
            return client.list_entries(ids)
        except AgentError as err:
            logger.warning("bookie %s: %s; checking it without its agent", bookie, err)
            return {}

    answers: dict[tuple[int, str], ProbeResult] = {}
    with ThreadPoolExecutor(max_workers=min(16, len(asked))) as pool:
        for (bookie, _, _), results in zip(asked, pool.map(ask, asked), strict=True):
            answers.update({(ledger_id, bookie): result for ledger_id, result in results.items()})
    return answers
