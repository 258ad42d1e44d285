"""Budgets a test can assert without depending on the machine's speed.

"Without expanding the set" or "without allocating" is a property of the code, not of the clock: a bound on
the memory the block allocated (``tracemalloc``'s peak) holds on a loaded machine as on a quiet one, while
a bound on the elapsed time does not. Speed targets go to ``tests/benchmarks`` instead.

Example:
    >>> with allocation_peak() as peak:
    ...     _ = bytearray(1 << 20)
    >>> (1 << 20) <= peak.bytes < (2 << 20)
    True
"""

from __future__ import annotations

import contextlib
import dataclasses
import tracemalloc
from collections.abc import Iterator


@dataclasses.dataclass
class Peak:
    """The most bytes Python had allocated at once inside an :func:`allocation_peak` block, above its start.

    Example:
        >>> Peak().bytes
        0
    """

    bytes: int = 0


@contextlib.contextmanager
def allocation_peak() -> Iterator[Peak]:
    """Trace Python's allocations inside the block; ``peak.bytes`` is set when it ends.

    Example:
        >>> with allocation_peak() as peak:
        ...     pass
        >>> peak.bytes < 4096
        True
    """
    peak = Peak()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    start, _ = tracemalloc.get_traced_memory()
    try:
        yield peak
    finally:
        _, top = tracemalloc.get_traced_memory()
        peak.bytes = max(0, top - start)
        if not was_tracing:
            tracemalloc.stop()
