"""Calibrated anomaly scores: a detector's raw score turned into its rarity on its own series.

A detector's raw score (a robust z-score, a ratio to a forecast band, ...) means different things
on different series: on a heavy-tailed series (a gradient norm) large raw scores are common, on a
smooth one (a loss curve) rare. Each series keeps a peaks-over-threshold model of its own recent
raw scores and reports the tail probability of each new one:

* ``u``, the running ``q``-quantile of the raw scores (``q`` = 0.95), and the excesses over it
  modelled by a generalized Pareto law (the law that excesses over a high threshold follow for
  most distributions), its shape ``xi`` and scale ``beta`` from the first two moments of the
  recent excesses (``xi`` kept in [0, ``xi_max``]: a heavy tail is followed, a light one is read
  as exponential, which overstates its tail and so errs towards fewer alerts);
* ``P(R >= r) = (1 - q) * (1 + xi (r - u) / beta) ** (-1 / xi)`` above ``u`` (the exponential
  ``exp(-(r - u) / beta)`` at ``xi`` = 0); below it the probability falls linearly from 1 at 0 to
  ``1 - q`` at ``u`` (the body matters little: alerts live in the tail);
* ``anomaly_score = 1 - P``, in [0, 1].

The model follows the series: ``u`` by a stochastic quantile step of ``eta * beta`` per score, the
moments as exponential moving averages (``alpha``) of the excesses. An extreme score widens the
tail for a while, so an effect that keeps recurring stops looking rare. The first ``warmup``
scores set the model exactly (their quantile and the moments of the excesses) and have no
anomaly score yet (NaN: the series does not know its own noise). A series that has seen ``n``
values does not claim a rarity beyond ``1 / (reach n)`` (``reach`` = 4: 1 in 1,000 after 250
values, 1 in 10,000 after 2,500): a tail estimated from few values, early in a run whose
noise still changes, overstates rarity. The
update is scale-free: scores multiplied by a constant calibrate to the same anomaly scores.

Measured on synthetic series (``tests/stream_jobs/test_calibration.py``): the share of values
scoring 0.99 and above is 0.78-1.05 % on half-normal, exponential, log-normal and Pareto tails;
at 0.9999 it is 0.2-0.8 times the nominal 0.01 % on light tails and 2.3-3.7 times on heavy ones.

What a score means: 0.99, a raw score this large comes about once in 100 values of this series
(recently); 0.9999, about once in 10,000: at one value per step, once in 10,000 steps. A NaN (the
detector has no score yet) has none. A value that stands for ``w`` steps (``weights``: the mean
of a logging interval, as the Hugging Face Trainer logs its loss every ``logging_steps``) is
scored in steps: its tail probability, and the rarity the values seen can claim,
divided by ``w`` (once in 100 means of 10 steps is once in 1,000 steps), so a series logged
every 10 steps reaches a rarity of 1 in 1,000 steps after 25 values, not 250.

An infinite raw score is a *saturated* one: the detector's noise scale sits at its floor (a
series idle most of the time, whose bursts are infinitely many of its zero noise away: disk or
network bytes, request counts). It is rarer than any finite score, and as rare as saturation is
on this series: the series keeps the share ``sat`` of its values that saturated (a running mean
over its last ``horizon`` values), a saturated score's tail probability is ``max(sat, 1 / (reach
n))`` and a finite score's ``sat + (1 - sat) P``. A series whose bursts are routine learns them
(2 % of values bursting: 0.98, no alert); the first burst after a long quiet stretch is still as
rare as the series can tell. Non-finite *values* never get here (they are signals of their own).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numba
import numpy as np

_jit = numba.njit(cache=True, error_model="numpy")


@dataclass(frozen=True)
class CalibrationConfig:
    q: float = 0.95  # the threshold quantile of the tail model
    warmup: int = 64  # raw scores before the first calibrated one
    eta: float = 0.05  # quantile step, in units of beta
    alpha: float = 0.02  # EMA weight of the excesses' moments
    xi_max: float = 0.45  # the heaviest tail followed (the moments need xi < 0.5)
    reach: float = 4.0  # rarity claimed at most 1 in ``reach`` x the values seen
    horizon: int = 4096  # values over which the share of saturated scores is kept


@dataclass
class CalibrationState:
    u: float = 0.0
    m1: float = 0.0  # mean excess over u
    m2: float = 0.0  # mean squared excess
    seen: int = 0  # finite raw scores learnt
    warm: np.ndarray = field(default_factory=lambda: np.empty(0))  # the first ``warmup``
    sat: float = 0.0  # share of saturated (infinite) raw scores among the last ``horizon``
    counted: int = 0  # raw scores in ``sat`` (at most ``horizon``)


def calibrate(
    state: CalibrationState,
    cfg: CalibrationConfig,
    raw: np.ndarray,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """The anomaly scores of ``raw`` (one series' new raw scores, in order); learns them.
    ``weights``: the steps each value stands for (None: one each)."""
    if len(state.warm) < cfg.warmup and state.seen < cfg.warmup:
        warm = np.empty(cfg.warmup)
        warm[: len(state.warm)] = state.warm
        state.warm = warm
    raw = np.asarray(raw, dtype=float)
    out, u, m1, m2, seen, sat, counted = _calibrate(
        raw,
        np.ones(len(raw)) if weights is None else np.asarray(weights, dtype=float),
        state.warm,
        float(state.u),
        float(state.m1),
        float(state.m2),
        int(state.seen),
        float(state.sat),
        int(state.counted),
        float(cfg.q),
        int(cfg.warmup),
        float(cfg.eta),
        float(cfg.alpha),
        float(cfg.xi_max),
        float(cfg.reach),
        int(cfg.horizon),
    )
    state.u, state.m1, state.m2, state.seen = u, m1, m2, seen
    state.sat, state.counted = sat, counted
    if seen >= cfg.warmup:
        state.warm = np.empty(0)  # only needed until the model is set
    else:
        state.warm = state.warm[:seen].copy()
    return out


@_jit
def _calibrate(  # noqa: PLR0917
    raw: np.ndarray,
    weights: np.ndarray,
    warm: np.ndarray,
    u: float,
    m1: float,
    m2: float,
    seen: int,
    sat: float,
    counted: int,
    q: float,
    warmup: int,
    eta: float,
    alpha: float,
    xi_max: float,
    reach: float,
    horizon: int,
) -> tuple[np.ndarray, float, float, float, int, float, int]:
    out = np.zeros(len(raw))
    tail = 1.0 - q
    for i in range(len(raw)):
        r = raw[i]
        if math.isnan(r) or r == -math.inf:
            out[i] = math.nan  # no score
            continue
        saturated = r == math.inf
        if saturated:
            # as rare as saturation on this series, then learnt into its share
            floor = 1.0 / (reach * (seen + 1))
            out[i] = 1.0 - max(sat, floor) / weights[i] if seen >= warmup else math.nan
            counted = min(counted + 1, horizon)
            sat += (1.0 - sat) / counted
            continue
        counted = min(counted + 1, horizon)
        sat -= sat / counted
        r = max(r, 0.0)
        if seen < warmup:
            warm[seen] = r
            seen += 1
            if seen == warmup:
                u, m1, m2 = _fit(warm[:warmup], q)
            out[i] = math.nan
            continue
        xi, beta = _shape(m1, m2, xi_max)
        if r > u:
            if xi > 0.0:
                p = tail * (1.0 + xi * (r - u) / beta) ** (-1.0 / xi)
            else:
                p = tail * math.exp(-(r - u) / beta)
        elif u > 0.0:
            p = 1.0 - q * r / u
        else:
            p = 1.0
        p = sat + (1.0 - sat) * p  # a saturated score is more extreme than any finite one
        floor = 1.0 / (reach * (seen + 1))  # no rarer than the values seen can tell
        out[i] = 1.0 - max(p, floor) / weights[i]  # in steps (``weights``)
        u += eta * beta * ((1.0 if r > u else 0.0) - tail)
        u = max(u, 0.0)  # raw scores are >= 0: a series of zeros keeps u at 0
        if r > u:
            e = r - u
            m1 += alpha * (e - m1)
            m2 += alpha * (e * e - m2)
        seen += 1
    return out, u, m1, m2, seen, sat, counted


@_jit
def _shape(m1: float, m2: float, xi_max: float) -> tuple[float, float]:
    """The generalized Pareto shape and scale of excesses with mean ``m1`` and mean square
    ``m2`` (method of moments: mean = beta / (1 - xi), variance = mean^2 / (1 - 2 xi))."""
    var = m2 - m1 * m1
    xi = 0.5 * (1.0 - m1 * m1 / var) if var > 0.0 else 0.0
    xi = max(xi, 0.0)
    xi = min(xi, xi_max)
    beta = m1 * (1.0 - xi)
    if not beta > 0.0:
        beta = _TINY
    return xi, beta


_TINY = 2.2250738585072014e-308


@_jit
def _fit(values: np.ndarray, q: float) -> tuple[float, float, float]:
    """The ``q``-quantile of ``values`` and the first two moments of the excesses over it (an
    exponential tail of a tenth of the quantile when none is above)."""
    s = np.sort(values)
    u = s[int(q * (len(s) - 1))]
    m1 = m2 = 0.0
    n = 0
    for x in s:
        if x > u:
            m1 += x - u
            m2 += (x - u) * (x - u)
            n += 1
    if n:
        return u, m1 / n, m2 / n
    m1 = 0.1 * u
    return u, m1, 2.0 * m1 * m1


def warm_up() -> None:
    """Compile the kernel, or load it from the cache."""
    calibrate(CalibrationState(), CalibrationConfig(warmup=2), np.ones(4))
