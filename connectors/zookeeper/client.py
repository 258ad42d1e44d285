"""The ZooKeeper connection every bkaudit client opens: kazoo's options, TLS checked before connecting.

kazoo's layers are the protocol (its connection thread, the wire format), the client (a session with
retries) and recipes on top; this module is bkaudit's way into the client layer, shared by the watcher
(:mod:`connectors.zookeeper.watcher`), the admin reads, the job's lease and the simulator:

* :func:`kazoo_client_options`: the client's keyword arguments (auth unwrapped only here, kazoo's log
  records passed through the secret filter, reconnection retried forever, :class:`PollingHandler`);
* :func:`check_tls` and :func:`start_client`: a refused TLS handshake or a ZooKeeper that does not answer
  becomes one line naming the address and the setting, instead of kazoo's endless retries;
* :func:`unreadable_znode`: the one line for a znode ZooKeeper refused to read.

Example:
    >>> from core.settings import Settings
    >>> options = kazoo_client_options(Settings(zookeeper={"auth_scheme": "digest", "auth_username": "bk",
    ...                                                    "auth_password": "pw"}).zookeeper)
    >>> options["auth_data"], options["logger"].name
    ([('digest', 'bk:pw')], 'connectors.zookeeper.client.kazoo')
"""

from __future__ import annotations

import logging
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from connectors.tls import client_context, explain_refusal, first_refusal
from connectors.zookeeper.handler import PollingHandler
from core.domain.addresses import parse_zookeeper_connect
from core.errors import ConfigError, ServiceError
from core.logsetup import SECRET_FILTER
from core.settings import ZooKeeperSettings


def _kazoo_logger(secret: str | None) -> logging.Logger:
    # kazoo's clients log through this logger; the shared secret filter applies to every record they emit
    # (znode payloads and Auth credentials included), whatever handlers the process has.
    kazoo_logger = logging.getLogger(f"{__name__}.kazoo")
    if SECRET_FILTER not in kazoo_logger.filters:
        kazoo_logger.addFilter(SECRET_FILTER)
    SECRET_FILTER.add_secret(secret)
    return kazoo_logger


def kazoo_client_options(
    settings: ZooKeeperSettings, hosts: str | None = None, *, inline_callbacks: bool = False
) -> dict[str, Any]:
    """KazooClient keyword arguments for ``settings`` (auth unwrapped here only; never log the result).

    Reconnection retries forever with a short back-off, so a restarted ZooKeeper is rejoined quickly. The
    client logs through a logger that redacts credentials (kazoo itself would print Auth requests), and
    waits on its sockets with one ``poll`` call (:class:`~connectors.zookeeper.handler.PollingHandler`;
    ``inline_callbacks``: watch callbacks run on kazoo's connection thread, for callbacks that never block).

    Example:
        >>> kazoo_client_options(ZooKeeperSettings(connect="zk1:2181/bk"))["hosts"]
        'zk1:2181/bk'
        >>> kazoo_client_options(ZooKeeperSettings(auth_scheme="sasl"))["sasl_options"]
        {'mechanism': 'GSSAPI'}
    """
    options: dict[str, Any] = {
        "hosts": hosts or settings.connect,
        "timeout": settings.session_timeout_s,
        "connection_retry": {"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 2.0},
        "handler": PollingHandler(inline_callbacks=inline_callbacks),
    }
    password = settings.auth_password.get_secret_value() if settings.auth_password is not None else None
    if settings.auth_scheme == "digest":
        if not settings.auth_username or password is None:
            raise ConfigError("zookeeper.auth_scheme=digest needs auth_username and auth_password")
        options["auth_data"] = [("digest", f"{settings.auth_username}:{password}")]
    elif settings.auth_scheme == "sasl":
        if settings.auth_username and password is not None:
            options["sasl_options"] = {
                "mechanism": "DIGEST-MD5",
                "username": settings.auth_username,
                "password": password,
            }
        else:  # Kerberos from the process' ticket cache
            options["sasl_options"] = {"mechanism": "GSSAPI"}
    options.update(kazoo_tls_options(settings))
    options["logger"] = _kazoo_logger(password)
    return options


def kazoo_tls_options(settings: ZooKeeperSettings) -> dict[str, Any]:
    """The KazooClient TLS keyword arguments of ``settings`` (empty without ``use_tls``), for clients built
    elsewhere (the simulator's sessions); the key password is registered with the secret filter.

    Example:
        >>> kazoo_tls_options(ZooKeeperSettings())
        {}
        >>> kazoo_tls_options(ZooKeeperSettings(use_tls=True))["verify_certs"]
        True
    """
    if not settings.use_tls:
        return {}
    key_password = settings.tls_keyfile_password
    secret = key_password.get_secret_value() if key_password is not None else None
    SECRET_FILTER.add_secret(secret)
    return {
        "use_ssl": True,
        "verify_certs": True,
        "check_hostname": settings.tls_check_hostname,
        "ca": str(settings.tls_cafile) if settings.tls_cafile is not None else None,
        "certfile": str(settings.tls_certfile) if settings.tls_certfile is not None else None,
        "keyfile": str(settings.tls_keyfile) if settings.tls_keyfile is not None else None,
        "keyfile_password": secret,
    }


def check_tls(settings: ZooKeeperSettings, hosts: str, timeout_s: float) -> None:
    """With ``use_tls``: load the TLS files and make one handshake with the first host that answers; a
    problem is one :class:`ConfigError` (files, key password, expired client certificate) or
    :class:`ServiceError` (the server refused: wrong CA, missing or refused client certificate) line.

    kazoo itself would retry a refused handshake until the connect timeout, saying only "no connection".

    Example:
        >>> check_tls(ZooKeeperSettings(), "127.0.0.1:2181", 1.0)  # use_tls off: nothing to check
    """
    if not settings.use_tls:
        return
    key_password = settings.tls_keyfile_password
    context = client_context(
        "zookeeper.tls_",
        settings.tls_cafile,
        settings.tls_certfile,
        settings.tls_keyfile,
        key_password.get_secret_value() if key_password is not None else None,
        check_hostname=settings.tls_check_hostname,
    )
    # "srvr" is the four-letter word ZooKeeper answers by default: with TLS 1.3 a refused client
    # certificate shows only at the first read.
    servers = parse_zookeeper_connect(hosts)[0]
    refused = first_refusal(context, servers, min(timeout_s, 10.0), hello=b"srvr")
    if refused is not None:
        host, port, reason = refused
        sent = settings.tls_certfile is not None
        hint = explain_refusal(reason, "zookeeper.tls_", sent_certificate=sent)
        raise ServiceError(f"ZooKeeper at {host}:{port}: TLS refused ({reason}): {hint}")


def start_client(
    client: KazooClient, settings: ZooKeeperSettings, hosts: str, setting: str, timeout_s: float
) -> None:
    """Start ``client``, waiting at most ``timeout_s``; no answer becomes one :class:`ServiceError` line
    naming the address and ``setting`` (the hosts string carries no credentials, so it is safe to print).

    Example:
        >>> # start_client(KazooClient(**kazoo_client_options(zk)), zk, zk.connect, "zookeeper.connect", 10)
    """
    check_tls(settings, hosts, timeout_s)
    try:
        client.start(timeout=timeout_s)
    except (client.handler.timeout_exception, KazooException) as err:
        # kazoo's own text ("Connection time-out") names neither the address nor what to do.
        what = "no connection" if isinstance(err, client.handler.timeout_exception) else type(err).__name__
        auth = "" if settings.auth_scheme == "none" else f" and the {settings.auth_scheme} credentials"
        auth += " and zookeeper.use_tls (TLS port?)" if settings.use_tls else ""
        raise ServiceError(
            f"ZooKeeper at {hosts}: {what} within {timeout_s:g} s; check {setting} "
            f"(BKAUDIT_{setting.upper().replace('.', '__')}), that ZooKeeper is up and reachable from "
            f"this host{auth}"
        ) from None


def unreadable_znode(settings: ZooKeeperSettings, path: str, err: KazooException) -> ServiceError:
    """The error for a znode ZooKeeper refused to read (NoAuth, usually: creator-only ACLs).

    Example:
        >>> from kazoo.exceptions import NoAuthError
        >>> str(unreadable_znode(ZooKeeperSettings(), "/ledgers/LAYOUT", NoAuthError()))[:60]
        'ZooKeeper at 127.0.0.1:2181: cannot read /ledgers/LAYOUT (No'
    """
    return ServiceError(
        f"ZooKeeper at {settings.connect}: cannot read {path} ({type(err).__name__}); "
        "check zookeeper.auth_scheme and its credentials (BKAUDIT_ZOOKEEPER__AUTH_*) and the znode's ACL"
    )


__all__ = ["check_tls", "kazoo_client_options", "kazoo_tls_options", "start_client", "unreadable_znode"]
