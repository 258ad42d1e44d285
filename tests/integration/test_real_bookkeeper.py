"""bkaudit against a real Apache BookKeeper 4.17 cluster: its reads agree with BookKeeper's own shell.

One cluster per module (4 bookie processes in 2 racks on the session's ZooKeeper, under a prefix of its
own), ~20 ledgers written by BookKeeper's Java client, some left open.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bkaudit.testing.harness import ServiceHarness
from connectors.bookie.liveness import LivenessProbes
from connectors.bookkeeper import RealBookie, RealBookKeeperCluster
from core.errors import ServiceError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def real_bk(bk_services: ServiceHarness) -> Iterator[RealBookKeeperCluster]:
    cluster = bk_services.real_bookkeeper(bookies=4, racks=2)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def written(real_bk: RealBookKeeperCluster) -> dict[str, Any]:
    return real_bk.write_ledgers(20, ensemble=3, write_quorum=2, ack_quorum=2, entries=5, open_ledgers=2)


def _bkaudit_json(cli: Callable[..., Any], cluster: RealBookKeeperCluster, *args: str) -> Any:
    result = cli(
        *args, "--zookeeper", cluster.zookeeper, "--ledgers-root", cluster.ledgers_root, "--format", "json"
    )
    assert result.exit_code == 0, result.stderr
    return result.json()


def _comparable_bkaudit(document: dict[str, Any]) -> dict[str, Any]:
    closed = document["state"] == "CLOSED"
    return {
        "ledger_id": document["ledger_id"],
        "format_version": document["format_version"],
        "ensemble_size": document["ensemble_size"],
        "write_quorum_size": document["write_quorum"],
        "ack_quorum_size": document["ack_quorum"],
        "state": document["state"],
        "length": document["length"] if closed else None,
        "last_entry_id": document["last_entry_id"] if closed else None,
        "digest_type": document["digest_type"],
        "ensembles": {segment["first_entry_id"]: segment["ensemble"] for segment in document["segments"]},
        "custom_metadata": {
            item["key"]: base64.b64decode(item["value_b64"]) for item in document["custom_metadata"]
        },
    }


def _comparable_shell(parsed: dict[str, Any]) -> dict[str, Any]:
    return {
        "ledger_id": parsed["ledger_id"],
        "format_version": parsed["format_version"],
        "ensemble_size": parsed["ensemble_size"],
        "write_quorum_size": parsed["write_quorum_size"],
        "ack_quorum_size": parsed["ack_quorum_size"],
        "state": parsed["state"],
        "length": parsed.get("length"),
        "last_entry_id": parsed.get("last_entry_id"),
        "digest_type": parsed["digest_type"],
        "ensembles": parsed["ensembles"],
        "custom_metadata": parsed["custom_metadata"],
    }


def test_metadata_show_agrees_with_the_shells_ledgermetadata(
    real_bk: RealBookKeeperCluster, written: dict[str, Any], cli: Callable[..., Any]
) -> None:
    sample = [*written["closed"][:3], *written["open"]]
    assert len(written["closed"]) == 18 and len(written["open"]) == 2
    shell = real_bk.shell()
    for ledger_id in sample:
        ours = _comparable_bkaudit(_bkaudit_json(cli, real_bk, "metadata", "show", str(ledger_id)))
        theirs = _comparable_shell(shell.ledger_metadata(ledger_id))
        assert ours == theirs, f"ledger {ledger_id}"
    open_ledger = _bkaudit_json(cli, real_bk, "metadata", "show", str(written["open"][0]))
    assert open_ledger["state"] == "OPEN"
    assert open_ledger["pulsar_topic"].startswith("persistent://public/default/")


def test_the_real_client_spread_every_ensemble_over_both_racks(
    real_bk: RealBookKeeperCluster, written: dict[str, Any], cli: Callable[..., Any]
) -> None:
    racks = {bookie: info["rack"] for bookie, info in real_bk.rack_map()["default"].items()}
    for ledger_id in written["closed"][:5]:
        document = _bkaudit_json(cli, real_bk, "metadata", "show", str(ledger_id))
        (segment,) = document["segments"]
        assert {racks[bookie] for bookie in segment["ensemble"]} == {"/rack-1", "/rack-2"}


def _listed(cli: Callable[..., Any], cluster: RealBookKeeperCluster, flag: str) -> list[str]:
    return sorted(row["bookie_id"] for row in _bkaudit_json(cli, cluster, "bookies", "list", flag)["bookies"])


def test_bookies_list_agrees_with_listbookies_writable_and_read_only(
    real_bk: RealBookKeeperCluster, cli: Callable[..., Any]
) -> None:
    shell = real_bk.shell()
    everyone = sorted(bookie.bookie_id for bookie in real_bk.all_bookies())
    assert _listed(cli, real_bk, "--rw") == shell.list_bookies() == everyone
    assert _listed(cli, real_bk, "--ro") == shell.list_bookies(read_only=True) == []
    real_bk.restart_bookie(3, read_only=True)  # forceReadOnlyBookie: registers under available/readonly
    try:
        read_only = [real_bk.bookie(3).bookie_id]
        assert _listed(cli, real_bk, "--ro") == shell.list_bookies(read_only=True) == read_only
        assert _listed(cli, real_bk, "--rw") == shell.list_bookies() == sorted(set(everyone) - set(read_only))
    finally:
        real_bk.restart_bookie(3)


def test_a_killed_bookie_leaves_both_listings_once_its_session_expires(
    real_bk: RealBookKeeperCluster, cli: Callable[..., Any]
) -> None:
    victim = real_bk.bookie(2)
    victim.kill()  # kill -9: its ephemeral registration lives until the ZooKeeper session expires
    try:
        deadline = time.monotonic() + 60
        while victim.bookie_id in _listed(cli, real_bk, "--rw") and time.monotonic() < deadline:
            time.sleep(0.5)
        survivors = sorted(bookie.bookie_id for bookie in real_bk.all_bookies() if bookie is not victim)
        assert _listed(cli, real_bk, "--rw") == real_bk.shell().list_bookies() == survivors
    finally:
        real_bk.start_bookie(2)
    assert victim.bookie_id in _listed(cli, real_bk, "--rw")


def test_the_liveness_probe_is_answered_by_a_running_bookie_and_not_by_a_killed_one(
    real_bk: RealBookKeeperCluster,
) -> None:
    """What tells a ZooKeeper outage from a dead bookie: a real bookie answers the watcher's liveness read
    (of a ledger no cluster has), a killed one does not."""
    answers: list[tuple[str, bool, str, str]] = []
    probes = LivenessProbes(lambda *answer: answers.append(answer), interval_s=60.0, timeout_s=5.0)
    alive, victim = real_bk.bookie(1), real_bk.bookie(3)
    try:
        probes.watch(alive.bookie_id, alive.bookie_id)
        probes.probe_due()
        victim.kill()
        probes.watch(victim.bookie_id, victim.bookie_id)
        probes.probe_due()
    finally:
        probes.stop()
        real_bk.start_bookie(3)
    by_bookie = {bookie: (answered, detail) for bookie, answered, _, detail in answers}
    assert by_bookie[alive.bookie_id][0] is True, by_bookie
    assert by_bookie[victim.bookie_id][0] is False, by_bookie


def test_a_bookie_that_cannot_start_names_its_log_file(real_bk: RealBookKeeperCluster) -> None:
    broken = RealBookie(
        real_bk.state_dir / "broken-bookie",  # type: ignore[operator]
        index=9,
        service_uri=real_bk.service_uri,
        classpath=real_bk.classpath or "",
        extra_conf={"ledgerStorageClass": "org.example.NoSuchLedgerStorage"},
    )
    with pytest.raises(ServiceError) as caught:
        broken.start(lambda: False, timeout=90)
    assert str(broken.log_file) in str(caught.value)
    assert not broken.is_running()


def test_status_reports_every_bookie_with_its_rack(real_bk: RealBookKeeperCluster) -> None:
    status = real_bk.status()
    assert [row["rack"] for row in status["bookies"]] == ["/rack-1", "/rack-2", "/rack-1", "/rack-2"]
    assert all(row["pid"] for row in status["bookies"])
    assert json.loads(json.dumps(status))["ledgers_root"].endswith("/ledgers")


def _ensemble(cli: Callable[..., Any], cluster: RealBookKeeperCluster, ledger_id: int) -> list[str]:
    document = _bkaudit_json(cli, cluster, "metadata", "show", str(ledger_id))
    return [bookie for segment in document["segments"] for bookie in segment["ensemble"]]


def test_the_auditor_replaces_a_dead_bookie_and_both_read_the_new_ensemble(
    real_bk: RealBookKeeperCluster, written: dict[str, Any], cli: Callable[..., Any]
) -> None:
    victim = real_bk.bookie(4)
    on_victim = [lid for lid in written["closed"] if victim.bookie_id in _ensemble(cli, real_bk, lid)]
    assert on_victim, "the writer spread ensembles of 3 over 4 bookies"
    real_bk.start_auditor(check_interval_s=5)
    victim.kill()
    try:
        target = on_victim[0]
        deadline = time.monotonic() + 180
        while victim.bookie_id in _ensemble(cli, real_bk, target) and time.monotonic() < deadline:
            time.sleep(1)
        ours = _comparable_bkaudit(_bkaudit_json(cli, real_bk, "metadata", "show", str(target)))
        assert victim.bookie_id not in ours["ensembles"][0], (
            f"not re-replicated; see {real_bk.auditor_log_file}"
        )
        assert ours == _comparable_shell(real_bk.shell().ledger_metadata(target))
    finally:
        real_bk.stop_auditor()
        real_bk.start_bookie(4)
