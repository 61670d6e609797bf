"""Gradient clipping rate: the share of the last ``window`` watched steps whose gradient was
clipped. Clipping now and then is what clipping is for; clipping on most steps means every
update is the clip's, not the gradient's: the lr is too high or the data is wrong.

A step record's ``clipped`` is one value (1 or 0); a window's is the share of its watched steps,
``count`` of them. Steps before the declared warmup ends are not counted: gradients of a model
just initialised are large and clipped by design.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from steplens.stream_jobs.engine.core import WARN_SEV, Column, Signals, scores_of
from steplens.stream_jobs.engine.signals.kernels import jit
from steplens.stream_jobs.engine.signals.lr_schedule import warmup_end

NAN = math.nan
_EMPTY_I = np.empty(0, np.int64)
_EMPTY_F = np.empty(0)


@dataclass
class ClipConfig:
    window: int = 100  # watched steps the rate is measured over
    min_values: int = 50  # watched steps before the rate is judged
    threshold: float = 0.5  # a rate above this ("most steps") warns


@dataclass
class ClipState:
    counts: np.ndarray = field(default_factory=lambda: _EMPTY_I)  # steps of each value kept
    clipped: np.ndarray = field(default_factory=lambda: _EMPTY_F)  # clipped steps of each
    schedule: dict[str, Any] | None = None  # the run's declared lr schedule (its warmup)


def update(state: ClipState, cfg: ClipConfig, metric: str, col: Column) -> Signals | None:
    """The clipping rate after each value from the end of the declared warmup on."""
    n = len(col.xs)
    counts = np.ones(n, np.int64) if col.counts is None else col.counts
    rates, judged, keep, state.counts, state.clipped = _clipping(
        col.xs,
        counts,
        col.steps,
        state.counts,
        state.clipped,
        warmup_end(state.schedule),
        int(cfg.window),
        int(cfg.min_values),
    )
    if not keep.any():
        return None
    rates, judged = rates[keep], judged[keep]
    threshold = float(cfg.threshold)
    scores = np.where(judged, scores_of(rates / threshold), NAN)
    sev = np.where(judged & (rates > threshold), WARN_SEV, 0).astype(np.int8)
    limit = np.where(judged, threshold, NAN)  # expected and upper bound alike
    return Signals.of(
        "clipping",
        metric,
        col.rows[keep],
        col.steps[keep],
        rates,
        scores,
        sev,
        limit,
        None,
        limit,
        col.rank,
    )


@jit
def _clipping(  # noqa: PLR0917
    xs: np.ndarray,
    counts: np.ndarray,
    steps: np.ndarray,
    kept_counts: np.ndarray,
    kept_clipped: np.ndarray,
    warm: int,
    window: int,
    min_values: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rate after each value (a share ``xs[i]`` of ``counts[i]`` steps) over the values
    kept (oldest first; the oldest dropped while the others still cover ``window`` steps);
    values at steps before ``warm`` are skipped. Returns (rates, judged, counted, the kept
    counts and clipped steps)."""
    m = len(xs)
    nk = len(kept_counts)
    cs = np.empty(nk + m, np.int64)
    cl = np.empty(nk + m)
    cs[:nk] = kept_counts
    cl[:nk] = kept_clipped
    head, end = 0, nk
    total_c = 0
    for j in range(nk):
        total_c += cs[j]
    rates = np.zeros(m)
    judged = np.zeros(m, np.bool_)
    keep = np.zeros(m, np.bool_)
    for i in range(m):
        c = counts[i]
        if steps[i] < warm or c <= 0:
            continue
        keep[i] = True
        x = min(max(xs[i], 0.0), 1.0) * c
        cs[end] = c
        cl[end] = x
        end += 1
        total_c += c
        while end - head > 1 and total_c - cs[head] >= window:
            total_c -= cs[head]
            head += 1
        total_x = 0.0  # summed afresh, oldest first: no drift over a long run
        for j in range(head, end):
            total_x += cl[j]
        rates[i] = total_x / total_c
        judged[i] = total_c >= min_values
    return rates, judged, keep, cs[head:end].copy(), cl[head:end].copy()


def warm_up_kernel() -> None:
    one = np.ones(4)
    update(ClipState(), ClipConfig(), "clipped", Column(one, np.arange(4), np.zeros(4, np.int64)))
