"""The Structured Streaming auditor: decode, stateful processing and the ``foreachBatch`` sink.

The pure audit rules it applies live in :mod:`core.domain.rules` (shared with the CLI and the simulator);
Spark code lives in this package and is imported only where a session is needed.
"""
