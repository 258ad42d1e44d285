"""Pure audit rules: replicas classification, placement adherence, lost-bookie debounce, grace periods.

Status: stable core. No I/O, no Spark import; inputs are plain values so the CLI, the streaming job and the
simulator apply exactly the same rule.
"""
