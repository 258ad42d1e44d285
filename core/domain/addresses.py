"""Service addresses as operators write them: ZooKeeper connect strings and Kafka bootstrap lists.

A malformed address must be refused when the settings are read (one line, exit 2), not deep inside a client
library as a traceback. The rules follow what the clients accept: kazoo splits ``host[:port],...[/chroot]``
(port 2181 when absent), kafka-python ``host[:port],...`` (port 9092 when absent); IPv6 hosts go in
brackets. Pure code: no I/O, no name resolution (a well-formed name that does not resolve is a connection
error, reported by the command that connects).

Example:
    >>> parse_zookeeper_connect("zk1:2181,zk2/pulsar")
    ([('zk1', 2181), ('zk2', 2181)], '/pulsar')
    >>> parse_bootstrap_servers("[::1]:9093,k2")
    [('::1', 9093), ('k2', 9092)]
    >>> parse_zookeeper_connect("not-a-host:xx")
    Traceback (most recent call last):
    ...
    ValueError: 'not-a-host:xx' is not host[:port]: port 'xx' is not a number from 1 to 65535
"""

from __future__ import annotations

import re

_HOST_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?$")
_IPV6 = re.compile(r"^[0-9A-Fa-f:.]+(?:%[\w.-]+)?$")


def parse_host_port(text: str, default_port: int) -> tuple[str, int]:
    """``host[:port]`` (``[v6]:port`` for IPv6) as ``(host, port)``; ValueError says what is wrong.

    Example:
        >>> parse_host_port("10.0.0.1:2182", 2181), parse_host_port("[fe80::1]", 2181)
        (('10.0.0.1', 2182), ('fe80::1', 2181))
    """
    item = text.strip()
    if item.startswith("["):
        host, bracket, rest = item[1:].partition("]")
        if not bracket or not _IPV6.match(host):
            raise ValueError(f"{text!r} is not host[:port]: bad IPv6 address in brackets")
        if rest and not rest.startswith(":"):
            raise ValueError(f"{text!r} is not host[:port]: unexpected {rest!r} after the address")
        port_text = rest[1:] if rest else None
    else:
        host, colon, port_text_found = item.rpartition(":")
        if not colon:
            host, port_text = item, None
        else:
            port_text = port_text_found
        if ":" in host:
            raise ValueError(f"{text!r} is not host[:port]: write an IPv6 address in brackets, [addr]:port")
        if not _HOST_NAME.match(host):
            raise ValueError(f"{text!r} is not host[:port]: {host!r} is not a host name or address")
    if port_text is None:
        return host, default_port
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r} is not host[:port]: port {port_text!r} is not a number from 1 to 65535")
    return host, int(port_text)


def _host_list(text: str, default_port: int, what: str) -> list[tuple[str, int]]:
    items = text.split(",")
    if not text.strip() or any(not item.strip() for item in items):
        raise ValueError(f"{what} {text!r} has an empty host (expected host[:port],host[:port],...)")
    return [parse_host_port(item, default_port) for item in items]


def parse_zookeeper_connect(text: str) -> tuple[list[tuple[str, int]], str | None]:
    """A ZooKeeper connect string as ``(hosts, chroot)``, as kazoo reads it.

    Example:
        >>> parse_zookeeper_connect("127.0.0.1:2181")
        ([('127.0.0.1', 2181)], None)
        >>> parse_zookeeper_connect("zk1:2181/a//b")
        Traceback (most recent call last):
        ...
        ValueError: chroot '/a//b' is not a ZooKeeper path (empty, '.' or '..' part, or a trailing '/')
    """
    hosts_text, slash, chroot_text = text.partition("/")
    hosts = _host_list(hosts_text, 2181, "ZooKeeper connect string")
    if not slash or not chroot_text:
        return hosts, None
    chroot = "/" + chroot_text
    if any(part in ("", ".", "..") for part in chroot.split("/")[1:]):
        raise ValueError(
            f"chroot {chroot!r} is not a ZooKeeper path (empty, '.' or '..' part, or a trailing '/')"
        )
    return hosts, chroot


def parse_bootstrap_servers(text: str) -> list[tuple[str, int]]:
    """A Kafka bootstrap list as ``[(host, port), ...]``.

    Example:
        >>> parse_bootstrap_servers("k1:9092,k2:9092")
        [('k1', 9092), ('k2', 9092)]
    """
    return _host_list(text, 9092, "Kafka bootstrap list")
