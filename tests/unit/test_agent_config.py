"""How the job reaches bookie-side agents: built from the settings, the token never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError
from core.settings import Settings
from streaming.job import agent_config


def test_no_agent_configured_means_none() -> None:
    assert agent_config(Settings()) is None


def test_agents_without_a_token_are_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match=r"agent\.token"):
        agent_config(Settings(agent={"addresses": {"bookie-01": "10.0.0.5:3182"}}))


def test_the_config_carries_the_token_but_never_shows_it() -> None:
    settings = Settings(
        agent={"addresses": {"b2": "h2:3182", "b1": "h1:3182"}, "token": "tok-93e1", "tls_ca_file": "/ca.pem"}
    )
    config = agent_config(settings)
    assert config is not None
    assert config.addresses == (("b1", "h1:3182"), ("b2", "h2:3182"))
    assert config.token == "tok-93e1" and config.ca_file == Path("/ca.pem") and not config.insecure
    assert (
        "tok-93e1" not in repr(config)
        and "tok-93e1" not in repr(settings)
        and "tok-93e1" not in str(settings)
    )
