"""TLS for a real BookKeeper cluster's JVMs on a secured ZooKeeper, as a secured Pulsar cluster runs them.

Every JVM of the cluster (the bookies, BookKeeper's shell, the ledger writer, the Auditor) reaches
ZooKeeper over TLS with ZooKeeper's client system properties (the Netty socket, ``zookeeper.client.secure``,
PEM key and trust stores); the bookies serve ``START_TLS`` with client certificates required and authorize
the role in them (``BookieAuthZFactory``, ``authorizedRoles``), and the clients that read or write entries
(the writer, the Auditor's replication worker) present a certificate carrying that role.

Example:
    >>> tls = BookKeeperTls(Path("/t/ca.pem"), Path("/t/ks.pem"), Path("/t/s.pem"), Path("/t/s.key"),
    ...                     Path("/t/c.pem"), Path("/t/c.key"), role="bkaudit")
    >>> tls.bookie_conf()["authorizedRoles"], tls.client_conf()["tlsCertificatePath"]
    ('bkaudit', PosixPath('/t/c.pem'))
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connectors.tls import SERVER_CERT_FILE, SERVER_KEY_FILE, ServerTls

_TLS_PROVIDER = "org.apache.bookkeeper.tls.TLSContextFactory"


@dataclass(frozen=True)
class BookKeeperTls:
    """The PEM files of a secured cluster: the CA, a key-and-certificate file every JVM presents to
    ZooKeeper, the bookies' server pair, and the role-carrying client pair of the writer and the Auditor."""

    ca: Path
    zookeeper_keystore: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    role: str

    @classmethod
    def of(cls, tls: ServerTls, role: str) -> BookKeeperTls:
        """The files of an embedded services' TLS directory (``bkaudit dev up --tls``): the server pair for
        the bookies and ZooKeeper alike, the bookie client pair (:attr:`ServerTls.bookie_client_certfile`).

        Example:
            >>> BookKeeperTls.of(ServerTls.in_directory(Path("/s/tls")), "r").server_key
            PosixPath('/s/tls/server.key.pem')
        """
        folder = tls.cafile.parent
        cert = tls.bookie_client_certfile or tls.client_certfile
        key = tls.bookie_client_keyfile or tls.client_keyfile
        return cls(
            tls.cafile, tls.keystore, folder / SERVER_CERT_FILE, folder / SERVER_KEY_FILE, cert, key, role
        )

    def zookeeper_jvm_options(self) -> tuple[str, ...]:
        """ZooKeeper's client TLS as system properties (read by every ZooKeeper client in the JVM).

        Example:
            >>> tls = BookKeeperTls.of(ServerTls.in_directory(Path("/s")), "r")
            >>> "-Dzookeeper.client.secure=true" in tls.zookeeper_jvm_options()
            True
        """
        return (
            "-Dzookeeper.clientCnxnSocket=org.apache.zookeeper.ClientCnxnSocketNetty",
            "-Dzookeeper.client.secure=true",
            f"-Dzookeeper.ssl.keyStore.location={self.zookeeper_keystore}",
            "-Dzookeeper.ssl.keyStore.type=PEM",
            f"-Dzookeeper.ssl.trustStore.location={self.ca}",
            "-Dzookeeper.ssl.trustStore.type=PEM",
        )

    def bookie_conf(self) -> dict[str, object]:
        """A bookie's server settings: ``START_TLS``, client certificates required, the role authorized.

        Example:
            >>> tls = BookKeeperTls.of(ServerTls.in_directory(Path("/s")), "r")
            >>> tls.bookie_conf()["tlsClientAuthentication"]
            True
        """
        return {
            "tlsProviderFactoryClass": _TLS_PROVIDER,
            "tlsProvider": "JDK",
            "tlsKeyStoreType": "PEM",
            "tlsKeyStore": self.server_key,
            "tlsCertificatePath": self.server_cert,
            "tlsTrustStoreType": "PEM",
            "tlsTrustStore": self.ca,
            "tlsClientAuthentication": True,
            "bookieAuthProviderFactoryClass": "org.apache.bookkeeper.tls.BookieAuthZFactory",
            "authorizedRoles": self.role,
        }

    def client_conf(self) -> dict[str, object]:
        """A BookKeeper client's settings: TLS to the bookies with the role-carrying certificate.

        Example:
            >>> BookKeeperTls.of(ServerTls.in_directory(Path("/s")), "r").client_conf()["tlsKeyStore"]
            PosixPath('/s/bookie-client.key.pem')
        """
        return {
            "tlsProviderFactoryClass": _TLS_PROVIDER,
            "tlsProvider": "JDK",
            "tlsClientAuthentication": True,
            "tlsKeyStoreType": "PEM",
            "tlsKeyStore": self.client_key,
            "tlsCertificatePath": self.client_cert,
            "tlsTrustStoreType": "PEM",
            "tlsTrustStore": self.ca,
        }

    def kazoo_options(self) -> dict[str, Any]:
        """KazooClient arguments for the harness's own ZooKeeper reads of the cluster (mutual TLS).

        Example:
            >>> BookKeeperTls.of(ServerTls.in_directory(Path("/s")), "r").kazoo_options()["use_ssl"]
            True
        """
        return {
            "use_ssl": True,
            "verify_certs": True,
            "ca": str(self.ca),
            "certfile": str(self.server_cert),
            "keyfile": str(self.server_key),
        }
