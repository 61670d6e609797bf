"""Reading back what the InfluxDB sink wrote (tests only)."""

from __future__ import annotations

from influxdb_client import InfluxDBClient

from steplens.sinks.query import csv_text
from steplens.sinks.rollup import flux_string
from steplens.sinks.settings import InfluxSettings


def settings_from(env: dict[str, str]) -> InfluxSettings:
    return InfluxSettings(
        url=env["STEPLENS_INFLUX_URL"],
        org=env["STEPLENS_INFLUX_ORG"],
        token=env["STEPLENS_INFLUX_TOKEN"],
        bucket=env["STEPLENS_INFLUX_BUCKET"],
        rollup_bucket=env["STEPLENS_INFLUX_ROLLUP_BUCKET"],
    )


def count_points(
    s: InfluxSettings, run_id: str, measurement: str = "step", bucket: str | None = None
) -> int:
    """Points (not fields) of one run in one measurement: every point has a ``seq`` field."""
    flux = (
        f"from(bucket: {flux_string(bucket or s.bucket)}) |> range(start: 0)"
        f" |> filter(fn: (r) => r._measurement == {flux_string(measurement)}"
        f' and r.run_id == {flux_string(run_id)} and r._field == "seq")'
        " |> group() |> count()"
    )
    with InfluxDBClient(url=s.url, token=s.token, org=s.org) as c:
        tables = c.query_api().query(flux, org=s.org)
    return sum(int(r.get_value()) for t in tables for r in t.records)


def rows(s: InfluxSettings, flux_filter: str, bucket: str | None = None) -> list[dict]:
    flux = (
        f"from(bucket: {flux_string(bucket or s.bucket)}) |> range(start: 0)"
        f" |> filter(fn: (r) => {flux_filter})"
    )
    with InfluxDBClient(url=s.url, token=s.token, org=s.org) as c:
        tables = c.query_api().query(flux, org=s.org)
    return [{k: csv_text(v) for k, v in r.values.items()} for t in tables for r in t.records]
