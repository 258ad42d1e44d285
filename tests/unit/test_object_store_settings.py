"""The object store's settings: the secret stays masked everywhere a setting is shown or logged, and reaches
only the process's AWS_* variables (which delta-rs and pyarrow read)."""

from __future__ import annotations

import json

import pytest

from bkaudit.settings_docs import effective_settings_json
from connectors import storage
from core.logsetup import secret_values
from core.settings import Settings
from streaming.disk_space import job_directories

STORE = {
    "lakehouse_url": "s3://audit/lakehouse/",
    "endpoint_url": "https://s3.example:9000",
    "access_key_id": "AKIDEXAMPLE",
    "secret_access_key": "wJalrXUtnFEMI-example",
    "session_token": "token-example",
}


def test_the_secret_key_and_token_are_masked_and_registered_with_the_log_filter():
    settings = Settings(object_store=STORE)
    shown = (repr(settings), str(settings), settings.model_dump_json(), effective_settings_json(settings))
    for text in shown:
        assert "wJalrXUtnFEMI-example" not in text and "token-example" not in text
    assert json.loads(effective_settings_json(settings))["object_store"]["access_key_id"] == "AKIDEXAMPLE"
    assert {"wJalrXUtnFEMI-example", "token-example"} <= set(secret_values(settings))


def test_the_settings_become_the_variables_delta_rs_reads_and_unset_ones_leave_the_chain_alone():
    environ = {"AWS_ACCESS_KEY_ID": "from-the-host"}
    storage.configure_from(Settings(object_store=STORE), environ)
    assert environ == {
        "AWS_ENDPOINT_URL": "https://s3.example:9000",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-example",
        "AWS_SESSION_TOKEN": "token-example",
    }
    untouched = {"AWS_ACCESS_KEY_ID": "from-the-host"}
    storage.configure_from(Settings(), untouched)
    assert untouched == {"AWS_ACCESS_KEY_ID": "from-the-host"}


def test_the_lakehouse_is_the_url_when_set_and_has_no_local_volume_to_watch():
    settings = Settings(object_store=STORE)
    assert settings.lakehouse == "s3://audit/lakehouse"
    assert "lakehouse_root" not in job_directories(settings)
    assert (
        storage.join(settings.lakehouse, "ledgers", "_delta_log") == "s3://audit/lakehouse/ledgers/_delta_log"
    )


@pytest.mark.parametrize("url", ["/data/lakehouse", "gs://bucket/lh", "s3://", "lakehouse"])
def test_a_lakehouse_url_that_is_not_s3_is_refused(url):
    with pytest.raises(ValueError, match="must be s3://bucket"):
        Settings(object_store={"lakehouse_url": url})
