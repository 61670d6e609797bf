"""`steplens demo --act`: every scenario of ``demo_scenarios`` trained twice from one seed, with
the remedies and without, on the stack, worker and sinks the demo started; then the remedies
scorecard (``demo_recovery``). Exits non-zero when a scenario breaks its promise.

The run with remedies instruments itself as the README's loop does (``init(remedies=[...])``,
``timed(skipping(loader))``, a checkpoint and ``checkpoint(step, path)`` about six times a run,
``act(step)`` every step); the run without is the same script with ``remedies=[]``. Both at the
producer's defaults but one: windows of at most 1 s (``STEPLENS_WINDOW_S``), as the steps are
scaled: a demo step takes 0.1 s on any machine (``--step-s``; the rest of a step is slept), so
the default 10 s window would be half a run, where a real job's steps of a second or more make
it 10 steps or fewer. The demo's worker is started with a lead of 1 s for shared remedies
(``--advice-lead-s``, 5 by default), scaled the same way.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from steplens.stack.demo_recovery import LossRun, read_run, scorecard
from steplens.stack.demo_scenarios import SCENARIOS, checkpoint_every, plan_scenario

ACT_STEPS = 300
QUICK_ACT_STEPS = 200
ACT_ENV = {"STEPLENS_WINDOW_S": "1"}
# the shared remedies' lead scaled as the window is: 5 s is 5 steps or fewer of a real job but
# 50 demo steps, which would put a rewind past the end of a 200-step run; 1 s is
# still three times the advice's latency measured on one machine (p99 0.3 s)
ACT_WORKER_ARGS = ["--advice-lead-s", "1"]
SEED = 1234
# each demo step takes at least this long, on any machine: a faster machine's steps would
# otherwise put more of them in a 1 s window and in the lead, and so a rewind past a run's end
ACT_STEP_S = 0.1

Train = Callable[[str, list[str], dict[str, str]], int]  # (run id, script args, env) -> exit


def act_steps(args: argparse.Namespace) -> int:
    if args.steps_given:
        return int(args.steps)
    return QUICK_ACT_STEPS if args.quick else ACT_STEPS


def run_scenarios(
    args: argparse.Namespace,
    env: dict[str, str],
    advice_topic: str,
    run_dir: Path,
    train: Train,
    *,
    say: Callable[[str], None],
) -> int:
    """Train each scenario with and without remedies; print the scorecard; 0 if all held."""
    from steplens.stack.demo_kafka import RunTail

    steps = act_steps(args)
    every = checkpoint_every(steps)
    names = [n for n in SCENARIOS if n in (args.scenario or SCENARIOS)]
    if not names:
        say(f"[demo] no such scenario: {', '.join(args.scenario)} (one of {', '.join(SCENARIOS)})")
        return 2
    say(
        f"[demo] {len(names)} scenarios x 2 runs of {steps} steps from seed {SEED} "
        f"(checkpoints every {every} steps)"
    )
    results: list[tuple[str, list[Any], LossRun, LossRun]] = []
    for name in names:
        runs: dict[bool, LossRun] = {}
        for act in (True, False):
            run_id = f"{args.run_id}-{name}" + ("" if act else "-base")
            losses = run_dir / f"losses-{run_id}.jsonl"
            script = [
                "--steps",
                str(steps),
                "--scenario",
                name,
                "--seed",
                str(SEED),
                "--checkpoint-every",
                str(every),
                "--checkpoint-dir",
                str(run_dir / f"checkpoints-{run_id}"),
                "--loss-file",
                str(losses),
                "--incidents-file",
                str(run_dir / f"incidents-{run_id}.json"),
                "--log-every",
                "100",
                "--step-s",
                str(ACT_STEP_S),
                *(["--act"] if act else []),
            ]
            say(f"[demo] {name}, {'with' if act else 'without'} remedies: run {run_id}")
            rc = train(run_id, script, {**env, **ACT_ENV})
            if rc != 0:
                say(f"[demo] the run {run_id} failed (exit {rc}); see {run_dir}")
                return 1
            runs[act] = read_run(losses)
            if act:
                tail = RunTail(env["STEPLENS_KAFKA_BOOTSTRAP"], [advice_topic], run_id)
                tail.settle(quiet_s=3.0, timeout_s=30.0, progress=lambda _line: None)
                runs[act].advice = [
                    {**r.data, "step": r.step, "rank": r.rank} for r in tail.of_kind("advice")
                ]
                tail.close()
        plan = plan_scenario(name, steps)
        results.append((name, plan, runs[True], runs[False]))
    text, failed = scorecard(results, SEED)
    say(text)
    return 1 if failed else 0
