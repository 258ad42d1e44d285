"""bkaudit: a continuously running auditor for Apache BookKeeper clusters; this package is its top floor.

- ``bkaudit.cli``: the ``bkaudit`` command.
- ``bkaudit.sim``: the cluster simulator with fault injection and ground truth.
- ``bkaudit.testing``: the shipped test harness (embedded services, pytest fixtures, fault helpers).
- ``bkaudit.demo``, ``bkaudit.settings_docs``: the demo and the settings reference.

Below it, each importing only what lies lower: ``streaming`` (the Spark job), ``connectors`` (everything
that talks to another system) and ``core`` (pure formats, rules and vocabulary; configuration).

Example:
    >>> import bkaudit
    >>> bkaudit.__version__
    '0.1.0'
"""

__version__ = "0.1.0"
