"""The webhook output (`steplens sink webhook --url URL`): each alert transition of the alert
topic POSTed as JSON, in order, one request each.

A transition posted already (the same fingerprint, state, episode and severity: an incident
scored again after a worker restart, or a batch exported again after a failed post) is not
posted again; the last ``remember`` transitions are remembered. A restarted output remembers
none of them: every post carries an ``idempotency_key`` (in the body and the
``Idempotency-Key`` header), the same for the same transition, by which a receiver drops a
repeat. A post that may succeed later makes the batch retryable (those before it are
remembered, so they are not posted twice); a refused one is dead-lettered with the answer.
"""

from __future__ import annotations

from typing import Any

from steplens.schema import Record
from steplens.sinks import metrics
from steplens.sinks.contract import ExportResult, Rejection
from steplens.sinks.notify import JsonPoster, Post, Remembered, alert_of


def identity(alert: dict[str, Any]) -> tuple[str, str, int | None, str, int]:
    """What makes a transition the same one: fingerprint, state, episode (its start, and how
    often an incident opened again) and severity (an escalation is a transition of its own)."""
    again = alert["evidence"].get("episode", 0)
    return (alert["fingerprint"], alert["state"], alert["started_step"], alert["severity"], again)


def idempotency_key(alert: dict[str, Any]) -> str:
    return ":".join(str(part) for part in identity(alert))


def payload(alert: dict[str, Any]) -> dict[str, Any]:
    body = dict(alert)
    body["text"] = f"[{alert['severity']}] {alert['state']}: {alert['summary']} - {alert['hint']}"
    body["idempotency_key"] = idempotency_key(alert)
    return body


class WebhookOutput:
    name = "webhook"

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        remember: int = 10_000,
        post: Post | None = None,
    ) -> None:
        self.url = url
        self.post = post or JsonPoster(timeout_s)
        self.seen = Remembered(remember)
        self.counts = dict.fromkeys(("sent", "refused", "repeated"), 0)

    def export(self, batch: list[Record]) -> ExportResult:
        result = ExportResult()
        for i, rec in enumerate(batch):
            if rec.kind != "alert":
                result.skipped += 1
                continue
            try:
                alert = alert_of(rec)
                key = identity(alert)
            except (KeyError, TypeError, AttributeError) as exc:
                result.rejected.append(Rejection(i, f"not an alert transition: {exc!r}"))
                continue
            if key in self.seen:
                self._count("repeated")
                result.skipped += 1
                continue
            answer = self.post(
                self.url, payload(alert), {"Idempotency-Key": idempotency_key(alert)}
            )
            if not answer.ok and answer.retry:
                return ExportResult.retry(answer.reason)
            if answer.ok:  # a refused one is posted again if its batch is exported again
                self.seen.add(key)
                self._count("sent")
                result.accepted += 1
            else:
                self._count("refused")
                result.rejected.append(Rejection(i, answer.reason))
        return result

    def _count(self, outcome: str) -> None:
        self.counts[outcome] += 1
        metrics.NOTIFICATIONS.labels(self.name, outcome).inc()

    def shutdown(self) -> None:
        return None
