"""The webhook output: each alert transition posted once, in order; a failure the receiver
may recover from makes the batch retryable, a refusal dead-letters the record."""

from __future__ import annotations

from typing import Any

import pytest
from notify_helpers import HookServer, alert_record, member

from steplens.schema import Record, make_record
from steplens.sinks.notify import alert_of
from steplens.sinks.webhook import WebhookOutput, idempotency_key, identity, payload


def alert(i: int, **kw: Any) -> Record:
    args: dict[str, Any] = {
        "fingerprint": f"fp{i}",
        "rule": "spike:loss",
        "severity": "critical",
        "state": "firing",
        "step": i,
        "members": [member("spike:loss", "critical", i, i, True)],
        "started": i,
        **kw,
    }
    return alert_record("run-1", **args)


@pytest.fixture
def hook():
    server = HookServer()
    yield server
    server.close()


def test_alerts_are_posted_and_a_server_error_makes_the_batch_retryable(hook) -> None:
    hook.statuses = [200, 503]
    out = WebhookOutput(f"{hook.url}/hook", timeout_s=5)
    batch = [alert(1), alert(2)]
    first = out.export(batch)
    assert first.retryable and "503" in first.error
    again = out.export(batch)  # the loop's next attempt: the first one is not posted twice
    assert not again.retryable and again.accepted == 1 and again.skipped == 1
    posted = [body["fingerprint"] for body in hook.bodies()]
    assert posted == ["fp1", "fp2", "fp2"]
    path, headers, body = hook.posts[0]
    assert path == "/hook" and headers["Idempotency-Key"] == body["idempotency_key"]
    assert body["rule"] == "spike:loss" and "critical" in body["text"]
    assert body["run_id"] == "run-1" and body["started_step"] == 1
    assert out.counts == {"sent": 2, "refused": 0, "repeated": 1}


def test_a_refused_post_is_rejected_with_the_answer_and_the_rest_go_on(hook) -> None:
    hook.statuses = [400]
    result = WebhookOutput(hook.url).export([alert(1), alert(2)])
    assert [(r.index, r.reason[:8]) for r in result.rejected] == [(0, "HTTP 400")]
    assert result.accepted == 1 and not result.retryable


def test_an_unreachable_webhook_is_retryable_without_raising() -> None:
    result = WebhookOutput("http://127.0.0.1:9/hook", timeout_s=1).export([alert(1)])
    assert result.retryable and result.accepted == 0


def test_other_kinds_are_skipped(hook) -> None:
    step = make_record("step", {"loss": 1.0}, run_id="run-1", step=3)
    result = WebhookOutput(hook.url).export([step, alert(1)])
    assert (result.accepted, result.skipped) == (1, 1) and len(hook.posts) == 1


def test_an_alert_sent_again_is_posted_once_and_a_new_episode_is_posted(hook) -> None:
    """An alert scored again after a worker restart (the same fingerprint, state and start)
    pages once; the same alert firing again after it resolved is a new episode and pages; the
    memory of what was posted is bounded."""
    out = WebhookOutput(hook.url, remember=3)
    first = alert(1)
    again = alert(40, fingerprint="fp1", started=40)  # fires again, a new episode
    batch = [first, first, alert(20, fingerprint="fp1", started=1, state="resolved"), again]
    out.export(batch)
    out.export([alert(i) for i in range(2, 6)])
    out.export([first])  # forgotten: past ``remember``
    posted = [(b["fingerprint"], b["state"], b["started_step"]) for b in hook.bodies()]
    assert posted[:3] == [("fp1", "firing", 1), ("fp1", "resolved", 1), ("fp1", "firing", 40)]
    assert out.counts["repeated"] == 1 and len(out.seen) == 3 and len(posted) == 8


def test_an_escalation_pages_and_every_post_names_its_transition(hook) -> None:
    """An incident that escalates (the same fingerprint and episode, a higher severity) pages
    again; a repeat carries the same idempotency key, so a receiver can drop it after a
    restart of the output that forgot what it posted."""
    warn, crit = alert(1, severity="warning"), alert(1)
    WebhookOutput(hook.url).export([warn, crit])
    assert [b["severity"] for b in hook.bodies()] == ["warning", "critical"]
    assert payload(alert_of(crit))["idempotency_key"] == idempotency_key(alert_of(alert(1)))
    assert identity(alert_of(warn)) != identity(alert_of(crit))
    reopened = alert(1, episode=1)  # the incident opened again
    assert idempotency_key(alert_of(reopened)) != idempotency_key(alert_of(crit))
