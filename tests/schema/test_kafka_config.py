"""The Kafka client settings of every role: what each keeps, what a caller adds, what wins."""

from __future__ import annotations

import subprocess
import sys

from steplens.schema.kafka_config import admin_config, consumer_config, producer_config


def test_a_producer_is_idempotent_acks_all_lz4_and_extra_wins(monkeypatch) -> None:
    monkeypatch.setenv("STEPLENS_KAFKA_BOOTSTRAP", "k:1")
    monkeypatch.setenv("STEPLENS_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    conf = producer_config(client_id="c", delivery_timeout_s=2.5, extra={"linger.ms": 5})
    assert conf.pop("logger").name == "steplens.kafka.producer"  # librdkafka's lines, limited
    assert conf == {
        "bootstrap.servers": "k:1",
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": "lz4",
        "linger.ms": 5,
        "security.protocol": "SASL_SSL",
        "client.id": "c",
        "message.timeout.ms": 2500,
    }
    plain = producer_config("b:2")
    assert "client.id" not in plain and "message.timeout.ms" not in plain


def test_a_consumer_commits_by_hand_whatever_extra_says(monkeypatch) -> None:
    monkeypatch.delenv("STEPLENS_KAFKA_SECURITY_PROTOCOL", raising=False)
    conf = consumer_config(
        "g", "b:2", extra={"session.timeout.ms": 6000, "enable.partition.eof": True}
    )
    assert conf["bootstrap.servers"] == "b:2" and conf["group.id"] == "g"
    assert conf["enable.auto.commit"] is False and conf["enable.auto.offset.store"] is False
    assert conf["auto.offset.reset"] == "earliest" and conf["session.timeout.ms"] == 6000
    assert conf["enable.partition.eof"] is False
    assert consumer_config("g", "b", offset_reset="latest")["auto.offset.reset"] == "latest"
    assert conf["logger"].name == "steplens.kafka.g"


def test_an_admin_client_has_the_security_settings_and_extra_wins(monkeypatch) -> None:
    monkeypatch.setenv("STEPLENS_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("STEPLENS_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    conf = admin_config("b:2", extra={"log_level": 0, "sasl.mechanism": "PLAIN"})
    assert conf == {
        "bootstrap.servers": "b:2",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "log_level": 0,
    }


def test_the_training_producer_keeps_its_own_settings() -> None:
    from steplens.producer.delivery.transport import kafka_conf

    conf = kafka_conf("b:1", "steplens-r0", 30.0, {"acks": "1"})
    assert conf["acks"] == "1" and conf["enable.idempotence"] is True  # the user's wins
    assert conf["message.timeout.ms"] == 30_000 and conf["client.id"] == "steplens-r0"
    assert conf["queue.buffering.max.messages"] == 200_000 and conf["linger.ms"] == 20


def test_the_factory_does_not_import_the_kafka_client() -> None:
    code = "import sys, steplens.schema.kafka_config; print('confluent_kafka' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
