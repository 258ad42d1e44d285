"""The Prometheus rules and the Grafana dashboard with runbook links that work from Alertmanager and Grafana.

The files in ``infra/`` link the runbooks by their path in this repository (``docs/alerts.md#...``), which
neither Alertmanager nor Grafana can open. :func:`rules_with_docs_base` makes every ``runbook_url`` absolute
under the URL where the docs are published; :func:`dashboard_with_docs_base` sets the dashboard's ``docs``
variable, which its links use (``${docs}/docs/alerts.md``), so a dashboard already imported can also be
pointed elsewhere from Grafana's variable settings. ``bkaudit config monitoring`` writes both.

Example:
    >>> rules = "annotations:\\n  runbook_url: docs/alerts.md#bkauditwatcherdown\\n"
    >>> print(rules_with_docs_base(rules, "https://git.example.com/bkaudit/-/blob/main/"), end="")
    annotations:
      runbook_url: https://git.example.com/bkaudit/-/blob/main/docs/alerts.md#bkauditwatcherdown
"""

from __future__ import annotations

import re
from copy import deepcopy
from typing import Any
from urllib.parse import urlsplit

from core.errors import InvalidArgumentError, NotFoundError

DOCS_VARIABLE = "docs"
_RUNBOOK_PATH = re.compile(r"^(\s*runbook_url:\s*)(docs/\S+)\s*$", flags=re.MULTILINE)


def docs_base(url: str) -> str:
    """``url`` without its trailing slash, checked to be an absolute http(s) URL.

    Example:
        >>> docs_base("https://docs.example.com/bkaudit/")
        'https://docs.example.com/bkaudit'
        >>> docs_base("docs.example.com")
        Traceback (most recent call last):
        ...
        core.errors.InvalidArgumentError: --docs-base-url: 'docs.example.com' is not an absolute http(s) URL
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidArgumentError(f"--docs-base-url: {url!r} is not an absolute http(s) URL")
    return url.rstrip("/")


def rules_with_docs_base(rules_yaml: str, base_url: str) -> str:
    """The rules file's text with each ``runbook_url: docs/...`` under ``base_url``; comments kept.

    Example:
        >>> rules_with_docs_base("x: 1\\n", "https://d.example")  # no runbook: nothing to rewrite
        Traceback (most recent call last):
        ...
        core.errors.NotFoundError: no runbook_url under docs/ in the rules: is this bkaudit's rules file?
    """
    base = docs_base(base_url)
    text, count = _RUNBOOK_PATH.subn(lambda match: f"{match.group(1)}{base}/{match.group(2)}", rules_yaml)
    if count == 0:
        raise NotFoundError("no runbook_url under docs/ in the rules: is this bkaudit's rules file?")
    return text


def dashboard_with_docs_base(dashboard: dict[str, Any], base_url: str) -> dict[str, Any]:
    """A copy of the dashboard whose ``docs`` variable (the links' base) is ``base_url``.

    Example:
        >>> board = {"templating": {"list": [{"name": "docs", "type": "textbox", "query": ""}]}}
        >>> dashboard_with_docs_base(board, "https://d.example/")["templating"]["list"][0]["query"]
        'https://d.example'
    """
    base = docs_base(base_url)
    board = deepcopy(dashboard)
    variables = [v for v in board["templating"]["list"] if v["name"] == DOCS_VARIABLE]
    if not variables:
        raise NotFoundError(f"the dashboard has no ${DOCS_VARIABLE} variable: is this bkaudit's dashboard?")
    for variable in variables:
        variable["query"] = base
        variable["current"] = {"selected": False, "text": base, "value": base}
        variable["options"] = [{"selected": True, "text": base, "value": base}]
    return board
