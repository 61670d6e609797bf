"""Optimizer health from watch(): update-ratio collapse and parameter-norm instability.

``update_ratio`` is the share of parameter elements whose update exceeded 1e-3 of their
magnitude in the step (the producer samples the elements); below ``update_share_floor`` (5 %)
for ``update_persist`` values in a row, the optimizer has nearly stopped moving the model (an lr
decayed to nothing, a broken optimizer state, frozen parameters). Not judged before the declared
warmup ends: a warming lr moves few elements by design.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from steplens.stream_jobs.engine.core import WARN_SEV, Column, Signals, score_of, scores_of
from steplens.stream_jobs.engine.signals.lr_schedule import warmup_end

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


def _update_share(state: TrainingState, cfg: TrainingConfig, col: Column) -> Signals | None:
    """Each share against the floor, once the declared warmup is over; it warns from the
    ``update_persist``-th value below the floor in a row."""
    floor = cfg.update_share_floor
    warm = warmup_end(state.schedule)
    if warm:  # a value without a step: not after it
        keep = col.steps >= warm
        if not keep.any():
            return None
        col = Column(col.xs[keep], col.steps[keep], col.rows[keep], col.rank)
    xs = col.xs
    sev = np.zeros(len(xs), np.int8)
    below = state.below
    for k, x in enumerate(xs.tolist()):
        below = below + 1 if x < floor else 0
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
