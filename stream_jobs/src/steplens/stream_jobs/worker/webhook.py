"""Optional webhook notifier: POSTs each alert transition as JSON; never blocks the worker.

Alerts wait in a bounded queue (the oldest is dropped when full); a background task posts them
with a timeout and a few retries with backoff. A transition already posted (the same
fingerprint, state, episode and severity: an incident scored again after a rebalance) is not
posted again; the last ``remember`` transitions are remembered. A worker that restarts after a
crash remembers none of them, and scores again what it had not checkpointed: every post carries
an ``idempotency_key`` (in the body and the ``Idempotency-Key`` header), the same for the same
transition, by which a receiver drops a repeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from dataclasses import asdict
from typing import Any

import aiohttp

from steplens.schema.log_limit import LimitedLog
from steplens.stream_jobs.engine.core import Alert
from steplens.stream_jobs.worker.notify_queue import first_time, put_dropping_oldest

log = logging.getLogger("steplens.stream_jobs.worker.webhook")


def identity(alert: Alert) -> tuple[str, str, int | None, str, int]:
    """What makes a transition the same one: fingerprint, state, episode (its start, and how
    often an incident opened again) and severity (an escalation is a transition of its own)."""
    again = alert.evidence.get("episode", 0) if isinstance(alert.evidence, dict) else 0
    return (alert.fingerprint, alert.state, alert.started_step, alert.severity, again)


def idempotency_key(alert: Alert) -> str:
    return ":".join(str(part) for part in identity(alert))


def payload(alert: Alert) -> dict[str, Any]:
    body = asdict(alert)
    body["text"] = f"[{alert.severity}] {alert.state}: {alert.summary} - {alert.hint}"
    body["idempotency_key"] = idempotency_key(alert)
    return body


class WebhookNotifier:
    def __init__(
        self,
        url: str,
        timeout_s: float = 5.0,
        retries: int = 3,
        max_queue: int = 1000,
        remember: int = 10_000,
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.retries = retries
        self._log = LimitedLog(log)  # an outage gives up on every alert: said once a minute
        self.queue: asyncio.Queue[Alert] = asyncio.Queue(max_queue)
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self.repeated = 0
        self.remember = remember
        self.seen: OrderedDict[tuple[str, str, int | None, str, int], None] = OrderedDict()
        self._task: asyncio.Task[None] | None = None

    def notify(self, alert: Alert) -> None:
        if not first_time(self.seen, identity(alert), self.remember):
            self.repeated += 1
            return
        self.dropped += put_dropping_oldest(self.queue, alert)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self, deadline_s: float = 5.0) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.queue.join(), deadline_s)
        if self._task:
            self._task.cancel()

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                alert = await self.queue.get()
                try:
                    await self._post(session, alert)
                finally:
                    self.queue.task_done()

    async def _post(self, session: aiohttp.ClientSession, alert: Alert) -> None:
        for attempt in range(self.retries):
            try:
                headers = {"Idempotency-Key": idempotency_key(alert)}
                async with session.post(self.url, json=payload(alert), headers=headers) as resp:
                    if resp.status < 300:
                        self.sent += 1
                        return
                    if resp.status < 500 and resp.status != 429:
                        break
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                log.debug("webhook attempt %d failed: %s", attempt + 1, exc)
            await asyncio.sleep(0.2 * 2**attempt)
        self.failed += 1
        self._log.warning(
            "give up", "webhook: giving up on alert %s (%s)", alert.fingerprint, alert.rule
        )
