"""Optimizer health from watch(): update-ratio collapse and parameter-norm instability.

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
import statistics
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


def observe_lr(state: TrainingState, xs: np.ndarray) -> None:
    """The rank's logged lrs ``xs`` (its update share's state): the floor follows them."""
    good = xs[np.isfinite(xs) & (xs >= 0)]
    if len(good):
        state.lr_now = float(good[-1])
        top = float(good.max())
        state.lr_peak = top if not state.lr_peak >= top else state.lr_peak


def lr_shares(state: TrainingState, steps: np.ndarray) -> np.ndarray:
    """The lr at ``steps`` as a share of its peak: the declared schedule's, else the logged
    lr's (1 where neither is known)."""
    schedule = state.schedule
    peak = schedule.get("peak_lr") if schedule else None
    if schedule and isinstance(peak, (int, float)) and peak > 0:
        got = [expected_lr(schedule, int(s)) if s != NO_STEP else None for s in steps.tolist()]
        return np.array([1.0 if g is None else min(g / peak, 1.0) for g in got])
    if state.lr_peak > 0 and state.lr_now >= 0:
        return np.full(len(steps), min(state.lr_now / state.lr_peak, 1.0))
    return np.ones(len(steps))


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
    floor = cfg.update_share_floor * lr_shares(state, col.steps)
    sev = np.zeros(len(xs), np.int8)
    below = state.below
    for k, (x, f) in enumerate(zip(xs.tolist(), floor.tolist(), strict=True)):
        below = below + 1 if x < f else 0
        if below >= cfg.update_persist:
            sev[k] = WARN_SEV
    state.below = below
    with np.errstate(divide="ignore", over="ignore"):
        score = scores_of(floor / xs)  # 1 at a share of 0
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


def _param_norm(
    state: TrainingState, cfg: TrainingConfig, x: float
) -> tuple[float, float, float, float, float] | None:
    recent = state.recent
    recent.append(x)
    if len(recent) > cfg.param_norm_window:
        recent.popleft()
    if len(recent) < cfg.param_norm_window or x == 0:
        return None
    rel = statistics.pstdev(recent) / abs(x)
    breach = rel > cfg.param_norm_std
    return (
        rel,
        score_of(rel / cfg.param_norm_std),
        WARN_SEV if breach else 0,
        cfg.param_norm_std,
        NAN,
    )
