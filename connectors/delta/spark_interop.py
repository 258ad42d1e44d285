"""Reading bkaudit's Delta tables and alerts topic from Spark: delta-spark and Spark's own Kafka connector.

The jars are the ``spark-interop`` component (:mod:`connectors.jars`, ``infra/bootstrap.sh jars``), handed to
Spark with ``spark.jars`` (never ``spark.jars.packages``: Ivy ignores Maven's mirror settings). delta-spark
4.4.0 and spark-sql-kafka 4.2.0 are compiled against Spark 4.2: on another Spark line a Delta scan fails
deep in a job with ``NoSuchMethodError``, so :func:`interop_conf` refuses it up front with one line.

A session for these reads is the project's own session with this configuration added::

    build_spark_session(SparkSettings(extra_conf=interop_conf()))  # streaming.session

Example:
    >>> conf = interop_conf(["/jars/delta-spark_2.13-4.4.0.jar", "/jars/kafka-clients-3.9.2.jar"], "4.2.1")
    >>> conf["spark.jars"]
    '/jars/delta-spark_2.13-4.4.0.jar,/jars/kafka-clients-3.9.2.jar'
    >>> conf["spark.sql.extensions"]
    'io.delta.sql.DeltaSparkSessionExtension'
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from connectors.jars import ensure_jars, jar_dir
from core.errors import ConfigError
from core.settings import KafkaSettings

#: The jars' component under infra/jars.
COMPONENT = "spark-interop"
#: The Spark line delta-spark 4.4.0 and spark-sql-kafka-0-10 4.2.0 are built for (major.minor).
SPARK_LINE = "4.2"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


def interop_jars(*, fetch: bool = True) -> list[Path]:
    """The ``spark-interop`` jars, sorted; copied by Maven first when ``fetch`` and absent or stale.

    Raises :class:`~core.errors.ConfigError` when there are none (``infra/bootstrap.sh jars`` copies them).

    Example:
        >>> # interop_jars()[0].name  → 'commons-pool2-2.13.1.jar'
    """
    if fetch:
        ensure_jars(COMPONENT)
    jars = sorted(jar_dir(COMPONENT).glob("*.jar"))
    if not jars:
        raise ConfigError(f"no jars in {jar_dir(COMPONENT)}: run `infra/bootstrap.sh jars` first")
    return jars


def check_spark_line(version: str) -> None:
    """Raise :class:`~core.errors.ConfigError` unless ``version`` (pyspark's) is on :data:`SPARK_LINE`.

    Example:
        >>> check_spark_line("4.2.1")
        >>> try:
        ...     check_spark_line("4.3.0")
        ... except ConfigError as err:
        ...     print(err)  # doctest: +ELLIPSIS
        delta-spark 4.4.0 and spark-sql-kafka 4.2.0 need Spark 4.2.x, this pyspark is 4.3.0: ...
    """
    if version.split(".")[:2] != SPARK_LINE.split("."):
        raise ConfigError(
            f"delta-spark 4.4.0 and spark-sql-kafka 4.2.0 need Spark {SPARK_LINE}.x, this pyspark is "
            f"{version}: read with pyspark=={SPARK_LINE}.* (elsewhere Delta scans fail: NoSuchMethodError)"
        )


def interop_conf(
    jars: Sequence[str | Path] | None = None, spark_version: str | None = None
) -> dict[str, str]:
    """Spark configuration that reads bkaudit's Delta tables and Kafka topics, for a session not yet started.

    ``jars`` defaults to :func:`interop_jars`, ``spark_version`` to the installed pyspark's (checked with
    :func:`check_spark_line`). Delta's state reconstruction gets few partitions: the tables are small and a
    local session has few cores (its default, 50, costs a task each).

    Example:
        >>> conf = interop_conf(["/j/a.jar"], "4.2.0")
        >>> conf["spark.sql.catalog.spark_catalog"]
        'org.apache.spark.sql.delta.catalog.DeltaCatalog'
    """
    if spark_version is None:
        import pyspark

        spark_version = pyspark.__version__
    check_spark_line(spark_version)
    paths = interop_jars() if jars is None else jars
    return {
        "spark.jars": ",".join(str(path) for path in paths),
        "spark.sql.extensions": DELTA_EXTENSION,
        "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
        "spark.databricks.delta.snapshotPartitions": "2",
    }


def kafka_read_options(settings: KafkaSettings, topic: str) -> dict[str, str]:
    """Options of ``spark.read.format("kafka")`` reading every partition of ``topic`` from start to end.

    The connection is ``settings``' (bootstrap servers, security protocol, SASL PLAIN/SCRAM user, CA file),
    in the Java client's terms. Client certificates (mutual TLS) and GSSAPI/OAUTHBEARER are not translated:
    a :class:`~core.errors.ConfigError` says so (give the ``kafka.*`` options yourself).

    Example:
        >>> options = kafka_read_options(KafkaSettings(bootstrap_servers="127.0.0.1:9092"), "bkaudit.alerts")
        >>> options["kafka.bootstrap.servers"], options["subscribe"], options["startingOffsets"]
        ('127.0.0.1:9092', 'bkaudit.alerts', 'earliest')
    """
    options = {
        "kafka.bootstrap.servers": settings.bootstrap_servers,
        "kafka.security.protocol": settings.security_protocol,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "endingOffsets": "latest",
    }
    if settings.ssl_certfile or settings.ssl_keyfile:
        raise ConfigError("kafka_read_options does not translate client certificates: set kafka.ssl.*")
    if settings.ssl_cafile:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = str(settings.ssl_cafile)
    if settings.security_protocol.startswith("SASL"):
        options.update(_sasl_options(settings))
    return options


def _sasl_options(settings: KafkaSettings) -> dict[str, str]:
    modules = {
        "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
        "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
        "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    }
    mechanism = settings.sasl_mechanism or "PLAIN"
    if mechanism not in modules or settings.sasl_username is None or settings.sasl_password is None:
        raise ConfigError(f"kafka_read_options translates SASL PLAIN/SCRAM with a user only, not {mechanism}")

    def quoted(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    password = settings.sasl_password.get_secret_value()
    user = quoted(settings.sasl_username)
    jaas = f"{modules[mechanism]} required username={user} password={quoted(password)};"
    return {"kafka.sasl.mechanism": mechanism, "kafka.sasl.jaas.config": jaas}
