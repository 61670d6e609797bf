"""Learning-rate schedule: the logged lr must follow the declared schedule (``run_meta``).

Without a declared schedule the lr may only rise smoothly: a jump above ``jump`` x the largest
recent lr is a deviation. The signal carries the step where the deviation started.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from steplens.stream_jobs.core import WARNING, Signal, score_of


@dataclass
class LrConfig:
    rel_tolerance: float = 0.10  # of max(expected, 1 % of peak)
    jump: float = 2.0
    jump_window: int = 20
    warmup: int = 3


@dataclass
class LrState:
    schedule: dict[str, Any] | None = None
    recent: deque[float] = field(default_factory=deque)
    deviating_since: int | None = None


def expected_lr(schedule: dict[str, Any], step: int) -> float | None:
    """The declared lr at ``step``: linear warmup, then constant / linear / cosine / step decay."""
    peak = schedule.get("peak_lr")
    if not isinstance(peak, (int, float)):
        return None
    peak = float(peak)
    floor = float(schedule.get("min_lr") or 0.0)
    warm = int(schedule.get("warmup_steps") or 0)
    total = int(schedule.get("total_steps") or 0)
    kind = schedule.get("kind", "constant")
    if warm and step < warm:
        return peak * (step + 1) / warm
    if kind == "constant":
        return peak
    if kind == "step":
        passed = sum(1 for m in schedule.get("milestones") or [] if step >= m)
        return peak * float(schedule.get("gamma", 0.1)) ** passed
    if total <= warm:
        return peak
    progress = min(1.0, max(0.0, (step - warm) / (total - warm)))
    if kind == "linear":
        return peak + (floor - peak) * progress
    if kind == "cosine":
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return None


def update(
    state: LrState, cfg: LrConfig, lr: float, step: int | None, rank: int = -1
) -> tuple[LrState, list[Signal]]:
    if step is None:
        return state, []
    want = expected_lr(state.schedule, step) if state.schedule else None
    if want is not None:
        peak = float(state.schedule.get("peak_lr", want)) if state.schedule else want
        tol = cfg.rel_tolerance * max(abs(want), 0.01 * abs(peak), 1e-12)
        dev = abs(lr - want) if math.isfinite(lr) else math.inf
        breach = dev > tol
        expected, lower, upper = want, want - tol, want + tol
        score = score_of(dev / tol)
    else:
        top = max(state.recent) if state.recent else 0.0
        if math.isfinite(lr):
            state.recent.append(lr)
            if len(state.recent) > cfg.jump_window:
                state.recent.popleft()
        ready = len(state.recent) > cfg.warmup and top > 0
        breach = ready and (not math.isfinite(lr) or lr > cfg.jump * top)
        expected, lower, upper = top, 0.0, cfg.jump * top
        score = score_of(lr / (cfg.jump * top)) if ready and math.isfinite(lr) else 0.0
    if breach and state.deviating_since is None:
        state.deviating_since = step
    elif not breach:
        state.deviating_since = None
    detail = {"since_step": state.deviating_since} if breach else None
    return state, [
        Signal(
            "lr_schedule",
            "lr",
            step,
            lr,
            score,
            rank,
            severity=WARNING if breach else None,
            expected=expected,
            lower=lower,
            upper=upper,
            detail=detail,
        )
    ]
