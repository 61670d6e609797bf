"""Spikes against a robust recent baseline.

The baseline is the median of the last ``window`` finite values; the noise scale is the MAD of
their first differences (insensitive to a trend, so drifting series do not look like spikes),
or, when most differences are 0 (a quantized series, one mostly idle), their mean absolute
deviation, so a one-quantum step is not a spike; floored relative to the baseline and
absolutely so constant series stay quiet. The score rises
with the robust z-score ``(x - median) / scale`` (0.5 at ``z``, the band ``median +- z
scale``); with ``direction`` "up" only rises score. Whether a spike alerts, and how severely, is
the alert policy's call (``policy``): the score's rarity on its series, and the rise (or ratio)
over the median, where the design's anchors live (a gradient norm 10x its baseline).

A loss logged every N steps as the mean of those steps (the Hugging Face Trainer's
``logging_steps``) has the averaged noise of its own points, and its rarity is counted in steps
(``Policy.per_step``): a +25 % jump after 80 such points is as rare as it is, not capped at 1 in
320 values, and separates from a +2 % wobble by its rise.

A window's peak is the largest of its steps, never their mean: it is expected where the
largest of that many steps lands, the baseline plus the expected maximum of ``count`` normal
draws (Blom's approximation) times the window's own spread of its other steps (the peak left
out, so a bad batch does not widen its own band). A healthy window's peak then sits on its
expectation, and the magnitude the policy weighs is how far it stands above it. A step sent
between windows (a guard's outlier, a sample) is one step, its noise at least the spread of a
step its last window sent: a raw step 15 % up on a series whose steps wander 7 % is inside it.

Non-finite values never get here: the detector turns them into ``nonfinite`` signals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import NormalDist

import numpy as np

from steplens.stream_jobs.engine.core import NO_STEP, Column, Signals
from steplens.stream_jobs.engine.policy import Policy
from steplens.stream_jobs.engine.signals.kernels import (
    _insert,
    _mad_sorted,
    _median_sorted,
    _remove,
    jit,
    score,
)

NAN = math.nan
_EMPTY = np.empty(0)
_MEAN_ABS_TO_MAD = math.sqrt(math.pi / 2) / 1.4826  # both then scaled by 1.4826 to a sigma
_NORMAL = NormalDist()


@dataclass
class SpikeConfig:
    window: int = 64
    warmup: int = 16
    z: float = 7.0  # the band's half-width in noise scales (llm.c skips a step at z > 7)
    direction: str = "up"  # "up" (loss, grad norm) or "both"
    rel_floor: float = 1e-3  # scale >= rel_floor * |median|
    abs_floor: float = 1e-12
    rescale_every: int = 16
    trend_tolerant: bool = True  # noise from differences only (series that drift, like loss)
    # a loss spike: rarer than 1 in 1,000 values of its series and 10 % above the baseline
    # warns; 8 % warns when the next value is still rarely high (2 % up); one value 8-10 % up,
    # back at the next, is a hard batch: a note (it names its batch, and correlates with a
    # gradient jump); 50 % above is critical (a corrupted batch); a rare rise of 2 % is a
    # note; before the series knows its noise, 15 % warns
    policy: Policy = field(
        default_factory=lambda: Policy(
            rarity=0.999,
            measure="rise",
            warning=0.08,
            critical=0.5,
            persist=2,
            at_once=0.10,
            held=0.02,
            note=0.02,
            cold_warning=0.15,
            cold_critical=0.5,
            per_step=True,  # a loss logged as a mean over steps is as rare per step
            band=0.5,  # and outside the band of 7 noise scales
        )
    )


@dataclass
class SpikeState:
    values: np.ndarray = field(default_factory=lambda: _EMPTY)  # the window, oldest first
    diffs: np.ndarray = field(default_factory=lambda: _EMPTY)  # its differences
    ordered: np.ndarray = field(default_factory=lambda: _EMPTY)  # the window sorted
    scale: float = 0.0
    since_rescale: int = 0
    first_step: int | None = None  # the earliest step its values cover (None: no value yet)
    step_spread: float = 0.0  # the spread of a step of its last window (0: none)


def update(state: SpikeState, cfg: SpikeConfig, metric: str, col: Column) -> Signals:
    """Score each value (or its probe, a window's peak) against the baseline, then learn it.

    A window's peak may lie at any of its steps, so it is probed only against a baseline that
    holds a value from before the window's first step; otherwise (the run's first window, whose
    peak is usually its initial loss) the window is scored by its mean, as a step, unless the
    baseline already holds values of its steps (step records sent raw inside it): the mean of
    a window over a falling loss is above those values without anything happening, so it is
    learnt, not judged."""
    probes = col.probes
    known = state.first_step
    covered = None  # windows over steps the baseline already holds
    if col.firsts is not None:
        if probes is not None and (known is None or int(col.firsts[0]) <= known):
            probes = None
        if known is not None:
            covered = col.firsts <= known
    steps = col.steps[col.steps != NO_STEP]
    if len(steps):
        low = int(steps.min()) if col.firsts is None else int(col.firsts.min())
        state.first_step = low if state.first_step is None else min(state.first_step, low)
    lifts = np.zeros(len(col.xs)) if probes is None else peak_lifts(col, probes)
    floors = np.zeros(len(col.xs))
    if col.spreads is None:
        floors[:] = state.step_spread  # steps of a windowed series: a step's own noise
    elif math.isfinite(float(col.spreads[-1])):
        state.step_spread = float(col.spreads[-1])
    out, values, diffs, ordered, scale, since = _spike(
        col.xs if probes is None else probes,
        lifts,
        floors,
        col.xs,
        state.values,
        state.diffs,
        state.ordered,
        float(state.scale),
        int(state.since_rescale),
        int(cfg.window),
        int(cfg.warmup),
        int(cfg.rescale_every),
        cfg.trend_tolerant is not False,
        cfg.direction == "up",
        float(cfg.z),
        float(cfg.rel_floor),
        float(cfg.abs_floor),
    )
    state.values, state.diffs, state.ordered = values, diffs, ordered
    state.scale, state.since_rescale = scale, since
    if covered is not None and covered.any():
        out[:, covered] = NAN  # no score, nothing expected: never a breach
    return Signals(
        "spike",
        metric,
        col.rows,
        col.steps,
        col.xs if probes is None else probes,
        out[0],
        np.zeros(len(col.xs), np.int8),
        out[1],
        out[2],
        out[3],
        col.rank,
    )


@lru_cache(maxsize=256)
def expected_max(n: int) -> float:
    """The expected largest of ``n`` standard normal draws (Blom: 2.51 for 100)."""
    if n < 2:
        return 0.0
    return _NORMAL.inv_cdf((n - 0.375) / (n + 0.25))


def peak_lifts(col: Column, probes: np.ndarray) -> np.ndarray:
    """How far above the baseline each window's peak is expected: the expected largest of its
    ``count`` steps times the spread of its steps without the peak (0 where the window sent no
    spread). The window's values are its mean ``xs`` and population ``spreads``."""
    lifts = np.zeros(len(probes))
    if col.spreads is None or col.counts is None:
        return lifts
    for i in range(len(probes)):
        n, std, mean, peak = int(col.counts[i]), float(col.spreads[i]), col.xs[i], probes[i]
        if n < 3 or not math.isfinite(std):
            continue
        # the sums of the window's steps, then of the others than its peak
        total, squares = n * mean, n * (std * std + mean * mean)
        rest = total - peak
        var = (squares - peak * peak - rest * rest / (n - 1)) / (n - 2)
        lifts[i] = expected_max(n) * math.sqrt(max(var, 0.0))
    return lifts


@jit
def _spike(  # noqa: PLR0917
    probes: np.ndarray,
    lifts: np.ndarray,
    floors: np.ndarray,
    xs: np.ndarray,
    values: np.ndarray,
    diffs: np.ndarray,
    ordered: np.ndarray,
    scale: float,
    since: int,
    window: int,
    warmup: int,
    every: int,
    trend_tolerant: bool,
    up: bool,
    z_cfg: float,
    rel_floor: float,
    abs_floor: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, int]:
    """Score each of ``probes`` against the robust baseline (raised by its ``lifts``: where
    a window's peak is expected above it; its noise scale at least its ``floors``), then learn
    the ``xs`` at the same place (a window's mean is learnt, its peak probed). ``values``: the
    window (oldest first, at most ``window``), ``ordered``: it sorted, ``diffs``: its
    differences.

    Returns (rows of scores, medians, lower and upper; the window, its
    differences and the window sorted after the batch; scale, since). Below ``warmup`` values
    a probe has no score (NaN) and its expected value is the median so far (NaN before any
    value)."""
    m = len(xs)
    nv = len(values)
    nd = len(diffs)
    fl = np.empty(nv + m)
    fl[:nv] = values
    fl[nv:] = xs
    dl = np.empty(nd + m)
    dl[:nd] = diffs
    dhead = 0
    dcount = nd
    vhead = 0
    buf = np.empty(window + 2)
    buf[:nv] = ordered
    sd = np.empty(window + 2)
    sd[:nd] = np.sort(diffs)
    out = np.empty((4, m))  # scores, medians, lower, upper
    out[:] = NAN  # no score before the baseline is warm
    root2 = math.sqrt(2.0)
    for i in range(m):
        x = probes[i]
        if nv > 0:
            med = _median_sorted(buf, nv)
            amed = abs(med)
            if lifts[i] != 0.0:  # (a median of -0.0 stays -0.0)
                med += lifts[i]
            out[1, i] = med
        if nv >= warmup or (nv > 0 and floors[i] > 0.0):
            # before ``warmup`` values only a step of a windowed series has a noise scale: the
            # spread of a step its windows sent
            sc = scale if nv >= warmup else 0.0
            floor = rel_floor * amed
            sc = max(sc, floor)
            sc = max(sc, abs_floor)
            if floors[i] > 0.0:
                sc = max(sc, floors[i])
            dev = x - med
            if not up:
                dev = abs(dev)
            band = z_cfg * sc
            out[0, i] = score(dev / band)
            out[2, i] = med - band
            out[3, i] = med + band
        # learn x
        x = xs[i]
        at = vhead + nv  # fl index of x
        if at > 0:
            d = x - fl[at - 1]
            dl[dcount] = d
            dcount += 1
            _insert(sd, nd, d)
            nd += 1
            if nd > window:
                _remove(sd, nd, dl[dhead])
                dhead += 1
                nd -= 1
        _insert(buf, nv, x)
        nv += 1
        if nv > window:
            _remove(buf, nv, fl[vhead])
            vhead += 1
            nv -= 1
        since += 1
        if since >= every or scale == 0.0:
            if nd < 4:
                scale = 0.0
            else:
                mid = _median_sorted(sd, nd)
                scale = _mad_sorted(sd[:nd], mid) / root2
                if scale == 0.0:
                    # most differences are 0 (a quantized or mostly idle series): the mean
                    # absolute deviation still sees the steps (sqrt(pi / 2): its sigma)
                    total = 0.0
                    for k in range(nd):
                        total += abs(sd[k] - mid)
                    scale = total / nd * _MEAN_ABS_TO_MAD / root2
                if not trend_tolerant:
                    # the smaller is the noise when the series trends, the larger when it is
                    # heavy-tailed around a level
                    mad_level = _mad_sorted(buf[:nv], buf[nv // 2])
                    scale = max(scale, mad_level)
                scale *= 1.4826
                since = 0
    return (
        out,
        fl[vhead : vhead + nv].copy(),
        dl[dhead:dcount].copy(),
        buf[:nv].copy(),
        scale,
        since,
    )


def warm_up_kernel() -> None:
    one = np.ones(8)
    update(
        SpikeState(),
        SpikeConfig(window=4, warmup=2),
        "m",
        Column(one, np.zeros(8, np.int64), np.zeros(8, np.int64)),
    )
