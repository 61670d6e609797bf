"""GPU memory judged the way out-of-memory errors happen, from ``hw`` records.

NVML's "used" counts what PyTorch's caching allocator keeps reserved after tensors are freed, so
a healthy run often sits above 90 % of the device: the NVML share stays a signal and warns only
for a GPU whose allocator no rank reports (``thresholds.py``). Where a rank reports its
allocator (the ``torch_*`` keys of a GPU entry, ``steplens.schema.kinds.Hw``), the memory
training holds is judged, while the run steps:

* ``memory:alloc_growth``: the allocator's high-water mark (its peak, or the allocated bytes
  when higher) drifting toward the limit the allocator can reach (reserved plus the device's
  free memory), judged by ``headroom`` over the kept samples: a Theil-Sen slope whose lower
  bound reaches the limit within 30 minutes warns, with the time (and the steps, at the run's
  pace) left; under ``eta_critical_s`` it is critical. A steady run at 95 % NVML-used has a
  flat mark: quiet.
* ``memory:alloc_retries`` / ``memory:fragmentation``: the allocator freed its cache and
  retried a cudaMalloc (``num_alloc_retries``) in ``retry_samples`` samples of the last
  ``retry_window_s`` seconds (a rank reports its allocator every 30 s, every 5 s while its
  mark climbs, and at once when it retried). With a large share of the reserved memory unallocated
  (``fragmented_share``) the cause is fragmentation, else the memory is simply full.
* ``memory:ooms``: the allocator raised an out-of-memory error (``num_ooms`` rose): critical.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from steplens.schema import Record
from steplens.stream_jobs.engine.core import (
    WARNING,
    Run,
    SignalRows,
    Signals,
    counter_rise,
    finite,
    score_of,
)
from steplens.stream_jobs.engine.signals.allocator_keys import (
    ALLOCATED,
    LIMIT,
    OOMS,
    PEAK,
    RESERVED,
    RETRIES,
)
from steplens.stream_jobs.engine.signals.headroom import HeadroomConfig
from steplens.stream_jobs.engine.signals.memory_trend import growth
from steplens.stream_jobs.engine.state import Samples


@dataclass
class GpuMemoryConfig:
    keep_every_s: float = 5.0  # allocator samples kept for the trend at most this often
    # the mark's drift toward the limit: its window (120 kept samples: an hour of a steady
    # rank's, sent every 30 s; 10 minutes of a climbing one's, every 5 s), the samples before
    # a verdict, the time left that warns (30 minutes), judged every 10 s at most (a steady
    # rank's samples, 30 s apart, are each judged)
    trend: HeadroomConfig = field(default_factory=lambda: HeadroomConfig(judge_every_s=10.0))
    eta_critical_s: float = 300.0  # the time left that is critical
    retry_window_s: float = 60.0  # the retries' window
    retry_samples: int = 3  # samples with new retries among them that warn
    fragmented_share: float = 0.25  # (reserved - allocated) / reserved: fragmentation
    busy_s: float = 120.0  # the run steps: a step record this recent (windows: every 10 s)
    max_gpus: int = 4096  # GPUs followed per run (bounded under abuse); the rest are counted


@dataclass
class GpuMemoryState:
    gpus: set[str] = field(default_factory=set)  # GPU scopes followed
    # GPU scope -> kept samples [time s, high-water bytes, limit bytes, run's last step]
    marks: dict[str, Samples] = field(default_factory=dict)
    # times (s) of the samples with new retries, the last ``retry_samples``
    retried: dict[str, deque[float]] = field(default_factory=dict)
    counters: dict[str, list[float]] = field(default_factory=dict)  # last [retries, ooms]
    overflow: int = 0  # samples of GPUs past ``max_gpus``


def _known(state: GpuMemoryState, cfg: GpuMemoryConfig, scope: str) -> bool:
    """Whether ``scope`` is followed (a new one within the bound becomes followed)."""
    if scope in state.gpus:
        return True
    if len(state.gpus) >= cfg.max_gpus:
        state.overflow += 1
        return False
    state.gpus.add(scope)
    return True


def _number(x: Any) -> float:
    return float(x) if finite(x) else math.nan


def allocator(  # noqa: PLR0917
    out: SignalRows,
    state: GpuMemoryState,
    cfg: GpuMemoryConfig,
    gpu: dict[str, Any],
    scope: str,
    t_s: float,
    busy: bool,
    last_step: int,
    step: int | None,
    rank: int,
) -> None:
    """The allocator's signals of one GPU entry that carries its report."""
    alloc, reserved, peak, limit = (_number(gpu.get(k)) for k in (ALLOCATED, RESERVED, PEAK, LIMIT))
    if math.isnan(alloc) or math.isnan(reserved) or not limit > 0:  # NaN: not reported
        return
    high = peak if peak >= alloc else alloc
    marks = state.marks.get(scope)
    if marks is None:
        marks = state.marks[scope] = Samples(maxlen=cfg.trend.window)
    growth(out, marks, cfg, "alloc_growth", scope, t_s, high, limit, busy, last_step, step, rank)
    now = [_number(gpu.get(k)) for k in (RETRIES, OOMS)]
    before = state.counters.get(scope)
    state.counters[scope] = now
    if before is None:
        return  # a baseline: what happened before the run's first report is not counted
    new_retries, new_ooms = (
        c - b if c >= b else 0.0
        for c, b in zip(now, before, strict=True)  # NaN: False
    )
    got = state.retried.get(scope)
    if got is None:
        got = state.retried[scope] = deque(maxlen=cfg.retry_samples)
    if new_retries > 0:
        got.append(t_s)
    n = sum(1 for t in got if t_s - t < cfg.retry_window_s)
    retrying = n >= cfg.retry_samples
    cache = (reserved - alloc) / reserved if reserved > 0 else 0.0
    fragmented = cache >= cfg.fragmented_share
    detail = {
        "retry_samples": n,
        "cache_share": round(cache, 4),
        "allocated_bytes": alloc,
        "reserved_bytes": reserved,
        "limit_bytes": limit,
    }
    score = score_of(n / cfg.retry_samples)
    for metric, breach in (
        ("alloc_retries", retrying and not fragmented),
        ("fragmentation", retrying and fragmented),
    ):
        value = float(n) if metric == "alloc_retries" else cache
        out.add(
            "memory",
            metric,
            step,
            value,
            score,
            rank=rank,
            scope=scope,
            severity=WARNING if breach else None,
            expected=float(cfg.retry_samples) if metric == "alloc_retries" else None,
            detail=detail if breach else None,
        )
    counter_rise(
        out,
        "memory",
        "ooms",
        step,
        new_ooms,
        rank=rank,
        scope=scope,
        detail={**detail, "ooms": now[1]},
    )


def hw(  # noqa: PLR0917
    state: GpuMemoryState,
    cfg: GpuMemoryConfig,
    data: dict[str, Any],
    host: str,
    time_ns: int,
    busy: bool,
    last_step: int,
    step: int | None,
    rank: int,
) -> list[Signals]:
    """Every GPU entry of one ``hw`` record: its NVML figures and its allocator report."""
    out = SignalRows()
    for gpu in data.get("gpus") or []:
        scope = f"gpu:{host}/{gpu.get('index', 0)}"
        if finite(gpu.get(ALLOCATED)) and _known(state, cfg, scope):
            allocator(out, state, cfg, gpu, scope, time_ns / 1e9, busy, last_step, step, rank)
    return out.signals()


def on_record(state: GpuMemoryState, cfg: GpuMemoryConfig, rec: Record, run: Run) -> list[Signals]:
    busy = bool(run.last_step_ns) and rec.time_ns - run.last_step_ns < cfg.busy_s * 1e9
    return hw(state, cfg, rec.data, rec.host, rec.time_ns, busy, run.last_step, rec.step, rec.rank)
