"""`steplens demo --act` on the real stack: the stream jobs advise, the ranks act, and the
loss incidents are compared with the same run from the same seed without remedies."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

import pytest

pytestmark = [pytest.mark.stack, pytest.mark.slow]


@pytest.fixture(scope="module")
def act_demo(stack_env: dict[str, str]) -> str:
    env = {**os.environ, **stack_env}
    run = f"act-{uuid.uuid4().hex[:8]}"
    cmd = ["demo", "--quick", "--isolated", "--act", "--no-report", "--run-id", run]
    proc = subprocess.run(
        [sys.executable, "-m", "steplens.schema.command", *cmd],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def line_of(output: str, kind: str) -> str:
    section = output.split("Remedies (the same run from the same seed, with and without)", 1)
    assert len(section) == 2, output[-3000:]
    [line] = [x for x in section[1].splitlines() if x.startswith(kind)]
    return line


def test_the_lr_blowup_is_rewound_and_the_loss_recovers_sooner(act_demo):
    line = line_of(act_demo, "lr_blowup")
    assert re.search(r"acted on: .*rewind at step \d+", line), line
    got = re.search(r"back on trend after (\d+) steps \(without: (\d+|not by the end)", line)
    assert got, line
    without = 10**9 if got.group(2) == "not by the end" else int(got.group(2))
    assert int(got.group(1)) < without, line
    ends = re.search(r"loss at the end ([\d.]+) \(without: ([\d.]+)\)", line)
    assert ends and float(ends.group(1)) <= float(ends.group(2)) + 0.02, line


def test_every_loss_incident_has_its_line_and_what_was_done(act_demo):
    line = line_of(act_demo, "corrupted_batch")
    assert "advice " in line and "acted on:" in line
    assert "rewind: restored model, optimizer, scheduler from" in act_demo
