"""Loss volatility: noise of the last ``window`` values relative to their mean.

The noise is the standard deviation of first differences divided by sqrt(2): on a steadily
falling loss it measures the jitter, not the trend. Kept with running sums, O(1) per value.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from steplens.stream_jobs.core import WARNING, Signal, score_of


@dataclass
class VolatilityConfig:
    window: int = 50
    threshold: float = 0.10  # relative noise above this warns
    abs_floor: float = 1e-3  # |mean| below this is treated as this (near-zero losses)


@dataclass
class VolatilityState:
    values: deque[float] = field(default_factory=deque)
    diffs: deque[float] = field(default_factory=deque)
    sum_v: float = 0.0
    sum_d: float = 0.0
    sum_d2: float = 0.0


def update(
    state: VolatilityState, cfg: VolatilityConfig, metric: str, x: float, step: int | None
) -> tuple[VolatilityState, list[Signal]]:
    if not math.isfinite(x):
        return state, []
    if state.values:
        d = x - state.values[-1]
        state.diffs.append(d)
        state.sum_d += d
        state.sum_d2 += d * d
        if len(state.diffs) > cfg.window - 1:
            old = state.diffs.popleft()
            state.sum_d -= old
            state.sum_d2 -= old * old
    state.values.append(x)
    state.sum_v += x
    if len(state.values) > cfg.window:
        state.sum_v -= state.values.popleft()
    n = len(state.diffs)
    if len(state.values) < cfg.window or n < 2:
        return state, [Signal("volatility", metric, step, 0.0, 0.0)]
    var = max(0.0, (state.sum_d2 - state.sum_d * state.sum_d / n) / (n - 1))
    noise = math.sqrt(var / 2.0)
    mean = state.sum_v / len(state.values)
    cv = noise / max(abs(mean), cfg.abs_floor)
    severity = WARNING if cv > cfg.threshold else None
    sig = Signal(
        "volatility",
        metric,
        step,
        cv,
        score_of(cv / cfg.threshold),
        severity=severity,
        expected=cfg.threshold,
    )
    return state, [sig]
