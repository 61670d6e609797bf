"""Live values scored against the 7-day baseline's bands (``seasonal_baseline``), at the rollup
resolution: each series' values of a minute are averaged, and the minute's mean, once the
minute closes, is judged against the band of that minute.

Series: per GPU of a host (utilisation, temperature, power, memory used), per disk (read +
write MB/s) and network interface (rx + tx MB/s) from ``hw`` records; per followed rank (the
run's ``series_ranks``), step time and tokens/s from its steps. Each keeps its newest
``in_run_window`` minute means: what the in-run fallback is fitted on when the stores cannot
be read. Bands come from outside (``apply``: the worker's fit pool reads the stores and fits;
``fit_inline`` in tests and benches): ``due`` says which series want one.

A minute outside its band (and ``min_change``, 10 %, off its expected value) ``persist``
times in a row (ten) warns (``baseline:<metric>``: the "hardware" topic, step time and
tokens/s the "throughput" one); throughput warns on its bad side only (slower steps, fewer
tokens); a minute of hardware samples taken mostly while the run was not stepping (an
evaluation, a checkpoint save) never counts. Every signal's detail says which baseline judged
it (``{"baseline": "7d" | "in-run", "order", "seasonal", ...}``).

Bounded: at most ``max_series`` series per run; a further one is counted (``overflow``), not
kept. Not checkpointed (``DynamicState.series``): bands and minutes are derived from what the
stores keep, and are fitted again from them after a restart.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from steplens.schema import Record
from steplens.stream_jobs.engine.columns import Columns, floats_of
from steplens.stream_jobs.engine.core import WARNING, Run, Signals, one, score_of
from steplens.stream_jobs.engine.signals.seasonal_baseline import (
    MINUTE_NS,
    Band,
    BaselineConfig,
    fit_bands,
)

NAME = "baseline"
GPU_FIELDS = {
    "util_gpu": "gpu_util",
    "temp_c": "gpu_temp_c",
    "power_w": "gpu_power_w",
    "mem_used_bytes": "gpu_mem_used_bytes",
}
DISK_FIELDS = ("read_mb_s", "write_mb_s")  # summed: disk_mb_s
NET_FIELDS = ("rx_mb_s", "tx_mb_s")  # summed: net_mb_s
STEP_METRICS = ("step_time_s", "tokens_per_s")
# the side that is bad (+1: above the band, -1: below; absent: both)
BAD_SIDE = {"step_time_s": 1, "tokens_per_s": -1}

Key = str  # "<scope>|<metric>"
IDLE_AFTER_NS = 30 * 10**9  # a hw sample this long after the run's last step: not stepping


def key_of(scope: str, metric: str) -> Key:
    return f"{scope}|{metric}"


def split_key(key: Key) -> tuple[str, str]:
    scope, _, metric = key.rpartition("|")
    return scope, metric


@dataclass
class DynamicConfig:
    persist: int = 10  # minutes outside the band in a row that warn (a hardware 'for: 10m')
    # ... each also this share off its expected value (as the ARIMA detector's change of
    # regime): a band narrowed by a quiet week does not make a small move a page
    min_change: float = 0.1
    in_run_window: int = 256  # minute means kept per series (the in-run fallback's input)
    max_series: int = 4096  # per run
    # a series' band is refitted this often, by the clock ``due`` is asked with (the worker's
    # wall clock; the records' time inline)
    refit_s: float = 3600.0
    retry_s: float = 600.0  # ... and sooner while it has none
    fit: BaselineConfig = field(default_factory=BaselineConfig)


@dataclass
class Tail:
    """One series: its open minute, its newest minute means, its band."""

    rank: int
    minute: int = -1  # the open minute (minutes since the epoch)
    total: float = 0.0
    count: int = 0
    idle: int = 0  # values of the open minute taken while the run was not stepping
    times: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # minute starts
    values: np.ndarray = field(default_factory=lambda: np.empty(0))
    outside: int = 0  # minutes outside the band in a row
    band: Band | None = None
    asked_ns: int = 0  # when it last asked for a band (``due``'s clock)


@dataclass
class DynamicState:
    # not in the stored form (``init=False``): a run's bands and minute means would make its
    # checkpoint head megabytes (a GPU series holds about 7 KB); after a restart or a move each
    # series asks for its band at its first minute, fitted from the stores, which hold them
    series: dict[Key, Tail] = field(default_factory=dict, init=False)
    overflow: int = 0  # series refused past max_series
    late: int = 0  # values of a minute already closed (not learnt)
    checked_ns: int = 0  # when ``due`` last looked (it looks once a minute at most)


def observe(  # noqa: PLR0917
    state: DynamicState,
    cfg: DynamicConfig,
    scope: str,
    metric: str,
    value: float,
    time_ns: int,
    rank: int,
    step: int | None,
    row: int = 0,
    idle: bool = False,
) -> Signals | None:
    """Add a value (``idle``: taken while the run was not stepping); the signal of the minute
    it closes (None: none closed, or no band)."""
    if not math.isfinite(value):
        return None
    key = key_of(scope, metric)
    tail = state.series.get(key)
    if tail is None:
        if len(state.series) >= cfg.max_series:
            state.overflow += 1
            return None
        tail = state.series[key] = Tail(rank)
    minute = time_ns // MINUTE_NS
    if minute == tail.minute:
        tail.total += value
        tail.count += 1
        tail.idle += idle
        return None
    if minute < tail.minute:
        state.late += 1
        return None
    out = _close(tail, cfg, scope, metric, step, row)
    tail.minute, tail.total, tail.count, tail.idle = minute, value, 1, int(idle)
    return out


def _close(  # noqa: PLR0917
    tail: Tail, cfg: DynamicConfig, scope: str, metric: str, step: int | None, row: int
) -> Signals | None:
    """The open minute's mean, kept and judged."""
    if tail.count == 0:
        return None
    mean = tail.total / tail.count
    start = tail.minute * MINUTE_NS
    keep = cfg.in_run_window
    tail.times = np.append(tail.times[-keep + 1 :], start)
    tail.values = np.append(tail.values[-keep + 1 :], mean)
    got = tail.band.at(start) if tail.band is not None else None
    if got is None or tail.band is None:
        tail.outside = 0
        return None
    expected, lower, upper = got
    above, below = mean > upper, mean < lower
    # a minute mostly idle (evaluation, a checkpoint save, a stall: the stall detectors' case)
    # is judged but never counts towards a warning: its hardware is expected to differ
    bad = outside(cfg, metric, mean, expected, lower, upper) and 2 * tail.idle < tail.count
    tail.outside = tail.outside + 1 if bad else 0
    half = (upper - lower) / 2
    ratio = abs(mean - expected) / half if half > 0 else (math.inf if mean != expected else 0.0)
    return one(
        NAME,
        metric,
        step,
        mean,
        score_of(ratio) if bad or not (above or below) else min(score_of(ratio), 0.49),
        rank=tail.rank,
        scope=scope,
        severity=WARNING if tail.outside >= cfg.persist else None,
        expected=expected,
        lower=lower,
        upper=upper,
        detail={**tail.band.detail(), "minute_ns": start},
        row=row,
    )


def outside(  # noqa: PLR0917
    cfg: DynamicConfig, metric: str, value: float, expected: float, lower: float, upper: float
) -> bool:
    """Whether a minute counts towards a warning: outside its band on the metric's bad side,
    and ``min_change`` off its expected value."""
    side = BAD_SIDE.get(metric, 0)
    out = (value > upper and side >= 0) or (value < lower and side <= 0)
    return out and abs(value - expected) >= cfg.min_change * abs(expected)


def on_record(state: DynamicState, cfg: DynamicConfig, rec: Record, run: Run) -> list[Signals]:
    """An ``hw`` record's GPUs, disks and network interfaces (idle when the run has not
    stepped in ``IDLE_AFTER_NS``, as the GPU utilisation threshold judges it)."""
    out: list[Signals] = []
    data, host, t, step, rank = rec.data, rec.host, rec.time_ns, rec.step, rec.rank
    idle = not run.last_step_ns or t - run.last_step_ns >= IDLE_AFTER_NS

    def add(scope: str, metric: str, value: Any) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            sig = observe(state, cfg, scope, metric, float(value), t, rank, step, idle=idle)
            if sig is not None:
                out.append(sig)

    for gpu in data.get("gpus") or []:
        scope = f"gpu:{host}/{gpu.get('index', 0)}"
        for name, metric in GPU_FIELDS.items():
            add(scope, metric, gpu.get(name))
    for kind, items, ident, names in (
        ("disk", data.get("disks"), "device", DISK_FIELDS),
        ("net", data.get("nets"), "iface", NET_FIELDS),
    ):
        for item in items or []:
            parts = [item.get(n) for n in names]
            nums = [float(v) for v in parts if isinstance(v, (int, float))]
            if nums:
                add(f"{kind}:{host}/{item.get(ident, '?')}", f"{kind}_mb_s", sum(nums))
    return out


def on_steps(  # noqa: PLR0917
    state: DynamicState,
    cfg: DynamicConfig,
    rank: int,
    steps: np.ndarray,
    times_ns: Any,
    columns: Columns,
) -> list[Signals]:
    """A rank's step time and tokens/s of a batch of rows (row ``i`` at ``times_ns[i]``): one
    ``observe`` per minute the rows open, the rest of the minute's values summed at once."""
    out: list[Signals] = []
    scope = f"rank:{rank}"
    minutes = None
    for metric in STEP_METRICS:
        cells = columns.get(metric)
        if cells is None:
            continue
        xs, has = floats_of(cells)
        ok = np.isfinite(xs) if has is None else has & np.isfinite(xs)
        rows = np.flatnonzero(ok)
        if not len(rows):
            continue
        if minutes is None:
            minutes = np.asarray(times_ns, np.int64) // MINUTE_NS
        mins = minutes[rows]
        cuts = [0, *(np.flatnonzero(np.diff(mins)) + 1).tolist(), len(rows)]
        for a, b in itertools.pairwise(cuts):
            i = int(rows[a])
            t = int(minutes[i]) * MINUTE_NS
            sig = observe(state, cfg, scope, metric, float(xs[i]), t, rank, int(steps[i]), i)
            if sig is not None:
                out.append(sig)
            tail = state.series.get(key_of(scope, metric))
            if b - a > 1 and tail is not None:
                if tail.minute == mins[a]:
                    tail.total += float(xs[rows[a + 1 : b]].sum())
                    tail.count += b - a - 1
                else:
                    state.late += b - a - 1
    return out


def due(state: DynamicState, cfg: DynamicConfig, now_ns: int) -> list[Key]:
    """The series that want a band now (event time ``now_ns``): none yet and not asked in
    ``retry_s``, or one fitted ``refit_s`` ago. Marks them asked. Looks once a minute at
    most (it is asked at every record)."""
    if now_ns - state.checked_ns < MINUTE_NS:
        return []
    state.checked_ns = now_ns
    out = []
    for key, tail in state.series.items():
        wait = cfg.refit_s if tail.band is not None else cfg.retry_s
        if len(tail.values) and now_ns - tail.asked_ns >= wait * 1e9:
            tail.asked_ns = now_ns
            out.append(key)
    return out


def fit_input(state: DynamicState, keys: list[Key]) -> dict[Key, tuple[np.ndarray, np.ndarray]]:
    """The in-run minute means of ``keys`` (copies: they travel to a pool process)."""
    return {
        k: (state.series[k].times.copy(), state.series[k].values.copy())
        for k in keys
        if k in state.series
    }


def apply(state: DynamicState, bands: dict[Key, Band | None]) -> int:
    """Take fitted bands (a None keeps the series' current band); returns how many it took."""
    n = 0
    for key, band in bands.items():
        tail = state.series.get(key)
        if tail is not None and band is not None:
            tail.band = band
            n += 1
    return n


def fit_inline(state: DynamicState, cfg: DynamicConfig, now_ns: int) -> None:
    """Offline: the due series' bands fitted at once from their in-run minutes."""
    keys = due(state, cfg, now_ns)
    if keys:
        apply(state, fit_bands(fit_input(state, keys), cfg.fit))
