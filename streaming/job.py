"""The streaming auditor (``bkaudit stream``): two driver lanes and one Structured Streaming query.

- The ledger lane (:mod:`streaming.ledger_lane`, a driver thread): ``changes + feedback + decisions topics →
  columnar apply → sink`` (:mod:`streaming.sink`): ledgers, placement, probes, snapshots, the rack map. It
  forwards only the changes of ledgers that need a timer (suspects, under-replication marks) to the tracked
  topic.
- The timers query (Structured Streaming): ``tracked + feedback topics → decode → watermark →
  transformWithStateInPandas`` (:mod:`streaming.processor`) → the decisions topic, read back by the lane:
  re-probe rounds and grace periods in event time.
- The membership lane (:mod:`streaming.membership`, a driver thread): the changes topic's membership
  partition: registrations, the recovery delay, a lost bookie's alerts.

The lanes share one :class:`~streaming.loss.LossAuditor` (the lost-bookie alerts' only owner) and one alert
producer; see docs/design.md ("What runs where", "The commit protocol") for why state, timers and
idempotency sit where they do.

Example:
    >>> from core.settings import Settings
    >>> processor_config(Settings().stream).reprobe_rounds
    3
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connectors import storage
from connectors.bookie.tls import bookie_tls_config
from connectors.kafka.publisher import MEMBERSHIP_PARTITION_KEY, partition_for_key
from core.domain.rules.autorecovery import AutoRecoveryGraces
from core.domain.rules.lost_bookie import DisruptionRule
from core.errors import BkauditError, ConfigError, ServiceError
from core.localfs import writable_directory
from core.logsetup import step
from core.settings import Settings, StreamSettings
from streaming.decode import decode_batches
from streaming.driver_batches import DriverMicroBatches, LaneStates, OffsetLog
from streaming.membership import QUERY_NAME as MEMBERSHIP_QUERY_NAME
from streaming.membership import (
    SKIPPED_KEY_PREFIXES,
    MembershipLane,
    MembershipLaneConfig,
    MembershipStateStore,
)
from streaming.processor import ProcessorConfig, make_processor
from streaming.restarting_query import RestartingQuery
from streaming.schemas import CHANGE_SCHEMA, DECISION_SCHEMA
from streaming.session import start_at_driver_priority
from streaming.sink import AuditSink, SinkConfig
from streaming.sink_queue import SinkQueue
from streaming.spark_checkpoint import discard_temporary_files, discard_unplanned_first_batch
from streaming.topics import TopicsConfig

if TYPE_CHECKING:
    from connectors.agent.client import AgentConfig

logger = logging.getLogger(__name__)


def processor_config(stream: StreamSettings, *, membership: bool = True) -> ProcessorConfig:
    return ProcessorConfig(
        membership=membership,
        default_recovery_delay_s=stream.default_recovery_delay_s,
        reprobe_delay_s=stream.reprobe_delay_s,
        reprobe_rounds=stream.reprobe_rounds,
        reprobe_max_delay_s=stream.reprobe_max_delay_s,
        confirmed_recheck_s=stream.confirmed_recheck_s,
        under_replication_grace_s=stream.under_replication_grace_s,
        autorecovery=AutoRecoveryGraces(
            disabled_s=stream.autorecovery_disabled_grace_s,
            auditor_missing_s=stream.auditor_missing_grace_s,
            lock_held_s=stream.replication_lock_grace_s,
            checks_overdue_s=stream.auditor_checks_overdue_grace_s,
            check_all_ledgers_interval_s=stream.auditor_periodic_check_interval_s,
            placement_policy_check_interval_s=stream.auditor_periodic_placement_policy_check_interval_s,
            replicas_check_interval_s=stream.auditor_periodic_replicas_check_interval_s,
            lagging_s=stream.auditor_lagging_grace_s,
        ),
        disruption=DisruptionRule(
            settle_s=stream.zookeeper_disruption_settle_s,
            grace_s=stream.zookeeper_disruption_grace_s,
            share=stream.zookeeper_disruption_share,
        ),
    )


def sink_config(settings: Settings, changes_partitions: int) -> SinkConfig:
    stream = settings.stream
    return SinkConfig(
        lakehouse_root=settings.lakehouse,
        app_id=stream.app_id,
        kafka=settings.kafka,
        cluster_default=settings.cluster or "unknown",
        placement=stream.placement_policy_config(),
        probe_timeout_s=stream.probe_timeout_s,
        probe_concurrency=stream.probe_concurrency,
        entry_checks=stream.entry_checks,
        entry_checks_by_bookie=tuple(sorted(stream.entry_checks_by_bookie.items())),
        entry_read_sample_percent=stream.entry_read_sample_percent,
        entry_reads_per_s_per_bookie=stream.entry_reads_per_s_per_bookie,
        scrutiny_ledgers_per_s=stream.scrutiny_ledgers_per_s,
        scrutiny_pass_s=stream.scrutiny_pass_s,
        scrutiny_on_close=stream.scrutiny_on_close,
        scrutiny_max_per_batch=stream.scrutiny_max_per_batch,
        scrutiny_state_dir=storage.join(settings.checkpoint, "sink"),
        topics=TopicsConfig(
            enabled=settings.pulsar.follow_managed_ledgers,
            managed_ledgers_path=settings.pulsar.managed_ledgers_path,
            missing_grace_s=settings.pulsar.missing_grace_s,
            orphan_grace_s=settings.pulsar.orphan_grace_s,
        ),
        topics_state_dir=storage.join(settings.checkpoint, "sink", "topics"),
        maintenance_every_batches=stream.maintenance_every_batches,
        changes_partitions=changes_partitions,
        ledger_fold_interval_s=stream.ledger_fold_interval_s,
        ledger_table_buckets=stream.ledger_table_buckets,
        ledger_fold_ticks=stream.ledger_fold_ticks,
        ledger_vacuum_rounds=stream.ledger_vacuum_rounds,
        ledger_changes_retention_hours=stream.ledger_changes_retention_hours,
        maintenance_retention_hours=stream.maintenance_retention_hours,
        index_cleanup_bookies_per_batch=stream.index_cleanup_bookies_per_batch,
        index_cleanup_interval_s=stream.index_cleanup_interval_s,
        index_append_interval_s=stream.index_append_interval_s,
        agents=agent_config(settings),
        bookie_tls=bookie_tls_config(settings.bookie),
    )


def agent_config(settings: Settings) -> AgentConfig | None:
    """How the sink reaches the configured bookie-side agents; None when none is configured."""
    agent = settings.agent
    if not agent.addresses:
        return None
    if agent.token is None:
        raise ConfigError("agent.addresses is set but agent.token is not: every call to an agent carries it")
    from connectors.agent.client import AgentConfig

    return AgentConfig(
        addresses=tuple(sorted(agent.addresses.items())),
        token=agent.token.get_secret_value() if agent.token is not None else "",
        ca_file=agent.tls_ca_file,
        server_name=agent.tls_server_name,
        insecure=agent.insecure,
        timeout_s=agent.timeout_s,
    )


def ensure_topics(settings: Settings) -> int:
    """Create the job's topics when absent; returns the changes topic's partitions."""
    from connectors.kafka.topics import ensure_topic

    kafka = settings.kafka
    partitions = ensure_topic(kafka, kafka.changes_topic)
    ensure_topic(kafka, kafka.feedback_topic)
    ensure_topic(kafka, kafka.alerts_topic)
    ensure_topic(kafka, kafka.tracked_topic)
    ensure_topic(kafka, kafka.decisions_topic)
    return partitions


def kafka_source_options(settings: Settings, topics: list[str], status_file: Path) -> dict[str, str]:
    """The Kafka source's options for ``topics`` (every lane reads with the same ones).

    Example:
        >>> options = kafka_source_options(Settings(), ["bkaudit.changes"], Path("/tmp/status.json"))
        >>> options["subscribe"], options["failOnDataLoss"]
        ('bkaudit.changes', 'true')
    """
    kafka, stream = settings.kafka, settings.stream
    if stream.source_format == "kafka" and kafka.security_protocol != "PLAINTEXT":
        # The Python source builds its clients from the kafka.* settings; the JVM one would need them all
        # translated (key stores, JAAS), which is not done: refuse rather than connect without them.
        raise ConfigError(
            f"stream.source_format=kafka (Spark's JVM source) does not get kafka.security_protocol="
            f"{kafka.security_protocol} and its settings; use stream.source_format=bkaudit_kafka"
        )
    return {
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        "subscribe": ",".join(topics),
        "startingOffsets": "earliest",
        "failOnDataLoss": "true",
        "kafka.request.timeout.ms": str(kafka.request_timeout_ms),
        "bkaudit.brokerOutageLimitS": str(stream.broker_outage_limit_s),
        "bkaudit.statusFile": str(status_file),
    }


def _kafka_reader(spark: Any, settings: Settings, topics: list[str], status_file: Path) -> Any:
    """A stream reader of ``topics`` with the job's Kafka options."""
    if settings.stream.source_format == "bkaudit_kafka":
        from connectors.kafka.spark_source import KafkaDataSource

        spark.dataSource.register(KafkaDataSource)
    return spark.readStream.format(settings.stream.source_format).options(
        **kafka_source_options(settings, topics, status_file)
    )


def decisions_frame(spark: Any, settings: Settings) -> Any:
    """The timers query's streaming DataFrame of decisions (the processor's output, dead letters passed
    through): it reads only what the ledger lane forwards (tracked ledgers' changes, marks, heartbeats) and
    the feedback."""
    from pyspark.sql.functions import current_timestamp

    kafka, stream = settings.kafka, settings.stream
    topics = [kafka.tracked_topic, kafka.feedback_topic]
    reader = _kafka_reader(spark, settings, topics, timers_checkpoint(settings) / SOURCE_STATUS_FILE)
    if stream.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(stream.max_offsets_per_trigger))
    raw = reader.load()
    # The micro-batch timestamp is, with each record's Kafka time, the decoder's receiving clock: an event
    # dated further ahead of it than stream.max_event_time_skew_s is a dead letter and never moves the
    # watermark. Spark keeps the batch timestamp in its offset log, so a replayed batch decides the same.
    received = raw.withColumn("batch_time", current_timestamp())
    decoded = received.mapInArrow(
        functools.partial(
            decode_batches,
            feedback_topic=kafka.feedback_topic,
            ledger_buckets=stream.ledger_state_buckets,
            max_event_time_skew_s=stream.max_event_time_skew_s,
        ),
        CHANGE_SCHEMA,
    )
    # One pass over Kafka: dead letters go through the processor too (passed through), rather than a second
    # branch of the plan that would read and decode every record again.
    watched = decoded.withWatermark("watermark_time", f"{int(stream.watermark_delay_s * 1000)} milliseconds")
    return watched.groupBy("state_key").transformWithStateInPandas(
        statefulProcessor=make_processor(processor_config(stream, membership=False)),
        outputStructType=DECISION_SCHEMA,
        outputMode="Append",
        timeMode="EventTime",
    )


def membership_reader(settings: Settings) -> Any:
    """The membership lane's planner and reader: the changes topic's membership partition, its ``ledger/``
    records skipped while reading (the driver runs it, :mod:`streaming.driver_batches`)."""
    from connectors.kafka.planner import KafkaPlanner
    from connectors.kafka.publisher import MEMBERSHIP_PARTITION_KEY
    from connectors.kafka.tail_reader import TailingReader

    if settings.stream.source_format != "bkaudit_kafka":
        raise ConfigError(
            "the membership lane needs stream.source_format = bkaudit_kafka (it skips ledger records while "
            "reading)"
        )
    options = kafka_source_options(
        settings,
        [settings.kafka.changes_topic],
        local_checkpoint(settings) / "membership" / SOURCE_STATUS_FILE,
    )
    options["bkaudit.skipKeyPrefixes"] = ",".join(SKIPPED_KEY_PREFIXES)
    # Every event the lane needs is on one partition: bookie events and the recovery delay share the
    # partition of the key "cluster" (their total order), and heartbeats and snapshot markers go to every
    # partition. Reading only that one is a quarter of the broker work per 0.1 s planning.
    options["bkaudit.partitionOfKey"] = MEMBERSHIP_PARTITION_KEY.decode()
    reader = KafkaPlanner({key.lower(): value for key, value in options.items()})
    # Between full plannings, a consumer that stays on that partition hands over records as they arrive.
    tailing = TailingReader(reader, wait_s=settings.stream.membership_trigger_interval_s)
    tailing.enabled = settings.stream.membership_tail_consumer
    return tailing


def ledger_lane_reader(settings: Settings, available_now_topics: list[str] | None = None) -> Any:
    """The driver-run ledger lane's planner and reader: the changes, feedback and decisions topics."""
    from connectors.kafka.planner import KafkaPlanner

    kafka = settings.kafka
    options = kafka_source_options(
        settings,
        [kafka.changes_topic, kafka.feedback_topic, kafka.decisions_topic],
        source_status_file(settings),
    )
    if settings.stream.max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = str(settings.stream.max_offsets_per_trigger)
    if available_now_topics:
        options["bkaudit.availableNowTopics"] = ",".join(available_now_topics)
    return KafkaPlanner({key.lower(): value for key, value in options.items()})


def local_checkpoint(settings: Settings) -> Path:
    """The job's local directory, ``<checkpoint_root>/<stream.app_id>``: its lock, the timers query's
    Spark checkpoint and the sources' status files; with ``object_store.checkpoint_url`` unset, also
    everything else of the checkpoint (:attr:`~core.settings.Settings.checkpoint`)."""
    return Path(settings.checkpoint_root) / settings.stream.app_id


def ledger_lane_checkpoint(settings: Settings) -> str:
    """The driver-run ledger lane's checkpoint (offset log and state), inside the job's."""
    return storage.join(settings.checkpoint, "ledger-lane")


def timers_checkpoint(settings: Settings) -> Path:
    """The timers query's Spark checkpoint, inside the job's local directory (Spark would need ``s3a``)."""
    return local_checkpoint(settings) / "timers"


def membership_checkpoint(settings: Settings) -> str:
    """The membership lane's checkpoint: inside the job's, so a checkpoint reset resets both lanes."""
    return storage.join(settings.checkpoint, "membership")


def source_status_file(settings: Settings) -> Path:
    """Where the ledger lane's Kafka source keeps its outage and reset counts (read by the job's
    ``/metrics``), in the job's local directory."""
    return local_checkpoint(settings) / "ledger-lane" / SOURCE_STATUS_FILE


SOURCE_STATUS_FILE = "bkaudit-source-status.json"
#: Records per batch of the driver-run ledger lane when stream.max_offsets_per_trigger is unset.
LEDGER_LANE_MAX_RECORDS = 100_000
#: The driver-run ledger lane's full planning (offsets, fingerprints: what tells a recreated topic) runs at
#: least this often while records flow; on the embedded broker it costs seconds on a topic of a million
#: records. A consumer error (offsets gone, a broker error) or a partition ending before the lane's
#: position sends it to the full planning at once.
LEDGER_LANE_VERIFY_EVERY_S = 30.0
STATE_LAYOUT_FILE = "bkaudit-state-layout.json"
STATE_LAYOUT_VERSION = 2  # 1: one state group per ledger; 2: ledger buckets with a map state


#: The ledger lane a checkpoint records. Earlier versions could also run every change through Spark's
#: stateful operator (``spark``); a checkpoint they wrote is refused, its state is not this lane's.
LEDGER_LANE = "driver"


def check_state_layout(checkpoint: str | Path, stream: StreamSettings) -> None:
    """Refuse a checkpoint whose state was grouped differently (its ledgers' state would be silently lost).

    The first start records the layout next to the lanes' checkpoints; later starts must match it.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     check_state_layout(Path(tmp) / "cp", StreamSettings(ledger_state_buckets=8))
        ...     try:
        ...         check_state_layout(Path(tmp) / "cp", StreamSettings(ledger_state_buckets=16))
        ...     except ConfigError as err:
        ...         print("refused:", "keeps ledger state in 8 buckets" in str(err))
        refused: True
    """
    found = _recorded_layout(checkpoint)
    if found is not None:
        _check_recorded_layout(checkpoint, found, stream)
        return
    if storage.exists(storage.join(checkpoint, "offsets")):
        raise ConfigError(
            f"checkpoint {checkpoint} was written by an earlier version's Spark ledger lane, which this "
            "version does not run: reset the checkpoint (infra/README.md, 'Checkpoint reset')"
        )
    storage.make_dirs(checkpoint)
    wanted = {
        "state_layout": STATE_LAYOUT_VERSION,
        "ledger_state_buckets": stream.ledger_state_buckets,
        "ledger_lane": LEDGER_LANE,
    }
    layout = json.dumps(wanted, sort_keys=True) + "\n"
    storage.write_atomic(storage.join(checkpoint, STATE_LAYOUT_FILE), layout.encode())


def _check_recorded_layout(checkpoint: str | Path, found: dict[str, Any], stream: StreamSettings) -> None:
    """Raise :class:`ConfigError` when the layout a checkpoint recorded is not this job's."""
    if found.get("state_layout") != STATE_LAYOUT_VERSION:
        raise ConfigError(
            f"checkpoint {checkpoint} has state layout {found.get('state_layout')}, this version "
            f"needs {STATE_LAYOUT_VERSION}: reset the checkpoint (infra/README.md, 'Checkpoint reset')"
        )
    if found.get("ledger_state_buckets") != stream.ledger_state_buckets:
        raise ConfigError(
            f"checkpoint {checkpoint} keeps ledger state in {found.get('ledger_state_buckets')} "
            f"buckets; stream.ledger_state_buckets is {stream.ledger_state_buckets}: set it back or "
            "reset the checkpoint"
        )
    if found.get("ledger_lane", "spark") != LEDGER_LANE:
        raise ConfigError(
            f"checkpoint {checkpoint} was written by an earlier version's Spark ledger lane "
            f"(stream.ledger_lane = {found.get('ledger_lane', 'spark')}), which this version does not run: "
            "reset the checkpoint (infra/README.md, 'Checkpoint reset')"
        )


def _recorded_layout(checkpoint: str | Path) -> dict[str, Any] | None:
    """The state layout the checkpoint's first start recorded (None: none recorded)."""
    marker = storage.join(checkpoint, STATE_LAYOUT_FILE)
    if not storage.exists(marker):
        return None
    try:
        return dict(json.loads(storage.read_bytes(marker)))
    except ValueError as err:
        raise ConfigError(f"{marker}: unreadable state layout ({err}); reset the checkpoint") from None


def _no_check() -> None:
    """The write check of a job without a ZooKeeper lease: the local lock holds for the job's life."""


def _never_lost() -> BkauditError | None:
    return None


@dataclasses.dataclass(frozen=True)
class HeldCheckpoint:
    """A checkpoint this job holds: its path; the check to run before every batch and table write (it
    raises once the hold is gone: a lost ZooKeeper lease; and, from :func:`exclusive_checkpoint`, once a
    volume is below ``stream.disk_floor_mb``); and ``lost``, the error to stop with at once
    when the hold is gone (polled by the running job, which may have nothing to write for a while)."""

    path: Path
    write_check: Callable[[], None] = _no_check
    lost: Callable[[], BkauditError | None] = _never_lost


@contextlib.contextmanager
def exclusive_checkpoint(settings: Settings) -> Iterator[HeldCheckpoint]:
    """The job's checkpoint, created, checked and locked for the block (one job per checkpoint): a local
    lock always, and a lease in ZooKeeper with ``stream.lease = zookeeper`` (across hosts).

    Runs before the Spark session is built, so an operator error is one line at once: an unwritable
    checkpoint or lakehouse root, a checkpoint another job holds, a state layout that does not match, a
    volume below ``stream.disk_floor_mb`` (checked again before every batch and table write).
    """
    from connectors.delta._fold_process import FOLD_SCRATCH
    from connectors.delta.health import check_lakehouse
    from streaming.disk_space import floor_check

    with locked_checkpoint(settings) as held:
        check_state_layout(settings.checkpoint, settings.stream)
        check_lakehouse(settings.lakehouse)
        discard_temporary_files(
            held.path, storage.local_scratch(settings.lakehouse, FOLD_SCRATCH), settings.stream.app_id
        )
        check_floor = floor_check(settings)
        check_floor()  # after the cleanup: the temporary files it removed may be what filled the volume
        logger.info("checkpoint %s locked by this job (pid %d)", settings.checkpoint, os.getpid())
        yield dataclasses.replace(held, write_check=_both(held.write_check, check_floor))


def _both(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    """One write check made of two, run in order.

    Example:
        >>> calls = []
        >>> _both(lambda: calls.append(1), lambda: calls.append(2))(); calls
        [1, 2]
    """

    def check() -> None:
        first()
        second()

    return check


@contextlib.contextmanager
def locked_checkpoint(settings: Settings) -> Iterator[HeldCheckpoint]:
    """The job's checkpoint, created and locked for the block (the local lock, and the ZooKeeper lease with
    ``stream.lease = zookeeper``), its tables unchecked: what ``bkaudit repair`` holds while it rebuilds
    them, so no job starts meanwhile and it never runs beside one."""
    from streaming.checkpoint_lock import CheckpointLock

    storage.configure_from(settings)
    lakehouse_setting = (
        "object_store.lakehouse_url" if settings.object_store.lakehouse_url else "lakehouse_root"
    )
    storage.ensure_writable(settings.lakehouse, lakehouse_setting)
    refuse_remote_checkpoint(settings.checkpoint_root)
    require_lease_for_remote_checkpoint(settings)
    local = local_checkpoint(settings)
    writable_directory(local, "checkpoint_root")
    if settings.object_store.checkpoint_url:
        storage.ensure_writable(settings.checkpoint, "object_store.checkpoint_url")
    with CheckpointLock(local), _zookeeper_lease(settings) as (write_check, lost):
        yield HeldCheckpoint(local, write_check, lost)


def require_lease_for_remote_checkpoint(settings: Settings) -> None:
    """One :class:`ConfigError` line for a checkpoint on the object store without the ZooKeeper lease: the
    local lock file stops a second job on this host only, and nothing would stop one on another host.

    Example:
        >>> require_lease_for_remote_checkpoint(Settings())
        >>> try:
        ...     require_lease_for_remote_checkpoint(Settings(object_store={"checkpoint_url": "s3://b/cp"}))
        ... except ConfigError as err:
        ...     print(str(err).split(":")[0])
        object_store.checkpoint_url needs stream.lease = zookeeper
    """
    if settings.object_store.checkpoint_url and settings.stream.lease != "zookeeper":
        raise ConfigError(
            "object_store.checkpoint_url needs stream.lease = zookeeper: a local lock cannot keep a job on "
            "another host off a checkpoint on the object store (BKAUDIT_STREAM__LEASE=zookeeper)"
        )


def refuse_remote_checkpoint(checkpoint_root: str | Path) -> None:
    """One :class:`ConfigError` line for a ``checkpoint_root`` on an object store: it is a local directory
    (``object_store.checkpoint_url`` puts the checkpoint's files on the object store).

    Example:
        >>> refuse_remote_checkpoint(Path("checkpoints"))
        >>> try:
        ...     refuse_remote_checkpoint(Path("s3://bucket/checkpoints"))
        ... except ConfigError as err:
        ...     print(str(err).split(":")[0])
        checkpoint_root (BKAUDIT_CHECKPOINT_ROOT) must be a local directory
    """
    if re.match(r"s3a?:/", str(checkpoint_root)):
        raise ConfigError(
            f"checkpoint_root (BKAUDIT_CHECKPOINT_ROOT) must be a local directory: {checkpoint_root} is an "
            "object store URL; set object_store.checkpoint_url to it instead"
        )


@contextlib.contextmanager
def _zookeeper_lease(
    settings: Settings,
) -> Iterator[tuple[Callable[[], None], Callable[[], BkauditError | None]]]:
    """With ``stream.lease = zookeeper``: the lease ``<stream.lease_path>/<stream.app_id>`` for the block;
    yields the write check (waits out a dropped connection up to the session timeout, then raises) and the
    lost-lease poll (:class:`HeldCheckpoint`)."""
    stream, zookeeper = settings.stream, settings.zookeeper
    if stream.lease != "zookeeper":
        yield _no_check, _never_lost
        return
    from kazoo.client import KazooClient

    from connectors.zookeeper.client import kazoo_client_options, start_client
    from connectors.zookeeper.lease import ZooKeeperLease

    root = zookeeper.ledgers_root.rstrip("/")
    if stream.lease_path == root or stream.lease_path.startswith(root + "/"):
        raise ConfigError(
            f"stream.lease_path {stream.lease_path} is inside BookKeeper's tree ({root}): bkaudit writes "
            "only under its own path"
        )
    client = KazooClient(**kazoo_client_options(zookeeper))
    start_client(client, zookeeper, zookeeper.connect, "zookeeper.connect", zookeeper.session_timeout_s)
    lease = ZooKeeperLease(
        client,
        stream.lease_path,
        stream.app_id,
        wait_s=stream.lease_wait_s,
        # A job killed and restarted on this host finds its last session's lease until the session expires.
        stale_wait_s=zookeeper.session_timeout_s * 2,
        confirm_after_s=zookeeper.session_timeout_s / 3,
    )
    try:
        lease.acquire()
        yield (lambda: lease.wait_usable(zookeeper.session_timeout_s)), lease.lost
    finally:
        lease.release()
        client.stop()
        client.close()


class AuditQueries:
    """The job's lanes and its timers query as one handle: ``isActive``, ``exception()``, ``stop()``,
    ``awaitTermination()`` and ``processAllAvailable()`` cover all three; anything else is the ledger lane's.

    ``ledgers`` and ``membership`` are the driver-run lanes
    (:class:`~streaming.driver_batches.DriverMicroBatches`), ``timers`` the Structured Streaming query whose
    ``foreachBatch`` is ``relay`` (:class:`~streaming.ledger_lane.DecisionRelay`).
    """

    def __init__(
        self,
        ledgers: DriverMicroBatches,
        membership: DriverMicroBatches,
        sink: AuditSink,
        queue: SinkQueue | None,
        timers: Any,
        relay: Any,
    ) -> None:
        self.ledgers = ledgers
        self.membership = membership
        self.sink = sink
        self.queue = queue  # the ledger lane's pipelined sink (None: the sink runs inside each batch)
        self.timers = timers
        self.relay = relay

    @property
    def queries(self) -> list[Any]:
        return [self.ledgers, self.membership, self.timers]

    @property
    def isActive(self) -> bool:
        return all(q.isActive for q in self.queries) and self._queue_failure() is None

    def _queue_failure(self) -> BaseException | None:
        return self.queue.failure if self.queue is not None else None

    def exception(self) -> Any:
        """The sink's own failure when it failed (a lane that hands it a batch next fails with it as its
        cause), else the first query's."""
        failure = self._queue_failure()
        if failure is not None:
            return failure
        return next((e for q in self.queries if (e := q.exception()) is not None), None)

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until the sink applied every batch the query handed over (always True without a queue)."""
        return self.queue.drain(timeout_s) if self.queue is not None else True

    def stop(self) -> None:
        for query in self.queries:
            query.stop()

    def awaitTermination(self, timeout: float | None = None) -> Any:
        if timeout is None:
            for query in self.queries:
                query.awaitTermination()
            self.drain()
            return True
        ended = all(q.awaitTermination(timeout) is not False for q in self.queries)
        return ended and self.drain(timeout)

    def processAllAvailable(self) -> None:
        for query in self.queries:
            query.processAllAvailable()
        self.drain()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ledgers, name)


def start_membership_lane(settings: Settings, sink: AuditSink, *, available_now: bool) -> DriverMicroBatches:
    """Start the membership lane: micro-batches in a driver thread, with its own checkpoint directory."""
    stream = settings.stream
    checkpoint = membership_checkpoint(settings)
    store = MembershipStateStore(storage.join(checkpoint, "bkaudit-membership-state"))
    lane = MembershipLane(
        MembershipLaneConfig(
            app_id=stream.app_id,
            feedback_topic=settings.kafka.feedback_topic,
            processor=processor_config(stream),
            max_event_time_skew_s=stream.max_event_time_skew_s,
            cluster_default=settings.cluster or "unknown",
            membership_partition=partition_for_key(MEMBERSHIP_PARTITION_KEY, sink.config.changes_partitions),
        ),
        sink.loss,
        store,
        sink.metrics,
    )
    return DriverMicroBatches(
        MEMBERSHIP_QUERY_NAME,
        membership_reader(settings),
        lane.process,
        store.saved,
        OffsetLog(storage.join(checkpoint, "offsets")),
        interval_s=stream.membership_trigger_interval_s,
        available_now=available_now,
        write_check=lambda: sink.write_check(),
    ).start()


def start(
    spark: Any,
    settings: Settings,
    *,
    available_now: bool = False,
    write_check: Callable[[], None] = _no_check,
) -> tuple[AuditQueries, AuditSink]:
    """Start the lanes and the timers query; returns them as one handle with the ledger lane's sink (whose
    reports, and whose ``loss`` auditor's, tests and the demo read). ``write_check`` runs before every
    batch and table write (:class:`HeldCheckpoint`)."""
    storage.configure_from(settings)  # the tables or the checkpoint may be on an object store
    checkpoint = settings.checkpoint
    check_state_layout(checkpoint, settings.stream)
    with step(logger, f"checking the Kafka topics on {settings.kafka.bootstrap_servers}"):
        partitions = ensure_topics(settings)
    with step(logger, f"opening the Delta tables in {settings.lakehouse_root}"):
        sink = AuditSink(sink_config(settings, partitions), _start_metrics(spark, settings))
    sink.set_write_check(write_check)
    if not available_now:
        sink.start_producer()  # a long-running job: its producer is connected before the first loss
        sink.start_folding()
    queue = None
    if settings.stream.sink_queue_depth:
        queue = SinkQueue(
            sink, storage.join(checkpoint, "sink-queue"), depth=settings.stream.sink_queue_depth
        )
        queue.recover()  # batches the last run queued and did not apply, before anything new
    with step(logger, "starting the membership lane, the ledger lane and the timers query"):
        membership = start_membership_lane(settings, sink, available_now=available_now)
        queries = _start_ledger_lane_and_timers(spark, settings, sink, queue, membership, available_now)
    return queries, sink


def _start_metrics(spark: Any, settings: Settings) -> Any:
    """The job's gauges, fed by Spark's query listener and served on ``stream.metrics_port`` when set."""
    from streaming.disk_space import job_directories
    from streaming.metrics import StreamMetrics, subscribe

    metrics = StreamMetrics()
    metrics.watch_free_space(job_directories(settings))
    if settings.stream.source_format == "bkaudit_kafka":
        metrics.source_status.path = source_status_file(settings)
    subscribe(spark, metrics)
    if settings.stream.metrics_port:
        metrics.serve(settings.stream.metrics_port)
    return metrics


def _start_ledger_lane_and_timers(
    spark: Any,
    settings: Settings,
    sink: AuditSink,
    queue: SinkQueue | None,
    membership: DriverMicroBatches,
    available_now: bool,
) -> AuditQueries:
    """The ledger lane in a driver thread, and the timers query (the stateful operator over what the lane
    forwards) as the application's Structured Streaming query."""
    from streaming.ledger_lane import TIMERS_QUERY_NAME, DecisionRelay

    kafka = settings.kafka

    def send(topic: str, records: Any) -> None:
        from streaming.publish import send_keyed

        send_keyed(sink.kafka_producer(), kafka, topic, records)

    relay = DecisionRelay(send, kafka.decisions_topic)
    # Under --available-now both run on processing-time triggers until the loop between them settles
    # (LoopSettler): one available-now pass each would leave the relayed decisions unread.
    interval_ms = int(settings.stream.timers_trigger_interval_s * 1000)
    writer = (
        decisions_frame(spark, settings)
        .writeStream.queryName(TIMERS_QUERY_NAME)
        .foreachBatch(relay)
        .option("checkpointLocation", str(timers_checkpoint(settings)))
        .trigger(processingTime=f"{interval_ms} milliseconds")
    )

    def start_timers() -> Any:
        discard_unplanned_first_batch(timers_checkpoint(settings))
        query = start_at_driver_priority(spark, writer.start)
        if sink.metrics is not None:
            sink.metrics.watch_query(query.id)
        return query

    try:
        timers = RestartingQuery(start_timers, name=TIMERS_QUERY_NAME)
        ledgers = start_ledger_lane(settings, sink, queue, send, available_now=available_now)
    except BaseException:
        membership.stop()
        raise
    queries = AuditQueries(ledgers, membership, sink, queue, timers=timers, relay=relay)
    if available_now:
        LoopSettler(queries, settings).start()
    return queries


class LoopSettler(threading.Thread):
    """``--available-now`` with the driver-run ledger lane: the lane reads the changes available at its
    start, but a tracked ledger's timer decision takes a loop (lane → tracked topic → timers query →
    decisions topic → lane), and the probe results the sink publishes go round it too. Rounds of "each side
    processes all it has" repeat until a round leaves the ends of the tracked, decisions and feedback topics
    where they were; then both stop, as an available-now query would."""

    def __init__(self, queries: AuditQueries, settings: Settings) -> None:
        super().__init__(name="bkaudit-settle", daemon=True)
        self.queries = queries
        kafka = settings.kafka
        self.loop_topics = [kafka.tracked_topic, kafka.decisions_topic, kafka.feedback_topic]
        status = source_status_file(settings)
        self.options = kafka_source_options(settings, self.loop_topics, status)

    def run(self) -> None:
        from connectors.kafka.planner import KafkaPlanner

        reader = KafkaPlanner({key.lower(): value for key, value in self.options.items()})
        lane, timers = self.queries.ledgers, self.queries.timers
        try:
            while lane.isActive and timers.isActive:
                before = reader.reportLatestOffset()
                self._round(lane, timers)
                if reader.reportLatestOffset() == before:
                    return
        except Exception as error:  # the query's own error is what the job reports
            logger.debug("settling the ledger lane's loop stopped: %s", error)
        finally:
            reader.stop()
            lane.stop()
            _stop_lane(timers, self.queries.relay, 60.0)

    def _round(self, lane: Any, timers: Any) -> None:
        """The lane and the sink take what they have, then the timers query, then the lane and the sink
        again (the timers' decisions and the probes' feedback)."""
        lane.processAllAvailable()
        self.queries.drain()
        timers.processAllAvailable()
        lane.processAllAvailable()
        self.queries.drain()


def start_ledger_lane(
    settings: Settings, sink: AuditSink, queue: SinkQueue | None, send: Any, *, available_now: bool
) -> DriverMicroBatches:
    """Start the driver-run ledger lane (:mod:`streaming.ledger_lane`) with its own checkpoint directory."""
    from streaming.ledger_lane import LANE_NAME, LedgerLane, LedgerLaneConfig

    kafka, stream = settings.kafka, settings.stream
    interval_s = stream.ledger_lane_interval_s
    checkpoint = ledger_lane_checkpoint(settings)
    store = LaneStates(storage.join(checkpoint, "state"))
    lane = LedgerLane(
        LedgerLaneConfig(
            changes_topic=kafka.changes_topic,
            feedback_topic=kafka.feedback_topic,
            tracked_topic=kafka.tracked_topic,
            decisions_topic=kafka.decisions_topic,
            processor=processor_config(stream, membership=False),
            ledger_buckets=stream.ledger_state_buckets,
            max_event_time_skew_s=stream.max_event_time_skew_s,
            cluster_default=settings.cluster or "unknown",
        ),
        queue.put if queue is not None else sink.process,
        send,
        store,
    )
    if available_now:  # the changes as of now; the decisions until the loop settles (LoopSettler)
        reader = ledger_lane_reader(settings, available_now_topics=[kafka.changes_topic])
        reader.prepareForTriggerAvailableNow()
    else:  # one consumer stays on every partition; a full planning every few seconds
        from connectors.kafka.tail_reader import TailingReader

        reader = TailingReader(
            ledger_lane_reader(settings),
            wait_s=stream.ledger_lane_interval_s,
            verify_every_s=LEDGER_LANE_VERIFY_EVERY_S,
            gather_s=stream.ledger_lane_interval_s,
            max_records=stream.max_offsets_per_trigger or LEDGER_LANE_MAX_RECORDS,
        )
    return DriverMicroBatches(
        LANE_NAME,
        reader,
        lane.process,
        store.saved,
        OffsetLog(storage.join(checkpoint, "offsets")),
        # Available-now plans in full each time: look again soon (the interval is the tailing's gather).
        interval_s=min(interval_s, 0.1) if available_now else interval_s,
        on_progress=sink.metrics.on_progress if sink.metrics is not None else None,
        write_check=lambda: sink.write_check(),
    ).start()


def stop_gracefully(query: Any, sink: AuditSink | None = None, timeout_s: float = 60.0) -> None:
    """Stop between sink calls: the running batch's sink work finishes, later batches are not started.

    Interrupting the query while the Python ``foreachBatch`` is inside a Py4J call makes Spark format an
    enormous nested interrupt trace (and overflow its stack doing so); waiting for the sink avoids that.
    A batch that reaches the sink after the stop began fails fast and is replayed on the next start.
    """
    if isinstance(query, AuditQueries):
        query.membership.stop(timeout_s)  # each lane's thread stops after its running batch
        query.ledgers.stop(timeout_s)
        _stop_lane(query.timers, query.relay, timeout_s)
        query.sink.stopping.set()  # no new batch is queued; the queued ones are applied first
        with contextlib.suppress(Exception):  # a failed sink: its batch stays queued for the restart
            query.drain(timeout_s)
        _stop_lane(query.ledgers, query.sink, timeout_s)
        return
    if sink is None:
        query.stop()
        return
    _stop_lane(query, sink, timeout_s)


def _stop_lane(query: Any, lane: Any, timeout_s: float) -> None:
    lane.stopping.set()
    acquired = lane.busy.acquire(timeout=timeout_s)
    try:
        query.stop()
    finally:
        if acquired:
            lane.busy.release()


def query_failure(exception: Any) -> Exception:
    """The error to stop with when the query failed: a source's :class:`ServiceError` line (exit 2, no
    restart loop: the fault needs a person) when one caused it, else a ``RuntimeError`` (exit 1: systemd
    restarts the job, the batch is replayed).

    Example:
        >>> query_failure("... core.errors.ServiceError: bkaudit_kafka: Kafka at k:9 failed\\n  at ...")
        ServiceError('bkaudit_kafka: Kafka at k:9 failed')
        >>> type(query_failure("java.lang.OutOfMemoryError"))
        <class 'RuntimeError'>
        >>> query_failure(ConfigError("cp/membership/offsets/3.json: unreadable"))
        ConfigError('cp/membership/offsets/3.json: unreadable')
        >>> full = ServiceError("too little space left on the device of lakehouse_root /lh: ...")
        >>> try:
        ...     raise RuntimeError(f"the sink failed: {full}") from full  # a lane meeting the failed sink
        ... except RuntimeError as lane_error:
        ...     query_failure(lane_error) is full
        True
        >>> type(query_failure(OSError("Generic S3 error: GET http://s3/b/k: error sending request")))
        <class 'connectors.storage.ObjectStoreUnreachable'>
    """
    cause = _own_cause(exception)
    if cause is not None:
        return cause  # the lanes' own one-line errors (a damaged checkpoint, a source fault, a full disk)
    # The object store did not answer (also told by Spark's text of the timers query's Python error): one
    # line, exit 2; the batch is replayed on restart.
    error = exception if isinstance(exception, BaseException) else RuntimeError(str(exception))
    down = storage.unreachable(error)
    if down is not None:
        return down
    text = str(exception)
    found = re.search(r"(bkaudit_kafka: [^\n]*)", text)
    if found:
        return ServiceError(found.group(1).replace("\\n", " ").strip())
    return RuntimeError(f"the streaming query failed: {text}")


def _own_cause(exception: Any) -> BkauditError | None:
    """The first of bkaudit's one-line errors in ``exception``'s chain of causes (None if none)."""
    seen: set[int] = set()
    while isinstance(exception, BaseException) and id(exception) not in seen:
        if isinstance(exception, BkauditError):
            return exception
        seen.add(id(exception))
        exception = exception.__cause__
    return None


def run(settings: Settings, *, owns_spark: bool = False) -> None:
    """``bkaudit stream``: run until SIGTERM/SIGINT, then stop after the current batch. An object store that
    does not answer (after the clients' retries) stops it with one line (exit 2) wherever it is met.

    ``owns_spark``: the process is the job's own, so a job stopped on an error stops the Spark context too
    (a caller in the same process keeps its session)."""
    running: list[bool] = []
    try:
        with exclusive_checkpoint(settings) as held:
            _run_locked(settings, held, running, owns_spark=owns_spark)
    except (OSError, RuntimeError) as err:
        down = storage.unreachable(err)
        if down is None:
            raise
        raise stopped_while_running(down, running) from None
    except BkauditError as err:
        raise stopped_while_running(err, running) from None


def stopped_while_running(err: BkauditError, running: list[bool]) -> BkauditError:
    """``err`` marked ``job_was_running`` when the job had started its lanes (the CLI then exits at once
    after its line: Spark and delta-rs threads still unwinding would print after it).

    Example:
        >>> stopped_while_running(ConfigError("x"), [True]).job_was_running  # type: ignore[attr-defined]
        True
    """
    err.job_was_running = bool(running)  # type: ignore[attr-defined]
    return err


class IngestProgress:
    """The ledger lane's progress as one line on a terminal (silent elsewhere): its last batch, the changes
    it read and its rate, rewritten in place while the job ingests (a START snapshot, a backlog).

    Example:
        >>> import io
        >>> from connectors.zookeeper.snapshot import ProgressLine
        >>> progress = IngestProgress(ProgressLine(io.StringIO(), enabled=True))
        >>> progress.show({"batchId": 3, "numInputRows": 1200, "processedRowsPerSecond": 850.4})
        'stream: batch 3 read 1,200 changes (850/s)'
        >>> progress.show({"batchId": 3, "numInputRows": 1200}) is None  # nothing new
        True
    """

    def __init__(self, line: Any = None) -> None:
        from connectors.zookeeper.snapshot import ProgressLine

        self.line = line if line is not None else ProgressLine()
        self.batch_id = -1

    def show(self, last: Any) -> str | None:
        """Update the line from a query's last progress (a dict, or pyspark's progress object; None)."""
        if last is None:
            return None
        read = last if isinstance(last, dict) else json.loads(last.json)
        if read.get("batchId", -1) <= self.batch_id:
            return None
        self.batch_id = read["batchId"]
        rows, rate = read.get("numInputRows") or 0, read.get("processedRowsPerSecond") or 0
        text = f"stream: batch {self.batch_id} read {rows:,} changes ({rate:,.0f}/s)"
        self.line.update(text, force=True)
        return text


class StallWarnings:
    """One WARNING for each lane batch that runs longer than ``after_s``: such a batch waits on a store or a
    broker that does not answer while its client retries (delta-rs for up to 180 s), and the log says so
    instead of staying silent until the job stops or goes on.

    Example:
        >>> warnings = StallWarnings(after_s=60)
        >>> warnings.check("ledger-lane", (7, 75.0)).split(";")[0]
        'ledger-lane: batch 7 has run for 75 s'
        >>> warnings.check("ledger-lane", (7, 90.0)) is None  # said once per batch
        True
    """

    def __init__(self, after_s: float = 60.0) -> None:
        self.after_s = after_s
        self._warned: set[tuple[str, int]] = set()

    def check(self, lane: str, running: tuple[int, float] | None) -> str | None:
        """Warn (and return the line) when ``running`` (batch id, seconds) is past ``after_s`` for the first
        time."""
        if running is None or running[1] < self.after_s or (lane, running[0]) in self._warned:
            return None
        self._warned.add((lane, running[0]))
        line = (
            f"{lane}: batch {running[0]} has run for {running[1]:.0f} s; its writes are waiting for the "
            "object store or Kafka to answer (their clients retry; the job stops with one line if they give "
            "up)"
        )
        logger.warning("%s", line)
        return line


def started_spark(settings: Settings) -> Any:
    """The job's Spark session, its start logged (a JVM's start takes tens of seconds on a busy host)."""
    from streaming.session import build_spark_session

    with step(logger, f"starting Spark ({settings.spark.master})"):
        return build_spark_session(settings.spark)


def _quiet_spark(spark: Any) -> None:
    """A job stopping on an error says why in one line: the timers query's batch refused during the stop,
    the cancelled Spark jobs and py4j's closing connections would each log a trace or a line after the
    cause, so Spark's and py4j's logs keep only what is fatal from here on."""
    with contextlib.suppress(Exception):
        spark.sparkContext.setLogLevel("FATAL")
    logging.getLogger("py4j").setLevel(logging.CRITICAL)


def _run_locked(settings: Settings, held: HeldCheckpoint, running: list[bool], *, owns_spark: bool) -> None:
    spark = started_spark(settings)
    query, sink = start(spark, settings, write_check=held.write_check)
    running.append(True)
    checkpoint = Path(settings.checkpoint_root) / settings.stream.app_id
    logger.info(
        "bkaudit running: the ledger and membership lanes and the timers query (checkpoint %s)", checkpoint
    )
    stopping = threading.Event()

    def request_stop(signum: int, _frame: Any) -> None:
        logger.info("signal %s: stopping after the current batch", signum)
        stopping.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    progress = IngestProgress()
    failure: BaseException | None = None
    stalls = StallWarnings()
    try:
        while query.isActive and not stopping.wait(1.0):
            lost = held.lost()
            if lost is not None:
                failure = lost
                raise lost  # the checkpoint may be another job's now: stop before writing again
            for lane in (query.ledgers, query.membership):
                stalls.check(lane.name, lane.running())
            if progress.line.enabled:
                progress.show(query.ledgers.lastProgress)
        if query.exception() is not None and not sink.stopping.is_set():
            failure = query_failure(query.exception())
            raise failure
    finally:
        if failure is not None:
            _quiet_spark(spark)
        stop_gracefully(query, sink)  # every lane (one may have stopped on its own)
        # No last fold on a store that does not answer: it would wait out the clients' retries again (up
        # to minutes on a hung store) and then hide the line the job stops with.
        sink.close(fold=not isinstance(failure, storage.ObjectStoreUnreachable))
        if failure is not None and owns_spark:
            # Stopped on an error: stop Spark too, or its listener bus goes on calling back into a Python
            # that is exiting and prints Java traces after the job's one line.
            with contextlib.suppress(Exception):
                spark.stop()
