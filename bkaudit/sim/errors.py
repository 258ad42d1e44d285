"""Errors of the simulator; all are :class:`~core.errors.BkauditError`, so the CLI exits 2 with one line.

Example:
    >>> from core.errors import BkauditError
    >>> issubclass(NotEnoughBookiesError, SimulatorError) and issubclass(SimulatorError, BkauditError)
    True
"""

from __future__ import annotations

from core.errors import BkauditError

__all__ = ["NotEnoughBookiesError", "SimulatorError", "UnknownEntityError"]


class SimulatorError(BkauditError):
    """An operation the simulated cluster cannot perform (bad state, bad argument, ZooKeeper refused)."""


class UnknownEntityError(SimulatorError, KeyError):
    """A bookie or ledger reference that names nothing in the simulated cluster."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "unknown entity"


class NotEnoughBookiesError(SimulatorError, ValueError):
    """Fewer eligible bookies than an ensemble needs (BookKeeper's ``BKNotEnoughBookiesException``)."""
