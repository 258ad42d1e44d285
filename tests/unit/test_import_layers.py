"""Imports only go downward: the layering rule of CONTRIBUTING.md ("Layers"), checked on the source.

Every module of the product (``bkaudit``, ``connectors``, ``streaming``) and of ``notebooks``/``infra`` is
parsed with :mod:`ast` (nothing is imported); each ``import`` statement, wherever it stands (module level,
inside a function, under ``TYPE_CHECKING``), is an arrow from the module's component to the imported one.
The checks: every module belongs to a component of :data:`LAYERS`; no arrow points to a higher layer; no two
components import each other, directly or round a longer loop; no two modules do; and the ground imports no
I/O or Spark library. A self-test builds a small tree with a wrong-way import, a loop and an impure ground
module, and asserts the checker names each.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = ("core", "connectors", "streaming", "bkaudit", "notebooks", "infra")

#: Components from the bottom layer up. A component may import its own layer or a lower one, never a higher.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "ground: pure formats, rules and vocabulary (no I/O, no Spark)",
        ("core", "core.errors", "core.pb", "core.domain", "core.events"),
    ),
    (
        "process support: configuration, logging, local files, the metrics endpoint",
        ("core.settings", "core.logsetup", "core.localfs", "core.metrics_http"),
    ),
    (
        "connectors: everything that talks to another system",
        (
            "connectors",
            "connectors.process",
            "connectors.delta",
            "connectors.agent",
            "connectors.bookie",
            "connectors.kafka",
            "connectors.zookeeper",
            "connectors.devcluster",
        ),
    ),
    ("streaming: the Spark job", ("streaming",)),
    (
        "entry points: the simulator, the command, the demo, the test harness, notebooks, deployment",
        (
            "bkaudit",
            "bkaudit.sim",
            "bkaudit.demo",
            "bkaudit.cli",
            "bkaudit.testing",
            "bkaudit.settings_docs",
            "notebooks",
            "infra",
        ),
    ),
)

#: Top-level imports the ground never makes: it computes, it does not talk to anything.
GROUND_FORBIDDEN = (
    "pyspark",
    "py4j",
    "deltalake",
    "duckdb",
    "confluent_kafka",
    "kazoo",
    "grpc",
    "prometheus_client",
    "pydantic_settings",
    "socket",
    "subprocess",
    "asyncio",
    "http",
    "urllib.request",
)


def module_name(path: Path, root: Path) -> str:
    """The dotted name of a source file, e.g. ``connectors/delta/__init__.py`` -> ``connectors.delta``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(root: Path, source_roots: Iterable[str] = SOURCE_ROOTS) -> dict[str, Path]:
    """Every Python module under the source roots, by dotted name."""
    return {
        module_name(path, root): path
        for source_root in source_roots
        for path in sorted((root / source_root).rglob("*.py"))
    }


def imported_names(module: str, path: Path, known: Mapping[str, Path]) -> Iterator[tuple[str, int]]:
    """The modules ``module`` imports, with their line: ``from a import b`` is ``a.b`` when that is a module.

    Example: in ``streaming/job.py``, ``from streaming import sink`` yields ``("streaming.sink", line)``.
    """
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield (candidate if candidate in known else base), node.lineno


def component_of(module: str, layers: Sequence[tuple[str, Sequence[str]]] = LAYERS) -> tuple[int, str] | None:
    """(layer index, component) of a module: the longest component name it starts with; None when unplaced.

    Example: ``component_of("connectors.delta.tables")`` is ``(2, "connectors.delta")``.
    """
    matches = [
        (len(component), level, component)
        for level, (_, components) in enumerate(layers)
        for component in components
        if module == component or module.startswith(component + ".")
    ]
    if not matches:
        return None
    _, level, component = max(matches)
    return level, component


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one node (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        part.append(member)
                        if member == node:
                            break
                    if len(part) > 1:
                        found.append(sorted(part))
            elif successor not in index:
                index[successor] = low[successor] = len(index)
                stack.append(successor)
                on_stack.add(successor)
                work.append((successor, iter(sorted(graph.get(successor, ())))))
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
    return sorted(found)


def layering_problems(
    root: Path,
    source_roots: Iterable[str] = SOURCE_ROOTS,
    layers: Sequence[tuple[str, Sequence[str]]] = LAYERS,
) -> list[str]:
    """Every breach of the layering rule under ``root``, one readable line each; empty when the tree keeps it.

    Example: ``layering_problems(ROOT)`` is ``[]`` on this repository.
    """
    known = source_files(root, source_roots)
    problems: list[str] = []
    module_graph: dict[str, set[str]] = defaultdict(set)
    component_graph: dict[str, set[str]] = defaultdict(set)
    for module, path in known.items():
        home = component_of(module, layers)
        if home is None:
            problems.append(f"{module}: in no layer; add its package to LAYERS and to CONTRIBUTING.md")
            continue
        level, component = home
        for target, line in imported_names(module, path, known):
            where = f"{path.relative_to(root)}:{line}"
            if level == 0 and any(target == lib or target.startswith(lib + ".") for lib in GROUND_FORBIDDEN):
                problems.append(f"{where}: the ground ({component}) imports the I/O library {target}")
            target_home = component_of(target, layers)
            if target_home is None:
                continue
            if target_home[0] > level:
                problems.append(
                    f"{where}: wrong-way import {module} -> {target} "
                    f"(layer {level} {component} imports layer {target_home[0]} {target_home[1]})"
                )
            if target in known and target != module:
                module_graph[module].add(target)
            if target_home[1] != component:
                component_graph[component].add(target_home[1])
    problems.extend(f"packages import each other: {' <-> '.join(part)}" for part in cycles(component_graph))
    problems.extend(f"modules import each other: {' <-> '.join(part)}" for part in cycles(module_graph))
    return problems


def test_the_repository_keeps_the_layering_rule():
    assert layering_problems(ROOT) == []


def test_every_layer_names_real_packages():
    known = source_files(ROOT)
    for _, components in LAYERS:
        for component in components:
            assert any(component_of(module, [("", (component,))]) for module in known), component


def test_the_checker_catches_wrong_way_imports_loops_and_an_impure_ground(tmp_path: Path):
    files = {
        "core/__init__.py": "",
        "core/domain/__init__.py": "",
        "core/domain/rules.py": "from streaming import job\n",
        "core/domain/io.py": "def read():\n    import deltalake\n",
        "connectors/__init__.py": "",
        "connectors/kafka/__init__.py": "",
        "connectors/kafka/a.py": "import connectors.delta.b\n",
        "connectors/delta/__init__.py": "",
        "connectors/delta/b.py": "from connectors.kafka import a\n",
        "streaming/__init__.py": "",
        "streaming/job.py": "from core.domain import rules\n",
        "streaming/stray/__init__.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    layers = (
        ("ground", ("core", "core.domain")),
        ("connectors", ("connectors", "connectors.kafka", "connectors.delta")),
        ("streaming", ("streaming.job",)),
    )

    problems = layering_problems(tmp_path, ("core", "connectors", "streaming"), layers)

    assert problems == [
        "core/domain/io.py:2: the ground (core.domain) imports the I/O library deltalake",
        "core/domain/rules.py:1: wrong-way import core.domain.rules -> streaming.job "
        "(layer 0 core.domain imports layer 2 streaming.job)",
        "streaming: in no layer; add its package to LAYERS and to CONTRIBUTING.md",
        "streaming.stray: in no layer; add its package to LAYERS and to CONTRIBUTING.md",
        "packages import each other: connectors.delta <-> connectors.kafka",
        "packages import each other: core.domain <-> streaming.job",
        "modules import each other: connectors.delta.b <-> connectors.kafka.a",
        "modules import each other: core.domain.rules <-> streaming.job",
    ]


def test_from_imports_resolve_to_the_module_they_name(tmp_path: Path):
    (tmp_path / "streaming").mkdir()
    (tmp_path / "streaming" / "__init__.py").write_text("")
    (tmp_path / "streaming" / "sink.py").write_text("")
    job = tmp_path / "streaming" / "job.py"
    job.write_text("from streaming import sink, CONSTANT\nfrom . import sink as again\n")
    known = source_files(tmp_path, ("streaming",))

    assert list(imported_names("streaming.job", job, known)) == [
        ("streaming.sink", 1),
        ("streaming", 1),
        ("streaming.sink", 2),
    ]
