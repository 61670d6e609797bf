"""librdkafka's own lines go through the rate-limited logger the Kafka config factory sets: a
broker that refuses connections is said once a minute per message, not once per reconnect
attempt."""

from __future__ import annotations

import logging
import time
import uuid

import pytest
from confluent_kafka import Consumer

from steplens.schema.kafka_config import consumer_config
from steplens.stack.process import free_ports


def _lines_while_polling(
    caplog: pytest.LogCaptureFixture, logger: logging.Logger | None = None
) -> int:
    port = free_ports(1)[0]  # nothing listens there
    conf = consumer_config(
        f"g-{uuid.uuid4().hex[:8]}",
        f"127.0.0.1:{port}",
        extra={"reconnect.backoff.max.ms": 100} | ({"logger": logger} if logger else {}),
    )
    logger = conf["logger"]
    consumer = Consumer(conf)
    consumer.subscribe(["t"])
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        consumer.poll(0.2)
    consumer.close()
    return sum(1 for r in caplog.records if r.name == logger.name)


def test_refused_connections_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        raw = _lines_while_polling(caplog, logging.getLogger(f"test.raw.{uuid.uuid4().hex}"))
        limited = _lines_while_polling(caplog)
    assert raw >= 10  # the flood the limit stops
    assert limited <= 3, [r.getMessage() for r in caplog.records if "kafka" in r.name]
