"""Kafka helpers for the producer's integration tests: a fresh topic, read everything back."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from steplens.schema import Record, decode
from steplens.schema.topics import Topics, ensure_topics


def new_raw_topic(bootstrap: str) -> str:
    tag = uuid.uuid4().hex[:8]
    topics = Topics.prefixed(f"p{tag}", raw_partitions=4, other_partitions=1)
    ensure_topics(bootstrap, topics)
    return topics.raw


def consume_all(bootstrap: str, topic: str, until: Any, timeout_s: float = 60) -> list[Record]:
    """Read the topic from the start until ``until(records)`` holds or the timeout."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    md = consumer.list_topics(topic, timeout=10)
    consumer.assign([TopicPartition(topic, p, 0) for p in md.topics[topic].partitions])
    out: list[Record] = []
    deadline = time.monotonic() + timeout_s
    try:
        while not until(out) and time.monotonic() < deadline:
            for msg in consumer.consume(2000, timeout=0.5):
                if msg.error() is None:
                    rec = decode(msg.value())
                    assert isinstance(rec, Record), rec
                    assert msg.key() == rec.key
                    out.append(rec)
    finally:
        consumer.close()
    return out


def by_rank(records: list[Record]) -> dict[tuple[int, int], list[Record]]:
    out: dict[tuple[int, int], list[Record]] = defaultdict(list)
    for r in records:
        out[(r.rank, r.pid)].append(r)
    return out
