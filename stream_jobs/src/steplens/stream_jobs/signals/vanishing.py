"""Vanishing gradients: the gradient norm's level collapsing toward zero.

The level is a running geometric mean (an EMA of ``log(x)``, weight ``alpha``), so one small
value does not make a collapse and a zero gradient drags it down at once. The reference is
the highest level seen, forgotten slowly: it may fall by ``collapse`` over ``horizon`` values,
so the slow decline of a healthy run (a gradient norm a hundred times smaller after many
thousand steps) follows it, while a level that falls below ``collapse`` x the reference faster
than that is a collapse: parameters stopped receiving gradient (fp16 underflow, a detached or
frozen graph, saturated activations).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from steplens.stream_jobs.core import WARN_SEV, Column, Signals
from steplens.stream_jobs.signals.kernels import jit, score

NAN = math.nan
TINY = 1e-30  # log(0) stands for log of this


@dataclass
class VanishConfig:
    collapse: float = 1e-3  # the level below this share of the reference warns
    horizon: int = 2000  # values over which the reference may fall by ``collapse``
    alpha: float = 0.1  # EMA weight of log(x)
    warmup: int = 20  # values before the level is judged


@dataclass
class VanishState:
    level: float = NAN  # EMA of log(x)
    ref: float = NAN  # the reference level (log), forgotten at ln(1/collapse)/horizon a value
    seen: int = 0


def update(state: VanishState, cfg: VanishConfig, metric: str, col: Column) -> Signals | None:
    """The level after each value against its reference, once ``warmup`` values were seen."""
    out, ints, floats = _vanishing(
        col.xs,
        np.array((state.level, state.ref)),
        int(state.seen),
        float(cfg.alpha),
        math.log(1.0 / cfg.collapse) / max(cfg.horizon, 1),
        math.log(cfg.collapse),
        int(cfg.warmup),
    )
    state.level, state.ref, state.seen = float(floats[0]), float(floats[1]), int(ints)
    judged = ~np.isnan(out[1])
    if not judged.any():
        return None
    if not judged.all():
        out = out[:, judged]
    level, ref, floor = out[0], out[1], out[1] * cfg.collapse
    sev = np.where(level < floor, WARN_SEV, 0).astype(np.int8)
    return Signals.of(
        "vanishing",
        metric,
        col.rows[judged],
        col.steps[judged],
        level,
        out[2],
        sev,
        ref,
        floor,
        None,
        col.rank,
    )


@jit
def _vanishing(  # noqa: PLR0917
    xs: np.ndarray,
    floats: np.ndarray,
    seen: int,
    alpha: float,
    forget: float,
    log_collapse: float,
    warmup: int,
) -> tuple[np.ndarray, int, np.ndarray]:
    """Each value's level and reference (NaN before ``warmup`` values) and score (0.5 where
    the level is ``collapse`` x the reference); ``floats`` (their logs) is updated in place and
    returned with the count of values seen."""
    m = len(xs)
    out = np.full((3, m), NAN)
    level, ref = floats[0], floats[1]
    for i in range(m):
        lx = math.log(max(xs[i], TINY))
        level = lx if seen == 0 else level + alpha * (lx - level)
        seen += 1
        if seen < warmup:
            continue
        ref = level if math.isnan(ref) else max(level, ref - forget)
        out[0, i] = math.exp(level)
        out[1, i] = math.exp(ref)
        # how far below the reference, against how far it may be: 0.5 at the threshold
        out[2, i] = score((ref - level) / -log_collapse)
    floats[0], floats[1] = level, ref
    return out, seen, floats


def warm_up_kernel() -> None:
    one = np.ones(4)
    update(
        VanishState(),
        VanishConfig(warmup=2),
        "grad_norm",
        Column(one, np.arange(4), np.zeros(4, np.int64)),
    )
