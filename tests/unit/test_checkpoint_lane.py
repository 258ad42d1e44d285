"""A checkpoint records the ledger lane that wrote it; one an earlier version's Spark ledger lane wrote is
refused with one line (its state is not this lane's), never run on silently."""

from __future__ import annotations

import json

import pytest

from core.errors import ConfigError
from core.settings import Settings, StreamSettings
from streaming.job import LEDGER_LANE, STATE_LAYOUT_FILE, check_state_layout, source_status_file


def test_a_new_checkpoint_records_the_driver_lane_and_starts_again(tmp_path) -> None:
    checkpoint = tmp_path / "cp"
    check_state_layout(checkpoint, StreamSettings())
    assert json.loads((checkpoint / STATE_LAYOUT_FILE).read_text())["ledger_lane"] == LEDGER_LANE == "driver"
    check_state_layout(checkpoint, StreamSettings())  # a restart on its own checkpoint


@pytest.mark.parametrize("recorded", [{"ledger_lane": "spark"}, {}], ids=["spark", "unrecorded"])
def test_a_checkpoint_the_spark_lane_wrote_is_refused(tmp_path, recorded) -> None:
    """A layout with no lane recorded comes from before the setting existed: the Spark lane wrote it."""
    checkpoint = tmp_path / "cp"
    check_state_layout(checkpoint, StreamSettings())
    marker = checkpoint / STATE_LAYOUT_FILE
    layout = {k: v for k, v in json.loads(marker.read_text()).items() if k != "ledger_lane"}
    marker.write_text(json.dumps({**layout, **recorded}))
    with pytest.raises(ConfigError, match=r"earlier version's Spark ledger lane .*reset the checkpoint"):
        check_state_layout(checkpoint, StreamSettings())


def test_a_spark_query_checkpoint_without_a_recorded_layout_is_refused(tmp_path) -> None:
    """Spark's own ``offsets/`` at the checkpoint's top: the Spark lane's query checkpoint."""
    checkpoint = tmp_path / "cp"
    (checkpoint / "offsets").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"earlier version's Spark ledger lane"):
        check_state_layout(checkpoint, StreamSettings())
    assert not (checkpoint / STATE_LAYOUT_FILE).exists()


def test_the_source_status_is_kept_in_the_ledger_lanes_checkpoint(tmp_path) -> None:
    settings = Settings(checkpoint_root=tmp_path / "cps", lakehouse_root=tmp_path / "lh")
    status = source_status_file(settings)
    assert status.parent == tmp_path / "cps" / settings.stream.app_id / "ledger-lane"
