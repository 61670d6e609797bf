"""The per-value reference of the package's compiled spike detector (its code before the
columnar rewrite): the property tests hold the package equal to it, value by value."""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import repeat
from operator import sub

from steplens.stream_jobs.engine.core import CRITICAL, Signal, score_of
from steplens.stream_jobs.engine.signals.spike import SpikeConfig

isfinite = math.isfinite
_INF = math.inf


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
    if mad_diff == 0.0:  # most differences 0: their mean absolute deviation, as a MAD
        total = 0.0
        for d in sorted(diffs):
            total += abs(d - mid)
        mad_diff = total / len(diffs) * (math.sqrt(math.pi / 2) / 1.4826) / math.sqrt(2.0)
    if cfg.trend_tolerant is False:
        # the smaller is the noise when the series trends, the larger when it is heavy-tailed
        # around a level; a spike must clear both to matter
        level = ordered[len(ordered) // 2]
        mad_level = _median(list(map(abs, map(sub, values, repeat(level)))))
        return 1.4826 * max(mad_diff, mad_level)
    return 1.4826 * mad_diff


def update(
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
        med = _median(list(values)) if n else None
        sig = Signal("spike", metric, step, probe, math.nan, rank, expected=med)
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


def _score(
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
    if floor > scale:
        scale = floor
    floor = cfg.abs_floor
    if floor > scale:
        scale = floor
    dev = probe - med
    up = cfg.direction == "up"
    if not up:
        dev = abs(dev)
    z_cfg = cfg.z
    band = z_cfg * scale
    r = dev / band
    score = r / (r + 1.0) if 0.0 < r < _INF else score_of(r)
    return Signal(
        "spike", metric, step, probe, score, rank, "run", None, med, med - band, med + band
    )
