"""S3 cold roller: chunks of records to Parquet objects, committed to Kafka after the upload.

A chunk (``chunks.py``) becomes one object per (kind, run, hour), keyed by topic, partition
and the chunk's offset range. Each object is a single PUT, so a reader sees all of it or
nothing. Before the objects go up, the chunk's range is written to
``<prefix>/_state/<topic>-p<P>.json``; a restarted roller that resumes at that range's first
offset ends its first chunk at the same last offset, so a retry after a crash writes the same
keys again (overwrites) instead of overlapping ones. An upload makes one attempt: a failed
one makes the chunk retryable, and the loop exports it again (S3 writes are overwrites).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import boto3
import botocore.exceptions
from botocore.config import Config

from steplens.sinks import metrics
from steplens.sinks.chunks import Chunk
from steplens.sinks.cold import object_key, rows_to_parquet
from steplens.sinks.contract import ExportResult
from steplens.sinks.settings import S3Settings


def make_s3_client(s: S3Settings, signature_version: str | None = None) -> Any:
    """boto3 client: explicit settings, else environment / profile; path-style addressing; an
    https endpoint's certificate verified against ``ca_bundle`` when given
    (``signature_version="s3v4"``: presigned URLs that every region takes)."""
    session = boto3.Session(profile_name=s.profile) if s.profile else boto3.Session()
    config = Config(
        s3={"addressing_style": "path"},
        retries={"max_attempts": 1, "mode": "standard"},  # the consumer loop retries
        connect_timeout=5,
        read_timeout=30,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        signature_version=signature_version,
    )
    return session.client(
        "s3",
        endpoint_url=s.endpoint_url,
        region_name=s.region or "us-east-1",
        aws_access_key_id=s.access_key_id,
        aws_secret_access_key=s.secret_access_key,
        verify=s.ca_bundle,
        config=config,
    )


def credential_values(s: S3Settings) -> list[str | None]:
    """The credentials boto3 would use (to keep them out of logs)."""
    values = [s.access_key_id, s.secret_access_key]
    session = boto3.Session(profile_name=s.profile) if s.profile else boto3.Session()
    found = session.get_credentials()
    if found is not None:
        frozen = found.get_frozen_credentials()
        values += [frozen.access_key, frozen.secret_key, frozen.token]
    return values


def ensure_bucket(client: Any, bucket: str) -> None:
    try:
        client.head_bucket(Bucket=bucket)
    except botocore.exceptions.ClientError:
        client.create_bucket(Bucket=bucket)


@dataclass
class UploadStats:
    objects: int = 0
    rows: int = 0
    duplicates: int = 0


class S3Roller:
    """The cold sink: ``export(chunk)`` uploads a chunk's objects (``chunks.Chunker`` makes
    the chunks). Every decoded record becomes a row, so nothing is ever refused: a chunk is
    either durable or retryable (whatever S3 said: data is never dropped for an S3 error)."""

    name = "s3"

    def __init__(self, client: Any, settings: S3Settings) -> None:
        self.client = client
        self.settings = settings
        self.stats = UploadStats()
        self._markers: dict[tuple[str, int], tuple[int, int] | None] = {}

    def export(self, chunk: Chunk) -> ExportResult:
        try:
            keys = self.write(chunk)
        except Exception as exc:  # the contract: export never raises
            return ExportResult.retry(f"{type(exc).__name__}: {exc}")
        self.stats.objects += len(keys)
        self.stats.rows += chunk.rows
        self.stats.duplicates += chunk.duplicates
        metrics.S3_DUPLICATES.inc(chunk.duplicates)
        return ExportResult(accepted=chunk.records)

    def shutdown(self) -> None:
        return None

    def forget(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Forget the state markers of revoked partitions (their new owner reads them)."""
        for tp in partitions:
            self._markers.pop(tp, None)

    # ---------------------------------------------------------------- upload
    def _state_key(self, topic: str, partition: int) -> str:
        head = f"{self.settings.prefix.strip('/')}/" if self.settings.prefix.strip("/") else ""
        return f"{head}_state/{topic}-p{partition}.json"

    def marker(self, tp: tuple[str, int]) -> tuple[int, int] | None:
        """The range a previous roller was uploading for this partition, if any; raises when
        S3 could not say (the caller tries again: a chunk must not start without it)."""
        if tp not in self._markers:
            body = self._get_or_none(self._state_key(*tp))
            self._markers[tp] = None if body is None else (body["first"], body["last"])
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

    def put(self, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=self.settings.bucket, Key=key, Body=body)

    def write(self, chunk: Chunk) -> list[str]:
        """Upload a chunk's objects (raises when one failed); returns the keys."""
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
