"""Our bookie client against our simulated bookie over TLS (START_TLS on 127.0.0.1), and every refusal.

The simulated bookie speaks START_TLS as a real one (``EOK``, then the handshake on the same connection),
requires client certificates when asked to, and plays BookKeeper's ``BookieAuthZFactory`` (the role in the
client certificate's OU must be allowed). Certificates come from the throwaway CA.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from pathlib import Path

import pytest

from bkaudit.testing.tls import TlsFiles, write_client_certificate, write_throwaway_ca
from connectors.bookie.client import (
    REFUSED_KINDS,
    AuthRequired,
    BlockingBookieClient,
    BookieClient,
    EntryList,
    NoEntry,
    ProbeResult,
    TlsRefused,
)
from connectors.bookie.frames import EOK, FrameDecoder, encode_frame, parse_request, start_tls_response
from connectors.bookie.ledger_probe import LedgerProbeTarget, probe_ledgers
from connectors.bookie.liveness import answered_from
from connectors.bookie.server import BookieServer, InMemoryEntryStore
from connectors.bookie.tls import BookieTlsConfig, server_tls_context
from core.errors import ConfigError

pytestmark = pytest.mark.integration

ROLE = "bkaudit-auditor"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return write_throwaway_ca(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def role_cert(tls: TlsFiles) -> tuple[Path, Path]:
    """A client certificate with ``OU=0:<ROLE>``, as Pulsar's BookieAuthZFactory deployments issue."""
    return write_client_certificate(tls, "role", organizational_unit=f"0:{ROLE};1:test-cluster")


@pytest.fixture(scope="module")
def store() -> InMemoryEntryStore:
    store = InMemoryEntryStore()
    store.add_entries(5, [0, 1, 2])
    return store


def server(store: InMemoryEntryStore, tls: TlsFiles, **options: object) -> BookieServer:
    context = server_tls_context(
        tls.server_cert, tls.server_key, ca_file=tls.ca, require_client_cert=bool(options.pop("mtls", True))
    )
    return BookieServer(store, tls=context, **options)  # type: ignore[arg-type]


def client_tls(tls: TlsFiles, **changes: object) -> BookieTlsConfig:
    options: dict[str, object] = {
        "ca_file": tls.ca,
        "cert_file": tls.client_cert,
        "key_file": tls.client_key_encrypted,
        "key_password": tls.key_password,
    }
    options.update(changes)
    return BookieTlsConfig(**options)  # type: ignore[arg-type]


def probe(address: str, config: BookieTlsConfig | None, ledger_id: int = 5) -> ProbeResult:
    async def go() -> ProbeResult:
        async with BookieClient(tls=config, timeout=10.0, connect_timeout=10.0) as client:
            return await client.list_entries(address, ledger_id)

    return run(go())


def run(coroutine: Awaitable[ProbeResult]) -> ProbeResult:
    return asyncio.run(asyncio.wait_for(coroutine, timeout=30))


# ------------------------------------------------------------------------------------------------ answers


def test_probes_over_mutual_tls_with_an_encrypted_key(store, tls, caplog):
    caplog.set_level(logging.DEBUG)
    with server(store, tls) as bookie, BlockingBookieClient(tls=client_tls(tls), timeout=10.0) as client:
        listed = client.list_entries(bookie.address, 5)
        absent = client.read_entry_exists(bookie.address, 5, 9)
        assert isinstance(listed, EntryList) and list(listed.availability.iter_entries()) == [0, 1, 2]
        assert absent == NoEntry()
        assert client._client.connection_count == 1  # both over the one upgraded connection
    assert tls.key_password not in caplog.text


def test_bookie_authz_serves_a_certificate_with_an_authorized_role(store, tls, role_cert):
    cert, key = role_cert
    with server(store, tls, authorized_roles=[ROLE]) as bookie:
        assert isinstance(probe(bookie.address, client_tls(tls, cert_file=cert, key_file=key)), EntryList)


# ----------------------------------------------------------------------------------------------- refusals


def test_a_bookie_requiring_client_certificates_refuses_a_client_without_one(store, tls):
    with server(store, tls) as bookie:
        result = probe(bookie.address, client_tls(tls, cert_file=None, key_file=None))
    assert isinstance(result, TlsRefused)
    assert result.reason == (
        "the bookie requires a client certificate: set bookie.tls_cert_file and bookie.tls_key_file"
    )
    assert answered_from(result)[0]  # a live bookie, not a silent one


def test_a_client_trusting_the_wrong_ca_refuses_the_bookie(store, tls):
    with server(store, tls) as bookie:
        result = probe(bookie.address, client_tls(tls, ca_file=tls.other_ca))
    assert isinstance(result, TlsRefused)
    assert result.reason.startswith("the bookie's certificate is not trusted (")
    assert result.reason.endswith("): check bookie.tls_ca_file")


def test_a_bookie_refuses_an_expired_client_certificate(store, tls):
    with server(store, tls) as bookie:
        result = probe(bookie.address, client_tls(tls, cert_file=tls.expired_cert, key_file=tls.expired_key))
    assert result == TlsRefused(
        "the bookie refused bkaudit's client certificate (bookie.tls_cert_file): certificate expired"
    )


def test_a_bookie_without_tls_is_named_as_such(store, tls):
    with BookieServer(store) as bookie:
        result = probe(bookie.address, client_tls(tls))
    assert (
        isinstance(result, TlsRefused) and "does not offer TLS (START_TLS answered EBADREQ)" in result.reason
    )


def test_bookie_authz_answers_eua_to_a_plaintext_client(store, tls):
    with server(store, tls, authorized_roles=[ROLE]) as bookie:
        result = probe(bookie.address, None)
    assert isinstance(result, AuthRequired)
    assert "does not use TLS with it: set bookie.tls with a client certificate" in result.reason


def test_bookie_authz_refuses_a_certificate_without_an_authorized_role(store, tls):
    with server(store, tls, authorized_roles=[ROLE]) as bookie:
        result = probe(bookie.address, client_tls(tls))  # CN=bkaudit, no OU role
    assert isinstance(result, AuthRequired | TlsRefused)
    assert "did not authorize bkaudit's client certificate" in result.reason


def test_a_wrong_key_password_is_a_config_error_that_does_not_show_it(tls, caplog):
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ConfigError) as raised:
        BookieClient(tls=client_tls(tls, key_password="not-the-password"))
    assert "wrong bookie.tls_key_password" in str(raised.value)
    assert "not-the-password" not in str(raised.value) + caplog.text
    assert "not-the-password" not in repr(client_tls(tls, key_password="not-the-password"))


def test_a_ledger_probe_names_the_refusing_bookie_as_refused_not_silent(tls):
    target = LedgerProbeTarget(7, 2, 2, 2, "CLOSED", 2, ((0, ("b1", "b2")),))
    store = InMemoryEntryStore()
    store.add_entries(7, [0, 1, 2])
    with (
        server(store, tls) as b1,
        server(store, tls, authorized_roles=[ROLE]) as b2,  # our certificate has no role
        BlockingBookieClient(tls=client_tls(tls), timeout=10.0) as client,
    ):
        [outcome] = probe_ledgers(client, [target], {"b1": b1.address, "b2": b2.address}, timeout=10.0)
    assert outcome.answers["b1"] == "entry_list"
    assert outcome.answers["b2"] in REFUSED_KINDS and outcome.unresponsive == ("b2",)
    assert list(outcome.refused) == ["b2"]
    assert "did not authorize bkaudit's client certificate" in outcome.refused["b2"]


def test_a_bookie_that_closes_after_the_handshake_without_an_alert_is_a_refusal(tls):
    """What a bookie whose TLS stack sends no alert looks like: the handshake passes, then the connection
    closes before any answer (TLS 1.3 checks a client certificate after the client's side is done)."""
    context = server_tls_context(tls.server_cert, tls.server_key)

    async def scenario() -> ProbeResult:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            frame = FrameDecoder().feed(await reader.read(1024))[0]
            writer.write(encode_frame(start_tls_response(parse_request(frame).header, EOK)))
            await writer.start_tls(context)
            writer.transport.abort()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, BookieClient(tls=client_tls(tls), timeout=10.0) as client:
            return await client.list_entries(f"127.0.0.1:{port}", 5)

    result = run(scenario())
    assert isinstance(result, TlsRefused) and "closed the TLS connection before any answer" in result.reason
