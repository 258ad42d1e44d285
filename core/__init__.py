"""The ground floor of bkaudit: what every other package builds on, and which imports none of them.

- ``core.domain``: pure BookKeeper formats, layouts, schedules, the alert vocabulary and, in
  ``core.domain.rules``, the audit rules (no I/O, no Spark).
- ``core.pb``: code generated from ``proto/`` (BookKeeper's messages, the change events, the agent).
- ``core.events``, ``core.errors``: the change events as Python values, and the error types.
- ``core.settings``, ``core.logsetup``, ``core.localfs``, ``core.metrics_http``: typed configuration
  (``BKAUDIT_`` environment variables, an optional file), logging, local files, the metrics endpoint.

Above it: ``connectors`` (everything that talks to another system), ``streaming`` (the Spark job), and
``bkaudit`` (the command, the simulator, the demo, the test harness).

Example:
    >>> from core.domain.alerts import AlertKind
    >>> AlertKind("BOOKIE_LOST").name
    'BOOKIE_LOST'
"""
