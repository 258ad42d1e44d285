"""``kazoo_client_options`` with ``zookeeper.use_tls``: every kazoo client gets the CA, the client pair and
the key password, and the key password is registered with the secret filter (never logged)."""

from __future__ import annotations

from pathlib import Path

from connectors.zookeeper.watcher import kazoo_client_options
from core.logsetup import SECRET_FILTER
from core.settings import ZooKeeperSettings


def test_tls_settings_reach_kazoo_and_the_key_password_is_a_secret():
    settings = ZooKeeperSettings(
        use_tls=True,
        tls_cafile=Path("/etc/zk/ca.pem"),
        tls_certfile=Path("/etc/zk/client.pem"),
        tls_keyfile=Path("/etc/zk/client.key"),
        tls_keyfile_password="Zk-key-pw-1",
    )

    options = kazoo_client_options(settings)

    assert (options["use_ssl"], options["verify_certs"], options["check_hostname"]) == (True, True, False)
    assert (options["ca"], options["certfile"], options["keyfile"]) == (
        "/etc/zk/ca.pem",
        "/etc/zk/client.pem",
        "/etc/zk/client.key",
    )
    assert options["keyfile_password"] == "Zk-key-pw-1"
    assert "Zk-key-pw-1" in SECRET_FILTER.secrets
    assert "Zk-key-pw-1" not in repr(settings)


def test_plaintext_by_default():
    assert "use_ssl" not in kazoo_client_options(ZooKeeperSettings())
