"""1-minute rollups computed by InfluxDB itself (the task's query, run on demand)."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from influx_helpers import rows, settings_from
from sinks_helpers import unique

from steplens.schema import make_record
from steplens.sinks.influx import InfluxSink, make_client
from steplens.sinks.rollup import TASK_NAME, ensure_buckets, ensure_rollup_task, run_rollup

pytestmark = pytest.mark.stack
MIN_NS = 60 * 10**9


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


def test_rollup_task_is_created_once(stack_env) -> None:
    s = settings_from(stack_env)
    with make_client(s) as client:
        first = ensure_rollup_task(client, s)
        second = ensure_rollup_task(client, s, lookback_min=15)
        tasks = client.tasks_api().find_tasks(name=TASK_NAME)
    assert first == second and len(tasks) == 1
    assert (
        tasks[0].every == "1m"
        and "date.sub(d: 15m" in tasks[0].flux
        and tasks[0].status == "active"
    )
