"""bkaudit: a continuously running auditor for Apache BookKeeper clusters.

Packages:

- ``bkaudit.domain``: pure BookKeeper formats, schedules, alert vocabulary and, in ``bkaudit.domain.rules``,
  the audit rules (no I/O, no Spark).
- ``bkaudit.cli``: the ``bkaudit`` command.
- ``bkaudit.settings``: typed configuration (``BKAUDIT_`` environment variables, optional file).
- ``bkaudit.testing``: the shipped test harness (embedded services, pytest fixtures, fault helpers).
- ``connectors`` (top-level package): everything that talks to another system.
- ``streaming`` (top-level package): the Spark job.
"""

__version__ = "0.1.0"
