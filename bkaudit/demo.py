"""`bkaudit demo`: the embedded default cluster end to end, as far as the project has come.

Today (foundation): start the embedded ZooKeeper and broker, write a BookKeeper-shaped znode tree, publish
one change event per znode to Kafka, run a Structured Streaming query (``bkaudit_kafka`` source,
``availableNow`` trigger) that lands them in a Delta table with ``deltalake``, and print what happened with
timings. Later issues replace the smoke job with the simulator, watcher and auditor.

Status: foundation smoke demo.

Example:
    $ bkaudit demo
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bkaudit.settings import Settings


def _say(message: str) -> None:
    sys.stderr.write(f"[demo] {message}\n")
    sys.stderr.flush()


def _timed(label: str, step: Callable[[], Any], timings: dict[str, float]) -> Any:
    started = time.monotonic()
    result = step()
    timings[label] = round(time.monotonic() - started, 2)
    _say(f"{label}: {timings[label]} s")
    return result


def run_demo(settings: Settings, *, keep_running: bool = False) -> dict[str, Any]:
    """Run the smoke demo and return its summary (also the command's JSON output)."""
    import pyarrow as pa
    from kafka import KafkaProducer
    from kazoo.client import KazooClient

    from connectors.delta.store import append_batch, read_table
    from connectors.devcluster import DevCluster
    from connectors.kafka.client_config import producer_config
    from connectors.kafka.spark_source import KafkaDataSource
    from connectors.kafka.topics import ensure_topic
    from streaming.session import build_spark_session

    timings: dict[str, float] = {}
    cluster = DevCluster(settings.dev)
    addresses = _timed("embedded services up", cluster.up, timings)
    _say(f"zookeeper {addresses['zookeeper']}, kafka {addresses['kafka']}")
    kafka = settings.kafka.model_copy(
        update={"bootstrap_servers": addresses["kafka"], "changes_topic": f"bkaudit.demo.{int(time.time())}"}
    )
    try:
        zk = KazooClient(hosts=addresses["zookeeper"])
        zk.start(timeout=15)
        root = f"/bkaudit-demo-{int(time.time())}/ledgers"

        def write_znodes() -> list[str]:
            paths = [f"{root}/available/10.0.0.{i}:3181" for i in range(1, 4)]
            paths += [f"{root}/00/0000/L{i:04d}" for i in range(10)]
            for path in paths:
                zk.create(path, b"", makepath=True)
            return paths

        paths = _timed("znodes written", write_znodes, timings)
        zk.stop()
        zk.close()

        def publish() -> None:
            ensure_topic(kafka, kafka.changes_topic, partitions=2)
            producer = KafkaProducer(**producer_config(kafka))
            for path in paths:
                producer.send(
                    kafka.changes_topic, key=path.encode(), value=json.dumps({"path": path}).encode()
                )
            producer.flush()
            producer.close()

        _timed("change events published", publish, timings)
        spark = _timed("spark session", lambda: build_spark_session(settings.spark), timings)
        spark.dataSource.register(KafkaDataSource)
        table = Path(settings.lakehouse_root).absolute() / "demo_changes"
        checkpoint = Path(settings.checkpoint_root).absolute() / "demo" / kafka.changes_topic

        def stream() -> None:
            frame = (
                spark.readStream.format("bkaudit_kafka")
                .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
                .option("subscribe", kafka.changes_topic)
                .load()
                .selectExpr("CAST(key AS STRING) AS path", "partition", "offset", "timestamp")
            )

            def land(batch: Any, batch_id: int) -> None:
                arrow = batch.toArrow()
                if arrow.num_rows:
                    append_batch(table, pa.table(arrow), app_id="bkaudit-demo", batch_id=batch_id)

            query = (
                frame.writeStream.foreachBatch(land)
                .option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()

        _timed("streaming query (availableNow) to Delta", stream, timings)
        landed = read_table(table)
        summary = {
            "zookeeper": addresses["zookeeper"],
            "kafka": addresses["kafka"],
            "znodes_written": len(paths),
            "events_published": len(paths),
            "delta_table": str(table),
            "delta_rows": landed.num_rows,
            "timings_s": timings,
        }
        _say(f"{landed.num_rows} rows in the Delta table {table}")
        return summary
    finally:
        if not keep_running:
            cluster.down()
            _say("embedded services stopped (use --keep-running to keep them)")
