"""Optimizer health from watch(): update-ratio collapse and parameter-norm instability.

``param_norm`` is unstable when its spread around the trend of its last ``param_norm_window``
values exceeds ``param_norm_std`` (10 %) of its current value: a steady growth (early
training) or decay (weight decay) is its trend, not a spread.

``update_ratio`` is the share of parameter elements whose update exceeded 1e-3 of their
magnitude in the step (the producer samples the elements); below ``update_share_floor`` (5 %)
for ``update_persist`` values in a row, the optimizer has nearly stopped moving the model (a
broken optimizer state, frozen parameters, an lr that fell off its schedule). Not judged before
the declared warmup ends: a warming lr moves few elements by design.

The share scales with the lr (an Adam update is about the lr in size, so the share of elements
it moves by more than 1e-3 of their size is about proportional to it), so the floor is judged
at the lr the run has now: ``update_share_floor`` x lr(step) / peak lr, from the declared
schedule (``run_meta``), else from the logged lr against its largest value so far. A cosine
schedule that takes the lr to zero at its last step is not paged for its small updates; a
collapse at the peak lr still is.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from steplens.stream_jobs.engine.core import (
    NO_STEP,
    WARN_SEV,
    Column,
    Signals,
    score_of,
    scores_of,
)
from steplens.stream_jobs.engine.signals.lr_schedule import expected_lr, warmup_end

NAN = math.nan


@dataclass
class TrainingConfig:
    update_share_floor: float = 0.05  # share of elements updated by more than 1e-3 of their size
    update_persist: int = 3  # values below the floor in a row before it warns
    param_norm_window: int = 20
    param_norm_std: float = 0.10  # window std above 10 % of the current norm


@dataclass
class TrainingState:
    recent: deque[float] = field(default_factory=deque)  # param_norm's recent values
    below: int = 0  # update_ratio values below the floor in a row
    schedule: dict[str, Any] | None = None  # the run's declared lr schedule (its warmup)
    lr_now: float = NAN  # the logged lr (without a declared schedule)
    lr_peak: float = NAN  # the largest logged lr so far
    # the batch's rows' logged lr as a share of its peak then (``observe_lrs``; not stored)
    row_shares: np.ndarray | None = field(default=None, init=False)


def update(state: TrainingState, cfg: TrainingConfig, metric: str, col: Column) -> Signals | None:
    """``update_ratio`` against its floor, ``param_norm``'s spread over its window."""
    if metric == "update_ratio":
        return _update_share(state, cfg, col)
    at: list[int] = []
    cols: list[list[float]] = [[], [], [], [], []]  # value, score, severity, expected, lower
    for k, x in enumerate(col.xs.tolist()):
        got = _param_norm(state, cfg, x)
        if got is not None:
            at.append(k)
            for c, v in zip(cols, got, strict=True):
                c.append(v)
    if not at:
        return None
    value, score, sev, expected, lower = cols
    return Signals.of(
        "training",
        metric,
        col.rows[at],
        col.steps[at],
        value,
        score,
        np.array(sev, dtype=np.int8),
        expected,
        lower,
        None,
        col.rank,
    )


def observe_lrs(state: TrainingState, xs: np.ndarray | None) -> None:
    """A batch's logged lr by row (NaN: none; None: no lr in the batch), for the update share
    of the same rows (``row_shares``: each row's lr, or the last before it, over the largest
    so far); then the rank's last lr and its peak."""
    if xs is None:
        state.row_shares = None
        return
    ok = np.isfinite(xs) & (xs >= 0)
    now = np.where(ok, xs, np.nan)
    idx = np.where(ok, np.arange(len(xs)), -1)
    np.maximum.accumulate(idx, out=idx)  # the last row with an lr, at or before each
    now = np.where(idx >= 0, now[np.maximum(idx, 0)], state.lr_now)
    peak = np.fmax.accumulate(np.concatenate(([state.lr_peak], np.where(ok, xs, np.nan))))[1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        state.row_shares = np.where(peak > 0, np.minimum(now / peak, 1.0), np.nan)
    if len(xs):
        state.lr_now, state.lr_peak = float(now[-1]), float(peak[-1])


def lr_shares(state: TrainingState, col: Column) -> np.ndarray:
    """The lr at the column's steps as a share of its peak: the declared schedule's, else the
    logged lr's of the same rows (1 where neither is known)."""
    schedule = state.schedule
    peak = schedule.get("peak_lr") if schedule else None
    if schedule and isinstance(peak, (int, float)) and peak > 0:
        got = [expected_lr(schedule, s) if s != NO_STEP else None for s in col.steps.tolist()]
        return np.array([1.0 if g is None else min(g / peak, 1.0) for g in got])
    rows = state.row_shares
    if rows is not None:
        shares = rows[col.rows]
    elif state.lr_peak > 0 and state.lr_now >= 0:
        shares = np.full(len(col), min(state.lr_now / state.lr_peak, 1.0))
    else:
        return np.ones(len(col))
    return np.where(np.isnan(shares), 1.0, shares)


def _update_share(state: TrainingState, cfg: TrainingConfig, col: Column) -> Signals | None:
    """Each share against the floor at the lr of its step (``lr_shares``), once the declared
    warmup is over; it warns from the ``update_persist``-th value below the floor in a row."""
    warm = warmup_end(state.schedule)
    if warm:  # a value without a step: not after it
        keep = col.steps >= warm
        if not keep.any():
            return None
        col = Column(col.xs[keep], col.steps[keep], col.rows[keep], col.rank)
    xs = col.xs
    floor = cfg.update_share_floor * lr_shares(state, col)
    sev = np.zeros(len(xs), np.int8)
    below = state.below
    for k, (x, f) in enumerate(zip(xs.tolist(), floor.tolist(), strict=True)):
        below = below + 1 if x < f else 0
        if below >= cfg.update_persist:
            sev[k] = WARN_SEV
    state.below = below
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        score = scores_of(np.where(floor > 0, floor / xs, 0.0))  # 1 at a share of 0
    return Signals.of(
        "training",
        "update_ratio",
        col.rows,
        col.steps,
        xs,
        score,
        sev,
        floor,
        floor,
        None,
        col.rank,
    )


def _spread_around_trend(values: deque[float]) -> float:
    """The standard deviation of ``values`` around their least-squares line: a norm that
    grows or shrinks steadily (early training, weight decay) spreads nothing; one that
    swings or jumps does."""
    ys = np.fromiter(values, float, len(values))
    ts = np.arange(len(ys), dtype=float)
    ts -= ts.mean()
    slope = float(ts @ (ys - ys.mean())) / float(ts @ ts)
    return float(np.std(ys - ys.mean() - slope * ts))


def _param_norm(
    state: TrainingState, cfg: TrainingConfig, x: float
) -> tuple[float, float, float, float, float] | None:
    recent = state.recent
    recent.append(x)
    if len(recent) > cfg.param_norm_window:
        recent.popleft()
    if len(recent) < cfg.param_norm_window or x == 0:
        return None
    rel = _spread_around_trend(recent) / abs(x)
    breach = rel > cfg.param_norm_std
    return (
        rel,
        score_of(rel / cfg.param_norm_std),
        WARN_SEV if breach else 0,
        cfg.param_norm_std,
        NAN,
    )
