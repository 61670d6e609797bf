"""The librdkafka settings of every steplens Kafka client, one factory per role.

Every producer is idempotent with ``acks=all`` (a retried send is never stored twice, an
acknowledged one never lost) and compresses with lz4; every consumer commits by hand, only
after what it read is durable. Security settings come from ``STEPLENS_KAFKA_*``
(``settings.kafka_security_config``). What one caller needs besides is a keyword argument of
its own, and ``extra`` (librdkafka names) is applied last, so a user's setting always wins.
librdkafka's own log lines go to ``steplens.kafka.<role>``, each repeated line at most once a
minute with a count (``log_limit``). An admin client (``admin_config``; topics are created by
``topics.create_missing`` only) has the same security settings. Plain dicts: this module does
not import confluent_kafka; a full producer queue is ``kafka_produce``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from steplens.schema.log_limit import kafka_logger
from steplens.schema.settings import kafka_bootstrap, kafka_security_config


def producer_config(
    bootstrap: str | None = None,
    *,
    client_id: str | None = None,
    delivery_timeout_s: float | None = None,
    linger_ms: int = 20,
    log_role: str = "producer",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An idempotent, acks=all, lz4 producer; ``delivery_timeout_s`` bounds a message's wait
    for its acknowledgement (librdkafka's default when None)."""
    conf: dict[str, Any] = {
        "bootstrap.servers": kafka_bootstrap(bootstrap),
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": "lz4",
        "linger.ms": linger_ms,
        "logger": kafka_logger(log_role),
        **kafka_security_config(),
    }
    if client_id is not None:
        conf["client.id"] = client_id
    if delivery_timeout_s is not None:
        conf["message.timeout.ms"] = int(delivery_timeout_s * 1000)
    conf.update(extra or {})
    return conf


def consumer_config(
    group_id: str,
    bootstrap: str | None = None,
    *,
    offset_reset: str = "earliest",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A consumer of ``group_id`` with manual commits only: offsets move after the durable
    write, never before. An end of partition is not reported (every error is news)."""
    conf: dict[str, Any] = {
        "bootstrap.servers": kafka_bootstrap(bootstrap),
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": offset_reset,
        "max.poll.interval.ms": 1_800_000,  # a long outage pauses a consumer; it must not evict it
        "session.timeout.ms": 10_000,  # a crashed consumer's partitions move on within 10 s
        "logger": kafka_logger(group_id),
        **kafka_security_config(),
    }
    conf.update(extra or {})
    conf["enable.partition.eof"] = False
    return conf


def admin_config(
    bootstrap: str | None = None, *, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """An admin client (topics, groups) with the security settings of every other client."""
    conf: dict[str, Any] = {
        "bootstrap.servers": kafka_bootstrap(bootstrap),
        **kafka_security_config(),
    }
    conf.update(extra or {})
    return conf
