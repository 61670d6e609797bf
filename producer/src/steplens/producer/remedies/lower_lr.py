"""Lowering the learning rate by a factor, for the rest of the run.

Every param group's ``lr`` (and ``initial_lr``, which a scheduler built later starts from) is
multiplied by the factor, and so is every base lr of the scheduler (``base_lrs``: a
``LambdaLR``, the Trainer's schedules, ``OneCycleLR``'s ``max_lr`` aside), so the next
``scheduler.step()`` keeps the lower level instead of going back to the declared one. Host
numbers only; a group whose ``lr`` is a tensor is scaled in place on its device (no sync).
"""

from __future__ import annotations

from typing import Any


def unwrap_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside a wrapper (accelerate's, Lightning's) that keeps it in
    ``.optimizer``."""
    for _ in range(4):
        inner = getattr(optimizer, "optimizer", None)
        if inner is None or not hasattr(inner, "param_groups"):
            break
        optimizer = inner
    return optimizer


def _scaled(v: Any, factor: float) -> Any:
    if hasattr(v, "mul_"):
        return v.mul_(factor)
    return v * factor


def lower_lr(optimizer: Any, scheduler: Any, factor: float) -> tuple[Any, Any]:
    """Multiply the lr by ``factor``; returns the first group's lr (before, after)."""
    optimizer = unwrap_optimizer(optimizer)
    groups = optimizer.param_groups
    before = groups[0]["lr"] if groups else None
    for g in groups:
        for key in ("lr", "initial_lr"):
            if key in g:
                g[key] = _scaled(g[key], factor)
    base = getattr(scheduler, "base_lrs", None)
    if isinstance(base, list):
        scheduler.base_lrs = [_scaled(b, factor) for b in base]
    return before, (groups[0]["lr"] if groups else None)


MAX_SCALES = 16  # entries of ``lr_scale``: older ones are folded into one


def scaled_schedule(schedule: dict[str, Any], from_step: int, factor: float) -> dict[str, Any]:
    """A declared schedule (``lr_schedule``) with the lr multiplied by ``factor`` from
    ``from_step`` on: one more ``[step, factor]`` in its ``lr_scale``. Past ``MAX_SCALES``
    the oldest two become one (their product from the later step: the steps between are past)."""
    scales = [[int(s), float(f)] for s, f in schedule.get("lr_scale") or []]
    scales.append([int(from_step), float(factor)])
    while len(scales) > MAX_SCALES:
        (_, f0), (s1, f1) = scales[0], scales[1]
        scales[:2] = [[s1, f0 * f1]]
    out = dict(schedule)
    out["lr_scale"] = scales
    return out
