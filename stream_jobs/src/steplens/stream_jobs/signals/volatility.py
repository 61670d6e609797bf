"""Loss volatility: noise of the last ``window`` values relative to their mean.

The noise is the standard deviation of first differences divided by sqrt(2): on a steadily
falling loss it measures the jitter, not the trend. Kept with running sums, O(1) per value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from steplens.producer.schema import RUN_RANK
from steplens.stream_jobs.core import Column, Signals
from steplens.stream_jobs.policy import Policy
from steplens.stream_jobs.signals.kernels import jit, score

NAN = math.nan
_EMPTY = np.empty(0)


@dataclass
class VolatilityConfig:
    window: int = 50
    threshold: float = 0.10  # relative noise above this warns
    abs_floor: float = 1e-3  # |mean| below this is treated as this (near-zero losses)
    policy: Policy | None = None  # None: the design's anchor, relative noise over threshold

    def __post_init__(self) -> None:
        if self.policy is None:
            self.policy = Policy(rarity=None, measure="value", warning=self.threshold)


@dataclass
class VolatilityState:
    values: np.ndarray = field(default_factory=lambda: _EMPTY)  # the window, oldest first
    diffs: np.ndarray = field(default_factory=lambda: _EMPTY)  # its differences
    sums: np.ndarray = field(default_factory=lambda: np.zeros(3))  # of values, diffs, diffs²


def update(state: VolatilityState, cfg: VolatilityConfig, metric: str, col: Column) -> Signals:
    """The relative noise after each value (0, without a score, until the window is full).
    The signals are of the run (rank -1): the series is one rank's, the scope the run's."""
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
