"""Pure audit rules: replicas classification, placement adherence, lost-bookie debounce and verdicts,
re-probe rounds, event-time bounds, and the conditions the sink evaluates per ledger.

No I/O, no Spark import; inputs are plain values (or Arrow columns, for the rules applied to many ledgers
at once) so the CLI, the streaming job and the simulator apply exactly the same rule.
"""
