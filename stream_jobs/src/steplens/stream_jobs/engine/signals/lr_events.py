"""Learning-rate events: where the logged lr actually ended its warmup and decayed, set against
the declared schedule ("lr decayed at step 3012; declared milestone 3000"), for the report and
the training board. Events are signals (``lr_event``) that never alert and are always
published.

With a declared schedule (``run_meta``'s ``lr_schedule``) the events are its points, each
recorded at the first logged lr past it: the end of the warmup (the lr reached its peak), each
milestone of a step schedule (the lr fell below the geometric middle of the levels around it),
the end of a linear or cosine decay (the lr reached its floor), and each step a remedy lowered
the lr from (``lr_scale``; the schedule is declared again with it). A point the run was already
past when first seen (its lr, or its declared step: a resumed run) is not an event; a schedule
declared again mid-run keeps the points still ahead of the steps seen. Without a
schedule, an lr that changes by more than ``factor`` from one value to the next, after two
values within ``steady`` of each other (a step schedule, a plateau scheduler, a restart), is an
event.

The lr is the same on every rank: events are read from ``rank``'s lr only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from steplens.stream_jobs.engine.core import NO_STEP, Column, Signals
from steplens.stream_jobs.engine.signals.lr_schedule import expected_lr, lr_scale, warmup_end

NAN = math.nan
RISE, FALL = 1, -1


@dataclass
class LrEventConfig:
    rank: int = 0  # the rank whose lr is read (-1 too: records of the whole run, a CSV)
    tolerance: float = 0.01  # "at the peak" / "at the floor": within this share of the range
    factor: float = 1.5  # without a schedule: a change by more than this from one value...
    steady: float = 0.01  # ... after two values within this share of each other


@dataclass
class LrEventState:
    schedule: dict[str, Any] | None = None
    # the points of the schedule they were read from (``points``)
    points: list[tuple[str, int, int, float]] = field(default_factory=list)
    read_from: dict[str, Any] | None = None
    next_point: int = 0  # the declared point the lr has not passed yet
    armed: bool = False  # a value before it was seen (the lr will cross it)
    last: list[float] = field(default_factory=list)  # the last two lrs, oldest first


def points(schedule: dict[str, Any] | None, tol: float) -> list[tuple[str, int, int, float]]:
    """The declared schedule's points, in order: (kind, declared step, RISE or FALL, the lr
    the logged one passes there)."""
    if not schedule or not isinstance(schedule.get("peak_lr"), (int, float)):
        return []
    peak = float(schedule["peak_lr"])
    floor = float(schedule.get("min_lr") or 0.0)
    warm = warmup_end(schedule)
    total = int(schedule.get("total_steps") or 0)
    kind = schedule.get("kind", "constant")
    out: list[tuple[str, int, int, float]] = []
    if warm:
        out.append(("warmup_end", warm, RISE, peak * (1.0 - tol)))
    if kind == "step":
        for m in sorted(m for m in schedule.get("milestones") or [] if isinstance(m, int)):
            before, after = expected_lr(schedule, m - 1), expected_lr(schedule, m)
            if before and after and 0 < after < before:
                out.append(("decay", m, FALL, math.sqrt(before * after)))
    elif kind in ("linear", "cosine") and total > warm:
        at = (floor + tol * (peak - floor)) * lr_scale(schedule, total)
        out.append(("decay_end", total, FALL, at))
    for step, _ in schedule.get("lr_scale") or ():
        before, after = expected_lr(schedule, step - 1), expected_lr(schedule, step)
        if before and after and 0 < after < before:
            out.append(("lowered", step, FALL, math.sqrt(before * after)))
    return sorted(out, key=lambda p: p[1])


def update(state: LrEventState, cfg: LrEventConfig, metric: str, col: Column) -> Signals | None:
    """The events among the column's lrs (None: none, the common case)."""
    if col.rank > cfg.rank:
        return None
    if state.schedule != state.read_from:  # a new declared schedule: its points
        state.points = points(state.schedule, cfg.tolerance)
        first = next((s for s in col.steps.tolist() if s != NO_STEP), None)
        if state.last and first is not None:  # declared again mid-run: those ahead of it
            state.next_point = sum(1 for p in state.points if p[1] < first)
            state.armed = True
        else:
            state.next_point, state.armed = 0, False
        state.read_from = state.schedule
    pts = state.points
    rows: list[int] = []
    details: list[dict[str, Any] | None] = []
    xs, steps = col.xs.tolist(), col.steps.tolist()
    if pts:
        nxt, armed = state.next_point, state.armed
        for k, x in enumerate(xs):
            while nxt < len(pts):
                kind, declared, way, at = pts[nxt]
                reached = x >= at if way == RISE else x <= at
                if not armed and (reached or steps[k] >= declared):
                    nxt += 1  # first seen past it (a resumed run): not an event
                    continue
                if not reached:
                    armed = True
                    break
                if steps[k] != NO_STEP:
                    rows.append(k)
                    details.append(_declared(kind, steps[k], declared, x, state.last))
                nxt, armed = nxt + 1, False
            state.last = [*state.last[-1:], x]
        state.next_point, state.armed = nxt, armed
    else:
        last = state.last
        for k, x in enumerate(xs):
            if len(last) == 2 and last[0] > 0 and last[1] > 0:
                steady = abs(last[1] / last[0] - 1.0) <= cfg.steady
                change = x / last[1]
                jump = change > cfg.factor or change * cfg.factor < 1.0
                if steady and jump and steps[k] != NO_STEP:
                    rows.append(k)
                    details.append(_changed(steps[k], last[1], x))
            last = [*last[-1:], x]
        state.last = last
    if not rows:
        return None
    return Signals.of(
        "lr_event",
        metric,
        col.rows[rows],
        col.steps[rows],
        col.xs[rows],
        0.0,
        rank=col.rank,
        detail=details,
    )


def _declared(kind: str, step: int, declared: int, x: float, last: list[float]) -> dict[str, Any]:
    what = {
        "warmup_end": f"warmup ended at step {step}: the lr reached its peak ({x:.3g})",
        "decay": f"lr decayed at step {step} ({last[-1]:.3g} -> {x:.3g})"
        if last
        else f"lr decayed at step {step} (to {x:.3g})",
        "decay_end": f"lr decay ended at step {step}: the lr reached its floor ({x:.3g})",
        "lowered": f"lr lowered at step {step} by a remedy ({last[-1]:.3g} -> {x:.3g})"
        if last
        else f"lr lowered at step {step} by a remedy (to {x:.3g})",
    }[kind]
    label = "milestone" if kind == "decay" else "step"
    return {"text": f"{what}; declared {label} {declared}", "kind": kind, "declared_step": declared}


def _changed(step: int, before: float, x: float) -> dict[str, Any]:
    kind = "decay" if x < before else "rise"
    verb = "decayed" if x < before else "rose"
    return {"text": f"lr {verb} at step {step} ({before:.3g} -> {x:.3g})", "kind": kind}
