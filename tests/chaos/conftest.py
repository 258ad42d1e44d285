"""Fixtures of the chaos suite: its own embedded ZooKeeper and broker, one stack per module, the seed.

The suite stops, restarts and freezes its broker, so it does not share the session's ``bk_services``: one
private :class:`~bkaudit.testing.ServiceHarness` serves the whole package. ``stack`` is one
:class:`~tests.chaos.stack.ChaosStack` per module (simulator, watcher and job; a module may set
``STACK_OPTIONS`` for :func:`~tests.chaos.stack.chaos_stack`); its scenarios run on it in file order, each
starting from a stack that equals the ground truth. Every random choice (kill moments, churn, victims)
comes from ``chaos_seed`` (``CHAOS_SEED`` in the environment, else a fixed default); a failing test's
report carries the seed to replay it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from bkaudit.testing.harness import ServiceHarness
from tests.chaos.stack import ChaosStack, chaos_stack

DEFAULT_SEED = 20261124
_SEED_KEY = pytest.StashKey[int]()


@pytest.fixture(scope="package")
def chaos_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceHarness]:
    harness = ServiceHarness(tmp_path_factory.mktemp("chaos-services"))
    harness.start()
    try:
        yield harness
    finally:
        harness.stop()


@pytest.fixture(scope="module")
def chaos_seed(request: pytest.FixtureRequest) -> int:
    seed = int(os.environ.get("CHAOS_SEED", DEFAULT_SEED))
    request.config.stash[_SEED_KEY] = seed
    return seed


@pytest.fixture(scope="module")
def stack(
    chaos_services: ServiceHarness,
    chaos_seed: int,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[ChaosStack]:
    options = getattr(request.module, "STACK_OPTIONS", {})
    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    with chaos_stack(chaos_services, tmp_path_factory.mktemp(name), chaos_seed, **options) as built:
        yield built


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    seed = item.config.stash.get(_SEED_KEY, None)
    if report.failed and seed is not None:
        report.sections.append(("chaos seed", f"CHAOS_SEED={seed} replays this run's random choices"))
