"""The worker's 7-day baseline refits: rollup rows as series, and the fits run in the pool
process, never on the event loop, their bands applied to the run's detector."""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing

import numpy as np
import pandas as pd

from steplens.schema import make_record
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.signals import seasonal_baseline
from steplens.stream_jobs.engine.signals.dynamic_baseline import key_of
from steplens.stream_jobs.engine.signals.seasonal_baseline import IN_RUN, MINUTE_NS
from steplens.stream_jobs.worker import baseline_fits, baseline_history

T0 = 28_333_333 * MINUTE_NS


def test_rollup_rows_become_the_detectors_series() -> None:
    rows = [
        ("gpu", "util_gpu_mean", 90.0, {"host": "a", "gpu": "0"}),
        ("gpu", "temp_c_mean", 60.0, {"host": "a", "gpu": "0"}),
        ("disk", "read_mb_s_mean", 5.0, {"host": "a", "device": "nvme0"}),
        ("disk", "write_mb_s_mean", 2.0, {"host": "a", "device": "nvme0"}),
        ("net", "rx_mb_s_mean", 7.0, {"host": "b", "iface": "ib0"}),
        ("step", "tokens_per_s_mean", 1e5, {"rank": "3"}),
        ("step", "loss_mean", 2.0, {"rank": "3"}),  # not a baseline's series
    ]
    frame = pd.DataFrame(
        [
            {"time_ns": T0 + k * MINUTE_NS, "_measurement": m, "_field": f, "_value": v, **tags}
            for k in range(2)
            for m, f, v, tags in rows
        ]
    )
    got = baseline_history.series_of(frame)
    assert set(got) == {
        key_of("gpu:a/0", "gpu_util"),
        key_of("gpu:a/0", "gpu_temp_c"),
        key_of("disk:a/nvme0", "disk_mb_s"),
        key_of("net:b/ib0", "net_mb_s"),
        key_of("rank:3", "tokens_per_s"),
    }
    t, v = got[key_of("disk:a/nvme0", "disk_mb_s")]
    assert t.tolist() == [T0, T0 + MINUTE_NS] and v.tolist() == [7.0, 7.0]  # read + write
    merged = baseline_history.merged(got, {key_of("rank:3", "tokens_per_s"): (t[:1], v[:1])})
    assert list(merged) == [key_of("rank:3", "tokens_per_s")]
    assert len(merged[key_of("rank:3", "tokens_per_s")][0]) == 3


def _boom(*a, **k):
    raise AssertionError("a baseline fit ran on the event loop's process")


def test_fits_run_in_the_pool_and_their_bands_are_applied(monkeypatch) -> None:
    monkeypatch.setattr(seasonal_baseline, "fit_bands", _boom)
    monkeypatch.setattr(baseline_fits, "fit_bands", _boom)
    det = RunDetector("r", fit_inline=False)
    rng = np.random.default_rng(0)
    for m in range(60):
        gpus = [{"index": 0, "util_gpu": float(90 + rng.normal())}]
        det.process(make_record("hw", {"gpus": gpus}, run_id="r", time_ns=T0 + m * MINUTE_NS))
    applied: dict[str, dict] = {}
    counts: dict[str, int] = {}

    async def main() -> None:
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
            fits = baseline_fits.BaselineFits(
                seasonal_baseline.BaselineConfig(),
                days=7.0,
                timeout_s=1.0,
                read=False,
                apply=lambda run, bands: applied.update({run: bands}),
                count=lambda what, n: counts.update({what: counts.get(what, 0) + n}),
            )
            fits.tick({"r": det})  # no pool yet: nothing is fitted here
            assert fits.in_flight is None and not applied
            fits.pool = pool
            fits.tick({"r": det})
            assert fits.in_flight == "r"
            for _ in range(600):
                if applied:
                    break
                await asyncio.sleep(0.05)

    asyncio.run(main())
    bands = applied["r"]
    band = bands[key_of("gpu:localhost/0", "gpu_util")]
    assert band is not None and band.baseline == IN_RUN
    assert counts == {"load_failed": 1, "bands": 1}
    assert det.apply_baselines(bands) == 1
