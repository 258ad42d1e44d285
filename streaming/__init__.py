"""The Structured Streaming auditor and the pure audit rules it applies.

``streaming.rules`` is pure (no Spark import, no I/O) and is shared by the job, the CLI and the simulator.
Spark code lives in the other modules of this package and is imported only where a session is needed.
"""
