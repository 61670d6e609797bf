"""The worker's 7-day baseline refits: rollup rows as series, and the fits run in the pool
process, never on the event loop, their bands applied to the run's detector."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import multiprocessing
import time
from typing import Any

import numpy as np
import pandas as pd

from steplens.schema import make_record
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.signals import seasonal_baseline
from steplens.stream_jobs.engine.signals.dynamic_baseline import key_of
from steplens.stream_jobs.engine.signals.seasonal_baseline import IN_RUN, MINUTE_NS
from steplens.stream_jobs.worker import baseline_fits, baseline_history

T0 = 28_333_333 * MINUTE_NS


def make_fits(read: bool, timeout_s: float, apply: Any, count: Any) -> baseline_fits.BaselineFits:
    """The worker's refits of 7-day bands (a week of history), given what to apply and count."""
    return baseline_fits.BaselineFits(
        seasonal_baseline.BaselineConfig(),
        days=7.0,
        timeout_s=timeout_s,
        read=read,
        apply=apply,
        count=count,
    )


def test_the_rollups_read_are_of_what_the_sink_writes() -> None:
    """Each measurement, item tag and field the baselines read (``WANTED``, before its
    ``_mean``) is one the influx sink writes for a hw or step record."""
    from steplens.sinks.points import record_builders

    wanted = baseline_history.WANTED
    field = {name: next(iter(fields)).removesuffix("_mean") for name, (_, fields) in wanted.items()}
    hw = {
        "gpus": [{"index": 0, field["gpu"]: 1.0}],
        "disks": [{"device": "nvme0", field["disk"]: 1.0}],
        "nets": [{"iface": "ib0", field["net"]: 1.0}],
    }
    records = [
        make_record("hw", hw, run_id="r", host="a", time_ns=T0),
        make_record("step", {field["step"]: 1.0}, run_id="r", rank=3, time_ns=T0, step=1),
    ]
    written = {b.measurement: b for rec in records for b in record_builders(rec)}
    for measurement, (tag, _) in wanted.items():
        point = written[measurement]
        assert tag in point.tags and field[measurement] in point.fields, measurement


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
    for m in range(60):  # 20 GPUs: two jobs (16 and 4 series)
        gpus = [{"index": i, "util_gpu": float(90 + rng.normal())} for i in range(20)]
        det.process(make_record("hw", {"gpus": gpus}, run_id="r", time_ns=T0 + m * MINUTE_NS))
    applied: dict[str, dict] = {}
    jobs: list[int] = []
    counts: dict[str, int] = {}

    def apply(run: str, bands: dict) -> None:
        jobs.append(len(bands))
        applied.setdefault(run, {}).update(bands)

    async def main() -> None:
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
            fits = make_fits(
                False, 1.0, apply, lambda what, n: counts.update({what: counts.get(what, 0) + n})
            )
            fits.tick({"r": det})  # no pool yet: nothing is fitted here
            assert fits.in_flight is None and not applied
            fits.pool = pool
            fits.tick({"r": det})
            assert fits.in_flight == "r"
            for _ in range(600):
                if sum(jobs) == 20:
                    break
                await asyncio.sleep(0.05)

    asyncio.run(main())
    bands = applied["r"]
    assert jobs == [16, 4]
    band = bands[key_of("gpu:localhost/0", "gpu_util")]
    assert band is not None and band.baseline == IN_RUN
    assert counts == {"load_failed": 2, "bands": 20}
    assert det.apply_baselines(bands) == 20


def test_a_job_reads_only_its_hosts_and_ranks() -> None:
    keys = [key_of("gpu:a/0", "gpu_util"), key_of("net:b/ib0", "net_mb_s")]
    keys += [key_of("rank:3", "tokens_per_s"), key_of("disk:a/nvme0", "disk_mb_s")]
    items = baseline_history.wanted_items(keys)
    assert items == {"gpu": {"a"}, "net": {"b"}, "step": {"3"}, "disk": {"a"}}
    flux = baseline_history.flux("b", "r", "gpu", T0, T0 + MINUTE_NS, items["gpu"])
    assert 'r.host == "a"' in flux and 'r._field == "util_gpu_mean"' in flux
    live = {k: (np.zeros(1, np.int64), np.zeros(1)) for k in keys}
    parts = baseline_fits.chunks(live, 3)
    assert [len(p) for p in parts] == [3, 1] and sorted(k for p in parts for k in p) == sorted(keys)


def test_a_store_that_failed_is_left_alone_for_a_while(monkeypatch, caplog) -> None:
    monkeypatch.setenv("STEPLENS_INFLUX_URL", "http://127.0.0.1:9")  # nothing listens
    det = RunDetector("r", fit_inline=False)
    for m in range(40):  # 20 GPUs: two jobs
        gpus = [{"index": i, "util_gpu": 90.0 + (m + i) % 3} for i in range(20)]
        det.process(make_record("hw", {"gpus": gpus}, run_id="r", time_ns=T0 + m * MINUTE_NS))
    counts: dict[str, int] = {}
    done: list[int] = []

    async def main() -> None:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            fits = make_fits(
                True,
                2.0,
                lambda run, bands: done.append(len(bands)),
                lambda what, n: counts.update({what: counts.get(what, 0) + n}),
            )
            fits.pool = pool
            fits.tick({"r": det})
            for _ in range(600):
                if sum(done) == 20:
                    break
                await asyncio.sleep(0.05)
            assert fits.down_until > 0

    with caplog.at_level("WARNING", logger="steplens.stream_jobs"):
        asyncio.run(main())
    assert counts["load_failed"] == 2 and counts["bands"] == 20
    said = [r.getMessage() for r in caplog.records if "stores not read" in r.getMessage()]
    # the first job tried InfluxDB; the second did not ask it again
    assert len(said) == 2 and "Connection" in said[0] and "not asked" in said[1]


def test_a_job_is_followed_by_the_next_only_after_its_spacing(monkeypatch) -> None:
    """Background work keeps to its share: after a job of t seconds the next starts no
    sooner than ``JOB_SPACING * t`` later (a lower bound, which load cannot break)."""
    det = RunDetector("r", fit_inline=False)
    for m in range(3):  # 40 GPUs: three jobs (16, 16 and 8 series)
        gpus = [{"index": i, "util_gpu": 90.0} for i in range(40)]
        det.process(make_record("hw", {"gpus": gpus}, run_id="r", time_ns=T0 + m * MINUTE_NS))
    spans: list[tuple[float, float]] = []

    def job(run, live, cfg, **_kw):
        began = time.monotonic()
        time.sleep(0.05)
        spans.append((began, time.monotonic()))
        return dict.fromkeys(live), None

    monkeypatch.setattr(baseline_fits, "load_and_fit", job)

    async def main() -> None:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            fits = make_fits(False, 1.0, lambda run, bands: None, lambda what, n: None)
            fits.pool = pool
            fits.tick({"r": det})
            deadline = time.monotonic() + 60
            while len(spans) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)

    asyncio.run(main())
    assert len(spans) == 3
    for (a, b), (c, _) in itertools.pairwise(spans):
        assert c - b >= baseline_fits.JOB_SPACING * (b - a) * 0.99
