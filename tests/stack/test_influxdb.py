"""InfluxDB of the local stack: write with influxdb-client, read back with Flux; restarts."""

from __future__ import annotations

import time
import uuid

import pytest
from influxdb_client import InfluxDBClient, Point
from influxdb_client.client.write_api import SYNCHRONOUS

pytestmark = pytest.mark.stack


def _client(env: dict[str, str]) -> InfluxDBClient:
    return InfluxDBClient(
        url=env["STEPLENS_INFLUX_URL"],
        token=env["STEPLENS_INFLUX_TOKEN"],
        org=env["STEPLENS_INFLUX_ORG"],
        timeout=20_000,
    )


def _write_and_read(env: dict[str, str], run_id: str, loss: float | None) -> list[float]:
    with _client(env) as client:
        if loss is not None:
            point = (
                Point("step")
                .tag("run_id", run_id)
                .tag("rank", "0")
                .field("loss", loss)
                .field("step", 7)
                .time(time.time_ns())
            )
            client.write_api(write_options=SYNCHRONOUS).write(
                bucket=env["STEPLENS_INFLUX_BUCKET"], record=point
            )
        flux = (
            f'from(bucket: "{env["STEPLENS_INFLUX_BUCKET"]}") |> range(start: -10m) '
            f'|> filter(fn: (r) => r._measurement == "step" and r.run_id == "{run_id}" '
            'and r._field == "loss")'
        )
        tables = client.query_api().query(flux)
    return [rec.get_value() for table in tables for rec in table.records]


def test_point_round_trip(stack_env: dict[str, str]) -> None:
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    assert _write_and_read(stack_env, run_id, 2.5) == [2.5]


def test_buckets_and_retention(stack_env: dict[str, str]) -> None:
    from steplens.stack.config import StackConfig

    with _client(stack_env) as client:
        api = client.buckets_api()
        hot = api.find_bucket_by_name(stack_env["STEPLENS_INFLUX_BUCKET"])
        rollup = api.find_bucket_by_name(stack_env["STEPLENS_INFLUX_ROLLUP_BUCKET"])
    assert hot.retention_rules[0].every_seconds == StackConfig.create().hot_retention_s
    assert rollup.retention_rules[0].every_seconds == 30 * 24 * 3600


@pytest.mark.slow
def test_restart_keeps_points(private_stack) -> None:
    stack = private_stack(["influxdb"])
    run_id = f"restart-{uuid.uuid4().hex[:8]}"
    assert _write_and_read(stack.env(), run_id, 1.25) == [1.25]
    assert stack.stop("influxdb") is True
    stack.start("influxdb")
    assert _write_and_read(stack.env(), run_id, None) == [1.25]
