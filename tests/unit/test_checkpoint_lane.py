"""Which ledger lane a job runs: the setting, else its checkpoint's, else the new-checkpoint default."""

from __future__ import annotations

import json

import pytest

from core.errors import ConfigError
from core.settings import Settings, StreamSettings
from streaming.job import (
    NEW_CHECKPOINT_LEDGER_LANE,
    STATE_LAYOUT_FILE,
    check_state_layout,
    resolved_ledger_lane,
    source_status_file,
    with_resolved_ledger_lane,
)


def test_a_new_checkpoint_gets_the_default_lane_and_records_it(tmp_path) -> None:
    checkpoint = tmp_path / "cp"
    assert resolved_ledger_lane(checkpoint, StreamSettings()) == NEW_CHECKPOINT_LEDGER_LANE
    check_state_layout(checkpoint, StreamSettings())
    recorded = json.loads((checkpoint / STATE_LAYOUT_FILE).read_text())["ledger_lane"]
    assert recorded == NEW_CHECKPOINT_LEDGER_LANE


@pytest.mark.parametrize(
    ("recorded", "lane"),
    [({"ledger_lane": "spark"}, "spark"), ({"ledger_lane": "driver"}, "driver"), ({}, "spark")],
)
def test_an_unset_lane_is_the_checkpoints_own(tmp_path, recorded, lane) -> None:
    """A checkpoint from before the setting existed (no lane recorded) was written by the Spark lane."""
    checkpoint = tmp_path / "cp"
    check_state_layout(checkpoint, StreamSettings(ledger_lane="spark"))
    marker = checkpoint / STATE_LAYOUT_FILE
    layout = {k: v for k, v in json.loads(marker.read_text()).items() if k != "ledger_lane"}
    marker.write_text(json.dumps({**layout, **recorded}))
    assert resolved_ledger_lane(checkpoint, StreamSettings()) == lane
    check_state_layout(checkpoint, StreamSettings())  # an upgraded job starts on its checkpoint


def test_a_set_lane_that_differs_from_the_checkpoints_is_refused(tmp_path) -> None:
    checkpoint = tmp_path / "cp"
    check_state_layout(checkpoint, StreamSettings(ledger_lane="spark"))
    assert resolved_ledger_lane(checkpoint, StreamSettings(ledger_lane="driver")) == "driver"
    with pytest.raises(ConfigError, match=r"written with stream\.ledger_lane = spark; it is driver"):
        check_state_layout(checkpoint, StreamSettings(ledger_lane="driver"))


def test_the_resolved_settings_name_the_lane_and_its_source_status(tmp_path) -> None:
    settings = Settings(checkpoint_root=tmp_path / "cps", lakehouse_root=tmp_path / "lh")
    resolved = with_resolved_ledger_lane(settings)
    assert settings.stream.ledger_lane is None and resolved.stream.ledger_lane == NEW_CHECKPOINT_LEDGER_LANE
    driver_lane = settings.model_copy(update={"stream": StreamSettings(ledger_lane="driver")})
    assert source_status_file(driver_lane).parent.name == "ledger-lane"
    spark_lane = settings.model_copy(update={"stream": StreamSettings(ledger_lane="spark")})
    assert source_status_file(spark_lane).parent.name == settings.stream.app_id
