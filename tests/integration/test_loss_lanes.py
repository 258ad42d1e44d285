"""The two lanes against one loss owner: no gap between them, and a replayed loss re-fires nothing new.

The ledger lane is :meth:`AuditSink.process` (it calls ``sink.loss.apply`` after writing a batch's ledgers
and index rows); the membership lane is ``sink.loss.apply`` with membership rows, as
:class:`streaming.membership.MembershipLane` calls it. Real broker, real Delta tables.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from connectors.delta.tables import TABLES, read_table, table_path
from connectors.kafka.topics import ensure_topic
from core.domain.rules.auditor_lag import UnmarkedAtRisk
from streaming.loss import membership_app
from streaming.sink import AuditSink, SinkConfig
from tests.integration.event_fixtures import alerts_on, closed_ledger_payload
from tests.integration.event_fixtures import decision_table as decisions

pytestmark = pytest.mark.integration

APP = "lanes-test"
UNDER = "LEDGER_UNDER_REPLICATED"


def writable(*bookies: str) -> list[tuple[str, int, None, str, dict[str, Any]]]:
    return [("bookie_state", 1_000, None, b, {"status": "WRITABLE", "lost": False}) for b in bookies]


def ledger(ledger_id: int, ensemble: list[str], at_ms: int, mzxid: int) -> tuple[str, int, int, None, Any]:
    return ("ledger_state", at_ms, ledger_id, None, closed_ledger_payload(ensemble, mzxid))


def loss_rows(bookie: str, at_ms: int) -> list[dict[str, Any]]:
    """What the membership lane hands the loss owner when ``bookie`` is lost."""
    since = {"missing_since_ms": at_ms - 500}
    return [
        {
            "kind": "bookie_state",
            "at_ms": at_ms,
            "bookie_id": bookie,
            "payload": {"status": "GONE", "lost": True, **since},
        },
        {"kind": "bookie_lost", "at_ms": at_ms, "bookie_id": bookie, "payload": since},
    ]


def lose(sink: AuditSink, bookie: str, at_ms: int, batch_id: int) -> Any:
    return sink.loss.apply(
        app_id=membership_app(APP), batch_id=batch_id, cluster="c1", membership=loss_rows(bookie, at_ms)
    )


def open_ledger_alerts(root: Path, kind: str = UNDER) -> list[int]:
    rows = read_table(root, "open_alerts").to_pylist()
    return sorted(r["ledger_id"] for r in rows if r["kind"] == kind)


def firing_ids(kafka: Any, ledger_id: int, kind: str = UNDER) -> set[str]:
    return {
        alert["alert_id"]
        for _, alert in alerts_on(kafka)
        if alert["kind"] == kind and alert["ledger_id"] == ledger_id and alert["state"] == "firing"
    }


@pytest.fixture
def sink(kafka_settings: Any, tmp_path: Path) -> AuditSink:
    ensure_topic(kafka_settings, kafka_settings.alerts_topic, 1)
    config = SinkConfig(lakehouse_root=tmp_path / "lh", app_id=APP, kafka=kafka_settings)
    made = AuditSink(config)
    made.process(decisions(*writable("b1", "b2", "b3", "b4"), ledger(1, ["b2", "b3", "b4"], 1_000, 10)), 0)
    return made


def test_a_ledger_the_ledger_lane_moves_onto_a_lost_bookie_is_alerted_then_resolved(
    sink: AuditSink, tmp_path: Path
) -> None:
    root = tmp_path / "lh"
    lose(sink, "b1", 2_000, 0)
    assert open_ledger_alerts(root) == []  # ledger 1 is not on b1 yet

    sink.process(decisions(ledger(1, ["b1", "b2", "b3"], 3_000, 20)), 1)
    assert open_ledger_alerts(root) == [1]

    sink.process(decisions(ledger(1, ["b4", "b2", "b3"], 4_000, 30)), 2)  # re-replicated off b1
    assert open_ledger_alerts(root) == []

    sink.process(decisions(ledger(1, ["b1", "b2", "b3"], 5_000, 40)), 3)
    assert open_ledger_alerts(root) == [1]
    sink.process(decisions(("ledger_deleted", 6_000, 1, None, {"mzxid": 50})), 4)
    assert open_ledger_alerts(root) == []


def test_a_loss_that_lands_between_the_ledger_lanes_index_write_and_its_loss_call_alerts_once(
    sink: AuditSink, kafka_settings: Any, tmp_path: Path
) -> None:
    """The race: the ledger lane has written ledger 1's new index rows (now on b1) but not yet asked the
    loss owner; the membership lane loses b1 meanwhile. Whichever runs second sees the other's effect."""
    paused, release = threading.Event(), threading.Event()
    ledger_lane_apply = sink.loss.apply

    def apply_after_release(**kwargs: Any) -> Any:
        if kwargs.get("changed_rows"):
            paused.set()
            assert release.wait(30)
        return ledger_lane_apply(**kwargs)

    sink.loss.apply = apply_after_release  # type: ignore[method-assign]
    errors: list[BaseException] = []

    def ledger_lane() -> None:
        try:
            sink.process(decisions(ledger(1, ["b1", "b2", "b3"], 3_000, 20)), 1)
        except BaseException as error:  # surfaced below
            errors.append(error)

    thread = threading.Thread(target=ledger_lane)
    thread.start()
    assert paused.wait(60), "the ledger lane never reached its loss call"
    report = lose(sink, "b1", 3_500, 0)  # the membership lane, while the ledger lane waits
    assert [a["ledger_id"] for a in report.alerts if a["kind"] == UNDER] == [1]
    release.set()
    thread.join(60)
    assert not errors, errors

    assert open_ledger_alerts(tmp_path / "lh") == [1]
    assert len(firing_ids(kafka_settings, 1)) == 1


def test_the_ledger_lane_first_then_the_loss_alerts_once(
    sink: AuditSink, kafka_settings: Any, tmp_path: Path
) -> None:
    sink.process(decisions(ledger(1, ["b1", "b2", "b3"], 3_000, 20)), 1)
    assert open_ledger_alerts(tmp_path / "lh") == []
    lose(sink, "b1", 3_500, 0)
    sink.process(decisions(ledger(2, ["b1", "b3", "b4"], 4_000, 21)), 2)
    assert open_ledger_alerts(tmp_path / "lh") == [1, 2]
    assert len(firing_ids(kafka_settings, 1)) == 1 and len(firing_ids(kafka_settings, 2)) == 1


def test_a_loss_replayed_by_a_restarted_job_publishes_the_same_ids_and_writes_nothing(
    sink: AuditSink, kafka_settings: Any, tmp_path: Path
) -> None:
    root = tmp_path / "lh"
    sink.process(decisions(ledger(2, ["b1", "b3", "b4"], 1_500, 11)), 1)
    first = lose(sink, "b1", 2_000, 7)
    versions = {name: DeltaTable(table_path(root, name)).version() for name in TABLES}
    state = {name: read_table(root, name).to_pylist() for name in TABLES}

    # The job died after the loss was recorded but before the lane saved its state: the new process (a
    # fresh loss owner, loaded from Delta) runs the same membership batch again.
    restarted = AuditSink(sink.config)
    again = lose(restarted, "b1", 2_000, 7)

    assert [(a["alert_id"], a["state"]) for a in again.alerts] == [
        (a["alert_id"], a["state"]) for a in first.alerts
    ]
    assert {a["kind"] for a in first.alerts} == {"BOOKIE_LOST", UNDER}
    assert list(first.phase_s) == ["lock", "membership", "evaluate", "transitions", "publish", "record"]
    assert sum(first.phase_s.values()) <= first.seconds + 0.01
    assert {name: DeltaTable(table_path(root, name)).version() for name in TABLES} == versions
    assert {name: read_table(root, name).to_pylist() for name in TABLES} == state
    assert again.skipped_replay_tables > 0
    assert restarted.loss.lost() == frozenset({"b1"})


def membership_clock(
    sink: AuditSink, at_ms: int, batch_id: int, rows: list[dict[str, Any]] | None = None
) -> Any:
    """A membership lane batch that read its partition's heartbeat at ``at_ms`` (and ``rows``)."""
    return sink.loss.apply(
        app_id=membership_app(APP),
        batch_id=batch_id,
        cluster="c1",
        membership=rows or [],
        membership_clock_ms=at_ms,
    )


def open_bookie_alerts(root: Path) -> dict[str, dict[str, Any]]:
    rows = read_table(root, "open_alerts").to_pylist()
    return {r["entity"]: json.loads(r["detail"] or "{}") for r in rows if r["kind"] == "BOOKIE_LOST"}


def test_a_bookie_named_by_a_ledger_but_never_registered_is_lost_with_its_ledgers(
    sink: AuditSink, tmp_path: Path
) -> None:
    root = tmp_path / "lh"
    sink.process(decisions(ledger(2, ["b1", "ghost:3181", "b2"], 2_000, 11)), 1)
    membership_clock(sink, 1_999, 0)  # the registrations are not read up to when it was named: wait
    assert open_bookie_alerts(root) == {} and open_ledger_alerts(root) == []

    membership_clock(sink, 2_500, 1)
    assert open_bookie_alerts(root) == {
        "bookie/ghost:3181": {"missing_since": 2_500, "never_registered": True}
    }
    assert open_ledger_alerts(root) == [2]
    assert "ghost:3181" in sink.loss.lost()
    bookie = next(r for r in read_table(root, "bookies").to_pylist() if r["bookie_id"] == "ghost:3181")
    assert (bookie["status"], bookie["lost"], bookie["has_cookie"]) == ("GONE", True, False)

    # It registers after all: the loss resolves with its ledger's alert.
    returned = [("bookie_state", 3_000, None, "ghost:3181", {"status": "WRITABLE", "lost": False})]
    rows = [{"kind": k, "at_ms": t, "bookie_id": b, "payload": p} for k, t, _, b, p in returned]
    membership_clock(sink, 3_000, 2, rows)
    assert open_bookie_alerts(root) == {} and open_ledger_alerts(root) == []


def test_a_registration_read_before_the_clock_passes_the_ledger_is_never_a_loss(
    sink: AuditSink, tmp_path: Path
) -> None:
    root = tmp_path / "lh"
    sink.process(decisions(ledger(2, ["b1", "late:3181", "b2"], 2_000, 11)), 1)
    registered = [
        {
            "kind": "bookie_state",
            "at_ms": 1_500,
            "bookie_id": "late:3181",
            "payload": {"status": "WRITABLE", "lost": False},
        }
    ]
    membership_clock(sink, 2_500, 0, registered)
    assert open_bookie_alerts(root) == {} and open_ledger_alerts(root) == []


def test_a_never_registered_bookie_stays_lost_across_a_restart(
    kafka_settings: Any, sink: AuditSink, tmp_path: Path
) -> None:
    root = tmp_path / "lh"
    sink.process(decisions(ledger(2, ["b1", "ghost:3181", "b2"], 2_000, 11)), 1)
    membership_clock(sink, 2_500, 0)
    sink.close()
    restarted = AuditSink(SinkConfig(lakehouse_root=root, app_id=APP, kafka=kafka_settings))
    membership_clock(restarted, 3_000, 1)  # nothing new: no second alert, the loss still open
    assert list(open_bookie_alerts(root)) == ["bookie/ghost:3181"] and open_ledger_alerts(root) == [2]
    assert "ghost:3181" in restarted.loss.lost()


def test_a_never_registered_bookie_is_judged_from_the_stored_index_after_a_restart(
    kafka_settings: Any, tmp_path: Path
) -> None:
    """Folded and restarted before any judgement: the name comes from the index's partitions and the rows
    from the stored index (older versions told apart by their mzxid)."""
    ensure_topic(kafka_settings, kafka_settings.alerts_topic, 1)
    root = tmp_path / "lh"
    config = SinkConfig(lakehouse_root=root, app_id=APP, kafka=kafka_settings, index_append_interval_s=0)
    first = AuditSink(config)
    first.process(decisions(*writable("b1", "b2"), ledger(2, ["b1", "ghost:3181", "b2"], 2_000, 11)), 0)
    first.process(decisions(ledger(3, ["b1", "b2"], 2_100, 12)), 1)  # the index append runs after batch 0
    first.ledger_log.fold()  # the ledgers leave memory: only the stored index rows name the bookie
    first.close()
    restarted = AuditSink(config)
    membership_clock(restarted, int(time.time() * 1000) + 60_000, 0)
    assert list(open_bookie_alerts(root)) == ["bookie/ghost:3181"] and open_ledger_alerts(root) == [2]


def test_the_unmarked_at_risk_ledgers_are_the_open_ledger_alerts_whose_rows_carry_no_mark(
    sink: AuditSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``AUDITOR_LAGGING``'s input: the loss owner's open ledger alerts, less the ledgers whose current row
    the sink marked (an ``under_replication`` decision, as the timers query relays a ``urL`` mark). Looked
    up again only once a row or the open set changed."""
    assert sink.loss.unmarked_at_risk() == UnmarkedAtRisk()
    sink.process(decisions(ledger(2, ["b2", "b3", "b1"], 1_500, 11)), 1)
    lose(sink, "b2", 2_000, 0)
    lookups: list[int] = []
    take = sink.ledger_log.take
    monkeypatch.setattr(sink.ledger_log, "take", lambda *args, **kw: lookups.append(1) or take(*args, **kw))
    assert sink.loss.unmarked_at_risk() == UnmarkedAtRisk(2, 2_000, (1, 2))
    assert sink.loss.unmarked_at_risk() == UnmarkedAtRisk(2, 2_000, (1, 2)) and len(lookups) == 1

    marked = {"state": "SET", "replicas": ["b2"], "mark_ctime_ms": 2_500}
    sink.process(decisions(("under_replication", 3_000, 1, None, marked)), 2)
    assert sink.loss.unmarked_at_risk() == UnmarkedAtRisk(1, 2_000, (2,))
    sink.process(decisions(("under_replication", 4_000, 2, None, marked)), 3)
    assert sink.loss.unmarked_at_risk() == UnmarkedAtRisk()
    sink.process(decisions(("under_replication", 5_000, 1, None, {"state": "CLEARED", "replicas": []})), 4)
    assert sink.loss.unmarked_at_risk() == UnmarkedAtRisk(1, 2_000, (1,))
