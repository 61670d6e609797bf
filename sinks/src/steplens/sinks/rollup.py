"""Buckets and 1-minute rollups.

Rollups run inside InfluxDB as a task (every minute): it aggregates closed minutes of the hot
bucket into the rollup bucket as ``<field>_mean``, ``_min``, ``_max`` and ``_last`` (floats),
stamped with the minute's start, keeping measurement and tags. Rewriting a minute rewrites the
same points, so every run may safely redo minutes.

Coverage: after a run's points are written, the task writes a ``rollup_coverage`` point (no
tags) into the rollup bucket, stamped with the end of the range it covered. The next run
starts from the older of that mark and the last ``lookback_min`` minutes (late data, such as a
sink catching up after an outage, is folded in), so minutes of failed or missed runs are
redone once a run succeeds. A run covers at most ``CHUNK_MIN`` minutes, and never reaches back
past the hot window (``floor``): a gap longer than that cannot be rolled up from the hot bucket.

Memory: every aggregate is computed by the storage engine (a window aggregate pushed down per
measurement), so a query holds rollup rows, not raw points, whatever the burst. Fields that
are not numbers (text, booleans, ``<name>_nonfinite``) are found first with a pushed-down
``last()`` over the shards the range touches and left out by name, since the storage engine
refuses to aggregate them.
``run_rollup`` runs the same aggregation for any past range, in chunks of ``CHUNK_MIN``.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Final

from influxdb_client import BucketRetentionRules, InfluxDBClient, TaskCreateRequest

from steplens.sinks.settings import InfluxSettings

TASK_NAME: Final = "steplens-rollup-1m"
ROLLUP_RETENTION_S: Final = 30 * 24 * 3600  # 30 days: the boards' longest range
AGGREGATES: Final = ("mean", "min", "max", "last")
COVERAGE: Final = "rollup_coverage"  # measurement of the task's coverage marks
CHUNK_MIN: Final = 15  # minutes one query rolls up at most
MAX_LOOKBACK_S: Final = 24 * 3600  # how far back the task reaches when the hot window is longer
IMPORTS: Final = ("array", "date", "regexp", "strings", "types", "influxdata/influxdb/schema")


def flux_string(value: str) -> str:
    """A Flux string literal (Flux has no query parameters in InfluxDB OSS)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("${", "\\${")
    return f'"{escaped}"'


def flux_time(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _imports() -> str:
    return "".join(f"import {flux_string(name)}\n" for name in IMPORTS)


def _rollup_stream(s: InfluxSettings, run_id: str | None) -> str:
    """Flux defining ``rolled``: the rollup points of [start_, stop_), written to the rollup
    bucket (``start_`` and ``stop_`` are defined by the caller)."""
    hot = flux_string(s.bucket)
    only_run = "" if run_id is None else f" and r.run_id == {flux_string(run_id)}"
    aggs = ", ".join(
        f"agg(m: m, skip: skip, fn: {a}, suffix: {flux_string('_' + a)})" for a in AGGREGATES
    )
    return f"""not_numeric = (m) => {{
    // of every run, in every shard the range touches: the storage engine types a field by
    // measurement and shard, and refuses a text or boolean field even where a series or the
    // range holds none of it
    names = from(bucket: {hot})
        |> range(start: date.sub(d: 7d, from: start_), stop: date.add(d: 7d, to: stop_))
        |> filter(fn: (r) => r._measurement == m and r._field != "seq")
        |> last()
        |> filter(fn: (r) => not types.isNumeric(v: r._value))
        |> keep(columns: ["_field"])
        |> group()
        |> distinct(column: "_field")
        |> findColumn(fn: (key) => true, column: "_value")
    quoted = array.map(arr: names, fn: (x) => regexp.quoteMeta(v: x))
    return regexp.compile(v: "^(" + strings.joinStr(arr: quoted, v: "|") + ")$")
}}
agg = (m, skip, fn, suffix) => from(bucket: {hot})
    |> range(start: start_, stop: stop_)
    |> filter(fn: (r) => r._measurement == m and r._field != "seq" and r._field !~ skip{only_run})
    |> aggregateWindow(every: 1m, fn: fn, createEmpty: false, timeSrc: "_start")
    |> toFloat()
    |> map(fn: (r) => ({{r with _field: r._field + suffix}}))
measurement = (m) => {{
    skip = not_numeric(m: m)
    return union(tables: [{aggs}])
}}
names = schema.measurements(bucket: {hot}, start: start_, stop: stop_)
    |> findColumn(fn: (key) => true, column: "_value")
// union takes two streams at least: two empty measurements make sure of it
all_names = array.concat(arr: ["", ""], v: names)
rolled = union(tables: array.map(arr: all_names, fn: (x) => measurement(m: x)))
    |> to(bucket: {flux_string(s.rollup_bucket)}, org: {flux_string(s.org)})
"""


def rollup_flux(s: InfluxSettings, start: str, stop: str, run_id: str | None = None) -> str:
    """Aggregate the numeric fields of [start, stop) (of one run, or all) into the rollup bucket."""
    return (
        _imports()
        + f"start_ = {start}\nstop_ = {stop}\n"
        + _rollup_stream(s, run_id)
        + "rolled |> count() |> group() |> sum()\n"
    )


def max_lookback_s(s: InfluxSettings) -> int:
    """How far back the task reaches: the hot window (nothing older is left), at most a day."""
    hot = s.hot_retention_s
    return min(hot, MAX_LOOKBACK_S) if hot > 0 else MAX_LOOKBACK_S


def task_body(s: InfluxSettings, lookback_min: int = 5) -> str:
    """The task's script without its ``option task`` line (runnable as a query)."""
    rollup = flux_string(s.rollup_bucket)
    org = flux_string(s.org)
    head = f"""now_ = date.truncate(t: now(), unit: 1m)
floor = date.sub(d: {max_lookback_s(s)}s, from: now_)
late = date.sub(d: {int(lookback_min)}m, from: now_)
marks = from(bucket: {rollup})
    |> range(start: floor, stop: date.add(d: 1m, to: now_))
    |> filter(fn: (r) => r._measurement == {flux_string(COVERAGE)} and r._field == "points")
    |> last()
    |> findColumn(fn: (key) => true, column: "_time")
covered = if length(arr: marks) > 0 then marks[0] else floor
start_ = if covered < late then covered else late
chunk_end = date.add(d: {CHUNK_MIN}m, to: start_)
stop_ = if chunk_end < now_ then chunk_end else now_
"""
    # the mark depends on the written points, so it is written only once they all are
    mark = f"""union(tables: [
        rolled |> group() |> count() |> map(fn: (r) => ({{_value: r._value}})),
        array.from(rows: [{{_value: 0}}]),
    ])
    |> group()
    |> sum()
    |> map(fn: (r) => ({{
        _time: stop_, _measurement: {flux_string(COVERAGE)}, _field: "points", _value: r._value,
    }}))
    |> to(bucket: {rollup}, org: {org})
"""
    return _imports() + head + _rollup_stream(s, None) + mark


def task_flux(s: InfluxSettings, lookback_min: int = 5) -> str:
    body = task_body(s, lookback_min)
    option = f"option task = {{name: {flux_string(TASK_NAME)}, every: 1m, offset: 5s}}\n"
    cut = body.index("now_ = ")
    return body[:cut] + option + body[cut:]


def ensure_buckets(client: InfluxDBClient, s: InfluxSettings) -> None:
    """Create the hot and rollup buckets when missing (existing ones are left as they are)."""
    api = client.buckets_api()
    org = client.organizations_api().find_organizations(org=s.org)[0]
    for name, retention in ((s.bucket, s.hot_retention_s), (s.rollup_bucket, ROLLUP_RETENTION_S)):
        if api.find_bucket_by_name(name) is None:
            rules = [BucketRetentionRules(type="expire", every_seconds=retention)]
            api.create_bucket(bucket_name=name, retention_rules=rules, org=org)


def ensure_rollup_task(client: InfluxDBClient, s: InfluxSettings, lookback_min: int = 5) -> str:
    """Create the rollup task, or update its script; returns its id."""
    api = client.tasks_api()
    flux = task_flux(s, lookback_min)
    org_id = client.organizations_api().find_organizations(org=s.org)[0].id
    for task in api.find_tasks(name=TASK_NAME, org_id=org_id):
        if task.flux != flux:
            task.flux = flux
            api.update_task(task)
        return str(task.id)
    created = api.create_task(
        task_create_request=TaskCreateRequest(flux=flux, org_id=org_id, status="active")
    )
    return str(created.id)


def run_task_once(
    client: InfluxDBClient, s: InfluxSettings, now: datetime, lookback_min: int = 5
) -> None:
    """One run of the task's script as if the scheduler ran it at ``now`` (tests, catch-up)."""
    flux = task_body(s, lookback_min).replace(
        "now_ = ", f"option now = () => {flux_time(now)}\nnow_ = ", 1
    )
    client.query_api().query(flux, org=s.org)


def run_rollup(
    client: InfluxDBClient,
    s: InfluxSettings,
    start: datetime,
    stop: datetime,
    run_id: str | None = None,
) -> None:
    """Roll up [start, stop) now (backfill after a long outage, tests), ``CHUNK_MIN`` minutes
    per query; pass whole minutes."""
    step = timedelta(minutes=CHUNK_MIN)
    while start < stop:
        end = min(start + step, stop)
        flux = rollup_flux(s, flux_time(start), flux_time(end), run_id)
        client.query_api().query(flux, org=s.org)
        start = end
