"""librdkafka's log lines reach Python logging (``connectors.kafka.librdkafka``), one level lower, with the
configured secrets redacted even where no handler was set up (a Spark worker)."""

from __future__ import annotations

import logging
import time

from confluent_kafka import Producer

from connectors.kafka.client_config import producer_config
from core.settings import KafkaSettings

LOGGER = "connectors.kafka.librdkafka"


def test_librdkafka_lines_are_one_level_lower_and_carry_no_secret(caplog):
    settings = KafkaSettings(
        sasl_mechanism="PLAIN",
        sasl_password="sasl-pw-5521",
        extra_config={"sasl.oauthbearer.client.secret": "oauth-secret-7730"},
    )
    config = producer_config(settings)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        # What librdkafka's log callback calls (level, format, facility, client name, text).
        config["logger"].log(
            logging.ERROR, "%s [%s] %s", "SASL", "rdkafka#producer-1", "sasl-pw-5521 oauth-secret-7730"
        )
    record = caplog.records[-1]
    assert record.name == LOGGER and record.levelno == logging.WARNING
    assert record.getMessage() == "SASL [rdkafka#producer-1] *** ***"


def test_a_real_client_logs_through_python_logging(caplog):
    producer = Producer(producer_config(KafkaSettings(bootstrap_servers="127.0.0.1:1")))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        deadline = time.monotonic() + 20
        while not any(r.name == LOGGER for r in caplog.records) and time.monotonic() < deadline:
            producer.poll(0.2)  # log lines are served by poll, like delivery reports
    lines = [r for r in caplog.records if r.name == LOGGER]
    assert lines, "librdkafka logged nothing about a refused connection"
    assert "127.0.0.1:1" in lines[0].getMessage()
    assert lines[0].levelno <= logging.WARNING  # librdkafka's error, one level lower
