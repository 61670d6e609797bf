"""Spikes and non-finite values against a robust recent baseline.

The baseline is the median of the last ``window`` finite values; the noise scale is the MAD of
their first differences (insensitive to a trend, so drifting series do not look like spikes),
floored relative to the baseline and absolutely so constant series stay quiet. Two rules:

* robust z-score ``(x - median) / scale`` at or above ``z`` warns, at ``2 z`` is critical;
* a jump of ``ratio`` x the baseline is critical, but only when the baseline is clearly away from
  zero (``|median| > near_zero`` and more than 3 noise scales), where a ratio means something.

A non-finite value is a ``nonfinite`` signal, critical at once.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import sub

import numpy as np

from steplens.stream_jobs.core import CRITICAL, WARNING, Signal, SignalRun, score_of
from steplens.stream_jobs.signals import kernels

isfinite = math.isfinite
_INF = math.inf


@dataclass
class SpikeConfig:
    window: int = 64
    warmup: int = 16
    z: float = 7.0  # llm.c skips a step at z > 7 over its last 128 values
    ratio: float = 10.0
    direction: str = "up"  # "up" (loss, grad norm) or "both"
    min_rel_change: float = 0.1  # a z-breach must also move this share of |median|
    rel_floor: float = 1e-3  # scale >= rel_floor * |median|
    abs_floor: float = 1e-12
    near_zero: float = 1e-8
    rescale_every: int = 16
    trend_tolerant: bool = True  # noise from differences only (series that drift, like loss)


@dataclass
class SpikeState:
    values: deque[float] = field(default_factory=deque)
    ordered: list[float] = field(default_factory=list)
    diffs: deque[float] = field(default_factory=deque)
    scale: float = 0.0
    since_rescale: int = 0
    last: float | None = None


def _median(values: list[float]) -> float:
    """Median of ``values`` (sorted here), as ``statistics.median`` computes it."""
    values.sort()
    n = len(values)
    i = n // 2
    return values[i] if n % 2 else (values[i - 1] + values[i]) / 2


def _rescale(state: SpikeState, cfg: SpikeConfig) -> None:
    if len(state.diffs) < 4:
        state.scale = 0.0
        return
    state.scale = _scale_of(list(state.diffs), state.values, state.ordered, cfg)
    state.since_rescale = 0


def _scale_of(
    diffs: list[float], values: Iterable[float], ordered: list[float], cfg: SpikeConfig
) -> float:
    """The noise scale of ``diffs`` (at least 4; sorted here), with ``values`` and their sorted
    copy ``ordered`` for the level's MAD when ``trend_tolerant`` is off."""
    mid = _median(diffs)
    mad_diff = _median(list(map(abs, map(sub, diffs, repeat(mid))))) / math.sqrt(2.0)
    if cfg.trend_tolerant is False:
        # the smaller is the noise when the series trends, the larger when it is heavy-tailed
        # around a level; a spike must clear both to matter
        level = ordered[len(ordered) // 2]
        mad_level = _median(list(map(abs, map(sub, values, repeat(level)))))
        return 1.4826 * max(mad_diff, mad_level)
    return 1.4826 * mad_diff


def update(  # noqa: PLR0917
    state: SpikeState,
    cfg: SpikeConfig,
    metric: str,
    x: float,
    step: int | None,
    rank: int = -1,
    peak: float | None = None,
) -> tuple[SpikeState, list[Signal]]:
    """Score ``x`` (or ``peak``, a window's extreme) against the baseline, then learn ``x``."""
    probe = x if peak is None else peak
    if not (isfinite(x) and (peak is None or isfinite(peak))):
        bad = probe if not isfinite(probe) else x
        sig = Signal("nonfinite", metric, step, bad, 1.0, rank, severity=CRITICAL)
        return state, [sig]
    values, ordered = state.values, state.ordered
    n = len(values)
    if n < cfg.warmup:
        sig = Signal("spike", metric, step, probe, 0.0, rank)
    else:
        sig = _score(state, cfg, metric, probe, step, rank)
    # learn x
    window = cfg.window
    last = state.last
    if last is not None:
        diffs = state.diffs
        diffs.append(x - last)
        if len(diffs) > window:
            diffs.popleft()
    state.last = x
    values.append(x)
    insort(ordered, x)
    if len(values) > window:
        del ordered[bisect_left(ordered, values.popleft())]
    since = state.since_rescale = state.since_rescale + 1
    if since >= cfg.rescale_every or state.scale == 0.0:
        _rescale(state, cfg)
    return state, [sig]


def _score(  # noqa: PLR0917
    state: SpikeState, cfg: SpikeConfig, metric: str, probe: float, step: int | None, rank: int
) -> Signal:
    """``probe`` against the robust baseline of the values learnt so far."""
    ordered = state.ordered
    n = len(ordered)
    h = n // 2
    med = ordered[h] if n % 2 else 0.5 * (ordered[h - 1] + ordered[h])
    amed = abs(med)
    # max(scale, rel_floor * |median|, abs_floor), compared as max() compares
    scale = state.scale
    floor = cfg.rel_floor * amed
    if floor > scale:  # noqa: PLR1730 (no call on the hot path)
        scale = floor
    floor = cfg.abs_floor
    if floor > scale:  # noqa: PLR1730
        scale = floor
    dev = probe - med
    up = cfg.direction == "up"
    if not up:
        dev = abs(dev)
    z_cfg = cfg.z
    z = dev / scale
    moved = dev >= cfg.min_rel_change * amed
    severity = None
    if moved and z >= z_cfg:
        severity = CRITICAL if z >= 2.0 * z_cfg else WARNING
    ratio = 0.0
    if amed > cfg.near_zero and amed > 3.0 * scale and probe * med > 0:
        ratio = probe / med if up else max(probe / med, med / probe)
        if ratio >= cfg.ratio:
            severity = CRITICAL
    score = 0.0
    if moved:
        r = z / z_cfg
        score = r / (r + 1.0) if 0.0 < r < _INF else score_of(r)
    if ratio >= 1.0:
        r = ratio / cfg.ratio
        by_ratio = r / (r + 1.0) if 0.0 < r < _INF else score_of(r)
        if by_ratio > score:  # noqa: PLR1730
            score = by_ratio
    band = z_cfg * scale
    return Signal(
        "spike", metric, step, probe, score, rank, "run", severity, med, med - band, med + band
    )


def update_many(  # noqa: PLR0917
    state: SpikeState,
    cfg: SpikeConfig,
    metric: str,
    xs: Sequence[float],
    steps: Sequence[int | None],
    rank: int = -1,
) -> SignalRun:
    """``update`` over consecutive finite values: their signals as columns, the same as calling
    ``update`` per value. Once the baseline window is full the scores are computed with numpy
    over the whole batch (the same elements and arithmetic, so the same floats)."""
    run = SignalRun("spike", metric, rank)
    window = cfg.window
    i, n = 0, len(xs)
    scalar = window < 4 or cfg.warmup > window  # a baseline that never warms up, or too short
    while i < n and (scalar or len(state.values) < window or len(state.diffs) < window):
        run.add(update(state, cfg, metric, xs[i], steps[i], rank)[1][0])
        i += 1
    if i < n:
        _score_full(state, cfg, run, xs[i:] if i else xs, steps[i:] if i else steps)
    return run


def _score_full(
    state: SpikeState,
    cfg: SpikeConfig,
    run: SignalRun,
    xl: Sequence[float],
    steps: Sequence[int | None],
) -> None:
    """``update_many`` once ``state`` holds a full window of values and of differences: the
    compiled loop over the batch (``kernels.spike_full``)."""
    w = cfg.window
    fl = np.array([*state.values, *xl], dtype=float)  # before x_i the baseline is fl[i : i + w]
    scores, sev, meds, lower, upper, ordered, dl, scale, since = kernels.spike_full(
        fl,
        np.array(state.diffs, dtype=float),
        np.array(state.ordered, dtype=float),
        float(state.scale),
        int(state.since_rescale),
        int(cfg.rescale_every),
        cfg.trend_tolerant is not False,
        cfg.direction == "up",
        float(cfg.z),
        float(cfg.ratio),
        float(cfg.min_rel_change),
        float(cfg.rel_floor),
        float(cfg.abs_floor),
        float(cfg.near_zero),
    )
    run.extend(
        steps,
        list(xl),
        scores.tolist(),
        kernels.severities(sev),
        meds.tolist(),
        lower.tolist(),
        upper.tolist(),
    )
    # the state after learning the batch, as update leaves it
    state.values = deque(fl[-w:].tolist())
    state.diffs = deque(dl[-w:].tolist())
    state.ordered = ordered.tolist()
    state.scale, state.since_rescale = scale, since
    state.last = xl[-1]
