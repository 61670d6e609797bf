"""Static thresholds on hardware, communication and per-step ratios.

``Sustained`` counts consecutive breaches so a single low sample (GPU util between two
kernels) does not alert; everything else breaches on the sample itself.

NVML's GPU memory (``gpu_mem_pct``, ``gpu_mem_growth``) counts what PyTorch's caching allocator
keeps reserved after tensors are freed, so a healthy run often sits above 90 %: both are kept
as signals, and warn only for a GPU whose allocator no rank reports (``gpu_memory.py`` judges
the allocator's figures where one does); the share warns once sustained.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from steplens.schema import Record
from steplens.stream_jobs.engine.core import (
    INFO_SEV,
    WARN_SEV,
    WARNING,
    Run,
    Signals,
    one,
    score_of,
    scores_of,
)
from steplens.stream_jobs.engine.signals.gpu_memory import ALLOCATED


@dataclass
class ThresholdConfig:
    gpu_mem_pct: float = 90.0  # NVML used share, judged for GPUs without allocator reports
    gpu_mem_sustain: int = 3  # consecutive hw samples over it
    gpu_util_low: float = 60.0
    gpu_util_sustain: int = 3  # consecutive hw samples
    comm_latency_ms: float = 50.0
    disk_latency_ms: float = 10.0
    host_mem_available_pct: float = 5.0
    data_wait_share: float = 0.3  # data_time_s / step_time_s
    data_wait_steps: int = 3  # consecutive steps over the share that warn (a window warns alone)
    mem_growth_samples: int = 6  # GPU memory rising at every one of this many samples
    mem_growth_pct: float = 2.0  # ... by at least this share of the total in all
    max_gpus: int = 4096  # GPU scopes remembered as reporting their allocator (bounded)


@dataclass
class ThresholdState:
    low_util: dict[str, int] = field(default_factory=dict)  # gpu scope -> consecutive low samples
    mem: dict[str, deque[float]] = field(default_factory=dict)  # gpu scope -> recent used %
    mem_over: dict[str, int] = field(default_factory=dict)  # gpu scope -> samples over the pct
    allocator: set[str] = field(default_factory=set)  # gpu scopes with allocator reports


def above(  # noqa: PLR0917
    name: str,
    metric: str,
    value: float,
    limit: float,
    step: int | None,
    rank: int,
    scope: str,
    severity: str | None = WARNING,
) -> Signals:
    """A signal that breaches when ``value > limit``."""
    breach = math.isfinite(value) and value > limit
    return one(
        name,
        metric,
        step,
        value,
        score_of(value / limit) if limit else 0.0,
        rank,
        scope,
        severity if breach else None,
        expected=limit,
        upper=limit,
    )


def below(  # noqa: PLR0917
    name: str,
    metric: str,
    value: float,
    limit: float,
    step: int | None,
    rank: int,
    scope: str,
    breach: bool,
) -> Signals:
    ratio = limit / value if value > 0 else math.inf
    return one(
        name,
        metric,
        step,
        value,
        score_of(ratio),
        rank,
        scope,
        WARNING if breach else None,
        expected=limit,
        lower=limit,
    )


def hw(  # noqa: PLR0917
    state: ThresholdState,
    cfg: ThresholdConfig,
    data: dict[str, Any],
    host: str,
    step: int | None,
    rank: int,
    training: bool,
) -> tuple[ThresholdState, list[Signals]]:
    """GPU memory and utilisation, disk latency, host memory from one ``hw`` record."""
    out: list[Signals] = []
    for gpu in data.get("gpus") or []:
        scope = f"gpu:{host}/{gpu.get('index', 0)}"
        if ALLOCATED in gpu and len(state.allocator) < cfg.max_gpus:
            state.allocator.add(scope)
        used, total = gpu.get("mem_used_bytes"), gpu.get("mem_total_bytes")
        if isinstance(used, (int, float)) and isinstance(total, (int, float)) and total > 0:
            pct = 100.0 * used / total
            judged = scope not in state.allocator
            over = state.mem_over.get(scope, 0) + 1 if pct > cfg.gpu_mem_pct else 0
            state.mem_over[scope] = over
            warns = judged and over >= cfg.gpu_mem_sustain
            out.append(
                above(
                    "threshold",
                    "gpu_mem_pct",
                    pct,
                    cfg.gpu_mem_pct,
                    step,
                    rank,
                    scope,
                    WARNING if warns else None,
                )
            )
            out.append(_growth(state, cfg, scope, pct, step, rank, judged))
        util = gpu.get("util_gpu")
        if isinstance(util, (int, float)) and math.isfinite(util):
            low = training and util < cfg.gpu_util_low
            count = state.low_util.get(scope, 0) + 1 if low else 0
            state.low_util[scope] = count
            out.append(
                below(
                    "threshold",
                    "gpu_util",
                    float(util),
                    cfg.gpu_util_low,
                    step,
                    rank,
                    scope,
                    count >= cfg.gpu_util_sustain,
                )
            )
    for disk in data.get("disks") or []:
        lat = disk.get("io_latency_ms")
        if isinstance(lat, (int, float)):
            out.append(
                above(
                    "threshold",
                    "disk_io_latency_ms",
                    float(lat),
                    cfg.disk_latency_ms,
                    step,
                    rank,
                    f"disk:{host}/{disk.get('device', '?')}",
                )
            )
    avail, total = data.get("mem_available_bytes"), data.get("mem_total_bytes")
    if isinstance(avail, int) and isinstance(total, int) and total > 0:
        pct = 100.0 * avail / total
        out.append(
            below(
                "threshold",
                "host_mem_available_pct",
                pct,
                cfg.host_mem_available_pct,
                step,
                rank,
                f"host:{host}",
                pct < cfg.host_mem_available_pct,
            )
        )
    return state, out


def _growth(  # noqa: PLR0917
    state: ThresholdState,
    cfg: ThresholdConfig,
    scope: str,
    pct: float,
    step: int | None,
    rank: int,
    judged: bool = True,
) -> Signals:
    """Memory that rises at every sample: a leak, long before the 90 % threshold (``judged``:
    it may warn)."""
    hist = state.mem.get(scope)
    if hist is None:
        hist = state.mem[scope] = deque(maxlen=cfg.mem_growth_samples)
    hist.append(pct)
    rise = hist[-1] - hist[0]
    steady = len(hist) == hist.maxlen and all(
        b > a for a, b in zip(hist, list(hist)[1:], strict=False)
    )
    breach = judged and steady and rise >= cfg.mem_growth_pct
    return one(
        "threshold",
        "gpu_mem_growth",
        step,
        rise,
        score_of(rise / cfg.mem_growth_pct) if steady else 0.0,
        rank,
        scope,
        WARNING if breach else None,
        expected=cfg.mem_growth_pct,
    )


def comm(cfg: ThresholdConfig, data: dict[str, Any], step: int | None, rank: int) -> list[Signals]:
    lat = float(data.get("latency_ms", math.nan))
    return [
        above("threshold", "comm_latency_ms", lat, cfg.comm_latency_ms, step, rank, f"rank:{rank}")
    ]


def on_record(state: ThresholdState, cfg: ThresholdConfig, rec: Record, run: Run) -> list[Signals]:
    """A ``hw`` record's hardware thresholds (GPU utilisation only counts while the run
    steps), a ``comm`` record's latency."""
    if rec.kind == "comm":
        return comm(cfg, rec.data, rec.step, rec.rank)
    busy = rec.time_ns - run.last_step_ns < 30e9 if run.last_step_ns else False
    return hw(state, cfg, rec.data, rec.host, rec.step, rec.rank, busy)[1]


def data_wait(  # noqa: PLR0917
    cfg: ThresholdConfig,
    data_times: np.ndarray,
    step_times: np.ndarray,
    steps: np.ndarray,
    rows: np.ndarray,
    rank: int,
    sustained: bool = False,
    streak: int = 0,
) -> tuple[Signals | None, int]:
    """Share of each step spent waiting for data (NaN: not known), and the rank's streak of
    consecutive steps over the limit after these rows (``streak``: before them). One step over
    it is a note for the data-bottleneck correlation; ``data_wait_steps`` in a row, or a
    ``sustained`` row (a window's means over its steps), warn: the rank's input pipeline holds
    its steps back."""
    ok = (step_times > 0) & np.isfinite(data_times) & np.isfinite(step_times)
    if not ok.any():
        return None, streak
    share = data_times[ok] / step_times[ok]  # finite over positive: finite
    limit = cfg.data_wait_share
    breach = share > limit
    held = np.zeros(len(share), dtype=bool)
    for i, over in enumerate(breach):
        streak = streak + 1 if over else 0
        held[i] = sustained or streak >= cfg.data_wait_steps
    score = scores_of(share / limit) if limit else np.zeros(len(share))
    return Signals.of(
        "threshold",
        "data_wait_share",
        rows[ok],
        steps[ok],
        share,
        score,
        np.where(breach, np.where(held, WARN_SEV, INFO_SEV), 0),
        limit,
        None,
        limit,
        rank,
        f"rank:{rank}",
    ), streak
