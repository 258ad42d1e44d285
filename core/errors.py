"""Typed errors shared by every layer.

Every decoder raises a subclass of :class:`FormatError` for bad input, and the CLI turns any
:class:`BkauditError` into exit code 2 with a one-line message. Nothing else should escape a parser.

Example:
    >>> from core.errors import FormatError
    >>> try:
    ...     raise FormatError("ledger metadata: empty input")
    ... except FormatError as err:
    ...     str(err)
    'ledger metadata: empty input'
"""


class BkauditError(Exception):
    """Base class of every error this project raises on purpose."""


class FormatError(BkauditError, ValueError):
    """Input bytes or text that cannot be decoded (truncated, random, hostile, wrong version)."""


class ConfigError(BkauditError):
    """A setting that is missing, contradictory or unusable."""


class ServiceError(BkauditError):
    """An external service could not be started, reached or stopped."""


class NotFoundError(BkauditError, LookupError):
    """Something named that does not exist: a lakehouse directory, a Delta table, a ledger."""


class InvalidArgumentError(BkauditError, ValueError):
    """An argument a command or query does not accept (an unknown kind, a group-by key, a negative limit)."""
