"""1-minute rollups computed by InfluxDB itself (the task's query, run on demand)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from influx_helpers import rows, settings_from
from influxdb_client import TaskCreateRequest
from prometheus_client import REGISTRY
from sinks_helpers import unique

from steplens.schema import make_record
from steplens.schema.store_layout import COVERAGE
from steplens.sinks.influx import InfluxSink, make_client
from steplens.sinks.points import record_builders
from steplens.sinks.rollup import (
    CHUNK_MIN,
    TASK_NAME,
    ensure_buckets,
    remove_rollup_task,
    run_once,
    run_rollup,
)
from steplens.sinks.rollup_loop import (
    CATCH_UP_LAG_S,
    RollupLoop,
    covered_lag_s,
    next_chunk,
    take_lease,
)
from steplens.sinks.text_fields import TextFields

pytestmark = pytest.mark.stack
MIN_NS = 60 * 10**9


def minutes_ago(back: int) -> tuple[int, Callable[[int], datetime]]:
    """The start of the minute ``back`` minutes ago (ns), and the time of ``k`` minutes after
    it."""
    t0 = (time.time_ns() // MIN_NS - back) * MIN_NS
    return t0, lambda k: datetime.fromtimestamp((t0 + k * MIN_NS) / 1e9, tz=timezone.utc)


def test_rollup_writes_mean_min_max_last_per_minute(stack_env) -> None:
    s = settings_from(stack_env)
    run_id = unique("run")
    minute = (time.time_ns() // MIN_NS - 3) * MIN_NS  # a closed minute
    losses = [4.0, 1.0, 7.0, 2.0]
    recs = [
        make_record(
            "step",
            {"loss": v, "tokens": 10 * (i + 1)},
            run_id=run_id,
            seq=i,
            step=i,
            time_ns=minute + i * 10**9,
        )
        for i, v in enumerate(losses)
    ]
    recs.append(
        make_record(
            "step", {"loss": 100.0}, run_id=run_id, seq=9, step=9, time_ns=minute + MIN_NS + 1
        )
    )
    with make_client(s) as client:
        ensure_buckets(client, s)
        assert InfluxSink(client, s).export(recs).accepted == 5
        start = datetime.fromtimestamp(minute / 1e9, tz=timezone.utc)
        stop = datetime.fromtimestamp((minute + 2 * MIN_NS) / 1e9, tz=timezone.utc)
        run_rollup(client, s, start, stop, run_id)
        run_rollup(client, s, start, stop, run_id)  # idempotent: the same points again
    got = rows(s, f'r.run_id == "{run_id}" and r._measurement == "step"', bucket=s.rollup_bucket)
    first = {r["_field"]: r["_value"] for r in got if r["_time"].timestamp() * 1e9 == minute}
    assert first["loss_mean"] == pytest.approx(3.5)
    assert (first["loss_min"], first["loss_max"], first["loss_last"]) == (1.0, 7.0, 2.0)
    assert first["tokens_max"] == 40.0 and "seq_mean" not in first
    second = {
        r["_field"]: r["_value"] for r in got if r["_time"].timestamp() * 1e9 == minute + MIN_NS
    }
    assert second["loss_mean"] == 100.0
    assert len([r for r in got if r["_field"] == "loss_mean"]) == 2
    assert {r["rank"] for r in got} == {"0"}


def test_summary_fields_are_rolled_up_by_their_own_fold(stack_env) -> None:
    """A step window's fields and a signal's band are summaries: the rollups keep the fold
    of each that means something (the minute's largest window maximum, its smallest minimum,
    its windows' mean, the last band), each the same value as the four-way rollup had, and
    a signal's value all four ways."""
    s = settings_from(stack_env)
    run_id = unique("run")
    minute = (time.time_ns() // MIN_NS - 3) * MIN_NS
    windows = [
        {"count": 10, "mean": 2.0, "std": 0.5, "min": 1.0, "max": 6.0, "last": 2.5},
        {"count": 10, "mean": 3.0, "std": 0.25, "min": 1.5, "max": 4.0, "last": 3.5},
    ]
    recs = [
        make_record(
            "step_window",
            {"step_first": 10 * i, "step_last": 10 * i + 9, "count": 10, "metrics": {"loss": w}},
            run_id=run_id,
            seq=i,
            step=10 * i + 9,
            time_ns=minute + (i + 1) * 10**10,
        )
        for i, w in enumerate(windows)
    ]
    band = {"name": "arima", "metric": "loss", "score": 0.2}
    recs += [
        make_record(
            "signal",
            {**band, "value": v, "expected": e, "lower": e - 1, "upper": e + 1},
            run_id=run_id,
            seq=5 + i,
            step=10 * i + 9,
            time_ns=minute + (i + 1) * 10**10 + 1,
        )
        for i, (v, e) in enumerate(((2.0, 2.2), (4.0, 2.4)))
    ]
    with make_client(s) as client:
        ensure_buckets(client, s)
        assert InfluxSink(client, s).export(recs).accepted == 4
        start = datetime.fromtimestamp(minute / 1e9, tz=timezone.utc)
        run_rollup(client, s, start, start + timedelta(minutes=1), run_id)

    def fields(measurement: str) -> dict[str, float]:
        got = rows(
            s, f'r.run_id == "{run_id}" and r._measurement == "{measurement}"', s.rollup_bucket
        )
        return {r["_field"]: r["_value"] for r in got}

    window = fields("step_window")
    assert window["max_max"] == 6.0 and window["min_min"] == 1.0 and window["last_last"] == 3.5
    assert window["mean_mean"] == pytest.approx(2.5) and window["std_mean"] == pytest.approx(0.375)
    assert (window["step_first_min"], window["step_last_max"]) == (0.0, 19.0)
    unkept = {"max_min", "max_mean", "min_max", "mean_max", "last_mean", "mean_last"}
    assert not unkept & set(window)
    signal = fields("signal")
    assert (signal["value_mean"], signal["value_min"], signal["value_max"]) == (3.0, 2.0, 4.0)
    assert signal["value_last"] == 4.0 and signal["expected_last"] == pytest.approx(2.4)
    assert signal["upper_last"] == pytest.approx(3.4) and signal["score_max"] == 0.2
    assert not {"expected_mean", "upper_max", "score_min"} & set(signal)


def test_an_earlier_rollup_task_is_removed(stack_env) -> None:
    """Rollups are made by the sink now: the InfluxDB task of earlier versions goes."""
    s = settings_from(stack_env)
    with make_client(s) as client:
        org_id = client.organizations_api().find_organizations(org=s.org)[0].id
        if not client.tasks_api().find_tasks(name=TASK_NAME, org_id=org_id):
            flux = f'option task = {{name: "{TASK_NAME}", every: 1h}}\narray.from(rows: [])'
            client.tasks_api().create_task(
                task_create_request=TaskCreateRequest(
                    flux='import "array"\n' + flux, org_id=org_id, status="inactive"
                )
            )
        assert remove_rollup_task(client, s)
        assert not client.tasks_api().find_tasks(name=TASK_NAME, org_id=org_id)
        assert not remove_rollup_task(client, s)


@pytest.fixture
def scratch_buckets(stack_env):
    """A hot and a rollup bucket of their own (the task's marks are per rollup bucket)."""
    name = unique("rollup")
    s = replace(settings_from(stack_env), bucket=name, rollup_bucket=name + "-rollup")
    with make_client(s) as client:
        ensure_buckets(client, s)
    yield s
    with make_client(s) as client:
        api = client.buckets_api()
        for bucket in (s.bucket, s.rollup_bucket):
            found = api.find_bucket_by_name(bucket)
            if found is not None:
                api.delete_bucket(found)


def test_minutes_of_failed_runs_are_rolled_up_by_the_next_run(scratch_buckets) -> None:
    """Runs that fail (or never run) leave no mark; the next run starts from the last mark,
    however far back within the hot window, not from its own lookback."""
    s = scratch_buckets
    t0, at = minutes_ago(30)
    recs = [
        make_record(
            "step",
            {"loss": float(k), "clipped": True, "reason": "x"},
            run_id="r",
            seq=k + 5,
            step=k + 5,
            time_ns=t0 + k * MIN_NS + 10**9,
        )
        for k in range(-5, 12)
    ]
    fields = TextFields()
    with make_client(s) as client:
        assert InfluxSink(client, s, text_fields=fields).export(recs).accepted == len(recs)
        for _ in range(60 // CHUNK_MIN):  # no mark yet: from the start of the hot window on
            run_once(client, s, fields, at(0))
        # runs at t0+1 .. t0+9 failed: nothing written, no mark
        run_once(client, s, fields, at(10))
    got = rows(s, 'r._measurement == "step" and r._field == "loss_mean"', bucket=s.rollup_bucket)
    minutes = sorted(round((r["_time"].timestamp() * 1e9 - t0) / MIN_NS) for r in got)
    assert minutes == list(range(-5, 10))
    got.sort(key=lambda r: r["_time"])
    assert [r["_value"] for r in got] == [float(m) for m in minutes]
    marks = rows(s, f'r._measurement == "{COVERAGE}"', bucket=s.rollup_bucket)
    assert max(r["_time"] for r in marks) == at(10)


def test_a_run_reaches_back_one_chunk_at_a_time(scratch_buckets) -> None:
    """A long gap is caught up over several runs, CHUNK_MIN minutes each."""
    s = scratch_buckets
    now = datetime.fromtimestamp((time.time_ns() // MIN_NS - 1) * MIN_NS / 1e9, tz=timezone.utc)
    with make_client(s) as client:
        run_once(client, s, TextFields(), now)
    marks = rows(s, f'r._measurement == "{COVERAGE}"', bucket=s.rollup_bucket)
    assert [r["_time"] for r in marks] == [
        now - timedelta(seconds=s.hot_retention_s) + timedelta(minutes=CHUNK_MIN)
    ]


def _step(run_id: str, k: int, t_ns: int, **data: object) -> object:
    return make_record("step", data, run_id=run_id, seq=k, step=k, time_ns=t_ns)


def test_text_fields_are_learnt_once_and_again_when_another_sink_wrote_one(
    scratch_buckets,
) -> None:
    """The fields that are not numbers are not scanned on every run: learnt at the first;
    one written by another sink fails a run, and the next learns it."""
    s = scratch_buckets
    t0, at = minutes_ago(8)
    fields = TextFields()
    with make_client(s) as client:
        mine = InfluxSink(client, s, text_fields=fields)
        assert mine.export([_step("r", 0, t0 + 10**9, loss=1.0)]).accepted == 1
        for _ in range(60 // CHUNK_MIN + 1):  # from the start of the hot window to at(2)
            run_once(client, s, fields, at(2))
        assert fields.scans == 1 and fields.count() == 0
        other = InfluxSink(client, s)  # another sink: this one never sees its fields
        other.export([_step("r", 1, t0 + 3 * MIN_NS + 10**9, loss=2.0, reason="c")])
        with pytest.raises(Exception):  # noqa: B017 - the storage engine's own error
            run_once(client, s, fields, at(5))
        run_once(client, s, fields, at(5))
        assert fields.scans == 2 and fields.count() == 1
    got = rows(s, 'r._measurement == "step" and r._field == "loss_mean"', bucket=s.rollup_bucket)
    assert sorted(r["_value"] for r in got) == [1.0, 2.0]


class LearntDuringTheRun(TextFields):
    """Text fields whose next ``late`` one is learnt right after a run's first query read the
    set (the sink wrote its first value while the run's queries were under way)."""

    late: tuple[str, str] | None = None

    def flux_dict(self) -> str:
        seen = super().flux_dict()
        if self.late is not None:
            self.add(*self.late)
            self.late = None
        return seen


def test_a_run_made_while_a_text_field_was_first_written_is_made_again(scratch_buckets) -> None:
    """The run the server fails because of a text field this sink learnt meanwhile is made
    again at once without it, not failed (and the bucket is not scanned again)."""
    s = scratch_buckets
    t0, at = minutes_ago(8)
    fields = LearntDuringTheRun()
    with make_client(s) as client:
        InfluxSink(client, s, text_fields=fields).export([_step("r", 0, t0 + 10**9, loss=1.0)])
        for _ in range(60 // CHUNK_MIN + 1):  # from the start of the hot window to at(2)
            run_once(client, s, fields, at(2))
        assert fields.scans == 1 and fields.count() == 0
        # written before the next run, learnt by this sink only once that run has begun
        InfluxSink(client, s).export([_step("r", 1, t0 + 3 * MIN_NS + 10**9, loss=2.0, reason="c")])
        fields.late = ("step", "reason")
        run_once(client, s, fields, at(5))
        assert fields.scans == 1 and fields.count() == 1
    got = rows(s, 'r._measurement == "step" and r._field == "loss_mean"', bucket=s.rollup_bucket)
    assert sorted(r["_value"] for r in got) == [1.0, 2.0]
    marks = rows(s, f'r._measurement == "{COVERAGE}"', bucket=s.rollup_bucket)
    assert max(r["_time"] for r in marks) == at(5)


def test_a_run_that_times_out_does_not_scan_the_fields_again(scratch_buckets) -> None:
    """A slow store is not made slower: only a run the storage engine refuses (a text field
    it did not know) makes the next one scan the bucket's fields again."""
    s = scratch_buckets
    t0, at = minutes_ago(8)
    fields = TextFields()
    with make_client(s) as client:
        InfluxSink(client, s, text_fields=fields).export([_step("r", 0, t0 + 10**9, loss=1.0)])
        run_once(client, s, fields, at(2))
        assert fields.scans == 1
        with make_client(s, timeout_ms=1) as hurried, pytest.raises(Exception):  # noqa: B017
            run_once(hurried, s, fields, at(3))
        for _ in range(60 // CHUNK_MIN + 1):
            run_once(client, s, fields, at(3))
        assert fields.scans == 1
    got = rows(s, 'r._measurement == "step" and r._field == "loss_mean"', bucket=s.rollup_bucket)
    assert [r["_value"] for r in got] == [1.0]


def test_the_fields_written_are_learnt_without_a_scan() -> None:
    fields = TextFields(max_fields=2)
    fields.observe(record_builders(_step("r", 0, 1, loss=1.0, reason="x")))
    assert fields.count() == 1 and '"step": "^(reason)$"' in fields.flux_dict()
    fields.observe(record_builders(_step("r", 1, 2, loss=float("nan"))))  # loss_nonfinite
    fields.observe(record_builders(_step("r", 2, 3, grad_norm=float("inf"))))
    assert fields.count() == 2 and fields.overflow == 1


def test_the_loop_catches_up_at_once_and_exports_the_coverage_lag(scratch_buckets) -> None:
    """A fresh bucket (or a sink back from an outage) is an hour behind: the runs of one
    minute follow each other, a chunk each, until coverage is current."""
    s = scratch_buckets
    now_ns = time.time_ns()
    ok_runs = {"result": "ok"}
    before = REGISTRY.get_sample_value("steplens_sink_rollup_runs_total", ok_runs) or 0.0
    with make_client(s) as client:
        InfluxSink(client, s).export([_step("r", 0, now_ns - 3 * MIN_NS, loss=1.0)])
        assert RollupLoop(client, s, TextFields()).run_now()  # once
    lag = REGISTRY.get_sample_value("steplens_sink_rollup_coverage_lag_seconds")
    assert lag is not None and lag < 3 * 60
    runs = REGISTRY.get_sample_value("steplens_sink_rollup_runs_total", ok_runs) - before
    assert runs >= s.hot_retention_s // 60 // CHUNK_MIN
    got = rows(s, 'r._measurement == "step" and r._field == "loss_mean"', bucket=s.rollup_bucket)
    assert [r["_value"] for r in got] == [1.0]


def test_runs_after_a_failed_one_cover_fewer_minutes_until_they_succeed() -> None:
    halved = [CHUNK_MIN]
    while halved[-1] > 1:
        halved.append(next_chunk(halved[-1], ok=False))
    assert halved == [CHUNK_MIN, 7, 3, 1] and next_chunk(1, ok=False) == 1
    doubled = [next_chunk(c, ok=True) for c in (1, 2, 4, 8, CHUNK_MIN)]
    assert doubled == [2, 4, 8, CHUNK_MIN, CHUNK_MIN]


def test_a_store_too_slow_for_a_chunk_is_caught_up_in_smaller_ones(scratch_buckets) -> None:
    """Runs that time out (a store too slow for a chunk's queries) are made again over fewer
    minutes, down to one; each run that succeeds doubles them again, and no minute is left
    out. Before, every next run reached back over the same minutes and more."""
    s = scratch_buckets
    now_ns = time.time_ns()
    recs = [_step("r", k, now_ns - (k + 3) * MIN_NS, loss=float(k)) for k in range(30)]
    with make_client(s) as client, make_client(s, timeout_ms=1) as hurried:
        assert InfluxSink(client, s).export(recs).accepted == len(recs)
        loop = RollupLoop(hurried, s, TextFields())
        for _ in range(4):
            assert not loop.run_now()
        assert loop.chunk_min == 1
        assert REGISTRY.get_sample_value("steplens_sink_rollup_chunk_minutes") == 1
        loop.client = client  # the store answers in time again
        deadline = time.monotonic() + 240
        while (lag := covered_lag_s(client, s)) is None or lag > CATCH_UP_LAG_S:
            assert time.monotonic() < deadline, lag
            loop.run_now()
    marks = sorted(
        r["_time"] for r in rows(s, f'r._measurement == "{COVERAGE}"', bucket=s.rollup_bucket)
    )
    gaps = [round((b - a).total_seconds() / 60) for a, b in itertools.pairwise(marks)]
    assert gaps[:4] == [2, 4, 8, CHUNK_MIN], gaps
    got = rows(s, 'r._measurement == "step" and r._field == "loss_mean"', bucket=s.rollup_bucket)
    assert sorted(r["_value"] for r in got) == [float(k) for k in range(30)]


def test_of_two_sinks_on_the_same_buckets_one_makes_the_runs(scratch_buckets) -> None:
    s = scratch_buckets
    with make_client(s) as client:
        first, second = RollupLoop(client, s, TextFields()), RollupLoop(client, s, TextFields())
        assert first.run_now()
        assert not second.run_now()  # the first holds the lease
        assert first.run_now()
        assert take_lease(client, s, first.owner) and not take_lease(client, s, second.owner)
