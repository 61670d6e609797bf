"""Warm starts against the real local stack: a run's history read back from InfluxDB and S3,
and workers that start a run (or a restarted rank) from it, with the sinks running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from history_helpers import STEP_NS, steps
from test_stream_worker import sample

from steplens.schema import Record, encode, make_record
from steplens.stream_jobs.engine.history import read_history
from steplens.stream_jobs.engine.signals.registry import DetectorConfig
from steplens.stream_jobs.worker.history_source import Source
from steplens.stream_jobs.worker.settings import HistorySettings

pytestmark = pytest.mark.stack
MIN_NS = 60 * 10**9
CRASH, RESUME, REGRESSION = 1500, 1000, 1010


def stores(env: dict[str, str], prefix: str, s3_endpoint: str | None = None):
    from steplens.sinks.query import Stores
    from steplens.sinks.settings import InfluxSettings, S3Settings

    influx = InfluxSettings(
        url=env["STEPLENS_INFLUX_URL"],
        org=env["STEPLENS_INFLUX_ORG"],
        token=env["STEPLENS_INFLUX_TOKEN"],
        bucket=env["STEPLENS_INFLUX_BUCKET"],
        rollup_bucket=env["STEPLENS_INFLUX_ROLLUP_BUCKET"],
        timeout_ms=30_000,  # a rollup run on 2 cores shared with the whole suite
    )
    s3 = S3Settings(
        bucket=env["STEPLENS_S3_BUCKET"],
        prefix=prefix,
        endpoint_url=s3_endpoint or env["STEPLENS_S3_ENDPOINT"],
    )
    return Stores(influx, s3)


def write_hot(st, records: list[Record]) -> None:
    from steplens.sinks.influx import InfluxSink, make_client

    with make_client(st.influx) as client:
        result = InfluxSink(client, st.influx).export(records)
    assert result.accepted + result.skipped == len(records)


def write_cold(st, records: list[Record]) -> None:
    from steplens.sinks.chunks import Chunker
    from steplens.sinks.kafka_io import Consumed
    from steplens.sinks.s3 import S3Roller, ensure_bucket, make_s3_client

    roller = S3Roller(make_s3_client(st.s3), st.s3)
    ensure_bucket(roller.client, st.s3.bucket)
    buffer = Chunker(roller.marker, max_bytes=1 << 40)
    for i, rec in enumerate(records):
        buffer.add(Consumed("raw", 0, i, rec.key, encode(rec), rec))
    for chunk in buffer.due(everything=True):
        roller.write(chunk)


def test_history_is_read_back_from_influxdb_and_s3(stack_env):
    """Steps 0-599 two hours ago (S3 only: past the hot bucket's hour), 600-999 twenty
    minutes ago (both), then a restart from step 900 five minutes ago (InfluxDB only: not
    rolled yet): each rank's history is steps 0-1199 of the surviving line, values as sent."""
    st = stores(stack_env, f"h-{uuid.uuid4().hex[:8]}")
    run = f"hist-{uuid.uuid4().hex[:8]}"
    now = time.time_ns()
    old = steps(run, 0, 600, ranks=(0, 1), t0=now - 120 * MIN_NS)
    mid = steps(run, 600, 1000, ranks=(0, 1), t0=now - 20 * MIN_NS)
    again = steps(run, 900, 1200, ranks=(0, 1), t0=now - 5 * MIN_NS, seed=1)
    write_cold(st, old + mid)
    write_hot(st, old + mid + again)
    settings = HistorySettings(max_points=5000)
    hist = read_history(
        Source(st), run, until_ns=now, settings=settings, metrics=DetectorConfig().metrics()
    )
    assert hist.runs == [run] and sorted(hist.rows) == [0, 1]
    surviving = [r for r in old + mid if r.step < 900] + again
    for rank, rows in hist.rows.items():
        mine = [r for r in surviving if r.rank == rank]
        assert rows.step.tolist() == list(range(1200))
        assert rows.values["loss"].tolist() == [r.data["loss"] for r in mine]
        assert rows.time_ns.tolist() == [r.time_ns for r in mine]
    capped = read_history(
        Source(st),
        run,
        until_ns=now,
        settings=replace(settings, max_points=300),
        metrics=DetectorConfig().metrics(),
        cuts={0: 1000},
    )
    assert capped.rows[0].step.tolist() == list(range(700, 1000))
    assert capped.rows[1].step.tolist() == list(range(900, 1200))
    assert capped.queries < hist.queries  # the newest spans were enough


def test_windows_and_their_raw_samples_come_back_as_rows(stack_env):
    st = stores(stack_env, f"h-{uuid.uuid4().hex[:8]}")
    run = f"hist-{uuid.uuid4().hex[:8]}"
    now = time.time_ns()
    recs = []
    for w in range(40):
        t = now - 30 * MIN_NS + w * 10 * 10**9
        loss = {"count": 50, "mean": 3.0 - 0.01 * w, "min": 2.9, "max": 3.1, "last": 3.0}
        data = {"step_first": 50 * w, "step_last": 50 * w + 49, "count": 50}
        recs.append(
            make_record(
                "step_window",
                {**data, "metrics": {"loss": loss}},
                run_id=run,
                rank=0,
                step=50 * w + 49,
                seq=2 * w,
                time_ns=t,
            )
        )
        raw = {"loss": 3.0 - 0.01 * w, "reason": "sample"}
        recs.append(
            make_record(
                "step", raw, run_id=run, rank=0, step=50 * w + 7, seq=2 * w + 1, time_ns=t - 10**9
            )
        )
    recs.sort(key=lambda r: r.time_ns)
    write_cold(st, recs[:40])
    write_hot(st, recs[30:])
    hist = read_history(
        Source(st),
        run,
        until_ns=now,
        settings=HistorySettings(),
        metrics=DetectorConfig().metrics(),
    )
    rows = hist.rows[0]
    assert rows.step.tolist() == [r.step for r in recs]
    windows = rows.first != -1
    assert rows.first[windows].tolist() == [50 * w for w in range(40)]
    assert np.allclose(rows.values["loss"], [3.0 - 0.01 * (i // 2) for i in range(80)])


def test_without_s3_the_older_history_comes_from_the_rollups(stack_env):
    """S3 cannot be reached and the hot bucket does not reach back: the rollup bucket's
    minutes stand for the older history, as windows over each minute's steps."""
    from steplens.sinks.influx import make_client
    from steplens.sinks.rollup import run_rollup

    st = stores(stack_env, "unused", s3_endpoint="http://127.0.0.1:9")
    run = f"hist-{uuid.uuid4().hex[:8]}"
    minute = (time.time_ns() // MIN_NS - 40) * MIN_NS
    recs = steps(run, 0, 1800, t0=minute)  # 10 steps a second: 3 minutes
    write_hot(st, recs)
    with make_client(st.influx) as client:
        start = datetime.fromtimestamp(minute / 1e9, tz=timezone.utc)
        stop = datetime.fromtimestamp((minute + 3 * MIN_NS) / 1e9, tz=timezone.utc)
        run_rollup(client, st.influx, start, stop, run)
    st = replace(st, influx=replace(st.influx, hot_retention_s=0))  # as if an hour had passed
    hist = read_history(
        Source(st),
        run,
        until_ns=minute + 10 * MIN_NS,
        settings=HistorySettings(),
        metrics=DetectorConfig().metrics(),
    )
    rows = hist.rows[0]
    assert rows.first.tolist() == [0, 600, 1200]
    assert rows.step.tolist() == [599, 1199, 1799]
    means = [np.mean([r.data["loss"] for r in recs[m * 600 : (m + 1) * 600]]) for m in range(3)]
    assert np.allclose(rows.values["loss"], means)


# --------------------------------------------------------------------------- workers


class Sinks:
    """``steplens sink influx`` and ``steplens sink s3`` on the test's topics."""

    def __init__(self, kafka, tmp: Path, prefix: str) -> None:
        t = kafka.topics
        self.env = {
            **os.environ,
            **kafka.env,
            "STEPLENS_TOPIC_RAW": t.raw,
            "STEPLENS_TOPIC_SIGNALS": t.signals,
            "STEPLENS_TOPIC_ALERTS": t.alerts,
            "STEPLENS_TOPIC_DEADLETTER": t.dead_letters,
            "STEPLENS_TOPIC_ADVICE": t.advice,
            "STEPLENS_S3_PREFIX": prefix,
        }
        group = f"sinks-{uuid.uuid4().hex[:8]}"
        self.procs = []
        for which, extra in (("influx", []), ("s3", ["--max-age-s", "2"])):
            log = (tmp / f"sink-{which}.log").open("ab")
            args = [sys.executable, "-m", "steplens.schema.command", "sink", which]
            args += ["--group", f"{group}-{which}", "--topics", t.raw, "--metrics-port", "0"]
            self.procs.append(
                subprocess.Popen(
                    args + extra,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


@pytest.fixture
def prefix(monkeypatch) -> str:
    """The S3 prefix of this test's sinks, and of the workers it starts (their history)."""
    name = f"h-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("STEPLENS_S3_PREFIX", name)
    return name


def wait_for(what, timeout_s: float, step_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while True:
        got = what()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(step_s)


def stored_steps(st, run: str) -> int:
    from steplens.sinks.query import query_series

    return len(query_series(run, "loss", stores=st))


def outcome(kafka, run: str, last_step: int, since_ns: int):
    """The run's alert transitions, once one made on a record from ``since_ns`` on fired (a
    run's alerts are in order), and its signals, once each rank's of ``last_step`` made on a
    record from ``since_ns`` on is out (a restarted run sent that step before)."""

    def fired(got):
        return any(
            r.run_id == run and r.time_ns >= since_ns and r.data["state"] == "firing" for r in got
        )

    def done(got):
        at = (
            r.rank for r in got if r.run_id == run and r.step == last_step and r.time_ns >= since_ns
        )
        return {0, 1} <= set(at)  # each rank's (a run-level signal of that step may come first)

    alerts = [a for a in kafka.collect(kafka.topics.alerts, fired, 120) if a.run_id == run]
    sigs = [s for s in kafka.collect(kafka.topics.signals, done, 60) if s.run_id == run]
    return alerts, sigs


# a 10 % rise whose first value the noise leaves just under 10 % warns once the next step is
# still high (a one-step rise below 10 % is a hard batch's note)
REGRESSION_CAUGHT = [(REGRESSION, "spike:loss"), (REGRESSION + 1, "spike:loss")]


def first_fired(alerts) -> tuple[int, str] | None:
    """The step and lead rule of the first incident that fired (a sustained regression's
    incident is reported again as ranks join it and as it resolves and reopens)."""
    return min(
        ((a.step, a.data["rule"]) for a in alerts if a.data["state"] == "firing"), default=None
    )


def test_a_restarted_run_alerts_on_a_real_regression_but_not_on_its_restart(
    kafka, workers, tmp_path, stack_env, prefix
):
    """A run crashes at step 1,500 and resumes from its checkpoint of step 1,000 (the loss
    12 % above where it was); the worker, whose state of the run is intact, re-seeds its
    ranks from the history the sinks stored up to step 1,000: no alert at the jump back, and
    a 10 % regression ten steps later alerts (a rank that started afresh would not score
    it yet)."""
    sinks = Sinks(kafka, tmp_path, prefix)
    try:
        w = workers(
            "--checkpoint-s",
            "1",
            "--signal-every",
            "10",
            "--signal-interval",
            "0",
            "--log-level",
            "info",
        )
        w.start().wait_metrics()
        run = f"restart-{uuid.uuid4().hex[:6]}"
        t0 = time.time_ns() - 400 * 10**9
        kafka.send(steps(run, 0, CRASH, ranks=(0, 1), t0=t0))
        st = stores(stack_env, prefix)
        assert wait_for(lambda: stored_steps(st, run) >= 2 * CRASH, 120)
        assert wait_for(
            lambda: sample(w.metrics(), "steplens_worker_records_total", kind="step") >= 2 * CRASH,
            120,
        )
        resumed = steps(
            run,
            RESUME,
            1300,
            ranks=(0, 1),
            t0=t0 + (CRASH + 600) * STEP_NS,
            regression=(REGRESSION, 1.1),
            seed=1,
        )
        kafka.send(resumed)
        alerts, sigs = outcome(kafka, run, 1299, resumed[0].time_ns)
        assert first_fired(alerts) in REGRESSION_CAUGHT  # none at the restart
        assert (
            sample(
                w.metrics(), "steplens_worker_history_loads_total", why="restart", outcome="warm"
            )
            == 1
        )
        assert (
            sample(
                w.metrics(), "steplens_worker_history_loads_total", why="restart", outcome="kept"
            )
            == 1
        )
        after = [s for s in sigs if s.time_ns >= resumed[0].time_ns]  # the restart's
        marked = [s for s in after if s.data["name"] == "spike" and s.step < RESUME + 256]
        assert {s.rank for s in marked} == {0, 1}
        assert all(
            s.data["detail"]["baseline"] == "history" and s.data["detail"]["resumed_at"] == RESUME
            for s in marked
        )
    finally:
        sinks.stop()


def test_a_worker_without_state_warms_a_resumed_run_from_its_parents_history(
    kafka, workers, stack_env, prefix
):
    """Run "b" resumes run "a" from a's checkpoint of step 1,000 under a new id, naming it in
    its run_meta; a's history is in InfluxDB and S3. A worker that never saw either starts b
    warm: no alert at b's start, its signals say their baseline came from a's history, and
    a 10 % regression ten steps in alerts."""
    st = stores(stack_env, prefix)
    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    t0 = time.time_ns() - 600 * 10**9
    history = steps(a, 0, CRASH, ranks=(0, 1), t0=t0)
    write_cold(st, history[: 2 * 1200])
    write_hot(st, history)
    w = workers("--signal-every", "10", "--signal-interval", "0").start()
    w.wait_metrics()
    t1 = t0 + (CRASH + 600) * STEP_NS
    meta = [
        make_record("run_meta", {"world_size": 2, "baseline_run": a}, run_id=b, rank=r, time_ns=t1)
        for r in (0, 1)
    ]
    resumed = steps(
        b, RESUME, 1300, ranks=(0, 1), t0=t1 + STEP_NS, regression=(REGRESSION, 1.1), seed=1
    )
    kafka.send(meta + resumed)
    alerts, sigs = outcome(kafka, b, 1299, resumed[0].time_ns)
    assert first_fired(alerts) in REGRESSION_CAUGHT  # none at the restart
    assert (
        sample(w.metrics(), "steplens_worker_history_loads_total", why="start", outcome="warm") == 1
    )
    # each spike signal of b's first step as first sent: delivery is at least once, and a
    # replay of its records (a rebalance on a loaded machine, the run's state restored from
    # the changelog) sends it again without the mark, which is no state of the run's
    first: dict[tuple[int, str], Any] = {}
    for s in sigs:  # in the order sent (keyed by run: one partition)
        if s.data["name"] == "spike" and s.step == RESUME:
            first.setdefault((s.rank, s.data["metric"]), s)
    assert {rank for rank, _ in first} == {0, 1}
    details = {key: s.data.get("detail") for key, s in first.items()}
    expected = {"baseline": "history", "history_runs": [a], "history_points": 1000}
    assert all(d == expected for d in details.values()), details
