"""Fetching JVM jars with Maven from a POM: a refused coordinate is one line, a current copy is reused."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.jars import copy_jars
from core.errors import ServiceError

pytestmark = pytest.mark.integration

_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.bkaudit.test</groupId>
  <artifactId>probe</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-api</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""


def _pom(folder: Path, version: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    pom = folder / "pom.xml"
    pom.write_text(_POM.format(version=version))
    return pom


def test_a_refused_coordinate_stops_the_fetch_with_one_line_naming_it(tmp_path: Path) -> None:
    pom = _pom(tmp_path / "pom", "0.0.404-bkaudit")
    with pytest.raises(ServiceError) as caught:
        copy_jars(pom, tmp_path / "jars" / "probe", "probe")
    message = str(caught.value)
    assert "\n" not in message
    assert "cannot resolve org.slf4j:slf4j-api:jar:0.0.404-bkaudit" in message
    assert not (tmp_path / "jars" / "probe").exists()  # nothing half copied


def test_jars_are_copied_once_and_reused_while_the_pom_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pom = _pom(tmp_path / "pom", "1.7.36")
    target = copy_jars(pom, tmp_path / "jars" / "probe", "probe")
    assert [jar.name for jar in target.glob("*.jar")] == ["slf4j-api-1.7.36.jar"]
    monkeypatch.setenv("PATH", "/nonexistent")  # no Maven: a second fetch would fail
    assert copy_jars(pom, target, "probe") == target
    _pom(tmp_path / "pom", "0.0.405-bkaudit")  # a changed POM is fetched again
    with pytest.raises(ServiceError, match=r"Maven \(mvn\) is not on PATH"):
        copy_jars(pom, target, "probe")
