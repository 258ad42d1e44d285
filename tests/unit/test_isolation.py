"""Pulsar's bookie isolation: the custom-metadata decoder, the rule (scalar and columnar held equal), and the
sink's handling of affinity groups and configs that do not decode."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.domain.alert_book import AlertBook
from core.domain.alerts import AlertKind
from core.domain.isolation import (
    ISOLATED_POLICY_CLASS,
    ISOLATION_METADATA_KEY,
    IsolationGroups,
    decode_isolation_config,
    encode_isolation_config,
    isolation_config_of,
)
from core.domain.rules.evaluate import PlacementPolicyConfig
from core.domain.rules.isolation import isolation_screen, isolation_verdict
from core.errors import FormatError
from streaming.sink_batch import SinkBatch, apply_decisions, evaluate_ledgers

# What Pulsar 3.x's EnsemblePlacementPolicyConfig.encode writes (Jackson's default pretty printer).
PULSAR_VALUE = (
    b"{\n"
    b'  "policyClass" : "org.apache.pulsar.bookie.rackawareness.IsolatedBookieEnsemblePlacementPolicy",\n'
    b'  "properties" : {\n'
    b'    "secondaryIsolationBookieGroups" : "shared",\n'
    b'    "isolationBookieGroups" : "orders,payments"\n'
    b"  }\n"
    b"}"
)


# -- the decoder ----------------------------------------------------------------------------------------
def test_pulsars_value_decodes_to_its_primary_and_secondary_groups() -> None:
    assert decode_isolation_config(PULSAR_VALUE) == IsolationGroups(("orders", "payments"), ("shared",))


def test_the_encoder_round_trips_and_writes_what_pulsar_writes() -> None:
    groups = IsolationGroups(("a", "b"), ("c",))
    assert decode_isolation_config(encode_isolation_config(groups)) == groups
    assert b'"policyClass" : "' + ISOLATED_POLICY_CLASS.encode() in encode_isolation_config(groups)


@pytest.mark.parametrize(
    ("properties", "expected"),
    [
        ({}, IsolationGroups((), ())),
        ({"isolationBookieGroups": None}, IsolationGroups((), ())),
        ({"isolationBookieGroups": ["a", "b"]}, IsolationGroups(("a", "b"), ())),
        ({"isolationBookieGroups": "a,,b,,"}, IsolationGroups(("a", "", "b"), ())),
        ({"isolationBookieGroups": "a, b", "other": {"x": 1}}, IsolationGroups(("a", " b"), ())),
        ({"secondaryIsolationBookieGroups": "s"}, IsolationGroups((), ("s",))),
    ],
)
def test_properties_are_read_as_pulsars_cast_and_java_split_read_them(
    properties: dict[str, Any], expected: IsolationGroups
) -> None:
    value = json.dumps({"policyClass": ISOLATED_POLICY_CLASS, "properties": properties, "extra": 1}).encode()
    assert decode_isolation_config(value) == expected


def test_another_policy_class_is_no_isolation_config() -> None:
    assert decode_isolation_config(b'{"policyClass": "org.example.Mine", "properties": {"x": "y"}}') is None


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"{",
        b"[1]",
        b'{"policyClass": 7}',
        b'{"properties": {}}',
        b'{"policyClass": "%s", "properties": 3}',
    ],
)
def test_a_value_that_does_not_decode_raises_a_format_error(value: bytes) -> None:
    value = value.replace(b"%s", ISOLATED_POLICY_CLASS.encode())
    with pytest.raises(FormatError, match="isolation config"):
        decode_isolation_config(value)


@given(st.binary(max_size=64))
def test_no_bytes_crash_the_decoder(value: bytes) -> None:
    config = isolation_config_of([(ISOLATION_METADATA_KEY, value)])
    assert (config.groups is None) or (config.error is None)


def test_the_last_value_of_the_key_wins() -> None:
    first, last = (encode_isolation_config(IsolationGroups((g,))) for g in ("x", "y"))
    pairs = [(ISOLATION_METADATA_KEY, first), ("k", b"v"), (ISOLATION_METADATA_KEY, last)]
    assert isolation_config_of(pairs).groups == IsolationGroups(("y",))


# -- the rule -------------------------------------------------------------------------------------------
GROUP_OF = {"p1": "prim", "p2": "prim", "s1": "sec", "o1": "other", "n1": None}
CONFIG = IsolationGroups(("prim",), ("sec",))


@pytest.mark.parametrize(
    ("ensemble", "writable", "outside"),
    [
        (["p1", "p2"], {"p1", "p2"}, ()),
        (["p1", "s1"], {"p1", "p2"}, ("s1",)),  # the primary group had room: secondary not allowed
        (["p1", "s1"], {"p1"}, ()),  # one writable primary bookie for an ensemble of 2: secondary allowed
        (["p1", "o1"], {"p1"}, ("o1",)),  # a group listed nowhere in the config: always outside
        (["p1", "n1"], {"p1", "p2"}, ()),  # no group in the rack map: Pulsar never excludes it
        (["p1", "unknown"], {"p1", "p2"}, ()),  # absent from the rack map: likewise
    ],
)
def test_members_outside_the_allowed_groups(
    ensemble: list[str], writable: set[str], outside: tuple[str, ...]
) -> None:
    verdict = isolation_verdict([ensemble], len(ensemble), CONFIG, GROUP_OF, writable)
    assert verdict.outside == outside


def test_every_segment_counts_and_the_detail_names_the_groups_and_members() -> None:
    verdict = isolation_verdict([["p1", "p2"], ["p1", "o1"]], 2, CONFIG, GROUP_OF, {"p1", "p2"})
    assert verdict.detail(CONFIG) == {
        "primary_groups": ["prim"],
        "secondary_groups": ["sec"],
        "allowed_groups": ["prim"],
        "outside": ["o1"],
    }


BOOKIES = [f"b{i}" for i in range(7)]
NAMES = ["g1", "g2", "g3", "g4"]


@st.composite
def ledgers_and_cluster(draw: Any) -> tuple[list[Any], dict[str, str | None], set[str]]:
    group_of = draw(st.dictionaries(st.sampled_from(BOOKIES), st.sampled_from([None, *NAMES])))
    writable = draw(st.sets(st.sampled_from(BOOKIES)))
    ledgers = []
    for _ in range(draw(st.integers(0, 6))):
        size = draw(st.integers(1, 4))
        ensembles = draw(
            st.lists(st.lists(st.sampled_from(BOOKIES), min_size=size, max_size=size), max_size=3)
        )
        names = st.lists(st.sampled_from([*NAMES, "absent"]), max_size=3).map(tuple)
        config = draw(st.one_of(st.none(), st.builds(IsolationGroups, names, names)))
        ledgers.append((ensembles, size, config))
    return ledgers, group_of, writable


@settings(max_examples=400, deadline=None)
@given(ledgers_and_cluster())
def test_the_batch_screen_equals_the_per_ledger_rule(
    case: tuple[list[Any], dict[str, Any], set[str]],
) -> None:
    ledgers, group_of, writable = case
    expected = [
        config is not None and isolation_verdict(ensembles, size, config, group_of, writable).violated
        for ensembles, size, config in ledgers
    ]
    assert isolation_screen(ledgers, group_of, writable).tolist() == expected


# -- the sink -------------------------------------------------------------------------------------------
def _ledger_payload(ensemble: list[str], value: bytes | None, mzxid: int) -> dict[str, Any]:
    custom = (
        []
        if value is None
        else [{"key": ISOLATION_METADATA_KEY, "value_b64": base64.b64encode(value).decode()}]
    )
    return {
        "state": "OPEN",
        "ensemble_size": len(ensemble),
        "write_quorum": len(ensemble),
        "ack_quorum": 1,
        "last_entry_id": -1,
        "segments": [{"first_entry_id": 0, "ensemble": ensemble}],
        "custom_metadata": custom,
        "mzxid": mzxid,
    }


def _batch(groups: dict[str, str | None], book: AlertBook | None = None) -> SinkBatch:
    rows = {b: {"bookie_id": b, "status": "WRITABLE", "rack_group": g} for b, g in groups.items()}
    return SinkBatch(
        batch_id=1,
        cluster="c",
        book=book or AlertBook("c"),
        bookie_rows=rows,
        changes_partitions=1,
        groups=groups,
    )


def test_a_group_change_in_the_rack_map_moves_the_bookie_and_is_stored() -> None:
    batch = _batch({"b1": "g1", "b2": "g1"})
    payload = {"racks": {"b1": None, "b2": None}, "moved": [], "groups": {"b1": "g1", "b2": "g2"}}
    apply_decisions(batch, [{"kind": "rack_map", "at_ms": 7, "payload": payload}])
    assert batch.moved == {"b2": 7}
    assert batch.bookie_rows["b2"]["rack_group"] == "g2" and "b2" in batch.bookies_changed
    assert batch.groups == {"b1": "g1", "b2": "g2"}


def test_the_sink_fires_and_a_config_that_no_longer_decodes_resolves_saying_why() -> None:
    groups = {"b1": "g1", "b2": "g1", "b3": "g2"}
    config = encode_isolation_config(IsolationGroups(("g1",)))
    batch = _batch(groups)
    decision = {
        "kind": "ledger_state",
        "ledger_id": 5,
        "at_ms": 10,
        "payload": _ledger_payload(["b1", "b3"], config, 1),
    }
    apply_decisions(batch, [decision])
    evaluate_ledgers(batch, PlacementPolicyConfig())
    [fired] = batch.book.transitions
    assert (fired.kind, fired.state.value, fired.detail["outside"]) == (
        AlertKind.PLACEMENT_ISOLATION_VIOLATED,
        "firing",
        ["b3"],
    )
    later = _batch(groups, AlertBook("c", open=dict(batch.book.open)))
    decision = {
        "kind": "ledger_state",
        "ledger_id": 5,
        "at_ms": 20,
        "payload": _ledger_payload(["b1", "b3"], b"{", 2),
    }
    apply_decisions(later, [decision])
    evaluate_ledgers(later, PlacementPolicyConfig())
    [resolved] = later.book.transitions
    assert resolved.alert_id == fired.alert_id and resolved.state.value == "resolved"
    assert resolved.detail["resolution"].startswith("isolation config not judged: isolation config: not JSON")
