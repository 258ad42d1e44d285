"""TLS client checks shared by the connectors: load the configured files once, probe a server's handshake.

A client library that meets a refused TLS handshake retries it in silence (kazoo) or logs it as one more
connection error among many (librdkafka), and a wrong key password surfaces as an OpenSSL "PEM lib" error.
Before a client starts, :func:`client_context` loads the CA, certificate and key as the client will (one
:class:`~core.errors.ConfigError` line naming the setting when a file is missing, unreadable, the key
password is wrong or the client certificate has expired) and :func:`first_refusal` makes one handshake
with the first server that answers and returns its refusal, which :func:`explain_refusal` turns into a
hint naming the setting. Key passwords are never part of a message. :class:`ServerTls` names the files an
embedded service serves TLS with.

Example:
    >>> explain_refusal("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed", "zookeeper.tls_")
    "the server's certificate is not signed by a CA in zookeeper.tls_cafile"
"""

from __future__ import annotations

import datetime
import re
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError

#: File names of a TLS directory (written by ``bkaudit.testing.tls``, read by :meth:`ServerTls.in_directory`).
CA_FILE = "ca.pem"
SERVER_KEYSTORE_FILE = "server-keystore.pem"
SERVER_CERT_FILE = "server.pem"
SERVER_KEY_FILE = "server.key.pem"
CLIENT_CERT_FILE = "client.pem"
CLIENT_KEY_FILE = "client.key.pem"
#: The client pair for bookies that authorize a role (BookieAuthZFactory): the certificate carries
#: ``OU=0:<BOOKIE_ROLE>``.
BOOKIE_CLIENT_CERT_FILE = "bookie-client.pem"
BOOKIE_CLIENT_KEY_FILE = "bookie-client.key.pem"
#: The role the embedded services' bookies authorize (``bkaudit dev up --tls``, ``bkaudit demo --tls``).
BOOKIE_ROLE = "bkaudit"


@dataclass(frozen=True)
class ServerTls:
    """The PEM files an embedded service (ZooKeeper, the Kafka broker) serves TLS with.

    ``keystore`` holds the server's unencrypted private key followed by its certificate; clients must
    present a certificate signed by ``cafile`` (mutual TLS). The client pair is what the service's own
    readiness checks connect with.

    Example:
        >>> ServerTls(Path("ca.pem"), Path("ks.pem"), Path("c.pem"), Path("c.key")).cafile.name
        'ca.pem'
    """

    cafile: Path
    keystore: Path
    client_certfile: Path
    client_keyfile: Path
    #: A client pair whose certificate carries :data:`BOOKIE_ROLE` (for bookies that authorize roles).
    bookie_client_certfile: Path | None = None
    bookie_client_keyfile: Path | None = None

    @classmethod
    def in_directory(cls, directory: Path) -> ServerTls:
        """The files under their conventional names (those ``bkaudit.testing.tls`` writes) in ``directory``.

        Example:
            >>> ServerTls.in_directory(Path("/s/tls")).keystore
            PosixPath('/s/tls/server-keystore.pem')
        """
        return cls(
            directory / CA_FILE,
            directory / SERVER_KEYSTORE_FILE,
            directory / CLIENT_CERT_FILE,
            directory / CLIENT_KEY_FILE,
            directory / BOOKIE_CLIENT_CERT_FILE,
            directory / BOOKIE_CLIENT_KEY_FILE,
        )

    def client_context(self) -> ssl.SSLContext:
        """A client context trusting ``cafile`` with the client pair (for readiness checks)."""
        return client_context("", self.cafile, self.client_certfile, self.client_keyfile, None)


def client_context(
    prefix: str,
    cafile: Path | None,
    certfile: Path | None,
    keyfile: Path | None,
    password: str | None,
    *,
    check_hostname: bool = False,
) -> ssl.SSLContext:
    """A verifying TLS client context from the configured files; each problem is one ``ConfigError`` line.

    ``prefix`` names the settings in messages (``zookeeper.tls_`` or ``kafka.ssl_``).

    Example:
        >>> try:
        ...     client_context("zookeeper.tls_", Path("/nonexistent/ca.pem"), None, None, None)
        ... except ConfigError as err:
        ...     print(err)
        zookeeper.tls_cafile: cannot read /nonexistent/ca.pem (No such file or directory)
    """
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.check_hostname = check_hostname
    if cafile is not None:
        try:
            context.load_verify_locations(cafile=str(cafile))
        except (OSError, ssl.SSLError) as err:
            raise ConfigError(f"{prefix}cafile: cannot read {cafile} ({_reason(err)})") from None
    if (certfile is None) != (keyfile is None):
        raise ConfigError(f"{prefix}certfile and {prefix}keyfile go together (the client's pair)")
    if certfile is not None and keyfile is not None:
        for name, path in (("certfile", certfile), ("keyfile", keyfile)):
            if not Path(path).is_file():
                raise ConfigError(f"{prefix}{name}: cannot read {path} (no such file)")
        try:
            context.load_cert_chain(str(certfile), str(keyfile), password=password or "")
        except ssl.SSLError as err:
            raise ConfigError(_key_problem(prefix, keyfile, password, err)) from None
        expired = certificate_expired_on(Path(certfile))
        if expired is not None:
            raise ConfigError(f"{prefix}certfile: the client certificate {certfile} expired on {expired}")
    return context


def _key_problem(prefix: str, keyfile: Path, password: str | None, err: ssl.SSLError) -> str:
    text = _reason(err)
    if "KEY_VALUES_MISMATCH" in text.upper() or "key values mismatch" in text:
        return f"{prefix}keyfile: {keyfile} is not the key of {prefix}certfile"
    if password:
        return f"{prefix}keyfile: cannot load {keyfile}: wrong password in the key's password setting?"
    return f"{prefix}keyfile: cannot load {keyfile} (encrypted and no password given, or not a PEM key)"


def certificate_expired_on(certfile: Path, now: datetime.datetime | None = None) -> str | None:
    """The date ``certfile``'s first certificate expired on, or ``None`` (valid, or unknown: needs
    ``cryptography``, which the ``demo`` and ``dev`` extras install; without it the server's refusal says it).

    Example:
        >>> certificate_expired_on(Path("/nonexistent.pem")) is None
        True
    """
    try:
        from cryptography import x509
    except ImportError:  # pragma: no cover - the server's refusal then names the expiry
        return None
    try:
        cert = x509.load_pem_x509_certificate(certfile.read_bytes())
    except (OSError, ValueError):
        return None
    now = now or datetime.datetime.now(datetime.UTC)
    end = cert.not_valid_after_utc
    return end.strftime("%Y-%m-%d %H:%M:%S UTC") if end < now else None


def first_refusal(
    context: ssl.SSLContext, servers: list[tuple[str, int]], timeout_s: float, *, hello: bytes = b""
) -> tuple[str, int, str] | None:
    """Probe ``servers`` in order until one answers: its refusal as ``(host, port, reason)``, or ``None``
    (accepted, or none reachable: the client's own error then says so).

    Example:
        >>> first_refusal(ssl.create_default_context(), [("127.0.0.1", 1)], 1.0) is None
        True
    """
    for host, port in servers:
        reached, reason = _probe(context, host, port, timeout_s, hello)
        if reason is not None:
            return host, port, reason
        if reached:
            return None
    return None


def _probe(
    context: ssl.SSLContext, host: str, port: int, timeout_s: float, hello: bytes
) -> tuple[bool, str | None]:
    """``(reached, refusal)`` of one handshake: ``refusal`` is ``None`` when the server accepted it.

    With TLS 1.3 a server refuses a client certificate (missing, expired, unknown CA) only after the
    handshake, so ``hello`` (bytes the server answers, e.g. a ZooKeeper four-letter word) is sent and one
    read waits for that answer or the refusal. A connection that fails before TLS (nothing listening) is
    not a TLS refusal: the client's own error says it."""
    try:
        raw = socket.create_connection((host, port), timeout=timeout_s)
    except OSError:
        return False, None
    try:
        with context.wrap_socket(raw, server_hostname=host) as sock:
            if hello:
                sock.sendall(hello)
                sock.recv(1)
    except ssl.SSLError as err:
        return True, _reason(err)
    except ConnectionError as err:
        return True, f"connection closed during TLS ({type(err).__name__})"
    except OSError:  # a timeout: no refusal came
        return True, None
    finally:
        raw.close()
    return True, None


def explain_refusal(reason: str, prefix: str, *, sent_certificate: bool = True) -> str:
    """A hint for a TLS refusal's text (``prefix``: the settings' prefix, ``zookeeper.tls_``/``kafka.ssl_``;
    ``sent_certificate``: whether the client had a certificate to present).

    Example:
        >>> explain_refusal("sslv3 alert bad certificate", "kafka.ssl_", sent_certificate=False)
        'the server requires a client certificate: set kafka.ssl_certfile and kafka.ssl_keyfile'
        >>> explain_refusal("sslv3 alert certificate expired", "kafka.ssl_")
        'the server refused the client certificate as expired: renew kafka.ssl_certfile'
    """
    lowered = reason.lower()
    if not sent_certificate and "alert" in lowered and ("certificate" in lowered or "handshake" in lowered):
        return f"the server requires a client certificate: set {prefix}certfile and {prefix}keyfile"
    if "certificate verify failed" in lowered or "certificate_verify_failed" in lowered:
        if "hostname" in lowered or "ip address mismatch" in lowered:
            return f"the server's certificate does not name the host connected to ({prefix}check_hostname)"
        if "expired" in lowered:
            return "the server's certificate has expired"
        return f"the server's certificate is not signed by a CA in {prefix}cafile"
    if "certificate required" in lowered or "handshake failure" in lowered:
        return f"the server requires a client certificate: set {prefix}certfile and {prefix}keyfile"
    if "certificate expired" in lowered:
        return f"the server refused the client certificate as expired: renew {prefix}certfile"
    if "unknown ca" in lowered or "bad certificate" in lowered or "certificate unknown" in lowered:
        return f"the server does not trust the client certificate in {prefix}certfile (signed by another CA?)"
    plaintext = ("wrong version number", "record layer failure", "eof occurred", "closed during tls")
    if any(text in lowered for text in plaintext):
        return "the server does not speak TLS on this port (a plaintext port?)"
    return f"check {prefix}cafile, {prefix}certfile and {prefix}keyfile"


def _reason(err: BaseException) -> str:
    if isinstance(err, ssl.SSLError):
        return re.sub(r"\s*\(_ssl\.c:\d+\)$", "", str(err))
    return err.strerror if isinstance(err, OSError) and err.strerror else str(err)
