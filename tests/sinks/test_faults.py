"""Faults survived, against real services. Outages are shortened to keep the suite fast:
STEPLENS_SINKS_OUTAGE_S (default 15) sets them; 120 gives the full two minutes."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace

import pytest
from confluent_kafka import Consumer
from influx_helpers import count_points, settings_from
from prometheus_client import REGISTRY
from sinks_helpers import (
    committed,
    end_offsets,
    produce,
    sink_process,
    step_records,
    unique,
    wait_for,
)
from test_s3_roller import cold_rows, s3_settings, start_roller

from steplens.schema.kafka_config import consumer_config
from steplens.sinks.chunks import Chunker
from steplens.sinks.influx import InfluxSink, make_client
from steplens.sinks.kafka_io import DeadLetters
from steplens.sinks.loop import SinkLoop
from steplens.sinks.retry import RetryPolicy
from steplens.sinks.roller_loop import RollerLoop
from steplens.sinks.rollup import ensure_buckets
from steplens.sinks.s3 import S3Roller, make_s3_client
from steplens.sinks.settings import S3Settings

pytestmark = [pytest.mark.stack, pytest.mark.slow]
OUTAGE_S = float(os.environ.get("STEPLENS_SINKS_OUTAGE_S", "15"))


def retries(sink: str) -> float:
    """Exports ``sink``'s loop made again after a retryable result, in this process."""
    return REGISTRY.get_sample_value("steplens_sink_retries_total", {"sink": sink}) or 0.0


def produce_slowly(bootstrap: str, topic: str, records, seconds: float) -> threading.Thread:
    """Produce ``records`` in slices spread over ``seconds`` (load during the outage)."""
    slices = 20

    def run() -> None:
        step = max(1, len(records) // slices)
        for i in range(0, len(records), step):
            produce(bootstrap, topic, records[i : i + step])
            time.sleep(seconds / slices)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_influxdb_outage_under_load_loses_and_duplicates_nothing(
    stack_env, topics, private_stack
) -> None:
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    stack = private_stack(["influxdb"])
    s = replace(settings_from({**stack_env, **stack.env()}), timeout_ms=2000)
    run_id = unique("run")
    records = step_records(run_id, 4000, ranks=4)
    group = unique("group")
    stop = threading.Event()
    consumer = Consumer(consumer_config(group, bootstrap))
    consumer.subscribe([topics.raw])
    with make_client(s) as client:
        ensure_buckets(client, s)
        sink = InfluxSink(client, s)
        loop = SinkLoop(
            consumer,
            sink,
            DeadLetters(topics.dead_letters, group, bootstrap),
            stop=stop,
            batch_size=100,
            backoff=RetryPolicy(initial_backoff_s=0.2, max_backoff_s=1),
        )
        thread = threading.Thread(target=loop.run, daemon=True)
        thread.start()
        try:
            produce(bootstrap, topics.raw, records[:1000])
            wait_for(lambda: loop.stats.accepted >= 500, 60, "first writes")
            stack.stop("influxdb")
            failing = retries("influx")
            feeder = produce_slowly(bootstrap, topics.raw, records[1000:], OUTAGE_S / 2)
            wait_for(lambda: retries("influx") > failing, 30, "writes failing")
            before = committed(bootstrap, group, topics.raw, 4)
            time.sleep(OUTAGE_S)  # the outage itself
            feeder.join(60)
            assert committed(bootstrap, group, topics.raw, 4) == before  # nothing without a write
            ends = end_offsets(bootstrap, topics.raw, 4)
            stack.start("influxdb")
            wait_for(lambda: committed(bootstrap, group, topics.raw, 4) == ends, 120, "catch-up")
        finally:
            stop.set()
            thread.join(30)
            consumer.close()
        assert count_points(s, run_id) == len(records)
        assert loop.stats.accepted >= len(records) and loop.stats.dead_letters == 0


def private_s3(stack_env: dict[str, str], stack) -> S3Settings:
    """Settings for the S3 server of a private stack (its own endpoint and keys)."""
    penv = stack.env()
    return replace(
        s3_settings(stack_env, unique("outage")),
        bucket=penv["STEPLENS_S3_BUCKET"],
        endpoint_url=penv["STEPLENS_S3_ENDPOINT"],
        access_key_id=penv["AWS_ACCESS_KEY_ID"],
        secret_access_key=penv["AWS_SECRET_ACCESS_KEY"],
    )


def test_s3_outage_retries_and_leaves_no_partial_objects(stack_env, topics, private_stack) -> None:
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    stack = private_stack(["s3"])
    settings = private_s3(stack_env, stack)
    run_id = unique("run")
    records = step_records(run_id, 3000, ranks=4)
    group = unique("group")
    r = start_roller(stack_env, topics, group, settings, max_age_s=0.3)
    try:
        produce(bootstrap, topics.raw, records[:1000])
        wait_for(lambda: r.loop.stats.accepted >= 500, 60, "first uploads")
        stack.stop("s3")
        failing = retries("s3")
        feeder = produce_slowly(bootstrap, topics.raw, records[1000:], OUTAGE_S / 2)
        wait_for(lambda: retries("s3") > failing, 30, "uploads failing")
        before = committed(bootstrap, group, topics.raw, 4)
        time.sleep(OUTAGE_S)  # the outage itself
        feeder.join(60)
        assert committed(bootstrap, group, topics.raw, 4) == before  # nothing without a write
        stack.start("s3")
        ends = end_offsets(bootstrap, topics.raw, 4)
        wait_for(lambda: committed(bootstrap, group, topics.raw, 4) == ends, 120, "catch-up")
    finally:
        r.close()
    rows = cold_rows(settings)  # every object parses: none is partial
    assert len(rows) == len(records)
    assert len({(row["kafka_partition"], row["kafka_offset"]) for row in rows}) == len(records)


def test_shutdown_in_an_s3_outage_commits_nothing_past_an_unwritten_chunk(
    stack_env, topics, private_stack
) -> None:
    """Chunks of one partition wait behind one that S3 did not take when shutdown comes; S3
    is back for the last drain: it must not commit the later chunks past the unwritten one."""
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    stack = private_stack(["s3"])
    settings = private_s3(stack_env, stack)
    records = step_records(unique("run"), 60, ranks=1)  # one key: one partition
    produce(bootstrap, topics.raw, records)
    stack.stop("s3")
    group, stop = unique("group"), threading.Event()
    consumer = Consumer(consumer_config(group, bootstrap))
    roller = S3Roller(make_s3_client(settings), settings)
    loop = RollerLoop(
        consumer,
        roller,
        DeadLetters(topics.dead_letters, group, bootstrap),
        chunker=Chunker(roller.marker, max_bytes=2000),  # about 12 records a chunk
        stop=stop,
        backoff=RetryPolicy(initial_backoff_s=0.2, max_backoff_s=1),
    )
    consumer.subscribe([topics.raw], on_revoke=loop.on_revoke)
    thread = threading.Thread(target=loop.run, daemon=True)
    failing = retries("s3")
    thread.start()
    try:
        wait_for(lambda: retries("s3") > failing, 60, "uploads failing")
        stop.set()
        thread.join(30)
        stack.start("s3")
        loop.drain()
    finally:
        stop.set()
        thread.join(30)
        consumer.close()
    stored = {row["kafka_offset"] for row in cold_rows(settings)}
    done = sum(committed(bootstrap, group, topics.raw, 4).values())
    assert set(range(done)) <= stored
    assert done == 0 and loop.stats.commits == 0


@pytest.mark.parametrize("which", ["influx", "s3"])
def test_sink_killed_mid_batch_restarts_with_exact_counts(stack_env, topics, which) -> None:
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    run_id = unique("run")
    records = step_records(run_id, 8000, ranks=4)
    produce(bootstrap, topics.raw, records)
    ends = end_offsets(bootstrap, topics.raw, 4)
    group = unique("group")
    prefix = unique("kill")
    extra = (
        ["--prefix", prefix, "--max-bytes", "200000", "--max-age-s", "0.5"] if which == "s3" else []
    )
    proc = sink_process(which, topics, group, extra)
    try:
        wait_for(
            lambda: sum(committed(bootstrap, group, topics.raw, 4).values()) > 0,
            60,
            "a first commit",
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert sum(committed(bootstrap, group, topics.raw, 4).values()) < len(records)
        proc = sink_process(which, topics, group, extra)
        wait_for(
            # 8,000 records again into S3 after the group moves on: minutes on a loaded machine
            lambda: committed(bootstrap, group, topics.raw, 4) == ends,
            300,
            "the restarted sink",
        )
    finally:
        proc.terminate()
        proc.wait(30)
    if which == "influx":
        assert count_points(settings_from(stack_env), run_id) == len(records)
    else:
        rows = cold_rows(s3_settings(stack_env, prefix))
        assert len(rows) == len(records)
        assert len({(row["kafka_partition"], row["kafka_offset"]) for row in rows}) == len(records)
