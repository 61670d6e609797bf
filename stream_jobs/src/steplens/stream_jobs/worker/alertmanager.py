"""Incidents into Alertmanager (``POST /api/v2/alerts``); never blocks the worker.

An incident transition becomes an Alertmanager alert with the labels ``alertname`` and
``rule`` (both the rule of its lead member when it opened: an incident keeps its name),
``run_id``, ``severity``, ``fingerprint`` (the incident's id) and ``topic``, and the
annotations ``summary``, ``hint``, ``lead_rule`` (the lead member's rule now), ``members``,
``started_step`` and ``step``; its
``startsAt`` is the time of the record it fired on. Alertmanager identifies an alert by its
labels and keeps a firing one until its ``endsAt``:

* a firing incident is posted with ``endsAt`` ``hold_s`` ahead (4 resends) and posted again
  every ``resend_s`` while it fires, as Prometheus does; so if this worker stops, Alertmanager
  resolves it ``hold_s`` later by itself (a worker that takes the run over re-posts it at its
  next transition, not before: the open incidents are in this process's memory);
* a resolved incident is posted with ``endsAt`` = the time of the record it resolved on;
* an incident that escalates changes its ``severity`` label, so the alert of its previous
  labels is resolved in the same post (else it would linger until its ``endsAt``); a better
  hint (a new lead member) only updates the annotations.

A transition already posted (the same fingerprint, state, severity and lead rule: an incident
scored again after a rebalance) is not posted again (the last ``remember`` are remembered); a repeat
is harmless anyway, since Alertmanager merges alerts of the same labels. Posts wait in a bounded
queue (the oldest dropped when full, counted) and go in batches from a background task, with a
timeout and retries with exponential backoff; a refusal (4xx) is logged and not retried. A batch
holds each alert (label set) once, in its latest state: Alertmanager 0.35 takes in the alerts of
one request on parallel workers, and an alert posted firing and ended in one request was seen to
stay firing in its group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import aiohttp

from steplens.schema.log_limit import LimitedLog
from steplens.stream_jobs.engine.core import Alert
from steplens.stream_jobs.worker.notify_queue import first_time, put_dropping_oldest

log = logging.getLogger("steplens.stream_jobs.worker.alertmanager")

MAX_BATCH = 100  # alerts in one POST
MAX_ANNOTATION = 2000  # characters of one annotation


def rfc3339(t_s: float) -> str:
    return datetime.fromtimestamp(t_s, timezone.utc).isoformat(timespec="milliseconds")


def labels_of(alert: Alert) -> dict[str, str]:
    topic = alert.evidence.get("topic") if isinstance(alert.evidence, dict) else None
    labels = {
        "alertname": alert.rule,
        "rule": alert.rule,
        "run_id": alert.run_id,
        "severity": alert.severity,
        "fingerprint": alert.fingerprint,
    }
    if topic:
        labels["topic"] = str(topic)
    return labels


def annotations_of(alert: Alert) -> dict[str, str]:
    members = alert.evidence.get("members") if isinstance(alert.evidence, dict) else None
    rules = [f"{m.get('rule')} ({m.get('scope')})" for m in members or [] if isinstance(m, dict)]
    out = {
        "summary": alert.summary,
        "hint": alert.hint,
        "lead_rule": alert.rule,
        "members": ", ".join(rules),
        "started_step": "" if alert.started_step is None else str(alert.started_step),
        "step": "" if alert.step is None else str(alert.step),
    }
    return {k: v[:MAX_ANNOTATION] for k, v in out.items() if v}


@dataclass
class Posted:
    """An alert as Alertmanager has it: ``ends_s`` None = firing (``hold_s`` from the post)."""

    labels: dict[str, str]
    annotations: dict[str, str]
    starts_s: float
    ends_s: float | None = None

    def body(self, now_s: float, hold_s: float) -> dict[str, Any]:
        ends = self.ends_s if self.ends_s is not None else now_s + hold_s
        return {
            "labels": self.labels,
            "annotations": self.annotations,
            "startsAt": rfc3339(self.starts_s),
            "endsAt": rfc3339(max(ends, self.starts_s)),
        }


class AlertmanagerSender:
    def __init__(  # noqa: PLR0917
        self,
        url: str,
        timeout_s: float = 5.0,
        retries: int = 5,
        max_queue: int = 1000,
        remember: int = 10_000,
        resend_s: float = 60.0,
        max_open: int = 10_000,
        metrics: Any = None,
    ) -> None:
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.timeout_s = timeout_s
        self._log = LimitedLog(log)  # an outage gives up on every batch: said once a minute
        self.retries = retries
        self.resend_s = resend_s
        self.hold_s = 4 * resend_s
        self.queue: asyncio.Queue[Posted] = asyncio.Queue(max_queue)
        self.remember = remember
        self.max_open = max_open
        self.metrics = metrics  # WorkerMetrics (its ``alertmanager`` counter), or None
        self.seen: OrderedDict[tuple[str, str, str, str], None] = OrderedDict()
        self.open: OrderedDict[str, Posted] = OrderedDict()  # firing incidents by fingerprint
        self.counts = dict.fromkeys(
            ("sent", "failed", "dropped", "repeated", "evicted", "superseded"), 0
        )
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ the worker's side
    def notify(self, alert: Alert) -> None:
        """Queue the posts of one incident transition (never waits)."""
        key = (alert.fingerprint, alert.state, alert.severity, alert.rule)
        if not first_time(self.seen, key, self.remember):
            self._count("repeated")
            return
        at = alert.time_ns / 1e9 if alert.time_ns else time.time()
        now = Posted(labels_of(alert), annotations_of(alert), at)
        before = self.open.pop(alert.fingerprint, None)
        if before is not None:
            now.starts_s = before.starts_s
            now.labels["alertname"] = now.labels["rule"] = before.labels["rule"]
            if before.labels != now.labels:  # escalated: end the alert of the old labels
                self._put(Posted(before.labels, before.annotations, before.starts_s, at))
        if alert.state == "resolved":
            now.ends_s = at
        else:
            self.open[alert.fingerprint] = now
            if len(self.open) > self.max_open:
                self.open.popitem(last=False)  # Alertmanager ends it after hold_s
                self._count("evicted")
        self._put(now)

    def _put(self, posted: Posted) -> None:
        if put_dropping_oldest(self.queue, posted):
            self._count("dropped")

    def _count(self, outcome: str, n: int = 1) -> None:
        self.counts[outcome] += n
        if self.metrics is not None:
            self.metrics.alertmanager.labels(outcome).inc(n)

    # ------------------------------------------------------------------ background
    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run()), asyncio.create_task(self._resend())]

    async def stop(self, deadline_s: float = 5.0) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.queue.join(), deadline_s)
        for task in self._tasks:
            task.cancel()

    async def _resend(self) -> None:
        """Firing incidents again, before Alertmanager's ``endsAt`` for them passes."""
        while True:
            await asyncio.sleep(self.resend_s)
            for posted in list(self.open.values()):
                await self.queue.put(posted)  # a wait here, not a transition dropped

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                batch = [await self.queue.get()]
                while len(batch) < MAX_BATCH and not self.queue.empty():
                    batch.append(self.queue.get_nowait())
                try:
                    await self._post(session, self._latest(batch))
                finally:
                    for _ in batch:
                        self.queue.task_done()

    def _latest(self, batch: list[Posted]) -> list[Posted]:
        """One post per alert (label set), its latest state: Alertmanager may take in the
        alerts of one request in any order, so a firing alert and its end in one request
        could leave it firing."""
        latest = {tuple(sorted(p.labels.items())): p for p in batch}
        if len(latest) < len(batch):
            self._count("superseded", len(batch) - len(latest))
        return list(latest.values())

    async def _post(self, session: aiohttp.ClientSession, batch: list[Posted]) -> None:
        for attempt in range(self.retries):
            body = [p.body(time.time(), self.hold_s) for p in batch]
            try:
                async with session.post(self.url, json=body) as resp:
                    if resp.status < 300:
                        self._count("sent", len(batch))
                        return
                    detail = (await resp.text())[:300]
                    if resp.status < 500 and resp.status != 429:
                        self._log.warning(
                            "refused", "alertmanager refused %d alerts: %s", len(batch), detail
                        )
                        break
                    log.debug("alertmanager answered %d: %s", resp.status, detail)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                log.debug("alertmanager attempt %d failed: %s", attempt + 1, exc)
            await asyncio.sleep(min(30.0, 0.5 * 2**attempt))
        self._count("failed", len(batch))
        self._log.warning(
            "give up", "alertmanager: giving up on %d alerts (%s)", len(batch), self.url
        )
