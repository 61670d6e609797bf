"""What the worker sends: signals (thinned out by the quiet limiter), alert transitions (to the
alert topic, which the notifier outputs read), advice to a run's ranks (the advice topic, keyed
by run), dead letters; with the worker's metrics of each."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from steplens.schema.dead_letter import dead_letter_bytes
from steplens.schema.topics import Topics
from steplens.stream_jobs.engine.advice import Advised
from steplens.stream_jobs.engine.core import Alert, Signals
from steplens.stream_jobs.engine.outputs import advice_bytes, alert_bytes, signal_bytes
from steplens.stream_jobs.engine.publish_limit import QuietLimiter
from steplens.stream_jobs.engine.run_keys import run_of
from steplens.stream_jobs.worker.metrics import WorkerMetrics, reason_class

log = logging.getLogger("steplens.stream_jobs")

# (topic, key, value) -> the send's delivery
Send = Callable[[str, bytes | None, bytes], Awaitable[Any]]


class Publisher:
    def __init__(
        self,
        send: Send,
        topics: Topics,
        metrics: WorkerMetrics,
        quiet: QuietLimiter,
        consumer_name: str,
    ) -> None:
        self.send = send
        self.topics = topics
        self.metrics = metrics
        self.quiet = quiet
        self.consumer_name = consumer_name

    async def publish(
        self,
        run: str,
        batch: list[Signals],
        alerts: list[Alert],
        times_ns: Sequence[int],
        width: int = 1,
    ) -> None:
        """A record's alert transitions, then its signals (breaches, and the quiet ones the
        limiter lets through, built as rows only then), each at the time of its row's record
        (``times_ns``, one per row), so a replay writes the same points. The alerts go first:
        a run-wide spike's breaches on every rank (thousands in a wide run) fill the producer's
        buffer, and the page must not wait behind them. The signal latency is measured from
        the last row's time. ``run``: a by-run key, whose run the outputs name
        (``run_shards``); ``width``: the run's ranks (a wide run's quiet signals are spread:
        ``QuietLimiter``)."""
        name = run_of(run)
        key = name.encode()
        send, topic = self.send, self.topics.signals
        for a in alerts:
            await send(self.topics.alerts, key, alert_bytes(a, run_id=name))
            self.metrics.alerts.labels(a.state, a.severity).inc()
        now = time.monotonic()
        n = 0
        for sigs in batch:
            rows = sigs.row
            for k in self.quiet.picked(run, sigs, now, width):
                body = signal_bytes(name, sigs.view(k), time_ns=times_ns[rows[k]])
                await send(topic, key, body)
                n += 1
        if n:
            self.metrics.signals.inc(n)
        last = max(times_ns, default=0)
        if (n or alerts) and last:
            self.metrics.latency.observe(max(0.0, time.time() - last / 1e9))

    async def advise(self, run: str, given: list[Advised], held: list[Advised]) -> None:
        """Advice to ``run``'s ranks (keyed by run: a rank reads its run's only), and the
        advice held back, counted: by the storm limit (outcome "held"), past the run's remedy
        budget ("held_budget"), a rewind without a checkpoint in range ("held_no_checkpoint"), or
        named past the run's declared last step ("held_run_ends")."""
        for adv in held:
            outcome = "held" if adv.held in (None, "storm") else f"held_{adv.held}"
            self.metrics.advice.labels(adv.action, outcome).inc()
        name = run_of(run)
        for adv in given:
            try:
                body = advice_bytes(name, adv)
            except ValueError as exc:
                log.warning("advice not sent (run %s): %s", name, exc)
                self.metrics.advice.labels(adv.action, "invalid").inc()
                continue
            await self.send(self.topics.advice, name.encode(), body)
            self.metrics.advice.labels(adv.action, "sent").inc()

    async def dead(  # noqa: PLR0917
        self,
        reason: str,
        payload: bytes | None,
        run: str | None,
        key: Any,
        partition: int,
        offset: int,
    ) -> None:
        """A record that cannot be scored, with the reason, to the dead-letter topic."""
        body = self.dead_letter(reason, payload, run and run_of(run), partition, offset)
        await self.send(self.topics.dead_letters, key if isinstance(key, bytes) else None, body)

    def dead_letter(
        self, reason: str, payload: bytes | None, run: str | None, partition: int, offset: int
    ) -> bytes:
        """The dead letter of a raw record (counted): what ``dead`` sends, and the route
        stage's producer (``router``)."""
        self.metrics.dead_letters.labels(reason_class(reason)).inc()
        return dead_letter_bytes(
            reason,
            payload,
            source_topic=self.topics.raw,
            partition=partition,
            offset=offset,
            consumer=self.consumer_name,
            run_id=run,
        )
