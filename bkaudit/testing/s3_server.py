"""A real S3 API on 127.0.0.1 for tests: moto in server mode, one process per test session.

The server keeps its objects in memory; each test takes a bucket of its own (:meth:`S3Server.new_bucket`)
and its :class:`~core.settings.ObjectStoreSettings` (:meth:`S3Server.object_store`).

Example:
    >>> import tempfile
    >>> server = S3Server(tempfile.mkdtemp())
    >>> server.running
    False
"""

from __future__ import annotations

import itertools
import sys
import uuid
from pathlib import Path

import pyarrow.fs as pafs

from connectors.process import LOOPBACK, ManagedProcess, free_port, port_open
from core.settings import ObjectStoreSettings

#: moto accepts any credentials; these are what the tests configure (never real ones).
ACCESS_KEY_ID = "bkaudit-test"
SECRET_ACCESS_KEY = "bkaudit-test-secret"
REGION = "us-east-1"
_START_TIMEOUT_S = 120.0


class S3Server:
    """One ``moto.server`` process on a free loopback port, owned by the test session.

    Example:
        >>> # server = S3Server("/tmp/s3"); server.start(); url = server.new_bucket()  # "s3://t-1-…"
    """

    def __init__(self, state_dir: str | Path) -> None:
        self.state_dir = Path(state_dir)
        self.port = 0
        self._process = ManagedProcess("moto-s3", self.state_dir, marker="moto.server")
        self._counter = itertools.count(1)
        self.running = False

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> None:
        """Start the server and wait until it answers on its port."""
        self.port = free_port()
        argv = [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(self.port)]
        self._process.start(argv)
        self._process.wait_until(lambda: port_open(self.port), _START_TIMEOUT_S, "listening")
        self.running = True

    def stop(self) -> None:
        self._process.stop()
        self.running = False

    def object_store(self, lakehouse_url: str | None = None) -> ObjectStoreSettings:
        """The settings that reach this server (plain http, the test credentials)."""
        return ObjectStoreSettings(
            lakehouse_url=lakehouse_url,
            endpoint_url=self.endpoint_url,
            region=REGION,
            access_key_id=ACCESS_KEY_ID,
            secret_access_key=SECRET_ACCESS_KEY,
            allow_http=True,
        )

    def new_bucket(self) -> str:
        """Create a fresh bucket and return its ``s3://`` URL."""
        name = f"t-{next(self._counter)}-{uuid.uuid4().hex[:8]}"
        fs = pafs.S3FileSystem(
            access_key=ACCESS_KEY_ID,
            secret_key=SECRET_ACCESS_KEY,
            region=REGION,
            endpoint_override=f"{LOOPBACK}:{self.port}",
            scheme="http",
            allow_bucket_creation=True,
        )
        fs.create_dir(name)
        return f"s3://{name}"
