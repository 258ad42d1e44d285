"""The processor's grouping keys (``state_key``): which state group a decoded change belongs to.

Pure (no Spark import), shared by the decoder (which assigns keys) and the processor (which reads them).

Example:
    >>> CLUSTER_STATE_KEY, ledger_state_key(130, 64), DEAD_LETTER_STATE_KEY
    ('cluster', 'ledgers/2', 'dead')
"""

from __future__ import annotations

#: Membership, the recovery delay and the rack map: one group for the whole cluster.
CLUSTER_STATE_KEY = "cluster"
#: Undecodable records share one group; the processor passes them through untouched (no state).
DEAD_LETTER_STATE_KEY = "dead"
LEDGER_STATE_KEY_PREFIX = "ledgers/"
#: Pulsar's managed ledgers and cursors: passed by the ledger lane to the sink's topics stage (no timers).
MANAGED_LEDGER_STATE_KEY = "managed-ledgers"


def ledger_state_key(ledger_id: int, buckets: int) -> str:
    """The state group of a ledger: ledgers share ``buckets`` groups (ledger id modulo ``buckets``).

    One group per ledger would cost Spark a Python round trip per ledger per micro-batch; a bucket keeps the
    few ledgers that need state (suspects, marks) in a map state, so a batch costs one call per *touched
    bucket* and state calls only for those ledgers.

    Example:
        >>> ledger_state_key(130, 64)
        'ledgers/2'
    """
    return f"{LEDGER_STATE_KEY_PREFIX}{ledger_id % buckets}"
