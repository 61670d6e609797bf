"""The worker publishes its incidents to the alert topic and `steplens sink alertmanager`
posts them: a loss spike in the raw topic becomes an active alert in a real Alertmanager, and
no longer active once the incident resolves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_stream_worker import sample, steps

from steplens.stack.demo_children import free_port


def _active(url: str, run: str) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"filter": f'run_id="{run}"'})
    with urllib.request.urlopen(f"{url}/api/v2/alerts?{query}", timeout=10) as resp:
        return json.loads(resp.read())


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


@pytest.mark.stack
@pytest.mark.slow
def test_the_worker_s_incidents_reach_alertmanager(kafka, workers, tmp_path: Path, monkeypatch):
    from steplens.stack import Stack

    monkeypatch.delenv("STEPLENS_ALERTMANAGER_CONFIG", raising=False)
    stack = Stack(home=tmp_path / "stack", ports={"alertmanager": free_port()}, progress=print)
    url = stack.up(["alertmanager"], timeout_s=60)["STEPLENS_ALERTMANAGER_URL"]
    run = f"am-run-{uuid.uuid4().hex[:6]}"
    t = kafka.topics
    port = free_port()
    log = (tmp_path / "sink.log").open("wb")
    sink = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "steplens.schema.command",
            "sink",
            "alertmanager",
            "--url",
            url,
            "--group",
            f"am-{run}",
            "--metrics-port",
            str(port),
        ],
        env={
            **os.environ,
            **kafka.env,
            "STEPLENS_TOPIC_RAW": t.raw,
            "STEPLENS_TOPIC_SIGNALS": t.signals,
            "STEPLENS_TOPIC_ALERTS": t.alerts,
            "STEPLENS_TOPIC_DEADLETTER": t.dead_letters,
            "STEPLENS_TOPIC_ADVICE": t.advice,
        },
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        w = workers("--no-arima", "--fetch-wait-ms", "40").start()
        w.wait_metrics()
        kafka.send(steps(run, 0, 60, spike_at=50))
        deadline = time.monotonic() + 90
        while not (active := _active(url, run)):
            assert time.monotonic() < deadline, w.log.read_text()[-3000:]
            assert sink.poll() is None, (tmp_path / "sink.log").read_text()
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
        page = _metrics(port)
        sent = sample(
            page, "steplens_sink_notifications_total", sink="alertmanager", outcome="sent"
        )
        assert sent >= 2
    finally:
        if sink.poll() is None:
            os.killpg(sink.pid, signal.SIGTERM)
            sink.wait(30)
        log.close()
        stack.down(deadline_s=15)
