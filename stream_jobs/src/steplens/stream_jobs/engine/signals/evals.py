"""Validation metrics: plateaus, perplexity vs exp(loss), a widening train/validation gap and
unstable (oscillating) validation results.

An unstable metric's signal says how often to evaluate instead (``eval_interval``): a result
is the metric plus noise, and the mean of ``k`` results has ``1/sqrt(k)`` of that noise. With
the noise ``sigma`` read from the changes between successive results (their spread about
their mean change, over ``sqrt(2)``: each change holds two results' noise) and the change
worth seeing between two evaluations ``delta`` (the metric's drift per evaluation, at least
``unstable_rel`` of its level, the swing that counts as unstable), ``z * sigma / sqrt(k) <=
delta`` needs ``k = ceil((z * sigma / delta)^2)``: evaluate ``k`` times as often and judge
the mean of the last ``k`` results (or evaluate on ``k`` times as many samples).

A plateau is a suggestion (severity info: consider early stopping or the lr), of the split's
loss when it has one (an accuracy that stalls while the loss still improves is no news); the
other metrics' plateaus stay signals."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from steplens.schema import Record
from steplens.stream_jobs.engine.core import INFO, WARNING, Run, Signals, one, score_of

LOWER_IS_BETTER = {"loss", "perplexity"}


@dataclass
class EvalConfig:
    patience: int = 5  # evaluations without improvement
    min_improvement: float = 1e-3  # relative
    perplexity_tolerance: float = 0.05  # |ppl - exp(loss)| / exp(loss)
    gap_evals: int = 3  # consecutive widenings of (val loss - train loss)
    gap_rel: float = 0.05  # ... by at least this share of the validation loss in all
    unstable_swings: int = 3  # direction changes in the last unstable_swings + 1 evaluations
    unstable_rel: float = 0.05  # each swing at least this share of the value
    interval_z: float = 2.0  # the mean of the advised results tells a change from noise at z
    interval_max_factor: int = 16  # evaluate at most this many times as often


@dataclass
class EvalState:
    best: dict[str, float] = field(default_factory=dict)
    stale: dict[str, int] = field(default_factory=dict)
    history: dict[str, list[float]] = field(default_factory=dict)
    at: dict[str, list[int]] = field(default_factory=dict)  # the steps of ``history``
    gaps: list[float] = field(default_factory=list)


def _swings(values: list[float], rel: float) -> int:
    diffs = [b - a for a, b in pairwise(values)]
    swings = 0
    for d0, d1, ref in zip(diffs, diffs[1:], values[1:], strict=False):
        big = abs(d0) >= rel * abs(ref) and abs(d1) >= rel * abs(ref)
        if d0 * d1 < 0 and big:
            swings += 1
    return swings


@dataclass(frozen=True)
class EvalInterval:
    """How often the results of an unstable metric support evaluating it (module docstring)."""

    every: float  # steps between evaluations now (the median)
    noise: float  # one result's noise
    change: float  # the change worth seeing between two evaluations
    factor: int  # evaluate this many times as often, and judge the mean of that many results
    suggested: int  # steps between evaluations

    def advice(self) -> str:
        return (
            f"evaluate every {self.suggested} steps instead of every {self.every:g} and judge "
            f"the mean of the last {self.factor} results (or evaluate on {self.factor}x the "
            f"samples): one result's noise ({self.noise:.3g}) is {self.noise / self.change:.1f}x "
            f"the change worth seeing between evaluations ({self.change:.3g})"
        )


def eval_interval(
    steps: Sequence[int],
    values: Sequence[float],
    rel: float,
    z: float = 2.0,
    max_factor: int = 16,
) -> EvalInterval | None:
    """The evaluation interval the results ``values`` at ``steps`` support (module
    docstring); None with fewer than four results or no step between them."""
    if len(values) < 4 or len(steps) != len(values):
        return None
    gaps = np.diff(np.asarray(steps, dtype=np.float64))
    every = float(np.median(gaps))
    if not every > 0:
        return None
    changes = np.diff(np.asarray(values, dtype=np.float64))
    drift = float(changes.mean())
    noise = float(changes.std(ddof=1)) / math.sqrt(2.0)
    level = float(np.abs(np.asarray(values, dtype=np.float64)).mean())
    change = max(abs(drift), rel * level, 1e-12)
    factor = math.ceil((z * noise / change) ** 2)
    factor = min(max(factor, 2), max_factor)  # unstable: at least twice as often
    return EvalInterval(every, noise, change, factor, max(1, round(every / factor)))


def update(  # noqa: PLR0917
    state: EvalState,
    cfg: EvalConfig,
    split: str,
    metrics: dict[str, float],
    train_loss: float | None,
    step: int | None,
) -> tuple[EvalState, list[Signals]]:
    out: list[Signals] = []
    scope = f"split:{split}"
    led_by_loss = "loss" in metrics
    for name, value in metrics.items():
        if not math.isfinite(value):
            out.append(
                one("nonfinite", f"eval_{name}", step, value, 1.0, scope=scope, severity="critical")
            )
            continue
        key = f"{split}/{name}"
        sign = 1.0 if name in LOWER_IS_BETTER else -1.0
        best = state.best.get(key)
        improved = best is None or sign * (best - value) > cfg.min_improvement * abs(best)
        if improved:
            state.best[key] = value
            state.stale[key] = 0
        else:
            state.stale[key] = state.stale.get(key, 0) + 1
        stale = state.stale[key]
        out.append(
            one(
                "plateau",
                f"eval_{name}",
                step,
                float(stale),
                score_of(stale / cfg.patience),
                scope=scope,
                severity=INFO
                if stale >= cfg.patience and (name == "loss" or not led_by_loss)
                else None,
            )
        )
        hist = state.history.setdefault(key, [])
        hist.append(value)
        del hist[: -(cfg.unstable_swings + 2)]
        at = state.at.setdefault(key, [])
        if step is None:
            at.clear()  # the steps no longer match the results
        else:
            at.append(step)
            del at[: -len(hist)]
        swings = _swings(hist, cfg.unstable_rel)
        unstable = swings >= cfg.unstable_swings
        detail = None
        if unstable and len(at) == len(hist):
            found = eval_interval(
                at, hist, cfg.unstable_rel, cfg.interval_z, cfg.interval_max_factor
            )
            if found is not None:
                detail = {
                    "eval_every": found.every,
                    "eval_every_suggested": found.suggested,
                    "eval_noise": found.noise,
                    "eval_change": found.change,
                    "eval_mean_of": found.factor,
                    "advice": found.advice(),
                }
        out.append(
            one(
                "eval_unstable",
                f"eval_{name}",
                step,
                float(swings),
                score_of(swings / cfg.unstable_swings),
                scope=scope,
                severity=WARNING if unstable else None,
                detail=detail,
            )
        )
    loss, ppl = metrics.get("loss"), metrics.get("perplexity")
    if loss is not None and ppl is not None and math.isfinite(loss) and math.isfinite(ppl):
        want = math.exp(min(loss, 700.0))
        rel = abs(ppl - want) / want
        out.append(
            one(
                "perplexity",
                "eval_perplexity",
                step,
                ppl,
                score_of(rel / cfg.perplexity_tolerance),
                scope=scope,
                severity=WARNING if rel > cfg.perplexity_tolerance else None,
                expected=want,
            )
        )
    if loss is not None and train_loss is not None and math.isfinite(loss):
        state.gaps.append(loss - train_loss)
        del state.gaps[: -(cfg.gap_evals + 1)]
        g = state.gaps
        widening = len(g) > cfg.gap_evals and all(b > a for a, b in pairwise(g))
        widening = widening and g[-1] > 0 and g[-1] - g[0] >= cfg.gap_rel * abs(loss)
        out.append(
            one(
                "generalization_gap",
                "eval_loss",
                step,
                g[-1],
                0.75 if widening else 0.0,
                scope=scope,
                severity=INFO if widening else None,
                expected=g[0],
            )
        )
    return state, out


METRICS = ("loss", "perplexity", "accuracy", "f1", "bleu", "rouge")


def on_record(state: EvalState, cfg: EvalConfig, rec: Record, run: Run) -> list[Signals]:
    """An ``eval`` record's metrics (its own and its ``extra`` ones) of its split."""
    d = rec.data
    vals = {k: float(d[k]) for k in METRICS if isinstance(d.get(k), (int, float))}
    vals.update({k: float(v) for k, v in (d.get("extra") or {}).items()})
    return update(state, cfg, d["split"], vals, run.train_loss, rec.step)[1]
