"""Buckets and 1-minute rollups.

Rollups run inside InfluxDB as a task (every minute): it re-aggregates the last few closed
minutes of the hot bucket into the rollup bucket as ``<field>_mean``, ``_min``, ``_max`` and
``_last`` (floats), stamped with the minute's start, keeping measurement and tags. Rewriting
a minute rewrites the same points, so late data (a sink catching up after an outage) is folded
in as long as it arrives within the lookback, and nothing depends on a sink process's memory.
``run_rollup`` runs the same query for any past range (backfill, tests).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Final

from influxdb_client import BucketRetentionRules, InfluxDBClient, TaskCreateRequest

from steplens.sinks.settings import InfluxSettings

TASK_NAME: Final = "steplens-rollup-1m"
ROLLUP_RETENTION_S: Final = 30 * 24 * 3600  # 30 days: the boards' longest range
AGGREGATES: Final = ("mean", "min", "max", "last")


def flux_string(value: str) -> str:
    """A Flux string literal (Flux has no query parameters in InfluxDB OSS)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("${", "\\${")
    return f'"{escaped}"'


def flux_time(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rollup_flux(s: InfluxSettings, start: str, stop: str, run_id: str | None = None) -> str:
    """Aggregate the numeric fields of [start, stop) (of one run, or all) into the rollup bucket."""
    only_run = "" if run_id is None else f" and r.run_id == {flux_string(run_id)}"
    parts = ", ".join(f"agg(fn: {a}, suffix: {flux_string('_' + a)})" for a in AGGREGATES)
    return f"""import "types"
data = from(bucket: {flux_string(s.bucket)})
    |> range(start: {start}, stop: {stop})
    |> filter(fn: (r) => r._field != "seq"{only_run} and types.isNumeric(v: r._value))
    |> toFloat()
agg = (fn, suffix) => data
    |> aggregateWindow(every: 1m, fn: fn, createEmpty: false, timeSrc: "_start")
    |> map(fn: (r) => ({{r with _field: r._field + suffix}}))
union(tables: [{parts}])
    |> to(bucket: {flux_string(s.rollup_bucket)}, org: {flux_string(s.org)})
"""


def task_flux(s: InfluxSettings, lookback_min: int = 5) -> str:
    header = (
        'import "date"\n'
        f"option task = {{name: {flux_string(TASK_NAME)}, every: 1m, offset: 5s}}\n"
        "stop_ = date.truncate(t: now(), unit: 1m)\n"
        f"start_ = date.sub(d: {int(lookback_min)}m, from: stop_)\n"
    )
    body = rollup_flux(s, "start_", "stop_").replace('import "types"\n', "")
    return 'import "types"\n' + header + body


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


def run_rollup(
    client: InfluxDBClient,
    s: InfluxSettings,
    start: datetime,
    stop: datetime,
    run_id: str | None = None,
) -> None:
    """Roll up [start, stop) now (backfill after a long outage, tests); pass whole minutes."""
    flux = rollup_flux(s, flux_time(start), flux_time(stop), run_id)
    client.query_api().query(flux, org=s.org)
