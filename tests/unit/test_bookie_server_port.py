"""A simulated bookie that is stopped keeps its port for its restart (real sockets on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from connectors.bookie.server import BookieServer, InMemoryEntryStore


def _bind_plainly(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", port))


def test_a_stopped_bookie_refuses_connections_and_no_other_socket_takes_its_port() -> None:
    async def scenario() -> None:
        server = BookieServer(InMemoryEntryStore())
        await server.start()
        port = server.port
        await server.stop()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        with pytest.raises(OSError):  # held for the restart (without it, anything could bind it now)
            _bind_plainly(port)
        await server.start()
        assert server.port == port
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        await server.stop(keep_port=False)
        _bind_plainly(port)  # released for good

    asyncio.run(scenario())
