"""The per-value reference of the compiled clipping-rate detector: the property tests hold the
package equal to it, value by value."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from steplens.stream_jobs.engine.core import WARNING, Signal, score_of
from steplens.stream_jobs.engine.signals.clipping import ClipConfig


@dataclass
class ClipState:
    kept: deque[tuple[int, float]] = field(default_factory=deque)  # (steps, clipped steps)
    warm: int = 0  # the declared warmup's end


def update(
    state: ClipState, cfg: ClipConfig, x: float, step: int, count: int = 1, rank: int = 0
) -> list[Signal]:
    """A share ``x`` of ``count`` watched steps ending at ``step``."""
    if step < state.warm or count <= 0:
        return []
    state.kept.append((count, min(max(x, 0.0), 1.0) * count))
    while len(state.kept) > 1 and sum(c for c, _ in state.kept) - state.kept[0][0] >= cfg.window:
        state.kept.popleft()
    steps = sum(c for c, _ in state.kept)
    rate = sum(v for _, v in state.kept) / steps
    judged = steps >= cfg.min_values
    return [
        Signal(
            "clipping",
            "clipped",
            step,
            rate,
            score_of(rate / cfg.threshold) if judged else math.nan,
            rank,
            "run",
            WARNING if judged and rate > cfg.threshold else None,
            cfg.threshold if judged else None,
            None,
            cfg.threshold if judged else None,
        )
    ]
