"""How the demo's loss incidents went with remedies and without: one scorecard line each.

Both runs start from the same seed and meet the same incidents at the same steps (the
training script's ``--loss-file``: each step's loss on rank 0, and what the remedies did). For
each loss incident: the advice the run acted on, the steps until the loss is back on its
pre-incident trend, and the loss at the end, against the run without remedies.

"Back on trend": the loss was falling before the incident, so it is back once the mean of
``window`` steps from some step on is at most its mean over the ``before`` steps before the
onset (times ``1 + tolerance``), and stays so at every later step's window.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOSS_INCIDENTS = ("lr_blowup", "corrupted_batch")


@dataclass
class LossRun:
    losses: dict[int, float] = field(default_factory=dict)  # step -> loss (rank 0)
    acted: list[dict[str, Any]] = field(default_factory=list)  # the remedies' answers


def read_run(path: Path) -> LossRun:
    run = LossRun()
    if not path.exists():
        return run
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        if "acted" in d:
            run.acted.append(d["acted"])
        else:
            run.losses[int(d["step"])] = float(d["loss"])
    return run


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def back_on_trend(
    losses: dict[int, float],
    onset: int,
    before: int = 20,
    window: int = 10,
    tolerance: float = 0.05,
) -> int | None:
    """Steps from ``onset`` until the loss is back on its trend for good (None: not by the
    end, or no loss before the onset)."""
    pre = [losses[s] for s in range(onset - before, onset) if s in losses]
    after = [s for s in sorted(losses) if s >= onset]
    if not pre or len(after) < window:
        return None
    limit = _mean(pre) * (1.0 + tolerance)
    back = None
    for i in range(len(after) - window + 1):
        ok = _mean([losses[s] for s in after[i : i + window]]) <= limit
        if ok and back is None:
            back = after[i]
        elif not ok:
            back = None
    return None if back is None else back - onset


def end_loss(losses: dict[int, float], last: int = 20) -> float | None:
    steps = sorted(losses)[-last:]
    return _mean([losses[s] for s in steps]) if steps else None


def _steps(n: int | None) -> str:
    return "not by the end" if n is None else f"{n} steps"


def _loss(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def remedy_lines(plan: list[Any], with_: LossRun, without: LossRun) -> list[str]:
    """One line per loss incident of the plan (``Incident``s), in step order."""
    loss_incidents = sorted(
        (i for i in plan if i.kind in LOSS_INCIDENTS), key=lambda i: i.first_step
    )
    lines = ["", "Remedies (the same run from the same seed, with and without)", "=" * 72]
    for k, inc in enumerate(loss_incidents):
        until = loss_incidents[k + 1].first_step if k + 1 < len(loss_incidents) else None
        answers = [
            a
            for a in with_.acted
            if isinstance(a.get("step"), int)
            and a["step"] >= inc.first_step
            and (until is None or a["step"] < until)
        ]
        given = ", ".join(sorted({str(a["action"]) for a in answers})) or "none"
        done = [a for a in answers if a.get("outcome") == "acted"]
        acted = ", ".join(f"{a['action']} at step {a['step']}" for a in done) or "nothing"
        lines.append(
            f"{inc.kind} (step {inc.first_step}): advice {given}; acted on: {acted}; "
            f"back on trend after {_steps(back_on_trend(with_.losses, inc.first_step))} "
            f"(without: {_steps(back_on_trend(without.losses, inc.first_step))}); "
            f"loss at the end {_loss(end_loss(with_.losses))} "
            f"(without: {_loss(end_loss(without.losses))})"
        )
        for a in done:
            lines.append(f"        {a['action']}: {a.get('detail', '')}")
    return lines
