"""`steplens demo --act --quick` on the real stack: each scenario trained from one seed with the
remedies and without; what its scorecard says each remedy did, and how each run ended."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass

import pytest

from steplens.stack.demo_recovery import TOLERANCE

pytestmark = [pytest.mark.stack, pytest.mark.slow]


@dataclass
class Scenario:
    text: str
    advice: list[tuple[str, str]]  # (action, outcome)
    final: float
    final_without: float

    def acted(self, action: str) -> bool:
        return (action, "acted") in self.advice


@dataclass
class ActDemo:
    returncode: int
    output: str
    scenarios: dict[str, Scenario]


def parse(output: str) -> dict[str, Scenario]:
    card = output.split("Remedies: each scenario trained twice", 1)
    assert len(card) == 2, output[-4000:]
    out = {}
    for block in re.split(r"^(?=scenario \w+:)", card[1], flags=re.M)[1:]:
        name = block.split(":", 1)[0].removeprefix("scenario ")
        advice = re.findall(r"advice (\w+)[^\n]*? at step \S+ \(([\w ]+)\)", block)
        final = re.search(r"final loss ([\d.]+) \(without: ([\d.]+)", block)
        assert final, block
        out[name] = Scenario(block, advice, float(final.group(1)), float(final.group(2)))
    return out


@pytest.fixture(scope="module")
def act_demo(stack_env: dict[str, str]) -> ActDemo:
    env = {**os.environ, **stack_env}
    run = f"act-{uuid.uuid4().hex[:8]}"
    cmd = ["demo", "--quick", "--isolated", "--act", "--run-id", run]
    proc = subprocess.run(
        [sys.executable, "-m", "steplens.schema.command", *cmd],
        capture_output=True,
        text=True,
        timeout=840,
        env=env,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    out = proc.stdout + proc.stderr
    return ActDemo(proc.returncode, out, parse(out))


@pytest.mark.timeout(900)
def test_every_scenario_keeps_its_promise_and_the_demo_says_so(act_demo):
    assert set(act_demo.scenarios) == {"blip", "lr_blowup", "bad_shard", "healthy"}
    assert act_demo.returncode == 0, act_demo.output[-5000:]
    assert "remedies: 4 of 4 scenarios as promised" in act_demo.output


@pytest.mark.timeout(900)
def test_a_blip_is_not_rewound_and_ends_where_the_run_without_ends(act_demo):
    blip = act_demo.scenarios["blip"]
    assert not {a for a, _ in blip.advice} & {"rewind", "lower_lr"}, blip.text
    assert blip.final == pytest.approx(blip.final_without, rel=TOLERANCE), blip.text


@pytest.mark.timeout(900)
def test_a_diverging_lr_blowup_is_rewound_and_ends_better(act_demo):
    blowup = act_demo.scenarios["lr_blowup"]
    assert blowup.acted("rewind"), blowup.text
    assert re.search(r"cost \d+ steps lost, \d+ batches skipped", blowup.text), blowup.text
    assert "evidence: " in blowup.text
    assert blowup.final < blowup.final_without * (1 - TOLERANCE), blowup.text


@pytest.mark.timeout(900)
def test_a_recurring_bad_shard_is_skipped_and_the_run_ends_no_worse(act_demo):
    shard = act_demo.scenarios["bad_shard"]
    assert shard.acted("skip_samples"), shard.text
    rows = [
        (int(a), int(b))
        for a, b in re.findall(r"shard rows trained on: (\d+) \(without: (\d+)\)", shard.text)
    ]
    assert len(rows) >= 3 and all(b > 0 for _, b in rows), shard.text
    assert sum(a for a, _ in rows) < sum(b for _, b in rows), shard.text  # later visits skipped
    assert shard.final <= shard.final_without * (1 + TOLERANCE), shard.text


@pytest.mark.timeout(900)
def test_a_healthy_run_gets_no_advice_at_all(act_demo):
    healthy = act_demo.scenarios["healthy"]
    assert healthy.advice == [], healthy.text
    assert "other advice" not in healthy.text and "no advice" in healthy.text
    assert healthy.final == pytest.approx(healthy.final_without, rel=1e-6), healthy.text
