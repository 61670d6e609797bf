"""The per-value reference of the package's compiled lr-schedule detector (its code before the
columnar rewrite): the property tests hold the package equal to it, value by value."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from steplens.stream_jobs.engine.core import WARNING, Signal, score_of
from steplens.stream_jobs.engine.signals.lr_schedule import LrConfig, expected_lr, expected_range

isfinite = math.isfinite


@dataclass
class LrState:
    schedule: dict[str, Any] | None = None
    recent: deque[float] = field(default_factory=deque)
    deviating_since: int | None = None


KINDS = ("constant", "linear", "cosine", "step")


def update(
    state: LrState,
    cfg: LrConfig,
    lr: float,
    step: int | None,
    rank: int = -1,
    first_step: int | None = None,
) -> tuple[LrState, list[Signal]]:
    """Score the lr logged at ``step`` (a window's mean when ``first_step`` is given)."""
    if step is None:
        return state, []
    score, breach, expected, lower, upper = _judge(state, cfg, lr, step, first_step)
    detail = {"since_step": state.deviating_since} if breach else None
    sev = WARNING if breach else None
    return state, [
        Signal(
            "lr_schedule", "lr", step, lr, score, rank, "run", sev, expected, lower, upper, detail
        )
    ]


def _judge(
    state: LrState, cfg: LrConfig, lr: float, step: int, first_step: int | None
) -> tuple[float, bool, float, float, float]:
    """(score, breach, expected, lower, upper) of the lr logged at ``step``; keeps the step
    where a deviation started."""
    first = step if first_step is None else min(first_step, step)
    span = expected_range(state.schedule, first, step, cfg.step_offset) if state.schedule else None
    if span is not None and state.schedule is not None:
        want = expected_lr(state.schedule, step)
        lo, hi = span
        peak = float(state.schedule.get("peak_lr", hi))
        near = lo if math.isfinite(lr) and lr < lo else hi
        tol = cfg.rel_tolerance * max(abs(near), 0.01 * abs(peak), 1e-12)
        dev = max(lo - lr, lr - hi, 0.0) if math.isfinite(lr) else math.inf
        breach = dev > tol
        expected, lower, upper = (want if want is not None else lo), lo - tol, hi + tol
        score = score_of(dev / tol) if dev > 0 else 0.0
    else:
        recent = state.recent
        top = max(recent) if recent else 0.0
        finite = isfinite(lr)
        if finite:
            recent.append(lr)
            if len(recent) > cfg.jump_window:
                recent.popleft()
        limit = cfg.jump * top
        ready = len(recent) > cfg.warmup and top > 0
        breach = ready and (not finite or lr > limit)
        expected, lower, upper = top, 0.0, limit
        score = score_of(lr / limit) if ready and finite else 0.0
    if breach:
        if state.deviating_since is None:
            state.deviating_since = step
    else:
        state.deviating_since = None
    return score, breach, expected, lower, upper
