"""The consume → export → dead-letter → commit loop, written once for every output.

Offsets are committed only once a batch is durable and its dead letters acknowledged. While a
batch keeps coming back retryable the consumer is paused (and still polled, so it stays in its
group) and the same batch is exported again after a backoff (``retry.until_done``, the only
place an output's work is retried), until it is durable or shutdown is requested.
``SinkLoop`` exports each polled batch as it comes, as decoded records (InfluxDB, the
notifiers); ``MessageLoop`` as decoded messages with their offsets (the MLflow mirror);
``RollerLoop`` (``roller_loop.py``) buffers per partition and exports rolled chunks (S3). They
only say how polled messages become batches; making a batch durable is ``ConsumerLoop.deliver``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from confluent_kafka import Consumer, TopicPartition

from steplens.schema import DecodeError, Record
from steplens.schema.log_limit import LimitedLog
from steplens.sinks import metrics
from steplens.sinks.contract import ExportResult, Output
from steplens.sinks.kafka_io import Consumed, DeadLetters, commit, next_offsets, poll_batch
from steplens.sinks.retry import RetryPolicy, until_done

log = logging.getLogger("steplens.sinks")
# an outage retries every few seconds: each output's and step's retries said once a minute
limited = LimitedLog(log)

B = TypeVar("B")
T = TypeVar("T")
Bad = list[tuple[Consumed, str]]  # messages to dead-letter, with the reason


@dataclass
class LoopStats:
    batches: int = 0
    accepted: int = 0
    skipped: int = 0
    dead_letters: int = 0
    commits: int = 0


class ConsumerLoop(Generic[B]):
    """The consumer, the output, dead letters, the shutdown event and the retry policy."""

    def __init__(
        self,
        consumer: Consumer,
        output: Output[B],
        dead_letters: DeadLetters,
        *,
        stop: threading.Event,
        batch_size: int = 5000,
        poll_timeout_s: float = 0.2,
        backoff: RetryPolicy | None = None,
    ) -> None:
        self.consumer = consumer
        self.output = output
        self.dead_letters = dead_letters
        self.stop = stop
        self.batch_size = batch_size
        self.poll_timeout_s = poll_timeout_s
        self.stats = LoopStats()
        self.policy = backoff or RetryPolicy()

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
        name = self.output.name
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

    def until_done(self, attempt: Callable[[], T], done: Callable[[T], bool], what: str) -> T:
        """``attempt`` again after a backoff until ``done``, or shutdown; meanwhile the consumer
        is paused and kept in its group. Returns the last result."""
        paused: list[TopicPartition] = []

        def on_retry(attempts: int, result: Any) -> None:
            metrics.RETRIES.labels(self.output.name).inc()
            limited.warning(
                f"{self.output.name} {what}",
                "steplens %s: %s not done yet (attempt %d): %s",
                self.output.name,
                what,
                attempts,
                getattr(result, "error", result),
            )
            if not paused:
                paused.extend(self.consumer.assignment())
                self.consumer.pause(paused)
            self._keep_alive()

        try:
            return until_done(attempt, done, policy=self.policy, stop=self.stop, on_retry=on_retry)
        finally:
            if paused:
                self.consumer.resume(paused)

    def _export_until_durable(self, batch: B, size: int) -> ExportResult | None:
        """Export until the result is not retryable; None when shutdown came first."""
        if size == 0:
            return ExportResult()

        def export() -> ExportResult:
            with metrics.EXPORT_SECONDS.labels(self.output.name).time():
                return self.output.export(batch)

        result = self.until_done(
            export, lambda r: not r.retryable, f"a batch of {size} made durable"
        )
        return None if result.retryable else result

    def _keep_alive(self) -> None:
        """Poll while paused so the group keeps us; rewind anything a rebalance delivered."""
        msg = self.consumer.poll(0)
        if msg is not None and msg.error() is None:
            self.consumer.seek(
                TopicPartition(msg.topic() or "", msg.partition() or 0, msg.offset() or 0)
            )

    def _send_dead_letters(self, letters: Bad) -> bool:
        """Send until all are acknowledged, again after a failure: a letter whose delivery
        failed must not be committed past (a retried letter may come twice). False on
        shutdown."""

        def send() -> bool:
            for item, reason in letters:
                self.dead_letters.send(item, reason)
            return self.dead_letters.flush()

        return self.until_done(send, bool, f"{len(letters)} dead letters acknowledged")


def decoded(polled: list[Consumed]) -> tuple[list[Consumed], Bad]:
    """The decodable messages, and the undecodable ones with the reason."""
    good: list[Consumed] = []
    bad: Bad = []
    for item in polled:
        if isinstance(item.decoded, DecodeError):
            bad.append((item, f"undecodable: {item.decoded}"))
        else:
            good.append(item)
    return good, bad


class SinkLoop(ConsumerLoop[Any]):
    """Each polled batch is exported as it comes, as its decoded records."""

    def handle(self, polled: list[Consumed]) -> bool:
        if not polled:
            return True
        origin, bad = decoded(polled)
        return self.deliver(
            self.batch_of(origin),
            size=len(origin),
            origin=origin,
            bad=bad,
            offsets=next_offsets(polled),
        )

    def batch_of(self, origin: list[Consumed]) -> Any:
        records: list[Record] = [item.decoded for item in origin]  # type: ignore[misc]
        return records


class MessageLoop(SinkLoop):
    """Each polled batch is exported as its decoded messages: for an output that keeps the
    offsets of what it wrote."""

    def batch_of(self, origin: list[Consumed]) -> Any:
        return origin
