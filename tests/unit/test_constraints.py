"""The tested dependency set is the installed one: constraints.txt pins every distribution bkaudit needs
(with its dev and notebooks extras), and this environment runs exactly those versions."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

CONSTRAINTS = Path(__file__).resolve().parents[2] / "constraints.txt"
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;]+)$")


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = _PIN.match(line.strip())
        assert match, f"constraints.txt: {line!r} is not an exact pin (name==version)"
        pins[canonicalize_name(match["name"])] = match["version"]
    return pins


def _needed(root: str, extras: set[str]) -> set[str]:
    """Every distribution ``root`` with ``extras`` installs, following requirements and their markers."""
    needed: set[str] = set()
    pending: list[tuple[str, set[str]]] = [(root, extras)]
    while pending:
        name, wanted = pending.pop()
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            applies = requirement.marker is None or any(
                requirement.marker.evaluate({"extra": extra}) for extra in (wanted or {""})
            )
            child = canonicalize_name(requirement.name)
            if not applies:
                continue
            if child == canonicalize_name(root):  # an extra naming its own package (bkaudit[notebooks])
                pending.append((root, set(requirement.extras)))
                continue
            if child not in needed:
                needed.add(child)
                pending.append((child, set(requirement.extras)))
    return needed


def test_every_line_is_an_exact_pin() -> None:
    assert len(_pins()) > 20


def test_every_needed_distribution_is_pinned_and_installed_at_its_pin() -> None:
    pins = _pins()
    needed = _needed("bkaudit", {"dev", "notebooks"})
    assert {"pyspark", "deltalake", "pyarrow", "kazoo"} <= needed
    unpinned = sorted(needed - set(pins))
    assert not unpinned, f"needed but not in constraints.txt (run `make lock`): {unpinned}"
    drifted = {
        name: (pins[name], metadata.version(name)) for name in needed if metadata.version(name) != pins[name]
    }
    assert not drifted, f"installed versions differ from constraints.txt (pinned, installed): {drifted}"
