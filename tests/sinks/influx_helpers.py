"""Reading back what the InfluxDB sink wrote (tests only)."""

from __future__ import annotations

import threading

from confluent_kafka import Consumer
from influxdb_client import InfluxDBClient
from sinks_helpers import committed, end_offsets, wait_for

from steplens.schema.flux_literals import flux_string
from steplens.schema.kafka_config import consumer_config
from steplens.schema.topics import Topics
from steplens.sinks.influx import InfluxSink, make_client
from steplens.sinks.kafka_io import DeadLetters
from steplens.sinks.loop import SinkLoop
from steplens.sinks.query_hot import csv_text
from steplens.sinks.retry import RetryPolicy
from steplens.sinks.settings import InfluxSettings


def settings_from(env: dict[str, str]) -> InfluxSettings:
    return InfluxSettings(
        url=env["STEPLENS_INFLUX_URL"],
        org=env["STEPLENS_INFLUX_ORG"],
        token=env["STEPLENS_INFLUX_TOKEN"],
        bucket=env["STEPLENS_INFLUX_BUCKET"],
        rollup_bucket=env["STEPLENS_INFLUX_ROLLUP_BUCKET"],
        # a rollup reads which fields are text across the whole hot bucket: seconds once the
        # suite has filled it on 2 shared cores
        timeout_ms=30_000,
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


def run_influx_loop(
    s: InfluxSettings,
    bootstrap: str,
    topics: Topics,
    group: str,
    batch_size: int,
    write_chunk: int | None = None,
) -> SinkLoop:
    """Run the InfluxDB sink's loop over the raw topic until it has committed every offset
    there is now; returns the stopped loop (its stats)."""
    stop = threading.Event()
    consumer = Consumer(consumer_config(group, bootstrap))
    consumer.subscribe([topics.raw])
    dead = DeadLetters(topics.dead_letters, group, bootstrap)
    with make_client(s) as client:
        chunk = {} if write_chunk is None else {"write_chunk": write_chunk}
        sink = InfluxSink(client, s, **chunk)
        loop = SinkLoop(
            consumer,
            sink,
            dead,
            stop=stop,
            batch_size=batch_size,
            backoff=RetryPolicy(initial_backoff_s=0.2),
        )
        thread = threading.Thread(target=loop.run, daemon=True)
        thread.start()
        try:
            ends = end_offsets(bootstrap, topics.raw, 4)
            wait_for(lambda: committed(bootstrap, group, topics.raw, 4) == ends, 60, "commits")
        finally:
            stop.set()
            thread.join(30)
            consumer.close()
    return loop
