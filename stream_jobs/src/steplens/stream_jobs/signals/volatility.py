"""Loss volatility: noise of the last ``window`` values relative to their mean.

The noise is the standard deviation of first differences divided by sqrt(2): on a steadily
falling loss it measures the jitter, not the trend. Kept with running sums, O(1) per value.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from steplens.producer.schema import RUN_RANK
from steplens.stream_jobs.core import WARNING, Signal, SignalRun, score_of
from steplens.stream_jobs.signals import kernels

isfinite, sqrt = math.isfinite, math.sqrt
_INF = math.inf


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
        return state, [Signal("volatility", metric, step, 0.0, 0.0)]
    sum_d = state.sum_d
    var = (state.sum_d2 - sum_d * sum_d / n) / (n - 1)
    if not var > 0.0:  # max(0.0, var), NaN included
        var = 0.0
    noise = sqrt(var / 2.0)
    mean = sum_v / m
    floor = abs(mean)
    if cfg.abs_floor > floor:  # noqa: PLR1730 (no call on the hot path)
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
        WARNING if cv > threshold else None,
        threshold,
    )
    return state, [sig]


def update_many(
    state: VolatilityState,
    cfg: VolatilityConfig,
    metric: str,
    xs: Sequence[float],
    steps: Sequence[int | None],
) -> SignalRun:
    """``update`` over finite values: their signals as columns; once the window is full, in
    the compiled loop ``kernels.volatility_full`` (the same arithmetic as ``update``)."""
    out = SignalRun("volatility", metric)
    i, n = 0, len(xs)
    window = cfg.window
    values, diffs = state.values, state.diffs
    while i < n and (len(values) < window or len(diffs) < window - 1 or window < 3):
        out.add(update(state, cfg, metric, xs[i], steps[i])[1][0])
        i += 1
    if i == n:
        return out
    vals = np.array([*values, *(xs[i:] if i else xs)], dtype=float)
    cvs, scores, sev, all_diffs, sum_v, sum_d, sum_d2 = kernels.volatility_full(
        vals,
        len(values),
        np.array(diffs, dtype=float),
        int(window),
        float(state.sum_v),
        float(state.sum_d),
        float(state.sum_d2),
        float(cfg.threshold),
        float(cfg.abs_floor),
    )
    taken = n - i
    out.steps += steps[i:]
    out.values += cvs.tolist()
    out.scores += scores.tolist()
    out.severities += kernels.severities(sev)
    out.expected += [cfg.threshold] * taken
    out.lower += [None] * taken
    out.upper += [None] * taken
    # the window as update leaves it (both deques keep their lengths)
    state.values = deque(vals[-len(values) :].tolist())
    state.diffs = deque(all_diffs[-len(diffs) :].tolist())
    state.sum_v, state.sum_d, state.sum_d2 = sum_v, sum_d, sum_d2
    return out
