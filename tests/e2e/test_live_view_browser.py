"""The live view in a real browser, while the run trains: a training child process logs its
steps through the producer to the stack's Kafka, the mirror (`steplens mlflow`, a child too)
follows them into the stack's MLflow server, and headless Chromium reads the run's page.

Before the trainer stops, the page's DOM must hold the loss curve's metric with its points
and the incident table. ``STEPLENS_LIVE_VIEW_SHOT=docs/live-view.png`` also saves a
screenshot of the run's charts there (how docs/demo.md's picture is made).

Skipped where no Chromium is installed (Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

pytest.importorskip("mlflow")

from steplens.schema import encode, make_record
from waiting import wait_until

BROWSER = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
pytestmark = [
    pytest.mark.stack,
    pytest.mark.skipif(BROWSER is None, reason="no Chromium to render the page"),
]

STEPS = 20_000  # at least 400 s: it trains on while the page is read
# A training loop's telemetry: every step raw (so the loss curve has a point per step), the
# host's memory twice a second, the schedule and model as the run's parameters.
TRAINER = """
import math, sys, time
import steplens.producer as sl
run_id, steps = sys.argv[1], int(sys.argv[2])
sl.init(run_id=run_id, sample_rate=1.0, hw_interval_s=0.5, window_s=2.0,
        lr_schedule={"kind": "cosine", "peak_lr": 3e-4, "warmup_steps": 100,
                     "total_steps": steps},
        model_info={"name": "tiny-lm", "seq_len": 256})
for step in range(steps):
    lr = 3e-4 * 0.5 * (1 + math.cos(math.pi * step / steps))
    loss = 4.0 * math.exp(-step / 800) + 1.5 + 0.05 * math.sin(step / 7)
    sl.log_step(step, loss=loss, lr=lr, grad_norm=1.0 + 0.2 * math.sin(step / 13),
                tokens=4096)
    time.sleep(0.02)
sl.shutdown()
"""


def _scratch_env(stack_env: dict[str, str], tag: str) -> dict[str, str]:
    from steplens.schema.settings import kafka_bootstrap
    from steplens.schema.topics import Topics, ensure_topics

    topics = Topics.prefixed(f"live-{tag}")
    bootstrap = kafka_bootstrap(stack_env.get("STEPLENS_KAFKA_BOOTSTRAP"))
    ensure_topics(bootstrap, topics)
    return {
        **os.environ,
        **stack_env,
        "STEPLENS_KAFKA_BOOTSTRAP": bootstrap,
        **topics.env(),
        "OMP_NUM_THREADS": "1",
    }


def _alert(run_id: str, step: int) -> bytes:
    """What the stream jobs' worker publishes when a loss spike opens an incident."""
    rec = make_record(
        "alert",
        {
            "rule": "spike:loss",
            "severity": "critical",
            "state": "firing",
            "scope": "run",
            "hint": "loss spike: inspect the batch at the onset",
            "fingerprint": "live01",
            "started_step": step,
        },
        run_id=run_id,
        rank=-1,
        step=step,
        time_ns=time.time_ns(),
    )
    return encode(rec)


def _api(base: str, path: str, **query: str) -> dict:
    url = f"{base}/api/2.0/mlflow/{path}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _loss_points(base: str, mlflow_run: str) -> int:
    try:
        got = _api(base, "metrics/get-history", run_id=mlflow_run, metric_key="train/loss")
    except OSError:
        return 0
    return len(got.get("metrics", []))


def _metric_page(base: str, experiment: str, run: str, keys: list[str]) -> str:
    """MLflow's page of one metric's chart (its own route reads these query parameters)."""
    query = {
        "runs": json.dumps([run]),
        "metric": json.dumps(keys[0]),
        "experiments": json.dumps([experiment]),
        "plot_metric_keys": json.dumps(keys),
    }
    return f"{base}/#/metric?{urllib.parse.urlencode(query)}"


def _chromium(url: str, profile: Path, *args: str) -> str:
    assert BROWSER is not None
    done = subprocess.run(
        [
            BROWSER,
            "--headless",
            "--no-sandbox",  # root in a container
            "--disable-gpu",
            f"--user-data-dir={profile}",
            "--window-size=1600,1000",
            "--virtual-time-budget=30000",  # the page's scripts fetch and draw first
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    return done.stdout


def test_the_live_view_shows_the_loss_curve_and_the_incidents_while_training(stack_env, tmp_path):
    from confluent_kafka import Producer

    base = stack_env.get("MLFLOW_TRACKING_URI")
    if not base:
        pytest.fail("the stack runs no MLflow server (its `mlflow` service)", pytrace=False)
    tag = uuid.uuid4().hex[:8]
    run_id = f"live-{tag}"
    env = _scratch_env(stack_env, tag)
    url_file = tmp_path / "live-view.url"
    children = []
    try:
        follow = ["--run", run_id, "--group", f"live-{tag}", "--url-file", str(url_file)]
        mirror = subprocess.Popen(
            [sys.executable, "-m", "steplens.schema.command", "mlflow", *follow, "--interval", "1"],
            env=env,
            stdout=open(tmp_path / "mirror.log", "wb"),  # noqa: SIM115 - closed with the child
            stderr=subprocess.STDOUT,
        )
        children.append(mirror)
        written = lambda: url_file.exists() and url_file.read_text().strip()  # noqa: E731
        assert wait_until(written, 120, 0.5), "the mirror wrote no page address"
        page = url_file.read_text().strip()
        assert page.startswith(f"{base}/#/experiments/") and "/runs/" in page
        experiment, mlflow_run = page.split("/")[-3], page.split("/")[-1]

        trainer = subprocess.Popen(
            [sys.executable, "-c", TRAINER, run_id, str(STEPS)],
            env=env,
            stdout=open(tmp_path / "trainer.log", "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        children.append(trainer)
        drawn = lambda: _loss_points(base, mlflow_run) >= 200  # noqa: E731
        assert wait_until(drawn, 180, 0.5), "no loss curve in MLflow"
        producer = Producer({"bootstrap.servers": env["STEPLENS_KAFKA_BOOTSTRAP"]})
        producer.produce(env["STEPLENS_TOPIC_ALERTS"], _alert(run_id, 250), key=run_id.encode())
        assert producer.flush(15) == 0

        def noted() -> bool:
            tags = _api(base, "runs/get", run_id=mlflow_run)["run"]["data"].get("tags", [])
            return any(t["key"] == "mlflow.note.content" for t in tags)

        assert wait_until(noted, 60, 0.5), "no incident table in MLflow"

        charts = _metric_page(base, experiment, mlflow_run, ["train/loss", "window/loss_max"])
        dom = _chromium(charts, tmp_path / "profile", "--dump-dom")
        overview = _chromium(page, tmp_path / "profile", "--dump-dom")
        assert trainer.poll() is None, "the trainer finished before the page was read"
        # the chart: a line of many points, and the table under it with the latest value
        vertices = [d.count("L") for d in re.findall(r'class="js-line" d="([^"]*)"', dom)]
        assert max(vertices, default=0) >= 50, f"no loss line drawn ({vertices})"
        assert re.search(r'train/loss</td><td title="[0-9.e+-]+ \(step=\d+\)"', dom)
        # the run's page: the incident table first, the curves' latest values, the parameters
        text = re.sub(r"<[^>]+>", " ", overview)
        assert "steplens: 1 incidents, 1 open" in text
        assert "critical firing run step 250: loss spike: inspect the batch at the onset" in text
        assert "train/loss" in text and "lr_schedule.kind" in text
        shot = os.environ.get("STEPLENS_LIVE_VIEW_SHOT")
        if shot:  # the chart and, beside it, the run's page
            at = Path(shot).resolve()
            _chromium(charts, tmp_path / "profile", f"--screenshot={at}")
            _chromium(page, tmp_path / "profile", f"--screenshot={at.with_stem(at.stem + '-run')}")
    finally:
        for child in reversed(children):
            if child.poll() is None:
                child.terminate()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=10)
