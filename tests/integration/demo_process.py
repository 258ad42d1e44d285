"""``bkaudit demo`` in a process of its own, as a user runs it, with two changes: the simulated cluster's
ledger password is the one given, so the tests can look for it in the tables; and, with ``--tls``, every
port of the embedded services is probed before the demo stops them.

    python -m tests.integration.demo_process PASSWORD REPORT_FILE [bkaudit arguments ...]

Writes ``{"clusters_with_known_password": n, "listeners": {...}}`` to REPORT_FILE at the end and exits with
the command's exit code. ``listeners`` (with ``--tls``) has, for ZooKeeper and the broker, every port their
process listens on (read from ``/proc``) with whether a TLS handshake with the client pair completes and
what a plaintext request of the service's own protocol got back (``closed``, ``tls-alert`` or
``answered <hex>``); and for each simulated bookie, the status a plaintext ``READ_ENTRY`` was answered with.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
from pathlib import Path
from typing import Any

import bkaudit.sim.cluster
import connectors.devcluster
from bkaudit.cli.main import run

#: A ZooKeeper ConnectRequest (protocol 0, no zxid seen, 10 s timeout, a new session, a zeroed password,
#: not read-only), length-prefixed: a plaintext server answers it with a ConnectResponse.
ZOOKEEPER_CONNECT = struct.pack(">iiqiqi16s?", 45, 0, 0, 10_000, 0, 16, b"\0" * 16, False)
#: A Kafka ApiVersions request (v0, correlation id 1, no client id): a plaintext listener answers it.
KAFKA_API_VERSIONS = bytes.fromhex("0000000a0012000000000001ffff")


def plaintext_answer(port: int, request: bytes, timeout_s: float = 5.0) -> str:
    """What ``request`` sent in plaintext to 127.0.0.1:``port`` got back: ``closed`` (nothing), ``tls-alert``
    (a TLS record: the port speaks TLS only) or ``answered <hex>`` (a plaintext answer)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.sendall(request)
            answer = sock.recv(64)
    except TimeoutError:
        return "closed"  # no answer at all within the wait
    except OSError:
        return "closed"  # reset
    if not answer:
        return "closed"
    if answer[0] == 0x15 and answer[1:2] == b"\x03":  # TLS alert record, version 3.x
        return "tls-alert"
    return f"answered {answer.hex()}"


def probe_services(cluster: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """Every listening port of ZooKeeper's and the broker's processes: TLS handshake and plaintext answer."""
    handshakes = cluster.listeners()
    requests = {"zookeeper": ZOOKEEPER_CONNECT, "kafka": KAFKA_API_VERSIONS}
    return {
        name: {
            str(port): {"tls": tls, "plaintext": plaintext_answer(port, requests[name])}
            for port, tls in ports.items()
        }
        for name, ports in handshakes.items()
    }


def plaintext_read_status(address: str, timeout_s: float = 10.0) -> str:
    """The status a bookie answers a plaintext ``READ_ENTRY`` with (``EUA``: not before TLS and a role)."""
    from connectors.bookie.frames import (
        FrameDecoder,
        encode_frame,
        parse_response,
        read_entry_request,
        status_name,
    )

    host, port = address.rsplit(":", 1)
    decoder = FrameDecoder()
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(encode_frame(read_entry_request(1, 0, txn_id=1)))
        while True:
            data = sock.recv(65536)
            if not data:
                return "closed"
            frames = decoder.feed(data)
            if frames:
                return status_name(parse_response(frames[0]).status)


def main(argv: list[str]) -> int:
    password, report, arguments = argv[0].encode(), Path(argv[1]), argv[2:]
    built: list[bytes | None] = []
    listeners: dict[str, Any] = {}

    class KnownPasswordCluster(bkaudit.sim.cluster.SimulatedCluster):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("password", password)
            built.append(kwargs["password"])
            super().__init__(*args, **kwargs)

        def close(self) -> None:
            if self.bookie_tls is not None and "bookies" not in listeners:
                listeners["bookies"] = _probed(
                    lambda: {b: plaintext_read_status(self.bookie_address(b)) for b in self.bookie_ids()}
                )
            super().close()

    original_down = connectors.devcluster.DevCluster.down

    def down_after_probing(cluster: connectors.devcluster.DevCluster) -> dict[str, bool]:
        if cluster.tls is not None and "zookeeper" not in listeners:
            listeners.update(_probed(lambda: probe_services(cluster)))
        return original_down(cluster)

    bkaudit.sim.cluster.SimulatedCluster = KnownPasswordCluster  # type: ignore[misc]
    connectors.devcluster.DevCluster.down = down_after_probing  # type: ignore[method-assign]
    try:
        return run(arguments)
    finally:
        known = built.count(password)
        report.write_text(json.dumps({"clusters_with_known_password": known, "listeners": listeners}))


def _probed(probe: Any) -> Any:
    try:
        return probe()
    except Exception as err:  # the test reports it; the demo still stops its services
        return {"probe failed": repr(err)}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
