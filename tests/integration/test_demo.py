"""`bkaudit demo --tls` end to end (one run, shared through the ``demo_run`` fixture): its open alerts against
the simulator's ground truth, no plaintext listener on its embedded services, its services stopped, no ledger
password in any of its tables, and a console that tells the story while Spark, py4j and the clients write to
the log file."""

from __future__ import annotations

import base64
import re
from collections import defaultdict

import pytest
from deltalake import DeltaTable

from connectors.delta.tables import TABLES
from connectors.devcluster import DevCluster
from tests.integration.conftest import DEMO_PASSWORD, DemoRun

pytestmark = pytest.mark.integration

# What the libraries print, in the forms they print it: log4j's default layout ("26/11/26 08:55:51 WARN
# Utils: ..."), the JVM's and Spark's own banners, the Python workers' chatter (copied to the JVM's stderr),
# and the Python loggers of py4j and the Kafka and ZooKeeper clients.
SPARK_LOG4J = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ")
SPARK_BANNERS = ("log4j", "Setting default log level", "sc.setLogLevel", "Using incubator modules")
PYTHON_WORKERS = "TransformWithStateInPandas Python worker"
LIBRARY_LOGGERS = {
    "py4j": re.compile(r" py4j[.:]"),
    "Kafka client": re.compile(r" connectors\.kafka\.librdkafka: |rdkafka#"),
    "ZooKeeper client": re.compile(r" kazoo[.:]"),
}


def library_lines(text: str) -> dict[str, list[str]]:
    """The lines of ``text`` that a library wrote, by who wrote them."""
    found: dict[str, list[str]] = defaultdict(list)
    for line in text.splitlines():
        if SPARK_LOG4J.match(line) or any(banner in line for banner in SPARK_BANNERS):
            found["Spark"].append(line)
        if PYTHON_WORKERS in line:
            found["Spark Python workers"].append(line)
        for name, pattern in LIBRARY_LOGGERS.items():
            if pattern.search(line):
                found[name].append(line)
    return dict(found)


def test_the_console_tells_the_story_and_the_libraries_write_to_the_log_file(demo_run: DemoRun):
    assert library_lines(demo_run.console) == {}, demo_run.console[-3000:]
    lines = demo_run.console.splitlines()
    assert lines[0].endswith(f"{demo_run.log_file} (--verbose shows them)"), lines[0]  # said once, first
    assert sum(str(demo_run.log_file) in line for line in lines) == 1
    assert any("STEP 1: bookie" in line for line in lines) and any("SUMMARY" in line for line in lines)
    # It ends by asking what losing the worst pair of bookies would do, with the command to ask it.
    assert any("] WHAT IF " in line for line in lines), demo_run.narration
    assert any("bkaudit query what-if --down" in line for line in lines)
    logged = library_lines(demo_run.log_file.read_text(errors="replace"))
    assert {"Spark", "Spark Python workers", "py4j", "Kafka client", "ZooKeeper client"} <= set(logged), {
        name: len(found) for name, found in logged.items()
    }


def test_the_demos_open_alerts_match_its_ground_truth(demo_run: DemoRun):
    summary = demo_run.summary
    assert summary["matches_ground_truth"], demo_run.narration
    assert summary["open_alerts"] == summary["ground_truth"], demo_run.narration
    # The story's own checks: a placement problem and a silent bookie are open at the end, nothing else.
    assert set(summary["ground_truth"]) == {"PLACEMENT_NOT_ADHERING", "BOOKIE_UNRESPONSIVE"}


def test_the_open_alerts_table_names_exactly_the_entities_of_the_ground_truth(demo_run: DemoRun):
    rows = DeltaTable(str(demo_run.lakehouse / "open_alerts")).to_pyarrow_table().to_pylist()
    found: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        found[row["kind"]].add(row["entity"].split("/", 1)[1])
    truth = demo_run.summary["ground_truth_ids"]
    for kind in set(found) | set(truth["alerts"]):
        required = {str(i) for i in truth["alerts"].get(kind, [])}
        allowed = required | {str(i) for i in truth["may_alert"].get(kind, [])}
        assert required <= found[kind] <= allowed, (kind, found[kind], required, allowed)
    assert found["BOOKIE_UNRESPONSIVE"] == {demo_run.summary["story"]["silent_bookie"]}


def test_the_tls_demo_matched_its_ground_truth_with_every_plaintext_port_closed(demo_run: DemoRun):
    closing = [line for line in demo_run.narration.splitlines() if "auditor matches the ground truth" in line]
    assert len(closing) == 1 and closing[0].endswith(": yes"), demo_run.narration
    assert "plaintext listeners: none;" in demo_run.narration  # what the demo itself says
    probed = demo_run.listeners  # every port each service's process listened on, probed before the end
    zookeeper, kafka, bookies = probed["zookeeper"], probed["kafka"], probed["bookies"]
    assert len(zookeeper) == 1 and len(kafka) == 2, (
        probed
    )  # ZooKeeper's client port; the broker's and the controller's
    for port, found in {**zookeeper, **kafka}.items():
        # A TLS handshake with the client pair completes; the service's own plaintext request gets no answer.
        assert found["tls"] and found["plaintext"] in ("closed", "tls-alert"), (port, found)
    # A simulated bookie answers a plaintext read "authentication required": nothing before TLS and a role.
    assert len(bookies) == 6 and set(bookies.values()) == {"EUA"}, bookies


def test_the_demo_stopped_the_services_it_started(demo_run: DemoRun):
    status = DevCluster(demo_run.settings.dev).status()
    assert not status["zookeeper"]["running"] and not status["kafka"]["running"], status


def test_no_table_holds_the_ledger_password(demo_run: DemoRun):
    assert demo_run.clusters_with_known_password == 1  # the simulated cluster's ledgers had this password
    needles = [DEMO_PASSWORD, base64.b64encode(DEMO_PASSWORD), DEMO_PASSWORD.hex().encode()]
    for name in TABLES:
        table = DeltaTable(str(demo_run.lakehouse / name)).to_pyarrow_table()
        text = repr(table.to_pylist()).encode()
        assert not any(needle in text for needle in needles), name
    for path in demo_run.lakehouse.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not any(needle in data for needle in needles), path
    ledgers = DeltaTable(str(demo_run.lakehouse / "ledgers")).to_pyarrow_table()
    assert ledgers.num_rows >= 20 and all(ledgers.column("has_password").to_pylist())  # it had one
