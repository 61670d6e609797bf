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
once a run succeeds. A run covers at most ``CHUNK_MIN`` minutes (fewer after runs that failed:
``rollup_loop``), and never reaches back past the hot window (``floor``): a gap longer than
that cannot be rolled up from the hot bucket.

Memory: every aggregate is computed by the storage engine (a window aggregate pushed down),
so a query holds rollup rows, not raw points, whatever the burst; and a run makes one query a
measurement (``roll``), so a query holds one measurement's rows: a run of 1,024 ranks has
about 20,000 series, whose minute in one query passed InfluxDB's query memory limit. Fields that
are not numbers (text, booleans, ``<name>_nonfinite``), which the storage engine refuses to
aggregate, are left out by name (``text_fields``: learnt once and from the points written,
not scanned on every run).
``run_rollup`` runs the same aggregation for any past range, in chunks of ``CHUNK_MIN``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

from influxdb_client import BucketRetentionRules, InfluxDBClient, Point, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS
from influxdb_client.rest import ApiException

from steplens.schema.flux_literals import flux_string, flux_time
from steplens.schema.store_layout import (
    AGGREGATES,
    COVERAGE,
    COVERAGE_FIELD,
    FOLDS,
    RUN,
    SEQ,
    field_in,
    last_mark,
    mark_is,
    measurement_in,
    rollup_suffix,
    tag_in,
)
from steplens.sinks.settings import InfluxSettings
from steplens.sinks.text_fields import TextFields

TASK_NAME: Final = "steplens-rollup-1m"  # the InfluxDB task of earlier versions, removed
ROLLUP_RETENTION_S: Final = 30 * 24 * 3600  # 30 days: the boards' longest range
CHUNK_MIN: Final = 15  # minutes one query rolls up at most
MAX_LOOKBACK_S: Final = 24 * 3600  # how far back the task reaches when the hot window is longer
IMPORTS: Final = ("array", "date", "dict", "regexp", "influxdata/influxdb/schema")


def _imports() -> str:
    return "".join(f"import {flux_string(name)}\n" for name in IMPORTS)


def _folded(measurement: str, aggregate: str) -> str:
    """Flux condition (to append): a field of ``measurement`` the rollups keep by
    ``aggregate`` (``FOLDS``: the summary fields that keep it, and every field not listed)."""
    folds = FOLDS.get(measurement)
    if folds is None:
        return ""
    using = [f for f, kept in folds.items() if aggregate in kept]
    others = " and ".join(f"r._field != {flux_string(f)}" for f in folds)
    return f" and ({field_in(using)} or ({others}))" if using else f" and {others}"


def _rollup_stream(s: InfluxSettings, measurement: str, run_id: str | None, skips: str) -> str:
    """Flux defining ``rolled``: the rollup points of ``measurement`` in [start_, stop_),
    written to the rollup bucket (``start_`` and ``stop_`` are defined by the caller): each
    numeric field by each aggregate it keeps (``FOLDS``), one pushed-down window aggregate
    each. ``skips``: a Flux dictionary, measurement -> a regular expression of its fields
    that are not numbers (``TextFields.flux_dict``)."""
    hot = flux_string(s.bucket)
    only_run = "" if run_id is None else f" and {tag_in(RUN, [run_id])}"
    m = flux_string(measurement)
    numbers = f"r._field != {flux_string(SEQ)} and r._field !~ skip{only_run}"
    aggs = ", ".join(
        f"""from(bucket: {hot})
    |> range(start: start_, stop: stop_)
    |> filter(fn: (r) => {measurement_in([measurement])} and {numbers}{_folded(measurement, a)})
    |> aggregateWindow(every: 1m, fn: {a}, createEmpty: false, timeSrc: "_start")
    |> toFloat()
    |> map(fn: (r) => ({{r with _field: r._field + {flux_string(rollup_suffix(a))}}}))"""
        for a in AGGREGATES
    )
    return f"""skips = {skips}
skip = regexp.compile(v: dict.get(dict: skips, key: {m}, default: "^$"))
rolled = union(tables: [{aggs}])
    |> to(bucket: {flux_string(s.rollup_bucket)}, org: {flux_string(s.org)})
"""


def rollup_flux(
    s: InfluxSettings, start: str, stop: str, measurement: str, *, skips: str, run_id: str | None
) -> str:
    """Aggregate the numeric fields of ``measurement`` in [start, stop) (of one run, or all)
    into the rollup bucket; the query's value is the count of points written."""
    return (
        _imports()
        + f"start_ = {start}\nstop_ = {stop}\n"
        + _rollup_stream(s, measurement, run_id, skips)
        + "rolled |> count() |> group() |> sum()\n"
    )


def max_lookback_s(s: InfluxSettings) -> int:
    """How far back the task reaches: the hot window (nothing older is left), at most a day."""
    hot = s.hot_retention_s
    return min(hot, MAX_LOOKBACK_S) if hot > 0 else MAX_LOOKBACK_S


def window_flux(s: InfluxSettings, lookback_min: int = 5, chunk_min: int = CHUNK_MIN) -> str:
    """One run's range, from the coverage mark (at most ``lookback_min`` minutes back, at
    least the hot window) to the last closed minute, ``chunk_min`` minutes at most, and the
    measurements in it: a row per measurement (and one named ``""``), with ``start`` and
    ``stop``."""
    rollup = flux_string(s.rollup_bucket)
    return (
        _imports()
        + f"""now_ = date.truncate(t: now(), unit: 1m)
floor = date.sub(d: {max_lookback_s(s)}s, from: now_)
late = date.sub(d: {int(lookback_min)}m, from: now_)
marks = from(bucket: {rollup})
    |> range(start: floor, stop: date.add(d: 1m, to: now_))
    |> filter(fn: (r) => {mark_is(COVERAGE, COVERAGE_FIELD)})
    |> last()
    |> findColumn(fn: (key) => true, column: "_time")
covered = if length(arr: marks) > 0 then marks[0] else floor
start_ = if covered < late then covered else late
chunk_end = date.add(d: {int(chunk_min)}m, to: start_)
stop_ = if chunk_end < now_ then chunk_end else now_
names = schema.measurements(bucket: {flux_string(s.bucket)}, start: start_, stop: stop_)
    |> findColumn(fn: (key) => true, column: "_value")
array.from(rows: array.map(
    arr: array.concat(arr: [""], v: names),
    fn: (x) => ({{name: x, start: start_, stop: stop_}}),
))
"""
    )


def measurements(
    client: InfluxDBClient, s: InfluxSettings, start: datetime, stop: datetime
) -> list[str]:
    """The hot bucket's measurements with points in [start, stop)."""
    span = f"start: {flux_time(start)}, stop: {flux_time(stop)}"
    flux = f"""import "influxdata/influxdb/schema"
schema.measurements(bucket: {flux_string(s.bucket)}, {span})
"""
    return [
        str(r.get_value()) for t in client.query_api().query(flux, org=s.org) for r in t.records
    ]


def roll(
    client: InfluxDBClient,
    s: InfluxSettings,
    span: tuple[datetime, datetime],
    names: list[str],
    *,
    skips: str,
    run_id: str | None = None,
) -> int:
    """Roll up ``span`` (start, stop) of each of ``names``, one query a measurement (a
    query's memory is one measurement's rollup rows: all of a large run's at once passed
    InfluxDB's query memory limit); returns the points written."""
    total = 0
    start, stop = (flux_time(t) for t in span)
    for name in names:
        flux = rollup_flux(s, start, stop, name, skips=skips, run_id=run_id)
        for t in client.query_api().query(flux, org=s.org):
            total += sum(int(r.get_value() or 0) for r in t.records)
    return total


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
    *,
    lookback_min: int = 5,
    chunk_min: int = CHUNK_MIN,
) -> None:
    """One rollup run, as if at ``now`` (default: the server's clock): its range (``chunk_min``
    minutes at most, from the coverage mark or ``lookback_min`` back, ``window_flux``) and
    measurements, each measurement rolled up, then the coverage mark at the range's end (a
    run that fails leaves the mark where it was: the next one redoes its minutes). A run
    that the server fails (another sink may have written a text field this one never saw:
    the storage engine refuses to aggregate it) marks ``fields`` stale: the next run learns
    them again; a run that the server fails after this sink learnt a text field meanwhile is
    made again at once with it left out. A run that times out does not: the scan is the
    costliest query of all, and repeating it after every slow run made a loaded store slower
    still."""
    query_api = client.query_api()
    fields.scan_if_stale(query_api, s)
    flux = window_flux(s, lookback_min, chunk_min)
    if now is not None:
        flux = flux.replace("now_ = ", f"option now = () => {flux_time(now)}\nnow_ = ", 1)
    try:
        rows = [r.values for t in query_api.query(flux, org=s.org) for r in t.records]
        if not rows:
            return
        start, stop = rows[0]["start"], rows[0]["stop"]
        names = [str(r["name"]) for r in rows if r["name"]]
        known = fields.count()
        try:
            points = roll(client, s, (start, stop), names, skips=fields.flux_dict())
        except ApiException:
            if fields.count() == known:
                raise
            # the sink wrote a text field first while the run was under way (an alert's, a
            # new metric's): the run again, leaving it out too (its points are the same)
            points = roll(client, s, (start, stop), names, skips=fields.flux_dict())
        mark = Point(COVERAGE).field(COVERAGE_FIELD, points).time(stop, WritePrecision.NS)
        client.write_api(write_options=SYNCHRONOUS).write(s.rollup_bucket, s.org, mark)
    except ApiException:  # the server's answer, not a timeout
        fields.mark_stale()
        raise


def covered_until(client: InfluxDBClient, s: InfluxSettings) -> datetime | None:
    """The end of the range the last successful run covered (its coverage mark)."""
    flux = last_mark(s.rollup_bucket, COVERAGE, COVERAGE_FIELD, max_lookback_s(s) + 3600)
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
        names = measurements(client, s, start, end)
        roll(client, s, (start, end), names, skips=fields.flux_dict(), run_id=run_id)
        start = end
