"""Pure BookKeeper domain code: byte-exact formats, ZooKeeper layouts and striping schedules.

Status: stable core. Nothing in this package performs I/O or imports Spark, kazoo, kafka or the
``connectors`` package; it is shared by the CLI, the watcher, the streaming job and the simulator.
"""
