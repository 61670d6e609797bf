"""Learning-rate schedule: the logged lr must follow the declared schedule (``run_meta``).

The logged lr is compared with the declared lr over the steps it may stand for: a step record's
lr may be the one of its own step or of a neighbour (PyTorch schedulers are stepped after the
optimizer, so ``get_last_lr()`` read after ``scheduler.step()`` is the next step's lr), and a
window's mean stands for every step of the window. Between those steps the declared lr is monotone
except across the warmup peak, so the range of the declared values at the ends (and at the peak)
bounds every value the logged lr may rightly take.

A schedule may carry ``lr_scale``, ``[[from_step, factor], ...]``: the lr a remedy lowered
(``lower_lr``), multiplied by each factor from its step on; the producer sends the schedule
again with it, so a lowered lr is no deviation.

Without a declared schedule the lr may only rise smoothly: a jump above ``jump`` x the largest
recent lr is a deviation. The signal carries the step where the deviation started.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from steplens.stream_jobs.engine.core import NO_STEP, WARN_SEV, Column, Signals, scores_of
from steplens.stream_jobs.engine.signals.kernels import jit, score

_EMPTY = np.empty(0)


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
    recent: np.ndarray = field(default_factory=lambda: _EMPTY)  # the last jump_window finite lrs
    deviating_since: int | None = None


KINDS = ("constant", "linear", "cosine", "step", "wsd")
DECAYS = ("linear", "cosine", "1-sqrt")  # the shapes of a ``wsd`` schedule's decay


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
    decay = out.get("decay_type")
    if decay is not None and decay not in DECAYS:
        raise ValueError(
            f"lr_schedule.decay_type: must be one of {', '.join(DECAYS)}, got {decay!r}"
        )
    for key in ("warmup_steps", "total_steps", "decay_steps"):
        v = out.get(key)
        if v is not None:
            if not _real(v) or v < 0 or v != int(v):
                raise ValueError(f"lr_schedule.{key}: must be a whole number >= 0, got {v!r}")
            out[key] = int(v)
    ms = out.get("milestones")
    if ms is not None and not (isinstance(ms, list) and all(_count(m) for m in ms)):
        raise ValueError(f"lr_schedule.milestones: must be a list of step numbers, got {ms!r}")
    scale = out.get("lr_scale")
    if scale is not None:
        out["lr_scale"] = _check_scale(scale)
    return out


MAX_SCALES = 64  # ``lr_scale`` entries


def _check_scale(scale: Any) -> list[list[Any]]:
    """``[[step, factor], ...]`` by step (lists, as the state stores them)."""
    ok = isinstance(scale, list) and len(scale) <= MAX_SCALES
    pairs: list[list[Any]] = []
    for p in scale if ok else ():
        if not (isinstance(p, (list, tuple)) and len(p) == 2 and _count(p[0]) and _real(p[1])):
            ok = False
            break
        if not 0 < p[1] <= 1:
            ok = False
            break
        pairs.append([int(p[0]), float(p[1])])
    if not ok:
        raise ValueError(
            f"lr_schedule.lr_scale: must be at most {MAX_SCALES} [step, factor in (0, 1]] "
            f"pairs, got {scale!r}"
        )
    return sorted(pairs)


def lr_scale(schedule: dict[str, Any], step: int) -> float:
    """The product of the ``lr_scale`` factors in force at ``step`` (1.0: none)."""
    out = 1.0
    for from_step, factor in schedule.get("lr_scale") or ():
        if step >= from_step:
            out *= factor
    return out


def _real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def warmup_end(schedule: dict[str, Any] | None) -> int:
    """The step the declared warmup ends at (0: none declared)."""
    if not schedule:
        return 0
    w = schedule.get("warmup_steps")
    return int(w) if isinstance(w, (int, float)) and not isinstance(w, bool) else 0


def expected_lr(schedule: dict[str, Any], step: int) -> float | None:
    """The declared lr at ``step``: linear warmup, then constant / linear / cosine / step decay
    or warmup-stable-decay (``wsd``: the peak until the last ``decay_steps`` steps before
    ``total_steps``, then ``decay_type`` down to ``min_lr``), times the ``lr_scale`` factors in
    force."""
    lr = _declared_lr(schedule, step)
    if lr is None or not schedule.get("lr_scale"):
        return lr
    return lr * lr_scale(schedule, step)


def _declared_lr(schedule: dict[str, Any], step: int) -> float | None:
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
    start = warm
    if kind == "wsd":
        start = max(warm, total - int(schedule.get("decay_steps") or 0))
        if step < start:
            return peak
    progress = min(1.0, max(0.0, (step - start) / max(1, total - start)))
    shape = (schedule.get("decay_type") or "cosine") if kind == "wsd" else kind
    if shape == "linear":
        return peak + (floor - peak) * progress
    if shape == "cosine":
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if shape == "1-sqrt":
        return floor + (peak - floor) * (1.0 - math.sqrt(progress))
    return None


def _drops(schedule: dict[str, Any]) -> list[int]:
    """The steps where the declared lr drops at once: a step schedule's milestones and the
    steps a remedy lowered it from (``lr_scale``)."""
    out = [m for m in schedule.get("milestones") or [] if isinstance(m, int)]
    out.extend(int(p[0]) for p in schedule.get("lr_scale") or ())
    return out


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
    for m in _drops(schedule):  # both sides of each drop
        if lo_step < m <= hi_step:
            probes.update((m - 1, m))
    values = [v for v in (expected_lr(schedule, s) for s in probes) if v is not None]
    return (min(values), max(values)) if values else None


def update(state: LrState, cfg: LrConfig, metric: str, col: Column) -> Signals | None:
    """Score the lrs logged at the column's steps (a window's mean where ``col.firsts`` gives
    the window's first step); keeps the step where a deviation started."""
    if not (col.steps != NO_STEP).all():  # an lr without a step is not judged
        keep = col.steps != NO_STEP
        if not keep.any():
            return None
        col = Column(
            col.xs[keep],
            col.steps[keep],
            col.rows[keep],
            col.rank,
            firsts=None if col.firsts is None else col.firsts[keep],
        )
    lr, steps = col.xs, col.steps
    schedule = state.schedule
    if schedule and isinstance(schedule.get("peak_lr"), (int, float)):
        firsts = steps if col.firsts is None else np.minimum(col.firsts, steps)
        score_, breach, expected, lower, upper = _against_schedule(schedule, cfg, lr, firsts, steps)
    else:
        score_, breach, expected, upper, state.recent = _lr_recent(
            state.recent, lr, int(cfg.jump_window), int(cfg.warmup), float(cfg.jump)
        )
        lower = np.zeros(len(lr))
    details: list[dict[str, Any] | None] | None = None
    since = state.deviating_since
    if breach.any():
        details = []
        for b, step in zip(breach.tolist(), steps.tolist(), strict=True):
            if b:
                since = step if since is None else since
                details.append({"since_step": since})
            else:
                since = None
                details.append(None)
    else:
        since = None
    state.deviating_since = since
    sev = np.where(breach, WARN_SEV, 0).astype(np.int8)
    return Signals(
        "lr_schedule",
        "lr",
        col.rows,
        steps,
        lr,
        score_,
        sev,
        expected,
        lower,
        upper,
        col.rank,
        "run",
        details,
    )


def _against_schedule(
    schedule: dict[str, Any], cfg: LrConfig, lr: np.ndarray, firsts: np.ndarray, at: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each lr against the range of the declared lrs over its steps (``expected_range``): the
    declared lr is computed once per step seen (``expected_lr``, in Python), the ranges and
    scores with numpy. Returns (scores, breaches, expected, lower, upper)."""
    off = cfg.step_offset
    lo_at, hi_at = np.maximum(firsts - off, 0), np.maximum(at + off, 0)
    known: dict[int, float] = {}

    def declared(points: np.ndarray) -> np.ndarray:
        out = []
        for p in points.tolist():
            v = known.get(p)
            if v is None:
                v = known[p] = expected_lr(schedule, p) or 0.0  # a numeric peak: never None
            out.append(v)
        return np.array(out, dtype=float)

    e_lo, e_hi, want = declared(lo_at), declared(hi_at), declared(at)
    lo, hi = np.minimum(e_lo, e_hi), np.maximum(e_lo, e_hi)
    warm = int(schedule.get("warmup_steps") or 0)
    extra: list[tuple[np.ndarray, tuple[int, ...]]] = [
        ((lo_at <= p) & (p <= hi_at), (p,)) for p in (warm - 1, warm)
    ]
    for m in _drops(schedule):
        extra.append(((lo_at < m) & (m <= hi_at), (m - 1, m)))
    for inside, points in extra:
        if inside.any():
            for p in points:
                v = float(declared(np.array([p]))[0])
                lo = np.where(inside, np.minimum(lo, v), lo)
                hi = np.where(inside, np.maximum(hi, v), hi)
    peak = float(schedule["peak_lr"])
    finite = np.isfinite(lr)
    near = np.where(finite & (lr < lo), lo, hi)
    tol = cfg.rel_tolerance * np.maximum(np.maximum(np.abs(near), 0.01 * abs(peak)), 1e-12)
    with np.errstate(invalid="ignore"):
        dev = np.where(finite, np.maximum(np.maximum(lo - lr, lr - hi), 0.0), np.inf)
        score_ = np.where(dev > 0, scores_of(dev / tol), 0.0)
    return score_, dev > tol, want, lo - tol, hi + tol


@jit
def _lr_recent(
    recent: np.ndarray, lr: np.ndarray, window: int, warmup: int, jump: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each lr against ``jump`` x the largest of the (at most ``window``) finite lrs before
    it (``recent``: those before the first); a non-finite lr breaches once warmed up.

    Returns (scores, breaches, tops, limits, the last ``window`` finite lrs)."""
    n = len(lr)
    seq = np.empty(len(recent) + n)
    seq[: len(recent)] = recent
    head, end = 0, len(recent)
    scores = np.zeros(n)
    breach = np.zeros(n, np.bool_)
    tops = np.empty(n)
    limits = np.empty(n)
    for i in range(n):
        top = 0.0
        if end > head:
            top = seq[head]
            for j in range(head + 1, end):
                top = max(top, seq[j])
        x = lr[i]
        finite = math.isfinite(x)
        if finite:
            seq[end] = x
            end += 1
            if end - head > window:
                head += 1
        limit = jump * top
        ready = end - head > warmup and top > 0
        breach[i] = ready and (not finite or x > limit)
        tops[i] = top
        limits[i] = limit
        if ready and finite:
            scores[i] = score(x / limit)
    return scores, breach, tops, limits, seq[head:end].copy()


def warm_up_kernel() -> None:
    one = np.ones(8)
    update(LrState(), LrConfig(), "lr", Column(one, np.arange(8), np.zeros(8, np.int64)))
