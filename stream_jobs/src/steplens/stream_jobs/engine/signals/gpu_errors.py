"""GPU hardware errors from ``hw`` records: an XID event or an uncorrectable ECC error on a GPU
between two samples is critical at once (the device or its memory is failing: the job's
results after it are suspect and it will likely crash).

The counters are cumulative: each GPU's last sample is kept and an increase is the breach; the
first sample of a GPU only sets its baseline (errors from before the run are not the run's),
and a counter that goes back (a driver reload, a replaced device) starts a new baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from steplens.schema import Record
from steplens.stream_jobs.engine.core import Run, SignalRows, Signals, counter_rise, finite

COUNTERS = ("xid_count", "ecc_uncorrected")


@dataclass
class GpuErrorConfig:
    max_gpus: int = 4096  # GPUs followed per run (bounded under abuse); the rest are counted


@dataclass
class GpuErrorState:
    # GPU scope -> the counters of its last sample (xid_count, ecc_uncorrected)
    last: dict[str, list[float | None]] = field(default_factory=dict)
    overflow: int = 0  # samples of GPUs past ``max_gpus``


def _count(x: Any) -> float | None:
    return float(x) if finite(x) else None


def hw(  # noqa: PLR0917
    state: GpuErrorState,
    cfg: GpuErrorConfig,
    data: dict[str, Any],
    host: str,
    step: int | None,
    rank: int,
) -> list[Signals]:
    """One signal per GPU counter sampled after its baseline: the increase since the last
    sample, critical above 0; an XID's evidence carries its code (``xid_last``)."""
    out = SignalRows()
    for gpu in data.get("gpus") or []:
        scope = f"gpu:{host}/{gpu.get('index', 0)}"
        now = [_count(gpu.get(c)) for c in COUNTERS]
        if all(v is None for v in now):
            continue
        before = state.last.get(scope)
        if before is None and len(state.last) >= cfg.max_gpus:
            state.overflow += 1
            continue
        if before is None:
            state.last[scope] = now
            continue
        state.last[scope] = [b if c is None else c for b, c in zip(before, now, strict=True)]
        for metric, prev, cur in zip(COUNTERS, before, now, strict=True):
            if cur is None or prev is None or cur < prev:
                continue  # not sampled now, a first sample, or a reset: a new baseline
            rise = cur - prev
            detail: dict[str, Any] = {"total": cur}
            if metric == "xid_count" and gpu.get("xid_last") is not None:
                detail["xid_last"] = gpu["xid_last"]
            for key in ("uuid", "name"):
                if isinstance(gpu.get(key), str):
                    detail[key] = gpu[key]
            counter_rise(out, "hardware", metric, step, rise, rank=rank, scope=scope, detail=detail)
    return out.signals()


def on_record(state: GpuErrorState, cfg: GpuErrorConfig, rec: Record, run: Run) -> list[Signals]:
    return hw(state, cfg, rec.data, rec.host, rec.step, rec.rank)
