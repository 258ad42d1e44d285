"""A throwaway certificate authority for TLS on the embedded services, the demo and tests.

:func:`write_throwaway_ca` makes a CA and, signed by it, a server certificate for ``localhost`` and
``127.0.0.1``, a client certificate (its key also written encrypted under a password), an expired client
certificate, and a second CA that signed nothing here (what a client trusting the wrong CA holds). Everything
is written as PEM files to one directory; keys are ``0600``. The certificates are valid for ``days`` days and
are for development and tests only.

Example:
    >>> import tempfile
    >>> tls = write_throwaway_ca(tempfile.mkdtemp())
    >>> sorted(p.name for p in tls.directory.glob("*.pem"))[:2]
    ['ca.key.pem', 'ca.pem']
    >>> tls.server_keystore.read_text().count("BEGIN")
    2
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from connectors.tls import (
    BOOKIE_CLIENT_CERT_FILE,
    BOOKIE_CLIENT_KEY_FILE,
    BOOKIE_ROLE,
    CA_FILE,
    CLIENT_CERT_FILE,
    CLIENT_KEY_FILE,
    SERVER_CERT_FILE,
    SERVER_KEY_FILE,
    SERVER_KEYSTORE_FILE,
)

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey

#: The password of ``client.key.enc.pem`` (a throwaway: the files it protects are test material).
DEFAULT_KEY_PASSWORD = "throwaway-key-password"


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files :func:`write_throwaway_ca` wrote (all paths inside ``directory``)."""

    directory: Path
    ca: Path  # the CA certificate: what clients and servers trust
    ca_key: Path  # the CA's key (to sign more certificates)
    server_cert: Path  # localhost / 127.0.0.1, server and client auth
    server_key: Path  # unencrypted PKCS#8
    server_keystore: Path  # server key then certificate in one file (Kafka/ZooKeeper ``PEM`` keystores)
    client_cert: Path  # CN=bkaudit, client auth
    client_key: Path  # unencrypted PKCS#8
    client_key_encrypted: Path  # the same key, PKCS#8 encrypted with ``key_password``
    key_password: str
    expired_cert: Path  # a client certificate signed by the CA whose validity ended yesterday
    expired_key: Path
    other_ca: Path  # a CA that signed none of these: trusting it is "the wrong CA"


def write_throwaway_ca(
    directory: str | os.PathLike[str], *, days: int = 7, key_password: str = DEFAULT_KEY_PASSWORD
) -> TlsFiles:
    """Write a fresh CA, server, client, expired-client and wrong-CA certificates to ``directory``.

    Example:
        >>> import tempfile
        >>> write_throwaway_ca(tempfile.mkdtemp()).key_password == DEFAULT_KEY_PASSWORD
        True
    """
    from cryptography.hazmat.primitives.asymmetric import ec

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("bkaudit-throwaway-ca", ca_key, None, ca_key, valid, ca=True)
    other_key = ec.generate_private_key(ec.SECP256R1())
    other = _certificate("bkaudit-other-ca", other_key, None, other_key, valid, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _certificate("localhost", server_key, ca, ca_key, valid, san=True)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _certificate("bkaudit", client_key, ca, ca_key, valid, san=True)
    expired_key = ec.generate_private_key(ec.SECP256R1())
    past = (now - datetime.timedelta(days=2), now - datetime.timedelta(days=1))
    expired = _certificate("bkaudit-expired", expired_key, ca, ca_key, past, san=True)
    files = TlsFiles(
        directory=out,
        ca=_write(out / CA_FILE, _cert_pem(ca)),
        ca_key=_write(out / "ca.key.pem", _key_pem(ca_key), secret=True),
        server_cert=_write(out / SERVER_CERT_FILE, _cert_pem(server)),
        server_key=_write(out / SERVER_KEY_FILE, _key_pem(server_key), secret=True),
        server_keystore=_write(
            out / SERVER_KEYSTORE_FILE, _key_pem(server_key) + _cert_pem(server), secret=True
        ),
        client_cert=_write(out / CLIENT_CERT_FILE, _cert_pem(client)),
        client_key=_write(out / CLIENT_KEY_FILE, _key_pem(client_key), secret=True),
        client_key_encrypted=_write(
            out / "client.key.enc.pem", _key_pem(client_key, key_password), secret=True
        ),
        key_password=key_password,
        expired_cert=_write(out / "client-expired.pem", _cert_pem(expired)),
        expired_key=_write(out / "client-expired.key.pem", _key_pem(expired_key), secret=True),
        other_ca=_write(out / "other-ca.pem", _cert_pem(other)),
    )
    return files


def write_client_certificate(tls: TlsFiles, name: str, *, organizational_unit: str) -> tuple[Path, Path]:
    """A client certificate ``CN=bkaudit, OU=<organizational_unit>`` signed by the throwaway CA, and its key,
    written as ``<name>.pem`` and ``<name>.key.pem``: e.g. ``OU=0:<role>``, a role of BookKeeper's
    ``BookieAuthZFactory``.

    Example:
        >>> import tempfile
        >>> tls = write_throwaway_ca(tempfile.mkdtemp())
        >>> [p.name for p in write_client_certificate(tls, "role", organizational_unit="0:auditor")]
        ['role.pem', 'role.key.pem']
    """
    return _write_role_certificate(tls.directory, tls.ca, tls.ca_key, name, organizational_unit)


def _write_role_certificate(
    directory: Path, ca_file: Path, ca_key_file: Path, name: str, organizational_unit: str
) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca = x509.load_pem_x509_certificate(ca_file.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_file.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, "bkaudit"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, organizational_unit),
        ]
    )
    valid = (now - datetime.timedelta(minutes=5), ca.not_valid_after_utc)  # as long as the CA
    cert = _certificate("bkaudit", key, ca, ca_key, valid, subject=subject)
    return (
        _write(directory / f"{name}.pem", _cert_pem(cert)),
        _write(directory / f"{name}.key.pem", _key_pem(key), secret=True),
    )


def ensure_throwaway_ca(directory: str | os.PathLike[str]) -> Path:
    """``directory`` with a throwaway CA in it: the one already there (a restart keeps the clients' files
    valid), else a new one from :func:`write_throwaway_ca`; and a client pair for bookies that authorize
    :data:`~connectors.tls.BOOKIE_ROLE` (``bookie-client.pem``, ``OU=0:bkaudit``), signed by that CA.

    Example:
        >>> import tempfile
        >>> folder = ensure_throwaway_ca(tempfile.mkdtemp())
        >>> (folder / "ca.pem").read_bytes() == (ensure_throwaway_ca(folder) / "ca.pem").read_bytes()
        True
    """
    out = Path(directory)
    names = (CA_FILE, SERVER_KEYSTORE_FILE, CLIENT_CERT_FILE, CLIENT_KEY_FILE)
    if not all((out / name).is_file() for name in names):
        write_throwaway_ca(out)
    if not (out / BOOKIE_CLIENT_CERT_FILE).is_file() or not (out / BOOKIE_CLIENT_KEY_FILE).is_file():
        name = BOOKIE_CLIENT_CERT_FILE.removesuffix(".pem")
        _write_role_certificate(out, out / CA_FILE, out / "ca.key.pem", name, f"0:{BOOKIE_ROLE}")
    return out


def _certificate(
    common_name: str,
    key: EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: EllipticCurvePrivateKey,
    valid: tuple[datetime.datetime, datetime.datetime],
    *,
    ca: bool = False,
    san: bool = False,
    subject: x509.Name | None = None,
) -> x509.Certificate:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    subject = subject or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.subject if issuer is not None else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    if san:
        names: list[x509.GeneralName] = [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _cert_pem(cert: x509.Certificate) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: EllipticCurvePrivateKey, password: str | None = None) -> bytes:
    from cryptography.hazmat.primitives import serialization

    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    )
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def _write(path: Path, data: bytes, *, secret: bool = False) -> Path:
    path.write_bytes(data)
    if secret:
        path.chmod(0o600)
    return path
