"""A synthetic run as the query layer would return it, for the report's unit tests."""

from __future__ import annotations

import numpy as np
import pandas as pd

from steplens.sinks.report_data import RunData
from steplens.sinks.report_figures import declared_lr

SCHEDULE = {
    "kind": "cosine",
    "peak_lr": 3e-3,
    "min_lr": 3e-4,
    "warmup_steps": 20,
    "total_steps": 300,
}


def synthetic_run(n_steps: int = 300, ranks: int = 2, seed: int = 0) -> RunData:
    rng = np.random.default_rng(seed)
    t0 = pd.Timestamp("2026-01-01T00:00:00Z")
    steps = np.arange(n_steps)
    lr = declared_lr(SCHEDULE, steps)
    lr[150:154] *= 30  # a blow-up
    rows = []
    for rank in range(ranks):
        loss = 4.3 * np.exp(-steps / 60) + 2.0 + rng.normal(0, 0.05, n_steps)
        loss[151:156] += 3.0
        grad = 1.0 + rng.gamma(2, 0.2, n_steps)
        grad[151:155] *= 8
        step_time = 0.08 + rng.normal(0, 0.005, n_steps)
        data_time = 0.002 + rng.gamma(2, 0.001, n_steps)
        step_time[200:220] += 0.25  # synchronous ranks: every rank waits for the slow one
        if rank == 1:
            data_time[200:220] += 0.25
        for s in steps:
            rows.append(
                {
                    "rank": rank,
                    "step": int(s),
                    "loss": loss[s],
                    "lr": lr[s],
                    "grad_norm": min(grad[s], 1.0),
                    "grad_norm_preclip": grad[s],
                    "clipped": bool(grad[s] > 1.0),
                    "step_time_s": step_time[s],
                    "data_time_s": data_time[s],
                }
            )
    steps_df = pd.DataFrame(rows)
    rank0 = steps_df[steps_df["rank"] == 0]
    expected = rank0["loss"].rolling(10, min_periods=1).mean().shift(1).bfill()
    signals = pd.DataFrame(
        {
            "step": rank0["step"],
            "name": "arima",
            "metric": "loss",
            "value": rank0["loss"],
            "expected": expected,
            "lower": expected - 0.3,
            "upper": expected + 0.3,
            "score": 0.0,
            "rank": -1,
        }
    )
    alerts = pd.DataFrame(
        [
            {
                "step": 152,
                "started_step": 151,
                "rule": "loss_spike",
                "severity": "critical",
                "state": "firing",
                "scope": "run",
                "hint": "check the learning rate",
                "rank": -1,
                "fingerprint": "a",
            },
            {
                "step": 170,
                "started_step": 151,
                "rule": "loss_spike",
                "severity": "critical",
                "state": "resolved",
                "scope": "run",
                "hint": "",
                "rank": -1,
                "fingerprint": "a",
            },
            {
                "step": 205,
                "started_step": 201,
                "rule": "straggler",
                "severity": "warning",
                "state": "firing",
                "scope": "rank:1",
                "hint": "rank 1 is slow",
                "rank": 1,
                "fingerprint": "b",
            },
        ]
    )
    times = t0 + pd.to_timedelta(np.arange(60) * 2, unit="s")
    host = pd.DataFrame(
        {
            "time": times,
            "host": "n1",
            "cpu_percent": 60 + rng.normal(0, 5, 60),
            "mem_available_bytes": 12e9,
            "mem_total_bytes": 24e9,
        }
    )
    gpu = pd.DataFrame(
        {
            "time": np.tile(times, 2),
            "host": "n1",
            "gpu": np.repeat([0, 1], 60),
            "util_gpu": rng.uniform(70, 99, 120),
            "mem_used_pct": 55.0,
        }
    )
    return RunData("synthetic", steps_df, signals, alerts, gpu, host, SCHEDULE)
