"""The route stage: raw messages, in batches, grouped by run and forwarded to the by-run topic.

The hop puts every rank of a run on one by-run partition: the producers key raw by run and
rank, and a run's detectors judge its ranks together (stragglers, hangs). A run's share of a
batch is cut into messages of about ``BY_RUN_MESSAGE_BYTES``; undecodable keys or non-UTF-8
payloads become dead letters here.

The stage reads the raw topic with a librdkafka consumer of its own group (``<app id>-route``)
in a thread of its own, not through a Faust agent: every raw message is one record, and
Faust's per-message machinery (its event, stream and sensor calls, aiokafka's record parsing)
cost about 150 us a message where this costs under 10 (bench/RESULTS.md), the largest share of
the worker's time in a wide run. A batch: up to ``batch`` messages within ``within_s``; their
by-run messages produced keyed by run with the murmur2 partitioner (the partition Faust's
producer gives the same key, so a run's nudges land beside its messages; the shards of a wide
run, keyed and placed by ``run_shards``, are nudged on their partitions); the producer
flushed; then the raw offsets committed. A worker killed before the commit leaves the old
position: the batch is routed again, and the detectors skip what they already applied.

A route group that never committed starts where the worker group (``<app id>``, whose Faust
agent routed before) committed the raw topic, else at its start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from steplens.schema import DecodeError, decode
from steplens.schema.kafka_config import admin_config, consumer_config, producer_config
from steplens.schema.kafka_produce import produce_bounded
from steplens.schema.log_limit import LimitedLog
from steplens.stream_jobs.engine.run_keys import shard_key
from steplens.stream_jobs.worker import run_shards
from steplens.stream_jobs.worker.settings import (
    BY_RUN_MAX_BYTES,
    WorkerSettings,
    by_run_chunks,
    run_of_key,
)

log = logging.getLogger("steplens.stream_jobs")

FLUSH_S = 30.0  # longest a batch's by-run writes may wait to be acknowledged
QUEUE_FULL_S = 10.0  # longest one by-run message waits for room in the producer's queue
RETRY_S = 1.0  # pause after a batch failed (Kafka away), before the next try
LAG_EVERY_S = 1.0  # the route thread reads its lag at most this often

# (reason, payload, run, partition, offset) -> the dead letter's key and value
DeadLetter = Callable[[str, bytes | None, str | None, int, int], bytes]


class Router:
    """The route stage's consumer, producer and thread (``start``, ``stop``)."""

    def __init__(
        self,
        s: WorkerSettings,
        dead_letter: DeadLetter,
        on_assigned: Callable[[int], None] = lambda n: None,
        *,
        first: int,
    ) -> None:
        self.s = s
        self.by_run = f"{s.app_id}-by-run"
        self.group = f"{s.app_id}-route"
        self.dead_letter = dead_letter  # the dead letter's bytes (and its count)
        self.on_assigned = on_assigned  # raw partitions now assigned
        self.consumer: Consumer | None = None
        self.producer: Producer | None = None
        self.routed = 0  # raw messages routed (dead letters included)
        self.partitions = s.by_run_partitions  # the by-run topic's, once it is read
        self.first = first  # the ranks of a run's shard 0 (``run_shards.first_ranks``)
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.failed: list[str] = []  # a delivery of the batch in flight that failed
        self.assigned: list[TopicPartition] = []  # the raw partitions the route thread holds
        self.behind = 0  # raw messages behind their partitions' ends, as last read (``lag``)
        self._lag_read = -LAG_EVERY_S  # when the route thread last read it (monotonic)
        self._log = LimitedLog(log)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """The route thread; it makes its clients itself (the carry-over of offsets waits on
        the broker, which the app's event loop must not)."""
        self.thread = threading.Thread(target=self._loop, name="steplens-route", daemon=True)
        self.thread.start()

    def _open(self) -> tuple[Consumer, Producer]:
        s = self.s
        try:
            self._seed()
        except Exception as exc:  # the route group's own position, or the topic's start
            log.warning("route: the worker group's raw offsets not carried over: %s", exc)
        extra = {
            "fetch.wait.max.ms": max(1, s.fetch_wait_ms),
            "client.id": self.group,
            # a killed worker's raw partitions move as its by-run ones do (``session_timeout_s``)
            "session.timeout.ms": int(s.session_timeout_s * 1000),
            "heartbeat.interval.ms": int(s.session_timeout_s * 1000 / 6),
        }
        consumer = Consumer(consumer_config(self.group, s.bootstrap, extra=extra))
        consumer.subscribe([s.topics.raw], on_assign=self._on_assign, on_revoke=self._on_revoke)
        producer = Producer(
            producer_config(
                s.bootstrap,
                client_id=self.group,
                linger_ms=5,
                log_role="route",
                extra={"partitioner": "murmur2_random", "message.max.bytes": BY_RUN_MAX_BYTES},
            )
        )
        try:  # the shards of a wide run go to partitions of their own (``run_shards``)
            topic = producer.list_topics(self.by_run, timeout=10).topics[self.by_run]
            self.partitions = len(topic.partitions) or self.partitions
        except Exception as exc:
            log.warning("route: the by-run topic's partitions not read: %s", exc)
        return consumer, producer

    def stop(self, timeout_s: float = FLUSH_S + 5) -> None:
        """Stop after the batch in flight (routed and committed), and leave the group."""
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout_s)

    def _loop(self) -> None:
        self.consumer, self.producer = self._open()
        try:
            while not self.stopping.is_set():
                try:
                    self.step()
                except Exception as exc:  # Kafka away or a commit refused: the batch again
                    self._log.warning(
                        type(exc).__name__, "route: batch not routed, tried again: %s", exc
                    )
                    self.stopping.wait(RETRY_S)
        finally:
            self.producer.flush(FLUSH_S)
            self.consumer.close()

    # ------------------------------------------------------------------ batches
    def step(self) -> int:
        """Route one batch; returns its raw messages. Raises when its by-run writes were not
        all acknowledged or the commit failed: nothing is committed, and the consumer is back
        at the batch's first messages."""
        consumer, producer = self.consumer, self.producer
        assert consumer is not None and producer is not None
        self._read_lag(consumer)  # before the batch: nothing it raises can cost one
        msgs = consumer.consume(num_messages=self.s.batch, timeout=self.s.within_s)
        if not msgs:
            producer.poll(0)
            return 0
        firsts: dict[tuple[str, int], int] = {}  # each partition's first offset in the batch
        try:
            self._route(msgs, firsts)
        except Exception:
            self._rewind(firsts)  # the batch is consumed again
            raise
        self.routed += len(msgs)
        return len(msgs)

    def _route(self, msgs: list[Any], firsts: dict[tuple[str, int], int]) -> None:
        """``msgs`` forwarded, flushed and committed (``step``)."""
        consumer, producer = self.consumer, self.producer
        assert consumer is not None and producer is not None
        groups: dict[tuple[str, int], list[list[Any]]] = {}  # by run and shard
        offsets: dict[tuple[str, int], int] = {}
        for msg in msgs:
            err = msg.error()
            if err is not None:
                self._log.warning(f"consumer {err.code()}", "route: consumer error: %s", err)
                continue
            partition, offset = msg.partition() or 0, msg.offset() or 0
            tp = (msg.topic() or "", partition)
            firsts.setdefault(tp, offset)
            offsets[tp] = offset + 1
            got = self._run_of(msg.key(), msg.value(), partition, offset)
            if got is not None:
                groups.setdefault(got[:2], []).append([partition, offset, got[2]])
        self.failed.clear()
        for (run, shard), items in groups.items():
            key = shard_key(run, shard).encode()
            to = run_shards.partition_of(run, shard, self.partitions)
            for chunk in by_run_chunks(items):
                self._produce(self.by_run, key, orjson.dumps(chunk), to)
        left = producer.flush(FLUSH_S)
        if left or self.failed:
            why = f" ({self.failed[0]})" if self.failed else ""
            raise RuntimeError(
                f"{left} by-run messages unacknowledged, {len(self.failed)} failed{why}"
            )
        if offsets:
            consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                asynchronous=False,
            )

    def _rewind(self, firsts: dict[tuple[str, int], int]) -> None:
        """Back to a failed batch's first messages, on the partitions still assigned (a
        partition moved by a rebalance starts at its committed offset with its new owner)."""
        assert self.consumer is not None
        for (topic, partition), offset in firsts.items():
            try:
                self.consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException:
                log.debug("route: partition %s not rewound (not assigned)", partition)

    def _produce(
        self, topic: str, key: bytes | None, value: bytes, partition: int | None = None
    ) -> None:
        assert self.producer is not None
        queued = produce_bounded(
            self.producer,
            topic,
            value,
            key,
            on_delivery=self._delivered,
            max_wait_s=QUEUE_FULL_S,
            partition=partition,
        )
        if not queued:
            raise RuntimeError(f"the producer's queue stayed full ({topic})")

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.failed.append(str(err))

    def _run_of(
        self, key: bytes | None, value: bytes | None, partition: int, offset: int
    ) -> tuple[str, int, str | None] | None:
        """A raw message's run and shard (from its key, else its record) and its text; None
        (a dead letter) when it has none."""
        named = run_of_key(key)
        try:
            text = value.decode("utf-8") if value is not None else None
        except UnicodeDecodeError as exc:
            run = named[0] if named else None
            self._dead(f"not valid UTF-8: {exc}", value, run, key, partition, offset)
            return None
        if named is None:
            got = decode(text)
            if isinstance(got, DecodeError):
                self._dead(str(got), value, None, key, partition, offset)
                return None
            named = got.run_id, got.rank
        run, rank = named
        s = self.s
        shard = run_shards.shard_of_rank(rank, s.shard_ranks, s.limits.max_ranks, self.first)
        return run, shard, text  # a null value (None) under a run's key: the scorer says why

    def _dead(  # noqa: PLR0917
        self,
        reason: str,
        value: bytes | None,
        run: str | None,
        key: bytes | None,
        partition: int,
        offset: int,
    ) -> None:
        body = self.dead_letter(reason, value, run, partition, offset)
        self._produce(self.s.topics.dead_letters, key, body)

    # ------------------------------------------------------------------ assignment
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        self.on_assigned(len(partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned = []
        self.behind = 0
        self.on_assigned(0)  # an eager rebalance: every partition is revoked, then assigned

    def _seed(self) -> None:
        """Before the route group is joined, once: where it has committed no raw partition at
        all, it is given the worker group's raw offsets (those of earlier versions' route
        agent), so an upgrade does not route the raw topic again from its start. Nothing
        blocks a rebalance: this runs before the consumer joins."""
        topic = self.s.topics.raw
        admin = AdminClient(admin_config(self.s.bootstrap))
        parts = admin.list_topics(topic, timeout=10).topics[topic].partitions
        tps = [TopicPartition(topic, p) for p in parts]
        if self._group_offsets(admin, self.group, tps):
            return  # the route group's own commits hold
        before = self._group_offsets(admin, self.s.app_id, tps)
        if before:
            seeded = [TopicPartition(topic, p, o) for p, o in before.items()]
            request = ConsumerGroupTopicPartitions(self.group, seeded)
            admin.alter_consumer_group_offsets([request])[self.group].result(timeout=10)

    @staticmethod
    def _group_offsets(admin: AdminClient, group: str, tps: list[TopicPartition]) -> dict[int, int]:
        request = ConsumerGroupTopicPartitions(group, tps)
        got = admin.list_consumer_group_offsets([request])[group].result(timeout=10)
        return {
            tp.partition: tp.offset
            for tp in got.topic_partitions or []
            if tp.offset >= 0 and tp.error is None
        }

    # ------------------------------------------------------------------ lag
    def lag(self) -> int:
        """Raw messages behind the ends of this worker's raw partitions, as the route thread
        last read them (at most ``LAG_EVERY_S`` ago while it runs)."""
        return self.behind

    def _read_lag(self, consumer: Consumer) -> None:
        """The lag, read in the route thread before a batch from its own consumer's
        positions and the ends its fetches brought (no broker round trip). Read from another
        thread, under load, these calls waited on the consumer for tens of seconds, and the
        gauge was that stale."""
        now = time.monotonic()
        if now - self._lag_read < LAG_EVERY_S:
            return
        self._lag_read = now
        total = 0
        try:
            for tp in consumer.position(self.assigned) if self.assigned else []:
                _, high = consumer.get_watermark_offsets(tp, cached=True)
                if high >= 0 and tp.offset >= 0:
                    total += max(0, high - tp.offset)
        except Exception as exc:  # best effort: the last reading stands
            log.debug("route: lag not read: %s", exc)
            return
        self.behind = total
