"""How fast this machine is right now: a fixed amount of CPU work, timed, for the benchmarks' JSON lines.

The load average counts runnable threads, not how fast a core runs them. On a shared virtual machine the
host's other tenants can slow every core without raising the load average (the same replay's single-
threaded ingest took 45 s one afternoon and 80 s that night at a load of 1). A benchmark prints this
probe beside its figures, so runs taken hours apart can be compared: a figure that moved with the probe
moved with the machine.

The probe is best-of-three of each part, so a single preemption does not count:

- ``python_ms``: a pure-Python loop (the interpreter: the driver lane, the watcher, the sink's glue);
- ``numpy_ms``: sorting a fixed array of four million floats (columnar work, memory bandwidth).

Example:
    >>> probe = machine_probe_ms(scale=0.01)
    >>> sorted(probe), all(value > 0 for value in probe.values())
    (['numpy_ms', 'python_ms'], True)
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

#: Loop turns of the Python part at scale 1 (~80 ms on the 2-core development machine).
PYTHON_TURNS = 2_000_000
#: Floats sorted by the numpy part at scale 1.
SORTED_FLOATS = 4_000_000


def machine_probe_ms(scale: float = 1.0) -> dict[str, float]:
    """Milliseconds of the two fixed workloads (best of three each); lower is a faster machine.

    Example:
        >>> machine_probe_ms(scale=0.01)["python_ms"] < 1000
        True
    """
    turns = max(1, int(PYTHON_TURNS * scale))
    floats = np.random.default_rng(7).random(max(1, int(SORTED_FLOATS * scale)))
    return {
        "python_ms": _best_of_three(lambda: _python_loop(turns)),
        "numpy_ms": _best_of_three(lambda: np.sort(floats)),
    }


def _python_loop(turns: int) -> int:
    total = 0
    for i in range(turns):
        total += i ^ (i >> 3)
    return total


def _best_of_three(work: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 1)


__all__ = ["machine_probe_ms"]
