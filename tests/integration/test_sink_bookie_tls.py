"""The job's sink probing over TLS: a bookie that refuses bkaudit's certificate is BOOKIE_AUTH_REFUSED on the
alerts topic, naming the credential (not BOOKIE_UNRESPONSIVE), while the bookie that accepts it is probed as
usual. (No rack map: the ledger's PLACEMENT_NOT_ADHERING is beside the point.)"""

from __future__ import annotations

import pytest

from bkaudit.testing.tls import write_throwaway_ca
from connectors.bookie.server import BookieServer, InMemoryEntryStore
from connectors.bookie.tls import BookieTlsConfig, server_tls_context
from streaming.sink import AuditSink, SinkConfig
from tests.integration.event_fixtures import alerts_on, closed_ledger_payload, decision_table

pytestmark = pytest.mark.integration


def test_a_refusing_bookie_is_auth_refused_on_the_alerts_topic(tmp_path, kafka_settings):
    tls = write_throwaway_ca(tmp_path / "tls")
    context = server_tls_context(tls.server_cert, tls.server_key, ca_file=tls.ca, require_client_cert=True)
    store = InMemoryEntryStore()
    store.add_entries(7, range(10))
    config = SinkConfig(
        lakehouse_root=tmp_path / "lake",
        app_id="tls",
        kafka=kafka_settings,
        probe_timeout_s=10.0,
        bookie_tls=BookieTlsConfig(ca_file=tls.ca, cert_file=tls.client_cert, key_file=tls.client_key),
    )
    with (
        BookieServer(store, tls=context) as accepting,
        BookieServer(store, tls=context, authorized_roles=["pulsar"]) as refusing,  # our cert has no role
    ):
        sink = AuditSink(config)
        try:
            registered = {"status": "WRITABLE"}
            sink.process(
                decision_table(
                    ("bookie_state", 1000, None, "b1", {**registered, "rpc_address": accepting.address}),
                    ("bookie_state", 1000, None, "b2", {**registered, "rpc_address": refusing.address}),
                    ("ledger_state", 1001, 7, None, closed_ledger_payload(["b1", "b2"], mzxid=5)),
                    ("probe_request", 1002, 7, None, {"round": 0, "reason": "probe"}),
                ),
                0,
            )
        finally:
            sink.close()
    alerts = alerts_on(kafka_settings)
    fired = [a for _, a in alerts if a["state"] == "firing" and a["kind"].startswith("BOOKIE_")]
    assert [(a["kind"], a["bookies"]) for a in fired] == [("BOOKIE_AUTH_REFUSED", ["b2"])]
    assert "did not authorize bkaudit's client certificate" in fired[0]["detail"]["reason"]
