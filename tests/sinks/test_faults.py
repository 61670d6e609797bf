"""Faults survived, against real services. Outages are shortened to keep the suite fast:
STEPLENS_SINKS_OUTAGE_S (default 15) sets them; 120 gives the full two minutes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest
from confluent_kafka import Consumer
from influx_helpers import count_points, settings_from
from sinks_helpers import committed, end_offsets, produce, step_records, unique, wait_for
from test_s3_roller import cold_rows, s3_settings, start_roller

from steplens.sinks.influx import InfluxSink, make_client
from steplens.sinks.kafka_io import DeadLetters, consumer_config
from steplens.sinks.loop import SinkLoop
from steplens.sinks.retry import RetryPolicy
from steplens.sinks.rollup import ensure_buckets

pytestmark = [pytest.mark.stack, pytest.mark.slow]
OUTAGE_S = float(os.environ.get("STEPLENS_SINKS_OUTAGE_S", "15"))
FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff_s=0.1, max_backoff_s=0.5, deadline_s=2)


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
        sink = InfluxSink(client, s, policy=FAST_RETRY, stop=stop)
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
            feeder = produce_slowly(bootstrap, topics.raw, records[1000:], OUTAGE_S / 2)
            time.sleep(OUTAGE_S)  # the outage itself
            feeder.join(60)
            during = committed(bootstrap, group, topics.raw, 4)
            ends = end_offsets(bootstrap, topics.raw, 4)
            assert sum(during.values()) < sum(ends.values())  # nothing committed without a write
            stack.start("influxdb")
            wait_for(lambda: committed(bootstrap, group, topics.raw, 4) == ends, 120, "catch-up")
        finally:
            stop.set()
            thread.join(30)
            consumer.close()
        assert count_points(s, run_id) == len(records)
        assert loop.stats.accepted >= len(records) and loop.stats.dead_letters == 0


def test_s3_outage_retries_and_leaves_no_partial_objects(stack_env, topics, private_stack) -> None:
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    stack = private_stack(["s3"])
    penv = stack.env()
    settings = replace(
        s3_settings(stack_env, unique("outage")), endpoint_url=penv["STEPLENS_S3_ENDPOINT"]
    )
    env = {
        **stack_env,
        **{
            k: penv[k]
            for k in ("STEPLENS_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
        },
    }
    old = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update({k: env[k] for k in old})
    try:
        run_id = unique("run")
        records = step_records(run_id, 3000, ranks=4)
        group = unique("group")
        r = start_roller(env, topics, group, settings, max_age_s=0.3, policy=FAST_RETRY)
        try:
            produce(bootstrap, topics.raw, records[:1000])
            wait_for(lambda: r.loop.stats.records >= 500, 60, "first uploads")
            stack.stop("s3")
            feeder = produce_slowly(bootstrap, topics.raw, records[1000:], OUTAGE_S / 2)
            time.sleep(OUTAGE_S)
            feeder.join(60)
            ends = end_offsets(bootstrap, topics.raw, 4)
            assert sum(committed(bootstrap, group, topics.raw, 4).values()) < sum(ends.values())
            stack.start("s3")
            wait_for(lambda: committed(bootstrap, group, topics.raw, 4) == ends, 120, "catch-up")
        finally:
            r.close()
        rows = cold_rows(settings)  # every object parses: none is partial
        assert len(rows) == len(records)
        assert len({(row["kafka_partition"], row["kafka_offset"]) for row in rows}) == len(records)
    finally:
        for k, v in old.items():
            if v is not None:
                os.environ[k] = v


def _sink_process(which: str, topics, group: str, extra: list[str]) -> subprocess.Popen:
    code = "import sys; from steplens.sinks.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            which,
            "--topics",
            topics.raw,
            "--group",
            group,
            "--dead-letter-topic",
            topics.dead_letters,
            "--metrics-port",
            "0",
            "--batch-size",
            "200",
            "--no-setup",
            "--log-level",
            "WARNING",
            "-X",
            "session.timeout.ms=6000",
            *extra,
        ],
        env={
            **os.environ,
            "STEPLENS_TOPIC_RAW": topics.raw,
            "STEPLENS_TOPIC_SIGNALS": topics.signals,
            "STEPLENS_TOPIC_ALERTS": topics.alerts,
            "STEPLENS_TOPIC_DEADLETTER": topics.dead_letters,
        },
    )


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
    proc = _sink_process(which, topics, group, extra)
    try:
        wait_for(
            lambda: sum(committed(bootstrap, group, topics.raw, 4).values()) > 0,
            60,
            "a first commit",
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert sum(committed(bootstrap, group, topics.raw, 4).values()) < len(records)
        proc = _sink_process(which, topics, group, extra)
        wait_for(
            lambda: committed(bootstrap, group, topics.raw, 4) == ends, 120, "the restarted sink"
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
