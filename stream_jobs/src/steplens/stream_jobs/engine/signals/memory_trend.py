"""A memory figure drifting toward its limit, judged at kept samples by ``headroom``: the one
judgment of ``memory:alloc_growth`` (a GPU's allocator, ``gpu_memory``) and
``memory:rss_growth`` (a rank's process on its host, ``host_memory``).

Samples are kept at most every ``keep_every_s`` while the run steps (``busy``: loading a
model, evaluating or a stopped run is not the steps' memory, and clears the trend); a
Theil-Sen slope whose lower bound reaches the limit within ``horizon_s`` warns, with the
time (and the steps, at the run's pace) left; under ``eta_critical_s`` it is critical."""

from __future__ import annotations

from collections import deque
from typing import Protocol

import numpy as np

from steplens.stream_jobs.engine.core import CRITICAL, WARNING, SignalRows
from steplens.stream_jobs.engine.signals.headroom import HeadroomConfig, headroom, judged_at


class TrendSettings(Protocol):
    keep_every_s: float
    trend: HeadroomConfig
    eta_critical_s: float


def growth(  # noqa: PLR0917
    out: SignalRows,
    marks: deque[tuple[float, ...]],
    cfg: TrendSettings,
    metric: str,
    scope: str,
    t_s: float,
    high: float,
    limit: float,
    busy: bool,
    last_step: int,
    step: int | None,
    rank: int,
) -> None:
    """``memory:<metric>`` at a kept sample that is judged (``judged_at``; none between them),
    added to ``out``: ``marks``
    (the scope's kept ``[time s, value, limit, run's last step]``, updated) with ``high``
    now; the signal's value is the estimated seconds to ``limit`` (inf: not climbing)."""
    if not busy:
        marks.clear()
    elif not marks or t_s - marks[-1][0] >= cfg.keep_every_s:
        before = marks[-1][0] if marks else None
        marks.append((t_s, high, limit, float(last_step)))
        if not judged_at(cfg.trend, f"{scope} {metric}", t_s, before):
            return
    else:
        return  # judged at kept samples only
    arr = np.asarray(marks, dtype=np.float64).reshape(-1, 4)
    h = headroom(cfg.trend, arr[:, 0], arr[:, 1], limit)
    severity, detail = None, None
    if h.breach:
        severity = CRITICAL if h.seconds_left <= cfg.eta_critical_s else WARNING
        first, last = marks[0], marks[-1]
        detail = {
            "eta_s": round(h.seconds_left, 1),
            "eta_min": round(h.seconds_left / 60.0, 1),
            "slope_mib_per_min": round(h.slope * 60.0 / 2**20, 2),
            "high_water_bytes": high,
            "limit_bytes": limit,
        }
        pace = (last[3] - first[3]) / (last[0] - first[0]) if last[0] > first[0] else 0.0
        if first[3] >= 0 and pace > 0:
            detail["eta_steps"] = int(h.seconds_left * pace)
    out.add(
        "memory",
        metric,
        step,
        h.seconds_left,
        h.score,
        rank=rank,
        scope=scope,
        severity=severity,
        expected=cfg.trend.horizon_s,
        lower=cfg.trend.horizon_s,
        detail=detail if severity else None,
    )
