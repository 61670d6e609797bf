"""Validation metrics: plateaus, perplexity vs exp(loss), a widening train/validation gap and
unstable (oscillating) validation results.

A plateau is a suggestion (severity info: consider early stopping or the lr), of the split's
loss when it has one (an accuracy that stalls while the loss still improves is no news); the
other metrics' plateaus stay signals."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import pairwise

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


@dataclass
class EvalState:
    best: dict[str, float] = field(default_factory=dict)
    stale: dict[str, int] = field(default_factory=dict)
    history: dict[str, list[float]] = field(default_factory=dict)
    gaps: list[float] = field(default_factory=list)


def _swings(values: list[float], rel: float) -> int:
    diffs = [b - a for a, b in pairwise(values)]
    swings = 0
    for d0, d1, ref in zip(diffs, diffs[1:], values[1:], strict=False):
        big = abs(d0) >= rel * abs(ref) and abs(d1) >= rel * abs(ref)
        if d0 * d1 < 0 and big:
            swings += 1
    return swings


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
        swings = _swings(hist, cfg.unstable_rel)
        out.append(
            one(
                "eval_unstable",
                f"eval_{name}",
                step,
                float(swings),
                score_of(swings / cfg.unstable_swings),
                scope=scope,
                severity=WARNING if swings >= cfg.unstable_swings else None,
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
