"""Reading BookKeeper's shell output: truncated, random or hostile text is one clear error, and the ledger
password the shell prints never reaches an error message."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.bookkeeper.shell import parse_ledger_metadata, parse_listbookies
from core.errors import ServiceError

GOOD = (
    "ledgerID: 7\nLedgerMetadata{formatVersion=3, ensembleSize=2, writeQuorumSize=2, ackQuorumSize=1, "
    "state=CLOSED, length=10, lastEntryId=4, digestType=CRC32C, password=base64:c2VjcmV0LXB3, "
    "ensembles={0=[b1:1, b2:2]}, customMetadata={application=base64:cHVsc2Fy}}"
)


def test_the_shells_metadata_is_read_and_the_password_dropped() -> None:
    meta = parse_ledger_metadata(GOOD)
    assert meta["state"] == "CLOSED" and meta["last_entry_id"] == 4 and meta["length"] == 10
    assert meta["ensembles"] == {0: ["b1:1", "b2:2"]}
    assert meta["custom_metadata"] == {"application": b"pulsar"}
    assert "password" not in meta


@pytest.mark.parametrize("cut", [1, 20, 60, 200, len(GOOD) - 1])
def test_truncated_output_is_one_clear_error_without_the_password(cut: int) -> None:
    with pytest.raises(ServiceError, match="ledgermetadata printed") as caught:
        parse_ledger_metadata(GOOD[:cut])
    assert "c2VjcmV0LXB3" not in str(caught.value)
    assert "\n" not in str(caught.value)


def test_hostile_values_are_one_clear_error_without_the_password() -> None:
    hostile = GOOD.replace("ledgerID: 7", "ledgerID: 7e99").replace("LedgerMetadata{", "LedgerMetadata {")
    with pytest.raises(ServiceError) as caught:
        parse_ledger_metadata(hostile)
    assert "c2VjcmV0LXB3" not in str(caught.value)
    bad_base64 = GOOD.replace("base64:cHVsc2Fy", "base64:!!not-base64!!")
    with pytest.raises(ServiceError, match="cannot read"):
        parse_ledger_metadata(bad_base64)


@given(st.text(max_size=400))
def test_random_output_is_metadata_or_a_service_error(text: str) -> None:
    try:
        parse_ledger_metadata(text)
    except ServiceError as err:
        assert "\n" not in str(err)
    assert isinstance(parse_listbookies(text), dict)
