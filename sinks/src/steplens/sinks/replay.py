"""Re-stream a run's cold records from S3 into Kafka, in time order, byte for byte."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pandas as pd
from confluent_kafka import Producer

from steplens import schema
from steplens.schema.kafka_config import producer_config
from steplens.schema.kafka_produce import produce_bounded
from steplens.schema.settings import kafka_bootstrap
from steplens.schema.topics import Topics, TopicSpec, create_missing
from steplens.sinks.cold import read_parquet, run_prefix
from steplens.sinks.query import _ns
from steplens.sinks.s3 import make_s3_client
from steplens.sinks.settings import S3Settings

QUEUE_FULL_S = 60.0  # longest the producer's local queue may stay full before replay gives up
# a step_batch is stored as its step rows, so replay re-sends those steps
REPLAYED_KINDS = [k for k in schema.KINDS if k not in ("dead_letter", "step_batch")]


def cold_records(
    s: S3Settings,
    run_id: str,
    kinds: Iterable[str] = REPLAYED_KINDS,
    since: object = None,
    until: object = None,
) -> Iterator[tuple[bytes, bytes]]:
    """(key, payload) of each stored record of the run, ordered by time, each once."""
    client = make_s3_client(s)
    frames = []
    for kind in kinds:
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=s.bucket, Prefix=run_prefix(s.prefix, kind, run_id)
        )
        for page in pages:
            for obj in page.get("Contents", []):
                body = client.get_object(Bucket=s.bucket, Key=obj["Key"])["Body"].read()
                cols = ["time_ns", "rank", "seq", "host", "kind", "payload"]
                frames.append(read_parquet(body, cols).to_pandas())
    if not frames:
        return
    frame = pd.concat(frames, ignore_index=True)
    lo, hi = _ns(since), _ns(until)  # type: ignore[arg-type]
    if lo is not None:
        frame = frame[frame["time_ns"] >= lo]
    if hi is not None:
        frame = frame[frame["time_ns"] <= hi]
    frame = frame.drop_duplicates(subset=["kind", "time_ns", "rank", "host", "seq"])
    for rank, payload in frame.sort_values(["time_ns", "rank", "seq"])[
        ["rank", "payload"]
    ].itertuples(index=False):
        yield schema.record_key(run_id, int(rank)), bytes(payload)


def replay(
    s: S3Settings,
    run_id: str,
    topic: str,
    *,
    bootstrap: str | None = None,
    kinds: Iterable[str] = REPLAYED_KINDS,
    since: object = None,
    until: object = None,
) -> int:
    """Produce the run's cold records to ``topic`` (created when missing, with as many
    partitions as the raw topic); returns how many were acknowledged."""
    create_missing(bootstrap, [TopicSpec(topic, Topics.from_env().raw_partitions)])
    producer = Producer(producer_config(bootstrap))
    failed: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(str(err))

    n = 0
    for key, payload in cold_records(s, run_id, kinds, since, until):
        if not produce_bounded(
            producer, topic, payload, key, on_delivery=on_delivery, max_wait_s=QUEUE_FULL_S
        ):
            raise RuntimeError(
                f"replay: Kafka's local queue stayed full for {QUEUE_FULL_S:.0f} s "
                f"after {n} records (is the broker at {kafka_bootstrap(bootstrap)} up?)"
            )
        n += 1
        producer.poll(0)
    left = producer.flush(60)
    if left or failed:
        raise RuntimeError(
            f"replay: {left} records unacknowledged, {len(failed)} failed: {failed[:3]}"
        )
    return n
