"""The S3 roller against the real Kafka and S3 server."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer
from sinks_helpers import committed, end_offsets, produce, read_all, step_records, unique, wait_for

from steplens.schema import decode
from steplens.schema.kafka_config import consumer_config
from steplens.sinks.chunks import Chunker
from steplens.sinks.cold import read_parquet
from steplens.sinks.kafka_io import DeadLetters
from steplens.sinks.retry import RetryPolicy
from steplens.sinks.roller_loop import RollerLoop
from steplens.sinks.s3 import S3Roller, ensure_bucket, make_s3_client
from steplens.sinks.settings import S3Settings

pytestmark = pytest.mark.stack


@dataclass
class Running:
    loop: RollerLoop
    thread: threading.Thread
    stop: threading.Event

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive()
        self.loop.consumer.close()


def s3_settings(env: dict[str, str], prefix: str) -> S3Settings:
    return S3Settings(
        bucket=env["STEPLENS_S3_BUCKET"], prefix=prefix, endpoint_url=env["STEPLENS_S3_ENDPOINT"]
    )


def start_roller(env, topics, group, settings, max_age_s=0.5) -> Running:
    stop = threading.Event()
    consumer = Consumer(consumer_config(group, env["STEPLENS_KAFKA_BOOTSTRAP"]))
    client = make_s3_client(settings)
    ensure_bucket(client, settings.bucket)
    roller = S3Roller(client, settings)
    dead = DeadLetters(topics.dead_letters, group, env["STEPLENS_KAFKA_BOOTSTRAP"])
    loop = RollerLoop(
        consumer,
        roller,
        dead,
        chunker=Chunker(roller.marker, max_age_s=max_age_s),
        stop=stop,
        backoff=RetryPolicy(initial_backoff_s=0.2, max_backoff_s=1),
    )
    consumer.subscribe([topics.raw], on_revoke=loop.on_revoke)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    return Running(loop, thread, stop)


def cold_rows(settings: S3Settings) -> list[dict]:
    client = make_s3_client(settings)
    rows = []
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=settings.bucket, Prefix=settings.prefix + "/kind="
    ):
        for obj in page.get("Contents", []):
            data = client.get_object(Bucket=settings.bucket, Key=obj["Key"])["Body"].read()
            rows += read_parquet(data).to_pylist()
    return rows


def test_roller_writes_every_record_once_and_dead_letters_bad_ones(stack_env, topics) -> None:
    env, bootstrap = stack_env, stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    run_id = unique("run")
    records = step_records(run_id, 300, ranks=4)
    bad = [(b"x:0", b"not json"), (b"x:1", b'{"v": 1, "kind": "nope"}'), (b"x:2", b"")]
    produce(bootstrap, topics.raw, records[:150] + bad + records[150:])
    settings = s3_settings(env, unique("prefix"))
    group = unique("group")
    r = start_roller(env, topics, group, settings)
    try:
        ends = end_offsets(bootstrap, topics.raw, 4)
        wait_for(lambda: committed(bootstrap, group, topics.raw, 4) == ends, 60, "commits")
    finally:
        r.close()
    rows = cold_rows(settings)
    assert sorted((row["rank"], row["seq"]) for row in rows) == sorted(
        (x.rank, x.seq) for x in records
    )
    assert {row["run_id"] for row in rows} == {run_id}
    assert all(
        decode(row["payload"])
        == next(x for x in records if (x.rank, x.seq) == (row["rank"], row["seq"]))
        for row in rows[:20]
    )
    dead = [decode(m) for m in read_all(bootstrap, topics.dead_letters, 3)]
    assert len(dead) == 3
    reasons = sorted(d.data["reason"] for d in dead)
    assert all(r.startswith("undecodable") for r in reasons)
    assert any("not valid JSON" in r for r in reasons) and any("empty" in r for r in reasons)


def test_a_retry_after_a_crash_rewrites_the_same_objects(stack_env) -> None:
    """Upload without commit, then a new roller with other roll sizes resumes at the same offset."""
    from sinks_helpers import step_records

    from steplens.schema import encode
    from steplens.sinks.kafka_io import Consumed

    settings = s3_settings(stack_env, unique("crash"))
    client = make_s3_client(settings)
    ensure_bucket(client, settings.bucket)
    recs = step_records(unique("run"), 100, ranks=1)
    items = [Consumed("raw", 0, 500 + i, r.key, encode(r), r) for i, r in enumerate(recs)]
    first = S3Roller(client, settings)
    buffer = Chunker(first.marker, max_bytes=1 << 30)
    for item in items[:80]:
        assert buffer.add(item) == []
    (chunk,) = buffer.due(everything=True)
    keys = first.write(chunk)  # ... and the process dies before the commit
    second = S3Roller(make_s3_client(settings), settings)
    buffer = Chunker(second.marker, max_bytes=2000)
    ready = [c for item in items for c in buffer.add(item)] + buffer.due(everything=True)
    assert (ready[0].first, ready[0].last) == (500, 579)
    assert second.write(ready[0]) == keys
    for c in ready[1:]:
        second.write(c)
    rows = cold_rows(settings)
    assert sorted(row["kafka_offset"] for row in rows) == list(range(500, 600))


def test_shutdown_drains_buffered_records(stack_env, topics) -> None:
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    records = step_records(unique("run"), 50, ranks=2)
    produce(bootstrap, topics.raw, records)
    settings = s3_settings(stack_env, unique("drain"))
    group = unique("group")
    r = start_roller(stack_env, topics, group, settings, max_age_s=3600)
    wait_for(
        lambda: sum(len(c.groups) for c in list(r.loop.chunker.chunks.values())) > 0,
        30,
        "buffering",
    )
    wait_for(
        lambda: sum(c.records for c in list(r.loop.chunker.chunks.values())) == 50,
        30,
        "all buffered",
    )
    assert committed(bootstrap, group, topics.raw, 4) == dict.fromkeys(range(4), 0)
    r.stop.set()
    r.thread.join(30)
    r.loop.drain()
    r.loop.consumer.close()
    assert committed(bootstrap, group, topics.raw, 4) == end_offsets(bootstrap, topics.raw, 4)
    assert len(cold_rows(settings)) == 50
