"""`bkaudit watch --log-level DEBUG` against the real ZooKeeper and broker: no secret in any log line.

The watcher runs as the operator runs it (its own process, the CLI's logging setup), with ZooKeeper digest
credentials, a Kafka SASL password and an SSL key password in its settings (the embedded broker speaks
PLAINTEXT, so the SASL settings only travel to the client construction; a client may log its configuration
at DEBUG, as kafka-python's admin client did), a secret-looking librdkafka property in kafka.extra_config
and librdkafka's debug lines on, and reads a ledger whose password is a known marker (kazoo logs every
response at DEBUG). Everything it prints is searched for each secret.
"""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest

from tests.integration.event_fixtures import run_watch_once
from tests.integration.test_watcher import PASSWORD, ClusterTree

pytestmark = pytest.mark.integration

ZK_SECRET = "zk-digest-secret-5e7b"
SASL_SECRET = "sasl-secret-0c4d"
SSL_SECRET = "ssl-key-secret-9a1f"
OAUTH_SECRET = "oauth-client-secret-3b8e"


def test_watch_at_debug_logs_no_secret(bk_services: Any, zk_chroot: str, tmp_path: Any) -> None:
    client = bk_services.kazoo_client(zk_chroot)
    try:
        tree = ClusterTree(client).init()
        for ledger_id in (1, 2, 3):
            tree.create_ledger(ledger_id)
    finally:
        client.stop()
        client.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKAUDIT_")}
    env.update(
        {
            "BKAUDIT_ZOOKEEPER__AUTH_SCHEME": "digest",
            "BKAUDIT_ZOOKEEPER__AUTH_USERNAME": "auditor",
            "BKAUDIT_ZOOKEEPER__AUTH_PASSWORD": ZK_SECRET,
            "BKAUDIT_KAFKA__SASL_MECHANISM": "PLAIN",
            "BKAUDIT_KAFKA__SASL_USERNAME": "bkaudit",
            "BKAUDIT_KAFKA__SASL_PASSWORD": SASL_SECRET,
            "BKAUDIT_KAFKA__SSL_PASSWORD": SSL_SECRET,
            # A librdkafka property passed through, secret-looking; and librdkafka's own debug lines on.
            "BKAUDIT_KAFKA__EXTRA_CONFIG": (
                f'{{"sasl.oauthbearer.client.secret": "{OAUTH_SECRET}", "debug": "conf,broker"}}'
            ),
            "BKAUDIT_WATCHER__PROGRESS": "off",
        }
    )
    done = run_watch_once(
        bk_services.zookeeper_hosts(zk_chroot),
        bk_services.kafka_bootstrap,
        bk_services.unique_topic("secrets"),
        "--watch-mode",
        "fallback",  # one read per ledger: each response is its own kazoo record
        env=env,
        cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    text = output.decode("utf-8", "replace")
    assert done.returncode == 0, text[-3000:]
    forbidden = {
        "ledger password": PASSWORD,
        "ledger password (base64)": base64.b64encode(PASSWORD),
        "ledger password (hex)": PASSWORD.hex().encode(),
        "ZooKeeper password": ZK_SECRET.encode(),
        "SASL password": SASL_SECRET.encode(),
        "SSL key password": SSL_SECRET.encode(),
        "extra_config secret": OAUTH_SECRET.encode(),
    }
    leaked = [name for name, secret in forbidden.items() if secret in output]
    assert not leaked, f"in the DEBUG output: {leaked}"
    # librdkafka's own lines reach Python logging (through the secret filter), and they were asked for.
    assert "connectors.kafka.librdkafka" in text
    assert "Received response" in text and "bytes>" in text  # kazoo's responses, payloads as lengths
    assert "Auth(" in text  # kazoo's auth request, credentials redacted
