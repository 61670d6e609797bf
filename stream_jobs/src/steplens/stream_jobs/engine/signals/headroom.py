"""Headroom: how soon a series that drifts toward a limit will reach it.

A slow drift (GPU memory creeping up with a leak, a temperature rising as cooling fails) is
invisible to spike and forecast detectors: every value is close to the one before. What matters
is when the drift reaches the limit. Over a window of recent samples:

* the rate is the Theil-Sen slope (the median of the pairwise slopes: robust to outliers and to
  the noise around the trend) with its ``confidence`` interval (``theil_sen`` below);
* the level is the fitted line at the latest sample, the time to the limit ``(limit - level) /
  slope``.

The drift breaches when the limit is reached within ``horizon_s`` even at the slope's lower
bound (a rise that noise cannot explain, fast enough to matter) and the latest value is still
below the limit (at the limit, the static threshold speaks). Its score rises as the time left
at the fitted slope shrinks: 0.5 at ``horizon_s``.

A leak often starts in the middle of the window, after a flat stretch: the median of the
pairwise slopes stays near 0 until the rise holds about half the window. So the trailing
``min_samples``, twice as many, and so on up to the window are each judged, and the first
that breaches speaks (the shorter ones with a wider interval, ``confidence_short``: several
are judged at once, and a short stretch is noisier, so only a clear rise breaches there).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

# The Theil-Sen line of a short series with Sen's (1968) confidence interval of its slope.
#
# The same estimator as ``scipy.stats.theilslopes`` (the median of the pairwise slopes, the
# intercept ``median(y) - slope * median(x)``, the interval's order statistics from Sen's
# equation 2.6 with its tie correction), written with numpy alone: the drift detectors fit it
# on every hardware sample of every GPU, and scipy's argument handling (its ``nan_policy``
# wrapper, a distribution object's ``ppf``) costs about ten times the arithmetic on windows
# of 20 to 120 samples. tests/stream_jobs/signals/test_theil_sen.py holds it to scipy.


class Line(NamedTuple):
    slope: float
    intercept: float
    low: float  # the slope's confidence interval (NaN: fewer than two distinct x)
    high: float


@lru_cache(maxsize=16)
def _z(confidence: float) -> float:
    alpha = 1.0 - confidence if confidence > 0.5 else confidence
    return NormalDist().inv_cdf(alpha / 2.0)


def _ties(values: np.ndarray) -> float:
    """Sen's tie correction: sum of k(k-1)(2k+5) over each value repeated k > 1 times."""
    s = np.sort(values)
    bounds = np.concatenate(([-1], np.flatnonzero(s[1:] != s[:-1]), [s.size - 1]))
    k = (bounds[1:] - bounds[:-1]).astype(float)
    return float(k @ ((k - 1) * (2 * k + 5)))


def _median(values: np.ndarray) -> float:
    n = values.size
    part = np.partition(values, [(n - 1) // 2, n // 2])
    return float((part[(n - 1) // 2] + part[n // 2]) / 2.0)


def theil_sen(x: np.ndarray, y: np.ndarray, confidence: float = 0.95) -> Line:
    """The line through ``(x, y)`` (at least two points; x not all equal)."""
    dx = x[:, None] - x
    dy = y[:, None] - y
    pos = dx > 0
    slopes = dy[pos] / dx[pos]
    nt = slopes.size
    if nt == 0:
        return Line(math.nan, math.nan, math.nan, math.nan)
    n = y.size
    var = (n * (n - 1) * (2 * n + 5) - _ties(x) - _ties(y)) / 18.0
    mid = nt // 2
    kth = {mid, max(mid - 1, 0)}
    if var >= 0:  # ties in both x and y can leave no interval (NaN, as scipy's)
        z, sigma = _z(confidence), math.sqrt(var)
        upper = min(round((nt - z * sigma) / 2.0), nt - 1)
        lower = max(round((nt + z * sigma) / 2.0) - 1, 0)
        kth |= {lower, upper}
    part = np.partition(slopes, sorted(kth))
    slope = float(part[mid]) if nt % 2 else float((part[mid - 1] + part[mid]) / 2.0)
    intercept = _median(y) - slope * _median(x)
    if var < 0:
        return Line(slope, intercept, math.nan, math.nan)
    return Line(slope, intercept, float(part[lower]), float(part[upper]))


@dataclass(frozen=True)
class HeadroomConfig:
    window: int = 120  # samples in the trend (20 minutes of 10 s samples)
    min_samples: int = 20  # before any verdict
    horizon_s: float = 1800.0  # warn when the limit is this close (30 minutes)
    confidence: float = 0.95  # of the slope's interval
    # of a shorter trailing stretch's: several are judged at once, and a short one is noisier
    confidence_short: float = 0.999
    # a drift is judged at the first kept sample in each span of this many seconds
    # (``judged_at``; samples further apart: each of them): a fit of the window's
    # stretches costs about 0.25 ms, paid by every GPU and rank, and a drift that reaches its
    # limit within ``horizon_s`` is seen as well 30 s later
    judge_every_s: float = 30.0


@dataclass(frozen=True)
class Headroom:
    slope: float  # units per second (NaN: too few samples)
    seconds_left: float  # until the limit at that slope (inf: not rising)
    score: float  # 0.5 at ``horizon_s`` left, toward 1 as it shrinks
    breach: bool


NONE = Headroom(math.nan, math.inf, 0.0, False)
FLAT = Headroom(0.0, math.inf, 0.0, False)  # what the fit of a flat stretch gives


def judged_at(cfg: HeadroomConfig, series: str, now_s: float, before_s: float | None) -> bool:
    """Whether a sample of ``series`` kept at ``now_s`` (the one kept before it at
    ``before_s``; None: none, judged) is judged: the first kept in each span of
    ``judge_every_s``.
    Each series' spans start at a phase of its own (from its name), so a fleet's drifts are
    judged spread over the span, not all at once; samples a span or more apart (a rank that
    reports every 30 s) are each judged; and whether a sample is judged depends on the kept
    samples' times alone, so a restored detector judges the samples a never-stopped one does."""
    if before_s is None:
        return True
    every = cfg.judge_every_s
    phase = every * (zlib.crc32(series.encode()) % 1024) / 1024
    return (now_s + phase) // every != (before_s + phase) // every


def headroom(
    cfg: HeadroomConfig, times_s: np.ndarray, values: np.ndarray, limit: float
) -> Headroom:
    """The drift of ``values`` (at ``times_s``, oldest first) toward ``limit`` (an upper one):
    that of the shortest trailing stretch that breaches, else of them all."""
    ok = np.isfinite(times_s) & np.isfinite(values)
    t, x = np.asarray(times_s, float)[ok], np.asarray(values, float)[ok]
    n = cfg.min_samples if _may_breach(cfg, t, x, limit) else len(t)
    while n < len(t):
        h = _fit(cfg, t[-n:], x[-n:], limit, cfg.confidence_short)
        if h.breach:
            return h
        n *= 2
    return _fit(cfg, t, x, limit, cfg.confidence)


def _may_breach(cfg: HeadroomConfig, t: np.ndarray, x: np.ndarray, limit: float) -> bool:
    """False when no stretch of ``(t, x)`` can breach, so that only the whole window's fit is
    made (the result is the same: the shorter stretches are judged only for a breach). A
    stretch breaches only when ``limit - level <= low * horizon_s``, with ``low <= slope``, the
    slope at most the steepest pairwise slope ``S`` (at most ``ptp(x)`` over the closest two
    times), and the level (the line at the last time: ``median(x) + slope * (t[-1] -
    median(t))``) at most ``max(x) + S * ptp(t)``: so never when ``limit > max(x) + S *
    (ptp(t) + horizon_s)``. A process's memory far below its host's is judged this way: a
    window's stretches cost about half of its fits."""
    if len(t) <= cfg.min_samples:
        return True  # no shorter stretch is judged
    gaps = np.diff(t)
    closest = gaps.min()
    if not closest > 0:
        return True  # times not in order: judged in full
    top = x.max()
    steepest = (top - x.min()) / closest
    # a margin for rounding: near the bound every stretch is judged
    return not limit - top > steepest * (t[-1] - t[0] + cfg.horizon_s) * (1 + 1e-6)


def _fit(
    cfg: HeadroomConfig, t: np.ndarray, x: np.ndarray, limit: float, confidence: float
) -> Headroom:
    if len(t) < cfg.min_samples or not np.ptp(t) > 0:
        return NONE
    if not np.ptp(x) > 0:  # flat (a steady allocator's mark): every pairwise slope is 0
        return FLAT
    slope, intercept, low, _ = theil_sen(t, x, confidence)
    level = intercept + slope * t[-1]
    if not (slope > 0 and math.isfinite(slope)):
        return Headroom(float(slope), math.inf, 0.0, False)
    left = max((limit - level) / slope, 0.0)
    score = cfg.horizon_s / (cfg.horizon_s + left)
    breach = bool(low > 0 and x[-1] < limit and (limit - level) / low <= cfg.horizon_s)
    return Headroom(float(slope), float(left), float(score), breach)
