"""The streaming job's internal row contracts: decoded changes (processor input) and decisions (its output).

Stage 1 — ``decode`` turns each Kafka record (changes topic or feedback topic) into one :data:`CHANGE_SCHEMA`
row; an undecodable record becomes a ``dead_letter`` row, never an exception.
Stage 2 — ``AuditProcessor`` (transformWithStateInPandas, grouped by ``state_key``) turns them into
:data:`DECISION_SCHEMA` rows.
Stage 3 — the ``foreachBatch`` sink applies decisions to the Delta tables, probes bookies and publishes
alerts and feedback.

``payload`` is a compact JSON object whose keys depend on ``kind``; :data:`CHANGE_KINDS` and
:data:`DECISION_KINDS` document each. Keeping one JSON column (instead of a wide sparse schema) keeps the
Arrow batches small and lets the three stages evolve independently.

Example:
    >>> CHANGE_SCHEMA.fieldNames()[:3]
    ['state_key', 'kind', 'event_time']
"""

from __future__ import annotations

from pyspark.sql.types import (
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

CHANGE_SCHEMA = StructType(
    [
        StructField("state_key", StringType(), False),  # "cluster", "ledgers/<bucket>" or "dead"
        StructField("kind", StringType(), False),  # see CHANGE_KINDS
        StructField("event_time", TimestampType(), False),  # watcher clock (feedback: the timer's time)
        StructField("cluster", StringType(), True),
        StructField("run_id", StringType(), True),  # watcher run (feedback: "feedback")
        StructField("sequence", LongType(), True),  # order within a run
        StructField("snapshot_id", StringType(), True),
        StructField("ledger_id", LongType(), True),
        StructField("bookie_id", StringType(), True),
        StructField("payload", StringType(), True),  # JSON, per kind
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        # The watermark's column: event_time, but null for dead letters. Spark drops input rows older than
        # the watermark; a null is never older, so an undecodable record (stamped with its Kafka time, which
        # may be behind the watcher's clock) still reaches the sink, through the same single read of Kafka.
        StructField("watermark_time", TimestampType(), True),
    ]
)

CHANGE_KINDS = {
    "bookie_status": "payload: {status, rpc_address, host, port, has_cookie, registration_error}",
    "bookie_probe": "payload: {answered, address, detail}",
    "ledger_upserted": "payload: metadata without password + "
    "{mzxid, version, znode_ctime_ms, znode_mtime_ms, path}",
    "ledger_deleted": "payload: {last_mzxid, inferred}",
    "ledger_undecodable": "payload: {reason, mzxid, version, path, data_length}",
    "under_replication_mark": "payload: {state: SET|CLEARED, replicas, mark_ctime_ms, mzxid, inferred}",
    "recovery_delay": "payload: {seconds (or null), present, mzxid}",
    "rack_map": "payload: {racks: {bookie: rack|null}, hostnames: {bookie: host}, groups: {bookie: "
    "affinity group}, error}",
    "auto_recovery_state": "payload: {disabled, disabled_ctime_ms, auditor (lowest vote's bookie id, null: "
    "no vote), votes, locks: [[ledger_id, holder, ctime_ms]], checks: {check ctime znode: last completion "
    "ms}, error}",
    "snapshot_begin": "payload: {snapshot_id, reason, mode, partition, partition_count}",
    "snapshot_end": "payload: {snapshot_id, complete, mode, partition, partition_count, partition_events}",
    "heartbeat": "payload: {partition}",
    "probe_result": "feedback: {round, reason, outcome: {result, min_replicas, worst_entries, unknown, "
    "unresponsive, unresolved, answers}, metadata_changed, mzxid}",
    "dead_letter": "payload: {reason, source: kafka|future, key_b64, value_b64 (the record's bytes, absent "
    "when they may hold a ledger password)}",
}

DECISION_SCHEMA = StructType(
    [
        StructField("kind", StringType(), False),  # see DECISION_KINDS
        StructField("event_time", TimestampType(), False),
        StructField("cluster", StringType(), True),
        StructField("ledger_id", LongType(), True),
        StructField("bookie_id", StringType(), True),
        StructField("payload", StringType(), True),  # JSON, per kind
        StructField("topic", StringType(), True),  # source of a dead letter
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
    ]
)

DECISION_KINDS = {
    "ledger_state": "a newer ledger version to apply: payload as ledger_upserted (+ snapshot_id)",
    "ledger_seen": "a stale or duplicate read of an existing ledger (live, or by a snapshot): payload "
    "{snapshot_id (or null)}",
    "ledger_deleted": "the ledger is gone: payload {last_mzxid, inferred}",
    "ledger_corrupt": "the ledger znode is undecodable: payload {reason, mzxid, version, path, data_length}",
    "under_replication": "urL mark changed: payload {state, replicas, mark_ctime_ms}",
    "under_replication_stuck": "a mark outlived the grace period: payload {mark_ctime_ms, grace_s, replicas}",
    "bookie_state": "a bookie's membership: payload {status, rpc_address, host, port, has_cookie, "
    "cookie (czxid:sha256 of the last cookie seen), cookie_changed_ms, missing_since_ms, lost, flaps; "
    "cookie_replaced: true on the decision that saw the cookie replaced}",
    "bookie_lost": "a missing bookie is now lost: payload {missing_since_ms}",
    "bookie_returned": "a lost bookie registered again: payload {missing_since_ms}",
    "bookie_flapped": "a missing bookie came back before the delay: payload {missing_since_ms, flaps}",
    "recovery_delay": "lostBookieRecoveryDelay in force: payload {seconds}",
    "autorecovery_alert": "an AutoRecovery health condition fired or cleared (ledger_id set for "
    "REPLICATION_STALLED): payload {kind, firing, detail}",
    "rack_map": "the rack map changed: payload {racks, moved: [bookies whose rack changed since the last "
    "valid map], groups: {bookie: affinity group}}, or {error} when the current map is invalid (placement "
    "unknown)",
    "snapshot_complete": "a complete FULL snapshot on one partition: payload {snapshot_id, partition, "
    "partition_count, begin_ms (event time of its begin; null when the job did not read it)}",
    "probe_request": "re-probe a suspect ledger now: payload {round, reason}",
    "replicas_confirmed": "a suspect stayed failing for the configured rounds: payload {round, outcome}",
    "replicas_cleared": "a suspect probed healthy again: payload {round}",
    "dead_letter": "an input that could not be processed: payload as the dead_letter change",
}
