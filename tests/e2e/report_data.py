"""A synthetic run as the query layer would return it, for the report's unit tests."""

from __future__ import annotations

import json

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
        grad = 0.5 + rng.gamma(2, 0.2, n_steps)
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
    alerts = pd.DataFrame(_incident_records(t0))
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
            "power_w": rng.uniform(300, 700, 120),
            "temp_c": rng.uniform(50, 80, 120),
            "pcie_tx_mb_s": rng.uniform(0, 900, 120),
            "pcie_rx_mb_s": rng.uniform(0, 900, 120),
            "mem_bw_util": rng.uniform(20, 90, 120),
            "mem_bw_source": np.repeat(["gpm", "util"], 60),  # an H100 beside an older GPU
            "xid_count": np.r_[np.zeros(90), np.ones(30)],
            "ecc_corrected": 0.0,
            "ecc_uncorrected": 0.0,
            "throttle_reasons": np.r_[np.zeros(100), np.full(20, 1 << 6)],  # HW thermal
        }
    )
    disks = pd.DataFrame(
        {
            "time": times,
            "host": "n1",
            "device": "nvme0n1",
            "read_mb_s": rng.uniform(0, 500, 60),
            "write_mb_s": rng.uniform(0, 50, 60),
            "io_latency_ms": rng.uniform(0.1, 15, 60),
        }
    )
    nets = pd.DataFrame(
        {
            "time": times,
            "host": "n1",
            "iface": "ib0",
            "rx_mb_s": rng.uniform(0, 9000, 60),
            "tx_mb_s": rng.uniform(0, 9000, 60),
        }
    )
    comm = pd.DataFrame(
        {
            "time_ns": np.tile(times.as_unit("ns").asi8, 2),
            "rank": np.repeat([0, 1], 60),
            "op": "all_reduce",
            "latency_ms": rng.uniform(1, 80, 120),
        }
    )
    signals = pd.concat([signals, _quality_signals(n_steps)], ignore_index=True)
    return RunData(
        "synthetic",
        steps_df,
        signals,
        alerts,
        gpu,
        host,
        SCHEDULE,
        disks=disks,
        nets=nets,
        comm=comm,
        evals=_evals(n_steps),
        batches=_batches(n_steps, ranks, rng),
        layers=_layers(n_steps, ranks, rng),
        lr_events=pd.DataFrame(
            {"step": [20.0, 150.0], "text": ["warm-up ended", "lr 30x the declared schedule"]}
        ),
        checks=pd.DataFrame(
            [
                {"rank": r, "check": "loss volatility", "state": "on use", "needs": "log_step"}
                for r in range(ranks)
            ]
            + [
                {
                    "rank": r,
                    "check": "inter-rank communication latency",
                    "state": "off",
                    "why": "a probe adds collectives",
                    "enable": "sl.probe_comm(every=100)",
                }
                for r in range(ranks)
            ]
        ),
    )


ADVICE = "evaluate every 62 steps instead of every 250 and judge the mean of the last 4 results"


def _incident_records(t0: pd.Timestamp) -> list[dict]:
    """Three incidents in six records, as the stream jobs report them: a loss spike that
    opens, escalates and resolves; a straggler still open; an unstable evaluation metric that
    opens and resolves, its member's evidence advising an interval."""

    def rec(step, started, rule, sev, state, fp, hint, members, seconds, **evidence):
        listed = [{"rule": m, "scope": "run", "severity": sev} for m in members]
        return {
            "time_ns": (t0 + pd.Timedelta(seconds=seconds)).value,
            "step": step,
            "started_step": started,
            "rule": rule,
            "severity": sev,
            "state": state,
            "scope": "incident",
            "hint": hint,
            "rank": -1,
            "fingerprint": fp,
            "summary": f"incident since step {started}: {', '.join(members)}",
            "evidence": json.dumps({"members": [{**m, **evidence} for m in listed]}),
        }

    spike = ("correlation:loss_grad", "check the learning rate", "a")
    unstable = ("eval_unstable:eval_accuracy", "evaluate more often", "c")
    return [
        rec(152, 151, spike[0], "warning", "firing", spike[2], spike[1], ["spike:loss"], 30),
        rec(153, 151, spike[0], "critical", "firing", "a", spike[1], ["spike:loss", "x:y"], 31),
        rec(170, 151, spike[0], "critical", "resolved", "a", spike[1], ["spike:loss", "x:y"], 40),
        rec(205, 201, "straggler", "warning", "firing", "b", "rank 1 is slow", ["straggler"], 70),
        rec(250, 250, unstable[0], "warning", "firing", "c", unstable[1], ["u"], 90, advice=ADVICE),
        rec(
            275, 250, unstable[0], "warning", "resolved", "c", unstable[1], ["u"], 99, advice=ADVICE
        ),
    ]


def _quality_signals(n_steps: int) -> pd.DataFrame:
    """The stream jobs' loss-volatility, gap and data-rate signals: duplicates on one stretch."""
    steps = np.arange(0, n_steps, 10)
    rows = []
    for s in steps:
        rows.append(
            {
                "step": s,
                "name": "volatility",
                "metric": "loss",
                "value": 0.03,
                "expected": 0.1 if s >= 50 else np.nan,
                "rank": -1,
            }
        )
        dup = 0.6 if 240 <= s < 260 else 0.0
        rows.append(
            {"step": s, "name": "data", "metric": "duplicate_rate", "value": dup, "rank": 0}
        )
        rows.append(
            {"step": s, "name": "data", "metric": "repeat_rate", "value": dup / 3, "rank": 1}
        )
    return pd.DataFrame(rows)


def _evals(n_steps: int) -> pd.DataFrame:
    steps = np.arange(25, n_steps, 25)
    progress = steps / n_steps
    return pd.DataFrame(
        {
            "step": steps,
            "split": "val",
            "loss": 3.0 - progress,
            "accuracy": 0.3 + 0.5 * progress,
            "f1": 0.25 + 0.5 * progress,
            "rouge": 0.2 + 0.4 * progress,
            "bleu": 10 + 25 * progress,
        }
    )


def _batches(n_steps: int, ranks: int, rng: np.random.Generator) -> pd.DataFrame:
    rows = []
    for rank in range(ranks):
        for step in range(0, n_steps, 5):
            lengths = rng.integers(20, 120 if step < 200 else 600, 16)
            edges = [0, 32, 64, 128, 256, 512, 1024]
            counts = np.histogram(lengths, bins=edges)[0]
            bins = list(zip(edges, edges[1:], counts, strict=False))
            over = int((lengths > 512).sum())
            rows.append(
                {
                    "step": step,
                    "rank": rank,
                    "n_samples": 16,
                    "lengths": [(int(a), int(b), int(c)) for a, b, c in bins],
                    "over_length": over,
                    "over_length_share": over / 16,
                    "supervised_share": 0.8,
                    "label_cat": 12 if step < 150 else 15,
                    "label_dog": 4 if step < 150 else 1,
                }
            )
    return pd.DataFrame(rows)


def _layers(n_steps: int, ranks: int, rng: np.random.Generator) -> pd.DataFrame:
    rows = []
    for rank in range(ranks):
        for step in range(0, n_steps, 10):
            for i in range(12):
                grad = 0.1 + rng.gamma(2, 0.02) + (3.0 if i == 7 and 150 <= step < 160 else 0)
                rows.append(
                    {
                        "step": step,
                        "rank": rank,
                        "layer": f"model.layers.{i}",
                        "grad_norm": grad,
                        "param_norm": 20 + i + step / 100,
                    }
                )
    return pd.DataFrame(rows)
