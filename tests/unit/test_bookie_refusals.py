"""A bookie that refuses bkaudit's TLS or credentials: BOOKIE_AUTH_REFUSED naming the credential, never
BOOKIE_UNRESPONSIVE; and the ``bookie`` settings that say what bkaudit presents (no secret shown)."""

from __future__ import annotations

import logging

import pytest

from connectors.bookie.tls import bookie_tls_config, refusal_reason
from core.domain.alert_book import AlertBook
from core.domain.alerts import AlertKind
from core.errors import ConfigError
from core.logsetup import secret_values
from core.settings import BookieSettings, load_settings
from streaming.sink_batch import SinkBatch, apply_decisions, bookie_answers

REASON = "the bookie requires a client certificate: set bookie.tls_cert_file and bookie.tls_key_file"


def open_kinds(book: AlertBook) -> set[tuple[str, str]]:
    return {(entity, kind.value) for entity, kind in book.open}


def test_a_refusal_fires_auth_refused_with_the_reason_and_resolves_unresponsive():
    book = AlertBook("c1")
    book.set_bookie_condition(AlertKind.BOOKIE_UNRESPONSIVE, "b1", True, at_ms=1)
    bookie_answers(book, 7, {"b1": "tls_refused", "b2": "entry_list"}, {"b1": REASON}, at_ms=2)
    assert open_kinds(book) == {("bookie/b1", "BOOKIE_AUTH_REFUSED")}
    alert = book.open[("bookie/b1", AlertKind.BOOKIE_AUTH_REFUSED)]
    assert alert.detail == {"answer": "tls_refused", "ledger_id": 7, "reason": REASON}
    assert alert.kind.severity == "warning" and tuple(alert.bookies) == ("b1",)


def test_the_next_answer_resolves_it_and_a_silent_bookie_leaves_it_open():
    book = AlertBook("c1")
    bookie_answers(book, 7, {"b1": "auth_required", "b2": "auth_required"}, {}, at_ms=1)
    bookie_answers(book, 8, {"b1": "entry_reads", "b2": "timeout"}, {}, at_ms=2)
    assert open_kinds(book) == {("bookie/b2", "BOOKIE_AUTH_REFUSED")}
    assert book.open[("bookie/b2", AlertKind.BOOKIE_AUTH_REFUSED)].detail["reason"] == "auth_required"


def test_confirmed_rounds_do_not_call_a_refusing_bookie_unresponsive():
    registered = {"status": "WRITABLE"}
    batch = SinkBatch(0, "c1", AlertBook("c1"), {"b1": registered, "b2": registered}, 1)
    outcome = {"result": "OK", "unresponsive": ["b1", "b2"], "refused": {"b1": REASON}}
    row = {
        "kind": "replicas_confirmed",
        "ledger_id": 7,
        "at_ms": 5,
        "payload": {"round": 3, "outcome": {"failing": True, "outcome": outcome}},
    }
    apply_decisions(batch, [row])
    assert ("bookie/b2", AlertKind.BOOKIE_UNRESPONSIVE) in batch.book.open
    assert ("bookie/b1", AlertKind.BOOKIE_UNRESPONSIVE) not in batch.book.open


@pytest.mark.parametrize(
    ("ssl_reason", "has_cert", "names"),
    [
        ("CERTIFICATE_VERIFY_FAILED", True, "bookie.tls_ca_file"),
        ("TLSV13_ALERT_CERTIFICATE_REQUIRED", False, "requires a client certificate"),
        ("SSLV3_ALERT_HANDSHAKE_FAILURE", False, "requires a client certificate"),
        (
            "SSLV3_ALERT_CERTIFICATE_EXPIRED",
            True,
            "client certificate (bookie.tls_cert_file): certificate expired",
        ),
        (
            "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
            True,
            "client certificate (bookie.tls_cert_file): certificate unknown",
        ),
        ("WRONG_VERSION_NUMBER", True, "TLS with the bookie failed: WRONG_VERSION_NUMBER"),
    ],
)
def test_each_tls_failure_names_its_credential(ssl_reason, has_cert, names):
    assert names in refusal_reason(ssl_reason, has_client_cert=has_cert)


def test_contradictory_bookie_settings_are_one_config_error_line():
    with pytest.raises(ConfigError, match=r"^bookie\.tls_ca_file set but bookie\.tls is false$"):
        bookie_tls_config(BookieSettings(tls_ca_file="ca.pem"))
    with pytest.raises(ConfigError, match=r"tls-certificate needs bookie\.tls and bookie\.tls_cert_file"):
        bookie_tls_config(BookieSettings(tls=True, auth_provider="tls-certificate"))
    assert bookie_tls_config(BookieSettings()) is None


def test_the_key_password_is_never_shown(monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("BKAUDIT_BOOKIE__TLS_KEY_PASSWORD", "pw-s3cret")
    settings = load_settings()
    assert settings.bookie.tls_key_password is not None
    assert "pw-s3cret" not in repr(settings) + settings.model_dump_json() + caplog.text
    assert "pw-s3cret" in secret_values(settings)  # what register_secrets redacts from every log record
