"""The per-value reference of the compiled vanishing-gradient detector: the property tests hold
the package equal to it, value by value."""

from __future__ import annotations

import math
from dataclasses import dataclass

from steplens.stream_jobs.engine.core import WARNING, Signal, score_of
from steplens.stream_jobs.engine.signals.vanishing import TINY, VanishConfig


@dataclass
class VanishState:
    level: float = math.nan
    ref: float = math.nan
    seen: int = 0
    since: int = 0


def update(state: VanishState, cfg: VanishConfig, x: float, step: int, rank: int = 0) -> list:
    lx = math.log(max(x, TINY))
    state.level = lx if state.seen == 0 else state.level + cfg.alpha * (lx - state.level)
    state.seen += 1
    if state.seen < cfg.warmup:
        return []
    forget = math.log(1.0 / cfg.collapse) / max(cfg.horizon, 1)
    state.ref = state.level if math.isnan(state.ref) else max(state.level, state.ref - forget)
    level, ref = math.exp(state.level), math.exp(state.ref)
    floor = ref * cfg.collapse
    sc = score_of((state.ref - state.level) / -math.log(cfg.collapse))
    state.since += 1
    if sc < cfg.quiet_score and level >= floor and state.since < cfg.quiet_every:
        return []  # quiet: not a signal
    state.since = 0
    return [
        Signal(
            "vanishing",
            "grad_norm",
            step,
            level,
            sc,
            rank,
            "run",
            WARNING if level < floor else None,
            ref,
            floor,
            None,
        )
    ]
