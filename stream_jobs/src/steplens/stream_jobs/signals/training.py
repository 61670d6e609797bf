"""Optimizer health from watch(): update ratio collapse and parameter-norm instability."""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from steplens.stream_jobs.core import WARN_SEV, Column, Signals, median, score_of

NAN = math.nan


@dataclass
class TrainingConfig:
    update_ratio_floor: float = 0.05  # update ratio below 5 % of its recent median
    update_window: int = 50
    update_warmup: int = 10
    param_norm_window: int = 20
    param_norm_std: float = 0.10  # window std above 10 % of the current norm


@dataclass
class TrainingState:
    recent: deque[float] = field(default_factory=deque)  # the metric's recent values


def update(state: TrainingState, cfg: TrainingConfig, metric: str, col: Column) -> Signals | None:
    """``update_ratio`` against its recent median, ``param_norm``'s spread over its window."""
    judge = _update_ratio if metric == "update_ratio" else _param_norm
    at: list[int] = []
    cols: list[list[float]] = [[], [], [], [], []]  # value, score, severity, expected, lower
    for k, x in enumerate(col.xs.tolist()):
        got = judge(state, cfg, x)
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


def _update_ratio(
    state: TrainingState, cfg: TrainingConfig, x: float
) -> tuple[float, float, float, float, float] | None:
    recent = state.recent
    out = None
    if len(recent) >= cfg.update_warmup:
        base = median(recent)
        limit = cfg.update_ratio_floor * base
        breach = base > 0 and x < limit
        out = (x, score_of(limit / x) if x > 0 else 1.0, WARN_SEV if breach else 0, base, limit)
    recent.append(x)
    if len(recent) > cfg.update_window:
        recent.popleft()
    return out


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
