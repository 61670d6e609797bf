"""Whether the loss came back to its trend after an incident, and how many steps it took (pure).

The trend is that of the ``window`` logged steps before the incident's onset: a Theil-Sen line
(the median of the pairwise slopes, so a spike among them does not tilt it) and a band of
``k`` times the scaled median absolute deviation of the residuals around it (at least
``min_width`` of the line's level, so a flat, noiseless loss still has a band). The line is
extrapolated at most ``window`` steps past the onset and held flat after that: a slope fitted
on a short stretch says little about a loss far ahead.

The loss is back once ``m`` consecutive logged steps from the onset on lie at or below the
band's upper edge (a loss below its trend is no harm); the answer is the steps from the onset
to the first of them (0: it never left). ``None`` with a reason otherwise: it did not come
back by the last logged step, or there were fewer than ``min_before`` steps before the onset
to learn the trend from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAD_SCALE = 1.4826  # MAD -> standard deviation of a normal distribution


@dataclass(frozen=True)
class RecoveryConfig:
    window: int = 50  # logged steps before the onset that define the trend
    k: float = 3.0  # band half-width in scaled MADs
    m: int = 5  # consecutive steps inside the band that count as back
    min_before: int = 8  # fewer steps before the onset: no trend to compare with
    min_width: float = 1e-3  # least half-width, relative to the trend's level at the onset


@dataclass(frozen=True)
class Recovery:
    steps: int | None  # from the onset until back on trend; None: not back (see ``reason``)
    back_step: int | None  # the first step of the ``m`` back on trend
    reason: str  # "recovered", "not recovered by the end", "too few steps before the onset"
    level: float  # the trend at the onset
    width: float  # the band's half-width

    def text(self) -> str:
        if self.steps is not None:
            return f"back on trend after {self.steps} steps (step {self.back_step})"
        return self.reason


def trend(steps: np.ndarray, values: np.ndarray) -> tuple[float, float, float]:
    """Theil-Sen line through ``(steps, values)`` and its residuals' scaled MAD: (slope,
    intercept, spread)."""
    i, j = np.triu_indices(len(steps), k=1)
    dx = steps[j] - steps[i]
    ok = dx != 0
    slope = float(np.median((values[j] - values[i])[ok] / dx[ok])) if ok.any() else 0.0
    intercept = float(np.median(values - slope * steps))
    resid = values - (slope * steps + intercept)
    spread = MAD_SCALE * float(np.median(np.abs(resid - np.median(resid))))
    return slope, intercept, spread


def recovery(
    steps: np.ndarray, loss: np.ndarray, onset: float, cfg: RecoveryConfig | None = None
) -> Recovery:
    """How many steps after ``onset`` the loss (``loss`` at ``steps``, any order) was back on
    its pre-onset trend."""
    cfg = cfg or RecoveryConfig()
    steps = np.asarray(steps, dtype="float64")
    loss = np.asarray(loss, dtype="float64")
    order = np.argsort(steps, kind="stable")
    steps, loss = steps[order], loss[order]
    before = (steps < onset) & np.isfinite(loss)
    xs, ys = steps[before][-cfg.window :], loss[before][-cfg.window :]
    if len(xs) < cfg.min_before:
        return Recovery(None, None, "too few steps before the onset", np.nan, np.nan)
    slope, intercept, spread = trend(xs, ys)
    level = slope * onset + intercept
    width = max(cfg.k * spread, cfg.min_width * abs(level))
    after = steps >= onset
    xa, ya = steps[after], loss[after]
    horizon = onset + max(onset - xs[0], 1.0)  # extrapolated as far as the window reaches
    expected = slope * np.minimum(xa, horizon) + intercept
    inside = (np.isfinite(ya) & (ya <= expected + width)).astype("int64")
    if len(inside) >= cfg.m:
        runs = np.convolve(inside, np.ones(cfg.m, dtype="int64"), mode="valid")
        hits = np.flatnonzero(runs == cfg.m)
        if len(hits):
            first = xa[hits[0]]
            return Recovery(int(first - onset), int(first), "recovered", level, width)
    return Recovery(None, None, "not recovered by the end", level, width)
