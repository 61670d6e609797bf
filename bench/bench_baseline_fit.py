"""The 7-day baselines' history load and fit: 64 series of 7 days at 1-minute resolution
(645,120 points), as one fit process of the worker would load and fit them.

Data: real multi-day machine telemetry at 1-minute resolution, the SMD excerpts in
``bench/data/quality/smd`` (5 server machines, 6 metrics each, about 16 days): 64 windows of
7 days (+ the 2 hours after each, held out), laid out as the rollup bucket's rows of 64 GPUs
(``gpu`` measurement, ``util_gpu_mean``), written to a Parquet file (what a read of the stores
returns, without the shared InfluxDB). Nothing synthetic.

Each stage runs in a fresh process (spawned, as the worker's pool is), so its peak RSS is its
own (``resource.getrusage``):

* ``read``: read the file and build the series (``baseline_history.series_of``): the baseline.
* ``fit``: the same read, then every band fitted (``seasonal_baseline.fit_bands``): the worker's
  pool job. Limit: 30 s and 512 MB on a 2-core machine.
* ``arima``: a plain statsmodels ARIMA(1,1,1) (exact likelihood) fitted to a few of the same
  series: the per-series cost of the obvious alternative.

Also printed: the held-out healthy minutes (SMD label 0) inside their band (nominal 0.999), and
the healthy minutes that would warn (``dynamic_baseline.outside``, ``DynamicConfig.persist``
minutes in a row) and the alerts they would be.

    python bench/bench_baseline_fit.py             # about a minute
    python bench/bench_baseline_fit.py --influx    # also through the real rollup bucket

``--influx`` writes the same rows into the stack's rollup bucket (under a run id of its own,
deleted afterwards) and adds ``influx``: the worker's own read (``read_rollups``) and fit in
one process, as a pool job does.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import multiprocessing
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

SMD = Path(__file__).parent / "data" / "quality" / "smd"
DAY = 1440
WEEK = 7 * DAY
HELD = 120  # minutes after each window: the band's horizon
MINUTE_NS = 60 * 10**9
LIMIT_S, LIMIT_MB = 30.0, 512.0


def windows(n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n`` windows of WEEK + HELD minutes (values, labels) from the SMD series, spread over
    every machine and metric (overlapping starts where the series run short)."""
    series = []
    for path in sorted(SMD.glob("*.csv.gz")):
        with gzip.open(path, "rt") as f:
            frame = pd.read_csv(f)
        for col in [c for c in frame.columns if c not in ("step", "label")]:
            series.append((frame[col].to_numpy(float), frame["label"].to_numpy(int)))
    out = []
    span = WEEK + HELD
    k = 0
    while len(out) < n:
        values, labels = series[k % len(series)]
        room = len(values) - span
        start = (k // len(series)) * (room // 2) % max(room, 1)
        out.append((values[start : start + span], labels[start : start + span]))
        k += 1
    return out


def write_rollups(path: Path, wins: list[tuple[np.ndarray, np.ndarray]], end_min: int) -> int:
    """The windows' first WEEK minutes as rollup rows of one GPU each; returns the points."""
    t = (end_min - WEEK + np.arange(WEEK, dtype=np.int64)) * MINUTE_NS
    parts = [
        pd.DataFrame(
            {
                "time_ns": t,
                "_measurement": "gpu",
                "_field": "util_gpu_mean",
                "_value": values[:WEEK],
                "host": f"node-{i // 8}",
                "gpu": str(i % 8),
            }
        )
        for i, (values, _) in enumerate(wins)
    ]
    frame = pd.concat(parts, ignore_index=True)
    frame.to_parquet(path, index=False)
    return len(frame)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def stage_read(path: str) -> dict[str, Any]:
    from steplens.stream_jobs.worker.baseline_history import series_of

    t0 = time.perf_counter()
    series = series_of(pd.read_parquet(path))
    return {"s": time.perf_counter() - t0, "mb": _peak_mb(), "series": len(series)}


def stage_fit(path: str) -> dict[str, Any]:
    from steplens.stream_jobs.engine.signals.seasonal_baseline import BaselineConfig, fit_bands
    from steplens.stream_jobs.worker.baseline_history import series_of

    t0 = time.perf_counter()
    series = series_of(pd.read_parquet(path))
    bands = fit_bands(series, BaselineConfig(horizon=HELD))
    took = time.perf_counter() - t0
    out = {
        k: (b.expected, b.lower, b.upper, b.baseline, b.order, b.seasonal)
        for k, b in bands.items()
        if b is not None
    }
    return {"s": took, "mb": _peak_mb(), "bands": out}


def stage_arima(path: str, n: int) -> dict[str, Any]:
    import warnings

    from statsmodels.tsa.arima.model import ARIMA

    from steplens.stream_jobs.worker.baseline_history import series_of

    series = list(series_of(pd.read_parquet(path)).values())[:n]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ARIMA(series[0][1][:200], order=(1, 1, 1)).fit()  # imports and first-call costs
        t0 = time.perf_counter()
        for _, v in series:
            ARIMA(v, order=(1, 1, 1)).fit()
    return {"s": time.perf_counter() - t0, "mb": _peak_mb(), "n": n}


def stage_influx(run: str, since_ns: int, until_ns: int) -> dict[str, Any]:
    from steplens.sinks.settings import InfluxSettings
    from steplens.stream_jobs.engine.signals.seasonal_baseline import BaselineConfig, fit_bands
    from steplens.stream_jobs.worker.baseline_history import read_rollups

    influx = InfluxSettings.from_env()
    t0 = time.perf_counter()
    series = read_rollups(influx, run, since_ns, until_ns)
    loaded = time.perf_counter() - t0
    bands = fit_bands(series, BaselineConfig(horizon=HELD))
    took = time.perf_counter() - t0
    return {
        "s": took,
        "load_s": loaded,
        "mb": _peak_mb(),
        "bands": sum(b is not None for b in bands.values()),
    }


def write_influx(path: Path, run: str) -> None:
    """The rows into the rollup bucket, as the rollup task writes them."""
    from influxdb_client.client.write_api import SYNCHRONOUS

    from steplens.sinks.influx import make_client
    from steplens.sinks.settings import InfluxSettings

    s = InfluxSettings.from_env()
    frame = pd.read_parquet(path)
    lines = [
        f"gpu,gpu={g},host={h},run_id={run} util_gpu_mean={v!r} {t}"
        for t, v, h, g in zip(
            frame["time_ns"], frame["_value"], frame["host"], frame["gpu"], strict=True
        )
    ]
    with make_client(s) as client:
        api = client.write_api(write_options=SYNCHRONOUS)
        for i in range(0, len(lines), 50_000):
            api.write(s.rollup_bucket, s.org, lines[i : i + 50_000])


def delete_influx(run: str, since_ns: int, until_ns: int) -> None:
    from datetime import datetime, timezone

    from steplens.sinks.influx import make_client
    from steplens.sinks.settings import InfluxSettings

    s = InfluxSettings.from_env()
    with make_client(s) as client:
        client.delete_api().delete(
            datetime.fromtimestamp(since_ns / 1e9, tz=timezone.utc),
            datetime.fromtimestamp(until_ns / 1e9 + 60, tz=timezone.utc),
            f'run_id="{run}"',
            bucket=s.rollup_bucket,
            org=s.org,
        )


def fresh(fn: Any, *args: Any) -> dict[str, Any]:
    """``fn(*args)`` in a fresh spawned process."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        return pool.submit(fn, *args).result()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--arima-series", type=int, default=3)
    ap.add_argument("--influx", action="store_true", help="also through the stack's InfluxDB")
    args = ap.parse_args()
    from steplens.stream_jobs.engine.signals.dynamic_baseline import (
        DynamicConfig,
        key_of,
        outside,
    )

    wins = windows(args.gpus)
    end_min = time.time_ns() // MINUTE_NS
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rollups.parquet"
        points = write_rollups(path, wins, end_min)
        read = fresh(stage_read, str(path))
        fit = fresh(stage_fit, str(path))
        arima = fresh(stage_arima, str(path), args.arima_series)
        influx = None
        if args.influx:
            run = f"bench-baseline-{uuid.uuid4().hex[:8]}"
            since, until = (end_min - WEEK) * MINUTE_NS, (end_min + 1) * MINUTE_NS
            t0 = time.perf_counter()
            write_influx(path, run)
            wrote = time.perf_counter() - t0
            try:
                influx = fresh(stage_influx, run, since, until)
            finally:
                delete_influx(run, since, until)
    print(f"data: SMD (real machine telemetry), {args.gpus} series x {WEEK} minutes = {points:,}")
    print(f"{'stage':<8}{'time s':>9}{'peak RSS MB':>13}")
    for name, r in (("read", read), ("fit", fit), ("arima", arima), ("influx", influx)):
        if r is not None:
            print(f"{name:<8}{r['s']:>9.2f}{r['mb']:>13.0f}")
    if influx is not None:
        print(
            f"influx: written in {wrote:.1f} s; read {influx['load_s']:.2f} s"
            f" ({influx['load_s'] / read['s']:.1f}x the file read), {influx['bands']} bands"
        )
    per_fit = (fit["s"] - read["s"]) / args.gpus
    per_arima = arima["s"] / arima["n"]
    print(
        f"fit / read time: {fit['s'] / read['s']:.1f}x;"
        f" fit / read peak RSS: {fit['mb'] / read['mb']:.2f}x"
    )
    print(
        f"per series: band {per_fit * 1000:.0f} ms vs plain ARIMA(1,1,1) {per_arima * 1000:.0f} ms"
        f" ({per_arima / max(per_fit, 1e-9):.1f}x faster)"
    )
    bands = fit["bands"]
    dyn = DynamicConfig()
    inside = healthy = warned = episodes = 0
    orders: dict[str, int] = {}
    seasonal = 0
    for i, (values, labels) in enumerate(wins):
        got = bands.get(key_of(f"gpu:node-{i // 8}/{i % 8}", "gpu_util"))
        if got is None:
            continue
        expected, lower, upper, _, order, is_seasonal = got
        orders[str(order)] = orders.get(str(order), 0) + 1
        seasonal += bool(is_seasonal)
        held, ok = values[WEEK:], labels[WEEK:] == 0
        out = (held < lower) | (held > upper)
        inside += int(np.sum(~out & ok))
        healthy += int(np.sum(ok))
        run = 0
        for k in range(HELD):
            e, lo, up = float(expected[k]), float(lower[k]), float(upper[k])
            bad = outside(dyn, "gpu_util", float(held[k]), e, lo, up)
            run = run + 1 if bad else 0
            warned += int(run >= dyn.persist and bool(ok[k]))
            episodes += int(run == dyn.persist and bool(ok[k]))
    print(f"bands: {len(bands)} of {args.gpus}; seasonal {seasonal}; orders {orders}")
    print(
        f"held-out healthy minutes inside their band: {inside / max(healthy, 1):.4f} "
        f"(nominal 0.999); would warn ({dyn.persist} minutes outside and "
        f"{dyn.min_change:.0%} off in a row): {warned} minutes of {healthy}, {episodes} alerts"
    )
    ok = all(r["s"] <= LIMIT_S and r["mb"] <= LIMIT_MB for r in (fit, influx) if r is not None)
    print(f"limit {LIMIT_S:.0f} s, {LIMIT_MB:.0f} MB: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
