"""ZooKeeper over mutual TLS: the embedded ZooKeeper serves a secureClientPort only (client certificates
required, no plaintext port); bkaudit's clients (``kazoo_client_options`` + ``start_client``: the watcher, the
lease, the admin reads, ``status``) connect with the CA, a client certificate and an encrypted key, and each
refusal (wrong CA, missing client certificate, expired certificate, wrong key password) is one line naming
the setting: no traceback, no secret in the output or the logs."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from bkaudit.testing.tls import TlsFiles, write_throwaway_ca
from connectors.process import listening_ports, port_open
from connectors.tls import ServerTls
from connectors.zookeeper.embedded import EmbeddedZooKeeper
from connectors.zookeeper.watcher import kazoo_client_options, start_client
from core.settings import ZooKeeperSettings

pytestmark = pytest.mark.integration

Cli = Callable[..., Any]
WRONG_PASSWORD = "Wr0ng-zk-key-password"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return write_throwaway_ca(tmp_path_factory.mktemp("zk-tls"))


@pytest.fixture(scope="module")
def tls_zookeeper(tls: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedZooKeeper]:
    server = ServerTls(tls.ca, tls.server_keystore, tls.client_cert, tls.client_key)
    zookeeper = EmbeddedZooKeeper(tmp_path_factory.mktemp("zk-tls-state"), heap="256m", tls=server)
    zookeeper.start(timeout=120)
    try:
        yield zookeeper
    finally:
        zookeeper.stop()


def _env(tls: TlsFiles, **override: str | Path | None) -> dict[str, str | Path | None]:
    values: dict[str, str | Path | None] = {
        "use_tls": "true",
        "tls_cafile": tls.ca,
        "tls_certfile": tls.client_cert,
        "tls_keyfile": tls.client_key_encrypted,
        "tls_keyfile_password": tls.key_password,
        "connect_timeout_s": "60",
    }
    return {**values, **override}


def _set_env(monkeypatch: pytest.MonkeyPatch, values: dict[str, str | Path | None]) -> None:
    for key, value in values.items():
        name = f"BKAUDIT_ZOOKEEPER__{key.upper()}"
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, str(value))


def _bookies_list(cli: Cli, zookeeper: EmbeddedZooKeeper) -> Any:
    return cli("bookies", "list", "--format", "json", "--zookeeper", zookeeper.address)


def test_admin_reads_over_mutual_tls_and_no_plaintext_port(
    cli: Cli, tls: TlsFiles, tls_zookeeper: EmbeddedZooKeeper, monkeypatch: pytest.MonkeyPatch
):
    settings = ZooKeeperSettings.model_validate({**_env(tls), "connect": tls_zookeeper.address})
    client = KazooClient(**kazoo_client_options(settings))
    start_client(client, settings, settings.connect, "zookeeper.connect", 60.0)
    try:
        client.create("/ledgers/available/bookie-tls-1:3181", b"", makepath=True)
    finally:
        client.stop()
        client.close()
    _set_env(monkeypatch, _env(tls))

    result = _bookies_list(cli, tls_zookeeper)

    assert result.exit_code == 0, result.stderr
    assert b"bookie-tls-1:3181" in result.stdout
    pid = tls_zookeeper.pid()
    assert pid is not None and listening_ports(pid) == {tls_zookeeper.port}
    assert "clientPort=" not in tls_zookeeper.config_file.read_text().replace("secureClientPort=", "")


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"tls_cafile": "other_ca"}, "not signed by a CA in zookeeper.tls_cafile"),
        ({"tls_certfile": None, "tls_keyfile": None}, "requires a client certificate"),
        ({"tls_certfile": "expired_cert", "tls_keyfile": "expired_key"}, "certfile: the client certificate"),
        ({"tls_keyfile_password": WRONG_PASSWORD}, "zookeeper.tls_keyfile: cannot load"),
    ],
    ids=["wrong-ca", "no-client-certificate", "expired-certificate", "wrong-key-password"],
)
def test_each_refusal_is_one_line_without_secrets(
    cli: Cli,
    tls: TlsFiles,
    tls_zookeeper: EmbeddedZooKeeper,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    override: dict[str, str | None],
    expected: str,
):
    files = {
        key: getattr(tls, value) if value in TlsFiles.__dataclass_fields__ else value
        for key, value in override.items()
    }
    _set_env(monkeypatch, _env(tls, **files))
    caplog.set_level(logging.DEBUG)

    result = _bookies_list(cli, tls_zookeeper)

    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    for secret in (tls.key_password, WRONG_PASSWORD):
        assert secret not in result.stderr and secret not in caplog.text
    assert port_open(tls_zookeeper.port)  # the server is still up: it was the client that was refused
