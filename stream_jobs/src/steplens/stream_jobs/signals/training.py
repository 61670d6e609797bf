"""Optimizer health from watch(): update ratio collapse and parameter-norm instability."""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from steplens.stream_jobs.core import WARNING, Signal, median, score_of


@dataclass
class TrainingConfig:
    update_ratio_floor: float = 0.05  # update ratio below 5 % of its recent median
    update_window: int = 50
    update_warmup: int = 10
    param_norm_window: int = 20
    param_norm_std: float = 0.10  # window std above 10 % of the current norm


@dataclass
class TrainingState:
    ratios: deque[float] = field(default_factory=deque)
    norms: deque[float] = field(default_factory=deque)


def update_ratio(
    state: TrainingState, cfg: TrainingConfig, x: float, step: int | None, rank: int
) -> tuple[TrainingState, list[Signal]]:
    if not math.isfinite(x):
        return state, []
    out: list[Signal] = []
    if len(state.ratios) >= cfg.update_warmup:
        base = median(state.ratios)
        limit = cfg.update_ratio_floor * base
        breach = base > 0 and x < limit
        out.append(
            Signal(
                "training",
                "update_ratio",
                step,
                x,
                score_of(limit / x) if x > 0 else 1.0,
                rank,
                severity=WARNING if breach else None,
                expected=base,
                lower=limit,
            )
        )
    state.ratios.append(x)
    if len(state.ratios) > cfg.update_window:
        state.ratios.popleft()
    return state, out


def param_norm(
    state: TrainingState, cfg: TrainingConfig, x: float, step: int | None, rank: int
) -> tuple[TrainingState, list[Signal]]:
    if not math.isfinite(x):
        return state, []
    state.norms.append(x)
    if len(state.norms) > cfg.param_norm_window:
        state.norms.popleft()
    if len(state.norms) < cfg.param_norm_window or x == 0:
        return state, []
    rel = statistics.pstdev(state.norms) / abs(x)
    return state, [
        Signal(
            "training",
            "param_norm",
            step,
            rel,
            score_of(rel / cfg.param_norm_std),
            rank,
            severity=WARNING if rel > cfg.param_norm_std else None,
            expected=cfg.param_norm_std,
        )
    ]
