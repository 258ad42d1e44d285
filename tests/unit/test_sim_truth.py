"""Ground truth of the simulator (pure): every alert kind, the lost-bookie delay rule, and ensemble choice."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping
from dataclasses import replace

import pytest

from bkaudit.sim.ensemble import (
    choose_ensemble,
    choose_replacement,
    choose_single_rack_ensemble,
    is_adhering,
)
from bkaudit.sim.errors import NotEnoughBookiesError
from bkaudit.sim.truth import (
    ALERT_KINDS,
    Absence,
    BookieSnapshot,
    ClusterSnapshot,
    Registration,
    TruthParameters,
    ground_truth,
    lost_bookies,
)
from core.domain.isolation import ISOLATION_METADATA_KEY, IsolationGroups, encode_isolation_config
from core.domain.metadata import DigestType, LedgerMetadata, LedgerPassword, LedgerState, Segment
from core.domain.striping import entries_striped_to_bookie

NOW = 1_000_000
RACKS = {"b1": "/r1", "b2": "/r2", "b3": "/r3", "b4": "/r1", "b5": "/r2", "b6": "/r3"}


def closed(
    ensemble: Iterable[str],
    last_entry_id: int = 9,
    *,
    write_quorum: int = 2,
    ack_quorum: int = 2,
    segments: tuple[Segment, ...] | None = None,
    state: LedgerState = LedgerState.CLOSED,
) -> LedgerMetadata:
    members = tuple(ensemble)
    closed_state = state is LedgerState.CLOSED
    return LedgerMetadata(
        ensemble_size=len(members),
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        state=state,
        last_entry_id=last_entry_id if closed_state else -1,
        length=(last_entry_id + 1) * 10 if closed_state else 0,
        digest_type=DigestType.CRC32C,
        password=LedgerPassword(b"top-secret-password"),
        segments=segments or (Segment(0, members),),
        ctoken=0,
    )


def stripes(ledgers: Mapping[int, LedgerMetadata], bookie: str) -> dict[int, frozenset[int]]:
    """Exactly the entries each ledger stripes to ``bookie`` (a healthy bookie's store)."""
    held: dict[int, frozenset[int]] = {}
    for ledger_id, md in ledgers.items():
        if md.state is not LedgerState.CLOSED or md.last_entry_id < 0:
            continue
        entries: set[int] = set()
        for segment in md.segment_ranges():
            if segment.is_empty:
                continue
            for index, member in enumerate(segment.ensemble):
                if member == bookie:
                    assert segment.last_entry_id is not None
                    entries.update(
                        entries_striped_to_bookie(
                            index,
                            segment.first_entry_id,
                            segment.last_entry_id,
                            md.ensemble_size,
                            md.write_quorum,
                        )
                    )
        if entries:
            held[ledger_id] = frozenset(entries)
    return held


def snapshot(
    ledgers: Mapping[int, LedgerMetadata],
    *,
    down: Mapping[str, int] | None = None,
    readonly: Iterable[str] = (),
    delay_s: int = 0,
    absences: Iterable[Absence] = (),
    bookie_overrides: Mapping[str, dict[str, object]] | None = None,
    holdings_overrides: Mapping[str, dict[int, frozenset[int]]] | None = None,
    **extra: object,
) -> ClusterSnapshot:
    """Six healthy bookies over three racks, holding exactly their stripes, unless told otherwise.

    ``down`` maps bookie → missing since (ms); an absence is recorded for it.
    """
    down = dict(down or {})
    readonly_set = set(readonly)
    bookies: dict[str, BookieSnapshot] = {}
    for bookie_id, rack in RACKS.items():
        registration = (
            Registration.NONE
            if bookie_id in down
            else Registration.READONLY
            if bookie_id in readonly_set
            else Registration.WRITABLE
        )
        holdings = stripes(ledgers, bookie_id)
        holdings.update((holdings_overrides or {}).get(bookie_id, {}))
        options: dict[str, object] = {"serving": bookie_id not in down, "holdings": holdings}
        options.update((bookie_overrides or {}).get(bookie_id, {}))
        bookies[bookie_id] = BookieSnapshot(bookie_id, registration, rack, **options)  # type: ignore[arg-type]
    all_absences = (*absences, *(Absence(bookie, since) for bookie, since in down.items()))
    return ClusterSnapshot(
        now_ms=NOW,
        bookies=bookies,
        ledgers=ledgers,
        absences=all_absences,
        lost_bookie_recovery_delay_s=delay_s,
        **extra,  # type: ignore[arg-type]
    )


def flagged(truth: dict[str, object]) -> dict[str, list[object]]:
    alerts = truth["alerts"]
    assert isinstance(alerts, dict)
    return {kind: ids for kind, ids in alerts.items() if ids}


# ---------------------------------------------------------------------------------------------- healthy


def test_a_healthy_cluster_flags_nothing_and_lists_every_kind() -> None:
    ledgers = {1: closed(["b1", "b2", "b3"]), 2: closed(["b4", "b5", "b6"], write_quorum=3)}
    truth = ground_truth(snapshot(ledgers))
    assert flagged(truth) == {}
    assert set(truth["alerts"]) == set(ALERT_KINDS)
    assert truth["ledgers"]["live"] == 2 and truth["ledgers"]["closed"] == 2
    json.dumps(truth)  # JSON-serialisable


def test_the_password_never_appears_in_the_truth() -> None:
    truth = ground_truth(snapshot({1: closed(["b1", "b2", "b3"])}, down={"b1": 0}))
    assert "top-secret-password" not in json.dumps(truth)


# ----------------------------------------------------------------------------------------- lost bookies


def test_a_lost_bookie_makes_its_ledgers_under_replicated() -> None:
    ledgers = {1: closed(["b1", "b2", "b3"]), 2: closed(["b4", "b5", "b6"]), 3: closed(["b2", "b3", "b1"])}
    truth = ground_truth(snapshot(ledgers, down={"b1": NOW - 1000}))
    assert flagged(truth) == {"BOOKIE_LOST": ["b1"], "LEDGER_UNDER_REPLICATED": [1, 3]}
    assert truth["bookies"]["b1"]["lost"] is True
    assert truth["bookies"]["b1"]["missing_since_ms"] == NOW - 1000


def test_open_and_old_segments_count_for_under_replication() -> None:
    two_segments = closed(
        ["b4", "b2", "b3"], segments=(Segment(0, ("b1", "b2", "b3")), Segment(5, ("b4", "b2", "b3")))
    )
    open_ledger = closed(["b1", "b5", "b6"], state=LedgerState.OPEN)
    in_recovery = closed(["b1", "b5", "b6"], state=LedgerState.IN_RECOVERY)
    ledgers = {1: two_segments, 2: open_ledger, 3: in_recovery}
    truth = ground_truth(snapshot(ledgers, down={"b1": 0}))
    assert truth["alerts"]["LEDGER_UNDER_REPLICATED"] == [1, 2, 3]


def test_no_surviving_copy_is_unrecoverable_not_under_replicated() -> None:
    ledgers = {
        1: closed(["b1", "b2", "b3"], write_quorum=1, ack_quorum=1),  # WQ=1: b1's entries are gone
        2: closed(["b1", "b2", "b3"]),  # WQ=2: every entry has another copy
    }
    truth = ground_truth(snapshot(ledgers, down={"b1": 0}))
    assert truth["alerts"]["LEDGER_UNRECOVERABLE"] == [1]
    assert truth["alerts"]["LEDGER_UNDER_REPLICATED"] == [2]


def test_two_lost_bookies_sharing_a_write_set_are_unrecoverable() -> None:
    ledgers = {1: closed(["b1", "b2", "b3"]), 2: closed(["b1", "b4", "b5", "b2"])}
    truth = ground_truth(snapshot(ledgers, down={"b1": 0, "b2": 0}))
    # Ledger 2's write sets are (b1,b4) (b4,b5) (b5,b2) (b2,b1): the last one is fully lost.
    assert truth["alerts"]["LEDGER_UNRECOVERABLE"] == [1, 2]
    assert truth["alerts"]["LEDGER_UNDER_REPLICATED"] == []


def test_one_missing_bookie_waits_for_the_delay() -> None:
    ledgers = {1: closed(["b1", "b2", "b3"])}
    young = ground_truth(snapshot(ledgers, down={"b1": NOW - 5_000}, delay_s=60))
    assert flagged(young) == {}
    assert young["bookies"]["b1"]["registration"] == "none"
    assert young["bookies"]["b1"]["lost"] is False
    old = ground_truth(snapshot(ledgers, down={"b1": NOW - 60_000}, delay_s=60))
    assert flagged(old) == {"BOOKIE_LOST": ["b1"], "LEDGER_UNDER_REPLICATED": [1]}


def test_several_missing_bookies_at_once_skip_the_delay() -> None:
    ledgers = {1: closed(["b1", "b2", "b3"]), 2: closed(["b4", "b5", "b6"])}
    truth = ground_truth(snapshot(ledgers, down={"b1": NOW - 5_000, "b4": NOW - 1_000}, delay_s=600))
    assert truth["alerts"]["BOOKIE_LOST"] == ["b1", "b4"]
    assert truth["alerts"]["LEDGER_UNDER_REPLICATED"] == [1, 2]


def test_a_second_bookie_that_went_and_came_back_still_triggered_the_audit() -> None:
    # b4 flapped while b1 was missing: BookKeeper audited at once, so b1 is lost; b4 is back, so not.
    flap = Absence("b4", NOW - 3_000, NOW - 2_000)
    truth = ground_truth(
        snapshot({1: closed(["b1", "b2", "b3"])}, down={"b1": NOW - 5_000}, delay_s=600, absences=[flap])
    )
    assert truth["alerts"]["BOOKIE_LOST"] == ["b1"]
    assert truth["bookies"]["b4"]["flaps"] == 1


def test_an_earlier_absence_of_another_bookie_does_not_skip_the_delay() -> None:
    before = Absence("b4", NOW - 9_000, NOW - 6_000)  # over before b1 went missing
    truth = ground_truth(
        snapshot({1: closed(["b1", "b2", "b3"])}, down={"b1": NOW - 5_000}, delay_s=600, absences=[before])
    )
    assert truth["alerts"]["BOOKIE_LOST"] == []


def test_a_flap_shorter_than_the_delay_raises_nothing() -> None:
    ledgers = {1: closed(["b1", "b2", "b3"])}
    truth = ground_truth(snapshot(ledgers, delay_s=60, absences=[Absence("b1", NOW - 20_000, NOW - 15_000)]))
    assert flagged(truth) == {}
    assert truth["bookies"]["b1"]["flaps"] == 1
    assert truth["bookies"]["b1"]["missing_since_ms"] is None


def test_read_only_is_not_missing() -> None:
    truth = ground_truth(snapshot({1: closed(["b1", "b2", "b3"])}, readonly=["b1", "b2"]))
    assert flagged(truth) == {}
    assert truth["bookies"]["b1"]["registration"] == "readonly"


def test_a_missing_bookie_without_an_absence_record_is_missing_since_now() -> None:
    base = snapshot({1: closed(["b1", "b2", "b3"])})
    gone = dict(base.bookies)
    gone["b1"] = BookieSnapshot("b1", Registration.NONE, "/r1", serving=False)
    one = ClusterSnapshot(now_ms=NOW, bookies=gone, ledgers=base.ledgers, lost_bookie_recovery_delay_s=30)
    assert lost_bookies(one) == {}
    immediate = ClusterSnapshot(now_ms=NOW, bookies=gone, ledgers=base.ledgers)
    assert lost_bookies(immediate) == {"b1": NOW}


def test_a_triggered_audit_ends_the_delay_of_the_bookies_missing_then() -> None:
    """`bookkeeper shell triggeraudit` (the delay written again): the ground truth replays it."""
    ledgers = {1: closed(["b1", "b2", "b3"])}
    pending = snapshot(ledgers, down={"b1": NOW - 5_000}, delay_s=600)
    assert lost_bookies(pending) == {}
    audited = snapshot(ledgers, down={"b1": NOW - 5_000}, delay_s=600, audits_ms=(NOW - 2_000,))
    assert lost_bookies(audited) == {"b1": NOW - 5_000}
    assert ground_truth(audited)["alerts"]["BOOKIE_LOST"] == ["b1"]
    before = snapshot(ledgers, down={"b1": NOW - 5_000}, delay_s=600, audits_ms=(NOW - 6_000,))
    assert lost_bookies(before) == {}  # an audit before the bookie went missing leaves its delay


def test_a_bookie_named_by_a_ledger_but_never_seen_is_lost() -> None:
    truth = ground_truth(snapshot({1: closed(["b1", "b2", "ghost"])}))
    assert truth["alerts"]["BOOKIE_LOST"] == ["ghost"]
    assert truth["alerts"]["LEDGER_UNDER_REPLICATED"] == [1]


# -------------------------------------------------------------------------------------------- placement


def test_placement_in_one_rack_is_not_adhering_and_only_closed_ledgers_count() -> None:
    ledgers = {
        1: closed(["b1", "b4"]),  # both /r1
        2: closed(["b1", "b4"], state=LedgerState.OPEN),
        3: closed(["b1", "b2"]),
    }
    truth = ground_truth(snapshot(ledgers))
    assert flagged(truth) == {"PLACEMENT_NOT_ADHERING": [1]}


def test_placement_checks_every_segment_and_counts_members_whatever_their_liveness() -> None:
    bad_old_segment = closed(
        ["b1", "b2", "b3"], segments=(Segment(0, ("b1", "b4", "b2")), Segment(5, ("b1", "b2", "b3")))
    )
    ledgers = {1: bad_old_segment, 2: closed(["b1", "b2", "b3"])}
    truth = ground_truth(snapshot(ledgers, down={"b2": NOW}, delay_s=600))
    # b2 is down but keeps its rack: ledger 2 still adheres; ledger 1's first segment has (b1, b4) in /r1.
    assert truth["alerts"]["PLACEMENT_NOT_ADHERING"] == [1]


def test_a_rack_move_changes_placement() -> None:
    ledgers = {1: closed(["b1", "b2", "b3"])}
    moved = snapshot(ledgers)
    bookies = dict(moved.bookies)
    bookies["b2"] = BookieSnapshot("b2", Registration.WRITABLE, "/r1", holdings=moved.bookies["b2"].holdings)
    truth = ground_truth(ClusterSnapshot(now_ms=NOW, bookies=bookies, ledgers=ledgers))
    assert truth["alerts"]["PLACEMENT_NOT_ADHERING"] == [1]


def test_zone_aware_placement_can_be_soft() -> None:
    zones = {"b1": "/z1/u1", "b2": "/z1/u2", "b3": "/z2/u1"}
    ledgers = {1: closed(["b1", "b2", "b3"], write_quorum=3)}
    base = snapshot(ledgers)
    bookies = {
        bookie_id: BookieSnapshot(bookie_id, Registration.WRITABLE, zones.get(bookie_id), holdings=b.holdings)
        for bookie_id, b in base.bookies.items()
    }
    truth = ground_truth(
        ClusterSnapshot(now_ms=NOW, bookies=bookies, ledgers=ledgers),
        TruthParameters(placement_policy="zoneaware"),
    )
    assert flagged(truth) == {"PLACEMENT_SOFT": [1]}


# --------------------------------------------------------------------------------------------- replicas


def test_lost_entries_give_less_than_wq_then_aq_then_no_replica() -> None:
    ledgers = {1: closed(["b1", "b2", "b3"], write_quorum=3), 2: closed(["b4", "b5", "b6"], write_quorum=3)}
    # Ledger 1, E=WQ=3, AQ=2: every bookie holds every entry.
    full = frozenset(range(10))
    one_copy_lost = {"b1": {1: full - {4}}}
    assert flagged(ground_truth(snapshot(ledgers, holdings_overrides=one_copy_lost))) == {
        "REPLICAS_LESS_THAN_WQ": [1]
    }
    two_copies_lost = {"b1": {1: full - {4}}, "b2": {1: full - {4}}}
    assert flagged(ground_truth(snapshot(ledgers, holdings_overrides=two_copies_lost))) == {
        "REPLICAS_LESS_THAN_AQ": [1]
    }
    all_lost = {bookie: {1: full - {4}} for bookie in ("b1", "b2", "b3")}
    assert flagged(ground_truth(snapshot(ledgers, holdings_overrides=all_lost))) == {
        "REPLICAS_NO_REPLICA": [1]
    }


def test_a_lost_ledger_and_enoledger_both_count_as_holding_nothing() -> None:
    ledgers = {1: closed(["b1", "b2", "b3"]), 2: closed(["b1", "b2", "b3"])}
    base = snapshot(ledgers)
    bookies = dict(base.bookies)
    holdings = dict(bookies["b1"].holdings)
    del holdings[1]  # lose_ledger
    bookies["b1"] = BookieSnapshot(
        "b1", Registration.WRITABLE, "/r1", holdings=holdings, enoledger_for=frozenset({2})
    )
    truth = ground_truth(ClusterSnapshot(now_ms=NOW, bookies=bookies, ledgers=ledgers))
    assert flagged(truth) == {"REPLICAS_LESS_THAN_AQ": [1, 2]}


def test_a_silent_bookie_is_unknown_not_missing_and_unresponsive() -> None:
    ledgers = {1: closed(["b1", "b2", "b3"])}
    truth = ground_truth(snapshot(ledgers, bookie_overrides={"b1": {"silent": True}}))
    assert flagged(truth) == {"BOOKIE_UNRESPONSIVE": ["b1"]}


def test_a_slow_bookie_is_unresponsive_only_beyond_the_probe_timeout() -> None:
    ledgers = {1: closed(["b1", "b2", "b3"])}
    slow = snapshot(ledgers, bookie_overrides={"b1": {"delay_s": 2.0}})
    assert flagged(ground_truth(slow, TruthParameters(probe_timeout_s=5.0))) == {}
    assert flagged(ground_truth(slow, TruthParameters(probe_timeout_s=1.0))) == {
        "BOOKIE_UNRESPONSIVE": ["b1"]
    }


def test_a_silent_bookie_with_nothing_to_probe_may_be_flagged_but_need_not() -> None:
    truth = ground_truth(snapshot({1: closed(["b1", "b2", "b3"])}, bookie_overrides={"b6": {"silent": True}}))
    assert flagged(truth) == {}
    assert truth["may_alert"]["BOOKIE_UNRESPONSIVE"] == ["b6"]


def test_a_hard_killed_bookie_before_its_session_expires_is_only_may_unresponsive() -> None:
    ledgers = {1: closed(["b1", "b2", "b3"])}
    truth = ground_truth(snapshot(ledgers, bookie_overrides={"b1": {"serving": False}}))
    assert flagged(truth) == {}
    assert truth["may_alert"]["BOOKIE_UNRESPONSIVE"] == ["b1"]


def test_replicas_skip_open_and_empty_ledgers() -> None:
    ledgers = {
        1: closed(["b1", "b2", "b3"], state=LedgerState.OPEN),
        2: closed(["b1", "b2", "b3"], last_entry_id=-1),
    }
    nothing: frozenset[int] = frozenset()
    everything_lost = {bookie: {1: nothing, 2: nothing} for bookie in RACKS}
    assert flagged(ground_truth(snapshot(ledgers, holdings_overrides=everything_lost))) == {}


def _open_holdings(lost: Mapping[str, Iterable[int]]) -> dict[str, dict[int, frozenset[int]]]:
    """Ledger 1 (OPEN, E=3 on b1..b3, WQ=2) written with entries 0..9, less ``lost`` per bookie."""
    held = {}
    for index, bookie in enumerate(["b1", "b2", "b3"]):
        entries = set(entries_striped_to_bookie(index, 0, 9, 3, 2)) - set(lost.get(bookie, ()))
        held[bookie] = {1: frozenset(entries)}
    return held


def test_an_open_ledger_is_judged_up_to_the_lac_its_bookies_carry() -> None:
    ledgers = {1: closed(["b1", "b2", "b3"], state=LedgerState.OPEN)}
    # Entry 3's write set is b1 and b2 (positions 0, 1): both lost it. Entry 9 (b1, b2 too) is lost by both
    # as well, so the last entries are 8 (b1), 7 (b2) and 8 (b3): the LAC is 7, and 9 is not judged.
    lost = {"b1": [3, 9], "b2": [3, 9]}
    truth = ground_truth(snapshot(ledgers, holdings_overrides=_open_holdings(lost)))
    assert flagged(truth) == {"REPLICAS_NO_REPLICA": [1]}
    above = ground_truth(snapshot(ledgers, holdings_overrides=_open_holdings({"b1": [9], "b2": [9]})))
    assert flagged(above) == {}


def test_an_open_ledger_whose_lac_nobody_answers_and_one_in_recovery_are_not_judged() -> None:
    lost = _open_holdings({"b1": [3], "b2": [3]})
    silent = {b: {"silent": True} for b in ("b1", "b2", "b3")}
    ledgers = {1: closed(["b1", "b2", "b3"], state=LedgerState.OPEN)}
    truth = ground_truth(snapshot(ledgers, holdings_overrides=lost, bookie_overrides=silent))
    assert flagged(truth) == {} and truth["may_alert"]["BOOKIE_UNRESPONSIVE"] == ["b1", "b2", "b3"]
    recovering = {1: closed(["b1", "b2", "b3"], state=LedgerState.IN_RECOVERY)}
    assert flagged(ground_truth(snapshot(recovering, holdings_overrides=lost))) == {}


# ------------------------------------------------------------------------------------ marks and corrupt


def test_under_replication_marks_older_than_the_grace_period_are_stuck() -> None:
    marks = {1: NOW - 700_000, 2: NOW - 10_000, 3: None}
    truth = ground_truth(snapshot({}, underreplicated=marks), TruthParameters(under_replication_grace_s=600))
    assert flagged(truth) == {"UNDER_REPLICATION_STUCK": [1]}
    disabled = ground_truth(
        snapshot({}, underreplicated=marks), TruthParameters(under_replication_grace_s=None)
    )
    assert flagged(disabled) == {}


def test_a_corrupt_ledger_is_only_metadata_corrupt() -> None:
    ledgers = {1: closed(["b1", "b4"])}  # would also fail placement if it were readable
    truth = ground_truth(snapshot(ledgers, corrupt_ledgers=frozenset({1}), down={"b1": 0}))
    assert flagged(truth) == {"METADATA_CORRUPT": [1], "BOOKIE_LOST": ["b1"]}


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="placement policy"):
        TruthParameters(placement_policy="nope")
    with pytest.raises(ValueError, match="probe_timeout_s"):
        TruthParameters(probe_timeout_s=0)


# --------------------------------------------------------------------------------------------- ensembles


@pytest.mark.parametrize("seed", range(20))
def test_rack_aware_ensembles_adhere_when_the_racks_allow(seed: int) -> None:
    rng = random.Random(seed)
    for ensemble_size, write_quorum in ((3, 2), (3, 3), (5, 3), (4, 2), (6, 2)):
        ensemble = choose_ensemble(RACKS, ensemble_size, write_quorum, 2, rng)
        assert len(set(ensemble)) == ensemble_size
        assert is_adhering(ensemble, write_quorum, 2, RACKS)


def test_with_too_few_racks_an_ensemble_is_still_chosen() -> None:
    two_racks = {"a1": "/a", "a2": "/a", "b1": "/b"}
    ensemble = choose_ensemble(two_racks, 3, 2, 2, random.Random(0))
    assert sorted(ensemble) == ["a1", "a2", "b1"]
    with pytest.raises(NotEnoughBookiesError):
        choose_ensemble(two_racks, 4, 2, 2, random.Random(0))


def test_a_replacement_keeps_the_ensemble_adhering_and_prefers_the_same_rack() -> None:
    ensemble = ["b1", "b2", "b3"]
    candidates = {bookie: RACKS[bookie] for bookie in ("b4", "b5", "b6")}
    for seed in range(10):
        replacement = choose_replacement(ensemble, 0, candidates, 2, 2, random.Random(seed), RACKS)
        assert replacement == "b4"  # the only candidate in b1's rack /r1


def test_a_single_rack_ensemble_sits_in_one_rack() -> None:
    racks = {"a1": "/a", "a2": "/a", "a3": "/a", "b1": "/b"}
    ensemble = choose_single_rack_ensemble(racks, 3, random.Random(0))
    assert {racks[bookie] for bookie in ensemble} == {"/a"}
    assert not is_adhering(ensemble, 2, 2, racks)
    with pytest.raises(NotEnoughBookiesError):
        choose_single_rack_ensemble(racks, 2, random.Random(0), rack="/b")


def test_a_db_ledger_storage_bookie_s_lost_fragment_end_is_required_and_an_inner_loss_only_allowed() -> None:
    # E=WQ=3: b1's fragment is every entry 0..9, its ends 0 and 9; entry reads see only those.
    ledgers = {1: closed(["b1", "b2", "b3"], write_quorum=3)}
    full = frozenset(range(10))
    db = {"b1": {"answers_entry_lists": False}}
    end_lost = ground_truth(
        snapshot(ledgers, bookie_overrides=db, holdings_overrides={"b1": {1: full - {9}}})
    )
    assert flagged(end_lost) == {"REPLICAS_LESS_THAN_WQ": [1]}
    inner_lost = ground_truth(
        snapshot(ledgers, bookie_overrides=db, holdings_overrides={"b1": {1: full - {4}}})
    )
    assert flagged(inner_lost) == {}
    assert inner_lost["may_alert"]["REPLICAS_LESS_THAN_WQ"] == [1]
    # The same inner loss on a bookie that lists its entries is required.
    listed = ground_truth(snapshot(ledgers, holdings_overrides={"b1": {1: full - {4}}}))
    assert flagged(listed) == {"REPLICAS_LESS_THAN_WQ": [1]}


def test_isolated_ledgers_outside_their_group_are_in_the_truth_by_the_core_rule() -> None:
    groups = {"b1": "iso", "b2": "iso", "b3": "iso", "b4": "default", "b5": "default", "b6": None}
    bookies = {
        b: BookieSnapshot(b, Registration.WRITABLE, RACKS[b], group=g, holdings={}) for b, g in groups.items()
    }
    config = ((ISOLATION_METADATA_KEY, encode_isolation_config(IsolationGroups(("iso",), ("default",)))),)
    ledgers = {
        1: replace(closed(["b1", "b2", "b3"]), custom_metadata=config),  # inside
        2: replace(closed(["b1", "b2", "b4"]), custom_metadata=config),  # iso had room: b4 outside
        3: replace(closed(["b1", "b2", "b6"]), custom_metadata=config),  # b6 is in no group: never outside
        4: closed(["b1", "b2", "b4"]),  # not isolated
        5: replace(closed(["b1", "b4"]), custom_metadata=((ISOLATION_METADATA_KEY, b"{"),)),  # not judged
    }
    truth = ground_truth(ClusterSnapshot(now_ms=NOW, bookies=bookies, ledgers=ledgers))
    assert truth["alerts"]["PLACEMENT_ISOLATION_VIOLATED"] == [2]
    # With one iso bookie read-only, iso cannot hold an ensemble of 3: the secondary group is allowed.
    bookies["b3"] = replace(bookies["b3"], registration=Registration.READONLY)
    truth = ground_truth(ClusterSnapshot(now_ms=NOW, bookies=bookies, ledgers=ledgers))
    assert truth["alerts"]["PLACEMENT_ISOLATION_VIOLATED"] == []
