"""A TCP forwarder on 127.0.0.1 that a test can take down and bring back on the same port.

Put in front of a server that keeps its state in memory (the S3 test server), it models that server being
down without losing what it holds: :meth:`TcpProxy.refuse` closes the listening socket and every forwarded
connection (a client then gets "connection refused", as from a stopped server), :meth:`TcpProxy.accept`
listens again on the same port. Freezing the server itself (SIGSTOP) models a hung one instead: connections
are accepted by the kernel and never answered. :class:`ProxyProcess` runs the proxy in a process of its
own: in the test's process its threads would wait for the GIL while delta-rs holds it through a blocking
request.

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
import signal
import socket
import subprocess
import sys
import threading
import time

from connectors.process import LOOPBACK, free_port, port_open


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


class ProxyProcess:
    """A :class:`TcpProxy` in a child process (``python -m bkaudit.testing.tcp_proxy TARGET PORT``):
    SIGUSR1 makes it refuse, SIGUSR2 accept again; each call returns once the port shows it.

    Example:
        >>> # proxy = ProxyProcess(target_port).start(); proxy.refuse(); proxy.accept(); proxy.stop()
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> ProxyProcess:
        argv = [sys.executable, "-m", "bkaudit.testing.tcp_proxy", str(self.target_port), str(self.port)]
        self._process = subprocess.Popen(argv)
        self._wait(True)
        return self

    def refuse(self) -> None:
        self._signal(signal.SIGUSR1)
        self._wait(False)

    def accept(self) -> None:
        self._signal(signal.SIGUSR2)
        self._wait(True)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(10)

    def _signal(self, signum: int) -> None:
        assert self._process is not None and self._process.poll() is None, "the proxy is not running"
        self._process.send_signal(signum)

    def _wait(self, listening: bool, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while port_open(self.port) != listening:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the proxy on {self.port} did not {'listen' if listening else 'refuse'}")
            time.sleep(0.05)


def _serve(target_port: int, port: int) -> None:
    """The child's main: forward until SIGTERM; SIGUSR1 refuses, SIGUSR2 accepts again."""
    proxy = TcpProxy(target_port, port).start()
    signal.signal(signal.SIGUSR1, lambda *_: proxy.refuse())
    signal.signal(signal.SIGUSR2, lambda *_: proxy.accept())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
