"""Buckets and 1-minute rollups.

A run (``run_once``; the influx sink makes one 5 s after every minute, ``rollup_loop``)
aggregates closed minutes of the hot bucket into the rollup bucket as ``<field>_mean``,
``_min``, ``_max`` and ``_last`` (floats), stamped with the minute's start, keeping
measurement and tags. Rewriting a minute rewrites the same points, so every run may safely
redo minutes. Runs are made by the sink, one at a time, not by an InfluxDB task: the task
scheduler starts a run on time even while earlier ones still run, and after a burst they
piled up (an earlier task of that name is removed, ``remove_rollup_task``).

Coverage: after a run's points are written, it writes a ``rollup_coverage`` point (no tags)
into the rollup bucket, stamped with the end of the range it covered. The next run starts
from the older of that mark and the last ``lookback_min`` minutes (late data, such as a sink
catching up after an outage, is folded in), so minutes of failed or missed runs are redone
once a run succeeds. A run covers at most ``CHUNK_MIN`` minutes, and never reaches back past
the hot window (``floor``): a gap longer than that cannot be rolled up from the hot bucket.

Memory: every aggregate is computed by the storage engine (a window aggregate pushed down per
measurement), so a query holds rollup rows, not raw points, whatever the burst. Fields that
are not numbers (text, booleans, ``<name>_nonfinite``), which the storage engine refuses to
aggregate, are left out by name (``text_fields``: learnt once and from the points written,
not scanned on every run).
``run_rollup`` runs the same aggregation for any past range, in chunks of ``CHUNK_MIN``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

from influxdb_client import BucketRetentionRules, InfluxDBClient

from steplens.sinks.flux_literals import flux_string, flux_time
from steplens.sinks.settings import InfluxSettings
from steplens.sinks.text_fields import TextFields

TASK_NAME: Final = "steplens-rollup-1m"  # the InfluxDB task of earlier versions, removed
ROLLUP_RETENTION_S: Final = 30 * 24 * 3600  # 30 days: the boards' longest range
AGGREGATES: Final = ("mean", "min", "max", "last")
COVERAGE: Final = "rollup_coverage"  # measurement of the task's coverage marks
CHUNK_MIN: Final = 15  # minutes one query rolls up at most
MAX_LOOKBACK_S: Final = 24 * 3600  # how far back the task reaches when the hot window is longer
IMPORTS: Final = ("array", "date", "dict", "regexp", "influxdata/influxdb/schema")


def _imports() -> str:
    return "".join(f"import {flux_string(name)}\n" for name in IMPORTS)


def _rollup_stream(s: InfluxSettings, run_id: str | None, skips: str) -> str:
    """Flux defining ``rolled``: the rollup points of [start_, stop_), written to the rollup
    bucket (``start_`` and ``stop_`` are defined by the caller). ``skips``: a Flux dictionary,
    measurement -> a regular expression of its fields that are not numbers
    (``TextFields.flux_dict``)."""
    hot = flux_string(s.bucket)
    only_run = "" if run_id is None else f" and r.run_id == {flux_string(run_id)}"
    aggs = ", ".join(
        f"agg(m: m, skip: skip, fn: {a}, suffix: {flux_string('_' + a)})" for a in AGGREGATES
    )
    return f"""skips = {skips}
agg = (m, skip, fn, suffix) => from(bucket: {hot})
    |> range(start: start_, stop: stop_)
    |> filter(fn: (r) => r._measurement == m and r._field != "seq" and r._field !~ skip{only_run})
    |> aggregateWindow(every: 1m, fn: fn, createEmpty: false, timeSrc: "_start")
    |> toFloat()
    |> map(fn: (r) => ({{r with _field: r._field + suffix}}))
measurement = (m) => {{
    skip = regexp.compile(v: dict.get(dict: skips, key: m, default: "^$"))
    return union(tables: [{aggs}])
}}
names = schema.measurements(bucket: {hot}, start: start_, stop: stop_)
    |> findColumn(fn: (key) => true, column: "_value")
// union takes two streams at least: two empty measurements make sure of it
all_names = array.concat(arr: ["", ""], v: names)
rolled = union(tables: array.map(arr: all_names, fn: (x) => measurement(m: x)))
    |> to(bucket: {flux_string(s.rollup_bucket)}, org: {flux_string(s.org)})
"""


def rollup_flux(
    s: InfluxSettings, start: str, stop: str, skips: str, run_id: str | None = None
) -> str:
    """Aggregate the numeric fields of [start, stop) (of one run, or all) into the rollup bucket."""
    return (
        _imports()
        + f"start_ = {start}\nstop_ = {stop}\n"
        + _rollup_stream(s, run_id, skips)
        + "rolled |> count() |> group() |> sum()\n"
    )


def max_lookback_s(s: InfluxSettings) -> int:
    """How far back the task reaches: the hot window (nothing older is left), at most a day."""
    hot = s.hot_retention_s
    return min(hot, MAX_LOOKBACK_S) if hot > 0 else MAX_LOOKBACK_S


def run_body(s: InfluxSettings, skips: str, lookback_min: int = 5) -> str:
    """One run's query: from the coverage mark (at most ``lookback_min`` minutes back, at
    least the hot window) to the last closed minute, ``CHUNK_MIN`` minutes at most."""
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
    return _imports() + head + _rollup_stream(s, None, skips) + mark


def ensure_buckets(client: InfluxDBClient, s: InfluxSettings) -> None:
    """Create the hot and rollup buckets when missing (existing ones are left as they are)."""
    api = client.buckets_api()
    org = client.organizations_api().find_organizations(org=s.org)[0]
    for name, retention in ((s.bucket, s.hot_retention_s), (s.rollup_bucket, ROLLUP_RETENTION_S)):
        if api.find_bucket_by_name(name) is None:
            rules = [BucketRetentionRules(type="expire", every_seconds=retention)]
            api.create_bucket(bucket_name=name, retention_rules=rules, org=org)


def remove_rollup_task(client: InfluxDBClient, s: InfluxSettings) -> bool:
    """Delete the InfluxDB task that ran the rollups before the sink did (its runs could
    overlap); True if there was one."""
    api = client.tasks_api()
    org_id = client.organizations_api().find_organizations(org=s.org)[0].id
    found = api.find_tasks(name=TASK_NAME, org_id=org_id)
    for task in found:
        api.delete_task(task.id)
    return bool(found)


def run_once(
    client: InfluxDBClient,
    s: InfluxSettings,
    fields: TextFields,
    now: datetime | None = None,
    lookback_min: int = 5,
) -> None:
    """One rollup run, as if at ``now`` (default: the server's clock). A run that fails
    marks ``fields`` stale (another sink may have written a text field this one never saw):
    the next run learns them again."""
    query_api = client.query_api()
    fields.scan_if_stale(query_api, s)
    flux = run_body(s, fields.flux_dict(), lookback_min)
    if now is not None:
        flux = flux.replace("now_ = ", f"option now = () => {flux_time(now)}\nnow_ = ", 1)
    try:
        query_api.query(flux, org=s.org)
    except Exception:
        fields.mark_stale()
        raise


def covered_until(client: InfluxDBClient, s: InfluxSettings) -> datetime | None:
    """The end of the range the last successful run covered (its coverage mark)."""
    flux = f"""from(bucket: {flux_string(s.rollup_bucket)})
    |> range(start: -{max_lookback_s(s) + 3600}s, stop: 1m)
    |> filter(fn: (r) => r._measurement == {flux_string(COVERAGE)} and r._field == "points")
    |> last()
"""
    for table in client.query_api().query(flux, org=s.org):
        for r in table.records:
            t = r.get_time()
            return t if isinstance(t, datetime) else None
    return None


def run_rollup(
    client: InfluxDBClient,
    s: InfluxSettings,
    start: datetime,
    stop: datetime,
    run_id: str | None = None,
    *,
    fields: TextFields | None = None,
) -> None:
    """Roll up [start, stop) now (backfill after a long outage, tests), ``CHUNK_MIN`` minutes
    per query; pass whole minutes. ``fields``: the text fields known (else learnt now, from
    the shards the range touches)."""
    if fields is None:
        fields = TextFields()
    fields.scan_if_stale(client.query_api(), s, (start, stop))
    step = timedelta(minutes=CHUNK_MIN)
    while start < stop:
        end = min(start + step, stop)
        flux = rollup_flux(s, flux_time(start), flux_time(end), fields.flux_dict(), run_id)
        client.query_api().query(flux, org=s.org)
        start = end
