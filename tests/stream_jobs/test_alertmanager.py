"""Incidents into Alertmanager: what is posted for each transition (pure), delivery with retries
(a local HTTP server), and the round trip through a real Alertmanager of the local stack: an
incident fires, escalates and resolves; the API shows it active, then gone, and Alertmanager's
own webhook notifications carry the firing and the resolved alert with its ``endsAt``."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import time
import urllib.parse
import urllib.request
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from steplens.stream_jobs.engine import incidents
from steplens.stream_jobs.engine.core import Alert
from steplens.stream_jobs.worker.alertmanager import AlertmanagerSender, Posted

T0 = 1_700_000_000.0


def rule_alert(run: str, rule: str, severity: str, state: str, step: int, started: int) -> Alert:
    return Alert(
        rule,
        severity,
        state,
        "run",
        f"hint of {rule}",
        f"{run}-{rule}",
        run,
        step,
        started,
        f"{rule} at step {step}",
        {"metric": rule.rsplit(":", maxsplit=1)[-1], "value": 9.0},
        int((T0 + step) * 1e9),
    )


def incident_story(run: str) -> list[Alert]:
    """The incidents the real incident module reports: a loss spike opens one (warning), a
    gradient spike joins it (critical: it escalates), both resolve."""
    state, cfg = incidents.IncidentsState(), incidents.IncidentsConfig()
    out = []
    for step, alerts in (
        (100, [rule_alert(run, "spike:loss", "warning", "firing", 100, 100)]),
        (101, [rule_alert(run, "spike:grad_norm", "critical", "firing", 101, 101)]),
        (110, [rule_alert(run, "spike:loss", "warning", "resolved", 110, 100)]),
        (112, [rule_alert(run, "spike:grad_norm", "critical", "resolved", 112, 101)]),
    ):
        out += incidents.update(state, cfg, alerts, int((T0 + step) * 1e9))
    assert [(a.state, a.severity) for a in out] == [
        ("firing", "warning"),
        ("firing", "critical"),
        ("resolved", "critical"),
    ]
    return out


def queued(sender: AlertmanagerSender) -> list[Posted]:
    out = []
    while not sender.queue.empty():
        out.append(sender.queue.get_nowait())
        sender.queue.task_done()
    return out


def test_transitions_become_alerts_labelled_for_routing() -> None:
    opened, escalated, resolved = incident_story("run-a")
    sender = AlertmanagerSender("http://127.0.0.1:1", resend_s=60)
    sender.notify(opened)
    (first,) = queued(sender)
    assert first.labels == {
        "alertname": "spike:loss",
        "rule": "spike:loss",
        "run_id": "run-a",
        "severity": "warning",
        "fingerprint": opened.fingerprint,
        "topic": "training",
    }
    assert first.annotations["hint"] == opened.hint
    assert first.annotations["lead_rule"] == "spike:loss"
    assert (
        first.annotations["started_step"] == "100" and "spike:loss" in first.annotations["members"]
    )
    body = first.body(now_s=T0 + 500, hold_s=240)
    assert body["startsAt"] == "2023-11-14T22:15:00.000+00:00"  # the record's time
    assert body["endsAt"] == "2023-11-14T22:25:40.000+00:00"  # firing: held 240 s past now

    sender.notify(escalated)  # severity changes a label: the warning alert ends now
    ended, now = queued(sender)
    assert ended.labels == first.labels and ended.ends_s == T0 + 101
    assert now.labels["severity"] == "critical" and now.ends_s is None
    assert now.labels["alertname"] == now.labels["rule"] == "spike:loss"  # it keeps its name
    assert now.annotations["lead_rule"] == escalated.rule  # ... its lead rule is an annotation
    assert now.starts_s == T0 + 100  # and it started when it opened

    sender.notify(escalated)  # the same transition again (scored again after a rebalance)
    assert queued(sender) == [] and sender.counts["repeated"] == 1
    sender.notify(resolved)
    (last,) = queued(sender)
    assert last.labels == now.labels and last.ends_s == T0 + 112
    assert last.body(T0 + 500, 240)["endsAt"] == "2023-11-14T22:15:12.000+00:00"
    assert sender.open == {}


def test_memory_and_queue_are_bounded() -> None:
    sender = AlertmanagerSender("http://127.0.0.1:1", max_queue=3, remember=5, max_open=2)
    for i in range(10):
        sender.notify(rule_alert(f"run-{i}", "spike:loss", "warning", "firing", 1, 1))
    assert sender.queue.qsize() == 3 and sender.counts["dropped"] == 7
    assert len(sender.seen) == 5 and len(sender.open) == 2 and sender.counts["evicted"] == 8
    assert [p.labels["run_id"] for p in queued(sender)] == ["run-7", "run-8", "run-9"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serve(handler: Any, path: str) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


def test_batches_are_posted_a_server_error_retried_and_a_refusal_not() -> None:
    statuses = [503, 200, 400]
    bodies: list[list[dict[str, Any]]] = []

    async def handler(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        return web.Response(status=statuses.pop(0) if statuses else 200)

    async def main() -> AlertmanagerSender:
        runner, port = await _serve(handler, "/api/v2/alerts")
        sender = AlertmanagerSender(f"http://127.0.0.1:{port}/", timeout_s=5, retries=3)
        for i in range(3):  # queued before the sender starts: one batch
            sender.notify(rule_alert("run-b", f"spike:m{i}", "warning", "firing", i, i))
        await sender.start()
        await asyncio.wait_for(sender.queue.join(), 20)
        sender.notify(rule_alert("run-b", "spike:m9", "warning", "firing", 9, 9))  # refused
        await asyncio.wait_for(sender.queue.join(), 20)
        await sender.stop()
        await runner.cleanup()
        return sender

    sender = asyncio.run(main())
    assert [len(b) for b in bodies] == [3, 3, 1]  # the 503 retried, the 400 not
    assert sender.counts["sent"] == 3 and sender.counts["failed"] == 1
    assert {a["labels"]["alertname"] for a in bodies[1]} == {"spike:m0", "spike:m1", "spike:m2"}


def test_firing_incidents_are_posted_again_until_they_resolve() -> None:
    bodies: list[list[dict[str, Any]]] = []

    async def handler(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        return web.Response(status=200)

    def critical_posts() -> int:
        return sum(a["labels"]["severity"] == "critical" for body in bodies for a in body)

    async def main() -> None:
        runner, port = await _serve(handler, "/api/v2/alerts")
        sender = AlertmanagerSender(f"http://127.0.0.1:{port}", resend_s=0.2)
        await sender.start()
        opened, escalated, resolved = incident_story("run-c")
        sender.notify(opened)
        sender.notify(escalated)

        async def reposted() -> None:  # posted, then posted again twice while it fires
            while critical_posts() < 3:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(reposted(), 20)
        sender.notify(resolved)
        assert not sender.open  # nothing left to post again
        await sender.stop()  # once the queue, the resolved post last, is sent
        await runner.cleanup()

    asyncio.run(main())
    posts = [a for body in bodies for a in body]
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


def _active(url: str, run: str) -> list[dict[str, Any]]:
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

    hook_port = _free_port()
    config = tmp_path / "alertmanager.yml"
    config.write_text(RECEIVER.format(port=hook_port))
    monkeypatch.setenv("STEPLENS_ALERTMANAGER_CONFIG", str(config))
    stack = Stack(home=tmp_path / "stack", ports={"alertmanager": _free_port()}, progress=print)
    url = stack.up(["alertmanager"], timeout_s=60)["STEPLENS_ALERTMANAGER_URL"]
    try:
        notifications, ended = asyncio.run(_story(url, hook_port, f"am-{uuid.uuid4().hex[:8]}"))
    finally:
        stack.down(deadline_s=15)
    # Alertmanager's own notifications: the firing one, then the resolved one with its endsAt
    states = [
        (n["status"], a["labels"]["severity"], a["status"])
        for n in notifications
        for a in n["alerts"]
    ]
    assert ("firing", "critical", "firing") in states
    resolved = [
        a
        for n in notifications
        for a in n["alerts"]
        if a["status"] == "resolved" and a["labels"]["severity"] == "critical"
    ]
    assert resolved and _time(resolved[-1]["endsAt"]) == pytest.approx(ended, abs=1e-3)
    assert resolved[-1]["annotations"]["hint"]


async def _story(url: str, hook_port: int, run: str) -> tuple[list[dict[str, Any]], float]:
    """The incident story posted; Alertmanager's notifications and the time it resolved."""
    notified: list[dict[str, Any]] = []

    async def hook(request: web.Request) -> web.Response:
        notified.append(await request.json())
        return web.Response(status=200)

    runner, _ = await _serve_on(hook, "/notify", hook_port)
    sender = AlertmanagerSender(url, timeout_s=5)
    await sender.start()
    opened, escalated, resolved = _shifted(incident_story(run))
    try:
        sender.notify(opened)
        sender.notify(escalated)
        await asyncio.wait_for(sender.queue.join(), 20)
        active = await asyncio.to_thread(_active, url, run)
        assert [(a["labels"]["severity"], a["status"]["state"]) for a in active] == [
            ("critical", "active")
        ]  # the warning one ended when it escalated
        alert = active[0]
        assert alert["labels"]["alertname"] == alert["labels"]["rule"] == "spike:loss"
        assert alert["labels"]["fingerprint"] == opened.fingerprint
        assert alert["annotations"]["lead_rule"] == escalated.rule
        assert _time(alert["startsAt"]) == pytest.approx(opened.time_ns / 1e9, abs=1e-3)
        assert _time(alert["endsAt"]) > time.time() + 60  # held while it fires
        await _until(lambda: any(n["status"] == "firing" for n in notified))
        sender.notify(resolved)
        await asyncio.wait_for(sender.queue.join(), 20)
        assert await asyncio.to_thread(_active, url, run) == []  # resolved: no longer active
        await _until(lambda: any(n["status"] == "resolved" for n in notified), 30, notified)
    finally:
        await sender.stop()
        await runner.cleanup()
    assert sender.counts["failed"] == 0 and sender.counts["sent"] >= 3
    assert sender.counts["superseded"] == 1  # the warning's firing post, ended in the batch
    return notified, resolved.time_ns / 1e9


def _shifted(alerts: list[Alert]) -> list[Alert]:
    """The story two minutes ago (Alertmanager notifies about alerts of the present)."""
    shift = int((time.time() - T0 - 120) * 1e9)
    return [dataclasses.replace(a, time_ns=a.time_ns + shift) for a in alerts]


async def _serve_on(handler: Any, path: str, port: int) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


async def _until(cond: Any, timeout_s: float = 20.0, seen: Any = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out; seen: {seen}"
        await asyncio.sleep(0.1)


@pytest.mark.stack
@pytest.mark.slow
def test_the_worker_posts_its_incidents(kafka, workers, tmp_path: Path, monkeypatch) -> None:
    """`steplens worker --alertmanager-url`: a loss spike in the raw topic becomes an active
    alert in the real Alertmanager, and no longer active once the incident resolves."""
    from test_stream_worker import sample, steps

    from steplens.stack import Stack

    monkeypatch.delenv("STEPLENS_ALERTMANAGER_CONFIG", raising=False)
    stack = Stack(home=tmp_path / "stack", ports={"alertmanager": _free_port()}, progress=print)
    url = stack.up(["alertmanager"], timeout_s=60)["STEPLENS_ALERTMANAGER_URL"]
    run = f"am-run-{uuid.uuid4().hex[:6]}"
    try:
        w = workers("--no-arima", "--fetch-wait-ms", "40", "--alertmanager-url", url).start()
        w.wait_metrics()
        kafka.send(steps(run, 0, 60, spike_at=50))
        deadline = time.monotonic() + 90
        while not (active := _active(url, run)):
            assert time.monotonic() < deadline, w.log.read_text()[-3000:]
            time.sleep(0.2)
        (alert,) = active
        assert alert["labels"]["alertname"] == alert["labels"]["rule"] == "spike:loss"
        assert alert["labels"]["severity"] == "critical" and alert["annotations"]["hint"]
        assert alert["annotations"]["started_step"] == "50"
        # clean steps: the incident resolves once its last member does (the loss volatility,
        # whose 50-step window holds the spike until step 100, then 10 quiet steps)
        kafka.send(steps(run, 60, 130))
        deadline = time.monotonic() + 90
        while _active(url, run):
            assert time.monotonic() < deadline, w.log.read_text()[-3000:]
            time.sleep(0.2)
        sent = sample(w.metrics(), "steplens_worker_alertmanager_alerts_total", outcome="sent")
        assert sent >= 2
    finally:
        stack.down(deadline_s=15)
