"""The per-step reference of the package's compiled straggler judgement, in plain Python (its
medians ``statistics.median``'s, its score written out): the property tests hold the package
equal to it."""

from __future__ import annotations

import math
from collections import deque
from statistics import median

from steplens.stream_jobs.engine.core import WARNING, Signal
from steplens.stream_jobs.engine.signals.ranks import RanksConfig


def score(ratio: float) -> float:
    """``ratio`` (a measure over its threshold) as a score: 0.5 at 1, towards 1 above it."""
    if ratio == math.inf:
        return 1.0
    return ratio / (ratio + 1.0) if ratio > 0.0 else 0.0


def judge(
    ratios: dict[int, deque[float]], cfg: RanksConfig, step: int, times: dict[int, float]
) -> list[Signal]:
    """One step's ranks (``times``, in their order) against the step's median; ``ratios``:
    each rank's recent ratios, updated."""
    if len(times) < 2:
        return []
    med = median(times.values())
    factor, keep = cfg.straggler_factor, cfg.straggler_steps
    upper = factor * med
    out = []
    for rank, t in times.items():
        ratio = t / med if med > 0 else 1.0
        recent = ratios.get(rank)
        if recent is None:
            recent = ratios[rank] = deque(maxlen=keep)
        recent.append(ratio)
        typical = median(recent)  # one slow step (GC, a checkpoint) is not a straggler
        slow = len(recent) == keep and typical > factor
        r = typical / factor
        out.append(
            Signal(
                "straggler",
                "step_time_s",
                step,
                typical,
                score(r),
                rank,
                f"rank:{rank}",
                WARNING if slow else None,
                med,
                None,
                upper,
                # step times alone (no data waits): a straggler computes slowly
                {"rank": rank, "waits_on": "compute"} if slow else None,
            )
        )
    return out
