"""Typed configuration for every bkaudit process.

Settings come from, in priority order: keyword arguments, ``BKAUDIT_*`` environment variables (nested with
``__``, e.g. ``BKAUDIT_KAFKA__BOOTSTRAP_SERVERS``), an optional file named by ``BKAUDIT_CONFIG_FILE``
(``.toml``, ``.yaml``/``.yml`` or ``.json``), then the defaults below. Secrets are ``SecretStr``: they
print as ``**********`` in ``repr``, logs and JSON dumps.

A key that no section has is an error, as is a malformed value: :func:`load_settings` names the key, where the
value came from (``--set``, the variable, the config file) and, for a typo, the setting it most likely means.

The Kafka client defaults are chosen to work against both the embedded Tansu broker and a real Kafka
cluster; see :class:`KafkaSettings` for why each one is what it is.

Example:
    >>> settings = Settings(kafka={"bootstrap_servers": "k1:9092", "sasl_password": "s3cret"})
    >>> settings.kafka.bootstrap_servers
    'k1:9092'
    >>> "s3cret" in repr(settings)
    False
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import typing
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    JsonConfigSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

from core.domain.addresses import parse_bootstrap_servers, parse_zookeeper_connect
from core.domain.rules.evaluate import PlacementPolicyConfig
from core.errors import ConfigError

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

CONFIG_FILE_ENV = "BKAUDIT_CONFIG_FILE"


class _Section(BaseModel):
    """A section of the settings: a key it does not have is an error (a typo is never silently ignored)."""

    model_config = ConfigDict(extra="forbid")


class DevSettings(_Section):
    """The embedded default cluster (`bkaudit dev up`): ZooKeeper from pyspark's jars + the Tansu broker.

    Example:
        >>> DevSettings().zookeeper_port
        0
    """

    state_dir: Path = Field(Path(".bkaudit"), description="pid files, logs and data of the embedded services")
    zookeeper_port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    kafka_port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    zookeeper_classpath: str | None = Field(
        None, description="classpath of a system ZooKeeper; default: the jars inside the installed pyspark"
    )
    zookeeper_heap: str = Field("1g", description="-Xmx of the embedded ZooKeeper (1 M ledgers need ~1g)")
    zookeeper_tick_ms: int = Field(
        500, ge=50, description="ZooKeeper tickTime; session timeouts may be 2..120 ticks"
    )
    java_bin: str = Field("java", description="the java executable")
    start_timeout_s: float = Field(60.0, gt=0, description="how long `dev up` waits for readiness")
    broker: Literal["tansu", "kafka"] = Field(
        "tansu",
        description="the embedded broker: `tansu` (in memory, starts in under a second, topics lost on "
        "restart) or `kafka` (a real Apache Kafka 4.1 KRaft node from the Maven jars, topics kept on disk)",
    )
    kafka_heap: str = Field("512m", description="-Xmx of the real Kafka broker (dev.broker = kafka)")
    bookkeeper: Literal["none", "real"] = Field(
        "none",
        description="'real': `dev up` also starts a real Apache BookKeeper 4.17 cluster (bookie processes)",
    )
    bookies: int = Field(
        6, ge=1, le=250, description="real BookKeeper: how many bookies (127.0.0.2, .3, ...)"
    )
    racks: int = Field(3, ge=1, le=250, description="real BookKeeper: racks the bookies are spread over")
    tls: bool = Field(
        False,
        description="ZooKeeper and the broker serve TLS only, client certificates required, with a throwaway "
        "CA written to `<state_dir>/tls` (needs broker = kafka: Tansu has no TLS listener)",
    )
    kafka_scram: bool = Field(
        False,
        description="with tls: the real Kafka broker also opens a SASL_SSL listener for SCRAM-SHA-256/512 "
        "users (TLS without client certificates there); users are added with Kafka's admin API",
    )


def absolute_znode_path(value: str, what: str) -> str:
    """A ZooKeeper path below the root, without a trailing slash; else a ValueError naming the setting.

    Example:
        >>> absolute_znode_path("/bkaudit/leases/", "lease_path")
        '/bkaudit/leases'
    """
    if not value.startswith("/") or value.rstrip("/") == "":
        raise ValueError(f"{what} must be an absolute ZooKeeper path below /, e.g. /bkaudit/leases")
    return value.rstrip("/")


class ZooKeeperSettings(_Section):
    """The BookKeeper cluster's ZooKeeper, as the watcher and the simulator connect to it.

    Example:
        >>> ZooKeeperSettings(connect="zk1:2181,zk2:2181/pulsar").ledgers_root
        '/ledgers'
    """

    connect: str = Field(
        "127.0.0.1:2181", description="kazoo hosts string, an optional chroot after the last host"
    )
    ledgers_root: str = Field("/ledgers", description="BookKeeper's zkLedgersRootPath")
    session_timeout_s: float = Field(
        30.0,
        gt=0,
        description="ZooKeeper session timeout; also the connect wait at start unless connect_timeout_s is "
        "set (at least 10 s)",
    )
    connect_timeout_s: float | None = Field(
        None,
        gt=0,
        description="how long `bkaudit watch` waits for its first ZooKeeper connection before it exits with "
        "an error (default: session_timeout_s, at least 10 s); also the bound of each live admin read "
        "(`metadata show`, `bookies list`; default 10 s)",
    )
    auth_scheme: Literal["none", "digest", "sasl"] = Field(
        "none",
        description="`digest` (username/password), `sasl` (DIGEST-MD5, or GSSAPI without a username), or "
        "none",
    )
    auth_username: str | None = Field(
        None,
        description="user of the digest or SASL DIGEST-MD5 authentication",
    )
    auth_password: SecretStr | None = Field(
        None,
        description="password of the digest or SASL DIGEST-MD5 authentication",
    )
    use_tls: bool = Field(
        False,
        description="connect over TLS (ZooKeeper's secureClientPort; `connect` then names the TLS ports)",
    )
    tls_cafile: Path | None = Field(
        None,
        description="CA bundle (PEM) that signed ZooKeeper's server certificates (default: the system's)",
    )
    tls_certfile: Path | None = Field(
        None,
        description="client certificate (PEM) for mutual TLS (ZooKeeper's ssl.clientAuth=need); with "
        "tls_keyfile",
    )
    tls_keyfile: Path | None = Field(None, description="private key (PEM) of tls_certfile")
    tls_keyfile_password: SecretStr | None = Field(None, description="password of an encrypted tls_keyfile")
    tls_check_hostname: bool = Field(
        False,
        description="also check that the server certificate names the host in `connect` (the CA is always "
        "checked)",
    )

    @field_validator("connect")
    @classmethod
    def _connect_string(cls, value: str) -> str:
        parse_zookeeper_connect(value)
        return value

    @field_validator("ledgers_root")
    @classmethod
    def _absolute_root(cls, value: str) -> str:
        if not value.startswith("/") or (len(value) > 1 and value.endswith("/")):
            raise ValueError("ledgers_root must be an absolute ZooKeeper path without a trailing '/'")
        return value


#: librdkafka property names whose values are secrets (masked in logs, ``repr``, JSON dumps and ``--help``).
_SECRET_PROPERTY = re.compile(r"password|secret|token|^sasl\.oauthbearer\.", re.IGNORECASE)


def is_secret_property(name: str) -> bool:
    """Whether a librdkafka property (a ``kafka.extra_config`` key) holds a secret.

    Example:
        >>> [is_secret_property(n) for n in ("ssl.key.password", "sasl.oauthbearer.config", "linger.ms")]
        [True, True, False]
    """
    return bool(_SECRET_PROPERTY.search(name))


class KafkaSettings(_Section):
    """Kafka connection and client defaults; every client is librdkafka (confluent-kafka).

    Defaults that exist because of the embedded Tansu broker, each safe on real Kafka and overridable:

    - ``single_record_tails = true``: Tansu sets a partition's high watermark to its last batch's base
      offset + 1, hiding the rest of a multi-record batch until the next write. Senders keep batching but
      end every burst with a one-record batch per partition (:mod:`connectors.kafka.tail_sender`); one
      extra round trip per burst. It can be turned off on real Kafka. (``producer_batch_size = 0``, one
      record per request, is the slower alternative.)
    - ``tail_fetch_wait_ms = 50``: Tansu does not answer a fetch that waits for records when a record
      arrives, only later (a record reached a waiting consumer 130 ms after its ack on the
      median with 500 ms, 14 ms with 50 ms), so the wait bounds how late the driver-run lanes see a
      trickle of records such as a bookie's loss. Real Kafka answers at once; there the wait only sets
      how often an idle consumer asks (20 times a second).
    - ``consumer_session_timeout_ms``/``heartbeat_interval_ms``/``max_poll_interval_ms`` short: Tansu's
      first group join waits for the full rebalance timeout; short timeouts keep joins fast.

    Example:
        >>> KafkaSettings().changes_topic
        'bkaudit.changes'
    """

    bootstrap_servers: str = Field("127.0.0.1:9092", description="comma-separated host:port list")
    bootstrap_timeout_ms: int = Field(
        30_000,
        gt=0,
        description="how long a Kafka client waits to reach a first broker; at start a process then exits "
        "with an error",
    )
    changes_topic: str = Field(
        "bkaudit.changes",
        description="the watcher's change events (protobuf), read by the job",
    )
    alerts_topic: str = Field("bkaudit.alerts", description="alert transitions (JSON, see docs/alerts.md)")
    feedback_topic: str = Field(
        "bkaudit.feedback",
        description="the job's re-probe results, read back by the job",
    )
    tracked_topic: str = Field(
        "bkaudit.tracked",
        description="the change events of ledgers that need timers "
        "(suspects, under-replication marks) and heartbeats (one every 30 s while no ledger needs a timer), "
        "forwarded by the ledger lane to the timers query",
    )
    decisions_topic: str = Field(
        "bkaudit.decisions",
        description="the timers query's decisions (re-probes, confirmed "
        "failures, stuck marks), read back by the ledger lane",
    )
    topic_partitions: int = Field(4, ge=1, description="partitions of topics we create when absent")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT",
        description="Kafka security protocol of every client",
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER"] | None = (
        Field(
            None,
            description="SASL mechanism when the protocol is SASL_*",
        )
    )
    sasl_username: str | None = Field(None, description="SASL user")
    sasl_password: SecretStr | None = Field(None, description="SASL password")
    ssl_cafile: Path | None = Field(
        None,
        description="CA bundle to verify the brokers (must exist on every host that runs a client)",
    )
    ssl_certfile: Path | None = Field(None, description="client certificate (mutual TLS)")
    ssl_keyfile: Path | None = Field(None, description="client private key (mutual TLS)")
    ssl_password: SecretStr | None = Field(None, description="password of the client private key")
    client_id: str = Field("bkaudit", description="client id the brokers see (quotas, logs)")
    request_timeout_ms: int = Field(30_000, gt=0, description="Kafka request timeout")
    producer_acks: Literal["all", "1", "0"] = Field(
        "all",
        description="producer acks; `all` is what makes a published change durable",
    )
    producer_batch_size: int = Field(
        262_144,
        ge=0,
        description="producer batch bytes, librdkafka's `batch.size` (256 KiB: 31 k alerts produced and "
        "acked in ~0.06 s on the embedded broker); 0 = one record per batch (slow; not needed with "
        "single_record_tails)",
    )
    producer_linger_ms: int = Field(
        5,
        ge=0,
        description="how long the producer waits to fill a batch, librdkafka's `linger.ms` (5 ms, its own "
        "default: at 10,000 changes/s the embedded broker took ~0.45 of a core against ~0.73 with 0, for a "
        "few milliseconds more per record)",
    )
    single_record_tails: bool = Field(
        True,
        description="end each burst with a one-record batch per partition (the embedded broker's high "
        "watermark is wrong after a multi-record batch); may be false on real Kafka",
    )
    producer_retries: int = Field(
        2_147_483_647,
        ge=0,
        description="producer retries (endless by default: a change is never dropped)",
    )
    producer_max_in_flight: int = Field(1, ge=1, description="1 keeps per-key order across retries")
    producer_max_block_ms: int = Field(60_000, gt=0, description="back-pressure: block, never drop")
    tail_fetch_wait_ms: int = Field(
        50,
        gt=0,
        description="how long a fetch of the driver-run lanes' tailing consumers waits at the broker for "
        "records (librdkafka's fetch.wait.max.ms); the embedded broker does not answer when a record "
        "arrives, so it bounds how late a trickle of records (a bookie's loss) is seen; real Kafka "
        "answers at once",
    )
    consumer_session_timeout_ms: int = Field(
        6_000,
        gt=0,
        description="consumer group session timeout (short: fast joins on the embedded broker)",
    )
    consumer_heartbeat_interval_ms: int = Field(1_000, gt=0, description="consumer group heartbeat interval")
    consumer_max_poll_interval_ms: int = Field(30_000, gt=0, description="consumer max poll interval")
    producer_enable_idempotence: bool = Field(False, description="Tansu has no idempotent producer support")
    producer_delivery_timeout_ms: int = Field(
        120_000,
        gt=0,
        description="after this, an unacknowledged record counts as failed (the watcher then republishes a "
        "FULL snapshot)",
    )
    extra_config: dict[str, str | SecretStr] = Field(
        default_factory=dict,
        description="any other librdkafka property for every Kafka client, passed through as given (e.g. "
        '`{"sasl.oauthbearer.method": "oidc"}`); it overrides bkaudit\'s own; values of keys naming a '
        "password, secret or token, and of `sasl.oauthbearer.*`, are secrets (masked)",
    )

    @field_validator("bootstrap_servers")
    @classmethod
    def _bootstrap_list(cls, value: str) -> str:
        parse_bootstrap_servers(value)
        return value

    @field_validator("extra_config")
    @classmethod
    def _secret_extra_values(cls, value: dict[str, str | SecretStr]) -> dict[str, str | SecretStr]:
        return {
            name: SecretStr(item) if isinstance(item, str) and is_secret_property(name) else item
            for name, item in value.items()
        }


class StreamSettings(_Section):
    """``bkaudit stream``: the Structured Streaming auditor's knobs (times are event time, in seconds).

    Example:
        >>> StreamSettings().placement_policy
        'rackaware'
    """

    app_id: str = Field("bkaudit-stream", description="Delta app-transaction id; keep it per checkpoint")
    source_format: Literal["bkaudit_kafka", "kafka"] = Field(
        "bkaudit_kafka", description="the Python Kafka source, or Spark's JVM kafka source (needs its jars)"
    )
    ledger_lane_interval_s: float = Field(
        1.0,
        ge=0,
        description="how long the ledger lane (a driver thread that applies ledger changes in columns) waits "
        "for a first record, and then gathers records into one batch (a full planning of the topics' offsets "
        "every 30 s)",
    )
    timers_trigger_interval_s: float = Field(
        5.0,
        ge=0,
        description="micro-batch interval of the timers query (the Structured Streaming query whose stateful "
        "operator keeps the re-probe rounds and grace periods of the ledgers that need them; those are tens "
        "of seconds or more, and each of its batches costs ~1 CPU-second)",
    )
    membership_trigger_interval_s: float = Field(
        0.1,
        ge=0,
        description="how often the membership lane (registrations, the recovery delay, a lost bookie's "
        "alerts; a driver thread) looks for new records; its tail consumer hands a record over as it "
        "arrives, so only with membership_tail_consumer off does a loss wait for half of it on average",
    )
    membership_tail_consumer: bool = Field(
        True,
        description="the membership lane keeps one consumer on its partition and plans from the records it "
        "holds (a full planning, with the broker's offsets and fingerprints, every 5 s while idle and on any "
        "consumer error); false: every planning asks the broker",
    )
    watermark_delay_s: float = Field(5.0, ge=0, description="how late an event may arrive")
    max_event_time_skew_s: float = Field(
        300.0,
        gt=0,
        description="how far ahead of the receiving clock (the earlier of the Kafka record time and the "
        "batch time) an event may be dated; later events go to dead_letters and never move the watermark",
    )
    max_offsets_per_trigger: int | None = Field(
        None,
        ge=1,
        description="cap on records per micro-batch; bounds batches during a START snapshot catch-up "
        "(unset = everything available)",
    )
    ledger_state_buckets: int = Field(
        64,
        ge=1,
        le=65536,
        description="ledger state groups (ledger id modulo this); fixed for a checkpoint's life",
    )
    default_recovery_delay_s: int = Field(
        0, ge=0, description="lostBookieRecoveryDelay when the znode is absent (BookKeeper's default 0)"
    )
    reprobe_delay_s: float = Field(30.0, gt=0, description="first re-probe of a suspect ledger (doubles)")
    reprobe_rounds: int = Field(3, ge=1, description="failing re-probes before a REPLICAS_* alert")
    reprobe_max_delay_s: float = Field(600.0, gt=0, description="upper bound of the doubling re-probe delay")
    confirmed_recheck_s: float = Field(300.0, gt=0, description="re-probe interval of a confirmed failure")
    under_replication_grace_s: float = Field(
        3600.0, ge=0, description="UNDER_REPLICATION_STUCK after a urL mark is this old; 0 disables"
    )
    autorecovery_disabled_grace_s: float = Field(
        900.0, ge=0, description="AUTORECOVERY_DISABLED once underreplication/disable is this old; 0 disables"
    )
    auditor_missing_grace_s: float = Field(
        300.0,
        ge=0,
        description="AUDITOR_MISSING once no Auditor vote has existed this long while bookies run; "
        "0 disables",
    )
    replication_lock_grace_s: float = Field(
        1800.0,
        ge=0,
        description="REPLICATION_STALLED once a replication lock (underreplication/locks/urL<id>) is this "
        "old; 0 disables",
    )
    auditor_checks_overdue_grace_s: float = Field(
        86400.0,
        ge=0,
        description="AUDITOR_CHECKS_OVERDUE once one of the Auditor's periodic checks is this late (past its "
        "last completion plus its interval, or past the Auditor's election when it never ran); 0 disables",
    )
    auditor_periodic_check_interval_s: float = Field(
        604800.0,
        ge=0,
        description="the cluster's auditorPeriodicCheckInterval (BookKeeper's default: weekly): how often "
        "the Auditor checks all ledgers (underreplication/checkallledgersctime); 0: off, never overdue",
    )
    auditor_periodic_placement_policy_check_interval_s: float = Field(
        0.0,
        ge=0,
        description="the cluster's auditorPeriodicPlacementPolicyCheckInterval (BookKeeper's default 0: "
        "off): how often the Auditor checks placement (placementpolicycheckctime); 0: never overdue",
    )
    auditor_periodic_replicas_check_interval_s: float = Field(
        0.0,
        ge=0,
        description="the cluster's auditorPeriodicReplicasCheckInterval (BookKeeper's default 0: off): how "
        "often the Auditor checks replicas (replicascheckctime); 0: never overdue",
    )
    auditor_lagging_grace_s: float = Field(
        600.0,
        ge=0,
        description="AUDITOR_LAGGING once a ledger bkaudit finds at risk (an open LEDGER_UNDER_REPLICATED or "
        "LEDGER_UNRECOVERABLE, which starts when its bookie is lost, after lostBookieRecoveryDelay) has had "
        "no under-replication mark for this long while an Auditor is elected and AutoRecovery is on: the "
        "Auditor is not marking what it should; the same grace as `bkaudit query auditor-diff --grace`; "
        "keep it in minutes (a mark reaches bkaudit seconds to tens of seconds after the Auditor writes it); "
        "0 disables",
    )
    zookeeper_disruption_settle_s: float = Field(
        1.0,
        ge=0,
        description="a bookie that vanished is judged once the watcher's liveness probe answered or after "
        "this; bookies vanishing together in it (see zookeeper_disruption_share) are held, not lost, while "
        "they answer (ZOOKEEPER_DISRUPTION); 0 = BookKeeper's rules only",
    )
    zookeeper_disruption_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="the share of the bookies not lost that must be missing together (and at least two) "
        "for a ZooKeeper disruption",
    )
    zookeeper_disruption_grace_s: float = Field(
        30.0, ge=0, description="a held bookie that no liveness probe reached is lost after this"
    )
    placement_policy: Literal["rackaware", "regionaware", "zoneaware"] = Field(
        "rackaware",
        description="placement policy to check closed ledgers against",
    )
    min_racks_per_write_quorum: int = Field(
        2,
        ge=1,
        description="rack-aware: racks each write quorum must span (BookKeeper's minNumRacksPerWriteQuorum)",
    )
    enforce_min_racks_per_write_quorum: bool = Field(
        False,
        description="rack-aware: a write set in the default rack fails (enforceMinNumRacksPerWriteQuorum)",
    )
    min_zones_per_write_quorum: int = Field(2, ge=1, description="zone-aware: minNumZonesPerWriteQuorum")
    desired_zones_per_write_quorum: int = Field(
        3,
        ge=1,
        description="zone-aware: desiredNumZonesPerWriteQuorum (fewer → MEETS_SOFT)",
    )
    min_regions_for_durability: int = Field(
        2,
        ge=1,
        description="region-aware: reppMinimumRegionsForDurability",
    )
    probe_timeout_s: float = Field(5.0, gt=0, description="GET_LIST_OF_ENTRIES_OF_LEDGER timeout")
    probe_concurrency: int = Field(64, ge=1, description="bookie probes in flight")
    entry_checks: Literal["auto", "entry_lists", "entry_reads"] = Field(
        "auto",
        description="how replicas probes ask a bookie what it holds: entry_lists "
        "(GET_LIST_OF_ENTRIES_OF_LEDGER), entry_reads (READ_ENTRY of each fragment's first and last entry, "
        "BookKeeper's LedgerChecker way, for DbLedgerStorage bookies), or auto: entry lists, and entry "
        "reads for a bookie found silent to them while it answers reads (remembered in the bookies table)",
    )
    entry_checks_by_bookie: dict[str, Literal["auto", "entry_lists", "entry_reads"]] = Field(
        default_factory=dict, description="entry_checks for single bookies (bookie id -> mode)"
    )
    entry_reads_per_s_per_bookie: float = Field(
        200.0, gt=0, description="entry reads sent to one bookie per second at most (the probes' pace)"
    )
    entry_read_sample_percent: float = Field(
        0.0,
        ge=0,
        le=100,
        description="with entry reads, this share of each fragment's entries is read besides its first and "
        "last (BookKeeper's auditorLedgerVerificationPercentage)",
    )
    scrutiny_ledgers_per_s: float | None = Field(
        None,
        ge=0,
        description="background replicas check: closed ledgers probed per second in a walk over all of "
        "them (each bookie at the probes' pace, entry_reads_per_s_per_bookie); unset = the pace that "
        "walks them all within scrutiny_pass_s; 0 = no walk",
    )
    scrutiny_pass_s: float = Field(
        86_400.0,
        gt=0,
        description="the background replicas check walks every closed ledger within this long (a day: "
        "about 12 ledgers per second at 1 M closed ledgers)",
    )
    scrutiny_on_close: bool = Field(
        True,
        description="probe a ledger when it closes (a failed write leaves its last entries short)",
    )
    scrutiny_max_per_batch: int = Field(1000, ge=1, description="most scrutiny probes one micro-batch runs")
    maintenance_every_batches: int = Field(200, ge=0, description="compact/vacuum the tables; 0 = never")
    ledger_fold_interval_s: float = Field(
        30.0,
        ge=0,
        description="how often the changed ledgers are folded into the ledgers table in the background "
        "(a raw Delta reader of ledgers is at most this plus one fold behind; bkaudit query is not); "
        "0 = only when the job stops",
    )
    ledger_table_buckets: int = Field(
        256,
        ge=1,
        le=65536,
        description="partitions of the ledgers table (ledger_bucket = ledger_id modulo this), the unit a "
        "fold rewrites; a lakehouse written with another count is rewritten whole by the first fold",
    )
    ledger_fold_ticks: int = Field(
        10,
        ge=1,
        description="folds per ledger_fold_interval_s, each rewriting at most 1/this of the buckets, those "
        "holding the oldest changes first: the fold's CPU and bytes are spread over the interval",
    )
    ledger_vacuum_rounds: int = Field(
        3,
        ge=0,
        description="files the fold replaced in the ledgers table are deleted once its watermark (every "
        "bucket folded) advanced this many times since; 0 = only the periodic maintenance "
        "(stream.maintenance_retention_hours)",
    )
    ledger_changes_retention_hours: float = Field(
        168.0,
        ge=0,
        description="ledger_changes rows (the ledgers' version history) kept this long once folded, "
        "removed by the periodic maintenance; 0 = kept forever",
    )
    maintenance_retention_hours: int = Field(
        168,
        ge=1,
        description="files a table no longer uses (replaced by compaction, a delete or an append's "
        "rewrite) are deleted by the periodic maintenance once this old (whole hours: delta-rs's vacuum); a "
        "reader or Delta time travel older than this finds them gone",
    )
    lease: Literal["local", "zookeeper"] = Field(
        "local",
        description="one job per checkpoint: `local` is a lock file on the driver host (it stops a second "
        "job on that host only); `zookeeper` adds an ephemeral lease znode under stream.lease_path in "
        "zookeeper.connect, which holds across hosts, and the job stops (exit 2) before writing again once "
        "the lease is lost",
    )
    lease_path: str = Field(
        "/bkaudit/leases",
        description="ZooKeeper path of the leases (bkaudit's own, outside BookKeeper's tree); the job's "
        "lease is `<lease_path>/<app_id>`",
    )
    lease_wait_s: float = Field(
        0.0,
        ge=0,
        description="how long a starting job waits for a lease another job holds before it exits (0: at "
        "once)",
    )

    @field_validator("lease_path")
    @classmethod
    def _absolute_lease_path(cls, value: str) -> str:
        return absolute_znode_path(value, "lease_path")

    disk_floor_mb: int = Field(
        256,
        ge=0,
        description="free space (MiB) the job keeps on the volumes of lakehouse_root and checkpoint_root: "
        "below it, it stops with one line naming the directory (exit 2) before its next write instead of "
        "failing half-way through one; 0 = write until the disk is full",
    )
    sink_queue_depth: int = Field(
        1,
        ge=0,
        description="micro-batches whose decisions wait, on disk, for the ledger lane's sink while the "
        "lane plans and decides the next one (the two overlap); 0 = the sink runs inside each batch",
    )
    index_cleanup_bookies_per_batch: int = Field(
        1,
        ge=0,
        description="ledger_bookies partitions cleaned of old metadata versions' rows per "
        "index_cleanup_interval_s (a run cleans this many for each interval since the last run, within a "
        "fifth of that time, so micro-batches slowed by a backlog clean at the same pace)",
    )
    index_cleanup_interval_s: float = Field(
        5.0,
        ge=0,
        description="seconds at least between two cleanups of old versions' ledger_bookies rows (readers "
        "skip those rows anyway), so that a small micro-batch does not pay for one; 0 = every micro-batch",
    )
    index_append_interval_s: float = Field(
        5.0,
        ge=0,
        description="seconds at least between two appends of new ledger versions' rows to ledger_bookies "
        "(one commit for every batch since: ~100 small files, one per bookie, whatever its size); readers "
        "index the ledgers changed since by their current rows meanwhile, and the fold waits for it; "
        "0 = every micro-batch",
    )
    publish_processes: int | None = Field(
        None,
        description="deprecated and ignored: the librdkafka producer sends a lost bookie's alerts from the "
        "job's own process (31 k records in ~0.1 s); remove it from your configuration",
    )
    metrics_port: int = Field(0, ge=0, le=65535, description="Prometheus endpoint; 0 = off")
    broker_outage_limit_s: float = Field(
        600.0,
        gt=0,
        description="how long the job's Kafka source rides out an unreachable or hung broker (retrying "
        "with back-off, 0.5 s doubling to 30 s) before the job stops with one line and exit 2",
    )

    @field_validator("publish_processes")
    @classmethod
    def _deprecated_publish_processes(cls, value: int | None) -> int | None:
        if value is not None:
            logging.getLogger(__name__).warning(
                "stream.publish_processes (BKAUDIT_STREAM__PUBLISH_PROCESSES) is deprecated and ignored: "
                "alerts are sent by the job's own librdkafka producer; remove the setting"
            )
        return value

    def placement_policy_config(self) -> PlacementPolicyConfig:
        """The placement policy the job audits against (the job's and ``bkaudit query``'s one source).

        Example:
            >>> StreamSettings().placement_policy_config().min_racks_per_write_quorum
            2
        """
        return PlacementPolicyConfig(
            policy=self.placement_policy,
            min_racks_per_write_quorum=self.min_racks_per_write_quorum,
            enforce_min_racks_per_write_quorum=self.enforce_min_racks_per_write_quorum,
            min_zones_per_write_quorum=self.min_zones_per_write_quorum,
            desired_zones_per_write_quorum=self.desired_zones_per_write_quorum,
            min_regions_for_durability=self.min_regions_for_durability,
        )


class WatcherSettings(_Section):
    """``bkaudit watch``: heartbeats, snapshot pacing, reconciliation, rack map source, metrics.

    The rack map comes from at most one source: Pulsar's ``/bookies`` znode (``rack_map_znode``, on the
    BookKeeper ZooKeeper or on ``rack_map_zookeeper``) or a JSON file (``rack_map_file``, polled by mtime).

    Example:
        >>> WatcherSettings().heartbeat_interval_s, WatcherSettings().watch_mode
        (1.0, 'auto')
        >>> from pydantic import ValidationError
        >>> try:
        ...     WatcherSettings(rack_map_znode="/bookies", rack_map_file="racks.json")
        ... except ValidationError as err:
        ...     "exclusive" in str(err)
        True
    """

    heartbeat_interval_s: float = Field(1.0, gt=0, description="heartbeat to every partition this often")
    snapshot_concurrency: int = Field(
        1000, ge=1, le=100_000, description="ZooKeeper reads in flight during a snapshot scan (never flood)"
    )
    snapshot_batch_size: int = Field(
        100,
        ge=1,
        le=1000,
        description="znodes per multiRead during a snapshot (ZooKeeper >= 3.6); 1 = single reads",
    )
    change_batch_ms: float = Field(
        20.0,
        ge=0,
        le=1000,
        description="how long a changed ledger's read waits for the rest of its burst (at most this much "
        "latency added), so the burst is read with one multiRead and published as one Kafka batch; "
        "0 = read at once",
    )
    reconciliation_interval_s: float = Field(
        3600.0, ge=0, description="periodic low-rate reconciliation scan; 0 disables it"
    )
    reconciliation_reads_per_s: float = Field(
        2000.0, ge=0, description="read rate cap of periodic reconciliation scans; 0 = no cap"
    )
    watch_mode: Literal["auto", "persistent", "fallback"] = Field(
        "auto",
        description="persistent = AddWatch (ZooKeeper >= 3.6); fallback = one-shot child/data watches; "
        "auto picks persistent when the server supports it",
    )
    ledger_manager: Literal["flat", "hierarchical", "longhierarchical", "legacyhierarchical"] | None = Field(
        None, description="override the ledger manager; default: read it from the cluster's LAYOUT znode"
    )
    queue_size: int = Field(
        10_000,
        ge=100,
        description="items waiting in the internal event queue above which heartbeats are skipped "
        "(the queue never blocks ZooKeeper's connection thread)",
    )
    rack_map_znode: str | None = Field(None, description="Pulsar's rack map znode, e.g. /bookies")
    rack_map_zookeeper: str | None = Field(
        None, description="connect string of the ZooKeeper holding rack_map_znode; default: zookeeper.connect"
    )
    rack_map_file: Path | None = Field(None, description="a rack map JSON file (Pulsar or flat form)")
    rack_map_poll_s: float = Field(5.0, gt=0, description="how often the rack map file's mtime is checked")
    metrics_port: int = Field(0, ge=0, le=65535, description="Prometheus metrics port; 0 = off")
    metrics_host: str = Field("0.0.0.0", description="address the metrics server binds")
    progress: Literal["auto", "on", "off"] = Field(
        "auto", description="snapshot progress line on stderr (auto: only on a terminal)"
    )
    shutdown_timeout_s: float = Field(30.0, gt=0, description="how long a clean shutdown waits for Kafka")
    bookie_probe_interval_s: float = Field(
        5.0,
        ge=0,
        description="liveness probe of a bookie whose registration vanished: at once, then this often while "
        "it stays missing (an answer tells a ZooKeeper disruption from a dead bookie); 0 = no probes",
    )
    bookie_probe_timeout_s: float = Field(
        2.0, gt=0, description="how long a liveness probe waits for the bookie's answer"
    )

    @model_validator(mode="after")
    def _one_rack_map_source(self) -> WatcherSettings:
        if self.rack_map_znode is not None and self.rack_map_file is not None:
            raise ValueError("rack_map_znode and rack_map_file are exclusive: pick one rack map source")
        if self.rack_map_znode is not None and not self.rack_map_znode.startswith("/"):
            raise ValueError("rack_map_znode must be an absolute ZooKeeper path")
        if self.rack_map_zookeeper is not None:
            parse_zookeeper_connect(self.rack_map_zookeeper)
        return self


class SparkSettings(_Section):
    """How the one Spark session helper builds the session (``streaming.session.build_spark_session``).

    Example:
        >>> SparkSettings().master
        'local[*]'
    """

    master: str = Field(
        "local[*]",
        description="Spark master; under spark-submit set it to the same value as --master",
    )
    app_name: str = Field("bkaudit", description="Spark application name")
    ui_enabled: bool = Field(True, description="the Spark UI (port 4040 and up)")
    shuffle_partitions: int = Field(
        4,
        ge=1,
        description="spark.sql.shuffle.partitions; a stateful query keeps the value of its first start "
        "(the checkpoint wins)",
    )
    driver_memory: str = Field(
        "2g",
        description="spark.driver.memory; under spark-submit use --driver-memory instead (the JVM is "
        "already running)",
    )
    num_recent_progress_updates: int = Field(
        1000,
        ge=100,
        description="progress updates Spark keeps (the metrics listener reads them)",
    )
    local_nice: int = Field(
        0,
        ge=0,
        le=19,
        description="in local mode, the nice value (lower CPU priority) of the Spark JVM and the Python "
        "workers it starts; 0 (the default) = the driver's priority. A higher value lets the driver, "
        "whose membership lane publishes a loss's alerts, get the cores first, but slows the timers "
        "query (re-probe rounds) beside other busy processes. The timers query's execution thread and the "
        "Python worker it starts in the JVM keep the driver's priority (Spark gives that worker 10 s)",
    )
    extra_conf: dict[str, str] = Field(default_factory=dict, description="any other spark.* settings")


class AgentSettings(_Section):
    """The bookie-side agent (``bkaudit agent``): how it serves, and how the job reaches agents.

    The job asks a bookie's agent first where ``addresses`` names one, then the bookie itself (entry
    lists, then entry reads). The token is a secret (masked, never logged); without ``insecure`` every
    connection is TLS.

    Example:
        >>> AgentSettings(addresses={"bookie-01": "10.0.0.5:3182"}, token="t").token
        SecretStr('**********')
    """

    addresses: dict[str, str] = Field(
        default_factory=dict, description="bookie id -> host:port of the agent running beside that bookie"
    )
    token: SecretStr | None = Field(None, description="bearer token the job sends to agents")
    tls_ca_file: Path | None = Field(
        None, description="CA certificates (PEM) that sign the agents' certificates; default: system roots"
    )
    tls_server_name: str | None = Field(
        None, description="name checked against the agents' certificates instead of their host"
    )
    insecure: bool = Field(False, description="plaintext gRPC without TLS (loopback tests only)")
    timeout_s: float = Field(10.0, gt=0, description="deadline of one call to an agent")
    listen: str = Field("0.0.0.0:3182", description="`bkaudit agent`: host:port to serve on")
    ledger_dirs: list[Path] = Field(
        default_factory=list,
        description="`bkaudit agent`: the bookie's ledgerDirectories (indexDirectories when it has them)",
    )
    tls_cert_file: Path | None = Field(None, description="`bkaudit agent`: certificate chain (PEM)")
    tls_key_file: Path | None = Field(None, description="`bkaudit agent`: private key (PEM)")
    token_file: Path | None = Field(None, description="`bkaudit agent`: file holding the bearer token")
    refresh_s: float = Field(
        10.0, ge=0, description="`bkaudit agent`: reopen an index whose files changed at most this often"
    )


class PulsarSettings(_Section):
    """Pulsar's own metadata: the ``/managed-ledgers`` tree the watcher follows and the job cross-checks
    against BookKeeper (``TOPIC_LEDGER_MISSING``, ``LEDGER_ORPHANED``; docs/reference.md).

    Example:
        >>> PulsarSettings().managed_ledgers_path, PulsarSettings().orphan_grace_s
        ('/managed-ledgers', 86400.0)
    """

    follow_managed_ledgers: bool = Field(
        True,
        description="the watcher follows `managed_ledgers_path` (when it exists) and the job cross-checks "
        "every topic's ledgers against BookKeeper; false = neither",
    )
    managed_ledgers_path: str = Field(
        "/managed-ledgers",
        description="Pulsar's managed-ledgers root on the watcher's ZooKeeper (within its chroot)",
    )
    missing_grace_s: float = Field(
        60.0,
        ge=0,
        description="event time a listed ledger must stay absent from BookKeeper before TOPIC_LEDGER_MISSING "
        "fires (Pulsar creates a ledger, then lists it; unlists it, then deletes it)",
    )
    orphan_grace_s: float = Field(
        86_400.0,
        ge=0,
        description="age (from its creation) below which a ledger no managed ledger lists is never "
        "LEDGER_ORPHANED: Pulsar creates a ledger before its managed ledger lists it",
    )

    @field_validator("managed_ledgers_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        return absolute_znode_path(value, "managed_ledgers_path")


class BookieSettings(_Section):
    """How bkaudit connects to bookies (the job's replicas probes, the watcher's liveness probes): TLS and
    authentication the way BookKeeper's client does them.

    With ``tls`` every connection is upgraded by ``START_TLS`` (the bookies' ``tlsProviderFactoryClass``),
    verifying the bookies' certificates against ``tls_ca_file``, presenting ``tls_cert_file`` where the
    bookies require a client certificate (``tlsClientAuthentication=true``). ``auth_provider``
    ``tls-certificate`` is the bookies' ``bookieAuthProviderFactoryClass=``
    ``org.apache.bookkeeper.tls.BookieAuthZFactory`` (Pulsar's): the client certificate is the credential,
    its OU role (``OU=0:<role>``) one of the bookies' ``authorizedRoles``. A bookie that refuses what bkaudit
    presents is ``BOOKIE_AUTH_REFUSED`` naming the credential, never ``BOOKIE_UNRESPONSIVE``. The key
    password is a secret (masked, never logged).

    Example:
        >>> bookie = BookieSettings(tls=True, tls_cert_file="c.pem", tls_key_password="pw")
        >>> bookie.tls_key_password
        SecretStr('**********')
        >>> BookieSettings(auth_provider="tls-certificate").problem()
        'bookie.auth_provider tls-certificate needs bookie.tls and bookie.tls_cert_file'
    """

    tls: bool = Field(
        False,
        description="upgrade every bookie connection with START_TLS, as BookKeeper's client with "
        "tlsProviderFactoryClass set (a bookie without TLS is then refused, BOOKIE_AUTH_REFUSED)",
    )
    tls_ca_file: Path | None = Field(
        None, description="CA certificates (PEM) that sign the bookies' certificates; default: system roots"
    )
    tls_cert_file: Path | None = Field(
        None,
        description="client certificate chain (PEM), for bookies with tlsClientAuthentication=true or "
        "auth_provider tls-certificate",
    )
    tls_key_file: Path | None = Field(
        None, description="private key (PEM) of tls_cert_file; unset: the key is in tls_cert_file"
    )
    tls_key_password: SecretStr | None = Field(None, description="password of an encrypted tls_key_file")
    tls_hostname_verification: bool = Field(
        False,
        description="check the bookie's host name against its certificate (BookKeeper's "
        "tlsHostnameVerificationEnabled; off, its default, still verifies the certificate chain)",
    )
    auth_provider: Literal["none", "tls-certificate"] = Field(
        "none",
        description="the bookies' bookieAuthProviderFactoryClass: none, or tls-certificate "
        "(org.apache.bookkeeper.tls.BookieAuthZFactory: the client certificate's OU role must be among the "
        "bookies' authorizedRoles; needs tls and tls_cert_file). SASL is not supported",
    )

    def problem(self) -> str | None:
        """What makes these settings contradictory (checked where bookies are reached), or None.

        Example:
            >>> BookieSettings(tls_ca_file="ca.pem").problem()
            'bookie.tls_ca_file set but bookie.tls is false'
        """
        if self.auth_provider == "tls-certificate" and not (self.tls and self.tls_cert_file):
            return "bookie.auth_provider tls-certificate needs bookie.tls and bookie.tls_cert_file"
        given = [
            f"bookie.{name}"
            for name in ("tls_ca_file", "tls_cert_file", "tls_key_file")
            if getattr(self, name)
        ]
        if given and not self.tls:
            return f"{', '.join(given)} set but bookie.tls is false"
        if self.tls_key_file and not self.tls_cert_file:
            return "bookie.tls_key_file set without bookie.tls_cert_file"
        return None


class ObjectStoreSettings(_Section):
    """An S3-compatible object store for the Delta tables (AWS S3, MinIO, Ceph RGW, …).

    ``lakehouse_url`` (``s3://bucket/prefix``) puts the tables there instead of under ``lakehouse_root``;
    the job, ``bkaudit query`` and ``bkaudit status`` then read and write them through delta-rs's object
    store. The secret key and session token are secrets (masked, never logged); without them the usual
    AWS chain applies (environment, instance role, web identity).

    Example:
        >>> store = ObjectStoreSettings(lakehouse_url="s3://audit/lh", secret_access_key="k")
        >>> store.lakehouse_url, store.secret_access_key
        ('s3://audit/lh', SecretStr('**********'))
    """

    lakehouse_url: str | None = Field(
        None,
        description="`s3://bucket/prefix` of the Delta tables on the object store; unset: `lakehouse_root`",
    )
    checkpoint_url: str | None = Field(
        None,
        description="`s3://bucket/prefix` of the job's own checkpoint files (offset logs, lane state, sink "
        "queue); needs `stream.lease = zookeeper`; the timers query's Spark checkpoint stays under "
        "`checkpoint_root`; unset: all under `checkpoint_root`",
    )
    endpoint_url: str | None = Field(
        None, description="the S3 API's endpoint, e.g. `http://minio:9000`; unset: AWS's for `region`"
    )
    region: str = Field("us-east-1", description="the bucket's region (any value for MinIO and the like)")
    access_key_id: str | None = Field(None, description="access key id; unset: the AWS credential chain")
    secret_access_key: SecretStr | None = Field(None, description="secret access key (masked)")
    session_token: SecretStr | None = Field(None, description="session token of temporary credentials")
    allow_http: bool = Field(
        False, description="allow a plain-http `endpoint_url` (a local MinIO or a test server only)"
    )

    @field_validator("lakehouse_url", "checkpoint_url")
    @classmethod
    def _s3_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"s3a?://[^/]+(/.*)?", value):
            raise ValueError("must be s3://bucket[/prefix]")
        return value.rstrip("/") if value is not None else None


class Settings(BaseSettings):
    """All settings of one bkaudit process.

    Example:
        >>> Settings().lakehouse_root
        PosixPath('lakehouse')
    """

    model_config = SettingsConfigDict(
        env_prefix="BKAUDIT_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    cluster: str | None = Field(None, description="cluster name in alerts; default: the INSTANCEID")
    lakehouse_root: Path = Field(
        Path("lakehouse"),
        description="root directory of the Delta tables (a local or mounted path; see infra/README.md); "
        "`object_store.lakehouse_url` puts them on an object store instead",
    )
    checkpoint_root: Path = Field(
        Path("checkpoints"),
        description="Structured Streaming checkpoints; the query's is `<checkpoint_root>/<stream.app_id>`",
    )
    log_dir: Path = Field(
        Path(".bkaudit/logs"),
        description="where `bkaudit demo`, `stream` and `watch` write `<command>.log`: the output of Spark, "
        "py4j and the Kafka and ZooKeeper clients, kept off the console (`--verbose` shows it there instead)",
    )
    dev: DevSettings = Field(default_factory=DevSettings)
    zookeeper: ZooKeeperSettings = Field(default_factory=ZooKeeperSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    watcher: WatcherSettings = Field(default_factory=WatcherSettings)
    stream: StreamSettings = Field(default_factory=StreamSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)
    pulsar: PulsarSettings = Field(default_factory=PulsarSettings)
    bookie: BookieSettings = Field(default_factory=BookieSettings)
    object_store: ObjectStoreSettings = Field(default_factory=ObjectStoreSettings)

    @property
    def lakehouse(self) -> str:
        """Where the Delta tables are: ``object_store.lakehouse_url`` when set, else ``lakehouse_root``.

        Example:
            >>> Settings(object_store={"lakehouse_url": "s3://b/lh"}).lakehouse, Settings().lakehouse
            ('s3://b/lh', 'lakehouse')
        """
        return self.object_store.lakehouse_url or str(self.lakehouse_root)

    @property
    def checkpoint(self) -> str:
        """The job's own checkpoint, ``<object_store.checkpoint_url or checkpoint_root>/<stream.app_id>``
        (the timers query's Spark checkpoint is always under ``checkpoint_root``).

        Example:
            >>> Settings(object_store={"checkpoint_url": "s3://b/cp"}).checkpoint
            's3://b/cp/bkaudit-stream'
            >>> Settings().checkpoint
            'checkpoints/bkaudit-stream'
        """
        if self.object_store.checkpoint_url:
            return f"{self.object_store.checkpoint_url}/{self.stream.app_id}"
        return str(Path(self.checkpoint_root) / self.stream.app_id)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get(CONFIG_FILE_ENV)
        if config_file:
            sources.append(_file_source(settings_cls, Path(config_file)))
        return tuple(sources)


def _file_source(settings_cls: type[BaseSettings], path: Path) -> PydanticBaseSettingsSource:
    if not path.is_file():
        raise ConfigError(f"{CONFIG_FILE_ENV}={path}: no such file")
    from yaml import YAMLError  # a dependency (config files may be YAML)

    try:
        return _parsed_file(settings_cls, path)
    except (ValueError, OSError, YAMLError) as err:  # the file does not parse or cannot be read
        detail = " ".join(str(err).split()) or type(err).__name__
        raise ConfigError(f"{CONFIG_FILE_ENV}={path}: unreadable ({detail})") from None


def _parsed_file(settings_cls: type[BaseSettings], path: Path) -> PydanticBaseSettingsSource:
    suffix = path.suffix.lower()
    if suffix == ".toml":
        return TomlConfigSettingsSource(settings_cls, toml_file=path)
    if suffix in (".yaml", ".yml"):
        return YamlConfigSettingsSource(settings_cls, yaml_file=path)
    if suffix == ".json":
        return JsonConfigSettingsSource(settings_cls, json_file=path)
    raise ConfigError(f"{CONFIG_FILE_ENV}={path}: use a .toml, .yaml, .yml or .json file")


#: The ``BKAUDIT_*`` variables the command line wrote for ``--set`` (see :func:`note_command_line`).
_set_on_command_line: dict[str, str] = {}


def note_command_line(variables: Mapping[str, str]) -> None:
    """Remember which ``BKAUDIT_*`` variables carry ``--set`` values, so that an error about one of them
    says ``from --set`` instead of naming a variable the user never set (while it holds that value).

    Example:
        >>> note_command_line({"BKAUDIT_KAFKA__CLIENT_ID": "me"})
        >>> setting_origin(("kafka", "client_id"), {}, {"BKAUDIT_KAFKA__CLIENT_ID": "me"})
        '--set'
        >>> note_command_line({})
    """
    _set_on_command_line.clear()
    _set_on_command_line.update((name.upper(), value) for name, value in variables.items())


def _variable_origin(variable: str, value: str) -> str:
    """``--set`` for a variable the command line wrote (still with its value), else the variable."""
    return "--set" if _set_on_command_line.get(variable) == value else variable


def setting_env_var(path: Sequence[str]) -> str:
    """The environment variable of the setting (or section) at ``path``.

    Example:
        >>> setting_env_var(("kafka", "extra_config"))
        'BKAUDIT_KAFKA__EXTRA_CONFIG'
    """
    return "BKAUDIT_" + "__".join(part.upper() for part in path)


def setting_origin(
    path: Sequence[str], overrides: Mapping[str, Any], environ: Mapping[str, str]
) -> str | None:
    """Where the value at ``path`` came from: ``--set``, its ``BKAUDIT_*`` variable or ``config file
    FILE``; None for keyword arguments. The source that holds the most of the path gave it (a variable
    can carry a whole section as JSON); between equals, the one of higher priority.

    Example:
        >>> setting_origin(("dev", "zookeeper_port"), {}, {"BKAUDIT_DEV__ZOOKEEPER_PORT": "x"})
        'BKAUDIT_DEV__ZOOKEEPER_PORT'
        >>> setting_origin(("dev", "zookeeper_port"), {"dev": {"zookeeper_port": "x"}}, {}) is None
        True
    """
    variables = {name.upper(): value for name, value in environ.items()}
    env_depth = max((d for d in range(1, len(path) + 1) if setting_env_var(path[:d]) in variables), default=0)
    config_file = environ.get(CONFIG_FILE_ENV)
    file_depth = _depth(_file_data(Path(config_file)), path) if config_file else 0
    init_depth = _depth(overrides, path)
    best = max(init_depth, env_depth, file_depth)
    if best == 0 or init_depth == best:
        return None
    if env_depth == best:
        variable = setting_env_var(path[:env_depth])
        return _variable_origin(variable, variables[variable])
    return f"config file {config_file}"


def _depth(data: Any, path: Sequence[str]) -> int:
    """How many leading parts of ``path`` the nested mapping ``data`` holds."""
    depth = 0
    for part in path:
        if not isinstance(data, Mapping) or part not in data:
            break
        data, depth = data[part], depth + 1
    return depth


def _file_data(path: Path) -> Mapping[str, Any]:
    """The config file's settings as a nested mapping (empty when it cannot be read)."""
    try:
        return _file_source(Settings, path)()
    except (ConfigError, ValueError, OSError):
        return {}


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def suggest_setting(key: str) -> str | None:
    """The setting a mistyped dotted ``key`` most likely means (difflib over the field names of the
    section the typo is in); None when nothing is close, or the key is no typo.

    Example:
        >>> suggest_setting("kafka.bootstrap_server"), suggest_setting("kafak.changes_topic")
        ('kafka.bootstrap_servers', 'kafka.changes_topic')
        >>> suggest_setting("nothing.like.it") is None
        True
    """
    parts = key.split(".")
    model: type[BaseModel] = Settings
    for depth, part in enumerate(parts):
        fields = model.model_fields
        if part not in fields:
            close = difflib.get_close_matches(part, list(fields), n=1)
            return ".".join([*parts[:depth], close[0], *parts[depth + 1 :]]) if close else None
        annotation = fields[part].annotation
        if not _is_section(annotation):
            return None
        model = annotation  # type: ignore[assignment]
    return None


def _problem(error: ErrorDetails, overrides: Mapping[str, Any]) -> str:
    """One validation error as ``key: what is wrong (from where)``."""
    path = tuple(str(part) for part in error["loc"])
    key = ".".join(path)
    if error["type"] == "extra_forbidden":
        suggestion = suggest_setting(key)
        text = "no such setting" + (f"; did you mean {suggestion}?" if suggestion else "")
    else:
        text = error["msg"]
    origin = setting_origin(path, overrides, os.environ)
    return f"{key}: {text}" + (f" (from {origin})" if origin else "")


def _json_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The sections and the map or list settings: what a ``BKAUDIT_*`` variable gives as JSON."""
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        if _is_section(field.annotation):
            yield path
            yield from _json_paths(field.annotation, path)  # type: ignore[arg-type]
        elif typing.get_origin(field.annotation) in (dict, list):
            yield path


def _json_problem(environ: Mapping[str, str]) -> str | None:
    """The first ``BKAUDIT_*`` variable that should hold JSON and does not, as ``key: why (from where)``."""
    values = {name.upper(): value for name, value in environ.items()}
    for path in _json_paths(Settings):
        variable = setting_env_var(path)
        if variable not in values:
            continue
        try:
            json.loads(values[variable])
        except json.JSONDecodeError as err:  # the value itself is not shown: it may hold a secret
            origin = _variable_origin(variable, values[variable])
            return f"{'.'.join(path)}: not JSON ({err.msg} at column {err.colno}) (from {origin})"
    return None


def load_settings(**overrides: Any) -> Settings:
    """Build :class:`Settings`; any problem becomes one :class:`ConfigError` line naming the setting and
    where its value came from (``--set``, a ``BKAUDIT_*`` variable or the config file), and for a key no
    section has, the setting it most likely means.

    Example:
        >>> load_settings(lakehouse_root="/tmp/lh").lakehouse_root
        PosixPath('/tmp/lh')
        >>> try:
        ...     load_settings(kafka={"bootstrap_server": "k1:9092"})
        ... except ConfigError as err:
        ...     print(err)
        invalid settings: kafka.bootstrap_server: no such setting; did you mean kafka.bootstrap_servers?
    """
    from pydantic import ValidationError

    try:
        return Settings(**overrides)
    except ValidationError as err:
        problems = "; ".join(_problem(error, overrides) for error in err.errors(include_url=False))
        raise ConfigError(f"invalid settings: {problems}") from None
    except (ValueError, OSError) as err:  # a variable that should hold JSON does not
        detail = _json_problem(os.environ) or " ".join(str(err).split()) or type(err).__name__
        raise ConfigError(f"invalid settings: {detail}") from None
