"""Training curves, restarts and their history rows, for the tests of warm starts."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from typing import Any

import numpy as np

from steplens.schema import Record, make_record
from steplens.stream_jobs.engine.core import flatten
from steplens.stream_jobs.engine.detector import RunDetector

T0 = 1_700_000_000_000_000_000
STEP_NS = 100_000_000  # 10 steps a second


def loss_at(step: int, rng: random.Random) -> float:
    """A falling loss curve with noise: at step 1,000 it is 12 % above step 1,500."""
    return 2.0 + 3.0 * math.exp(-step / 500) + rng.gauss(0, 0.004)


def steps(
    run: str,
    first: int,
    last: int,
    *,
    ranks: Iterable[int] = (0,),
    t0: int = T0,
    regression: tuple[int, float] | None = None,
    seed: int = 0,
) -> list[Record]:
    """Step records ``first..last - 1`` of each rank, in time order from ``t0`` (one step per
    ``STEP_NS``); from step ``regression[0]`` on the loss is ``regression[1]`` x the curve."""
    rng = random.Random(seed * 1_000_003 + first)
    out = []
    for k, i in enumerate(range(first, last)):
        for r in ranks:
            loss = loss_at(i, rng)
            if regression is not None and i >= regression[0]:
                loss *= regression[1]
            data = {
                "loss": loss,
                "grad_norm": 1.0 + rng.gauss(0, 0.03),
                "step_time_s": 0.1 + rng.gauss(0, 0.001),
                "lr": 3e-4,
            }
            out.append(
                make_record(
                    "step",
                    data,
                    run_id=run,
                    rank=r,
                    host=f"h{r}",
                    step=i,
                    seq=i,
                    time_ns=t0 + k * STEP_NS,
                )
            )
    return out


def rows_of(records: list[Record]) -> dict[int, Any]:
    """What the stores give back of step records: each rank's ``history.Rows`` in time
    order."""
    from steplens.stream_jobs.engine.history import NO_FIRST, Rows

    out: dict[int, Any] = {}
    for rank in sorted({r.rank for r in records}):
        mine = sorted((r for r in records if r.rank == rank), key=lambda r: r.time_ns)
        names = sorted({k for r in mine for k in r.data})
        out[rank] = Rows(
            np.array([r.time_ns for r in mine], dtype=np.int64),
            np.array([r.step for r in mine], dtype=np.int64),
            np.full(len(mine), NO_FIRST, dtype=np.int64),
            {m: np.array([r.data.get(m, math.nan) for r in mine], dtype=np.float64) for m in names},
        )
    return out


def scored(det: RunDetector, records: list[Record]) -> tuple[list, list]:
    """Each record through ``det`` as the worker scores it: (signals, alert transitions)."""
    sigs, alerts = [], []
    for rec in records:
        batch, got = det.process(rec)
        sigs += flatten(batch)
        alerts += got
    return sigs, alerts


def firing(alerts: list) -> list[tuple[str, int]]:
    return [(a.rule, a.step) for a in alerts if a.state == "firing"]


def series_signals(sigs: list, names: Iterable[str] = ("spike", "arima", "volatility")) -> list:
    """The series detectors' signals as comparable tuples (detail left out)."""
    names = set(names)
    return [
        (s.name, s.metric, s.rank, s.step, s.value, s.score, s.severity, s.expected)
        for s in sigs
        if s.name in names
    ]
