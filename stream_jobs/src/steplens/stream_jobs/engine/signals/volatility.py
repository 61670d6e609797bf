"""Loss volatility: noise of the last ``window`` values relative to their mean.

The noise is the standard deviation of first differences divided by sqrt(2): on a steadily
falling loss it measures the jitter, not the trend. Kept with running sums, O(1) per value.

A ``step_window`` that carries its own standard deviation (of its steps' values) is judged on
it: the window's relative noise is its std over its mean, less the part a linear trend over the
window explains (the slope between this window's mean and the last's), so "the std of the last
N steps over 10 %" means what it says. A window without it (or of fewer than
``min_window_values`` steps) is one value of the series above, as a step record is. The steps a
windowed series sends between its windows are not judged: the windows hold them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from steplens.schema import RUN_RANK
from steplens.stream_jobs.engine.core import Column, Signals, score_of
from steplens.stream_jobs.engine.policy import Policy
from steplens.stream_jobs.engine.signals.kernels import jit, score

NAN = math.nan
_EMPTY = np.empty(0)


@dataclass
class VolatilityConfig:
    window: int = 50
    threshold: float = 0.10  # relative noise above this warns
    abs_floor: float = 1e-3  # |mean| below this is treated as this (near-zero losses)
    min_window_values: int = 8  # a window's own std is read from this many values on
    # None: the design's anchor, relative noise over ``threshold``: at once while the run's
    # own noise is not known (a run noisy from the start), then when that noise is also rare
    # for this run (1 in 10,000 steps: its windows overlap, so one excursion is many values):
    # a run whose loss always wanders 8-11 % is not paged each time a window reads 10.5 %;
    # one that turns unstable is
    policy: Policy | None = None

    def __post_init__(self) -> None:
        if self.policy is None:
            self.policy = Policy(
                rarity=0.9999,
                measure="value",
                warning=self.threshold,
                cold_warning=self.threshold,
                per_step=True,
            )


@dataclass
class VolatilityState:
    values: np.ndarray = field(default_factory=lambda: _EMPTY)  # the window, oldest first
    diffs: np.ndarray = field(default_factory=lambda: _EMPTY)  # its differences
    sums: np.ndarray = field(default_factory=lambda: np.zeros(3))  # of values, diffs, diffs²
    # the last window judged on its own std: its mean and last step (the trend to the next)
    window_mean: float = NAN
    window_step: int = -1


def update(state: VolatilityState, cfg: VolatilityConfig, metric: str, col: Column) -> Signals:
    """The relative noise after each value (0, without a score, until the window is full).
    The signals are of the run (rank -1): the series is one rank's, the scope the run's."""
    if col.spreads is not None and col.firsts is not None and col.counts is not None:
        std, count = float(col.spreads[0]), int(col.counts[0])
        if math.isfinite(std) and count >= cfg.min_window_values:
            return _window(state, cfg, metric, col, std)
    elif state.window_step >= 0:
        # steps sent between the windows of a windowed series (a guard's outliers, a sample):
        # the windows judge their noise; one step among means is no noise of its own
        none = np.empty(0)
        return Signals(
            "volatility",
            metric,
            col.rows[:0],
            col.steps[:0],
            none,
            none,
            np.zeros(0, np.int8),
            none,
            none,
            none,
            RUN_RANK,
        )
    cvs, scores, judged, values, diffs = _volatility(
        col.xs,
        state.values,
        state.diffs,
        state.sums,
        int(cfg.window),
        float(cfg.threshold),
        float(cfg.abs_floor),
    )
    state.values, state.diffs = values, diffs
    expected = np.where(judged, float(cfg.threshold), NAN)
    nan = np.full(len(cvs), NAN)
    return Signals(
        "volatility",
        metric,
        col.rows,
        col.steps,
        cvs,
        scores,
        np.zeros(len(cvs), np.int8),
        expected,
        nan,
        nan,
        RUN_RANK,
    )


def _window(
    state: VolatilityState, cfg: VolatilityConfig, metric: str, col: Column, std: float
) -> Signals:
    """A window's relative noise from its own std (one row), without the variance a linear
    trend from the last such window explains; the first window is not judged (no trend yet)."""
    assert col.firsts is not None
    mean, step, first = float(col.xs[0]), int(col.steps[0]), int(col.firsts[0])
    prev, prev_step = state.window_mean, state.window_step
    state.window_mean, state.window_step = mean, step
    var = std * std
    judged = math.isfinite(prev) and step > prev_step
    if judged:
        slope = (mean - prev) / (step - prev_step)
        span = max(step - first + 1, 1)
        var = max(0.0, var - slope * slope * (span * span - 1) / 12.0)
    # not judged: 0 without a score, as a step series before its window is full (the policy
    # reads the value: a first window's std is mostly the early loss's fall)
    cv = math.sqrt(var) / max(abs(mean), cfg.abs_floor) if judged else 0.0
    return Signals.of(
        "volatility",
        metric,
        col.rows,
        col.steps,
        cv,
        score_of(cv / cfg.threshold) if judged else NAN,
        None,
        cfg.threshold if judged else None,
    )


@jit
def _volatility(  # noqa: PLR0917
    xs: np.ndarray,
    values: np.ndarray,
    diffs: np.ndarray,
    sums: np.ndarray,
    window: int,
    threshold: float,
    abs_floor: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The relative noise of the last ``window`` values after each of ``xs``: ``values`` (at
    most ``window``) and ``diffs`` (at most ``window - 1``) the window before them, ``sums``
    (sum of values, of differences, of their squares; updated in place) kept running.

    Returns (cvs, scores, judged, the window, its differences); a value before
    the window is full is not judged (cv 0)."""
    m = len(xs)
    nv, nd = len(values), len(diffs)
    fl = np.empty(nv + m)
    fl[:nv] = values
    fl[nv:] = xs
    dl = np.empty(nd + m)
    dl[:nd] = diffs
    vhead = dhead = 0
    dcount = nd
    sum_v, sum_d, sum_d2 = sums[0], sums[1], sums[2]
    cvs = np.zeros(m)
    scores = np.full(m, NAN)  # no score before the window is full
    judged = np.zeros(m, np.bool_)
    for j in range(m):
        x = xs[j]
        if vhead + nv > 0:
            d = x - fl[vhead + nv - 1]
            dl[dcount] = d
            dcount += 1
            nd += 1
            sum_d += d
            sum_d2 += d * d
            if nd > window - 1:
                old = dl[dhead]
                dhead += 1
                nd -= 1
                sum_d -= old
                sum_d2 -= old * old
        nv += 1
        sum_v += x
        if nv > window:
            sum_v -= fl[vhead]
            vhead += 1
            nv -= 1
        if nv < window or nd < 2:
            continue
        var = (sum_d2 - sum_d * sum_d / nd) / (nd - 1)
        if not var > 0.0:  # max(0.0, var), NaN included
            var = 0.0
        noise = math.sqrt(var / 2.0)
        floor = abs(sum_v / nv)
        floor = max(floor, abs_floor)
        cv = noise / floor
        cvs[j] = cv
        scores[j] = score(cv / threshold)
        judged[j] = True
    sums[0], sums[1], sums[2] = sum_v, sum_d, sum_d2
    return (
        cvs,
        scores,
        judged,
        fl[vhead : vhead + nv].copy(),
        dl[dhead:dcount].copy(),
    )


def warm_up_kernel() -> None:
    one = np.ones(8)
    update(
        VolatilityState(),
        VolatilityConfig(window=4),
        "m",
        Column(one, np.zeros(8, np.int64), np.zeros(8, np.int64)),
    )
