"""The secret filter on its own: what it strips, redacts and drops (pure; the real run is
tests/integration/test_secret_logging.py)."""

from __future__ import annotations

import io
import logging
import os
from collections import namedtuple

from core.logsetup import SecretFilter, configure_logging

KAZOO_FILE = os.path.join("site-packages", "kazoo", "protocol", "connection.py")
GetData = namedtuple("GetData", "path watcher")


def record(msg: str, *args: object, pathname: str = __file__, exc_info: object = None) -> logging.LogRecord:
    return logging.LogRecord("x", logging.DEBUG, pathname, 1, msg, args, exc_info)  # type: ignore[arg-type]


def test_kazoo_responses_keep_their_shape_without_the_bytes():
    guard = SecretFilter()
    response = record("Received response(xid=%s): %r", 7, (b"ledger-pw", {"mzxid": 1}), pathname=KAZOO_FILE)
    assert guard.filter(response)
    assert response.getMessage() == "Received response(xid=7): ('<9 bytes>', {'mzxid': 1})"
    request = record("Sending request(xid=%s): %s", 8, GetData("/ledgers/L1", None), pathname=KAZOO_FILE)
    assert guard.filter(request) and "GetData(path='/ledgers/L1', watcher=None)" in request.getMessage()


def test_kazoo_records_still_showing_bytes_are_dropped():
    class Opaque:
        def __repr__(self) -> str:
            return "Opaque(b'ledger-pw')"

    assert not SecretFilter().filter(record("Read response %s", Opaque(), pathname=KAZOO_FILE))


def test_secrets_are_redacted_from_message_exception_and_stack():
    guard = SecretFilter()
    guard.add_secret("pw-1")
    try:
        raise ValueError("login pw-1 refused")
    except ValueError as err:
        failed = record("auth %s", "user:pw-1", exc_info=(type(err), err, err.__traceback__))
    failed.stack_info = "Stack: pw-1"
    assert guard.filter(failed)
    assert failed.getMessage() == "auth user:***"
    assert "login *** refused" in failed.exc_text and "pw-1" not in failed.exc_text
    assert failed.stack_info == "Stack: ***"


def test_quoted_password_values_are_redacted_even_when_not_registered():
    guard = SecretFilter()
    config = record("configuration: %s", {"ssl_password": "unknown", "sasl_plain_password": b"raw"})
    auth = record("Sending request(xid=None): Auth(auth_type=0, scheme='digest', auth='bk:pw')")
    assert guard.filter(config) and guard.filter(auth)
    assert config.getMessage() == "configuration: {'ssl_password': '***', 'sasl_plain_password': '***'}"
    assert auth.getMessage().endswith("auth='***')")


def test_configure_logging_guards_the_handlers_already_installed():
    root = logging.getLogger()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root.addHandler(handler)
    try:
        configure_logging("DEBUG")
        from core.logsetup import SECRET_FILTER

        assert SECRET_FILTER in handler.filters
    finally:
        root.removeHandler(handler)
