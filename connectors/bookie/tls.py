"""TLS and authentication towards bookies, the way BookKeeper's client does it.

BookKeeper has no TLS port: a client connects in plaintext, sends ``START_TLS``, and on the ``EOK`` answer
both ends run the TLS handshake on the same connection (``PerChannelBookieClient.initiateTLS``). A bookie
with ``tlsClientAuthentication=true`` requires a client certificate signed by a CA in its trust store. A
bookie with ``bookieAuthProviderFactoryClass=org.apache.bookkeeper.tls.BookieAuthZFactory`` (Pulsar's
TLS-certificate authorization) authenticates the client by that certificate only: the role in the
certificate's ``OU`` (``OU=0:<role>``) must be one of its ``authorizedRoles``; the client sends no ``AUTH``
message (its auth provider is BookKeeper's null one). Until a connection is authenticated, such a bookie
answers every request ``EUA``; after a handshake whose certificate it does not authorize it also answers the
``START_TLS`` ``EIO``.

:class:`BookieTlsConfig` holds the client's side (CA, certificate, key, key password; no secret in
``repr``) and builds the ``ssl.SSLContext``; a file that cannot be read or a wrong key password is a
:class:`~core.errors.ConfigError` naming the setting, at start. :func:`refusal_reason` turns what a failed
handshake raised into one line naming the credential a bookie refused or bkaudit lacks.

Example:
    >>> config = BookieTlsConfig(cert_file=Path("client.pem"), key_file=Path("client.key.pem"),
    ...                          key_password="s3cret")
    >>> "s3cret" in repr(config), config.has_client_cert
    (False, True)
    >>> refusal_reason("TLSV13_ALERT_CERTIFICATE_REQUIRED", has_client_cert=False)
    'the bookie requires a client certificate: set bookie.tls_cert_file and bookie.tls_key_file'
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError

if TYPE_CHECKING:
    from core.settings import BookieSettings

#: Where a refusal tells the user to look (the settings of :class:`core.settings.BookieSettings`).
CERT_SETTINGS = "bookie.tls_cert_file and bookie.tls_key_file"


@dataclass(frozen=True)
class BookieTlsConfig:
    """The client side of TLS to bookies; ``key_password`` never appears in ``repr``.

    ``hostname_verification`` off (BookKeeper's default, ``tlsHostnameVerificationEnabled=false``) still
    verifies the bookie's certificate chain against ``ca_file`` (the system roots when unset).

    Example:
        >>> BookieTlsConfig(ca_file=Path("ca.pem"))
        BookieTlsConfig(ca_file=PosixPath('ca.pem'), cert_file=None, key_file=None, \
hostname_verification=False)
    """

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    key_password: str | None = field(default=None, repr=False)
    hostname_verification: bool = False

    @property
    def has_client_cert(self) -> bool:
        """Whether bkaudit presents a client certificate."""
        return self.cert_file is not None

    def context(self) -> ssl.SSLContext:
        """The client ``SSLContext``; :class:`ConfigError` naming the setting when a file is unusable.

        Example:
            >>> BookieTlsConfig(ca_file=Path("/nonexistent/ca.pem")).context()  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            core.errors.ConfigError: bookie.tls_ca_file: cannot read /nonexistent/ca.pem (No such file ...)
        """
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        context.check_hostname = self.hostname_verification
        if self.ca_file is not None:
            try:
                context.load_verify_locations(cafile=str(self.ca_file))
            except (OSError, ssl.SSLError) as err:
                raise ConfigError(f"bookie.tls_ca_file: cannot read {self.ca_file} ({_why(err)})") from None
        if self.cert_file is not None:
            password = self.key_password or ""
            try:
                # A callable, so that an encrypted key without a password fails instead of prompting.
                context.load_cert_chain(
                    str(self.cert_file), str(self.key_file or self.cert_file), password=lambda: password
                )
            except FileNotFoundError as err:
                raise ConfigError(f"{CERT_SETTINGS}: cannot read {err.filename}") from None
            except (OSError, ssl.SSLError):
                raise ConfigError(
                    f"{CERT_SETTINGS}: cannot load the client certificate and key (a wrong "
                    "bookie.tls_key_password, or a key that does not match the certificate)"
                ) from None
        return context


def bookie_tls_config(settings: BookieSettings) -> BookieTlsConfig | None:
    """The client TLS of the ``bookie`` settings (None: plaintext), checked at once: an unreadable file or
    a wrong key password is a :class:`ConfigError` when the process starts, not at the first probe.

    Example:
        >>> from core.settings import BookieSettings
        >>> bookie_tls_config(BookieSettings()) is None
        True
        >>> bookie_tls_config(BookieSettings(tls=True)).has_client_cert
        False
    """
    problem = settings.problem()
    if problem is not None:
        raise ConfigError(problem)
    if not settings.tls:
        return None
    password = settings.tls_key_password.get_secret_value() if settings.tls_key_password else None
    config = BookieTlsConfig(
        ca_file=settings.tls_ca_file,
        cert_file=settings.tls_cert_file,
        key_file=settings.tls_key_file,
        key_password=password,
        hostname_verification=settings.tls_hostname_verification,
    )
    config.context()
    return config


def _why(err: BaseException) -> str:
    return str(getattr(err, "strerror", None) or getattr(err, "reason", None) or type(err).__name__)


def refusal_reason(
    ssl_reason: str | None, *, has_client_cert: bool, verify_message: str | None = None
) -> str:
    """One line saying which credential a failed TLS handshake with a bookie is about.

    ``ssl_reason`` is OpenSSL's reason (``ssl.SSLError.reason``): the bookie's alert, or the client's own
    verification failure (``CERTIFICATE_VERIFY_FAILED``, with ``verify_message``).

    Example:
        >>> print(refusal_reason("CERTIFICATE_VERIFY_FAILED", has_client_cert=True,
        ...                      verify_message="unable to get local issuer certificate"))
        the bookie's certificate is not trusted (unable to get local issuer certificate): check \
bookie.tls_ca_file
        >>> refusal_reason("SSLV3_ALERT_CERTIFICATE_EXPIRED", has_client_cert=True)
        "the bookie refused bkaudit's client certificate (bookie.tls_cert_file): certificate expired"
        >>> refusal_reason("TLSV1_ALERT_UNKNOWN_CA", has_client_cert=True)
        "the bookie refused bkaudit's client certificate (bookie.tls_cert_file): unknown ca"
    """
    reason = (ssl_reason or "").upper()
    if reason == "CERTIFICATE_VERIFY_FAILED":
        detail = f" ({verify_message})" if verify_message else ""
        return f"the bookie's certificate is not trusted{detail}: check bookie.tls_ca_file"
    alert = reason.partition("_ALERT_")[2].replace("_", " ").lower()
    if alert == "certificate required" or (alert and not has_client_cert):
        return f"the bookie requires a client certificate: set {CERT_SETTINGS}"
    if alert:
        return f"the bookie refused bkaudit's client certificate (bookie.tls_cert_file): {alert}"
    return f"TLS with the bookie failed: {ssl_reason or 'handshake error'}"


def refusal_of(err: ssl.SSLError, *, has_client_cert: bool) -> str:
    """:func:`refusal_reason` of a raised ``ssl.SSLError``.

    Example:
        >>> error = ssl.SSLError(1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] certificate required")
        >>> error.reason = "TLSV13_ALERT_CERTIFICATE_REQUIRED"
        >>> refusal_of(error, has_client_cert=False).startswith("the bookie requires a client certificate")
        True
    """
    return refusal_reason(
        getattr(err, "reason", None),
        has_client_cert=has_client_cert,
        verify_message=getattr(err, "verify_message", None),
    )


def auth_required_reason(tls: BookieTlsConfig | None) -> str:
    """What an ``EUA`` answer means given what bkaudit presented: the credential to set or fix.

    Example:
        >>> auth_required_reason(None).endswith("does not use TLS with it: set bookie.tls with a client "
        ...                                     "certificate (bookie.tls_cert_file and bookie.tls_key_file)")
        True
        >>> print(auth_required_reason(BookieTlsConfig()))
        the bookie requires authentication: no client certificate given (bookie.tls_cert_file and \
bookie.tls_key_file)
    """
    if tls is None:
        return (
            "the bookie requires authentication and bkaudit does not use TLS with it: set bookie.tls with a "
            f"client certificate ({CERT_SETTINGS})"
        )
    if not tls.has_client_cert:
        return f"the bookie requires authentication: no client certificate given ({CERT_SETTINGS})"
    return (
        "the bookie did not authorize bkaudit's client certificate (bookie.tls_cert_file): the role in its "
        "OU (OU=0:<role>) is not among the bookie's authorizedRoles, or the bookie uses another auth plugin"
    )


def certificate_roles(peercert: Mapping[str, Any] | None) -> list[str]:
    """The roles of a verified peer certificate (``ssl.SSLSocket.getpeercert()``), read from its ``OU``
    as BookKeeper's ``CertUtils.getRolesFromOU``: ``OU=0:<role>[,<role>...][;1:<cluster>]``.

    Example:
        >>> certificate_roles({"subject": ((("organizationalUnitName", "0:pulsar,admin;1:c1"),),)})
        ['pulsar', 'admin']
        >>> certificate_roles({"subject": ((("commonName", "bkaudit"),),)}), certificate_roles(None)
        ([], [])
    """
    for rdn in (peercert or {}).get("subject", ()):
        for name, value in rdn:
            if name == "organizationalUnitName":
                codes = dict(part.split(":", 1) for part in str(value).split(";") if ":" in part)
                names = codes.get("0")
                return [role.strip() for role in names.split(",")] if names else []
    return []


def server_tls_context(
    cert_file: Path, key_file: Path, *, ca_file: Path | None = None, require_client_cert: bool = False
) -> ssl.SSLContext:
    """A bookie's side (the simulator's): its certificate, and with ``require_client_cert`` the CA its
    clients' certificates must chain to (``tlsClientAuthentication=true``).

    Example:
        >>> # server_tls_context(files.server_cert, files.server_key, ca_file=files.ca,
        >>> #                    require_client_cert=True)
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert_file), str(key_file))
    if ca_file is not None:
        context.load_verify_locations(cafile=str(ca_file))
        context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return context


__all__ = [
    "BookieTlsConfig",
    "auth_required_reason",
    "bookie_tls_config",
    "certificate_roles",
    "refusal_of",
    "refusal_reason",
    "server_tls_context",
]
