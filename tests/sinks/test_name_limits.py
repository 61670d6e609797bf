"""Distinct metric names per run and per measurement are capped at the InfluxDB sink."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

import pytest
from influx_helpers import count_points, run_influx_loop, settings_from
from influxdb_client import InfluxDBClient
from prometheus_client import REGISTRY
from sinks_helpers import produce, read_all, unique

from steplens.schema import decode, make_record
from steplens.schema.flux_literals import flux_string
from steplens.sinks.influx import InfluxSink, make_client
from steplens.sinks.name_limits import NameBudget, NameLimits
from steplens.sinks.points import record_builders
from steplens.sinks.rollup import ensure_buckets
from steplens.sinks.settings import InfluxSettings

PER_RUN, PER_MEASUREMENT = 300, 700


def many_names(run_id: str, records: int, names: int, step0: int = 0) -> list:
    now = time.time_ns()
    return [
        make_record(
            "step",
            {"loss": 1.0 + i, "scalars": {f"n{uuid.uuid4().hex[:12]}": 1.0 for _ in range(names)}},
            run_id=run_id,
            seq=i,
            step=step0 + i,
            time_ns=now + i,
        )
        for i in range(records)
    ]


def field_keys(s: InfluxSettings, run_id: str | None = None) -> set[str]:
    only = f" and r.run_id == {flux_string(run_id)}" if run_id else ""
    flux = (
        'import "influxdata/influxdb/schema"\n'
        f"schema.fieldKeys(bucket: {flux_string(s.bucket)}, start: 0,"
        f' predicate: (r) => r._measurement == "step"{only})'
    )
    with InfluxDBClient(url=s.url, token=s.token, org=s.org) as c:
        return {str(r.get_value()) for t in c.query_api().query(flux, org=s.org) for r in t.records}


@pytest.fixture
def scratch_bucket(stack_env, monkeypatch):
    """Settings for a bucket of its own (field keys are per bucket), the limits lowered
    through the environment; the buckets are deleted afterwards."""
    monkeypatch.setenv("STEPLENS_INFLUX_MAX_NAMES_PER_RUN", str(PER_RUN))
    monkeypatch.setenv("STEPLENS_INFLUX_MAX_NAMES_PER_MEASUREMENT", str(PER_MEASUREMENT))
    name = unique("names")
    base = InfluxSettings.from_env()
    s = replace(settings_from(stack_env), bucket=name, rollup_bucket=name + "-rollup")
    s = replace(
        s,
        max_names_per_run=base.max_names_per_run,
        max_names_per_measurement=base.max_names_per_measurement,
    )
    with make_client(s) as client:
        ensure_buckets(client, s)
    yield s
    with make_client(s) as client:
        api = client.buckets_api()
        for bucket in (s.bucket, s.rollup_bucket):
            found = api.find_bucket_by_name(bucket)
            if found is not None:
                api.delete_bucket(found)


@pytest.mark.stack
def test_new_names_beyond_the_limits_are_left_out_and_dead_lettered(
    stack_env, topics, scratch_bucket
) -> None:
    s = scratch_bucket
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    broken, fine = unique("broken"), unique("fine")
    sent = [*many_names(broken, 10, 200), *many_names(fine, 5, 3)]
    dropped0 = REGISTRY.get_sample_value(
        "steplens_sink_fields_dropped_total",
        {"sink": "influx", "measurement": "step", "limit": "per run"},
    )
    produce(bootstrap, topics.raw, sent)
    run_influx_loop(s, bootstrap, topics, unique("group"), batch_size=4)

    assert len(field_keys(s, broken)) <= PER_RUN
    assert count_points(s, broken) == 10  # every record stored, without the names over
    assert count_points(s, fine) == 5
    assert len(field_keys(s, fine)) == 3 * 5 + 3  # its names, loss, seq, step
    letters = [decode(m) for m in read_all(bootstrap, topics.dead_letters, 9)]
    assert len(letters) == 9  # the first record's 203 names fit, the second's in part
    assert {d.run_id for d in letters} == {broken}
    for d in letters:
        reason = d.data["reason"]
        assert reason.startswith("stored in part by influx: ")
        assert f"over the limit of {PER_RUN} names per run in measurement 'step'" in reason
        assert "the rest of the record is stored" in reason
        assert f'"run_id":"{broken}"' in d.data["payload"]  # the record (cut at 4,096 chars)
    dropped = REGISTRY.get_sample_value(
        "steplens_sink_fields_dropped_total",
        {"sink": "influx", "measurement": "step", "limit": "per run"},
    )
    assert dropped - (dropped0 or 0) == 10 * 200 - (PER_RUN - 3)

    # per measurement: runs that each stay within their own limit, a fresh sink each (as
    # after a restart): the measurement's names are read back from InfluxDB
    for i in range(4):
        with make_client(s) as client:
            sink = InfluxSink(client, s)
            result = sink.export(many_names(unique(f"more{i}"), 1, 250))
            sink.shutdown()
        assert result.accepted == 1 and not result.rejected
    assert len(field_keys(s)) <= PER_MEASUREMENT
    assert "per measurement" in result.trimmed[0].reason


def test_names_already_known_are_admitted_at_the_limit() -> None:
    """A name the measurement already holds costs its limit nothing; the run's limit holds."""
    budget = NameBudget(NameLimits(per_run=4, per_measurement=4), lambda m, t: {"a", "b"})
    rec = make_record("step", {"loss": 1.0, "scalars": {"a": 1.0, "b": 2.0}}, run_id="r")
    (b,) = record_builders(rec)
    assert budget.admit(b, "r") == (True, [])
    assert set(b.fields) == {"seq", "loss", "a", "b"}
    (c,) = record_builders(make_record("step", {"scalars": {"c": 1.0}}, run_id="r2"))
    assert budget.admit(c, "r2") == (True, [("c", "per measurement")])
    (d,) = record_builders(make_record("step", {"scalars": {"a": 1.0}}, run_id="r2"))
    assert budget.admit(d, "r2") == (True, [])
    window = make_record(
        "step_window",
        {
            "step_first": 0,
            "step_last": 9,
            "count": 10,
            "metrics": {"x": {"mean": 1.0}, "a": {"mean": 2.0}},
        },
        run_id="r",
    )
    budget2 = NameBudget(NameLimits(per_run=1, per_measurement=10), lambda m, t: set())
    kept = [budget2.admit(p, "r")[0] for p in record_builders(window)]
    assert kept == [True, False]  # one metric per run: the second window point is left out
