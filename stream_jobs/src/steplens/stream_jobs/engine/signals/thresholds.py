"""Static thresholds on hardware, communication and per-step ratios, and drifts toward them.

``Sustained`` counts consecutive breaches so a single low sample (GPU util between two
kernels) does not alert; everything else breaches on the sample itself. GPU memory and
temperature also warn *before* their limit when they drift toward it (``headroom``, judged at
samples kept every ``drift_keep_every_s``): a leak or a failing fan is seen while there is
time to act.

NVML's GPU memory (``gpu_mem_pct``, ``gpu_mem_growth``) counts what PyTorch's caching allocator
keeps reserved after tensors are freed, so a healthy run often sits above 90 % and its cache
fills toward it: both are kept as signals, and warn only for a GPU whose allocator no rank
reports (``gpu_memory.py`` judges the allocator's figures where one does); the share warns
once sustained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from steplens.schema import Record
from steplens.stream_jobs.engine.core import (
    INFO_SEV,
    WARN_SEV,
    WARNING,
    Run,
    SignalRows,
    Signals,
    score_of,
    scores_of,
)
from steplens.stream_jobs.engine.signals.allocator_keys import ALLOCATED
from steplens.stream_jobs.engine.signals.headroom import HeadroomConfig, headroom, judged_at
from steplens.stream_jobs.engine.state import Samples


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
    gpu_temp_c: float = 85.0  # GPU temperature (clocks throttle near 90 C)
    # a drift toward the memory or temperature limit that reaches it within 30 minutes
    drift: HeadroomConfig = field(default_factory=HeadroomConfig)
    # a drift keeps a sample at most this often and is judged at kept samples only: its
    # window of 120 is 20 minutes, its shortest stretch (20) over 3 (the sampler reads NVML
    # every second: 20 such samples of a GPU whose temperature moves by a degree are noise)
    drift_keep_every_s: float = 10.0
    max_gpus: int = 4096  # GPU scopes remembered as reporting their allocator (bounded)


@dataclass
class ThresholdState:
    low_util: dict[str, int] = field(default_factory=dict)  # gpu scope -> consecutive low samples
    # "<gpu scope> <metric>" -> recent (seconds, value) samples, for the drift toward the limit
    drift: dict[str, Samples] = field(default_factory=dict)
    mem_over: dict[str, int] = field(default_factory=dict)  # gpu scope -> samples over the pct
    allocator: set[str] = field(default_factory=set)  # gpu scopes with allocator reports


def above(  # noqa: PLR0917
    out: SignalRows,
    name: str,
    metric: str,
    value: float,
    limit: float,
    step: int | None,
    rank: int,
    scope: str,
    severity: str | None = WARNING,
) -> None:
    """A signal that breaches when ``value > limit``."""
    breach = math.isfinite(value) and value > limit
    out.add(
        name,
        metric,
        step,
        value,
        score_of(value / limit) if limit else 0.0,
        rank=rank,
        scope=scope,
        severity=severity if breach else None,
        expected=limit,
        upper=limit,
    )


def below(  # noqa: PLR0917
    out: SignalRows,
    name: str,
    metric: str,
    value: float,
    limit: float,
    step: int | None,
    rank: int,
    scope: str,
    breach: bool,
) -> None:
    """A signal that breaches when ``breach`` (a value under ``limit``, as the caller judges)."""
    ratio = limit / value if value > 0 else math.inf
    out.add(
        name,
        metric,
        step,
        value,
        score_of(ratio),
        rank=rank,
        scope=scope,
        severity=WARNING if breach else None,
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
    at_s: float = math.nan,
) -> tuple[ThresholdState, list[Signals]]:
    """GPU memory, temperature and utilisation, disk latency, host memory from one ``hw``
    record taken at ``at_s`` (seconds; NaN: no drift is judged)."""
    out = SignalRows()
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
            above(
                out,
                "threshold",
                "gpu_mem_pct",
                pct,
                cfg.gpu_mem_pct,
                step,
                rank,
                scope,
                WARNING if warns else None,
            )
            _drift(
                out,
                state,
                cfg,
                "gpu_mem_growth",
                scope,
                at_s,
                pct,
                cfg.gpu_mem_pct,
                step,
                rank,
                judged,
            )
        temp = gpu.get("temp_c")
        if isinstance(temp, (int, float)) and math.isfinite(temp):
            above(out, "threshold", "gpu_temp_c", temp, cfg.gpu_temp_c, step, rank, scope)
            _drift(out, state, cfg, "gpu_temp_drift", scope, at_s, temp, cfg.gpu_temp_c, step, rank)
        util = gpu.get("util_gpu")
        if isinstance(util, (int, float)) and math.isfinite(util):
            low = training and util < cfg.gpu_util_low
            count = state.low_util.get(scope, 0) + 1 if low else 0
            state.low_util[scope] = count
            below(
                out,
                "threshold",
                "gpu_util",
                float(util),
                cfg.gpu_util_low,
                step,
                rank,
                scope,
                count >= cfg.gpu_util_sustain,
            )
    for disk in data.get("disks") or []:
        lat = disk.get("io_latency_ms")
        if isinstance(lat, (int, float)):
            above(
                out,
                "threshold",
                "disk_io_latency_ms",
                float(lat),
                cfg.disk_latency_ms,
                step,
                rank,
                f"disk:{host}/{disk.get('device', '?')}",
            )
    avail, total = data.get("mem_available_bytes"), data.get("mem_total_bytes")
    if isinstance(avail, int) and isinstance(total, int) and total > 0:
        pct = 100.0 * avail / total
        below(
            out,
            "threshold",
            "host_mem_available_pct",
            pct,
            cfg.host_mem_available_pct,
            step,
            rank,
            f"host:{host}",
            pct < cfg.host_mem_available_pct,
        )
    return state, out.signals()


def _drift(  # noqa: PLR0917
    out: SignalRows,
    state: ThresholdState,
    cfg: ThresholdConfig,
    metric: str,
    scope: str,
    time_s: float,
    value: float,
    limit: float,
    step: int | None,
    rank: int,
    judged: bool = True,
) -> None:
    """``value``'s drift toward ``limit`` over the scope's kept samples (``headroom``), at a
    kept sample that is judged (``judged_at``; none between them, and without a time): its
    value is the seconds left at the current rate (``judged``: it may warn)."""
    if not math.isfinite(time_s):
        return
    key = f"{scope} {metric}"
    hist = state.drift.get(key)
    if hist is None:
        hist = state.drift[key] = Samples(maxlen=cfg.drift.window)
    if hist and time_s <= hist[-1][0]:
        hist.clear()  # the clock went back: a new sampler
    elif hist and time_s - hist[-1][0] < cfg.drift_keep_every_s:
        return
    before = hist[-1][0] if hist else None
    hist.append((time_s, float(value)))
    if not judged_at(cfg.drift, key, time_s, before):
        return
    pairs = np.array(hist, dtype=float).reshape(-1, 2)
    h = headroom(cfg.drift, pairs[:, 0], pairs[:, 1], limit)
    out.add(
        "threshold",
        metric,
        step,
        h.seconds_left,
        h.score,
        rank=rank,
        scope=scope,
        severity=WARNING if judged and h.breach else None,
        expected=cfg.drift.horizon_s,
        detail={"slope_per_s": h.slope, "limit": limit, "value": float(value)},
    )


def comm(cfg: ThresholdConfig, data: dict[str, Any], step: int | None, rank: int) -> list[Signals]:
    lat = float(data.get("latency_ms", math.nan))
    out = SignalRows()
    above(out, "threshold", "comm_latency_ms", lat, cfg.comm_latency_ms, step, rank, f"rank:{rank}")
    return out.signals()


def on_record(state: ThresholdState, cfg: ThresholdConfig, rec: Record, run: Run) -> list[Signals]:
    """A ``hw`` record's hardware thresholds (GPU utilisation only counts while the run
    steps), a ``comm`` record's latency."""
    if rec.kind == "comm":
        return comm(cfg, rec.data, rec.step, rec.rank)
    busy = rec.time_ns - run.last_step_ns < 30e9 if run.last_step_ns else False
    return hw(state, cfg, rec.data, rec.host, rec.step, rec.rank, busy, rec.time_ns / 1e9)[1]


def data_wait(  # noqa: PLR0917
    cfg: ThresholdConfig,
    data_times: np.ndarray,
    step_times: np.ndarray,
    steps: np.ndarray,
    rows: np.ndarray,
    rank: int,
    sustained: bool = False,
    streak: tuple[int, int, bool] = (0, -1, False),
) -> tuple[Signals | None, tuple[int, int, bool]]:
    """Share of each step spent waiting for data (NaN: not known), and the rank's streak
    after these rows (``streak``: before them): how many rows in a row were over the limit,
    the step of the last, and whether the rank sends windows. One row over it is a note for
    the data-bottleneck correlation; ``data_wait_steps`` rows in a row, or a ``sustained`` row
    (a window's means over its steps), warn: the rank's input pipeline holds its steps back.
    A window neither breaks nor extends the streak of the steps it summarises. A row's score
    is its share weighed by how much of a stall its streak makes (1 from the warning row on).
    A rank that sends windows sends the steps between them only when they stand out (a guard's
    outliers, a sample): those are in a row only when their steps are (a stall's steps), never
    three outliers apart; a rank that sends every step, or a mean every N steps, is in a row
    from row to row."""
    ok = (step_times > 0) & np.isfinite(data_times) & np.isfinite(step_times)
    count, last, windows = streak
    windows = windows or sustained
    if not ok.any():
        return None, (count, last, windows)
    share = data_times[ok] / step_times[ok]  # finite over positive: finite
    limit = cfg.data_wait_share
    breach = share > limit
    held = np.zeros(len(share), dtype=bool)
    # how much of a stall each row makes (its rows in a row over the limit, of those that
    # warn): a step's share weighed by it, so a lone slow step scores below a stall's
    part = np.ones(len(share))
    need = max(cfg.data_wait_steps, 1)
    for i, (over, step) in enumerate(zip(breach.tolist(), steps[ok].tolist(), strict=True)):
        if sustained:  # a window is judged over its own span: the steps' streak goes on
            held[i] = True
            continue
        apart = windows and count and step != last + 1
        count = 0 if not over else 1 if apart else count + 1
        last = step
        held[i] = count >= cfg.data_wait_steps
        part[i] = min(max(count, 1), need) / need
    streak = (count, last, windows)
    score = scores_of(share * part / limit) if limit else np.zeros(len(share))
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
