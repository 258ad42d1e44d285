"""pytest fixtures over the real embedded services.

Enable with ``pytest_plugins = ["bkaudit.testing.pytest_plugin"]`` in a ``conftest.py``.

Fixtures:

- ``bk_services`` (session): a started :class:`~bkaudit.testing.ServiceHarness` (ZooKeeper + broker).
- ``zk_chroot`` / ``zk_client`` (test): a fresh chroot and a kazoo client inside it.
- ``kafka_settings`` (test): :class:`~core.settings.KafkaSettings` on the broker with unique topics.
- ``spark`` (module): the shared Spark session from ``streaming.session.build_spark_session``; streaming
  queries still active at the end of a module are stopped. On the Spark line the ``spark-interop`` jars are
  built for, it has them too (:mod:`connectors.delta.spark_interop`: delta-spark and Spark's Kafka source).
- ``lakehouse`` (test): an empty directory for Delta tables.
- ``s3_server`` (session): a real S3 API on 127.0.0.1 (:class:`~bkaudit.testing.s3_server.S3Server`, moto
  in server mode); ``s3_server.new_bucket()`` gives each test a bucket of its own.

When a test that uses the services fails, the tails of the ZooKeeper and broker logs are attached to its
report.

Example:
    >>> # def test_znode(zk_client):
    >>> #     zk_client.create("/x", b"1"); assert zk_client.get("/x")[0] == b"1"
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bkaudit.testing.harness import ServiceHarness

_HARNESS_KEY = pytest.StashKey[ServiceHarness]()


@pytest.fixture(scope="session")
def bk_services(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServiceHarness]:
    harness = ServiceHarness(tmp_path_factory.mktemp("bkaudit-services"))
    harness.start()
    request.config.stash[_HARNESS_KEY] = harness
    try:
        yield harness
    finally:
        harness.stop()


@pytest.fixture
def zk_chroot(bk_services: ServiceHarness) -> str:
    return bk_services.new_chroot()


@pytest.fixture
def zk_client(bk_services: ServiceHarness, zk_chroot: str) -> Iterator[Any]:
    client = bk_services.kazoo_client(zk_chroot)
    try:
        yield client
    finally:
        client.stop()
        client.close()


@pytest.fixture
def kafka_settings(bk_services: ServiceHarness) -> Any:
    return bk_services.kafka_settings()


def _interop_conf() -> dict[str, str]:
    """The ``spark-interop`` jars' configuration when this pyspark can run them, else none (the interop
    tests skip, saying why, or fail to find the delta source): jars are only taken at a session's start."""
    from connectors.delta.spark_interop import interop_conf
    from core.errors import ConfigError, ServiceError

    try:
        return interop_conf()
    except (ConfigError, ServiceError):  # another pyspark line; jars Maven could not copy
        return {}


@pytest.fixture(scope="session")
def _spark_session() -> Iterator[Any]:
    from core.settings import SparkSettings
    from streaming.session import build_spark_session

    session = build_spark_session(
        SparkSettings(
            master=os.environ.get("BKAUDIT_TEST_SPARK_MASTER", "local[2]"),
            shuffle_partitions=2,
            local_nice=0,  # the tests' own session shares the machine with the services they start
            extra_conf=_interop_conf(),
        ),
        for_tests=True,
    )
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def spark(_spark_session: Any) -> Iterator[Any]:
    yield _spark_session
    for query in _spark_session.streams.active:
        query.stop()


@pytest.fixture
def lakehouse(tmp_path: Path) -> Path:
    path = tmp_path / "lakehouse"
    path.mkdir()
    return path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    harness = item.config.stash.get(_HARNESS_KEY, None)
    if report.failed and harness is not None and "bk_services" in getattr(item, "fixturenames", ()):
        for name, tail in harness.log_tails().items():
            report.sections.append((f"{name} log (tail)", tail))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from bkaudit.testing.s3_server import S3Server

    server = S3Server(tmp_path_factory.mktemp("bkaudit-s3"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
