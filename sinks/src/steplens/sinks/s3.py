"""S3 cold roller: raw records to Parquet objects, committed to Kafka only after the upload.

Each partition's records are buffered into a chunk; a chunk rolls by size or age and becomes
one object per (kind, run, hour), keyed by topic, partition and the chunk's offset range. Each
object is a single PUT, so a reader sees all of it or nothing. Before the objects go up, the
chunk's range is written to ``<prefix>/_state/<topic>-p<P>.json``; a restarted roller that
resumes at that range's first offset ends its first chunk at the same last offset, so a retry
after a crash writes the same keys again (overwrites) instead of overlapping ones.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import boto3
import botocore.exceptions
from botocore.config import Config

from steplens.producer import schema
from steplens.producer.schema import DecodeError
from steplens.sinks import metrics
from steplens.sinks.cold import (
    GroupKey,
    group_of,
    object_key,
    record_row,
    rows_to_parquet,
)
from steplens.sinks.kafka_io import Consumed
from steplens.sinks.retry import RetryPolicy, call_with_retry
from steplens.sinks.settings import S3Settings

log = logging.getLogger("steplens.sinks")


def make_s3_client(s: S3Settings) -> Any:
    """boto3 client: explicit settings, else environment / profile; path-style addressing."""
    session = boto3.Session(profile_name=s.profile) if s.profile else boto3.Session()
    config = Config(
        s3={"addressing_style": "path"},
        retries={"max_attempts": 1, "mode": "standard"},  # our own policy retries
        connect_timeout=5,
        read_timeout=30,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return session.client(
        "s3",
        endpoint_url=s.endpoint_url,
        region_name=s.region or "us-east-1",
        aws_access_key_id=s.access_key_id,
        aws_secret_access_key=s.secret_access_key,
        config=config,
    )


def ensure_bucket(client: Any, bucket: str) -> None:
    try:
        client.head_bucket(Bucket=bucket)
    except botocore.exceptions.ClientError:
        client.create_bucket(Bucket=bucket)


def transient(exc: BaseException) -> bool:
    """Everything S3 says is worth another try: data is never dropped for an S3 error."""
    return isinstance(
        exc, (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, OSError)
    )


@dataclass
class Chunk:
    topic: str
    partition: int
    first: int
    last: int = -1
    nbytes: int = 0
    started: float = field(default_factory=time.monotonic)
    forced_last: int | None = None  # from the state marker: end exactly here
    groups: dict[GroupKey, list[dict]] = field(default_factory=lambda: defaultdict(list))
    dead: list[tuple[Consumed, str]] = field(default_factory=list)
    records: int = 0  # Kafka messages decoded
    rows: int = 0  # rows stored (a step_batch gives one per step)


class S3Roller:
    name = "s3"

    def __init__(
        self,
        client: Any,
        settings: S3Settings,
        *,
        max_bytes: int = 64 << 20,
        max_age_s: float = 60.0,
        policy: RetryPolicy | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.policy = policy or RetryPolicy()
        self.stop = stop or threading.Event()
        self.chunks: dict[tuple[str, int], Chunk] = {}
        self._markers: dict[tuple[str, int], tuple[int, int] | None] = {}

    # ---------------------------------------------------------------- buffering
    def add(self, item: Consumed) -> list[Chunk]:
        """Buffer one message; returns chunks that must be written before it fits."""
        tp = (item.topic, item.partition)
        ready = []
        chunk = self.chunks.get(tp)
        if chunk is not None and chunk.forced_last is not None and item.offset > chunk.forced_last:
            ready.append(self.chunks.pop(tp))
            chunk = None
        if chunk is None:
            chunk = self.chunks[tp] = Chunk(item.topic, item.partition, item.offset)
            marker = self._marker(tp)
            if marker is not None and marker[0] == item.offset:
                chunk.forced_last = marker[1]
        chunk.last = item.offset
        if isinstance(item.decoded, DecodeError):
            chunk.dead.append((item, f"undecodable: {item.decoded}"))
        else:
            rec = item.decoded
            steps = schema.unbatch(rec)  # a step_batch is stored as its step records
            # each step row keeps its own step record's bytes, so replay re-sends steps
            payloads = (
                [schema.encode(step) for step in steps]
                if rec.kind == "step_batch"
                else [item.value]
            )
            for step, payload in zip(steps, payloads, strict=True):
                row = record_row(step, item.topic, item.partition, item.offset, payload)
                chunk.groups[group_of(step)].append(row)
            chunk.records += 1
            chunk.rows += len(steps)
        chunk.nbytes += len(item.value)
        if chunk.forced_last is not None:
            if item.offset >= chunk.forced_last:
                ready.append(self.chunks.pop(tp))
        elif chunk.nbytes >= self.max_bytes:
            ready.append(self.chunks.pop(tp))
        return ready

    def due(self, everything: bool = False) -> list[Chunk]:
        """Chunks old enough to roll (all of them with ``everything``)."""
        now = time.monotonic()
        keys = [
            tp
            for tp, c in self.chunks.items()
            if everything or (c.forced_last is None and now - c.started >= self.max_age_s)
        ]
        return [self.chunks.pop(tp) for tp in keys]

    def drop(self, partitions: list[tuple[str, int]]) -> None:
        """Forget buffers of revoked partitions; their new owner re-reads them from Kafka."""
        for tp in partitions:
            self.chunks.pop(tp, None)
            self._markers.pop(tp, None)

    # ---------------------------------------------------------------- upload
    def _state_key(self, topic: str, partition: int) -> str:
        head = f"{self.settings.prefix.strip('/')}/" if self.settings.prefix.strip("/") else ""
        return f"{head}_state/{topic}-p{partition}.json"

    def _marker(self, tp: tuple[str, int]) -> tuple[int, int] | None:
        if tp not in self._markers:
            try:
                body = self._retry(
                    lambda: self._get_or_none(self._state_key(*tp)), "read state marker"
                )
                self._markers[tp] = None if body is None else (body["first"], body["last"])
            except Exception as exc:
                log.warning("steplens s3 roller: no state marker for %s: %s", tp, exc)
                return None
        return self._markers[tp]

    def _get_or_none(self, key: str) -> dict | None:
        try:
            obj = self.client.get_object(Bucket=self.settings.bucket, Key=key)
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        data: dict = json.loads(obj["Body"].read())
        return data

    def _retry(self, fn: Any, what: str) -> Any:
        def on_retry(exc: BaseException) -> None:
            metrics.RETRIES.labels(self.name).inc()
            log.warning("steplens s3 roller: %s failed, retrying: %s", what, exc)

        return call_with_retry(
            fn, policy=self.policy, retryable=transient, stop=self.stop, on_retry=on_retry
        )

    def put(self, key: str, body: bytes) -> None:
        self._retry(
            lambda: self.client.put_object(Bucket=self.settings.bucket, Key=key, Body=body),
            f"upload {key}",
        )

    def write(self, chunk: Chunk) -> list[str]:
        """Upload a chunk's objects (raises when retries ran out); returns the keys."""
        tp = (chunk.topic, chunk.partition)
        marker = {"first": chunk.first, "last": chunk.last}
        if chunk.groups and self._markers.get(tp) != (chunk.first, chunk.last):
            self.put(self._state_key(*tp), json.dumps(marker).encode())
            self._markers[tp] = (chunk.first, chunk.last)
        keys = []
        for group, rows in sorted(chunk.groups.items(), key=lambda kv: str(kv[0])):
            key = object_key(
                self.settings.prefix,
                group,
                chunk.topic,
                chunk.partition,
                first=chunk.first,
                last=chunk.last,
            )
            body = rows_to_parquet(group.kind, rows)
            self.put(key, body)
            metrics.S3_OBJECTS.inc()
            metrics.S3_BYTES.inc(len(body))
            keys.append(key)
        return keys
