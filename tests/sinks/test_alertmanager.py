"""The Alertmanager output: what is posted for each transition (pure), delivery (a local HTTP
server: a server error retried by the loop, a refusal dead-lettered, resends), and the round
trip through a real Alertmanager of the local stack: an incident fires, escalates and
resolves; the API shows it active, then gone, and Alertmanager's own webhook notifications
carry the firing and the resolved alert with its ``endsAt``."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from notify_helpers import HookServer, alert_record, incident_story, member
from sinks_helpers import wait_for

from steplens.schema import make_record
from steplens.sinks.alertmanager import MAX_BATCH, AlertmanagerOutput
from steplens.sinks.notify import Answer


class Recorder:
    """A ``post`` that keeps each request's alerts and answers with ``answers`` in turn."""

    def __init__(self, *answers: Answer) -> None:
        self.requests: list[list[dict[str, Any]]] = []
        self.answers = list(answers)

    def __call__(self, url: str, body: Any, headers: dict[str, str]) -> Answer:
        assert url.endswith("/api/v2/alerts")
        self.requests.append(body)
        return self.answers.pop(0) if self.answers else Answer(True)

    def last(self) -> list[dict[str, Any]]:
        return self.requests[-1]


def output(post: Recorder, **kw: Any) -> AlertmanagerOutput:
    return AlertmanagerOutput("http://127.0.0.1:1/", post=post, resend_s=60, **kw)


def test_transitions_become_alerts_labelled_for_routing() -> None:
    opened, escalated, resolved = incident_story("run-a")
    post = Recorder()
    out = output(post)
    out.export([opened])
    (first,) = post.last()
    assert first["labels"] == {
        "alertname": "spike:loss",
        "rule": "spike:loss",
        "run_id": "run-a",
        "severity": "warning",
        "fingerprint": "run-a-incident",
        "topic": "training",
    }
    notes = first["annotations"]
    assert notes["hint"] == "hint of spike:loss" and notes["lead_rule"] == "spike:loss"
    assert notes["started_step"] == "100" and "spike:loss" in notes["members"]
    assert first["startsAt"] == "2023-11-14T22:15:00.000+00:00"  # the record's time
    assert datetime.fromisoformat(first["endsAt"]).timestamp() > time.time() + 200  # held

    out.export([escalated])  # severity changes a label: the warning alert ends in this post
    ended, now = post.last()
    assert ended["labels"] == first["labels"]
    assert ended["endsAt"] == "2023-11-14T22:15:01.000+00:00"
    assert now["labels"]["severity"] == "critical"
    assert now["labels"]["alertname"] == now["labels"]["rule"] == "spike:loss"  # its name
    assert now["annotations"]["lead_rule"] == "spike:grad_norm"  # ... its lead rule now
    assert now["startsAt"] == first["startsAt"]  # it started when it opened

    again = out.export([escalated])  # the same transition again (a worker restart)
    assert len(post.requests) == 2 and again.skipped == 1 and out.counts["repeated"] == 1
    out.export([resolved])
    (last,) = post.last()
    assert last["labels"] == now["labels"] and last["endsAt"] == "2023-11-14T22:15:12.000+00:00"
    assert out.open == {}
    out.shutdown()


def _advised(rec: Any, *answers: dict[str, Any]) -> Any:
    """``rec`` with a rewind advised for its incident and ``answers`` (grouped), as the worker
    reports it."""
    rewind = {"action": "rewind", "rank": -1, "step": 100, "checkpoint": "/ck/90"}
    rewind |= {"checkpoint_step": 90, "skip_batches": 210, "answers": list(answers)}
    evidence = {**rec.data["evidence"], "remedies": [rewind]}
    return make_record(
        "alert",
        {**rec.data, "evidence": evidence},
        run_id=rec.run_id,
        rank=rec.rank,
        step=rec.step,
        time_ns=rec.time_ns + 1,
    )


def test_the_advice_and_its_answers_are_annotated_and_posted_again() -> None:
    opened, _, _ = incident_story("run-adv")
    post = Recorder()
    out = output(post)
    out.export([_advised(opened)])
    (first,) = post.last()
    advice = "rewind to /ck/90 (step 90), skip 210 batches, to every rank at step 100"
    assert first["annotations"]["advice"] == f"{advice} -> no answer yet"
    acted = {"outcome": "acted", "n": 2, "ranks": [0, 1], "details": ["reloaded /ck/90"]}
    out.export([_advised(opened, acted)])  # the same labels and state, an answer: news
    (now,) = post.last()
    assert now["labels"] == first["labels"] and now["startsAt"] == first["startsAt"]
    assert now["annotations"]["advice"].endswith("-> acted: ranks 0, 1 (reloaded /ck/90)")
    resent = out.open[opened.data["fingerprint"]].annotations  # what the resends carry
    assert resent["advice"] == now["annotations"]["advice"]
    again = out.export([_advised(opened, acted)])
    assert len(post.requests) == 2 and again.skipped == 1
    out.shutdown()


def test_a_batch_posts_each_alert_once_in_its_latest_state() -> None:
    post = Recorder()
    out = output(post)
    result = out.export(incident_story("run-b"))
    (request,) = post.requests
    states = sorted((a["labels"]["severity"], a["endsAt"]) for a in request)
    assert states == [
        ("critical", "2023-11-14T22:15:12.000+00:00"),  # posted resolved only
        ("warning", "2023-11-14T22:15:01.000+00:00"),  # ended when it escalated
    ]
    assert out.counts["superseded"] == 2 and result.accepted == 3
    out.shutdown()


def test_a_batch_exported_again_posts_the_same_alerts() -> None:
    """Nothing is remembered of a batch that was not delivered: its escalation ends the
    warning alert again when the loop exports it again."""
    opened, escalated, _ = incident_story("run-c")
    post = Recorder(Answer(True), Answer(False, retry=True, reason="HTTP 503"))
    out = output(post)
    out.export([opened])
    assert out.export([escalated]).retryable
    assert not out.export([escalated]).retryable
    retried, again = ([(a["labels"], a["startsAt"]) for a in r] for r in post.requests[1:])
    assert retried == again
    assert [a["labels"]["severity"] for a in post.last()] == ["warning", "critical"]
    out.shutdown()


def test_memory_open_incidents_and_requests_are_bounded() -> None:
    post = Recorder()
    out = output(post, remember=5, max_open=2)
    batch = [
        alert_record(
            f"run-{i}",
            f"fp{i}",
            "spike:loss",
            "warning",
            "firing",
            1,
            [member("spike:loss", "warning", 1, 1, True)],
        )
        for i in range(MAX_BATCH * 2 + 50)
    ]
    assert out.export(batch).accepted == len(batch)
    assert [len(r) for r in post.requests] == [MAX_BATCH, MAX_BATCH, 50]
    assert len(out.seen) == 5 and list(out.open) == [f"fp{len(batch) - 2}", f"fp{len(batch) - 1}"]
    assert out.counts["evicted"] == len(batch) - 2
    out.shutdown()


def test_a_server_error_is_retryable_and_a_refusal_dead_letters_its_records() -> None:
    hook = HookServer([503, 200, 400])
    out = AlertmanagerOutput(f"{hook.url}/", timeout_s=5)
    try:
        batch = [
            alert_record(
                "run-d",
                f"fp{i}",
                f"spike:m{i}",
                "warning",
                "firing",
                i,
                [member(f"spike:m{i}", "warning", i, i, True)],
            )
            for i in range(3)
        ]
        assert out.export(batch).retryable
        assert out.export(batch).accepted == 3
        refused = out.export([alert_record("run-d", "fp9", "spike:m9", "warning", "firing", 9, [])])
    finally:
        out.shutdown()
        hook.close()
    assert [len(b) for b in hook.bodies()] == [3, 3, 1]
    assert [(r.index, r.reason.split(":")[0]) for r in refused.rejected] == [
        (0, "refused by Alertmanager")
    ]
    assert "HTTP 400" in refused.rejected[0].reason
    assert out.counts["sent"] == 3 and out.counts["refused"] == 1


def test_firing_incidents_are_posted_again_until_they_resolve() -> None:
    hook = HookServer()
    out = AlertmanagerOutput(hook.url, resend_s=0.2)
    opened, escalated, resolved = incident_story("run-e")
    try:
        out.export([opened, escalated])
        wait_for(lambda: out.counts["resent"] >= 2, 10, "two resends")
        out.export([resolved])
        resent = out.counts["resent"]
        time.sleep(0.5)  # resend periods with nothing firing: no post
        assert out.counts["resent"] == resent
    finally:
        out.shutdown()
        hook.close()
    posts = [a for body in hook.bodies() for a in body]
    critical = [a for a in posts if a["labels"]["severity"] == "critical"]
    assert len(critical) >= 4  # posted, posted again at least twice, resolved
    assert critical[-1]["endsAt"] == "2023-11-14T22:15:12.000+00:00"
    warning = [a["endsAt"] for a in posts if a["labels"]["severity"] == "warning"]
    # opened and escalated in one batch: the warning alert is posted once, in its latest state
    assert warning == ["2023-11-14T22:15:01.000+00:00"]


# --------------------------------------------------------------------------- the real one

RECEIVER = """\
route:
  receiver: test
  group_by: [run_id, alertname]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: test
    webhook_configs:
      - url: http://127.0.0.1:{port}/notify
        send_resolved: true
"""


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def active(url: str, run: str) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"filter": f'run_id="{run}"'})
    return _get(f"{url}/api/v2/alerts?{query}")


def _time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.mark.stack
@pytest.mark.slow
def test_round_trip_through_a_real_alertmanager(tmp_path: Path, monkeypatch) -> None:
    """Built once into the cache by the stack (minutes the first time), then started in a
    private stack whose configuration routes to this test's webhook."""
    from steplens.stack import Stack
    from steplens.stack.process import free_ports

    hook = HookServer()
    config = tmp_path / "alertmanager.yml"
    config.write_text(RECEIVER.format(port=hook.port))
    monkeypatch.setenv("STEPLENS_ALERTMANAGER_CONFIG", str(config))
    (port,) = free_ports(1)
    stack = Stack(home=tmp_path / "stack", ports={"alertmanager": port}, progress=print)
    url = stack.up(["alertmanager"], timeout_s=60)["STEPLENS_ALERTMANAGER_URL"]
    run = f"am-{uuid.uuid4().hex[:8]}"
    # the story two minutes ago (Alertmanager notifies about alerts of the present)
    opened, escalated, resolved = incident_story(run, t0=time.time() - 120 - 112)
    out = AlertmanagerOutput(url, timeout_s=5)
    try:
        assert out.export([opened, escalated]).accepted == 2
        (alert,) = active(url, run)  # the warning one ended when it escalated
        assert (alert["labels"]["severity"], alert["status"]["state"]) == ("critical", "active")
        assert alert["labels"]["alertname"] == alert["labels"]["rule"] == "spike:loss"
        assert alert["labels"]["fingerprint"] == opened.data["fingerprint"]
        assert alert["annotations"]["lead_rule"] == "spike:grad_norm"
        assert _time(alert["startsAt"]) == pytest.approx(opened.time_ns / 1e9, abs=1e-3)
        assert _time(alert["endsAt"]) > time.time() + 60  # held while it fires
        firing = lambda: any(b["status"] == "firing" for b in hook.bodies())  # noqa: E731
        wait_for(firing, 20, "the firing notification")
        acted = {"outcome": "acted", "n": 1, "ranks": [0], "details": ["reloaded /ck/90"]}
        assert out.export([_advised(escalated, acted)]).accepted == 1  # an answer: news
        (alert,) = active(url, run)
        assert alert["annotations"]["advice"].endswith("-> acted: rank 0 (reloaded /ck/90)")
        assert out.export([resolved]).accepted == 1
        assert active(url, run) == []  # resolved: no longer active
        resolved_note = lambda: any(b["status"] == "resolved" for b in hook.bodies())  # noqa: E731
        wait_for(resolved_note, 60, "the resolved notification")
    finally:
        out.shutdown()
        stack.down(deadline_s=15)
        hook.close()
    assert out.counts["sent"] >= 3 and out.counts["refused"] == 0
    assert out.counts["superseded"] == 1  # the warning's firing post, ended in the batch
    notified = [a for body in hook.bodies() for a in body["alerts"]]
    assert any(a["status"] == "firing" and a["labels"]["severity"] == "critical" for a in notified)
    ends = [_time(a["endsAt"]) for a in notified
            if a["status"] == "resolved" and a["labels"]["severity"] == "critical"]  # fmt: skip
    assert ends and ends[-1] == pytest.approx(resolved.time_ns / 1e9, abs=1e-3)
    assert [a for a in notified if a["status"] == "resolved"][-1]["annotations"]["hint"]
