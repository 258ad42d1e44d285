"""An alerts-topic record's value becomes an alert object or a ValueError naming what is wrong: truncated,
random and hostile values never raise anything else (the tail names them and goes on)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.kafka.alert_tail import parse_alert
from core.domain.alerts import Alert, AlertKind

ALERT = Alert.bookie(
    cluster="c", kind=AlertKind.BOOKIE_LOST, bookie_id="b1:3181", started_at_ms=1, detected_at_ms=2
).to_bytes()


@given(st.binary(max_size=300))
def test_random_bytes_are_an_alert_or_a_value_error(value: bytes) -> None:
    try:
        body = parse_alert(value)
    except ValueError as err:
        assert str(err)
    else:
        assert {"alert_id", "kind", "state"} <= set(body)


@pytest.mark.parametrize("cut", range(len(ALERT)))
def test_every_truncation_of_a_published_alert_is_a_value_error(cut: int) -> None:
    with pytest.raises(ValueError, match=r"not JSON|not an alert object"):
        parse_alert(ALERT[:cut])


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "tombstone"),
        (b"[1, 2]", "a JSON list"),
        (b'"BOOKIE_LOST"', "a JSON str"),
        (b"1e999999", "a JSON float"),
        (b'{"kind": "BOOKIE_LOST", "state": "firing"}', "no alert_id"),
        (b"\xff\xfe{}", "not JSON"),
        (b"[" * 100_000, "not JSON"),  # deeply nested: no RecursionError
    ],
)
def test_hostile_values_name_what_is_wrong(value: bytes | None, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_alert(value)


def test_a_published_alert_parses_to_the_object_the_job_sent() -> None:
    assert parse_alert(ALERT) == json.loads(ALERT)
