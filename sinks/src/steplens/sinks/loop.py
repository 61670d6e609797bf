"""The consume → export → dead-letter → commit loop for sinks that follow the contract.

Offsets are committed only once a batch is durable and its dead letters acknowledged. While a
batch keeps failing the consumer is paused (and still polled, so it stays in its group) and the
same batch is exported again after a backoff, until it succeeds or shutdown is requested.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from steplens.producer.schema import DecodeError, Record
from steplens.sinks import metrics
from steplens.sinks.contract import ExportResult, Sink
from steplens.sinks.kafka_io import Consumed, DeadLetters, commit, next_offsets, poll_batch
from steplens.sinks.retry import RetryPolicy, backoff_delays

log = logging.getLogger("steplens.sinks")


@dataclass
class LoopStats:
    batches: int = 0
    accepted: int = 0
    skipped: int = 0
    dead_letters: int = 0
    commits: int = 0


class ConsumerLoop:
    """What every sink loop shares: the consumer, dead letters, shutdown event and backoff."""

    def __init__(
        self,
        consumer: Consumer,
        dead_letters: DeadLetters,
        *,
        stop: threading.Event,
        batch_size: int = 5000,
        poll_timeout_s: float = 0.2,
        backoff: RetryPolicy | None = None,
    ) -> None:
        self.consumer = consumer
        self.dead_letters = dead_letters
        self.stop = stop
        self.batch_size = batch_size
        self.poll_timeout_s = poll_timeout_s
        self._delay = backoff_delays(backoff or RetryPolicy(initial_backoff_s=0.5, max_backoff_s=5))

    def _keep_alive(self) -> None:
        """Poll while paused so the group keeps us; rewind anything a rebalance delivered."""
        msg = self.consumer.poll(0)
        if msg is not None and msg.error() is None:
            self.consumer.seek(
                TopicPartition(msg.topic() or "", msg.partition() or 0, msg.offset() or 0)
            )

    def _dead_letters_acknowledged(self) -> bool:
        """Wait (with backoff) until the dead letters sent are acknowledged; False on shutdown."""
        attempt = 0
        while not self.dead_letters.flush():
            attempt += 1
            if self.stop.wait(self._delay(attempt)):
                return False
        return True


class SinkLoop(ConsumerLoop):
    def __init__(
        self, consumer: Consumer, sink: Sink, dead_letters: DeadLetters, **loop: Any
    ) -> None:
        super().__init__(consumer, dead_letters, **loop)
        self.sink = sink
        self.stats = LoopStats()

    def run(self, max_seconds: float | None = None) -> LoopStats:
        """Run until ``stop`` is set (or ``max_seconds`` passed)."""
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        while not self.stop.is_set() and (deadline is None or time.monotonic() < deadline):
            batch = poll_batch(self.consumer, self.batch_size, self.poll_timeout_s)
            if batch:
                self.handle(batch)
        return self.stats

    def handle(self, batch: list[Consumed]) -> bool:
        """Make ``batch`` durable and commit it; False if shutdown came first."""
        records: list[Record] = []
        origin: list[Consumed] = []
        bad: list[tuple[Consumed, str]] = []
        for item in batch:
            if isinstance(item.decoded, DecodeError):
                bad.append((item, f"undecodable: {item.decoded}"))
            else:
                records.append(item.decoded)
                origin.append(item)
        result = self._export_until_durable(records)
        if result is None:
            return False
        bad += [
            (origin[r.index], f"rejected by {self.sink.name}: {r.reason}") for r in result.rejected
        ]
        for item, reason in bad:
            self.dead_letters.send(item, reason)
        name = self.sink.name
        metrics.RECORDS.labels(name, "accepted").inc(result.accepted)
        metrics.RECORDS.labels(name, "skipped").inc(result.skipped)
        metrics.RECORDS.labels(name, "dead_letter").inc(len(bad))
        if bad and not self._dead_letters_acknowledged():
            return False
        self.stats.batches += 1
        self.stats.accepted += result.accepted
        self.stats.skipped += result.skipped
        self.stats.dead_letters += len(bad)
        ok = commit(self.consumer, next_offsets(batch))
        metrics.COMMITS.labels(name, "ok" if ok else "failed").inc()
        if ok:
            self.stats.commits += 1
            metrics.LAST_COMMIT.labels(name).set_to_current_time()
        return True

    def _export_until_durable(self, records: list[Record]) -> ExportResult | None:
        if not records:
            return ExportResult()
        attempt = 0
        paused: list[TopicPartition] = []
        try:
            while True:
                with metrics.EXPORT_SECONDS.labels(self.sink.name).time():
                    result = self.sink.export(records)
                if not result.retryable:
                    return result
                attempt += 1
                log.warning(
                    "steplens sink %s: batch of %d not durable yet (attempt %d): %s",
                    self.sink.name,
                    len(records),
                    attempt,
                    result.error,
                )
                if not paused:
                    paused = self.consumer.assignment()
                    self.consumer.pause(paused)
                if self.stop.wait(self._delay(attempt)):
                    return None
                self._keep_alive()
        finally:
            if paused:
                self.consumer.resume(paused)
