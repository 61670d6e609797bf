"""The 7-day baselines' history against the real InfluxDB: a run's hw records written by the
sink and rolled up by the rollup code, older days already in the rollup bucket (as the rollup
task left them), read back and fitted in a fit job; with InfluxDB unreachable the job still
fits, from the in-run minutes, and says why."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from datetime import datetime, timezone

import numpy as np
import pytest
from test_stream_worker import alerts_matching, sample

from steplens.schema import make_record
from steplens.stream_jobs.engine.signals.dynamic_baseline import key_of
from steplens.stream_jobs.engine.signals.seasonal_baseline import (
    DAY_MIN,
    IN_RUN,
    MINUTE_NS,
    SEVEN_DAYS,
    BaselineConfig,
)
from steplens.stream_jobs.worker.baseline_fits import load_and_fit

pytestmark = pytest.mark.stack

KEY = key_of("gpu:node-a/0", "gpu_util")


def _util(minute: int, rng: np.random.Generator) -> float:
    return float(70 + 15 * np.sin(2 * np.pi * (minute % DAY_MIN) / DAY_MIN) + rng.normal())


def test_a_fit_job_reads_the_rollups_and_fits_the_seven_day_band(stack_env, monkeypatch):
    from influxdb_client import Point
    from influxdb_client.client.write_api import SYNCHRONOUS

    from steplens.sinks.influx import InfluxSink, make_client
    from steplens.sinks.rollup import run_rollup
    from steplens.sinks.settings import InfluxSettings

    s = replace(InfluxSettings.from_env(), timeout_ms=60_000)  # a shared, busy InfluxDB
    run = f"base-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(4)
    now_min = time.time_ns() // MINUTE_NS
    recent = range(now_min - 20, now_min - 1)  # hot bucket: the sink, then the rollup code
    older = range(now_min - 3 * DAY_MIN, now_min - 20)  # the rollup task's earlier minutes
    recs = [
        make_record(
            "hw",
            {"gpus": [{"index": 0, "util_gpu": _util(m, rng), "temp_c": 60.0}]},
            run_id=run,
            host="node-a",
            seq=i,
            time_ns=m * MINUTE_NS + 5 * 10**9,
        )
        for i, m in enumerate(recent)
    ]
    with make_client(s) as client:
        result = InfluxSink(client, s).export(recs)
        assert result.accepted == len(recs)
        start = datetime.fromtimestamp(recent[0] * 60, tz=timezone.utc)
        stop = datetime.fromtimestamp((recent[-1] + 1) * 60, tz=timezone.utc)
        run_rollup(client, s, start, stop, run)
        points = [
            Point("gpu")
            .tag("run_id", run)
            .tag("host", "node-a")
            .tag("gpu", "0")
            .field("util_gpu_mean", _util(m, rng))
            .time(m * MINUTE_NS)
            for m in older
        ]
        client.write_api(write_options=SYNCHRONOUS).write(s.rollup_bucket, s.org, points)
    # the in-run minutes the detector kept: the newest ten
    live_t = np.array([m * MINUTE_NS for m in recent[-10:]], dtype=np.int64)
    live = {KEY: (live_t, np.array([_util(m, rng) for m in recent[-10:]]))}
    bands, why = load_and_fit(run, live, BaselineConfig(), days=7.0, timeout_s=30.0)
    assert why is None
    band = bands[KEY]
    assert band is not None and band.baseline == SEVEN_DAYS and band.seasonal
    assert band.history_min >= len(older) + len(recent) - 5
    assert band.start_ns == (recent[-1] + 1) * MINUTE_NS
    e, lo, up = band.at(band.start_ns)  # type: ignore[misc]
    truth = 70 + 15 * np.sin(2 * np.pi * ((recent[-1] + 1) % DAY_MIN) / DAY_MIN)
    assert lo < truth < up and abs(e - truth) < 3

    # the store down: the in-run minutes alone, and the reason
    monkeypatch.setenv("STEPLENS_INFLUX_URL", "http://127.0.0.1:9")
    many = {KEY: (np.arange(60, dtype=np.int64) * MINUTE_NS, 50 + rng.normal(size=60))}
    bands, why = load_and_fit(run, many, BaselineConfig(), days=7.0, timeout_s=2.0)
    assert why is not None and bands[KEY] is not None and bands[KEY].baseline == IN_RUN


def test_a_ranks_throughput_comes_from_its_steps_and_windows(stack_env):
    """Step records (1 % raw in the producer's default mode) and step windows, written by the
    sink and rolled up: a minute's series value is the mean of both rollups."""
    from steplens.sinks.influx import InfluxSink, make_client
    from steplens.sinks.rollup import run_rollup
    from steplens.sinks.settings import InfluxSettings
    from steplens.stream_jobs.worker.baseline_history import read_rollups

    s = replace(InfluxSettings.from_env(), timeout_ms=60_000)
    run = f"base-{uuid.uuid4().hex[:8]}"
    now_min = time.time_ns() // MINUTE_NS
    minutes = range(now_min - 6, now_min - 1)
    recs = []
    for k, m in enumerate(minutes):
        t = m * MINUTE_NS + 10 * 10**9
        step = {"loss": 2.0, "tokens_per_s": 1000.0 + k, "step_time_s": 0.5}
        recs.append(
            make_record("step", step, run_id=run, rank=1, step=100 * k, seq=2 * k, time_ns=t)
        )
        window = {
            "step_first": 100 * k,
            "step_last": 100 * k + 99,
            "count": 100,
            "metrics": {"tokens_per_s": {"count": 100, "mean": 1100.0 + k, "last": 1.0}},
        }
        recs.append(
            make_record(
                "step_window",
                window,
                run_id=run,
                rank=1,
                step=100 * k + 99,
                seq=2 * k + 1,
                time_ns=t + 10**9,
            )
        )
    with make_client(s) as client:
        assert InfluxSink(client, s).export(recs).accepted == len(recs)
        start = datetime.fromtimestamp(minutes[0] * 60, tz=timezone.utc)
        stop = datetime.fromtimestamp((minutes[-1] + 1) * 60, tz=timezone.utc)
        run_rollup(client, s, start, stop, run)
    key = key_of("rank:1", "tokens_per_s")
    got = read_rollups(s, run, minutes[0] * MINUTE_NS, now_min * MINUTE_NS, [key])
    times, values = got[key]
    assert times.tolist() == [m * MINUTE_NS for m in minutes]
    assert values.tolist() == [1050.0 + k for k in range(len(minutes))]
    assert key_of("rank:1", "step_time_s") in got  # from the steps alone


def _rollup_points(run: str, minutes: range, rng: np.random.Generator) -> list:
    from influxdb_client import Point

    return [
        Point("gpu")
        .tag("run_id", run)
        .tag("host", "node-a")
        .tag("gpu", "0")
        .field("util_gpu_mean", _util(m, rng))
        .time(m * MINUTE_NS)
        for m in minutes
    ]


def test_the_worker_judges_live_gpu_minutes_against_their_seven_day_band(kafka, workers):
    """Three days of a GPU's rollups in the store; the run's live hw records reach the worker,
    whose hourly refit (its first at once) fits the band in its pool: the live minutes are
    published with it (``detail.baseline`` "7d"), and a drop while the run steps alerts in the
    hardware topic."""
    from influxdb_client.client.write_api import SYNCHRONOUS

    from steplens.sinks.influx import make_client
    from steplens.sinks.settings import InfluxSettings

    s = replace(InfluxSettings.from_env(), timeout_ms=60_000)
    run = f"base-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(6)
    now_min = time.time_ns() // MINUTE_NS
    with make_client(s) as client:
        points = _rollup_points(run, range(now_min - 3 * DAY_MIN, now_min - 2), rng)
        client.write_api(write_options=SYNCHRONOUS).write(s.rollup_bucket, s.org, points)
    # the live minutes run up to 16 minutes ahead of the clock: the worker is told to allow it
    w = workers("--no-arima", "--max-future-skew-s", "1800").start()
    w.wait_metrics()
    seq = iter(range(10**6))

    def minute(m: int, util: float) -> list:
        out = []
        for sec in (5, 35):
            t = m * MINUTE_NS + sec * 10**9
            step = {"loss": 2.0, "tokens_per_s": 5e3}
            common = {"run_id": run, "host": "node-a", "time_ns": t}
            out.append(make_record("step", step, step=next(seq), seq=next(seq), **common))
            gpus = [{"index": 0, "util_gpu": util}]
            out.append(make_record("hw", {"gpus": gpus}, seq=next(seq), **common))
        return out

    # the in-run minutes: the worker keeps them and asks for the band at its next minute tick
    in_run = minute(now_min - 2, _util(now_min - 2, rng))
    kafka.send(in_run + minute(now_min - 1, _util(now_min - 1, rng)))
    deadline = time.monotonic() + 150
    # one band: the GPU's (the run's tokens/s has one minute, too few for any)
    while sample(w.metrics(), "steplens_worker_baseline_loads_total", outcome="bands") < 1:
        lines = [x for x in w.metrics().splitlines() if "baseline" in x]
        assert time.monotonic() < deadline, (lines, w.log.read_text()[-3000:])
        time.sleep(1.0)
    text = w.metrics()
    assert sample(text, "steplens_worker_baseline_loads_total", outcome="loaded") >= 1
    assert sample(text, "steplens_worker_baseline_loads_total", outcome="load_failed") == 0
    # live minutes on the daily cycle, then 12 minutes of a GPU at 5 % while the run steps
    live = [r for m in range(now_min, now_min + 3) for r in minute(m, _util(m, rng))]
    drop = [r for m in range(now_min + 3, now_min + 16) for r in minute(m, 5.0)]
    kafka.send(live + drop)
    sigs = kafka.collect(
        kafka.topics.signals,
        lambda got: (
            sum(g.data["name"] == "baseline" and g.data["metric"] == "gpu_util" for g in got) >= 14
        ),
        timeout_s=60,
    )
    util = [g for g in sigs if g.data["name"] == "baseline" and g.data["metric"] == "gpu_util"]
    first = util[0].data
    assert first["detail"]["baseline"] == "7d" and first["detail"]["seasonal"] is True
    assert first["detail"]["scope"] == "gpu:node-a/0"
    assert first["lower"] < first["value"] < first["upper"]
    alerts = kafka.collect(
        kafka.topics.alerts,
        lambda got: bool(alerts_matching(got, rule="baseline:gpu_util", state="firing")),
        timeout_s=60,
    )
    fired = alerts_matching(alerts, rule="baseline:gpu_util", state="firing")
    assert fired and fired[0].data["severity"] == "warning"
