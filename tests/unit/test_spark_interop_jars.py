"""The ``spark-interop`` jars add to pyspark's, never replace them: no artifact that pyspark ships (Scala,
Hadoop, Jackson core, Parquet, compression, logging) is copied a second time, in any version."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from connectors.jars import jar_dir

_VERSIONED = re.compile(r"^(?P<artifact>.+?)-\d+(\.\d+)+[^/]*\.jar$")


def _artifacts(folder: Path) -> set[str]:
    return {m["artifact"] for jar in folder.glob("*.jar") if (m := _VERSIONED.match(jar.name))}


def test_artifact_names_drop_only_the_version():
    names = ["spark-sql-kafka-0-10_2.13-4.2.0.jar", "commons-pool2-2.13.1.jar", "jsr305-3.0.0.jar"]
    assert [m["artifact"] for m in map(_VERSIONED.match, names) if m] == [
        "spark-sql-kafka-0-10_2.13",
        "commons-pool2",
        "jsr305",
    ]


def test_the_interop_jars_never_repeat_an_artifact_pyspark_ships():
    import pyspark

    ours = _artifacts(jar_dir("spark-interop"))
    if not ours:
        pytest.skip("the spark-interop jars are not copied here (infra/bootstrap.sh jars spark-interop)")
    theirs = _artifacts(Path(pyspark.__file__).parent / "jars")
    assert {"delta-spark_2.13", "delta-storage", "spark-sql-kafka-0-10_2.13", "kafka-clients"} <= ours
    assert not ours & theirs
