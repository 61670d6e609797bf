"""Learning-rate schedule: the logged lr must follow the declared schedule (``run_meta``).

The logged lr is compared with the declared lr over the steps it may stand for: a step record's
lr may be the one of its own step or of a neighbour (PyTorch schedulers are stepped after the
optimizer, so ``get_last_lr()`` read after ``scheduler.step()`` is the next step's lr), and a
window's mean stands for every step of the window. Between those steps the declared lr is monotone
except across the warmup peak, so the range of the declared values at the ends (and at the peak)
bounds every value the logged lr may rightly take.

Without a declared schedule the lr may only rise smoothly: a jump above ``jump`` x the largest
recent lr is a deviation. The signal carries the step where the deviation started.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from steplens.stream_jobs.core import WARNING, Signal, SignalRun, score_of, scores_of
from steplens.stream_jobs.signals import kernels

isfinite = math.isfinite


@dataclass
class LrConfig:
    rel_tolerance: float = 0.10  # of max(expected, 1 % of peak)
    jump: float = 2.0
    jump_window: int = 20
    warmup: int = 3
    step_offset: int = 1  # the logged lr may be that of the previous or the next step


@dataclass
class LrState:
    schedule: dict[str, Any] | None = None
    recent: deque[float] = field(default_factory=deque)
    deviating_since: int | None = None


KINDS = ("constant", "linear", "cosine", "step")


def check_schedule(raw: Any) -> dict[str, Any]:
    """A declared schedule (``run_meta``'s ``lr_schedule``) checked field by field: a copy
    with counts as ints, or ``ValueError`` naming the bad field (a schedule that cannot be
    read would otherwise fail at every later step)."""
    if not isinstance(raw, dict):
        # ValueError like every other refusal: the worker dead-letters a record with it
        raise ValueError(f"lr_schedule: must be an object, got {type(raw).__name__}")  # noqa: TRY004
    out = dict(raw)
    kind = out.setdefault("kind", "constant")
    if kind not in KINDS:
        raise ValueError(f"lr_schedule.kind: must be one of {', '.join(KINDS)}, got {kind!r}")
    for key in ("peak_lr", "min_lr", "gamma"):
        v = out.get(key)
        if v is not None and not _real(v):
            raise ValueError(f"lr_schedule.{key}: must be a finite number, got {v!r}")
    for key in ("warmup_steps", "total_steps"):
        v = out.get(key)
        if v is not None:
            if not _real(v) or v < 0 or v != int(v):
                raise ValueError(f"lr_schedule.{key}: must be a whole number >= 0, got {v!r}")
            out[key] = int(v)
    ms = out.get("milestones")
    if ms is not None and not (isinstance(ms, list) and all(_count(m) for m in ms)):
        raise ValueError(f"lr_schedule.milestones: must be a list of step numbers, got {ms!r}")
    return out


def _real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def expected_lr(schedule: dict[str, Any], step: int) -> float | None:
    """The declared lr at ``step``: linear warmup, then constant / linear / cosine / step decay."""
    peak = schedule.get("peak_lr")
    if not isinstance(peak, (int, float)):
        return None
    peak = float(peak)
    floor = float(schedule.get("min_lr") or 0.0)
    warm = int(schedule.get("warmup_steps") or 0)
    total = int(schedule.get("total_steps") or 0)
    kind = schedule.get("kind", "constant")
    if warm and step < warm:
        return peak * (step + 1) / warm
    if kind == "constant":
        return peak
    if kind == "step":
        passed = sum(1 for m in schedule.get("milestones") or [] if step >= m)
        return peak * float(schedule.get("gamma", 0.1)) ** passed
    if total <= warm:
        return peak
    progress = min(1.0, max(0.0, (step - warm) / (total - warm)))
    if kind == "linear":
        return peak + (floor - peak) * progress
    if kind == "cosine":
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return None


def expected_range(
    schedule: dict[str, Any], first: int, last: int, offset: int
) -> tuple[float, float] | None:
    """Smallest and largest declared lr over steps ``first - offset`` .. ``last + offset``."""
    lo_step, hi_step = max(0, first - offset), max(0, last + offset)
    probes = {lo_step, hi_step}
    warm = int(schedule.get("warmup_steps") or 0)
    for s in (warm - 1, warm):  # the peak, where warmup turns into decay
        if lo_step <= s <= hi_step:
            probes.add(s)
    for m in schedule.get("milestones") or []:  # both sides of each drop of a step schedule
        if isinstance(m, int) and lo_step < m <= hi_step:
            probes.update((m - 1, m))
    values = [v for v in (expected_lr(schedule, s) for s in probes) if v is not None]
    return (min(values), max(values)) if values else None


def update(  # noqa: PLR0917
    state: LrState,
    cfg: LrConfig,
    lr: float,
    step: int | None,
    rank: int = -1,
    first_step: int | None = None,
) -> tuple[LrState, list[Signal]]:
    """Score the lr logged at ``step`` (a window's mean when ``first_step`` is given)."""
    if step is None:
        return state, []
    score, breach, expected, lower, upper = _judge(state, cfg, lr, step, first_step)
    detail = {"since_step": state.deviating_since} if breach else None
    sev = WARNING if breach else None
    return state, [
        Signal(
            "lr_schedule", "lr", step, lr, score, rank, "run", sev, expected, lower, upper, detail
        )
    ]


def update_many(
    state: LrState, cfg: LrConfig, xs: Sequence[float], steps: Sequence[int], rank: int = -1
) -> SignalRun:
    """``update`` over the lrs logged at ``steps`` (step records): their signals as columns.
    Finite lrs go through numpy (``_judge_many``: the same arithmetic, so the same floats)."""
    run = SignalRun("lr_schedule", "lr", rank)
    judged = _judge_many(state, cfg, xs, steps) if len(xs) >= _MANY else None
    if judged is not None:
        scores, breaches, expected, lower, upper = judged
        run.steps += steps
        run.values += xs
        run.scores = scores
        run.expected += expected
        run.lower += lower
        run.upper += upper
        run.severities = [WARNING if b else None for b in breaches]
        since = state.deviating_since
        details: list[dict[str, Any] | None] = [None] * len(xs)
        for i, b in enumerate(breaches):
            if b:
                if since is None:
                    since = steps[i]
                details[i] = {"since_step": since}
            else:
                since = None
        state.deviating_since = since
        if any(breaches):
            run.details = details
        return run
    details = []
    for lr, step in zip(xs, steps, strict=True):
        score, breach, exp, low, up = _judge(state, cfg, lr, step, None)
        run.steps.append(step)
        run.values.append(lr)
        run.scores.append(score)
        run.severities.append(WARNING if breach else None)
        run.expected.append(exp)
        run.lower.append(low)
        run.upper.append(up)
        details.append({"since_step": state.deviating_since} if breach else None)
    if any(details):
        run.details = details
    return run


_MANY = 8  # values from which the numpy path pays

Columns = tuple[list[float], list[bool], list[float], list[float], list[float]]


def _judge_many(
    state: LrState, cfg: LrConfig, xs: Sequence[float], steps: Sequence[int]
) -> Columns | None:
    """``_judge`` over finite lrs with numpy: (scores, breaches, expected, lower, upper), or
    None where only the scalar path applies (a non-finite lr, a schedule with no declared lr
    at some step, settings that divide by zero). Leaves ``deviating_since`` to the caller."""
    lr = np.asarray(xs, dtype=float)
    if not np.isfinite(lr).all() or cfg.rel_tolerance <= 0 or cfg.jump <= 0:
        return None
    if state.schedule:
        # None where a step has no declared lr (then it is judged as if there were no
        # schedule): step by step
        return _against_schedule(state.schedule, cfg, lr, steps)
    return _against_recent(state, cfg, lr)


def _against_schedule(
    schedule: dict[str, Any], cfg: LrConfig, lr: np.ndarray, steps: Sequence[int]
) -> Columns | None:
    """The scheduled branch of ``_judge``: the declared lr is computed once per step seen
    (``expected_lr``, in Python: the same floats), the ranges and scores with numpy."""
    off = cfg.step_offset
    at = np.asarray(steps, dtype=np.int64)
    lo_at, hi_at = np.maximum(at - off, 0), np.maximum(at + off, 0)
    known: dict[int, float] = {}

    def declared(points: np.ndarray) -> np.ndarray | None:
        out = []
        for p in points.tolist():
            v = known.get(p)
            if v is None:
                got = expected_lr(schedule, p)
                if got is None:
                    return None
                v = known[p] = got
            out.append(v)
        return np.array(out, dtype=float)

    e_lo, e_hi, want = declared(lo_at), declared(hi_at), declared(at)
    if e_lo is None or e_hi is None or want is None:
        return None
    lo, hi = np.minimum(e_lo, e_hi), np.maximum(e_lo, e_hi)
    warm = int(schedule.get("warmup_steps") or 0)
    extra: list[tuple[np.ndarray, tuple[int, ...]]] = [
        ((lo_at <= p) & (p <= hi_at), (p,)) for p in (warm - 1, warm)
    ]
    for m in schedule.get("milestones") or []:
        if isinstance(m, int):
            extra.append(((lo_at < m) & (m <= hi_at), (m - 1, m)))
    for inside, points in extra:
        if inside.any():
            for p in points:
                v = declared(np.array([p]))
                if v is None:
                    return None
                lo = np.where(inside, np.minimum(lo, v[0]), lo)
                hi = np.where(inside, np.maximum(hi, v[0]), hi)
    peak = float(schedule["peak_lr"])  # a declared lr exists: so does a numeric peak_lr
    near = np.where(lr < lo, lo, hi)
    tol = cfg.rel_tolerance * np.maximum(np.maximum(np.abs(near), 0.01 * abs(peak)), 1e-12)
    dev = np.maximum(np.maximum(lo - lr, lr - hi), 0.0)
    breach = dev > tol
    score = np.where(dev > 0, scores_of(dev / tol), 0.0)
    return score.tolist(), breach.tolist(), want.tolist(), (lo - tol).tolist(), (hi + tol).tolist()


def _against_recent(state: LrState, cfg: LrConfig, lr: np.ndarray) -> Columns | None:
    """The branch of ``_judge`` without a schedule (``kernels.lr_recent``): each lr against
    ``jump`` x the largest of the ``jump_window`` finite lrs before it."""
    recent, window = state.recent, cfg.jump_window
    if len(recent) > window or window < 1:
        return None
    score, breach, top, limit, kept = kernels.lr_recent(
        np.array(recent, dtype=float), lr, window, cfg.warmup, float(cfg.jump)
    )
    state.recent = deque(kept.tolist())
    zeros = [0.0] * len(lr)
    return score.tolist(), breach.tolist(), top.tolist(), zeros, limit.tolist()


def _judge(
    state: LrState, cfg: LrConfig, lr: float, step: int, first_step: int | None
) -> tuple[float, bool, float, float, float]:
    """(score, breach, expected, lower, upper) of the lr logged at ``step``; keeps the step
    where a deviation started."""
    first = step if first_step is None else min(first_step, step)
    span = expected_range(state.schedule, first, step, cfg.step_offset) if state.schedule else None
    if span is not None and state.schedule is not None:
        want = expected_lr(state.schedule, step)
        lo, hi = span
        peak = float(state.schedule.get("peak_lr", hi))
        near = lo if math.isfinite(lr) and lr < lo else hi
        tol = cfg.rel_tolerance * max(abs(near), 0.01 * abs(peak), 1e-12)
        dev = max(lo - lr, lr - hi, 0.0) if math.isfinite(lr) else math.inf
        breach = dev > tol
        expected, lower, upper = (want if want is not None else lo), lo - tol, hi + tol
        score = score_of(dev / tol) if dev > 0 else 0.0
    else:
        recent = state.recent
        top = max(recent) if recent else 0.0
        finite = isfinite(lr)
        if finite:
            recent.append(lr)
            if len(recent) > cfg.jump_window:
                recent.popleft()
        limit = cfg.jump * top
        ready = len(recent) > cfg.warmup and top > 0
        breach = ready and (not finite or lr > limit)
        expected, lower, upper = top, 0.0, limit
        score = score_of(lr / limit) if ready and finite else 0.0
    if breach:
        if state.deviating_since is None:
            state.deviating_since = step
    else:
        state.deviating_since = None
    return score, breach, expected, lower, upper
