"""Pure BookKeeper domain code: byte-exact formats, ZooKeeper layouts, striping schedules, the alert
vocabulary (:mod:`~core.domain.alerts`, :mod:`~core.domain.alert_book`) and the audit rules
(:mod:`core.domain.rules`).

Nothing in this package performs I/O or imports Spark, kazoo, kafka, the ``connectors`` or the
``streaming`` package; it is shared by the CLI, the watcher, the streaming job and the simulator.
"""
