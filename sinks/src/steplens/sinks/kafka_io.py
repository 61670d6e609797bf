"""Kafka plumbing shared by the outputs: decoding, dead letters, commits."""

from __future__ import annotations

import itertools
import logging
import socket
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from steplens.schema import RUN_RANK, DecodeError, Record, decode
from steplens.schema.dead_letter import dead_letter_bytes
from steplens.schema.kafka_config import producer_config
from steplens.schema.kafka_produce import produce_bounded
from steplens.schema.log_limit import LimitedLog

log = logging.getLogger("steplens.sinks")
limited = LimitedLog(log)  # errors that repeat while Kafka is down: once a minute, counted
QUEUE_FULL_S = 10.0  # longest a dead letter waits for room in the producer's local queue


@dataclass(frozen=True)
class Consumed:
    """One Kafka message and what decoding made of it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    decoded: Record | DecodeError


def poll_batch(consumer: Consumer, max_messages: int, timeout_s: float) -> list[Consumed]:
    """Up to ``max_messages`` decoded messages; transport errors are logged, not returned."""
    out = []
    for msg in consumer.consume(num_messages=max_messages, timeout=timeout_s):
        err = msg.error()
        if err is not None:
            limited.warning(f"consumer {err.code()}", "steplens sink: consumer error: %s", err)
            continue
        out.append(_consumed(msg))
    return out


def _consumed(msg: Message) -> Consumed:
    value = msg.value() or b""
    return Consumed(
        topic=msg.topic() or "",
        partition=msg.partition() or 0,
        offset=msg.offset() or 0,
        key=msg.key(),
        value=value,
        decoded=decode(value),
    )


def next_offsets(batch: list[Consumed]) -> list[TopicPartition]:
    """Offsets to commit after ``batch`` is durable: last offset + 1 per partition."""
    last: dict[tuple[str, int], int] = {}
    for c in batch:
        tp = (c.topic, c.partition)
        last[tp] = max(last.get(tp, -1), c.offset)
    return [TopicPartition(t, p, o + 1) for (t, p), o in sorted(last.items())]


def commit(consumer: Consumer, offsets: list[TopicPartition]) -> bool:
    """Synchronous commit; False when it failed (the records will be delivered again)."""
    if not offsets:
        return True
    try:
        consumer.commit(offsets=offsets, asynchronous=False)
        return True
    except KafkaException as exc:
        limited.warning(
            "commit", "steplens sink: commit failed (records will be re-delivered): %s", exc
        )
        return False


class DeadLetters:
    """Produces ``dead_letter`` records; ``flush`` must succeed before offsets are committed."""

    def __init__(
        self, topic: str, consumer_name: str, bootstrap: str | None = None, **config: Any
    ) -> None:
        self.topic = topic
        self.consumer_name = consumer_name
        self._producer = Producer(producer_config(bootstrap, extra=config))
        self._seq = itertools.count()
        self._host = socket.gethostname()
        self._failed = 0
        self.sent = 0

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self._failed += 1
            limited.warning(
                f"dead letter {err.code()}", "steplens sink: dead letter not delivered: %s", err
            )

    def send(self, item: Consumed, reason: str) -> None:
        rec = item.decoded
        run_id, rank = (rec.run_id, rec.rank) if isinstance(rec, Record) else ("unknown", RUN_RANK)
        body = dead_letter_bytes(
            reason,
            item.value,
            source_topic=item.topic,
            partition=item.partition,
            offset=item.offset,
            consumer=self.consumer_name,
            run_id=run_id,
            rank=rank,
            seq=next(self._seq),
        )
        if not produce_bounded(
            self._producer,
            self.topic,
            body,
            item.key,
            on_delivery=self._on_delivery,
            max_wait_s=QUEUE_FULL_S,
        ):
            self._failed += 1  # flush() reports it; the batch is not committed
        self._producer.poll(0)
        self.sent += 1

    def flush(self, timeout_s: float = 10.0) -> bool:
        """True when every dead letter sent since the last flush is acknowledged; False when
        one failed or is still pending (send them again: a dead letter may then come twice)."""
        left = self._producer.flush(timeout_s)
        ok = left == 0 and self._failed == 0
        self._failed = 0
        return ok
