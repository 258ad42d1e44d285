"""A TCP forwarder on 127.0.0.1 that a test can take down and bring back on the same port.

Put in front of a server that keeps its state in memory (the S3 test server), it models that server being
down without losing what it holds: :meth:`TcpProxy.refuse` closes the listening socket and every forwarded
connection (a client then gets "connection refused", as from a stopped server), :meth:`TcpProxy.accept`
listens again on the same port. Freezing the server itself (SIGSTOP) models a hung one instead: connections
are accepted by the kernel and never answered.

Example:
    >>> import socket, threading
    >>> backend = socket.create_server(("127.0.0.1", 0)); port = backend.getsockname()[1]
    >>> def echo():
    ...     conn, _ = backend.accept(); conn.sendall(conn.recv(5)); conn.close()
    >>> threading.Thread(target=echo, daemon=True).start()
    >>> proxy = TcpProxy(port).start()
    >>> with socket.create_connection(("127.0.0.1", proxy.port)) as client:
    ...     client.sendall(b"hello"); client.recv(5)
    b'hello'
    >>> proxy.refuse()
    >>> try:
    ...     socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
    ... except ConnectionRefusedError:
    ...     print("refused")
    refused
    >>> proxy.close(); backend.close()
"""

from __future__ import annotations

import contextlib
import socket
import threading

from connectors.process import LOOPBACK


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``127.0.0.1:<target_port>`` (a free port unless ``port`` is given)."""

    def __init__(self, target_port: int, port: int = 0) -> None:
        self.target_port = target_port
        self.port = port
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._accepting = threading.Event()

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> TcpProxy:
        self.accept()
        return self

    def accept(self) -> None:
        """Listen (again) on the proxy's port and forward every new connection."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._accepting.set()
        threading.Thread(target=self._accept_loop, args=(listener,), name="tcp-proxy", daemon=True).start()

    def refuse(self) -> None:
        """Stop listening and cut every forwarded connection: the port refuses connections until
        :meth:`accept`."""
        self._accepting.clear()
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            cut, self._open = self._open, set()
        for sock in cut:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.refuse()

    def _accept_loop(self, listener: socket.socket) -> None:
        while self._accepting.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return  # refused: the listener was closed
            try:
                upstream = socket.create_connection((LOOPBACK, self.target_port), timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if not self._accepting.is_set():
                    client.close()
                    upstream.close()
                    return
                self._open |= {client, upstream}
            # One thread per direction: a side that sends while the other does too never blocks both.
            threading.Thread(target=self._copy, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._copy, args=(upstream, client), daemon=True).start()

    def _copy(self, source: socket.socket, target: socket.socket) -> None:
        """Copy bytes from ``source`` to ``target`` until either side closes; then close both."""
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open -= {source, target}
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
