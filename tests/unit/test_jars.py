"""Reading Maven's failures: the coordinate it could not resolve is the one line a user sees."""

from __future__ import annotations

import pytest

from connectors.jars import COMPONENTS, jar_dir, missing_coordinate, pom_path
from core.errors import ConfigError

REFUSED = (
    "[ERROR] Failed to execute goal on project kafka: Could not resolve dependencies for project "
    "io.bkaudit.jars:kafka:pom:1: Could not find artifact org.apache.kafka:kafka_2.13:jar:0.0.404 in central "
    "(https://repo.example/maven2) -> [Help 1]"
)
CACHED = (
    "[ERROR] Failed to execute goal on project x: Could not resolve dependencies for project a:b:pom:1: "
    "Failure to find io.delta:delta-spark_2.13:jar:4.4.1 in https://repo.example/maven2 was cached in the "
    "local repository"
)
CACHED_IN_COLOUR = (
    "[\x1b[1;31mERROR\x1b[m] Failed to execute goal on project probe: \x1b[1;31mCould not resolve "
    "dependencies for "
    "project io.bkaudit.test:probe:pom:1: Failure to find org.slf4j:slf4j-api:jar:0.0.404-bkaudit in "
    "https://repo.example/maven2 was cached in the local repository\x1b[m"
)
CACHED_NOT_FOUND = (
    "[ERROR] Failed to execute goal on project b: Could not resolve dependencies for project a:b:pom:1: "
    "org.slf4j:slf4j-api:jar:0.0.404-bkaudit was not found in https://repo.example/maven2 during a previous "
    "attempt. This failure was cached in the local repository and resolution is not reattempted until the "
    "update interval of central has elapsed or updates are forced -> [Help 1]"
)
TRANSFER = (
    "[ERROR] Could not transfer artifact org.apache.bookkeeper:bookkeeper-server:pom:4.17.2 from/to central"
)


@pytest.mark.parametrize(
    ("output", "coordinate"),
    [
        (REFUSED, "org.apache.kafka:kafka_2.13:jar:0.0.404"),
        (CACHED, "io.delta:delta-spark_2.13:jar:4.4.1"),
        (TRANSFER, "org.apache.bookkeeper:bookkeeper-server:pom:4.17.2"),
        (CACHED_IN_COLOUR, "org.slf4j:slf4j-api:jar:0.0.404-bkaudit"),
        (CACHED_NOT_FOUND, "org.slf4j:slf4j-api:jar:0.0.404-bkaudit"),
    ],
)
def test_the_refused_coordinate_is_named(output: str, coordinate: str) -> None:
    assert missing_coordinate(output) == coordinate


def test_an_output_without_a_coordinate_names_none() -> None:
    assert missing_coordinate("[ERROR] Non-parseable POM /x/pom.xml: end tag name </projet>") is None


def test_every_component_has_a_pom_in_the_clone() -> None:
    for component in COMPONENTS:
        assert pom_path(component).is_file(), component
        assert jar_dir(component).name == component


def test_an_unknown_component_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown JVM component 'zookeepr'"):
        pom_path("zookeepr")
