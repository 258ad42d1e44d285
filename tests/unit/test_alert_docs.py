"""docs/alerts.md "The alert object": every example is an alert bkaudit publishes, and every kind has one.

The examples are read from the document itself, so a new :class:`AlertKind` without an example, or an
example the code would not produce (a field renamed, a severity changed, a timestamp format changed), fails
here. Each example is rebuilt through the code that publishes it (:class:`Alert` and, for the lost-bookie
kinds, the columnar :func:`~core.domain.ledger_alerts.alert_records`) and compared whole.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from connectors.kafka.alert_tail import parse_alert
from core.domain.alerts import Alert, AlertKind, alert_bytes, rfc3339_ms
from core.domain.ledger_alerts import (
    LEDGER_KINDS,
    alert_records,
    condition_table,
    detail_json,
    empty_open,
    ledger_transitions,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "alerts.md"
SECTION = "## The alert object"
FIELDS = [
    "alert_id",
    "cluster",
    "kind",
    "state",
    "severity",
    "ledger_id",
    "bookies",
    "pulsar_topic",
    "detected_at",
    "detail",
]
DETECTED_AT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


def section_text(doc: str) -> str:
    """The section "The alert object": from its heading to the next second-level heading."""
    start = doc.index(f"\n{SECTION}\n")
    end = doc.find("\n## ", start + 1)
    return doc[start : end if end >= 0 else len(doc)]


def json_blocks(text: str) -> list[str]:
    return re.findall(r"^```json\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)


def examples() -> list[dict[str, Any]]:
    return [json.loads(block) for block in json_blocks(section_text(DOC.read_text(encoding="utf-8")))]


EXAMPLES = examples()


def example_id(example: dict[str, Any]) -> str:
    return f"{example.get('kind')}-{example.get('state')}"


def epoch_ms(detected_at: str) -> int:
    moment = datetime.fromisoformat(detected_at)
    assert moment.utcoffset() == timedelta(0)
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def is_ledger_kind(kind: AlertKind) -> bool:
    return not kind.is_bookie_kind and not kind.is_cluster_kind


def firing_alert(example: dict[str, Any], started_at_ms: int) -> Alert:
    """The example's condition built with the constructor its kind uses (fired at ``started_at_ms``)."""
    kind = AlertKind(example["kind"])
    common = {
        "cluster": example["cluster"],
        "kind": kind,
        "started_at_ms": started_at_ms,
        "detected_at_ms": started_at_ms,
        "detail": example["detail"],
    }
    if kind.is_bookie_kind:
        (bookie_id,) = example["bookies"]
        return Alert.bookie(bookie_id=bookie_id, **common)
    if kind.is_cluster_kind:
        return Alert.cluster_level(**common)
    if kind.is_topic_kind:
        return Alert.topic(
            managed_ledger=example["detail"]["managed_ledger"],
            ledger_id=example["ledger_id"],
            pulsar_topic=example["pulsar_topic"],
            **common,
        )
    return Alert.ledger(
        ledger_id=example["ledger_id"],
        bookies=example["bookies"],
        pulsar_topic=example["pulsar_topic"],
        **common,
    )


def test_the_section_has_examples() -> None:
    assert len(EXAMPLES) >= len(AlertKind)


def test_one_firing_example_per_kind() -> None:
    firing = [e["kind"] for e in EXAMPLES if e["state"] == "firing"]
    assert sorted(firing) == sorted(kind.value for kind in AlertKind)


@pytest.mark.parametrize("example", EXAMPLES, ids=example_id)
def test_example_is_a_published_alert_object(example: dict[str, Any]) -> None:
    assert parse_alert(alert_bytes(example)) == example
    assert list(example) == FIELDS
    kind = AlertKind(example["kind"])
    assert example["severity"] == kind.severity
    assert example["state"] in ("firing", "resolved")
    assert re.fullmatch(r"[0-9a-f]{32}", example["alert_id"])
    assert isinstance(example["cluster"], str) and example["cluster"]
    if is_ledger_kind(kind):
        assert type(example["ledger_id"]) is int
    else:
        assert example["ledger_id"] is None
        assert example["pulsar_topic"] is None
    assert isinstance(example["bookies"], list)
    assert all(isinstance(bookie, str) for bookie in example["bookies"])
    if kind.is_bookie_kind:
        assert len(example["bookies"]) == 1
    if kind.is_cluster_kind:
        assert example["bookies"] == []
    assert example["pulsar_topic"] is None or example["pulsar_topic"].startswith("persistent://")
    assert DETECTED_AT.match(example["detected_at"])
    assert rfc3339_ms(epoch_ms(example["detected_at"])) == example["detected_at"]
    assert isinstance(example["detail"], dict)


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e["state"] == "firing"], ids=example_id)
def test_firing_example_round_trips_through_alert(example: dict[str, Any]) -> None:
    # A firing alert's condition started when it was detected: its id is computed from detected_at.
    alert = firing_alert(example, epoch_ms(example["detected_at"]))
    assert alert.to_json() == example
    assert list(alert.to_json()) == list(example)


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e["state"] == "resolved"], ids=example_id)
def test_resolved_example_resolves_a_documented_firing(example: dict[str, Any]) -> None:
    (fired,) = [e for e in EXAMPLES if e["state"] == "firing" and e["alert_id"] == example["alert_id"]]
    started_at_ms = epoch_ms(fired["detected_at"])
    resolved = firing_alert(fired, started_at_ms).resolved(at_ms=epoch_ms(example["detected_at"]))
    assert resolved.to_json() == example
    assert epoch_ms(example["detected_at"]) >= started_at_ms


@pytest.mark.parametrize(
    "example", [e for e in EXAMPLES if e["kind"] in LEDGER_KINDS and e["state"] == "firing"], ids=example_id
)
def test_lost_bookie_example_is_what_the_columnar_path_publishes(example: dict[str, Any]) -> None:
    at_ms = epoch_ms(example["detected_at"])
    conditions = condition_table(
        ledger_ids=[example["ledger_id"]],
        at_ms=np.array([at_ms]),
        kinds=[example["kind"]],
        bookies=[example["bookies"]],
        details=[detail_json(example["detail"])],
        topics=[example["pulsar_topic"]],
    )
    fired, _ = ledger_transitions(example["cluster"], empty_open(), conditions)
    ((key, value),) = alert_records(example["cluster"], fired)
    assert key == f"{example['cluster']}/ledger/{example['ledger_id']}".encode()
    assert json.loads(value) == example
    assert value == alert_bytes(example)  # byte for byte: the example's detail keys are sorted, as published
