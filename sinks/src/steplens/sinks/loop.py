"""The consume → export → dead-letter → commit loop, written once for both sinks.

Offsets are committed only once a batch is durable and its dead letters acknowledged. While a
batch keeps failing the consumer is paused (and still polled, so it stays in its group) and the
same batch is exported again after a backoff, until it succeeds or shutdown is requested.
``SinkLoop`` exports each polled batch as it comes (InfluxDB); ``RollerLoop``
(``roller_loop.py``) buffers per partition and exports rolled chunks (S3). Both only say how
polled messages become batches; making a batch durable is ``ConsumerLoop.deliver``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from confluent_kafka import Consumer, TopicPartition

from steplens.schema import DecodeError, Record
from steplens.sinks import metrics
from steplens.sinks.contract import ExportResult, Sink
from steplens.sinks.kafka_io import Consumed, DeadLetters, commit, next_offsets, poll_batch
from steplens.sinks.retry import RetryPolicy, backoff_delays

log = logging.getLogger("steplens.sinks")

B = TypeVar("B")
Bad = list[tuple[Consumed, str]]  # messages to dead-letter, with the reason


@dataclass
class LoopStats:
    batches: int = 0
    accepted: int = 0
    skipped: int = 0
    dead_letters: int = 0
    commits: int = 0


class ConsumerLoop(Generic[B]):
    """The consumer, the sink, dead letters, the shutdown event and the backoff."""

    def __init__(
        self,
        consumer: Consumer,
        sink: Sink[B],
        dead_letters: DeadLetters,
        *,
        stop: threading.Event,
        batch_size: int = 5000,
        poll_timeout_s: float = 0.2,
        backoff: RetryPolicy | None = None,
    ) -> None:
        self.consumer = consumer
        self.sink = sink
        self.dead_letters = dead_letters
        self.stop = stop
        self.batch_size = batch_size
        self.poll_timeout_s = poll_timeout_s
        self.stats = LoopStats()
        self._delay = backoff_delays(backoff or RetryPolicy(initial_backoff_s=0.5, max_backoff_s=5))

    def run(self, max_seconds: float | None = None) -> LoopStats:
        """Run until ``stop`` is set (or ``max_seconds`` passed)."""
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        while not self.stop.is_set() and (deadline is None or time.monotonic() < deadline):
            if not self.handle(poll_batch(self.consumer, self.batch_size, self.poll_timeout_s)):
                break
        return self.stats

    def handle(self, polled: list[Consumed]) -> bool:
        """Make what ``polled`` completes durable and commit it; False if shutdown came first."""
        raise NotImplementedError

    def deliver(
        self,
        batch: B,
        *,
        size: int,
        origin: Sequence[Consumed],
        bad: Bad,
        offsets: list[TopicPartition],
    ) -> bool:
        """Export ``batch`` until durable, dead-letter ``bad`` and what the sink refused (its
        indices point into ``origin``), then commit ``offsets``; False if shutdown came first."""
        result = self._export_until_durable(batch, size)
        if result is None:
            return False
        name = self.sink.name
        refused = [(origin[r.index], f"rejected by {name}: {r.reason}") for r in result.rejected]
        trimmed = [
            (origin[r.index], f"stored in part by {name}: {r.reason}") for r in result.trimmed
        ]
        letters = [*bad, *refused, *trimmed]
        metrics.RECORDS.labels(name, "accepted").inc(result.accepted)
        metrics.RECORDS.labels(name, "skipped").inc(result.skipped)
        metrics.RECORDS.labels(name, "dead_letter").inc(len(bad) + len(refused))
        metrics.RECORDS.labels(name, "trimmed").inc(len(trimmed))
        if letters and not self._send_dead_letters(letters):
            return False
        self.stats.batches += 1
        self.stats.accepted += result.accepted
        self.stats.skipped += result.skipped
        self.stats.dead_letters += len(letters)
        ok = commit(self.consumer, offsets)
        metrics.COMMITS.labels(name, "ok" if ok else "failed").inc()
        if ok:
            self.stats.commits += 1
            metrics.LAST_COMMIT.labels(name).set_to_current_time()
        return True

    def _export_until_durable(self, batch: B, size: int) -> ExportResult | None:
        """Export until the result is not retryable; None when shutdown came first. Meanwhile
        the consumer is paused and kept in its group."""
        if size == 0:
            return ExportResult()
        attempt = 0
        paused: list[TopicPartition] = []
        try:
            while True:
                with metrics.EXPORT_SECONDS.labels(self.sink.name).time():
                    result = self.sink.export(batch)
                if not result.retryable:
                    return result
                attempt += 1
                log.warning(
                    "steplens sink %s: batch of %d not durable yet (attempt %d): %s",
                    self.sink.name,
                    size,
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

    def _keep_alive(self) -> None:
        """Poll while paused so the group keeps us; rewind anything a rebalance delivered."""
        msg = self.consumer.poll(0)
        if msg is not None and msg.error() is None:
            self.consumer.seek(
                TopicPartition(msg.topic() or "", msg.partition() or 0, msg.offset() or 0)
            )

    def _send_dead_letters(self, letters: Bad) -> bool:
        """Send until all are acknowledged, again after a failure (with backoff): a letter whose
        delivery failed must not be committed past. False on shutdown."""
        attempt = 0
        while True:
            for item, reason in letters:
                self.dead_letters.send(item, reason)
            if self.dead_letters.flush():
                return True
            attempt += 1
            if self.stop.wait(self._delay(attempt)):
                return False


class SinkLoop(ConsumerLoop[list[Record]]):
    """Each polled batch is exported as it comes: the InfluxDB sink's loop."""

    def handle(self, polled: list[Consumed]) -> bool:
        if not polled:
            return True
        records: list[Record] = []
        origin: list[Consumed] = []
        bad: Bad = []
        for item in polled:
            if isinstance(item.decoded, DecodeError):
                bad.append((item, f"undecodable: {item.decoded}"))
            else:
                records.append(item.decoded)
                origin.append(item)
        return self.deliver(
            records, size=len(records), origin=origin, bad=bad, offsets=next_offsets(polled)
        )
