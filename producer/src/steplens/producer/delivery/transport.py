"""Where encoded records go: Kafka (confluent-kafka) or memory (tests, other parts' tests).

A transport queues messages asynchronously and reports each result through a callback
``on_result(ok, key, value)`` that runs inside ``poll``/``flush`` (confluent-kafka's model).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from steplens.producer.remedies.advice_inbox import Message
from steplens.schema import Record
from steplens.schema.codec import decode
from steplens.schema.kafka_config import consumer_config, producer_config
from steplens.schema.kafka_produce import produce_bounded

log = logging.getLogger("steplens")

OnResult = Callable[[bool, bytes, bytes], None]

# librdkafka's own log lines (one per reconnect attempt while Kafka is down; "steplens.kafka",
# see kafka_config) reach handlers the application configured; by default they stay silent in
# a training process, and the "steplens" logger says an outage once
logging.getLogger("steplens.kafka").addHandler(logging.NullHandler())


class Transport(Protocol):
    def produce(
        self, key: bytes, value: bytes, on_result: OnResult, topic: str | None = None
    ) -> bool:
        """Queue one message (to the raw topic, or ``topic``); False when the local buffer is
        full (poll, then try again). Raises ``ConnectionError`` when the destination refuses
        it for now (an unknown topic: keep it, send it again later), ``ValueError`` when it
        never can take it (too large)."""
        ...

    def poll(self, timeout_s: float = 0.0) -> None:
        """Serve delivery results."""
        ...

    def flush(self, timeout_s: float) -> int:
        """Wait for outstanding messages; returns how many are still outstanding."""
        ...

    def take_down_signal(self) -> bool:
        """True once after the transport noticed that its destination went away."""
        ...

    def reachable(self, timeout_s: float) -> bool:
        """Ask the destination whether it answers now."""
        ...

    def purge_queued(self) -> None:
        """Fail every queued, not yet sent message now (results arrive on the next poll)."""
        ...

    def abandon(self, timeout_s: float) -> None:
        """Fail every message not yet acknowledged, in flight included, and serve all their
        results before returning (bounded by ``timeout_s``)."""
        ...

    def close(self, timeout_s: float) -> None: ...


class MemoryTransport:
    """Keeps every delivered message in memory. ``available = False`` simulates an outage:
    queued messages then fail on the next poll, as they would after a Kafka timeout.

    It is also a Monitor's advice source: ``advise(value)`` hands it the bytes of a message
    of the advice topic (``steplens.schema.encode(make_record("advice", ...))``), which the
    Monitor's worker takes on its next wake-up. Messages to another topic than the raw one
    (dead letters) land in ``aside``."""

    label = "memory"  # as an advice source

    def __init__(self) -> None:
        self.messages: list[tuple[bytes, bytes]] = []
        self.aside: list[tuple[str, bytes, bytes]] = []  # (topic, key, value)
        self.available = True
        self._pending: list[tuple[bytes, bytes, OnResult]] = []
        self._lock = threading.Lock()
        self._down_signal = False
        self._advice: deque[Message] = deque()
        self._advice_offset = 0

    def produce(
        self, key: bytes, value: bytes, on_result: OnResult, topic: str | None = None
    ) -> bool:
        if topic is not None:
            self.aside.append((topic, key, value))
            return True
        with self._lock:
            self._pending.append((key, value, on_result))
        return True

    def advise(self, value: bytes | None, key: bytes | None = None) -> None:
        """One message of the advice topic for the Monitor to take (``key``: the run id)."""
        self._advice.append((key, value, 0, self._advice_offset))
        self._advice_offset += 1

    def take_advice(self, max_n: int) -> list[Message]:
        q = self._advice
        return [q.popleft() for _ in range(min(max_n, len(q)))]

    def close_advice(self) -> None:
        return None

    def poll(self, timeout_s: float = 0.0) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
            ok = self.available
            if ok:
                self.messages.extend((k, v) for k, v, _ in pending)
            elif pending:
                self._down_signal = True
        for key, value, on_result in pending:
            on_result(ok, key, value)

    def flush(self, timeout_s: float) -> int:
        self.poll()
        return 0

    def take_down_signal(self) -> bool:
        signal, self._down_signal = self._down_signal, False
        return signal

    def reachable(self, timeout_s: float) -> bool:
        return self.available

    def purge_queued(self) -> None:
        return None

    def abandon(self, timeout_s: float) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for key, value, on_result in pending:
            on_result(False, key, value)

    def close(self, timeout_s: float) -> None:
        self.flush(timeout_s)

    def records(self, kind: str | None = None) -> list[Record]:
        """Delivered messages decoded (each must decode), optionally of one kind."""
        with self._lock:
            raw = list(self.messages)
        out = []
        for _, value in raw:
            rec = decode(value)
            if not isinstance(rec, Record):
                raise AssertionError(f"undecodable record: {rec}")  # noqa: TRY004
            if kind is None or rec.kind == kind:
                out.append(rec)
        return out


def kafka_conf(
    bootstrap: str, client_id: str, delivery_timeout_s: float, extra: dict[str, Any]
) -> dict[str, Any]:
    """A training process's producer: the shared producer settings, a queue deep enough for
    an outage's first seconds, reconnects at least every second; ``extra`` wins."""
    return producer_config(
        bootstrap,
        client_id=client_id,
        delivery_timeout_s=delivery_timeout_s,
        extra={
            "queue.buffering.max.messages": 200_000,
            "queue.buffering.max.kbytes": 256 << 10,
            "reconnect.backoff.max.ms": 1000,
            "log.connection.close": False,
            **extra,
        },
    )


class KafkaTransport:
    """confluent-kafka producer. Created by the worker on its first send, in its own process."""

    def __init__(self, topic: str, conf: dict[str, Any]) -> None:
        from confluent_kafka import KafkaError, KafkaException, Producer

        self.topic = topic
        self._conf = dict(conf)
        self._kafka_error = KafkaError
        self._kafka_exception = KafkaException
        self._down_signal = False
        self._fatal = False
        self._conf["error_cb"] = self._on_error
        self._producer = Producer(self._conf)

    def _on_error(self, err: Any) -> None:
        code = err.code()
        if err.fatal():
            self._fatal = True
            self._down_signal = True
            log.warning("steplens: fatal Kafka producer error: %s", err)
        elif code in (self._kafka_error._ALL_BROKERS_DOWN, self._kafka_error._AUTHENTICATION):
            self._down_signal = True

    def produce(
        self, key: bytes, value: bytes, on_result: OnResult, topic: str | None = None
    ) -> bool:
        def done(err: Any, msg: Any) -> None:
            on_result(err is None, msg.key() or key, msg.value() or value)

        # never waits for room: the caller serves results and decides (``Delivery.send``)
        try:
            return produce_bounded(
                self._producer, topic or self.topic, value, key, on_delivery=done, max_wait_s=0.0
            )
        except self._kafka_exception as exc:
            err = exc.args[0] if exc.args else None
            if err is not None and err.code() == self._kafka_error.MSG_SIZE_TOO_LARGE:
                raise ValueError(f"steplens: a record Kafka never takes: {err}") from exc
            raise ConnectionError(f"steplens: Kafka refused a record for now: {err}") from exc

    def poll(self, timeout_s: float = 0.0) -> None:
        self._producer.poll(timeout_s)

    def flush(self, timeout_s: float) -> int:
        return int(self._producer.flush(timeout_s))

    def take_down_signal(self) -> bool:
        signal, self._down_signal = self._down_signal, False
        return signal

    def reachable(self, timeout_s: float) -> bool:
        if self._fatal:  # an idempotent producer in a fatal state cannot be reused
            self._recreate()
        try:
            md = self._producer.list_topics(self.topic, timeout=timeout_s)
        except Exception:
            return False
        return bool(md.brokers)

    def _recreate(self) -> None:
        from confluent_kafka import Producer

        # every message of the old client reaches the spool through its delivery callback
        # before the client is dropped: a dropped client never reports what it still held
        self.abandon(5.0)
        self._producer = Producer(self._conf)
        self._fatal = False

    def abandon(self, timeout_s: float) -> None:
        try:
            self._producer.purge(in_queue=True, in_flight=True, blocking=True)
        except Exception as exc:
            log.debug("steplens: purge failed: %s", exc)
        deadline = time.monotonic() + timeout_s
        self._producer.poll(0)
        while len(self._producer) and time.monotonic() < deadline:
            self._producer.poll(0.05)
        if len(self._producer):
            log.warning("steplens: %d Kafka results never arrived", len(self._producer))

    def purge_queued(self) -> None:
        try:
            self._producer.purge(in_queue=True, in_flight=False, blocking=False)
        except Exception as exc:  # older librdkafka builds
            log.debug("steplens: purge failed: %s", exc)

    def close(self, timeout_s: float) -> None:
        self._producer.flush(timeout_s)


def kafka_transport(config: Any, identity: Any) -> KafkaTransport:
    """The Kafka transport of a Monitor (``config``: its ProducerConfig)."""
    conf = kafka_conf(
        config.kafka_bootstrap,
        f"steplens-{identity.run_id}-r{identity.rank}"[:200],
        config.delivery_timeout_s,
        config.kafka_config,
    )
    return KafkaTransport(config.topic, conf)


class KafkaAdviceSource:
    """The advice topic, every partition of it, from ``start_ms`` on: assigned, not subscribed
    (no group to join, no offsets committed), so each rank reads its run's advice itself
    from the moment it started. Created in the worker thread; raises when Kafka or the topic
    does not answer within ``timeout_s`` (the worker tries again later)."""

    label = "kafka"

    def __init__(self, topic: str, conf: dict[str, Any], start_ms: int, timeout_s: float) -> None:
        from confluent_kafka import Consumer

        self._consumer = Consumer(conf)
        try:
            _assign_from(self._consumer, topic, start_ms, timeout_s)
        except Exception:
            self._consumer.close()
            raise

    def take_advice(self, max_n: int) -> list[Message]:
        out: list[Message] = []
        for msg in self._consumer.consume(max_n, timeout=0):
            if msg.error() is None:
                out.append((msg.key(), msg.value(), msg.partition() or 0, msg.offset() or 0))
        return out

    def close_advice(self) -> None:
        self._consumer.close()


def _assign_from(consumer: Any, topic: str, start_ms: int, timeout_s: float) -> None:
    """Assign every partition of ``topic`` to ``consumer`` at its first message from
    ``start_ms`` on (its end where there is none yet)."""
    from confluent_kafka import TopicPartition

    meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise ConnectionError(f"advice topic {topic!r}: {meta and meta.error}")
    wanted = [TopicPartition(topic, p, start_ms) for p in sorted(meta.partitions)]
    found = consumer.offsets_for_times(wanted, timeout=timeout_s)
    consumer.assign(found)  # where none is that recent: -1, which is OFFSET_END


def kafka_advice_source(config: Any, identity: Any, start_ms: int) -> KafkaAdviceSource:
    """The advice source of a Monitor (``config``: its ProducerConfig): the security settings
    of ``kafka_config`` apply, its producer settings do not."""
    security = {
        k: v for k, v in config.kafka_config.items() if k.startswith(("security.", "sasl.", "ssl."))
    }
    name = f"steplens-advice-{identity.run_id}-r{identity.rank}"[:200]
    conf = consumer_config(
        name, config.kafka_bootstrap, offset_reset="latest", extra={"client.id": name, **security}
    )
    return KafkaAdviceSource(config.advice_topic, conf, start_ms, timeout_s=2.0)
