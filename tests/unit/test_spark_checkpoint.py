"""Which leftovers of a Spark query's checkpoint the job removes before starting it."""

from __future__ import annotations

from pathlib import Path

from streaming.spark_checkpoint import discard_unplanned_first_batch

TEMPORARY = ".0.be34dc68-a11c-46fd-a5ec-3d2134fb9a14.tmp"
CHECKSUM = "..0.be34dc68-a11c-46fd-a5ec-3d2134fb9a14.tmp.crc"


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def checkpoint_with(tmp_path: Path, offsets: list[str], commits: list[str] = ()) -> Path:
    for name, entries in (("offsets", offsets), ("commits", commits)):
        (tmp_path / name).mkdir()
        for entry in entries:
            (tmp_path / name / entry).write_text("x")
    return tmp_path


def test_an_interrupted_first_batch_leaves_nothing_behind(tmp_path):
    location = checkpoint_with(tmp_path, [TEMPORARY, CHECKSUM], [TEMPORARY])
    assert [p.name for p in discard_unplanned_first_batch(location)] == [CHECKSUM, TEMPORARY, TEMPORARY]
    assert files(location / "offsets") == files(location / "commits") == []


def test_a_planned_batch_keeps_every_file(tmp_path):
    location = checkpoint_with(tmp_path, ["0", ".0.crc", ".1.ab.tmp"])
    assert discard_unplanned_first_batch(location) == []
    assert files(location / "offsets") == [".0.crc", ".1.ab.tmp", "0"]


def test_a_file_spark_does_not_write_is_left_for_spark_to_refuse(tmp_path):
    location = checkpoint_with(tmp_path, ["notes.txt", TEMPORARY])
    discard_unplanned_first_batch(location)
    assert files(location / "offsets") == ["notes.txt"]


def test_a_checkpoint_without_an_offset_log_is_left_alone(tmp_path):
    assert discard_unplanned_first_batch(tmp_path / "new") == []
    assert not (tmp_path / "new").exists()
