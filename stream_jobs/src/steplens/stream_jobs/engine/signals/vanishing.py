"""Vanishing gradients: the gradient norm's level collapsing toward zero.

The level is a running geometric mean (an EMA of ``log(x)``, weight ``alpha``), so one small
value does not make a collapse and a zero gradient drags it down at once. The reference is
the highest level seen, forgotten slowly: it may fall by ``collapse`` over ``horizon`` values,
so the slow decline of a healthy run (a gradient norm a hundred times smaller after many
thousand steps) follows it, while a level that falls below ``collapse`` x the reference faster
than that is a collapse: parameters stopped receiving gradient (fp16 underflow, a detached or
frozen graph, saturated activations).

A healthy level is news to nobody: a value is a signal when its score reaches ``quiet_score``
(the level well below its reference), when it warns, or once in ``quiet_every`` values (the
board's trace); an alert whose values stop coming resolves by steps, as any other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from steplens.stream_jobs.engine.core import WARN_SEV, Column, Signals
from steplens.stream_jobs.engine.signals.kernels import jit, score

NAN = math.nan
TINY = 1e-30  # log(0) stands for log of this


@dataclass
class VanishConfig:
    collapse: float = 1e-3  # the level below this share of the reference warns
    horizon: int = 2000  # values over which the reference may fall by ``collapse``
    alpha: float = 0.1  # EMA weight of log(x)
    warmup: int = 20  # values before the level is judged
    quiet_score: float = 0.2  # a score from this on is a signal (the level 5x below its ref)
    quiet_every: int = 50  # else one value in this many is


@dataclass
class VanishState:
    level: float = NAN  # EMA of log(x)
    ref: float = NAN  # the reference level (log), forgotten at ln(1/collapse)/horizon a value
    seen: int = 0
    since: int = 0  # values judged since the last one that was a signal


def update(state: VanishState, cfg: VanishConfig, metric: str, col: Column) -> Signals | None:
    """The level after each value against its reference, once ``warmup`` values were seen
    (those that are signals: ``quiet_score``, a warning, ``quiet_every``)."""
    at, out, sev, ints, floats = _vanishing(
        col.xs,
        np.array((state.level, state.ref)),
        np.array((state.seen, state.since, cfg.warmup, cfg.quiet_every), dtype=np.int64),
        float(cfg.alpha),
        math.log(1.0 / cfg.collapse) / max(cfg.horizon, 1),
        float(cfg.collapse),
        float(cfg.quiet_score),
    )
    state.level, state.ref = float(floats[0]), float(floats[1])
    state.seen, state.since = int(ints[0]), int(ints[1])
    if not len(at):
        return None
    return Signals(
        "vanishing",
        metric,
        col.rows[at],
        col.steps[at],
        out[0],
        out[2],
        sev,
        out[1],
        out[3],
        np.full(len(at), NAN),
        col.rank,
        "run",
        None,
    )


@jit
def _vanishing(  # noqa: PLR0917
    xs: np.ndarray,
    floats: np.ndarray,
    ints: np.ndarray,
    alpha: float,
    forget: float,
    collapse: float,
    quiet: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The values that are signals (their indices; not before ``warmup`` values, nor quiet)
    with their level, reference, score (0.5 where the level is ``collapse`` x the reference)
    and floor, and severities. ``floats`` (the level and reference, as logs) and ``ints``
    (seen, since the last signal, warmup, every) are updated in place and returned."""
    m = len(xs)
    at = np.empty(m, np.int64)
    out = np.empty((4, m))
    sev = np.zeros(m, np.int8)
    level, ref = floats[0], floats[1]
    seen, since, warmup, every = ints[0], ints[1], ints[2], ints[3]
    log_collapse = math.log(collapse)
    k = 0
    for i in range(m):
        lx = math.log(max(xs[i], TINY))
        level = lx if seen == 0 else level + alpha * (lx - level)
        seen += 1
        if seen < warmup:
            continue
        ref = level if math.isnan(ref) else max(level, ref - forget)
        # how far below the reference, against how far it may be: 0.5 at the threshold
        sc = score((ref - level) / -log_collapse)
        lv, rf = math.exp(level), math.exp(ref)
        floor = rf * collapse
        since += 1
        low = lv < floor
        if sc < quiet and not low and since < every:
            continue
        since = 0
        at[k] = i
        out[0, k], out[1, k], out[2, k], out[3, k] = lv, rf, sc, floor
        sev[k] = WARN_SEV if low else 0
        k += 1
    floats[0], floats[1] = level, ref
    ints[0], ints[1] = seen, since
    return at[:k], out[:, :k].copy(), sev[:k], ints, floats


def warm_up_kernel() -> None:
    one = np.ones(4)
    update(
        VanishState(),
        VanishConfig(warmup=2),
        "grad_norm",
        Column(one, np.arange(4), np.zeros(4, np.int64)),
    )
