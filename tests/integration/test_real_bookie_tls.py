"""bkaudit's bookie client against a real BookKeeper 4.17 bookie that requires TLS and authenticates clients
by their certificate, as Pulsar deployments do (``tlsClientAuthentication=true``,
``bookieAuthProviderFactoryClass=org.apache.bookkeeper.tls.BookieAuthZFactory``, PEM key and trust stores).

One bookie, one scenario: with the CA and a client certificate whose OU carries an authorized role the probe
is answered over START_TLS; without TLS, without a client certificate and with a certificate whose role is not
authorized, the probe is a refusal naming the missing credential, never a silent bookie.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkaudit.testing.harness import ServiceHarness
from bkaudit.testing.tls import TlsFiles, write_client_certificate, write_throwaway_ca
from connectors.bookie.client import (
    AuthRequired,
    BlockingBookieClient,
    ConnectionFailed,
    NoLedger,
    ProbeResult,
    TlsRefused,
)
from connectors.bookie.liveness import answered_from
from connectors.bookie.tls import BookieTlsConfig
from connectors.bookkeeper import RealBookKeeperCluster

pytestmark = pytest.mark.integration

ROLE = "bkaudit-auditor"
UNKNOWN_LEDGER = 987_654_321


def _role_cert(tls: TlsFiles, role: str) -> tuple[Path, Path]:
    return write_client_certificate(tls, "role", organizational_unit=f"0:{role}")


@pytest.fixture(scope="module")
def secured(
    bk_services: ServiceHarness, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RealBookKeeperCluster, TlsFiles]]:
    tls = write_throwaway_ca(tmp_path_factory.mktemp("real-tls"))
    conf: dict[str, object] = {
        "tlsProviderFactoryClass": "org.apache.bookkeeper.tls.TLSContextFactory",
        "tlsProvider": "JDK",
        "tlsKeyStoreType": "PEM",
        "tlsKeyStore": tls.server_key,
        "tlsCertificatePath": tls.server_cert,
        "tlsTrustStoreType": "PEM",
        "tlsTrustStore": tls.ca,
        "tlsClientAuthentication": True,
        "bookieAuthProviderFactoryClass": "org.apache.bookkeeper.tls.BookieAuthZFactory",
        "authorizedRoles": ROLE,
    }
    cluster = bk_services.real_bookkeeper(bookies=1, racks=1, bookie_conf=conf)
    try:
        yield cluster, tls
    finally:
        cluster.stop()


def _probe(address: str, config: BookieTlsConfig | None) -> ProbeResult:
    with BlockingBookieClient(tls=config, timeout=15.0, connect_timeout=15.0) as client:
        return client.read_entry_exists(address, UNKNOWN_LEDGER, 0)


def _first_answer(address: str, config: BookieTlsConfig, timeout_s: float = 60.0) -> ProbeResult:
    """The bookie's first answer: a bookie registered under load may still reset its first connections
    (seen once in a CI run at load 19: "connection lost at START_TLS"), as a client retries them."""
    deadline = time.monotonic() + timeout_s
    result = _probe(address, config)
    while isinstance(result, ConnectionFailed) and time.monotonic() < deadline:
        time.sleep(1.0)
        result = _probe(address, config)
    return result


def test_a_real_bookie_with_tls_and_certificate_authorization(secured) -> None:
    cluster, tls = secured
    address = cluster.bookie(1).bookie_id
    cert, key = _role_cert(tls, ROLE)
    authorized = BookieTlsConfig(ca_file=tls.ca, cert_file=cert, key_file=key)
    assert _first_answer(address, authorized) == NoLedger()  # answered over START_TLS + TLS

    plaintext = _probe(address, None)
    assert isinstance(plaintext, AuthRequired) and "does not use TLS with it" in plaintext.reason

    no_cert = _probe(address, BookieTlsConfig(ca_file=tls.ca))
    assert isinstance(no_cert, TlsRefused) and "requires a client certificate" in no_cert.reason

    # CN=bkaudit without an OU role: the handshake succeeds, BookieAuthZFactory refuses it.
    no_role = BookieTlsConfig(ca_file=tls.ca, cert_file=tls.client_cert, key_file=tls.client_key)
    refused = _probe(address, no_role)
    assert isinstance(refused, AuthRequired | TlsRefused)
    assert "did not authorize bkaudit's client certificate" in refused.reason

    for result in (plaintext, no_cert, refused):
        assert answered_from(result)[0]  # a live bookie, never taken for a silent one
