"""Help text for people: no Python type names (``<list[str]>``) and no reST markup from docstrings.

Typer shows each option's Python type as its value placeholder and copies docstrings verbatim. This
walks the command tree once before it runs: a value placeholder becomes the parameter's name in capitals
(or its choices), and reST literals and roles in help texts become plain text.

Example:
    >>> plain_help("Reads ``offsets/`` (see :class:`~streaming.job.AuditQueries`).")
    'Reads offsets/ (see AuditQueries).'
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def plain_help(text: str | None) -> str | None:
    """``text`` without reST literals (````x````) and roles (``:class:`~a.B```: the last name)."""
    if not text:
        return text
    text = _ROLE.sub(lambda found: found.group(1).rsplit(".", 1)[-1], text)
    return _LITERAL.sub(r"\1", text)


def _placeholder(param: Any) -> str:
    choices = getattr(param, "type_descriptor", None)
    if choices is not None and choices.is_choice and choices.choices:
        return "|".join(str(getattr(c, "value", c)) for c in choices.choices)
    return (param.name or "value").upper()


def tidy_help(command: Any) -> None:
    """Give every value-taking parameter of ``command`` and its subcommands a plain placeholder, and
    plain help texts (in place; parameters that set their own placeholder keep it).

    Example:
        >>> import typer
        >>> from bkaudit.cli.main import app
        >>> command = typer.main.get_command(app)
        >>> tidy_help(command)
        >>> [p.metavar for p in command.commands["status"].params][1]
        'SECONDS'
    """
    command.help = plain_help(command.help)
    command.short_help = plain_help(getattr(command, "short_help", None))
    for param in command.params:
        if hasattr(param, "help"):
            param.help = plain_help(param.help)
        if param.metavar is None and not getattr(param, "is_flag", False):
            param.metavar = _placeholder(param)
        if param.param_type_name == "argument":  # its name is its placeholder: no type after it
            param.display_type_rich = lambda ctx: None
    for sub in getattr(command, "commands", {}).values():
        tidy_help(sub)
