"""Suite-wide fixtures.

``cli`` runs the ``bkaudit`` command in-process (fast, no subprocess) with the given stdin bytes and returns
exit code, stdout bytes and stderr text. The service fixtures (ZooKeeper, broker, Spark) come from the
shipped harness, ``bkaudit.testing.pytest_plugin``.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from hypothesis import settings

from bkaudit.testing.spark_archive import archive_path, driver_options

pytest_plugins = ["bkaudit.testing.pytest_plugin"]

# No per-example deadline: on a shared, loaded machine one example can take 100x its usual time (a test
# then fails for hypothesis' timing, not for the property). Speed is measured in tests/benchmarks.
settings.register_profile("bkaudit", deadline=None)
settings.load_profile("bkaudit")

# Every Spark driver JVM the suite starts (in-process sessions and the job subprocesses, which inherit the
# environment) compiles with C1 only, runs the serial collector and maps a class-data-sharing archive of
# Spark's classes once the session has built it (bkaudit.testing.spark_archive): a test's JVM lives for
# seconds to minutes, and the suite is CPU-bound (docs/journal.md, "The suite's time"). Set
# SPARK_SUBMIT_OPTS to override.
os.environ.setdefault("SPARK_SUBMIT_OPTS", driver_options(archive_path()))
# The embedded ZooKeeper servers too (one per worker's services, per chaos package, per demo, per real
# cluster): C1 and the serial collector, ~2 CPU-seconds a start and stop against ~3 with G1 and C2.
os.environ.setdefault("BKAUDIT_ZOOKEEPER_JAVA_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
_ARCHIVE_BUILD = pytest.StashKey[subprocess.Popen[bytes]]()

# The order modules start in: the long, service-bound suites first, so that with several workers
# (``make test`` runs three) the many short unit modules fill the end instead of one long module running
# alone.
_START_ORDER = ("tests/chaos/", "tests/integration/")
# Modules that read the session's one ``demo_run`` (tests/integration/conftest.py): one worker runs them all,
# so the demo runs once.
_DEMO_RUN_MODULES = frozenset(
    f"tests/integration/{name}.py" for name in ("test_demo", "test_query_demo", "test_notebook_runbook")
)


def _start_rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return next(
        (rank for rank, prefix in enumerate(_START_ORDER) if path.startswith(prefix)), len(_START_ORDER)
    )


def worker_unit(nodeid: str) -> str:
    """What one worker runs whole: a test's module (its module-scoped stack, its file order), or the demo
    run's modules together.

    Example:
        >>> worker_unit("tests/unit/test_rackmap.py::test_facts_example")
        'tests/unit/test_rackmap.py'
        >>> worker_unit("tests/integration/test_query_demo.py::test_x[a]")
        'demo_run'
    """
    path = nodeid.split("::", 1)[0]
    return "demo_run" if path in _DEMO_RUN_MODULES else path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_start_rank)  # stable: each module's tests stay together and in file order


def pytest_sessionstart(session: pytest.Session) -> None:
    """A run with workers (the whole suite) builds the Spark class archive beside its first tests, once
    per machine: drivers started before it is ready run without it."""
    config = session.config
    workers = getattr(config.option, "numprocesses", None)
    if hasattr(config, "workerinput") or not workers or archive_path().exists():
        return
    config.stash[_ARCHIVE_BUILD] = subprocess.Popen(
        [sys.executable, "-m", "bkaudit.testing.spark_archive"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    build = config.stash.get(_ARCHIVE_BUILD, None)
    if build is not None and build.poll() is None:
        build.terminate()  # a short run ended first: the next one builds it
        build.wait(60)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: a run without workers never calls it
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """With workers (``-n``): each :func:`worker_unit` goes to one worker, in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_unit(nodeid)

    return ModuleScheduling(config, log)


@dataclass(frozen=True)
class CliResult:
    exit_code: int
    stdout: bytes
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8")

    def json(self) -> object:
        import json

        return json.loads(self.stdout)


@pytest.fixture
def cli() -> Callable[..., CliResult]:
    """Run ``bkaudit <args>`` in-process: ``cli("metadata", "decode", stdin=b"...")``."""
    from bkaudit.cli.main import run

    def invoke(*args: str, stdin: bytes | str = b"") -> CliResult:
        data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
        out_buffer = io.BytesIO()
        err_buffer = io.BytesIO()
        fake_in = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
        fake_out = io.TextIOWrapper(out_buffer, encoding="utf-8", write_through=True)
        fake_err = io.TextIOWrapper(err_buffer, encoding="utf-8", write_through=True)
        # A private MonkeyPatch: undoing it must not undo the test's own patches (env vars...).
        environment = dict(os.environ)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "stdin", fake_in)
            patch.setattr(sys, "stdout", fake_out)
            patch.setattr(sys, "stderr", fake_err)
            try:
                code = run(list(args))
            except SystemExit as exit_:  # typer may still raise for --help
                code = int(exit_.code or 0)
            finally:
                fake_out.flush()
                fake_err.flush()
                # What the command put in the environment (--set, --config, --dev's addresses and TLS
                # files) is the command's, as in its own process: a later test in this worker must not
                # inherit it (a Kafka client told to speak TLS to a plaintext broker retries for minutes).
                os.environ.clear()
                os.environ.update(environment)
        return CliResult(code, out_buffer.getvalue(), err_buffer.getvalue().decode("utf-8"))

    return invoke


@pytest.fixture
def restored_environment() -> Iterator[None]:
    """The process environment as it was before the test (the CLI's --config and --set write to it)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
