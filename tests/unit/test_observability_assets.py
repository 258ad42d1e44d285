"""The Grafana dashboard and the Prometheus rules only use metrics the code really exports.

The exported names come from the code itself: the watcher's and the job's metric objects are instantiated in
fresh registries and their families listed with every sample suffix Prometheus will see (``_total``,
``_created``, ``_bucket``, ``_count``, ``_sum``). The rules are also checked and unit-tested by ``promtool``,
and every dashboard expression is parsed by it; ``make test`` installs it (Debian's prometheus package) when
it is missing, and without it those tests fail rather than skip.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from connectors.zookeeper.watcher import WatcherMetrics
from core.domain.alerts import AlertKind
from streaming.metrics import AUDIT_GAUGES, StreamMetrics

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "infra" / "grafana" / "bkaudit-dashboard.json"
RULES = REPO / "infra" / "prometheus" / "bkaudit-rules.yaml"
RULE_TESTS = REPO / "infra" / "prometheus" / "bkaudit-rules.test.yaml"
ALERTS_DOC = REPO / "docs" / "alerts.md"

# Series Prometheus itself adds to every scrape target; `up` is how "process down" is detected.
SCRAPE_SERIES = {"up"}
TARGET_LABELS = {"job", "instance"}
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
}
PANEL_TYPES = {"row", "text", "timeseries", "stat", "bargauge", "gauge", "table"}


def _metric_objects(value: Any) -> Iterator[MetricWrapperBase]:
    if isinstance(value, MetricWrapperBase):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _metric_objects(item)


def exported_metrics() -> dict[str, set[str]]:
    """Every sample name the watcher and the job expose → the label names it carries."""
    exported: dict[str, set[str]] = {}
    for holder in (WatcherMetrics(CollectorRegistry()), StreamMetrics()):
        labels = {
            metric._name: set(metric._labelnames)
            for obj in vars(holder).values()
            for metric in _metric_objects(obj)
        }
        for family in holder.registry.collect():
            family_labels = labels.get(family.name, set())
            for suffix in SUFFIXES[family.type]:
                exported[family.name + suffix] = set(family_labels) | (
                    {"le"} if suffix == "_bucket" else set()
                )
            for sample in family.samples:
                exported.setdefault(sample.name, set()).update(sample.labels)
    return exported


def exported_label_values() -> dict[tuple[str, str], set[str]]:
    """(sample name, label) → values present in a fresh registry (labels the code pre-creates)."""
    values: dict[tuple[str, str], set[str]] = {}
    for holder in (WatcherMetrics(CollectorRegistry()), StreamMetrics()):
        for family in holder.registry.collect():
            for sample in family.samples:
                for label, value in sample.labels.items():
                    values.setdefault((sample.name, label), set()).add(value)
    return values


EXPORTED = exported_metrics()

_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
    "inf", "nan",
}  # fmt: skip
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|!~|=)\s*\"([^\"]*)\"")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def _strip_variables(expr: str) -> str:
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", "1m", expr)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords and labels left out)."""
    text = _strip_variables(expr)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery durations
    text = _GROUPING.sub(" ", text)
    text = re.sub(r"\"[^\"]*\"|'[^']*'", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()", text):
        word = match.group(1)
        if word.lower() not in _KEYWORDS:
            names.add(word)
    return names


def selector_labels(expr: str) -> list[tuple[str, str, str, str]]:
    """(metric, label, operator, value) for every matcher written inside ``metric{...}``."""
    text = _strip_variables(expr)
    return [
        (metric, label, operator, value)
        for metric, body in _SELECTOR.findall(text)
        for label, operator, value in _MATCHER.findall(body)
    ]


def grouping_labels(expr: str) -> set[str]:
    return {
        label.strip()
        for _, body in _GROUPING.findall(_strip_variables(expr))
        for label in body.split(",")
        if label.strip()
    }


def check_expression(expr: str) -> list[str]:
    """Problems of one expression: unknown metrics, unknown labels, label values the code never sets."""
    problems = []
    names = metric_names(expr)
    if not names:
        problems.append(f"no metric found in {expr!r}")
    for name in names - SCRAPE_SERIES:
        if name not in EXPORTED:
            problems.append(f"{name} is not exported by the code")
    known_values = exported_label_values()
    for metric, label, operator, value in selector_labels(expr):
        allowed = TARGET_LABELS | EXPORTED.get(metric, set())
        if label not in allowed:
            problems.append(f"{metric} has no label {label!r}")
        present = known_values.get((metric, label))
        if operator == "=" and present and value not in present:
            problems.append(f"{metric}{{{label}}} is never {value!r} (the code sets {sorted(present)})")
    in_expression = set().union(*(EXPORTED.get(n, set()) for n in names)) | TARGET_LABELS | {"le"}
    for label in grouping_labels(expr) - in_expression:
        problems.append(f"grouping by {label!r}, which no metric of the expression has")
    return problems


# ------------------------------------------------------------------------------------------ the checker


def test_exported_names_come_from_the_code_with_their_suffixes():
    assert "bkaudit_watcher_events_published_total" in EXPORTED
    assert EXPORTED["bkaudit_watcher_events_published_total"] == {"type"}
    assert {
        "bkaudit_stream_batch_duration_seconds_bucket",
        "bkaudit_stream_batch_duration_seconds_sum",
    } <= set(EXPORTED)
    assert "le" in EXPORTED["bkaudit_watcher_publish_lag_seconds_bucket"]
    assert "bkaudit_watcher_events_published" not in EXPORTED  # a counter is only ever seen with _total
    for name, _ in AUDIT_GAUGES.values():
        assert name in EXPORTED


def test_the_checker_finds_names_and_flags_what_is_not_exported():
    expr = (
        "histogram_quantile(0.99, sum by (le, job) "
        '(rate(bkaudit_watcher_publish_lag_seconds_bucket{instance=~"$w"}[$__rate_interval]))) > 1 '
        "unless on (job) bkaudit_made_up_metric offset 5m"
    )
    assert metric_names(expr) == {"bkaudit_watcher_publish_lag_seconds_bucket", "bkaudit_made_up_metric"}
    assert check_expression(expr) == ["bkaudit_made_up_metric is not exported by the code"]
    assert check_expression("bkaudit_watcher_events_published") == [
        "bkaudit_watcher_events_published is not exported by the code"
    ]
    assert check_expression('bkaudit_watcher_queue_depth{reason="START"}') == [
        "bkaudit_watcher_queue_depth has no label 'reason'"
    ]
    assert check_expression('bkaudit_watcher_zookeeper_session_state{state="UP"}') == [
        "bkaudit_watcher_zookeeper_session_state{state} is never 'UP' (the code sets "
        "['CONNECTED', 'LOST', 'SUSPENDED'])"
    ]
    assert check_expression("sum by (purpose) (bkaudit_watcher_queue_depth)") == [
        "grouping by 'purpose', which no metric of the expression has"
    ]


# ------------------------------------------------------------------------------------------ Grafana


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels_with_queries() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] not in ("row", "text")]


def test_dashboard_uses_a_prometheus_datasource_variable():
    board = dashboard()
    assert board["title"] and board["uid"] and isinstance(board["schemaVersion"], int)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels_with_queries():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"]["uid"] == "${datasource}"


def test_dashboard_panels_have_the_required_fields_and_do_not_overlap():
    panels = dashboard()["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    occupied: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel["type"] in PANEL_TYPES, panel
        assert panel["title"].strip()
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("x", "y", "w", "h")), panel["title"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & occupied, f"{panel['title']} overlaps another panel"
        occupied |= cells
        if panel["type"] in ("row", "text"):
            continue
        assert panel["targets"], panel["title"]
        assert "fieldConfig" in panel and "defaults" in panel["fieldConfig"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]


def test_dashboard_queries_use_only_exported_metrics():
    problems = {
        f"{panel['title']} / {target['refId']}": check_expression(target["expr"])
        for panel in panels_with_queries()
        for target in panel["targets"]
    }
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            inner = re.fullmatch(r"label_values\((.+),\s*[a-zA-Z_]+\)", query)
            assert inner, query
            problems[f"variable {variable['name']}"] = check_expression(inner.group(1))
    assert {where: found for where, found in problems.items() if found} == {}


def test_dashboard_shows_every_audit_gauge():
    exprs = " ".join(t["expr"] for p in panels_with_queries() for t in p["targets"])
    assert {name for name, _ in AUDIT_GAUGES.values()} <= metric_names(exprs)


# ------------------------------------------------------------------------------------------ Prometheus


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    assert {g["name"] for g in document["groups"]} == {"bkaudit-watcher", "bkaudit-stream", "bkaudit-audit"}
    return [rule for group in document["groups"] for rule in group["rules"]]


def github_anchors(markdown: str) -> set[str]:
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", markdown, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_rules_are_complete_alerts_with_a_runbook():
    anchors = github_anchors(ALERTS_DOC.read_text())
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names))
    for rule in rules():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        annotations = rule["annotations"]
        assert annotations["summary"].strip() and annotations["description"].strip(), rule["alert"]
        path, _, anchor = annotations["runbook_url"].partition("#")
        assert path == "docs/alerts.md" and anchor in anchors, (
            f"{rule['alert']}: no runbook section #{anchor}"
        )


def test_rules_use_only_exported_metrics():
    problems = {rule["alert"]: check_expression(rule["expr"]) for rule in rules()}
    assert {alert: found for alert, found in problems.items() if found} == {}


def test_every_alert_kind_above_info_has_a_rule_on_its_gauge_with_its_severity():
    by_kind = {rule["labels"]["alert_kind"]: rule for rule in rules() if "alert_kind" in rule["labels"]}
    for kind in AlertKind:
        if kind.severity == "info":
            assert kind.value not in by_kind  # dashboard only
            continue
        rule = by_kind[kind.value]
        assert AUDIT_GAUGES[kind.value][0] in metric_names(rule["expr"]), kind
        assert rule["labels"]["severity"] == kind.severity, kind


def test_every_alert_kind_has_a_runbook_section():
    anchors = github_anchors(ALERTS_DOC.read_text())
    assert {kind.value.lower() for kind in AlertKind} <= anchors


# ------------------------------------------------------------------------------------------ promtool


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail(
            "promtool is not on PATH: `make test` installs it as root on Debian (apt-get install "
            "--no-install-recommends prometheus); elsewhere install Prometheus' promtool and retry",
            pytrace=False,
        )
    return found


def test_promtool_accepts_the_rules_and_their_unit_tests():
    promtool = _promtool()
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name], capture_output=True, text=True, cwd=RULE_TESTS.parent
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_promtool_parses_every_dashboard_expression(tmp_path):
    promtool = _promtool()
    recorded = [
        {
            "record": f"dashboard:panel_{panel['id']}:{target['refId']}",
            "expr": _strip_variables(target["expr"]),
        }
        for panel in panels_with_queries()
        for target in panel["targets"]
    ]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))
    checked = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


# ------------------------------------------------------------------------------------------ runbook links


def test_monitoring_writes_rules_and_dashboard_with_every_runbook_under_the_docs_base(cli, tmp_path):
    base = "https://git.example.com/bkaudit/-/blob/main"
    result = cli("config", "monitoring", "--docs-base-url", base + "/", "--out", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    anchors = github_anchors(ALERTS_DOC.read_text())
    written = yaml.safe_load((tmp_path / RULES.name).read_text())
    urls = [rule["annotations"]["runbook_url"] for group in written["groups"] for rule in group["rules"]]
    assert len(urls) == len(rules())
    for url in urls:
        page, _, anchor = url.partition("#")
        assert page == f"{base}/docs/alerts.md" and anchor in anchors, url
    board = json.loads((tmp_path / DASHBOARD.name).read_text())
    docs = next(v for v in board["templating"]["list"] if v["name"] == "docs")
    assert docs["query"] == docs["current"]["value"] == base
    assert {**board, "templating": None} == {**dashboard(), "templating": None}  # only the variable changed


def test_every_dashboard_link_opens_a_runbook_section_under_the_docs_variable():
    anchors = github_anchors(ALERTS_DOC.read_text())
    board = dashboard()
    links = board["links"] + [link for panel in board["panels"] for link in panel.get("links", [])]
    assert len(links) >= 5
    for link in links:
        page, _, anchor = link["url"].partition("#")
        assert page == "${docs}/docs/alerts.md" and (not anchor or anchor in anchors), link


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--docs-base-url", "git.example.com"], "is not an absolute http(s) URL"),
        (["--docs-base-url", "https://d.example", "--infra", "/nonexistent"], "no such file; pass --infra"),
    ],
)
def test_monitoring_refuses_a_relative_url_or_a_missing_infra_in_one_line(cli, tmp_path, args, message):
    result = cli("config", "monitoring", *args, "--out", str(tmp_path))
    assert result.exit_code == 2 and message in result.stderr and len(result.stderr.splitlines()) == 1
