"""The per-value reference of the package's compiled volatility detector (its code before the
columnar rewrite): the property tests hold the package equal to it, value by value."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from steplens.schema import RUN_RANK
from steplens.stream_jobs.engine.core import Signal, score_of
from steplens.stream_jobs.engine.signals.volatility import VolatilityConfig

isfinite, sqrt = math.isfinite, math.sqrt
_INF = math.inf


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
    if not isfinite(x):
        return state, []
    values, diffs = state.values, state.diffs
    if values:
        d = x - values[-1]
        diffs.append(d)
        sum_d = state.sum_d + d
        sum_d2 = state.sum_d2 + d * d
        if len(diffs) > cfg.window - 1:
            old = diffs.popleft()
            sum_d -= old
            sum_d2 -= old * old
        state.sum_d, state.sum_d2 = sum_d, sum_d2
    values.append(x)
    sum_v = state.sum_v + x
    if len(values) > cfg.window:
        sum_v -= values.popleft()
    state.sum_v = sum_v
    n = len(diffs)
    m = len(values)
    if m < cfg.window or n < 2:
        return state, [Signal("volatility", metric, step, 0.0, math.nan)]
    sum_d = state.sum_d
    var = (state.sum_d2 - sum_d * sum_d / n) / (n - 1)
    if not var > 0.0:  # max(0.0, var), NaN included
        var = 0.0
    noise = sqrt(var / 2.0)
    mean = sum_v / m
    floor = abs(mean)
    if cfg.abs_floor > floor:
        floor = cfg.abs_floor
    cv = noise / floor
    threshold = cfg.threshold
    ratio = cv / threshold
    sig = Signal(
        "volatility",
        metric,
        step,
        cv,
        ratio / (ratio + 1.0) if 0.0 < ratio < _INF else score_of(ratio),
        RUN_RANK,
        "run",
        None,
        threshold,
    )
    return state, [sig]
