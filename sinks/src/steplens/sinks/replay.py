"""Re-stream a run's cold records from S3 into Kafka, in time order, byte for byte."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pandas as pd
from confluent_kafka import Producer

from steplens import schema
from steplens.schema.log_limit import kafka_logger
from steplens.schema.settings import kafka_bootstrap, kafka_security_config
from steplens.schema.topics import Topics
from steplens.sinks.cold import read_parquet, run_prefix
from steplens.sinks.query import _ns
from steplens.sinks.s3 import make_s3_client
from steplens.sinks.settings import S3Settings

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


def _ensure_topic(topic: str, bootstrap: str | None) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(
        {"bootstrap.servers": kafka_bootstrap(bootstrap), **kafka_security_config()}
    )
    if topic in admin.list_topics(timeout=30).topics:
        return
    partitions = Topics.from_env().raw_partitions
    for fut in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        try:
            fut.result(timeout=30)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise


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
    _ensure_topic(topic, bootstrap)
    producer = Producer(
        {
            "bootstrap.servers": kafka_bootstrap(bootstrap),
            "enable.idempotence": True,
            "linger.ms": 20,
            **kafka_security_config(),
        },
        logger=kafka_logger("replay"),
    )
    failed: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(str(err))

    n = 0
    for key, payload in cold_records(s, run_id, kinds, since, until):
        while True:
            try:
                producer.produce(topic, payload, key=key, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.5)
        n += 1
        producer.poll(0)
    left = producer.flush(60)
    if left or failed:
        raise RuntimeError(
            f"replay: {left} records unacknowledged, {len(failed)} failed: {failed[:3]}"
        )
    return n
