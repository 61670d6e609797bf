"""What the remedy policy's loss tracking costs the worker's scoring: a run's step batches (2
ranks, 100 steps each, the README's metrics) through ``RunDetector`` with the shared remedies
opted into (each step's loss kept, the pace measured: ``engine.advice.track_loss``, and a
decision per batch while a judgement waits) against the same run opted into none, measured
alternately in the same process (CPU time, the best of ``--repeat``).

    python bench/bench_advice_tracking.py            # 20,000 steps per rank
    python bench/bench_advice_tracking.py --steps 50000 --repeat 5
"""

from __future__ import annotations

import argparse
import math
import random
import time

from steplens.schema import make_record
from steplens.stream_jobs.engine.detector import RunDetector


def batches(steps: int, world: int, per: int = 100) -> list:
    """The run's step batches, each rank's ``per`` steps at a time; a loss spike at the middle
    after which the loss stays 30 % up, so a judgement waits for a while too."""
    rng = random.Random(0)
    out = []
    shift = steps // 2
    for a in range(0, steps, per):
        for rank in range(world):
            entries = []
            for i in range(a, min(a + per, steps)):
                loss = 3 * math.exp(-i / 5000) + 1 + rng.gauss(0, 0.02)
                loss *= 20.0 if i == shift else 1.3 if i > shift else 1.0
                entries.append(
                    {
                        "step": i,
                        "time_ns": (i + 1) * 10**8,
                        "loss": loss,
                        "grad_norm": 1 + rng.gauss(0, 0.05),
                        "lr": 3e-4,
                        "step_time_s": 0.1 + rng.gauss(0, 0.002),
                        "tokens": 4096,
                    }
                )
            data = {"records": entries}
            out.append(make_record("step_batch", data, run_id="r", rank=rank, time_ns=0))
    return out


def score(recs: list, remedies: list[str], world: int) -> float:
    """CPU seconds to score ``recs`` (and decide advice as the worker does)."""
    det = RunDetector("r", fit_inline=False)
    meta = {"world_size": world, "remedies": remedies}
    det.process(make_record("run_meta", meta, run_id="r", time_ns=1))
    ckpt = len(recs) // world * 50 - 50  # 50 steps before the spike
    det.process(make_record("checkpoint", {"path": "/ck"}, run_id="r", step=ckpt))
    t0 = time.process_time()
    for rec in recs:
        _, alerts = det.process(rec)
        if det.advice.remedies and (alerts or det.advice.pending):
            det.advise(alerts, rec.data["records"][-1]["time_ns"])
    return time.process_time() - t0


def decisions(recs: list, world: int) -> list[str]:
    """The advice the tracked run gets (the judgement did run)."""
    det = RunDetector("r", fit_inline=False)
    meta = {"world_size": world, "remedies": ["skip_samples", "rewind", "lower_lr"]}
    det.process(make_record("run_meta", meta, run_id="r", time_ns=1))
    ckpt = len(recs) // world * 50 - 50  # 50 steps before the spike
    det.process(make_record("checkpoint", {"path": "/ck"}, run_id="r", step=ckpt))
    out = []
    for rec in recs:
        _, alerts = det.process(rec)
        if alerts or det.advice.pending:
            d = det.advise(alerts, rec.data["records"][-1]["time_ns"])
            out += [f"{a.action} ({a.held or 'sent'})" for a in d.given + d.held]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    recs = batches(args.steps, args.world)
    score(recs[:20], [], args.world)  # compiled loops, imports
    off, on = math.inf, math.inf
    decided = decisions(recs, args.world)
    for k in range(args.repeat):  # alternately first: no order favoured
        for tracked in (k % 2 == 0, k % 2 == 1):
            if tracked:
                on = min(on, score(recs, ["skip_samples", "rewind", "lower_lr"], args.world))
            else:
                off = min(off, score(recs, ["skip_samples"], args.world))
    rows = args.steps * args.world
    print(f"rows: {rows:,} ({args.world} ranks, step batches of 100)")
    print(f"no shared remedy:   {off:.2f} s CPU, {rows / off:,.0f} rows/s")
    print(f"rewind, lower_lr:   {on:.2f} s CPU, {rows / on:,.0f} rows/s")
    print(f"ratio (tracked / not): {on / off:.3f}")
    print(f"advice decided (tracked run): {decided}")


if __name__ == "__main__":
    main()
