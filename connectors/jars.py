"""The JVM components bkaudit starts or hands to Spark, as jars copied by Maven from the project's POMs.

Each component has a POM of its own under ``infra/jars/<component>/pom.xml`` (so that the Kafka clients,
ZooKeeper and Netty versions of two components never mix). :func:`ensure_jars` copies a component's jars with
``mvn dependency:copy-dependencies`` into ``<jars root>/<component>/`` and reuses them while the POM is
unchanged (a stamp holds the POM's hash). Maven, not Ivy: ``spark.jars.packages`` ignores Maven's mirror
settings. A coordinate the registry refuses stops the fetch with one line naming it.

The jars root is ``$BKAUDIT_JARS_DIR``, else ``.jars`` beside ``infra/`` in a clone.

Example:
    >>> sorted(COMPONENTS)
    ['bookkeeper', 'kafka', 'spark-interop']
    >>> pom_path("kafka").name
    'pom.xml'
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from core.errors import ConfigError, ServiceError

#: The components with a POM under ``infra/jars``.
COMPONENTS = ("bookkeeper", "kafka", "spark-interop")

_REPO_ROOT = Path(__file__).resolve().parents[1]
_STAMP = ".pom-sha256"
_MVN_TIMEOUT_S = 900.0
#: Terminal colour codes, which some Maven installations print even in batch mode.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")

#: Maven's ways of saying that one coordinate could not be had (the first match names it).
_MISSING_PATTERNS = (
    re.compile(r"Could not resolve dependencies for project \S+: (\S+) was not found"),
    re.compile(r"Could not find artifact (\S+)"),
    re.compile(r"Failure to find (\S+)"),
    re.compile(r"Could not transfer artifact (\S+)"),
    re.compile(r"Missing:\s*-+\s*1\)\s*(\S+)"),
    re.compile(r"Non-resolvable import POM: .*? (\S+:\S+:\S+)"),
)


def jars_root() -> Path:
    """Where the components' jar folders live: ``$BKAUDIT_JARS_DIR``, else ``.jars`` in the clone.

    Example:
        >>> jars_root().name in {".jars", os.environ.get("BKAUDIT_JARS_DIR", ".jars").rsplit("/", 1)[-1]}
        True
    """
    configured = os.environ.get("BKAUDIT_JARS_DIR")
    return Path(configured).absolute() if configured else _REPO_ROOT / ".jars"


def pom_path(component: str) -> Path:
    """The POM of ``component`` (one of :data:`COMPONENTS`).

    Example:
        >>> pom_path("bookkeeper").parent.name
        'bookkeeper'
    """
    if component not in COMPONENTS:
        raise ConfigError(f"unknown JVM component {component!r} (one of: {', '.join(COMPONENTS)})")
    return _REPO_ROOT / "infra" / "jars" / component / "pom.xml"


def jar_dir(component: str) -> Path:
    """The folder that holds ``component``'s jars once :func:`ensure_jars` ran.

    Example:
        >>> jar_dir("kafka").name
        'kafka'
    """
    pom_path(component)  # validates the name
    return jars_root() / component


def classpath(component: str) -> str:
    """A ``java -cp`` value for ``component``, fetching its jars first when they are missing or stale.

    Example:
        >>> # subprocess.run(["java", "-cp", classpath("kafka"), "kafka.Kafka", "server.properties"])
    """
    return f"{ensure_jars(component)}/*"


def missing_coordinate(maven_output: str) -> str | None:
    """The coordinate Maven's output says it could not resolve, or None when it names none.

    Example:
        >>> missing_coordinate("[ERROR] ... Could not find artifact io.delta:delta-spark_2.13:jar:9.9 in x")
        'io.delta:delta-spark_2.13:jar:9.9'
        >>> missing_coordinate("BUILD SUCCESS") is None
        True
    """
    for pattern in _MISSING_PATTERNS:
        match = pattern.search(_ANSI_ESCAPE.sub("", maven_output))
        if match:
            return match.group(1).rstrip(",.:")
    return None


def _pom_digest(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def _is_current(target: Path, digest: str) -> bool:
    stamp = target / _STAMP
    try:
        return stamp.read_text().strip() == digest and any(target.glob("*.jar"))
    except OSError:
        return False


@contextmanager
def _fetch_lock(root: Path) -> Iterator[None]:
    """One fetch at a time per jars root (two test workers may ask for the same component at once)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _mvn_binary() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ServiceError(
            "Maven (mvn) is not on PATH: it copies the JVM components' jars (apt-get install maven, or "
            "run infra/bootstrap.sh, which installs it)"
        )
    return mvn


def _run_maven(component: str, pom: Path, staging: Path) -> None:
    argv = [
        _mvn_binary(),
        "-B",
        "-q",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={staging}",
        "-DincludeScope=runtime",
        "-Dstyle.color=never",
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_MVN_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise ServiceError(
            f"fetching the {component} jars: Maven did not finish in {_MVN_TIMEOUT_S:.0f} s ({pom})"
        ) from None
    if done.returncode != 0:
        output = _ANSI_ESCAPE.sub("", f"{done.stdout}\n{done.stderr}")
        coordinate = missing_coordinate(output)
        first_error = next((line for line in output.splitlines() if "[ERROR]" in line), "").strip()
        what = f"cannot resolve {coordinate}" if coordinate else first_error or f"mvn exit {done.returncode}"
        raise ServiceError(f"fetching the {component} jars from {pom}: {what}")


def ensure_jars(component: str) -> Path:
    """Copy ``component``'s jars (once per POM version) and return their folder.

    Example:
        >>> # ensure_jars("bookkeeper")  ->  PosixPath('<clone>/.jars/bookkeeper'), fetched once
    """
    pom = pom_path(component)
    if not pom.is_file():
        raise ServiceError(
            f"no POM for the {component} jars at {pom}: run from a clone of bkaudit, or set "
            f"BKAUDIT_JARS_DIR to a folder that holds {component}/ with its jars"
        )
    return copy_jars(pom, jar_dir(component), component)


def copy_jars(pom: Path, target: Path, what: str) -> Path:
    """Copy the runtime jars ``pom`` names into ``target`` unless a stamp says they are there already.

    The copy lands in a staging folder renamed into place, so a fetch cut short leaves nothing half done.

    Example:
        >>> # copy_jars(pom_path("kafka"), jar_dir("kafka"), "kafka")  ->  the folder, copied at most once
    """
    digest = _pom_digest(pom)
    if _is_current(target, digest):
        return target
    with _fetch_lock(target.parent):
        if _is_current(target, digest):
            return target
        staging = target.with_name(f".{target.name}.staging")
        shutil.rmtree(staging, ignore_errors=True)
        _run_maven(what, pom, staging)
        (staging / _STAMP).write_text(digest + "\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m connectors.jars [COMPONENT ...]``: fetch (default: all) and print each folder."""
    from core.errors import BkauditError

    names = (argv if argv is not None else sys.argv[1:]) or list(COMPONENTS)
    try:
        for name in names:
            print(f"{name}: {ensure_jars(name)}")
    except BkauditError as err:
        print(f"jars: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
