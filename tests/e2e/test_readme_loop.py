"""The README's own loop with every remedy on, against the real stack and worker: one batch of
random tokens at step 1000 of 1,600 (checkpoints every 1,000 steps, as the README shows) is a
blip. The run trains to the end, nothing is rewound or slowed, and it ends where the same run
without remedies ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.stack, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 1600
NOISE = 0.01  # the final loss of two runs from one seed; identical unless a remedy acted


@pytest.fixture
def worker(stack_env: dict[str, str], tmp_path: Path):
    """A worker on topics of its own; yields the environment a training run needs."""
    from tests.stream_jobs.conftest import Kafka, WorkerProc

    from steplens.schema.topics import Topics, ensure_topics

    tag = uuid.uuid4().hex[:8]
    topics = Topics.prefixed(f"t.{tag}")
    ensure_topics(stack_env["STEPLENS_KAFKA_BOOTSTRAP"], topics)
    proc = WorkerProc(Kafka(stack_env, topics), tmp_path / "w", f"readme-{tag}").start()
    proc.wait_metrics(120)
    env = {
        **os.environ,
        **stack_env,
        **topics.env(),
        "OMP_NUM_THREADS": "1",
    }
    yield env
    proc.stop()


def train(env: dict[str, str], tmp_path: Path, remedies: bool) -> dict:
    out = tmp_path / ("with" if remedies else "without")
    out.mkdir()
    cmd = [sys.executable, str(ROOT / "tests/e2e/readme_loop.py"), "--out", str(out)]
    cmd += ["--run-id", f"readme-{uuid.uuid4().hex[:8]}", "--steps", str(STEPS)]
    proc = subprocess.run(
        cmd + (["--remedies"] if remedies else []),
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(900)
def test_the_readme_loop_trains_through_a_bad_batch_to_where_it_ends_without_remedies(
    worker, tmp_path
):
    without = train(worker, tmp_path, remedies=False)
    with_ = train(worker, tmp_path, remedies=True)
    assert with_["last_step"] == without["last_step"] == STEPS - 1  # to the end, nothing lost
    assert without["answers"] == []
    actions = {a["action"] for a in with_["answers"]}
    assert not actions & {"rewind", "lower_lr"}, with_["answers"]
    assert with_["final"] == pytest.approx(without["final"], rel=NOISE), (with_, without)
